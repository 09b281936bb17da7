"""Tight privacy-loss-distribution (PLD) accounting: the default ``pld`` accountant, a guarantee.

What is analysed (see :mod:`fedsim.privacy.events`):

* ``poisson`` steps, add/remove neighbours. One step with rate ``q`` and noise multiplier
  ``sigma`` (``mu = 1/sigma``) is the pair of distributions of Google's ``dp_accounting``
  (``from_gaussian_mechanism(sigma, sampling_prob=q)``): *remove* compares
  ``P = (1-q) N(0,1) + q N(mu,1)`` with ``Q = N(0,1)``, *add* compares ``Q`` with ``P``.
  A fixed pair of neighbouring data sets keeps its direction over the whole run, so each
  direction is composed separately and delta(eps) is the larger of the two *after*
  composition (Zhu, Dong & Wang, "Optimal accounting of differential privacy via
  characteristic function", AISTATS 2022, Sec. 5).
* ``fixed`` steps, replace-one neighbours, noise ``2 C sigma``: one step is
  ``C_q(G_{1/sigma}) = min{f_q, f_q^{-1}}^**`` with ``f_q = q G_{1/sigma} + (1-q) Id``
  (Dong, Roth & Su, "Gaussian Differential Privacy", JRSS-B 2022, Thm 4.2), and T steps are
  its tensor power ``C_q(G_{1/sigma})^{(x)T}`` (their Thm 5.1, computed here numerically, not
  by the CLT). By convex duality the symmetrised curve has, for every eps,
  ``delta_C(eps) = max(delta_remove(eps), delta_add(eps))`` (the conjugate of the convex hull
  of a minimum is the maximum of the conjugates): the maximum is taken *per step*, before
  composition. This construction reproduces the reference values 1.067 / 3.069 / 7.208 for
  the MNIST runs of Dong-Roth-Su Fig. 7 (n=60000, m=256, delta=1e-5), whereas taking the
  maximum *after* composition would give the Poisson numbers 0.8645 / 2.3817 / 5.6397, which
  is not a valid bound for replace-one neighbours.

How it is computed:

1. Each distinct step is discretised on the grid ``h Z`` with the pessimistic
   *connect-the-dots* algorithm (Doroshenko, Ghazi, Kamath, Kumar & Manurangsi, PETS 2022,
   Alg. 1), written per gap between grid points (:mod:`fedsim.privacy.pld_step`,
   :func:`~fedsim.privacy.pld_step.hat_split`): each gap's P-mass, from Gaussian interval
   probabilities in log space (``log_ndtr``), is split between its two
   ends so that its P- and Q-masses are kept. Every mass is >= 0 and no two nearly equal
   deltas are subtracted (the earlier formula in delta differences made a step sum to
   1 + 7e-9 at q = 1e-4, and its clipped noise erased the composed upper tail; issue 23).
   The result dominates the true step for every eps, so every number below is an upper bound.
2. Histories with more than ``bucket_above`` (32) distinct kinds of step are bucketed
   pessimistically: sigma is rounded *down* and q *up* to a geometric grid of relative
   resolution ``bucket_resolution`` (2^-9; smaller sigma and larger q are never more private),
   which costs about 0.2-0.5% of eps. Shorter mixes are computed exactly. Identical buckets are
   self-composed.
3. All buckets are multiplied in the Fourier domain, as a sum of fixed-point log-spectra that
   a history extends step by step (:mod:`fedsim.privacy.pld_state`: exact, so the
   incremental and the one-shot composition are the same numbers), on a window chosen from
   Chernoff bounds on the composed loss; mass that may fall outside the window is charged to
   delta (moved to +infinity).
4. eps(delta) and delta(eps) of the composed PMF come from suffix sums over its atoms (the
   formulas of ``dp_accounting``'s ``DensePLDPmf``, vectorised), in log space where the
   support is wider than 700 nats so that nothing overflows.

The grid ``h`` is chosen adaptively unless given: the relative eps error of connect-the-dots
behaves like ``0.07 (h / s)^2`` where ``s ~ min(q sqrt(e^{mu^2}-1), mu)`` is the standard
deviation of one step's privacy loss (measured against dp_accounting on the issue's grid, both
schemes, T = 100 ... 10^4), so ``h = s / 10`` (snapped down to a quarter-octave grid) keeps
it near 0.1% even for eps < 0.05, where a fixed ``h`` fails (at ``h = 1e-2`` eps is off by
several hundred percent for q = 0.001, sigma = 4).

When the grid changes. ``h`` follows the kinds of step the history holds, so a step of a new
kind can make it finer (a near-free step, sigma = 1000, has a tiny loss std: the grid gets 100
times finer) or coarser (a much less private kind: the finest kind is held to 1/100 of the
largest loss std), and the whole history is then discretised on the new grid. Every answer is
still an upper bound (a pessimistic composition of the whole history), but eps at a fixed delta
can read a little *below* the answer before that step: 272 Poisson steps at q = 128/3890,
sigma 1.2 read 2.4981 at delta 1e-5, the same plus one step at sigma 1000 read 2.4965
(dp_accounting at a grid of 1e-4 reads 2.4965 pessimistic and 2.4829 optimistic for both).
The fall is the grid's discretisation error: at most 8.7e-4 of eps over 300 random histories
of 2-4 kinds (both schemes, deltas 1e-5 to 1e-10), held below 1e-3 by
tests/privacy/test_pld_grid_change.py. Exactly monotone answers would need each finished
stretch's answers kept as a floor: a composition per grid change, tried and not kept (it made
calibrated schedules about ten times slower).
"""

