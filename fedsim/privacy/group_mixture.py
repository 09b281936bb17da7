"""The tight privacy of a group of records under Poisson sampling: a mixture of Gaussians.

Neighbouring relation: add/remove (``poisson`` steps only). Two data sets differ by a group of
g records, added to (or removed from) the data set together. Poisson sampling includes each of
them in a step's batch independently with probability q, so J ~ Binomial(g, q) of them are in
it, and each moves the clipped sum by at most C. With the group's gradients aligned (the worst
case), one step with noise multiplier sigma is, in units of C, the pair

    P = N(0, sigma^2)   against   Q = sum_j Binom(j; g, q) N(j, sigma^2),

which dominates every group of g records in both directions (*remove*: Q against P; *add*: P
against Q), each direction composed over the steps separately, delta(eps) the larger of the two
after composition (Ganesh, "Tight Group-Level DP Guarantees for DP-SGD with Sampling via
Mixture of Gaussians Mechanisms", arXiv 2401.10294, 2024; tight up to discretisation when every
iterate is released). For g = 1 it is the ordinary Poisson subsampled Gaussian. A group split
between added and removed records (some in D only, others in D' only) is no worse than the
whole group added: checked by numerical integration for g <= 4 and T <= 2 in
tests/privacy/test_group_mixture.py, not proven here.

The pair is computed by ``dp_accounting`` (its ``from_mixture_gaussian_mechanism``, the
distribution behind ``dp_event.MixtureOfGaussiansDpEvent``): pessimistic connect-the-dots
discretisation (Doroshenko, Ghazi, Kamath, Kumar & Manurangsi, PETS 2022), mass below its
truncation bound and beyond its composition window charged to +infinity, so every delta and eps
below is an upper bound (eps within about 0.1% of the exact value on the grid chosen here,
:func:`mixture_discretisation`). Like fedsim's own PLD it is not asked below
:data:`fedsim.config.limits.MIN_DELTA`, where FFT rounding is no longer negligible.

Every simplification is pessimistic, by one fact: a sensitivity law stochastically larger than
another gives a pair no more private (the likelihood ratio Q/P is increasing in x, so the
optimal tests are thresholds, whose power grows with every component's mean; the add direction
is the inverse trade-off function, which keeps the order, and composition keeps it too). So
Binomial masses below 1e-30 in the lower tail are moved up to the first kept count and those
in the upper tail to g itself, at most :data:`MAX_COMPONENTS` counts are kept (each run of
neighbouring counts merged into its largest), and a history of more than :data:`MAX_KINDS`
kinds of step is bucketed with q rounded up and sigma down (:func:`fedsim.privacy.pld.bucket`)
on a grid coarsened until it has at most that many kinds.

Fixed-size batches (replace-one neighbours) are not covered: a group's count in a batch of m
from N is hypergeometric and a replaced record moves the sum both ways, so those groups keep the
generic group bounds (:mod:`fedsim.privacy.group_answers`).
"""

from __future__ import annotations

import functools
import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import numpy as np
from dp_accounting.pld import privacy_loss_distribution
from scipy import special, stats

from fedsim.config import limits
from fedsim.errors import ConfigError
from fedsim.privacy.events import GaussianStep
from fedsim.privacy.pld import DEFAULT_BUCKET_RESOLUTION, bucket, grid_for_stds

# Binomial mass left in each tail before it is moved (pessimistically) onto a kept count.
TAIL_MASS = 1e-30
# Most mixture components per step, and most kinds of step composed (beyond: merged upwards).
MAX_COMPONENTS = 256
MAX_KINDS = 6
# Grid h: fedsim's PLD's rule (pld.grid_for_stds: the smallest per-step loss std over 10,
# kinds more than 100 times below the largest not refining it), within this range. Measured eps
# error 3e-4 to 1.1e-3 at s / 10 against s / 100 (g = 1 ... 100, q = 0.001 ... 1, sigma
# 0.5 ... 8, T = 10 ... 10^5), 4 times smaller at s / 20 for twice the time.
_MIN_H, _MAX_H = 1e-7, 1e-1
# Most points of one step's PMF (per direction): dp_accounting builds each in about 100 us
# (the user's group of 8: 4,800), so a step beyond is built on a coarser grid (still an upper
# bound, less tight), which bounds a build to a few seconds.
MAX_STEP_POINTS = 20_000
# eps beyond which e^eps overflows in dp_accounting's delta (delta is non-increasing in eps,
# so delta there bounds delta beyond).
_MAX_EPS = 700.0

