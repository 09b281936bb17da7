"""How long a run will last: the stop that comes first, for the progress bar.

A scenario's run ends at the first of its stop conditions (``stop.windows``,
``stop.virtual_seconds``, every client's budget spent, a target accuracy). The first two are
known before the run starts; :func:`budget_horizon` estimates the third from the clients'
privacy postures and speed models:

* the rounds a client can afford are the most rounds whose privacy events stay within its
  budget, counted by the group's own accountant (:func:`fedsim.privacy.calibration.max_steps`,
  the same count the client's ledger enforces), capped by ``rounds``;
* a round lasts its expected compute time (its public per-example gradients,
  :func:`fedsim.runtime.actors.exposure.group_sample_grads`: batch size x local steps x
  per-example steps, times the mean seconds per sample of the speed model), at least the broadcast period divided by
  ``staleness.max_versions_behind`` (a client that may apply only k local rounds per global
  model waits for the next one), stretched by the share of time the client is online.

Within a group every client computes equally long rounds, so the group's last client to stop is
the one with the most records (the smallest q = m/N, the most affordable rounds): one accountant
search per group. The estimate ignores crashes, network delays and the target accuracy; it is
for showing progress, never for deciding anything. :class:`HorizonTracker` corrects it during the
run: the total shrinks to the next window end once no client can train any more, and grows to
the next known bound if the run outlives the estimate.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from fedsim.config.schema import ClientGroup, Scenario
from fedsim.privacy.calibration import max_steps
from fedsim.privacy.group_schedules import release_steps
from fedsim.reporting.progress import RunProgress
from fedsim.runtime.actors.exposure import group_sample_grads

# The estimate's search stops here (rounds); beyond it a budget is no horizon worth showing.
MAX_ESTIMATED_ROUNDS = 10**7


@dataclass(frozen=True)
class Horizon:
    """The run's expected end in seconds of scenario time.

    Attributes:
        seconds: the end of the stop expected first (None: no bound is known).
        bound: the end of the first *hard* stop (``windows`` or ``virtual_seconds``), None if
            the scenario has neither.
        source: which stop ``seconds`` comes from: ``"windows"``, ``"virtual_seconds"``,
            ``"budgets"`` (estimated) or ``"unknown"``.
        budgets_stop: whether the run ends once no client can train any more
            (``stop.all_budgets_spent``).
    """

    seconds: float | None
    bound: float | None
    source: str
    budgets_stop: bool = True

    @property
    def estimated(self) -> bool:
        return self.source == "budgets"


def mean_of(distribution: Any) -> float:
    """The mean of a scenario distribution (constant, uniform, exponential, lognormal,
    shifted exponential)."""
    kind = distribution.kind
    if kind == "constant":
        return float(distribution.value)
    if kind == "uniform":
        return 0.5 * (distribution.low + distribution.high)
    if kind == "exponential":
        return float(distribution.mean)
    if kind == "lognormal":
        return float(distribution.median * math.exp(0.5 * distribution.sigma**2))
    if kind == "shifted_exponential":
        return float(distribution.minimum + distribution.mean)
    raise ValueError(f"unknown distribution kind {kind!r}")


def bound_horizon(scenario: Scenario) -> Horizon:
    """The end of the first hard stop (windows or virtual seconds), known before the run."""
    window = scenario.server.window
    candidates: list[tuple[float, str]] = []
    if scenario.stop.windows is not None:
        candidates.append((scenario.stop.windows * window, "windows"))
    if scenario.stop.virtual_seconds is not None:
        # The run ends with the first window end at or after the limit.
        limit = scenario.stop.virtual_seconds
        candidates.append((math.ceil(limit / window - 1e-9) * window, "virtual_seconds"))
    budgets_stop = scenario.stop.all_budgets_spent
    if not candidates:
        return Horizon(None, None, "unknown", budgets_stop)
    seconds, source = min(candidates)
    return Horizon(seconds, seconds, source, budgets_stop)


def round_seconds(group: ClientGroup, scenario: Scenario) -> float:
    """Expected scenario seconds between two rounds of a client of ``group``."""
    compute = group_sample_grads(group) * mean_of(group.speed)
    behind = group.staleness.max_versions_behind
    if behind is not None:
        compute = max(compute, scenario.server.broadcast_every * scenario.server.window / behind)
    availability = group.availability
    if availability.online is not None and availability.offline is not None:
        online, offline = mean_of(availability.online), mean_of(availability.offline)
        if online + offline > 0:
            compute *= (online + offline) / max(online, 1e-12)
    return compute


def affordable_rounds(group: ClientGroup, num_samples: int, *, limit: int) -> int | None:
    """Rounds a client of ``group`` with ``num_samples`` records can release (None: no bound
    below ``limit``). Counted with the group's accountant for a constant noise; a calibrated
    schedule (``target``, ``growing_mu``) is made to fit its ``rounds``."""
    rounds = group.rounds
    if group.budget is None or group.noise.kind != "constant":
        return rounds
    cap = min(limit, rounds) if rounds is not None else limit
    q = min(1.0, group.batch_size / num_samples)
    steps = max_steps(group.accountant, group.sampling, q, float(group.noise.sigma),
                      group.budget.epsilon, group.budget.delta,
                      limit=cap * group.local_steps + 1,
                      prior=release_steps(group))  # releases before round 0
    return min(cap, steps // group.local_steps)


def budget_horizon(scenario: Scenario, sizes: Iterable[tuple[ClientGroup, int]],
                   *, limit_seconds: float | None = None) -> float | None:
    """Estimated scenario seconds until no client can train any more (None: some client is
    never stopped by its budget or rounds, or not before ``limit_seconds``).

    ``sizes`` gives each client's group and record count (a run's population plans)."""
    largest: dict[str, tuple[ClientGroup, int]] = {}
    for group, size in sizes:
        if group.name not in largest or size > largest[group.name][1]:
            largest[group.name] = (group, size)
    end = 0.0
    for group, size in largest.values():
        per_round = round_seconds(group, scenario)
        limit = MAX_ESTIMATED_ROUNDS
        if limit_seconds is not None and per_round > 0:
            limit = min(limit, int(limit_seconds / per_round) + 1)
        rounds = affordable_rounds(group, size, limit=limit)
        if rounds is None or rounds >= limit:
            return None
        end = max(end, rounds * per_round)
    return end


def run_horizon(scenario: Scenario, sizes: Iterable[tuple[ClientGroup, int]] | None = None
                ) -> Horizon:
    """The stop expected first: the hard bound, or the budget estimate if it comes earlier
    (only with ``sizes`` and ``stop.all_budgets_spent``)."""
    hard = bound_horizon(scenario)
    if sizes is None or not hard.budgets_stop:
        return hard
    estimate = budget_horizon(scenario, sizes, limit_seconds=hard.bound)
    if estimate is None or (hard.bound is not None and estimate >= hard.bound):
        return hard
    window = scenario.server.window
    # The run notices at a window end, one window after the last update arrives at the latest.
    seconds = (math.ceil(estimate / window) + 1) * window
    if hard.bound is not None:
        seconds = min(seconds, hard.bound)
    return Horizon(seconds, hard.bound, "budgets")


class HorizonTracker:
    """The progress bar's total during a run, corrected by what the windows report."""

    def __init__(self, horizon: Horizon, window: float) -> None:
        self.horizon = horizon
        self.window = float(window)
        self.total = horizon.seconds
        self.final = False

    def observe(self, time: float, active_clients: int | None) -> float | None:
        """The total after a window ending at ``time`` with ``active_clients`` still able to
        train."""
        if self.final and self.total is not None and time < self.total:
            return self.total
        if active_clients == 0 and self.horizon.budgets_stop:
            # Budgets spent (or rounds done): the run ends once every update has arrived,
            # usually at the next window end; one window more each time it has not.
            end = time + self.window
            self.total = end if self.horizon.bound is None else min(end, self.horizon.bound)
            self.final = True
        elif self.total is not None and time >= self.total and self.total != self.horizon.bound:
            # Outlived the estimate: fall back to the hard bound (or none).
            self.total = self.horizon.bound
        return self.total


class RunBar:
    """What a simulated run's progress bar shows, the one definition ``fedsim run`` and
    :func:`fedsim.simulate` share: its total is the run's :func:`run_horizon` (from its
    clients' groups and records), corrected as the windows come (:class:`HorizonTracker`),
    and the real end once the run is over."""

    def __init__(self, scenario: Scenario, plans: Iterable[Any]) -> None:
        self.horizon = run_horizon(scenario, [(p.group, p.num_samples) for p in plans])
        self._tracker = HorizonTracker(self.horizon, scenario.server.window)

    def on_window(self, bar: RunProgress, line: dict[str, Any]) -> None:
        """``bar`` after the window of metrics line ``line``."""
        bar.set_total(self._tracker.observe(line["time"], line["active_clients"]))
        bar.update(line["time"], line["window"], line["accuracy"],
                   line["min_remaining_epsilon"], line["active_clients"])

    @staticmethod
    def on_end(bar: RunProgress, summary: dict[str, Any]) -> None:
        """``bar`` at the run's real end (its summary's virtual time and windows)."""
        bar.set_total(max(summary["virtual_time"], 1e-9))
        bar.update(summary["virtual_time"], summary["windows"])
