"""The floor of a PLD accountant: what its finished stretches answered, kept so that no answer
falls when a step is composed (:mod:`fedsim.privacy.pld`, "Monotone answers").

Why a floor. The PLD accountant's grid ``h`` follows the kinds of step its history holds
(:func:`fedsim.privacy.pld.grid_for_stds`). A step with a tiny privacy-loss std (a near-free
step, sigma = 1000) makes the grid finer, and the finer grid sheds the discretisation
pessimism of every step before it: 272 Poisson steps at sigma 1.2 read eps 2.4981, the same
plus one step at sigma 1000 read 2.4965 (q = 128/3890, delta 1e-5; both valid upper bounds:
dp_accounting at a value discretisation of 1e-4 gives 2.496503 for both). At a fixed grid,
eps is monotone in the counts and in the kinds composed. So whenever composing a step changes
the grid (or the bucketed regime), the history composed before it is a finished *stretch*,
and its answers become part of the floor; every later answer is the more conservative of the
current composition and the floor.

What a floor is. Neighbouring relation: the accountant's (Poisson add/remove, or fixed-size
replace-one; a stretch has the same steps' relation). For a stretch with composed PMFs (one
per direction), its privacy profile ``delta_S(eps)`` (the maximum over directions) is, as a
function of ``x = e^eps``, a maximum of sums of ``p (1 - x e^{-l})_+``: convex and
non-increasing in x. The floor keeps, at each ``delta_j`` of a fixed grid :data:`DELTAS`
(``10^{-j/32}``, ``j = 1 ... 512``, down to 1e-16), the stretch's own answer
``eps_j = eps_S(delta_j)`` (bit for bit what the accountant answered at ``delta_j``), and
reads every other delta, eps or alpha off the chords between the points ``(e^{eps_j},
delta_j)`` (and the point ``(0, 1)``: delta never exceeds 1). By convexity a chord lies on or
above the curve, so the floor's eps(delta) is at least the stretch's at every delta from 1
down to the last point, and its delta(eps) at least the stretch's at every eps up to it.

Several stretches merge into one floor: the elementwise maximum of their ``eps_j``. The
inverse of a maximum of non-increasing curves is the maximum of their inverses, so the merged
points lie on the maximum of the stretches' (convex) chord curves, which is convex: its own
chords are above every stretch's. An accountant holds one floor of :data:`DELTAS`'s size
(4 KB), however many stretches its history had: its state does not grow with a run.

Why the answers stay valid bounds. Every answer is the maximum (eps, delta) or minimum (the
trade-off beta) of the current composition's, which is a valid bound for the whole history by
itself, and the floor's: raising an upper bound (lowering a lower bound) keeps it one. The
floor is also no looser than a bound for a sub-history, whose true privacy loss is no worse
than the whole history's (the whole history's output contains the sub-history's).

What it does not cover. Below the last point (``delta < 1e-16``) the floor reads its last
point's eps, a floor that may be below the stretch's: the accountant is monotone there only
within a stretch. Deltas that fall between grid points read a chord, above the stretch's
answer by a relative 2e-5 to 1.3e-4 for deltas 1e-12 to 1e-3 (measured on single postures, q
0.003 to 0.1, both schemes; a point every 1/32 decade: at 1/8 it was 1e-3, the accountant's
own discretisation error).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from fedsim.privacy.pld_step import LossPmf

POINTS_PER_DECADE = 32
DELTAS = np.array([float(f"1e-{j // POINTS_PER_DECADE}") if j % POINTS_PER_DECADE == 0
                   else 10.0 ** (-j / POINTS_PER_DECADE)
                   for j in range(1, 16 * POINTS_PER_DECADE + 1)])
"""The deltas at which a floor keeps its eps (``10^{-j/32}``, 1 <= j <= 512; the decades are
the literals 1e-1, 1e-2, ..., so a budget's delta of 1e-5 is a point)."""
DELTAS.setflags(write=False)
_FALLING = -DELTAS  # increasing, for searchsorted


@dataclass(frozen=True, slots=True, eq=False)
class Floor:
    """The points ``(eps[j], DELTAS[j])`` of one or more stretches' privacy profiles
    (module docstring); ``eps`` non-decreasing, ``+inf`` where a stretch's mass at +infinity
    reaches that delta. Immutable (its array is read-only): accountants and their previews
    share it."""

    eps: np.ndarray

    @classmethod
    def of_pmfs(cls, pmfs: Sequence[LossPmf]) -> Floor:
        """The floor of one stretch from its composed PMFs (the maximum over directions)."""
        eps = np.max([p.epsilons(DELTAS) for p in pmfs], axis=0)
        # eps(delta) is non-increasing in delta; keep the points' order exact under rounding
        eps = np.maximum.accumulate(eps)
        eps.setflags(write=False)
        return cls(eps)

    def merged(self, other: Floor | None) -> Floor:
        """One floor at least both (the elementwise maximum of their points)."""
        if other is None or other is self:
            return self
        eps = np.maximum(self.eps, other.eps)
        eps.setflags(write=False)
        return Floor(eps)

    @property
    def key(self) -> bytes:
        """The points as bytes (a cache key's part: two accountants with the same steps and
        different floors answer differently)."""
        return self.eps.tobytes()

    # -- readings (module docstring: chords in x = e^eps) -------------------------------------------
    def epsilon(self, delta: float) -> float:
        """eps at ``delta``: the chord's, at least every merged stretch's for delta >= 1e-16."""
        eps = self.eps
        j = int(np.searchsorted(_FALLING, -delta, side="left"))  # DELTAS[j] <= delta
        if j < DELTAS.size and DELTAS[j] == delta:
            return float(eps[j])
        if j == 0:  # between (x=0, delta=1) and the first point
            return float(eps[0] + math.log((1.0 - delta) / (1.0 - DELTAS[0])))
        if j == DELTAS.size:
            return float(eps[-1])  # below the last point: a floor only (module docstring)
        left, right = float(eps[j - 1]), float(eps[j])
        if right == math.inf:
            return math.inf
        if left == -math.inf:
            return right  # pragma: no cover - a point of a finite loss is finite
        t = (DELTAS[j - 1] - delta) / (DELTAS[j - 1] - DELTAS[j])
        return left + math.log1p(math.expm1(right - left) * t)

    def deltas(self, epsilons: np.ndarray) -> np.ndarray:
        """delta at each of ``epsilons``: the chords', at least every merged stretch's up to
        the last finite point (beyond it, that point's delta)."""
        eps = np.asarray(epsilons, dtype=float)
        points = self.eps
        finite = int(np.count_nonzero(np.isfinite(points)))
        out = np.empty(eps.shape)
        if finite == 0:
            out.fill(1.0)  # pragma: no cover - a stretch has less than 0.75 at +infinity
            return out
        xs, ds = points[:finite], DELTAS[:finite]
        # segment k: between point k-1 and point k (k = 0: from (x=0, delta=1))
        k = np.searchsorted(xs, eps, side="left")
        first = k == 0
        out[first] = 1.0 - (1.0 - ds[0]) * np.exp(np.minimum(eps[first] - xs[0], 0.0))
        last = k >= finite
        out[last] = ds[finite - 1]
        middle = ~(first | last)
        km = k[middle]
        left, right = xs[km - 1], xs[km]
        with np.errstate(invalid="ignore", over="ignore"):
            span = np.expm1(right - left)
            t = np.where(span > 0, np.expm1(eps[middle] - left) / span, 1.0)
        out[middle] = ds[km - 1] - (ds[km - 1] - ds[km]) * np.clip(t, 0.0, 1.0)
        return np.asarray(np.clip(out, 0.0, 1.0), dtype=float)

    def tradeoff(self, alpha: np.ndarray) -> np.ndarray:
        """beta(alpha) from the floor's points (Dong-Roth-Su Prop. 2.12, the supporting lines
        ``1 - delta_j - e^{eps_j} alpha`` only): a lower bound on each merged stretch's
        trade-off curve."""
        alpha = np.clip(np.asarray(alpha, dtype=float), 0.0, 1.0)
        finite = np.isfinite(self.eps)
        eps, ds = self.eps[finite], DELTAS[finite]
        log_alpha = np.full(alpha.size, -np.inf)
        log_alpha[alpha > 0] = np.log(alpha[alpha > 0])
        scaled = np.exp(np.minimum(eps[None, :] + log_alpha[:, None], 700.0))
        beta = np.max(1.0 - ds[None, :] - scaled, axis=1, initial=0.0)
        return np.asarray(np.clip(np.minimum(beta, 1.0 - alpha), 0.0, 1.0), dtype=float)