from __future__ import annotations

import functools
import math
from collections import OrderedDict
from collections.abc import Iterable, Sequence
from typing import Any

import numpy as np

from fedsim.errors import ConfigError, PrivacyError
from fedsim.privacy.accountant import Accountant
from fedsim.privacy.events import GaussianStep, Sampling
from fedsim.privacy.pld_state import (
    FactorSummary,
    SpectrumSum,
    fixed_point_spectrum,
    summarise,
    window,
)
from fedsim.privacy.pld_step import LossPmf, step_loss_std, step_pmfs

DEFAULT_TAIL_MASS = 1e-15
DEFAULT_BUCKET_RESOLUTION = 2.0**-9
DEFAULT_BUCKET_ABOVE = 32
# h = s / _H_PER_STEP_STD (see module docstring for the measured error model).
_H_PER_STEP_STD = 10.0
# Kinds whose per-step loss std is more than this factor below the largest one do not refine
# the grid further (they contribute little; this bounds the grid size of mixed ledgers).
_MAX_STD_RATIO = 100.0
_MIN_H, _MAX_H = 1e-9, 1e-2


# -- bucketing and the grid ------------------------------------------------------------------------
def bucket(step: GaussianStep, resolution: float) -> GaussianStep:
    """Round sigma down and q up to the geometric grid ``exp(k * resolution)`` (pessimistic:
    a smaller sigma or a larger q is never more private)."""
    if resolution <= 0:
        return step
    sigma = min(
        step.sigma, math.exp(math.floor(math.log(step.sigma) / resolution + 1e-9) * resolution)
    )
    q = (
        1.0
        if step.q == 1.0
        else min(
            1.0, max(step.q, math.exp(math.ceil(math.log(step.q) / resolution - 1e-9) * resolution))
        )
    )
    return GaussianStep(step.sampling, q, sigma, step.count)


@functools.lru_cache(maxsize=4096)
def _bucketed_kind(kind: tuple[Sampling, float, float], resolution: float) -> GaussianStep:
    """:func:`bucket` of one step of ``kind``, remembered: a ledger composes the same kind
    round after round (a fresh step a spend was 1% of a 1,000-client run's CPU)."""
    return bucket(GaussianStep(*kind), resolution)


def adaptive_discretisation(steps: Iterable[GaussianStep]) -> float:
    """Grid ``h`` for a set of step kinds: a tenth of the smallest per-step loss std, floored at
    1/100 of the largest (see module docstring), snapped down to ``2^{k/4}``.

    It depends only on the distinct kinds, not on counts, so eps is monotone in counts.
    """
    stds = [step_loss_std(s.q, s.sigma) for s in steps]
    if not stds:
        return _MAX_H
    return grid_for_stds(min(stds), max(stds))


