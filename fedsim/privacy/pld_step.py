"""One step's privacy-loss distribution for the ``pld`` accountant (:mod:`fedsim.privacy.pld`,
whose module docstring states what is analysed and cites the results): its exact hockey-stick
divergences, and its PMF discretised pessimistically on a grid ``h Z`` by connect-the-dots
(Doroshenko, Ghazi, Kamath, Kumar & Manurangsi, PETS 2022, Alg. 1), written per gap between
grid points from Gaussian interval probabilities in log space (:func:`hat_split`).

Neighbouring relations: a ``poisson`` step's PMFs are its *remove* and *add* directions
(add/remove neighbours); a ``fixed`` step's is the symmetrised ``C_q(G_{1/sigma})``
(replace-one neighbours; Dong, Roth & Su, "Gaussian Differential Privacy", Thm 4.2). Each
dominates the true step for every eps: every eps built on them is an upper bound.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass

import numpy as np
from scipy import special

from fedsim.errors import PrivacyError
from fedsim.privacy.events import Sampling

# Per-step probability mass left out of the discretised support (charged to delta as mass at
# +infinity); 1e-20 per step keeps the total below 1e-13 even for 10^7 steps.
STEP_TAIL_MASS = 1e-20
_STEP_TAIL_Z = float(-special.ndtri(STEP_TAIL_MASS))

# Largest uniform part of a one-step grid (points); beyond it a step is refused.
_MAX_STEP_GRID = 5_000_000


# -- one step: exact hockey-stick divergences ---------------------------------------------------
def _log_mix_shift(eps: np.ndarray, q: float) -> np.ndarray:
    """log((e^eps - (1-q)) / q), the log of the likelihood-ratio term that reaches loss eps."""
    # -inf at the edge of the support is the right limit, and so is +inf past e^709 (a loss
    # reached only beyond float's range: no mass is left there; a stranger saw numpy's
    # overflow warning from `fedsim account --sigma 0.01`)
    with np.errstate(divide="ignore", over="ignore"):
        return np.asarray(np.log(np.expm1(eps) + q) - math.log(q), dtype=float)


def hockey_stick_remove(eps: np.ndarray, q: float, sigma: float) -> np.ndarray:
    """delta(eps) of the *remove* pair ``P = (1-q)N(0,1) + qN(mu,1)`` vs ``Q = N(0,1)``.

    The loss ``log((1-q) + q e^{mu x - mu^2/2})`` is increasing in x, so the optimal set is
    ``{x > x_eps}`` and delta = P(x > x_eps) - e^eps Q(x > x_eps).
    """
    eps = np.asarray(eps, dtype=float)
    mu = 1.0 / sigma
    out = -np.expm1(eps)  # eps <= log(1-q): the whole space is the optimal set
    live = eps > math.log1p(-q) if q < 1.0 else np.ones_like(eps, dtype=bool)
    e = eps[live]
    x = (_log_mix_shift(e, q) + 0.5 * mu * mu) / mu
    upper = (1.0 - q) * special.ndtr(-x) + q * special.ndtr(mu - x)
    out[live] = upper - np.exp(e + special.log_ndtr(-x))
    return np.asarray(np.clip(out, 0.0, 1.0), dtype=float)


def hockey_stick_add(eps: np.ndarray, q: float, sigma: float) -> np.ndarray:
    """delta(eps) of the *add* pair ``Q = N(0,1)`` vs ``P = (1-q)N(0,1) + qN(mu,1)``.

    The loss ``-log((1-q) + q e^{mu x - mu^2/2})`` is decreasing in x; it never exceeds
    ``-log(1-q)``, beyond which delta is 0.
    """
    eps = np.asarray(eps, dtype=float)
    mu = 1.0 / sigma
    out = np.zeros_like(eps)
    live = eps < -math.log1p(-q) if q < 1.0 else np.ones_like(eps, dtype=bool)
    e = eps[live]
    x = (_log_mix_shift(-e, q) + 0.5 * mu * mu) / mu
    lower = (1.0 - q) * special.ndtr(x) + q * special.ndtr(x - mu)
    out[live] = special.ndtr(x) - np.exp(e) * lower
    return np.asarray(np.clip(out, 0.0, 1.0), dtype=float)


def _loss_remove(x: float, q: float, mu: float) -> float:
    return (
        float(np.logaddexp(math.log1p(-q), math.log(q) + mu * x - 0.5 * mu * mu))
        if q < 1.0
        else mu * x - 0.5 * mu * mu
    )


def step_loss_std(q: float, sigma: float) -> float:
    """Approximate standard deviation of one step's privacy loss (sets the grid, nothing else)."""
    mu = 1.0 / sigma
    subsampled = q * math.sqrt(math.expm1(mu * mu)) if mu * mu < 700 else math.inf
    return min(subsampled, mu)


