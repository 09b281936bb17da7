"""Partitioning a training set across clients (IID, Dirichlet label skew, shards, unequal sizes,
whole writers), and across client groups (:func:`split_groups`: both, as a scenario says).

Pure functions of the labels and a ``numpy.random.Generator``. The Dirichlet scheme redraws
until every client holds ``min_size`` records; when that is hopeless it says so at once, with
the concentration or client count that would work, instead of redrawing for a minute.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Literal

import numpy as np
import torch

from fedsim.errors import ConfigError, DataError, FedsimError

if TYPE_CHECKING:
    from fedsim.config.schema import ClientGroup

__all__ = [
    "DIRICHLET_ATTEMPTS",
    "PartitionScheme",
    "dirichlet_success_rate",
    "group_members",
    "natural_partition",
    "partition",
    "split_groups",
]

PartitionScheme = Literal["iid", "dirichlet", "shards", "unequal", "natural"]
DIRICHLET_ATTEMPTS = 1000
"""Draws the Dirichlet scheme tries before it gives up."""
_FULL_ATTEMPTS_BEFORE_ESTIMATE = 10
_ESTIMATE_TRIALS = 1000
_ADVICE_TRIALS = 100
_ESTIMATE_SEED = 20190913  # the estimate's own generator: the partition's stream is untouched


def _client_counts(class_sizes: np.ndarray, num_clients: int, alpha: float,
                   rng: np.random.Generator, trials: int) -> np.ndarray:
    """(trials, num_clients) record counts of Dirichlet draws, without drawing the records:
    the same cut rule as :func:`partition` (floor of the cumulative shares times the class
    size)."""
    counts = np.zeros((trials, num_clients), dtype=np.int64)
    chunk = max(1, 2_000_000 // num_clients)  # bounded memory for large populations
    for start in range(0, trials, chunk):
        rows = counts[start:start + chunk]
        for size in class_sizes:
            shares = rng.dirichlet(np.full(num_clients, alpha), size=len(rows))
            cuts = (np.cumsum(shares, axis=1)[:, :-1] * size).astype(np.int64)
            rows += np.diff(cuts, axis=1, prepend=0, append=size)
    return counts


def dirichlet_success_rate(class_sizes: np.ndarray, num_clients: int, alpha: float,
                           min_size: int, *, trials: int = _ESTIMATE_TRIALS,
                           seed: int = _ESTIMATE_SEED) -> float:
    """The share of Dirichlet(alpha) draws over ``num_clients`` clients that give every client
    at least ``min_size`` records, estimated from ``trials`` draws of the counts alone."""
    counts = _client_counts(np.asarray(class_sizes), num_clients, alpha,
                            np.random.default_rng(seed), trials)
    return float((counts.min(axis=1) >= min_size).mean())


def _feasible_advice(class_sizes: np.ndarray, num_clients: int, alpha: float,
                     min_size: int) -> str:
    """What works in at least half the draws: the smallest alpha (doubling) at this client
    count, and the largest client count at this alpha."""

    def works(clients: int, concentration: float) -> bool:
        rate = dirichlet_success_rate(class_sizes, clients, concentration, min_size,
                                      trials=_ADVICE_TRIALS)
        return rate >= 0.5

    options = []
    concentration = alpha
    for _ in range(20):
        concentration *= 2.0
        if works(num_clients, concentration):
            options.append(f"alpha >= {concentration:.3g} with {num_clients} clients")
            break
    low, high = 0, num_clients  # works(low) (or low == 0), not works(high)
    while high - low > 1:
        middle = (low + high) // 2
        if works(middle, alpha):
            low = middle
        else:
            high = middle
    if low >= 1:
        options.append(f"at most {low} clients with alpha {alpha:g}")
    return " or ".join(options) if options else "a larger data_share"


def _dirichlet(y: np.ndarray, num_clients: int, alpha: float, min_size: int,
               rng: np.random.Generator) -> list[np.ndarray]:
    classes = np.unique(y)
    members_by_class = [np.flatnonzero(y == cls) for cls in classes]
    class_sizes = np.array([len(m) for m in members_by_class])
    rate = None
    for attempt in range(DIRICHLET_ATTEMPTS):
        drawn = []
        counts = np.zeros(num_clients, dtype=np.int64)
        for members in members_by_class:
            shuffled = rng.permutation(members)
            shares = rng.dirichlet(np.full(num_clients, alpha))
            cuts = (np.cumsum(shares)[:-1] * len(members)).astype(int)
            counts += np.diff(cuts, prepend=0, append=len(members))
            drawn.append((shuffled, cuts))
        if counts.min() >= min_size:
            buckets: list[list[np.ndarray]] = [[] for _ in range(num_clients)]
            for shuffled, cuts in drawn:
                for client, piece in enumerate(np.split(shuffled, cuts)):
                    buckets[client].append(piece)
            return [np.concatenate(b) for b in buckets]
        if attempt + 1 == _FULL_ATTEMPTS_BEFORE_ESTIMATE:
            rate = dirichlet_success_rate(class_sizes, num_clients, alpha, min_size)
            if rate * (DIRICHLET_ATTEMPTS - attempt - 1) < 1.0:
                break  # expected to fail: say so now
    if rate is None:
        rate = dirichlet_success_rate(class_sizes, num_clients, alpha, min_size)
    raise DataError(
        f"dirichlet(alpha={alpha:g}) over {num_clients} clients and {len(y)} records rarely "
        f"gives every client at least {min_size} record{'s' if min_size != 1 else ''} "
        f"({rate:.1%} of draws do); what works "
        f"in most draws: {_feasible_advice(class_sizes, num_clients, alpha, min_size)}")


def group_members(
    n: int, shares: Sequence[float], rng: np.random.Generator,
    writers: np.ndarray | None = None,
) -> list[np.ndarray]:
    """Record indices (sorted) per group: ``floor(share * n)`` records for each share, cut in
    turn from one random order of ``0..n-1``.

    With ``writers`` (a writer index per record), the order keeps each writer's records
    together (writers in random order) and each cut is moved forward to the end of a writer,
    so that no writer's records are in two groups.
    """
    if writers is None:
        order, bounds = rng.permutation(n), None
    else:
        w = np.asarray(writers, dtype=np.int64)
        present = np.unique(w)
        rank = np.zeros(int(w.max()) + 1, np.int64)
        rank[rng.permutation(present)] = np.arange(len(present))
        order = np.argsort(rank[w], kind="stable")
        bounds = np.concatenate([[0], np.cumsum(np.bincount(rank[w], minlength=len(present)))])
    groups, start = [], 0
    for share in shares:
        end = min(start + math.floor(share * n), n)
        if bounds is not None:
            end = int(bounds[np.searchsorted(bounds, end)])
        groups.append(np.sort(order[start:end]))
        start = end
    return groups


def natural_partition(
    writers: np.ndarray, num_clients: int, *, rng: np.random.Generator
) -> list[np.ndarray]:
    """Each client gets the records of one or more whole writers: the writers present, in
    random order, cut into ``num_clients`` near-equal runs (LEAF's natural FL split)."""
    w = np.asarray(writers)
    present = rng.permutation(np.unique(w))
    if len(present) < num_clients:
        raise ConfigError(
            f"a natural partition needs a writer per client: {len(present)} writers for "
            f"{num_clients} clients"
        )
    return [np.flatnonzero(np.isin(w, run)) for run in np.array_split(present, num_clients)]


def partition(  # noqa: C901, PLR0912 - one branch per partition scheme
    labels: np.ndarray | torch.Tensor,
    num_clients: int,
    scheme: PartitionScheme,
    *,
    rng: np.random.Generator,
    alpha: float = 0.5,
    shards_per_client: int = 2,
    size_sigma: float = 1.0,
    min_size: int = 1,
    writers: np.ndarray | None = None,
) -> list[np.ndarray]:
    """Split record indices ``0..len(labels)-1`` among ``num_clients`` disjointly.

    * ``iid``: a random permutation cut into near-equal parts;
    * ``dirichlet``: label skew; for each class, client shares ~ Dirichlet(alpha) (Hsu, Qi and
      Brown 2019, "Measuring the Effects of Non-Identical Data Distribution for Federated Visual
      Classification"); redrawn until every client has ``min_size`` records, failing fast with
      what would work when that is hopeless;
    * ``shards``: sort by label, cut into ``num_clients * shards_per_client`` shards, deal
      ``shards_per_client`` at random to each client (McMahan et al. 2017);
    * ``unequal``: IID contents, sizes proportional to log-normal(0, size_sigma) draws, each at
      least ``min_size``;
    * ``natural``: whole writers per client (``writers``: a writer index per record; FEMNIST),
      see :func:`natural_partition`.

    Each array is sorted; together they cover every record exactly once.
    """
    y = np.asarray(labels.cpu().numpy() if isinstance(labels, torch.Tensor) else labels)
    n = len(y)
    if num_clients < 1:
        raise ConfigError(f"num_clients must be >= 1, got {num_clients}")
    if n < num_clients * max(min_size, 1):
        raise ConfigError(
            f"{n} records cannot give {num_clients} clients at least {max(min_size, 1)} each"
        )
    if scheme == "iid":
        parts = np.array_split(rng.permutation(n), num_clients)
    elif scheme == "dirichlet":
        if not alpha > 0:
            raise ConfigError(f"alpha must be > 0, got {alpha}")
        parts = _dirichlet(y, num_clients, alpha, min_size, rng)
    elif scheme == "shards":
        if shards_per_client < 1 or num_clients * shards_per_client > n:
            raise ConfigError(
                f"cannot cut {n} records into {num_clients} x {shards_per_client} shards"
            )
        order = np.argsort(y, kind="stable")
        shards = np.array_split(order, num_clients * shards_per_client)
        dealt = rng.permutation(len(shards)).reshape(num_clients, shards_per_client)
        parts = [np.concatenate([shards[s] for s in row]) for row in dealt]
    elif scheme == "natural":
        if writers is None or len(writers) != n:
            raise ConfigError("partition scheme 'natural' needs a data set with writers "
                              "(femnist); this one has none")
        parts = natural_partition(writers, num_clients, rng=rng)
    elif scheme == "unequal":
        weights = rng.lognormal(0.0, size_sigma, num_clients)
        spare = n - num_clients * min_size
        sizes = min_size + np.floor(weights / weights.sum() * spare).astype(int)
        sizes[: n - sizes.sum()] += 1  # hand out the rounding remainder
        parts = np.split(rng.permutation(n), np.cumsum(sizes)[:-1])
    else:
        raise ConfigError(
            f"unknown partition scheme {scheme!r}; known: iid, dirichlet, shards, unequal, natural"
        )
    return [np.sort(p) for p in parts]


def split_groups(
    labels: np.ndarray, groups: Sequence[ClientGroup],
    rng: Callable[[str], np.random.Generator], writers: np.ndarray | None = None,
) -> list[list[np.ndarray]]:
    """Record indices per group (by ``data_share``; whole writers where the data set has
    them: :func:`group_members`) and then per client (the group's ``partition``).

    ``rng(name)``: the generator for ``"groups"`` (the cut into groups) and for each group's
    name (its partition). A group that cannot be partitioned is a :class:`ConfigError` naming
    ``clients.groups[i]``.
    """
    shares = [group.data_share for group in groups]
    every = group_members(len(labels), shares, rng("groups"), writers)
    result: list[list[np.ndarray]] = []
    for index, (group, members) in enumerate(zip(groups, every, strict=True)):
        size = len(members)
        where = f"clients.groups[{index}]"
        if size < group.count:
            raise ConfigError(
                f"{where}: data_share {group.data_share} gives {size} records for "
                f"{group.count} clients"
            )
        scheme = group.partition
        try:
            parts = partition(
                labels[members],
                group.count,
                scheme.scheme,
                rng=rng(group.name),
                alpha=scheme.alpha,
                shards_per_client=scheme.shards_per_client,
                size_sigma=scheme.size_sigma,
                min_size=group.batch_size if scheme.scheme == "dirichlet" else 1,
                writers=None if writers is None else writers[members],
            )
        except FedsimError as exc:
            raise ConfigError(f"{where}: cannot partition its data: {exc}") from None
        result.append([members[p] for p in parts])
    return result