def grid_for_stds(smallest: float, largest: float, *, lowest: float = _MIN_H,
                  highest: float = _MAX_H) -> float:
    """:func:`adaptive_discretisation` from the smallest and largest per-step loss std, kept
    within ``[lowest, highest]`` before it is snapped (a group's mixture PLD,
    :mod:`fedsim.privacy.group_mixture`, keeps its own range)."""
    target = max(smallest, largest / _MAX_STD_RATIO) / _H_PER_STEP_STD
    target = min(max(target, lowest), highest)
    return float(2.0 ** (math.floor(4.0 * math.log2(target)) / 4.0))


# -- composition (incremental; see fedsim.privacy.pld_state) ------------------------------------
Kind = tuple[Sampling, float, float]


@functools.lru_cache(maxsize=4096)
def factor_summaries(sampling: Sampling, q: float, sigma: float,
                     h: float) -> tuple[FactorSummary, ...]:
    """The window data of one step's PMFs (one per direction), see :func:`step_pmfs`."""
    return tuple(summarise(p.probs, p.lower, p.infinity_mass)
                 for p in step_pmfs(sampling, q, sigma, h))


@functools.lru_cache(maxsize=32)
def factor_spectrum(sampling: Sampling, q: float, sigma: float, h: float, size: int,
                    direction: int) -> tuple[np.ndarray, np.ndarray]:
    """One step's fixed-point log-spectrum at FFT size ``size`` in one direction. The cache is
    small: a ledger extends its state with few kinds at a time (a few MB at most)."""
    return fixed_point_spectrum(step_pmfs(sampling, q, sigma, h)[direction].probs, size)


def composed_pmfs(kinds: Sequence[tuple[Kind, int]], h: float, tail_mass: float,
                  sums: list[SpectrumSum | None] | None = None) -> tuple[LossPmf, ...]:
    """One composed PMF per direction (Poisson: remove, add; fixed: symmetrised) of ``count``
    copies of each kind, ``kinds`` sorted. ``sums``, if given, holds each direction's running
    :class:`SpectrumSum` of exactly these counts (or None); a sum at the wrong FFT size is
    rebuilt in place from the counts. The result is the same either way (bit for bit)."""
    directions = 2 if kinds[0][0][0] == "poisson" else 1
    if sums is None:
        sums = [None] * directions
    out = []
    for d in range(directions):
        where = window([(factor_summaries(*k, h)[d], n) for k, n in kinds], tail_mass)
        held = sums[d]
        if held is None or held.size != where.size:
            held = SpectrumSum(where.size)
            for k, n in kinds:
                held.add(factor_spectrum(*k, h, where.size, d), n)
            sums[d] = held
        probs, _ = held.invert(where)
        charge = tail_mass if where.truncated else 0.0
        out.append(LossPmf(h, where.lower + where.lo, probs,
                           min(1.0, where.infinity_mass + charge)))
    return tuple(out)


# eps(delta) answers keyed by (composed kinds, h, tail, delta): ledgers ask the same questions
# for many clients with the same history.
_EPSILONS: OrderedDict[tuple[Any, ...], float] = OrderedDict()
_EPSILONS_MAX = 65536
# Accountants with at least this many composed kinds keep their spectrum sums between answers
# (and extend them step by step); fewer kinds rebuild them per answer (a few FFTs) and keep
# no O(FFT size) state.
_KEEP_SUMS_KINDS = 4