Kind = tuple[float, float, int]  # (q, sigma, count)


def group_count_law(group: int, q: float) -> tuple[tuple[float, ...], tuple[float, ...]]:
    """(counts, probabilities): the law of the number of a group's ``group`` records in one
    Poisson batch of rate ``q``, Binomial(group, q), made stochastically larger where it is
    shortened (module docstring): lower tail moved up, upper tail onto ``group``, at most
    :data:`MAX_COMPONENTS` counts. Neighbouring relation: add/remove."""
    if isinstance(group, bool) or not isinstance(group, int) or group < 1:
        raise ConfigError(f"group size must be an integer >= 1, got {group!r}")
    if not 0.0 < q <= 1.0:
        raise ConfigError(f"q must be in (0, 1], got {q!r}")
    counts = np.arange(group + 1)
    probs = stats.binom.pmf(counts, group, q)
    below = np.cumsum(probs)
    above = stats.binom.sf(counts, group, q)  # P(J > j)
    low = int(np.argmax(below > TAIL_MASS))
    high = max(low, int(np.argmax(above <= TAIL_MASS)))
    kept = probs[low:high + 1].copy()
    kept[0] = below[low]
    edges = np.linspace(0, kept.size, min(kept.size, MAX_COMPONENTS) + 1).round().astype(int)
    merged = np.add.reduceat(kept, edges[:-1])
    tops = counts[low:high + 1][edges[1:] - 1]
    out_counts, out_probs = [float(c) for c in tops], [float(p) for p in merged]
    if high < group and above[high] > 0.0:
        out_counts.append(float(group))
        out_probs.append(float(above[high]))
    total = math.fsum(out_probs)
    return tuple(out_counts), tuple(p / total for p in out_probs)


def mixture_loss_std(counts: Sequence[float], probs: Sequence[float], sigma: float) -> float:
    """Standard deviation of one step's privacy loss ``log Q/P`` of the pair (module
    docstring), the smaller of its two directions' (under Q and under P), by quadrature. It
    sets the grid, nothing else."""
    mus = np.asarray(counts, dtype=float) / sigma
    weights = np.asarray(probs, dtype=float)
    z = np.linspace(-12.0, 12.0 + float(mus.max()), 20001)
    loss = special.logsumexp(np.outer(z, mus) - 0.5 * mus**2, b=weights, axis=1)
    log_p = stats.norm.logpdf(z)
    stds = []
    for log_w in (loss + log_p, log_p):
        w = np.exp(log_w - special.logsumexp(log_w))
        mean = float(np.sum(w * loss))
        stds.append(math.sqrt(max(float(np.sum(w * (loss - mean) ** 2)), 0.0)))
    return min(stds)


@functools.lru_cache(maxsize=256)
def _kind_std(q: float, sigma: float, group: int) -> float:
    return mixture_loss_std(*group_count_law(group, q), sigma)


def mixture_discretisation(kinds: Iterable[Kind], group: int) -> float:
    """The grid ``h`` of a history's mixture PLD: fedsim's PLD's rule
    (:func:`fedsim.privacy.pld.grid_for_stds`) on the mixture steps' loss stds, within
    ``[1e-7, 0.1]``; it depends on the kinds only, not on their counts."""
    stds = [_kind_std(q, sigma, group) for q, sigma, _ in kinds]
    if not stds:
        raise ConfigError("no steps")
    return grid_for_stds(min(stds), max(stds), lowest=_MIN_H, highest=_MAX_H)


