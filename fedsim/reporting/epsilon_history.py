"""Clients' epsilon over time from their ledgers, for the plots, the comparison and
TensorBoard: a run's time grid, each client's eps at the run's delta on it (each prefix of its
ledger under its accountant, shared between clients of equal histories by
:class:`EpsilonCache`), final eps, and the clients at quantiles of final eps that stand for many.

Every number is each client's own guarantee about its own data set (per client, per sample);
the neighbouring relation is the one of the client's sampling scheme.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from fedsim.privacy.accountant import Accountant, make_accountant, smallest_epsilon
from fedsim.privacy.events import GaussianStep, group_steps
from fedsim.reporting.ledgers import ClientLedger

# Enough points for a smooth curve, few enough that a 100-client run reports in seconds.
TIME_GRID_POINTS = 25
MIN_TIME_GRID_POINTS = 10

# Above this many (client, time) evaluations the epsilon plot shows quantile clients only.
EXACT_BAND_EVALUATIONS = 1200
QUANTILES = (0.0, 0.1, 0.25, 0.5, 0.75, 0.9, 1.0)


@dataclass
class EpsilonCache:
    """eps(delta) of a history, keyed by its grouped steps and the accountant settings.

    Clients with the same posture that have taken the same number of steps share one
    computation; the prefixes of a long ledger share most of theirs.
    """

    delta: float
    values: dict[tuple[Any, ...], float] = field(default_factory=dict)

    def epsilon(self, accountant: Accountant, steps: Iterable[GaussianStep]) -> float:
        grouped = group_steps(steps)
        if not grouped:
            return 0.0
        settings = accountant.settings()
        key = (accountant.name, _hashable(settings), grouped)
        if key not in self.values:
            fresh = make_accountant(accountant.name, grouped, **settings)
            # a guarantee's eps by the ledger's rule (the smallest other guarantee's where its
            # own has no finite answer: a history the PLD grid cannot represent raised here)
            self.values[key] = float(
                smallest_epsilon(fresh, self.delta, only_if_infinite=True)[0]
                if fresh.is_guarantee else fresh.epsilon(self.delta))
        return self.values[key]


def _hashable(value: Any) -> Any:
    """``value`` as a cache key's part: mappings as sorted pairs, lists as tuples (an rdp
    accountant's settings hold its list of orders: as a list the key raised TypeError)."""
    if isinstance(value, Mapping):
        return tuple(sorted((key, _hashable(item)) for key, item in value.items()))
    if isinstance(value, list | tuple):
        return tuple(_hashable(item) for item in value)
    return value


@dataclass(frozen=True)
class EpsilonHistory:
    """Some clients' epsilon at ``delta`` at each of ``times`` (rows follow ``client_ids``)."""

    times: np.ndarray
    client_ids: tuple[str, ...]
    epsilon: np.ndarray  # shape (clients, times)
    accountant: str
    delta: float

    def final(self) -> dict[str, float]:
        return {cid: float(row[-1]) for cid, row in zip(self.client_ids, self.epsilon, strict=True)}


def time_grid(end: float, points: int = TIME_GRID_POINTS) -> np.ndarray:
    """``points`` virtual times from 0 to ``end`` (just 0 for an empty run), spaced as the
    squares ``end (k / (points - 1))^2``: dense early, where eps grows fastest.

    A plot joins them by straight lines, which lie below eps between the points (eps grows
    concavely, about as the square root of the steps taken): on an evenly spaced grid the
    first segment read a third low at its middle, and two runs of different lengths (different
    grids) read 2x apart at one time (a stranger's comparison). Square spacing keeps the
    early segments short, where the curvature is."""
    if not end > 0:
        return np.zeros(1)
    return float(end) * np.linspace(0.0, 1.0, points) ** 2


def accountant_names(ledgers: Iterable[ClientLedger]) -> str:
    return ", ".join(sorted({ledger.accountant.name for ledger in ledgers})) or "none"


def final_epsilons(ledgers: Sequence[ClientLedger], cache: EpsilonCache, *,
                   under: Accountant | None = None) -> dict[str, float]:
    """Each client's epsilon at ``cache.delta`` over its whole ledger, under its ledger's own
    accountant or ``under``'s name and settings (e.g. ``pld``, as summary.json reports)."""
    return {lg.client_id: cache.epsilon(under or lg.accountant, (s for _, s in lg.steps))
            for lg in ledgers}


def epsilon_history(ledgers: Sequence[ClientLedger], times: np.ndarray, delta: float,
                    cache: EpsilonCache | None = None) -> EpsilonHistory:
    """eps at ``delta`` spent by each client up to (and including) each of ``times``.

    The same numbers as each ledger's own ``epsilon_history``, computed through a cache
    shared by all clients (see :class:`EpsilonCache`).
    """
    cache = cache if cache is not None else EpsilonCache(delta)
    values = np.zeros((len(ledgers), len(times)))
    for row, ledger in enumerate(ledgers):
        record_times = np.array([t for t, _ in ledger.steps], dtype=float)
        for column, moment in enumerate(times):
            taken = int(np.searchsorted(record_times, moment, side="right"))
            values[row, column] = cache.epsilon(ledger.accountant,
                                                (s for _, s in ledger.steps[:taken]))
    return EpsilonHistory(np.asarray(times, dtype=float), tuple(lg.client_id for lg in ledgers),
                          values, accountant_names(ledgers), delta)


def quantile_clients(final: dict[str, float], quantiles: Sequence[float]) -> list[str]:
    """Client ids at the given quantiles of final epsilon (ties by id), distinct, in order."""
    ordered = sorted(final, key=lambda cid: (final[cid], cid))
    if not ordered:
        return []
    picks = [ordered[round(q * (len(ordered) - 1))] for q in quantiles]
    return list(dict.fromkeys(picks))


def representative_clients(final: dict[str, float], count: int = 3) -> list[str]:
    """Client ids with the smallest, median and largest final epsilon (ties by id), distinct."""
    if len(final) <= count:
        return sorted(final, key=lambda cid: (final[cid], cid))
    return quantile_clients(final, [i / (count - 1) for i in range(count)])