# -- the accountant --------------------------------------------------------------------------------
class PLDAccountant(Accountant):
    """Tight PLD accountant (a guarantee: eps and delta are upper bounds, beta a lower bound).

    Settings:
        value_discretization: grid ``h`` of the privacy loss; ``None`` (default) chooses it
            from the steps (see :func:`adaptive_discretisation`).
        bucket_resolution: relative grid for pessimistic bucketing of sigma (down) and q (up);
            ``0`` disables bucketing. The default 2^-9 costs at most ~0.4% of eps.
        bucket_above: bucket only histories with more than this many distinct kinds.
        tail_mass: probability mass the composition may move to +infinity per direction.
    """

    name = "pld"

    def __init__(
        self,
        steps: Iterable[GaussianStep] = (),
        *,
        value_discretization: float | None = None,
        bucket_resolution: float = DEFAULT_BUCKET_RESOLUTION,
        bucket_above: int = DEFAULT_BUCKET_ABOVE,
        tail_mass: float = DEFAULT_TAIL_MASS,
    ) -> None:
        if value_discretization is not None and not (0 < value_discretization <= 1):
            raise ConfigError(
                f"value_discretization must be in (0, 1], got {value_discretization!r}"
            )
        if not (0 <= bucket_resolution < 0.1):
            raise ConfigError(f"bucket_resolution must be in [0, 0.1), got {bucket_resolution!r}")
        if not (0 < tail_mass < 1e-6):
            raise ConfigError(f"tail_mass must be in (0, 1e-6), got {tail_mass!r}")
        self.value_discretization = value_discretization
        if isinstance(bucket_above, bool) or not isinstance(bucket_above, int) or bucket_above < 0:
            raise ConfigError(f"bucket_above must be an integer >= 0, got {bucket_above!r}")
        self.bucket_resolution = bucket_resolution
        self.bucket_above = bucket_above
        self.tail_mass = tail_mass
        self._init_state()
        super().__init__(steps)

    def settings(self) -> dict[str, Any]:
        return {
            "value_discretization": self.value_discretization,
            "bucket_resolution": self.bucket_resolution,
            "bucket_above": self.bucket_above,
            "tail_mass": self.tail_mass,
        }

    # -- incremental state --------------------------------------------------------------------
    def _init_state(self) -> None:
        self._bucket_counts: dict[Kind, int] = {}
        self._raw_stds = (math.inf, 0.0)  # smallest, largest per-step loss std over kinds
        self._bucket_stds = (math.inf, 0.0)
        self._sums: list[SpectrumSum | None] | None = None
        self._sums_for: tuple[bool, float] | None = None
        self._pending: dict[Kind, int] = {}  # composed into the counts, not yet into _sums
        self._answers: dict[float, float] = {}
        self._pmfs: tuple[LossPmf, ...] | None = None

    def _extend(self, step: GaussianStep, *, new_kind: bool) -> None:
        self._answers = {}
        self._pmfs = None
        if new_kind:
            self._raw_stds = _widen(self._raw_stds, step)
        bucketed = _bucketed_kind(step.key, self.bucket_resolution)
        held = self._bucket_counts.get(bucketed.key)
        self._bucket_counts[bucketed.key] = step.count if held is None else held + step.count
        if held is None:
            self._bucket_stds = _widen(self._bucket_stds, bucketed)
        if self._sums is None:
            return
        if self._sums_for != (self._bucketed(), self.discretisation()):
            self._sums, self._pending = None, {}  # another regime or grid: rebuilt when asked
            return
        # Added to the sums at the next answer, grouped by kind (integer sums: same result).
        kind = bucketed.key if self._sums_for[0] else step.key
        self._pending[kind] = self._pending.get(kind, 0) + step.count

    def _copy_caches_from(self, other: Accountant) -> None:
        assert isinstance(other, PLDAccountant)
        if other.kinds >= _KEEP_SUMS_KINDS and (other._sums is None or other._pending):
            # Bring the state up to date once (built, or extended by what was composed
            # since): this dry run and the next ones copy it instead of redoing that work.
            other.pmfs()
        self._pending = dict(other._pending)
        self._bucket_counts = dict(other._bucket_counts)
        self._sums = None if other._sums is None else [
            None if s is None else s.copy() for s in other._sums]
        self._answers = dict(other._answers)

    def _bucketed(self) -> bool:
        return self.kinds > self.bucket_above

    def composed_kinds(self) -> list[tuple[Kind, int]]:
        """The history as composed, sorted: bucketed (see :func:`bucket`) only when it has
        more than ``bucket_above`` distinct kinds (shorter mixes are computed exactly)."""
        return sorted((self._bucket_counts if self._bucketed() else self._counts).items())

    # -- computation ----------------------------------------------------------------------------
    def bucketed_steps(self) -> tuple[GaussianStep, ...]:
        """The history as composed, as steps (see :meth:`composed_kinds`)."""
        return tuple(GaussianStep(s, q, sigma, n) for (s, q, sigma), n in self.composed_kinds())

    def discretisation(self) -> float:
        """The grid ``h`` used for the current history."""
        if self.value_discretization is not None:
            return self.value_discretization
        smallest, largest = self._bucket_stds if self._bucketed() else self._raw_stds
        return grid_for_stds(smallest, largest) if largest > 0 else grid_for_stds(1.0, 1.0)

    def pmfs(self) -> tuple[LossPmf, ...]:
        """Composed PMFs, one per direction (Poisson: remove, add; fixed: symmetrised)."""
        if not self.kinds:
            raise PrivacyError("no steps composed")
        if self._pmfs is None:
            kinds = self.composed_kinds()
            h = self.discretisation()
            key = (self._bucketed(), h)
            sums = self._sums if self._sums is not None and self._sums_for == key else None
            if sums is None:
                sums = [None] * (2 if kinds[0][0][0] == "poisson" else 1)
            else:
                for kind, count in sorted(self._pending.items()):
                    for d, held in enumerate(sums):
                        if held is not None:
                            held.add(factor_spectrum(*kind, h, held.size, d), count)
            self._pending = {}
            self._pmfs = composed_pmfs(kinds, h, self.tail_mass, sums)
            keep = len(kinds) >= _KEEP_SUMS_KINDS
            self._sums, self._sums_for = (sums, key) if keep else (None, None)
        return self._pmfs

    # -- answers ----------------------------------------------------------------------------------
    def epsilon(self, delta: float) -> float:
        _check_delta(delta)
        if not self.kinds:
            return 0.0
        hit = self._answers.get(delta)
        if hit is not None:
            return hit
        key = (tuple(self.composed_kinds()), self.discretisation(), self.tail_mass, delta)
        hit = _EPSILONS.get(key)
        if hit is None:
            hit = max(0.0, max(p.epsilon(delta) for p in self.pmfs()))
            _EPSILONS[key] = hit
            if len(_EPSILONS) > _EPSILONS_MAX:
                _EPSILONS.popitem(last=False)
        self._answers[delta] = hit
        return hit

    def delta(self, epsilon: float) -> float:
        if not math.isfinite(epsilon):
            raise ConfigError(f"epsilon must be finite, got {epsilon!r}")
        if not self.kinds:
            return max(0.0, -math.expm1(epsilon))
        return max(p.delta(epsilon) for p in self.pmfs())

    def delta_curve(self, epsilons: np.ndarray) -> np.ndarray:
        """delta(eps) on many eps at once (the max over directions)."""
        eps = np.asarray(epsilons, dtype=float)
        if not self.kinds:
            return np.asarray(np.maximum(0.0, -np.expm1(eps)), dtype=float)
        return np.asarray(np.max([p.deltas(eps) for p in self.pmfs()], axis=0), dtype=float)

    def tradeoff(self, alpha: np.ndarray) -> np.ndarray:
        """beta(alpha) = sup_eps max(0, 1 - delta(eps) - e^eps alpha) (Dong-Roth-Su Prop. 2.12).

        delta is the max over directions, so this is ``min(f_remove, f_add)^**``, a valid
        lower bound on the trade-off curve. For a discrete PLD the supremum is attained at the
        atoms; up to 4000 of them (the ones carrying the curve) are used, which can only lower
        beta (every eps gives a valid supporting line).
        """
        alpha = np.clip(np.asarray(alpha, dtype=float), 0.0, 1.0)
        if not self.kinds:
            return 1.0 - alpha
        atoms = np.unique(
            np.concatenate(
                [(p.lower + np.flatnonzero(p.probs > 1e-300)) * p.h for p in self.pmfs()]
            )
        )
        if atoms.size > 4000:
            atoms = atoms[np.linspace(0, atoms.size - 1, 4000).astype(int)]
        deltas = self.delta_curve(atoms)
        beta = np.zeros_like(alpha)
        for start in range(0, alpha.size, 256):
            chunk = alpha[start : start + 256]
            # e^eps alpha in log space, capped at e^700 (such a line is far below 0 anyway)
            log_chunk = np.full(chunk.size, -np.inf)
            log_chunk[chunk > 0] = np.log(chunk[chunk > 0])
            scaled = np.exp(np.minimum(atoms[None, :] + log_chunk[:, None], 700.0))
            lines = 1.0 - deltas[None, :] - scaled
            beta[start : start + 256] = np.max(lines, axis=1)
        return np.asarray(np.clip(np.minimum(beta, 1.0 - alpha), 0.0, 1.0), dtype=float)


def _widen(stds: tuple[float, float], step: GaussianStep) -> tuple[float, float]:
    std = step_loss_std(step.q, step.sigma)
    return min(stds[0], std), max(stds[1], std)


def _check_delta(delta: float) -> None:
    if not (isinstance(delta, int | float) and 0.0 < delta < 1.0):
        raise ConfigError(f"delta must be in (0, 1), got {delta!r}")
