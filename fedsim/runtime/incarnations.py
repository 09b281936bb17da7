"""A client across its incarnations: its state across crashes (:class:`ClientRecord`) and its
crashes and rejoins (:func:`crashes_and_rejoins`), the one rule of ``availability.crashes``
both runtimes play out: the simulator in virtual time, a deployed client process on its own
clock (:mod:`fedsim.runtime.deployed.client_process`).

A crash cancels the client's current actor: a round begun but not charged is lost (nothing
released), a charged one was released first. A rejoin reopens the client's ledger from its
file, as a restarted process would, so its spending is never forgotten, and starts a new actor
whose round numbers continue after the last committed one.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from fedsim.clock import Clock
from fedsim.errors import ConfigError
from fedsim.logging import client_event_level, get_logger
from fedsim.privacy.ledger import PrivacyLedger
from fedsim.runtime.actors.client import ClientActor, Trainer
from fedsim.runtime.actors.releases import Releases, RoundRecord
from fedsim.runtime.actors.stops import ClientStopKind
from fedsim.runtime.population import ClientPlan
from fedsim.runtime.run_outputs import FINISHED_STATES
from fedsim.runtime.run_record import ClientOutcome, StoppedClient

__all__ = ["ClientRecord", "crashes_and_rejoins"]

_log = get_logger("fedsim.runtime.incarnations")


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
            crashes=self.crashes,
        )


async def crashes_and_rejoins(client: ClientRecord, clock: Clock, rng: np.random.Generator, *,
                              rejoin: Callable[[ClientRecord], None],
                              stopped: list[StoppedClient]) -> None:
    """The client's crashes (its group's ``availability.crashes``, up and down times drawn
    from ``rng``): each cancels its actor; after ``rejoin_after`` ``rejoin(client)`` reopens
    its ledger and starts a new actor (never: it is noted in ``stopped``, crashed for good)."""
    crashes = client.plan.group.availability.crashes
    assert crashes is not None
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