def mixture_kinds(steps: Iterable[GaussianStep]) -> tuple[Kind, ...]:
    """A Poisson history as at most :data:`MAX_KINDS` kinds ``(q, sigma, count)``, sorted:
    exact where it has that few, else bucketed pessimistically (q up, sigma down) on a grid
    coarsened by factors of 2 from fedsim's PLD's until it fits. Raises :class:`ConfigError`
    for a fixed-size step (replace-one: not this pair)."""
    counts: dict[tuple[float, float], int] = {}
    for step in steps:
        if step.sampling != "poisson":
            raise ConfigError("the mixture bound is for Poisson sampling (add/remove) only")
        counts[(step.q, step.sigma)] = counts.get((step.q, step.sigma), 0) + step.count
    resolution = DEFAULT_BUCKET_RESOLUTION
    while len(counts) > MAX_KINDS:
        merged: dict[tuple[float, float], int] = {}
        for (q, sigma), count in counts.items():
            step = bucket(GaussianStep("poisson", q, sigma, count), resolution)
            merged[(step.q, step.sigma)] = merged.get((step.q, step.sigma), 0) + count
        counts, resolution = merged, resolution * 2.0
    return tuple(sorted((q, sigma, n) for (q, sigma), n in counts.items()))


@functools.lru_cache(maxsize=64)
def _step_pld(q: float, sigma: float, group: int,
              h: float) -> privacy_loss_distribution.PrivacyLossDistribution:
    """One step's pessimistic PLD (both directions) on the grid ``h``."""
    counts, probs = group_count_law(group, q)
    return privacy_loss_distribution.from_mixture_gaussian_mechanism(
        standard_deviation=sigma, sensitivities=list(counts), sampling_probs=list(probs),
        pessimistic_estimate=True, value_discretization_interval=h, use_connect_dots=True)


def _step_width(q: float, sigma: float, group: int) -> float:
    """The loss range one step's PMF spans (both directions), before it is built."""
    from dp_accounting.pld import privacy_loss_mechanism as mechanism

    counts, probs = group_count_law(group, q)
    width = 0.0
    for adjacency in (mechanism.AdjacencyType.REMOVE, mechanism.AdjacencyType.ADD):
        bounds = mechanism.MixtureGaussianPrivacyLoss(
            sigma, list(counts), list(probs), adjacency_type=adjacency).connect_dots_bounds()
        width = max(width, float(bounds.epsilon_upper) - float(bounds.epsilon_lower))
    return width


def mixture_pld(kinds: tuple[Kind, ...],
                group: int) -> privacy_loss_distribution.PrivacyLossDistribution:
    """The composed pessimistic PLD of a history's ``kinds`` for groups of ``group`` records
    (module docstring), on the grid :func:`mixture_discretisation` (coarser where a step's
    PMF would exceed :data:`MAX_STEP_POINTS`)."""
    h = mixture_discretisation(kinds, group)
    width = max(_step_width(q, sigma, group) for q, sigma, _ in kinds)
    while width / h > MAX_STEP_POINTS:
        h *= 2.0
    composed = None
    for q, sigma, count in kinds:
        one = _step_pld(q, sigma, group, h)
        part = one.self_compose(count) if count > 1 else one
        composed = part if composed is None else composed.compose(part)
    assert composed is not None
    return composed


@functools.lru_cache(maxsize=16)
def _mixture_pld_or_none(kinds: tuple[Kind, ...], group: int
                         ) -> privacy_loss_distribution.PrivacyLossDistribution | None:
    """:func:`mixture_pld`, or None where dp_accounting cannot build it (a loss beyond
    double range: no bound from this pair, the others still answer)."""
    try:
        with np.errstate(all="ignore"):
            return mixture_pld(kinds, group)
    except (ValueError, OverflowError, ZeroDivisionError, FloatingPointError, MemoryError):
        return None


