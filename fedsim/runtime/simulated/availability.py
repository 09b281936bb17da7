"""A simulated client across its availability: its state across crashes
(:class:`ClientRecord`), its on/off periods and its crashes and rejoins, played out in virtual
time from its own random streams (``client/<id>/availability``, ``client/<id>/crashes``).

A crash cancels the client's current actor: a round begun but not charged is lost (nothing
released), a charged one was released first. A rejoin reopens the client's ledger from its
file, as a restarted process would, so its spending is never forgotten, and starts a new actor
whose round numbers continue after the last committed one.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Coroutine
from dataclasses import dataclass, field
from typing import Any

from fedsim.errors import ConfigError
from fedsim.logging import client_event_level, get_logger
from fedsim.privacy.ledger import PrivacyLedger
from fedsim.runtime.actors.client import ClientActor, Trainer
from fedsim.runtime.actors.releases import Releases, RoundRecord
from fedsim.runtime.actors.stops import ClientStopKind
from fedsim.runtime.assembly import toggle_availability
from fedsim.runtime.population import ClientPlan
from fedsim.runtime.rng import SeedTree
from fedsim.runtime.run_outputs import FINISHED_STATES, ClientOutcome, StoppedClient
from fedsim.runtime.simulated.kernel import VirtualClock
from fedsim.transports.simulated import SimulatedNetwork

__all__ = ["ClientRecord", "crashes_and_rejoins", "on_off_periods"]

_log = get_logger("fedsim.runtime.simulated.availability")


@dataclass(eq=False, slots=True)
class ClientRecord:
    """A client's runtime state across crashes."""

    plan: ClientPlan
    trainer: Trainer
    ledger: PrivacyLedger  # its path is the client's ledger file (reopened after a crash)
    actor: ClientActor | None = None
    task: asyncio.Task[None] | None = None
    online: bool = True
    crashed_for_good: bool = False
    crashes: int = 0
    earlier: Releases = field(default_factory=Releases)  # earlier incarnations' releases
    history: list[RoundRecord] | None = None  # every released round (run_scenario keep_history)

    def releases(self) -> Releases:
        """Rounds released by every incarnation of this client (crashes included), summed."""
        return self.earlier if self.actor is None else self.earlier.then(self.actor.releases)

    def released_rounds(self) -> list[RoundRecord]:
        """Every round released by every incarnation, in order: only a run with
        ``keep_history`` keeps them (they grow with the run's length)."""
        if self.history is None:
            raise ConfigError("released rounds are kept only by run_scenario(..., "
                              "keep_history=True); releases() has their sums")
        return list(self.history)

    @property
    def state(self) -> str:
        """The current incarnation's state; "crashed" while down (for now or for good)."""
        return self.actor.state if self.actor is not None else "crashed"

    @property
    def finished(self) -> bool:
        """Will never train again: budget spent, rounds done, or crashed without rejoining."""
        return self.crashed_for_good or (
            self.actor is not None and self.actor.state in FINISHED_STATES
        )

    def outcome(self) -> ClientOutcome:
        actor = self.actor
        return ClientOutcome(
            self.plan, self.ledger, self.state, self.releases(), self.finished,
            randomness=actor.randomness if actor is not None else "",
            timing_overruns=actor.timing_overruns if actor is not None else 0,
        )


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


async def crashes_and_rejoins(client: ClientRecord, clock: VirtualClock, tree: SeedTree, *,
                              rejoin: Callable[[ClientRecord], None],
                              stopped: list[StoppedClient]) -> None:
    """The client's crashes (its group's ``availability.crashes``): each cancels its actor;
    after ``rejoin_after`` ``rejoin(client)`` reopens its ledger and starts a new actor (never:
    it is noted in ``stopped``, crashed for good)."""
    crashes = client.plan.group.availability.crashes
    assert crashes is not None
    rng = tree.numpy("client", client.plan.client_id, "crashes")
    while True:
        await clock.sleep(crashes.every.sample(rng))
        if client.finished or client.task is None:
            return
        client.task.cancel()
        try:
            await client.task
        except asyncio.CancelledError:
            # The actor's cancel, expected; but this helper's own (the run ended at this
            # instant) must end it: swallowed, it went on to restart the client, whose new
            # actor then trained for ever with no server to end it.
            current = asyncio.current_task()
            if current is not None and current.cancelling():
                raise
        client.crashes += 1
        if client.actor is not None:
            client.earlier = client.earlier.then(client.actor.releases)
            client.actor = None
        _log.log(client_event_level(), "client crashed", client=client.plan.client_id,
                 time=clock.now())
        if crashes.rejoin_after is None:
            client.crashed_for_good = True
            stopped.append({"client_id": client.plan.client_id, "time": clock.now(),
                            "reason": "crashed and did not rejoin",
                            "kind": ClientStopKind.CRASHED})
            return
        await clock.sleep(crashes.rejoin_after.sample(rng))
        rejoin(client)
        _log.log(client_event_level(), "client rejoined", client=client.plan.client_id,
                 time=clock.now(),
                 next_round=client.actor.next_round if client.actor else None)
