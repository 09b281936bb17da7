"""A simulated client's on/off periods, played out in virtual time from its own random stream
(``client/<id>/availability``): its network link and its current actor go down and up. Its
crashes and rejoins are :mod:`fedsim.runtime.incarnations`' (``client/<id>/crashes``).
"""

from __future__ import annotations

from collections.abc import Coroutine
from typing import Any

from fedsim.runtime.assembly import toggle_availability
from fedsim.runtime.incarnations import ClientRecord
from fedsim.runtime.rng import SeedTree
from fedsim.runtime.simulated.kernel import VirtualClock
from fedsim.transports.simulated import SimulatedNetwork

__all__ = ["on_off_periods"]


def on_off_periods(client: ClientRecord, clock: VirtualClock, network: SimulatedNetwork,
                   tree: SeedTree) -> Coroutine[Any, Any, None]:
    """The client's on/off periods: its network link and (current) actor go down and up."""

    def set_online(online: bool) -> None:
        client.online = online
        network.set_online(client.plan.client_id, online)
        if client.actor is not None:
            client.actor.set_online(online)

    rng = tree.numpy("client", client.plan.client_id, "availability")
    return toggle_availability(client.plan, clock, rng, set_online)
