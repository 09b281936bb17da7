"""A finished run as both runtimes report it (:class:`RunRecord`): its clients' outcomes, the
clients that stopped for good and when, and what a deployed run's clients released that its
server never acknowledged. :mod:`fedsim.runtime.run_outputs` writes the run directory from it,
:mod:`fedsim.runtime.run_summary` says what ``summary.json`` says of it."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypedDict

from fedsim.config.schema import Scenario
from fedsim.privacy.ledger import PrivacyLedger
from fedsim.runtime.actors.releases import Releases
from fedsim.runtime.actors.stops import ClientStopKind, RunStop

if TYPE_CHECKING:  # the plan's module imports torch; this one is read by fedsim.reporting
    from fedsim.runtime.population import ClientPlan

__all__ = ["RELEASED_UNACKNOWLEDGED", "ClientOutcome", "RunRecord", "StoppedClient",
           "released_unacknowledged", "stop_time_in_run"]


RELEASED_UNACKNOWLEDGED = "released_unacknowledged"
"""A deployed run's ``server.json`` and ``summary.json`` key: its clients' released updates
the server never acknowledged (:func:`released_unacknowledged`)."""


def released_unacknowledged(counts: Mapping[str, int | None]) -> dict[str, Any]:
    """What ``server.json`` and a launch's ``summary.json`` say of the updates the clients
    released (charged to their privacy) and the server never acknowledged, from each client's
    count (its final status's, or its report's; None: unknown): the ``total``, the ``clients``
    with any (id: count) and how many clients ``reported`` a count."""
    known = {c: n for c, n in counts.items() if n is not None}
    return {"total": sum(known.values()), "reported": len(known),
            "clients": {c: n for c, n in sorted(known.items()) if n}}


class StoppedClient(TypedDict):
    """A client that stopped for good: when (scenario time), why (``reason``, text) and the
    kind of why (``kind``, a :class:`~fedsim.runtime.actors.stops.ClientStopKind`)."""

    client_id: str
    time: float | None
    reason: str
    kind: ClientStopKind


def stop_time_in_run(time: float | None, end: float) -> float | None:
    """A client's stop time as every output states it (``summary.json``'s ``stopped``,
    ``clients.csv``'s ``stopped_at``, a server's view): on the run's clock, the server's (the
    simulation's virtual clock; a deployed server's scenario clock, on which a deployed client
    says its stop, :class:`~fedsim.runtime.deployed.client_lives.ServerTimeline`), within the
    run's span from 0 to its end ``end`` (:attr:`RunRecord.virtual_time`, the last window's
    time): a client that stops as the run ends (told by the server that it ended, or its own
    stop while that news was on its way) stopped at the end. None: not known."""
    if time is None:
        return None
    return min(max(time, 0.0), end)


@dataclass(frozen=True, eq=False)
class ClientOutcome:
    """One client at the end of a run (its row of ``clients.csv``)."""

    plan: ClientPlan
    ledger: PrivacyLedger
    state: str
    releases: Releases
    """Rounds released by every incarnation of the client (restarts included), summed."""
    finished: bool
    """Will never train again (budget spent, rounds done, crashed for good)."""
    randomness: str = ""
    """Where its batches and noise came from (:mod:`fedsim.runtime.actors.exposure`)."""
    timing_overruns: int = 0
    """Rounds released after their public slot (deployed clients)."""
    split_delays: int = 0
    """Padded releases a global model's arrival moved to a later slot (deployed clients,
    ``interrupt: switch``)."""
    late_models: int = 0
    """Global models that arrived mid-round after a paced round's last part began, so they
    were the next round's where a simulation splits the round at them (deployed clients,
    ``interrupt: switch``)."""
    crashes: int = 0
    """Crashes its group's ``availability.crashes`` gave it (simulated or emulated)."""

    @property
    def client_id(self) -> str:
        return self.plan.client_id


@dataclass(frozen=True, eq=False)
class RunRecord:
    """A finished run as both runtimes report it: what :func:`~fedsim.runtime.run_outputs.write_run_outputs` writes."""

    scenario: Scenario
    out_dir: Path
    metrics: Sequence[Mapping[str, Any]]
    """The ``metrics.jsonl`` lines, in window order."""
    clients: Sequence[ClientOutcome]
    stopped: Sequence[StoppedClient]
    """Clients that stopped for good, in the order they stopped; their times are stated
    within the run's span (:func:`stop_time_in_run`, applied when the record is made)."""
    stop_reason: RunStop | None
    """Why the run ended (None: it ended without a stop condition holding)."""
    final_version: int
    network: Mapping[str, Any]
    """Transport counters (the simulated network's, or the deployed server's MQTT endpoint's)."""
    wall_seconds: float
    cpu_seconds: float
    rounds_batched: int = 0
    """Rounds computed in a batched pass with other clients' (virtual-time runs only)."""
    batched_passes: int = 0
    rounds_recomputed: int = 0
    """Computed rounds a late w-hat split (interrupt = switch) and computed again."""
    time_kind: str = "virtual"
    """What the run's seconds are: "virtual" (simulated) or "scenario" (on the wall clock)."""
    interrupted: str | None = None
    """The signal that interrupted the run (None: it ran to its stop condition); the summary
    then says ``"interrupted": {"signal": ..., "partial": true}``."""
    final_evaluation: Mapping[str, Any] | None = None
    """The final model's evaluation at the run's end: ``version``, ``accuracy``, ``loss``
    (None: not evaluated, e.g. an interrupted or message-only run)."""
    parts: int = 1
    """How many launches ran this (deployed) run: more than one, it was interrupted and resumed
    (``fedsim launch --resume``), which its summary says (a stranger's review)."""
    resumed_from_window: int | None = None
    """The window its last resumed part went on from (``parts`` > 1; None or 0: the start, the
    part before it interrupted before its first window)."""
    warnings: Sequence[str] = ()
    """What the run's collection found wrong (a deployed run's: a state ledger that does not
    extend the run directory's copy, a client the server refused); empty for a simulation."""
    deployed_differences: Sequence[str] = ()
    """What this (deployed) run did not do as a simulation of its scenario does
    (:mod:`fedsim.runtime.deployed.differences`); empty for a simulation."""
    released_unacknowledged: Mapping[str, Any] | None = None
    """A deployed run's :func:`released_unacknowledged` (None: a simulation's, which has no
    such key)."""

    def __post_init__(self) -> None:
        end = self.virtual_time
        object.__setattr__(self, "stopped", tuple(
            StoppedClient(client_id=e["client_id"], time=stop_time_in_run(e["time"], end),
                          reason=e["reason"], kind=e["kind"]) for e in self.stopped))

    @property
    def sample_grads(self) -> int:
        """Per-example gradients computed in released rounds, over all clients and restarts."""
        return sum(c.releases.sample_grads for c in self.clients)

    @property
    def virtual_time(self) -> float:
        return float(self.metrics[-1]["time"]) if self.metrics else 0.0