# -- discretised PMFs ---------------------------------------------------------------------------
@dataclass(frozen=True, slots=True, eq=False)
class LossPmf:
    """A privacy-loss PMF on the grid ``h * (lower + arange(len(probs)))`` plus mass at +inf."""

    h: float
    lower: int
    probs: np.ndarray
    infinity_mass: float

    def _suffix_sums(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Losses l_k, ``A_k = sum_{j>=k} p_j`` and ``log B_k = log sum_{j>=k} p_j e^{-l_j}``
        (each with a final entry for the empty suffix: 0 and -inf).

        ``B`` is summed with the factor ``e^{l_max}`` taken out when the support spans less
        than 700 nats; wider supports (large eps: many steps of little noise) would overflow
        ``e^{l_max - l_j}``, so their sums run in log space (``logaddexp``) instead.
        """
        losses = (self.lower + np.arange(self.probs.size)) * self.h
        mass_above = np.concatenate([np.cumsum(self.probs[::-1])[::-1], [0.0]])
        log_weighted = np.full(self.probs.size + 1, -np.inf)
        if losses[-1] - losses[0] < 700.0:
            shift = losses[-1]
            weighted = np.cumsum((self.probs * np.exp(shift - losses))[::-1])[::-1]
            positive = weighted > 0
            log_weighted[:-1][positive] = np.log(weighted[positive]) - shift
        else:
            log_terms = np.full(self.probs.size, -np.inf)
            positive = self.probs > 0
            log_terms[positive] = np.log(self.probs[positive]) - losses[positive]
            log_weighted[:-1] = np.logaddexp.accumulate(log_terms[::-1])[::-1]
        return losses, mass_above, log_weighted

    def delta(self, epsilon: float) -> float:
        return float(self.deltas(np.array([float(epsilon)]))[0])

    def epsilon(self, delta: float) -> float:
        """Smallest eps with delta(eps) <= delta (``inf`` if the mass at +inf exceeds delta).

        Same result as ``dp_accounting``'s ``DensePLDPmf.get_epsilon_for_delta`` (tested), but
        vectorised: on (l_{k-1}, l_k] the atoms above eps are fixed, so
        ``delta(eps) = inf + A_k - e^eps B_k`` with suffix sums A, B, solved in closed form.
        Every exponent is at most the log of a probability (no overflow for any support).
        """
        if self.infinity_mass >= delta:
            return math.inf
        losses, mass_above, log_weighted = self._suffix_sums()
        # delta at each atom l_k (atoms strictly above it: k+1 ...); l_k + log B_{k+1} <= 0
        at_atoms = (self.infinity_mass + mass_above[1:]
                    - np.exp(losses + log_weighted[1:]))
        k = int(np.argmax(at_atoms <= delta))  # at_atoms[-1] = infinity_mass <= delta
        numerator = self.infinity_mass + mass_above[k] - delta
        if log_weighted[k] == -np.inf or numerator <= 0:
            return float(losses[k])
        return float(math.log(numerator) - log_weighted[k])

    def deltas(self, epsilons: np.ndarray) -> np.ndarray:
        """delta(eps) for many eps at once (suffix sums; no per-eps loop, no overflow)."""
        losses, mass_above, log_weighted = self._suffix_sums()
        eps = np.asarray(epsilons, dtype=float)
        first_above = np.searchsorted(losses, eps, side="right")
        # eps < l_j for every atom in the suffix, so eps + log B <= log A <= 0
        out = mass_above[first_above] - np.exp(eps + log_weighted[first_above])
        return np.asarray(np.clip(out + self.infinity_mass, 0.0, 1.0), dtype=float)



# Relative error allowed for in the log-ratio of an interval's two masses (float error of
# log_ndtr differences is far below it); see :func:`hat_pmf`.
_LOG_RATIO_SLACK = 2.0**-36


def _log1mexp(d: np.ndarray) -> np.ndarray:
    """log(1 - e^d) for d <= 0, accurate for d near 0 and d very negative (Maechler 2012)."""
    with np.errstate(divide="ignore"):
        return np.where(d > -math.log(2.0), np.log(-np.expm1(d)), np.log1p(-np.exp(d)))


def log_gauss_mass(a: np.ndarray | float, b: np.ndarray | float) -> np.ndarray:
    """log(Phi(b) - Phi(a)) for a <= b (+-inf allowed), with relative accuracy in both tails:
    the difference is taken between the two values on the side where both are small
    (``log_ndtr``), never between two numbers near 1."""
    a, b = np.broadcast_arrays(np.asarray(a, dtype=float), np.asarray(b, dtype=float))
    upper = a > 0  # both in the upper tail: Phi(-a) - Phi(-b)
    # (each side's argument chosen first: one log_ndtr a side, not both and a choice)
    big = special.log_ndtr(np.where(upper, -a, b))
    small = special.log_ndtr(np.where(upper, -b, a))
    with np.errstate(invalid="ignore"):
        out = big + _log1mexp(np.minimum(small - big, 0.0))
    return np.asarray(np.where(big == -np.inf, -np.inf, out), dtype=float)


def _log_mixture_mass(a: np.ndarray | float, b: np.ndarray | float, q: float,
                      mu: float, unshifted: np.ndarray | None = None) -> np.ndarray:
    """log of ``((1-q) N(0,1) + q N(mu,1))([a, b])``; ``unshifted``: ``log_gauss_mass(a, b)``
    when the caller has it already (the segments need it on its own too)."""
    shifted = math.log(q) + log_gauss_mass(a - mu, b - mu)
    if q == 1.0:
        return shifted
    if unshifted is None:
        unshifted = log_gauss_mass(a, b)
    return np.asarray(np.logaddexp(math.log1p(-q) + unshifted, shifted), dtype=float)


def _boundaries(eps: np.ndarray, q: float, mu: float) -> np.ndarray:
    """x with ``log((1-q) + q e^{mu x - mu^2/2}) = eps`` (-inf where eps <= log(1-q))."""
    if q == 1.0:
        return np.asarray((eps + 0.5 * mu * mu) / mu, dtype=float)
    x = np.full(eps.shape, -np.inf)
    live = eps > math.log1p(-q)
    x[live] = (_log_mix_shift(eps[live], q) + 0.5 * mu * mu) / mu
    return x


@dataclass(frozen=True, slots=True)
class Segments:
    """A privacy loss L (under P) cut at the grid ``eps``: for each gap ``(eps_k, eps_k+1]``
    the log-masses ``log P(L in gap)`` and ``log Q(L in gap)`` (``Q(A) = E_P[e^{-L}; A]``),
    and the log P-masses below ``eps_0`` and above the last point."""

    eps: np.ndarray
    log_p: np.ndarray
    log_q: np.ndarray
    log_below: float
    log_above: float


def remove_segments(eps: np.ndarray, q: float, sigma: float) -> Segments:
    """The *remove* pair ``P = (1-q)N(0,1) + qN(mu,1)`` vs ``Q = N(0,1)``: L increasing in x."""
    mu = 1.0 / sigma
    x = _boundaries(eps, q, mu)
    null = log_gauss_mass(x[:-1], x[1:])
    return Segments(eps, _log_mixture_mass(x[:-1], x[1:], q, mu, null), null,
                    float(_log_mixture_mass(-np.inf, x[0], q, mu)),
                    float(_log_mixture_mass(x[-1], np.inf, q, mu)))


def add_segments(eps: np.ndarray, q: float, sigma: float) -> Segments:
    """The *add* pair ``Q = N(0,1)`` vs ``P = (1-q)N(0,1) + qN(mu,1)``: L = -log(...)
    decreasing in x, so L in (eps_k, eps_k+1] is x in [x_k+1, x_k)."""
    mu = 1.0 / sigma
    x = _boundaries(-eps, q, mu)
    null = log_gauss_mass(x[1:], x[:-1])
    return Segments(eps, null, _log_mixture_mass(x[1:], x[:-1], q, mu, null),
                    float(log_gauss_mass(x[0], np.inf)), float(log_gauss_mass(-np.inf, x[-1])))


def hat_split(seg: Segments) -> tuple[np.ndarray, np.ndarray]:
    """Each gap's P-mass split between its two end points so that both P(gap) and Q(gap) are
    kept: ``(to the left end, to the right end)``.

    This is the pessimistic connect-the-dots discretisation (Doroshenko et al., PETS 2022,
    Alg. 1: the PMF whose delta(eps) equals the mechanism's at every grid point and is
    linear in e^eps between them, hence above it) written per gap, with no differences of
    delta values: the right share is ``P (1 - e^{eps_k} Q/P) / (1 - e^{-gap})`` with
    ``log(Q/P)`` from log-masses, so every share is >= 0 and accurate to a relative
    ``~1e-11 / gap``. The log-ratio is lowered by a slack well above its float error, which
    can only move mass up (pessimistic).
    """
    eps = seg.eps
    gaps = np.diff(eps)
    with np.errstate(invalid="ignore"):
        z = eps[:-1] + seg.log_q - seg.log_p  # log(e^{eps_k} Q / P), in [-gap, 0]
    slack = _LOG_RATIO_SLACK * (1.0 + np.abs(eps[:-1]) + np.abs(seg.log_q))
    share = -np.expm1(np.minimum(z - slack, 0.0)) / -np.expm1(-gaps)
    share = np.where(np.isfinite(seg.log_p), np.clip(np.nan_to_num(share, nan=1.0), 0.0, 1.0), 0.0)
    mass = np.exp(seg.log_p)
    right = mass * share
    return mass - right, right


def hat_pmf(h: float, indices: np.ndarray, seg: Segments) -> LossPmf:
    """The pessimistic connect-the-dots PMF of one loss (see :func:`hat_split`): mass below
    the first point goes to it, mass above the last point to +infinity."""
    left, right = hat_split(seg)
    lower = int(indices[0])
    probs = np.zeros(int(indices[-1]) - lower + 1)
    where = indices - lower
    probs[where[:-1]] += left
    probs[where[1:]] += right
    probs[0] += math.exp(seg.log_below)
    return LossPmf(h, lower, probs, math.exp(seg.log_above))


# One-step grids: uniform on the core |eps| <= _CORE_STEP_STDS * s (+ |log(1-q)|), where the
# mass is; beyond it the gap grows geometrically by _TAIL_GAP_GROWTH (the far tail carries
# little mass, and connect-the-dots stays pessimistic on any grid).
_CORE_STEP_STDS = 100.0
_TAIL_GAP_GROWTH = 2.0**-9


def _step_grid(low: float, high: float, core: float, h: float) -> np.ndarray:
    """Increasing integer grid indices covering [low, high] (see above)."""
    k_low, k_high = math.floor(low / h), math.ceil(high / h)
    k_core = max(1, math.ceil(core / h))

    def tail(end: int) -> np.ndarray:  # points in (k_core, end], gaps growing geometrically
        if end <= k_core:
            return np.empty(0, dtype=np.int64)
        count = math.ceil(math.log(end / k_core) / math.log1p(_TAIL_GAP_GROWTH)) + 1
        points = np.ceil(k_core * (1.0 + _TAIL_GAP_GROWTH) ** np.arange(1, count)).astype(np.int64)
        points = points[(points > k_core) & (points < end)]
        return np.append(points[np.diff(points, prepend=k_core) > 0], end)

    middle = np.arange(max(k_low, -k_core), min(k_high, k_core) + 1, dtype=np.int64)
    return np.concatenate([-tail(-k_low)[::-1], middle, tail(k_high)])


@functools.lru_cache(maxsize=512)
def step_pmfs(sampling: Sampling, q: float, sigma: float, h: float) -> tuple[LossPmf, ...]:
    """Discretised PLDs of one step: ``(remove, add)`` for Poisson, ``(symmetrised,)`` for fixed.

    The support is cut where the Gaussian tail beyond it has mass ``STEP_TAIL_MASS``; the
    connect-the-dots construction charges what lies above to +infinity.
    """
    mu = 1.0 / sigma
    if not mu * mu < 1e300:  # 1/sigma^2 overflows: the loss itself is not a double
        raise PrivacyError(f"sigma={sigma:g} is too small to account: one step's privacy "
                           f"loss is beyond double precision (essentially no privacy)")
    top = _loss_remove(_STEP_TAIL_Z + mu, q, mu)  # largest loss kept (both directions)
    remove_low = math.log1p(-q) if q < 1.0 else -top
    add_high = -math.log1p(-q) if q < 1.0 else top
    core = _CORE_STEP_STDS * step_loss_std(q, sigma) - (math.log1p(-q) if q < 1.0 else 0.0)
    if not min(top, core) / h <= _MAX_STEP_GRID:  # also NaN/inf for a vanishing sigma
        raise PrivacyError(
            f"sigma={sigma:g} (q={q:g}) is too small to account: one step's privacy loss "
            f"reaches {top:.3g}; such a release gives essentially no privacy")

    if sampling == "poisson":
        k = _step_grid(remove_low, top, core, h)
        remove = hat_pmf(h, k, remove_segments(k * h, q, sigma))
        k = _step_grid(-top, add_high, core, h)
        return remove, hat_pmf(h, k, add_segments(k * h, q, sigma))
    return (symmetric_pmf(h, _step_grid(-top, top, core, h), q, sigma),)


def symmetric_pmf(h: float, indices: np.ndarray, q: float, sigma: float) -> LossPmf:
    """The pessimistic PMF of ``C_q(G_{1/sigma})`` (fixed-size steps) on grid points that
    include 0.

    ``C_q(f)`` is ``f_q`` where its slope is below -1, the segment of slope -1 through its
    fixed point, and ``f_q^{-1}`` beyond (Dong, Roth & Su 2022, Sec. 4.2, the explicit form
    of C_q): in privacy-loss terms the *remove* loss above 0, the *add* loss below
    0, and at 0 the atom ``(1-q)(Phi(mu/2) - Phi(-mu/2))`` of the linear segment (the two
    curves' delta agree at eps = 0, the total variation distance). Each side is split per gap
    as in :func:`hat_split`; the masses add up to 1.
    """
    zero = int(np.searchsorted(indices, 0))
    if indices[zero] != 0:
        raise PrivacyError("the grid of a fixed-size step must contain eps = 0")
    mu = 1.0 / sigma
    remove = remove_segments(indices[zero:] * h, q, sigma)
    add = add_segments(indices[: zero + 1] * h, q, sigma)
    lower = int(indices[0])
    probs = np.zeros(int(indices[-1]) - lower + 1)
    for part, seg in ((indices[zero:], remove), (indices[: zero + 1], add)):
        left, right = hat_split(seg)
        probs[part[:-1] - lower] += left
        probs[part[1:] - lower] += right
    probs[0] += math.exp(add.log_below)
    probs[-lower] += (1.0 - q) * math.exp(float(log_gauss_mass(-0.5 * mu, 0.5 * mu)))
    return LossPmf(h, lower, probs, math.exp(remove.log_above))