@dataclass(frozen=True)
class MixtureBound:
    """The mixture bound of one Poisson history for groups of ``group`` records (module
    docstring; add/remove neighbours): upper bounds on delta(eps) and eps(delta)."""

    kinds: tuple[Kind, ...]
    group: int

    def _pld(self) -> privacy_loss_distribution.PrivacyLossDistribution | None:
        return _mixture_pld_or_none(self.kinds, self.group)

    def epsilon(self, delta: float) -> float:
        """eps at ``delta``; ``inf`` below :data:`~fedsim.config.limits.MIN_DELTA`."""
        if not 0.0 < delta < 1.0:
            raise ConfigError(f"delta must be in (0, 1), got {delta!r}")
        pld = self._pld()
        if delta < limits.MIN_DELTA or pld is None:
            return math.inf
        with np.errstate(all="ignore"):
            found = float(pld.get_epsilon_for_delta(delta))
        return math.inf if math.isnan(found) else max(0.0, found)

    def _deltas(self, epsilons: np.ndarray) -> np.ndarray:
        eps = np.asarray(epsilons, dtype=float)
        pld = self._pld()
        if pld is None:
            return np.ones_like(eps)
        with np.errstate(all="ignore"):
            values = np.asarray(pld.get_delta_for_epsilon(np.minimum(eps, _MAX_EPS)),
                                dtype=float).reshape(eps.shape)
        return np.where(np.isnan(values), 1.0, np.clip(values, 0.0, 1.0))

    def deltas(self, epsilons: np.ndarray) -> np.ndarray:
        """delta at each of ``epsilons`` (the larger direction's); 1 where it is below
        :data:`~fedsim.config.limits.MIN_DELTA` (not resolved: no claim)."""
        values = self._deltas(epsilons)
        return np.where(values < limits.MIN_DELTA, 1.0, values)

    def delta(self, epsilon: float) -> float:
        """delta at ``epsilon`` (1 where below :data:`~fedsim.config.limits.MIN_DELTA`)."""
        if not math.isfinite(epsilon):
            raise ConfigError(f"epsilon must be finite, got {epsilon!r}")
        return float(self.deltas(np.asarray([epsilon]))[0])

    def profile(self, points: int = 2001) -> tuple[np.ndarray, np.ndarray]:
        """(eps grid from 0 to eps at MIN_DELTA, delta there, floored at MIN_DELTA): the
        privacy profile a GDP fit or a trade-off curve is read from. Raises :class:`ConfigError` where eps at MIN_DELTA
        is infinite."""
        top = self.epsilon(limits.MIN_DELTA)
        if not math.isfinite(top):
            raise ConfigError("the mixture's privacy profile does not reach delta "
                              f"{limits.MIN_DELTA:g} at any finite eps")
        grid = np.linspace(0.0, max(top, 1e-9), points)
        return grid, np.maximum(self._deltas(grid), limits.MIN_DELTA)

    def complement(self, alphas: np.ndarray) -> np.ndarray:
        """Upper bounds on ``1 - f_g`` at ``alphas``: ``min_eps delta(eps) + e^eps alpha``
        over the profile's eps (each eps a supporting line of the curve, Dong, Roth & Su 2022,
        Prop. 2.12), 1 where no line is resolved."""
        alphas = np.asarray(alphas, dtype=float)
        try:
            grid, deltas = self.profile()
        except ConfigError:
            return np.ones_like(alphas)
        out = np.ones_like(alphas)
        with np.errstate(divide="ignore"):
            log_alphas = np.log(alphas)
        for start in range(0, alphas.size, 512):
            chunk = log_alphas[start:start + 512]
            lines = deltas[None, :] + np.exp(np.minimum(grid[None, :] + chunk[:, None], 700.0))
            out[start:start + 512] = np.min(lines, axis=1)
        return np.clip(np.minimum(out, 1.0), 0.0, 1.0)


def mixture_bound(steps: Iterable[GaussianStep], group: int) -> MixtureBound | None:
    """The mixture bound of a history for groups of ``group`` records, or None where it does
    not apply (a fixed-size step: replace-one neighbours; no steps)."""
    steps = list(steps)
    if not steps or any(s.sampling != "poisson" for s in steps):
        return None
    return MixtureBound(mixture_kinds(steps), group)
