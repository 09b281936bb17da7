"""Converting a Renyi-DP curve into (eps, delta)-DP: the classic and the optimal conversion.

A mechanism is (alpha, r)-RDP when ``D_alpha(P || Q) <= r`` for the output distributions P, Q
of every ordered pair of neighbouring data sets, and (eps, delta)-DP when the hockey-stick
divergence ``E_gamma(P || Q) = sup_S P(S) - gamma Q(S) <= delta`` with ``gamma = e^eps`` for
the same pairs. Both notions are per ordered pair, so every conversion below holds for any
neighbouring relation (add/remove or replace-one) for which the RDP curve was computed.

Classic conversion (Mironov 2017, Prop. 3)::

    eps = min_alpha  r(alpha) + log(1/delta) / (alpha - 1)
    delta = min_alpha exp((alpha - 1) (r(alpha) - eps))

Optimal conversion (Asoodeh, Liao, Calmon, Kosut & Sankar 2021, "A Better Bound Gives a Hundred
Rounds"). For one order alpha the best conversion is

    delta_alpha(eps; r) = sup { E_gamma(P || Q) : D_alpha(P || Q) <= r },

the upper boundary of the joint range of the E_gamma and chi^alpha divergences
(``D_alpha = log(1 + (alpha - 1) chi^alpha) / (alpha - 1)``); by Harremoes & Vajda it is
reached by pairs of two-point distributions. Derivation used here: write L = dP/dQ under Q, a
random variable with ``E L = 1`` and ``E L^alpha <= M := e^{(alpha - 1) r}``; the objective is
``E (L - gamma)_+``. Replacing L by its conditional means on {L <= gamma} and {L > gamma} keeps
the objective and the mean and, by Jensen, lowers ``E L^alpha``, so L takes two values
``a < 1 <= gamma < b`` with Q-probabilities ``1 - w`` and ``w = (1 - a)/(b - a)``. The
Lagrangian ``phi(l) = (l - gamma)_+ - mu l - lam l^alpha`` must peak at both a and b; the
stationarity conditions give ``lam = 1/(alpha (b^{alpha-1} - a^{alpha-1}))`` and
``phi(a) = phi(b)`` gives

    gamma = (alpha - 1)/alpha * (b^alpha - a^alpha) / (b^{alpha-1} - a^{alpha-1}),
    M     = (1 - w) a^alpha + w b^alpha,
    delta = w (b - gamma).

Each (w, b) therefore gives a point of the boundary exactly, with the dual certificate
``delta = mu + lam M + phi(a)`` proving that no pair with ``E L^alpha <= M`` does better. For
fixed r the boundary is traced by b in (e^r, inf) with w solving ``M(w, b) = e^{(alpha-1) r}``;
along it gamma increases and delta decreases from 1/alpha to 0. For ``delta >= 1/alpha`` the
optimum has a = 0 and ``delta = 1 - e^{eps - r}``. The conversion of a whole RDP curve is the
minimum over orders (each order's bound holds on its own).

The two nested one-dimensional root finds (safeguarded Newton for w, Illinois false position
for b) keep brackets and return the end on the side that can only over-state eps (or delta),
so the reported values are upper bounds up to floating-point rounding (relative ~1e-11).

Minimising over orders. The full computation is skipped only for orders that provably cannot
attain the minimum, so the answer is the exact minimum over all orders. Per order, the
closed form of Lemma 1 (:func:`epsilon_improved`) is an upper bound on the optimal value, and
the two-point pair {0, e^r} (``D_alpha = r`` at every alpha) is a lower bound:
``eps_alpha >= r + log(1 - delta)`` and ``delta_alpha(eps) >= 1 - e^{eps - r}``; an order whose
lower bound exceeds the smallest upper bound is dropped. A pre-selection by the closed form
alone is wrong: where r(alpha) is far below log(1/delta)/(alpha - 1) (one step with small q,
small sigma, small orders) the optimal value is 10x below the closed form (q = 0.001,
sigma = 0.6, delta = 1e-5, alpha = 3.5: 0.287 against 3.77), the best order lies far from the
closed form's best (3.5 against 5.9), and a shortlist of the closed form's best orders made
eps jump up and down as sigma moved. The paper's own variational form (its Theorem 3),

    r*(alpha; eps, delta) = 1/(alpha - 1) log min_{delta < p <= 1}
        p^alpha w^{1-alpha} + (1 - p)^alpha (1 - w)^{1-alpha},  w = (p - delta) e^{-eps},

the smallest RDP value that can give ``E_gamma = delta``, is :func:`optimal_rdp_budget`; it
answers "how large may the composed RDP be" (the largest number of rounds) directly.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

import numpy as np

from fedsim.errors import ConfigError

__all__ = [
    "check_delta",
    "check_epsilon",
    "delta_classic",
    "delta_optimal",
    "epsilon_classic",
    "epsilon_improved",
    "epsilon_optimal",
    "optimal_delta_curve",
    "optimal_deltas_at",
    "optimal_deltas",
    "optimal_epsilons",
    "optimal_rdp_budget",
    "tradeoff_complement",
]

_BRACKET_RTOL = 1e-11  # on beta = log b: eps to ~1e-12 relative
_INNER_RTOL = 1e-14    # on log w, so that the outer search sees a smooth function
_ROOT_STEPS = 400
_CURVE_ROWS = 16  # optimal_delta_curve: eps rows solved over all orders
_CURVE_NEIGHBOURS = 3
_PRUNE_SLACK = 1e-9  # relative; far above the conversions' rounding, so pruning never errs
_GOLDEN_STEPS = 90
_LOG_TINY = -740.0  # log of the smallest positive double, about


def _as_curve(orders: Sequence[float] | np.ndarray,
              rdp: Sequence[float] | np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    orders_arr = np.asarray(orders, dtype=float).ravel()
    rdp_arr = np.asarray(rdp, dtype=float).ravel()
    if orders_arr.shape != rdp_arr.shape or orders_arr.size == 0:
        raise ConfigError("orders and rdp must be non-empty and of the same length")
    if np.any(~np.isfinite(orders_arr)) or np.any(orders_arr <= 1.0):
        raise ConfigError("RDP orders must be finite and > 1")
    if np.any(np.isnan(rdp_arr)) or np.any(rdp_arr < 0):
        raise ConfigError("RDP values must be >= 0 (inf allowed)")
    return orders_arr, rdp_arr


def check_delta(delta: float) -> float:
    if not (isinstance(delta, int | float) and 0.0 < delta < 1.0):
        raise ConfigError(f"delta must be in (0, 1), got {delta!r}")
    return float(delta)


def check_epsilon(epsilon: float) -> float:
    if not (isinstance(epsilon, int | float) and math.isfinite(epsilon) and epsilon >= 0.0):
        raise ConfigError(f"epsilon must be a finite number >= 0, got {epsilon!r}")
    return float(epsilon)


# -- classic and closed-form conversions ----------------------------------------------------
def epsilon_classic(orders: Sequence[float] | np.ndarray, rdp: Sequence[float] | np.ndarray,
                    delta: float) -> tuple[float, float]:
    """(eps, order) with ``eps = min_a rdp(a) + log(1/delta)/(a - 1)`` (Mironov 2017, Prop. 3)."""
    orders_arr, rdp_arr = _as_curve(orders, rdp)
    delta = check_delta(delta)
    eps = rdp_arr + math.log(1.0 / delta) / (orders_arr - 1.0)
    best = int(np.argmin(eps))
    return max(float(eps[best]), 0.0), float(orders_arr[best])


def delta_classic(orders: Sequence[float] | np.ndarray, rdp: Sequence[float] | np.ndarray,
                  epsilon: float) -> tuple[float, float]:
    """(delta, order) with ``delta = min_a exp((a - 1)(rdp(a) - eps))`` (Mironov 2017)."""
    orders_arr, rdp_arr = _as_curve(orders, rdp)
    epsilon = check_epsilon(epsilon)
    log_delta = (orders_arr - 1.0) * (rdp_arr - epsilon)
    best = int(np.argmin(log_delta))
    return min(math.exp(min(float(log_delta[best]), 0.0)), 1.0), float(orders_arr[best])


def tradeoff_complement(orders: Sequence[float] | np.ndarray, rdp: Sequence[float] | np.ndarray,
                        alphas: Sequence[float] | np.ndarray) -> np.ndarray:
    """Upper bounds on ``1 - f(alpha)`` at each alpha for a curve ``rdp`` that bounds
    ``D_a(P || Q)`` for both orderings of every neighbouring pair:
    ``1 - f(alpha) <= min_a (alpha e^{r(a)})^{(a - 1)/a}``.

    Derivation: a test with type I error alpha under P and type II error beta under Q maps Q
    to Bernoulli(1 - beta) and P to Bernoulli(alpha), so by the data processing inequality for
    Renyi divergence (van Erven & Harremoes 2014, Thm. 9)
    ``(a - 1) r(a) >= log((1 - beta)^a alpha^{1-a} + beta^a (1 - alpha)^{1-a})``, and dropping
    the second (positive) term leaves ``1 - beta <= (alpha e^{r(a)})^{(a-1)/a}`` for every test,
    hence for f(alpha), the smallest beta. Computed in log space: exact down to the smallest
    doubles (0 at alpha = 0), where ``1 - f`` from f's own value near 1 keeps no digits.
    """
    orders_arr, rdp_arr = _as_curve(orders, rdp)
    alpha = np.asarray(alphas, dtype=float)
    with np.errstate(divide="ignore", invalid="ignore"):  # log 0 = -inf; -inf + inf at r = inf
        logs = ((orders_arr - 1.0) / orders_arr)[None, :] * (
            np.log(alpha).reshape(-1, 1) + rdp_arr[None, :])
    logs = np.where(np.isnan(logs), np.inf, logs)  # an infinite r bounds nothing
    return np.exp(np.minimum(logs.min(axis=1), 0.0)).reshape(alpha.shape)


def epsilon_improved(orders: Sequence[float] | np.ndarray, rdp: Sequence[float] | np.ndarray,
                     delta: float) -> tuple[float, float]:
    """(eps, order) from the closed-form bound of Balle et al. 2020 ("Hypothesis Testing
    Interpretations and Renyi Differential Privacy", Thm. 21; weaker than Asoodeh et al.'s Lemma 1),
    also Canonne, Kamath & Steinke 2020 Prop. 12:
    ``eps = r + log((a - 1)/a) - (log delta + log a)/(a - 1)``.

    It lies between the optimal and the classic conversion; fedsim reports the optimal one and
    keeps this as an independent check.
    """
    orders_arr, rdp_arr = _as_curve(orders, rdp)
    delta = check_delta(delta)
    eps = (rdp_arr + np.log1p(-1.0 / orders_arr)
           - (math.log(delta) + np.log(orders_arr)) / (orders_arr - 1.0))
    best = int(np.argmin(eps))
    return max(float(eps[best]), 0.0), float(orders_arr[best])


# -- the optimal conversion ---------------------------------------------------------------
def _root(g: Callable[..., np.ndarray], lo: np.ndarray, hi: np.ndarray,
          args: tuple[np.ndarray, ...], side: str, rtol: float = _BRACKET_RTOL) -> np.ndarray:
    """Root of an increasing function ``g(x, *args)`` bracketed by [lo, hi], vectorised.

    Illinois false position (a bisection step whenever it stalls) keeps a bracket with
    ``g(lo) < 0 < g(hi)``; when an iterate lands within ``rtol`` of an end, a probe just
    inside that end tries to close the bracket. Ends that already meet the equation within
    rounding are returned as they are. Returns the end where ``g <= 0`` (``side="below"``)
    or ``g >= 0`` (``side="above"``), so that callers round in the safe direction.
    Each element is iterated on its own (``g`` and ``args`` are elementwise); only the
    elements still open are evaluated, so a few slow ones do not cost a pass over all.
    """
    shape = lo.shape
    # Flat copies: the loop updates the open elements in place by index.
    lo_f, hi_f = lo.astype(float).ravel(), hi.astype(float).ravel()
    args_f = tuple(np.broadcast_to(a, shape).ravel() for a in args)
    g_lo_f, g_hi_f = g(lo_f, *args_f), g(hi_f, *args_f)
    # an end that already meets the equation within rounding is the answer
    hi_f = np.where(g_lo_f >= 0.0, lo_f, hi_f)
    lo_f = np.where(g_hi_f <= 0.0, hi_f, lo_f)
    last_f = np.zeros(lo_f.size, dtype=np.int8)  # which end moved last: -1 lo, +1 hi
    shrink_f = np.ones(lo_f.size)  # width ratio over the last two steps
    prev_f = hi_f - lo_f
    open_ = np.arange(lo_f.size)  # indices of the elements not done yet
    with np.errstate(invalid="ignore", divide="ignore", over="ignore"):
        for _ in range(_ROOT_STEPS):
            lo_o, hi_o = lo_f[open_], hi_f[open_]
            tol = rtol * np.maximum(1.0, np.maximum(abs(lo_o), abs(hi_o)))
            keep = (hi_o - lo_o) > tol
            open_, lo_o, hi_o, tol = open_[keep], lo_o[keep], hi_o[keep], tol[keep]
            if open_.size == 0:
                break
            g_lo_o, g_hi_o = g_lo_f[open_], g_hi_f[open_]
            x = hi_o - g_hi_o * (hi_o - lo_o) / (g_hi_o - g_lo_o)
            # close the bracket with a probe just past an end that sits on the root
            near_lo, near_hi = (x - lo_o) < tol, (hi_o - x) < tol
            probe = np.where(near_lo & ~near_hi, lo_o + tol, hi_o - tol)
            stalled = ~np.isfinite(x) | (shrink_f[open_] > 0.5)
            x = np.where(near_lo ^ near_hi, probe, np.where(stalled, 0.5 * (lo_o + hi_o), x))
            g_x = g(x, *(a[open_] for a in args_f))
            exact = g_x == 0.0  # a root: both ends may stop there
            lo_o, hi_o = np.where(exact, x, lo_o), np.where(exact, x, hi_o)
            up = (g_x > 0.0) & ~exact
            down = (g_x < 0.0) & ~exact
            # a probe that crossed the root pins it to within tol
            crossed = (near_hi & ~near_lo & down) | (near_lo & ~near_hi & up)
            last_o = last_f[open_]
            # Illinois: halve the function value of an end that stays put twice in a row
            g_lo_o = np.where(up & (last_o == 1), 0.5 * g_lo_o, g_lo_o)
            g_hi_o = np.where(down & (last_o == -1), 0.5 * g_hi_o, g_hi_o)
            hi_o, g_hi_o = np.where(up, x, hi_o), np.where(up, g_x, g_hi_o)
            lo_o, g_lo_o = np.where(down, x, lo_o), np.where(down, g_x, g_lo_o)
            lo_f[open_], hi_f[open_], g_lo_f[open_], g_hi_f[open_] = lo_o, hi_o, g_lo_o, g_hi_o
            last_f[open_] = np.where(up, 1, np.where(down, -1, last_o)).astype(np.int8)
            width = hi_o - lo_o
            prev_o = prev_f[open_]
            shrink_f[open_] = width / np.where(prev_o > 0, prev_o, 1.0)
            prev_f[open_] = width
            open_ = open_[~(exact | crossed)]
    return (lo_f if side == "below" else hi_f).reshape(shape)


def _log_expm1(x: np.ndarray) -> np.ndarray:
    """log(e^x - 1) for x > 0 without overflow."""
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.where(x > 30.0, x + np.log1p(-np.exp(-np.abs(x))),
                        np.log(np.expm1(np.minimum(x, 30.0))))


def _log_low_ratio(log_w: np.ndarray, beta: np.ndarray) -> np.ndarray:
    """log a, the low likelihood ratio ``a = 1 - w (b - 1)/(1 - w)`` of the two-point pair."""
    d = np.exp(log_w + _log_expm1(beta) - np.log1p(-np.exp(log_w)))
    with np.errstate(divide="ignore"):
        return np.log1p(-np.minimum(d, 1.0))


def _log_moment(log_w: np.ndarray, beta: np.ndarray, alpha: np.ndarray) -> np.ndarray:
    """log E_Q L^alpha = log((1 - w) a^alpha + w b^alpha) of the two-point pair (w, b = e^beta)."""
    log_a = _log_low_ratio(log_w, beta)
    return np.logaddexp(np.log1p(-np.exp(log_w)) + alpha * log_a, log_w + alpha * beta)


def _boundary_point(log_w: np.ndarray, beta: np.ndarray,
                    alpha: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(eps, delta) of the optimal pair with high ratio b = e^beta and Q-mass w at b."""
    log_s = _log_low_ratio(log_w, beta) - beta  # log(a/b)
    with np.errstate(invalid="ignore", divide="ignore"):
        e_hi = np.expm1((alpha - 1.0) * log_s)  # s^{alpha-1} - 1 < 0
        e_lo = np.expm1(alpha * log_s)          # s^alpha - 1 < 0
        ratio = (alpha - 1.0) / alpha * e_lo / e_hi  # gamma / b
        one_minus_ratio = (alpha * e_hi - (alpha - 1.0) * e_lo) / (alpha * e_hi)
    ratio = np.where(np.isfinite(log_s), ratio, (alpha - 1.0) / alpha)
    one_minus_ratio = np.where(np.isfinite(log_s), one_minus_ratio, 1.0 / alpha)
    eps = beta + np.log(ratio)
    delta = np.exp(log_w + beta) * np.maximum(one_minus_ratio, 0.0)
    return eps, delta


def _solve_log_w(beta: np.ndarray, alpha: np.ndarray, log_m: np.ndarray) -> np.ndarray:
    """log w on the boundary ``E L^alpha = M`` for high ratio e^beta (beta >= log(M)/(alpha-1)).

    ``E L^alpha`` grows with w (a mean-preserving spread) and
    ``1 + w b^alpha >= E L^alpha >= w b^alpha`` brackets the root; safeguarded Newton steps
    in x = log w (``dM/dw = b^a - a^a - a a^{a-1} (b-1)/(1-w)``) converge in a few steps.
    Returns a point where ``E L^alpha >= M``: it lies on the boundary of a (negligibly)
    larger RDP value, which can only over-state delta and eps. Elementwise; only the elements
    not converged yet are iterated.
    """
    shape = np.broadcast_shapes(np.shape(beta), np.shape(alpha), np.shape(log_m))
    beta, alpha, log_m = (np.array(v, dtype=float).ravel()
                          for v in np.broadcast_arrays(beta, alpha, log_m))
    lo = np.maximum(_log_expm1(log_m) - alpha * beta, _LOG_TINY)
    hi = np.minimum(-beta, log_m - alpha * beta)
    lo = np.minimum(lo, hi)
    x = hi.copy()
    open_ = np.arange(x.size)
    with np.errstate(invalid="ignore", divide="ignore", over="ignore"):
        for _ in range(_ROOT_STEPS):
            b, a, m, x_o = beta[open_], alpha[open_], log_m[open_], x[open_]
            g_x = _moment_gap(x_o, b, a, m)
            hi_o = np.where(g_x >= 0.0, x_o, hi[open_])
            lo_o = np.where(g_x < 0.0, x_o, lo[open_])
            hi[open_], lo[open_] = hi_o, lo_o
            log_s = _log_low_ratio(x_o, b) - b
            w = np.exp(x_o)
            slope = np.exp(x_o + a * b - (g_x + m)) * (
                -np.expm1(a * log_s)
                - a * np.exp((a - 1.0) * log_s) * -np.expm1(-b) / (1.0 - w))
            step = g_x / slope
            tol = _INNER_RTOL * np.maximum(1.0, abs(x_o))
            converged = (g_x == 0.0) | (abs(step) <= tol) | (hi_o - lo_o <= tol)
            x_new = x_o - step
            bad = ~np.isfinite(x_new) | (x_new < lo_o) | (x_new > hi_o)
            x[open_] = np.where(converged, x_o, np.where(bad, 0.5 * (lo_o + hi_o), x_new))
            open_ = open_[~converged]
            if open_.size == 0:
                break
        probe = np.minimum(x + 4.0 * _INNER_RTOL * np.maximum(1.0, abs(x)), hi)
        return np.where(_moment_gap(probe, beta, alpha, log_m) >= 0.0, probe, hi).reshape(shape)


def _moment_gap(log_w: np.ndarray, beta: np.ndarray, alpha: np.ndarray,
                log_m: np.ndarray) -> np.ndarray:
    return _log_moment(log_w, beta, alpha) - log_m


def _optimal_deltas_elementwise(alpha: np.ndarray, r: np.ndarray,
                                epsilon: np.ndarray) -> np.ndarray:
    """delta_alpha(eps; r) for flat arrays of orders, finite RDP values > 0 and eps >= 0."""
    corner = epsilon <= r + np.log1p(-1.0 / alpha)  # optimum has a = 0
    result = np.where(corner, -np.expm1(np.minimum(epsilon - r, 0.0)), 0.0)
    interior = ~corner
    if np.any(interior):
        a_i, r_i, e_i = alpha[interior], r[interior], epsilon[interior]
        log_m = (a_i - 1.0) * r_i
        corner_eps, beta_end, end_eps, end_delta = _near_corner_segment(a_i, r_i)
        lo = np.maximum(beta_end, e_i)
        hi = e_i - np.log1p(-1.0 / a_i)
        lo = np.minimum(lo, hi)

        def eps_gap(beta: np.ndarray, a: np.ndarray, lm: np.ndarray,
                    target: np.ndarray) -> np.ndarray:
            eps_b, _ = _boundary_point(_solve_log_w(beta, a, lm), beta, a)
            return eps_b - target

        beta_lo = _root(eps_gap, lo, hi, (a_i, log_m, e_i), side="below")
        # the lower end has gamma <= e^eps, hence delta there >= the optimal delta at eps
        _, delta_lo = _boundary_point(_solve_log_w(beta_lo, a_i, log_m), beta_lo, a_i)
        with np.errstate(invalid="ignore", divide="ignore", over="ignore"):
            fraction = np.expm1(e_i - corner_eps) / np.expm1(end_eps - corner_eps)
            chord = 1.0 / a_i + fraction * (end_delta - 1.0 / a_i)
        result[interior] = np.where(e_i < end_eps, chord, delta_lo)
    return np.clip(result, 0.0, 1.0)


def _near_corner_segment(alpha: np.ndarray, r: np.ndarray) -> tuple[np.ndarray, ...]:
    """(corner eps, beta_end, eps and delta at b = e^beta_end) for order alpha and value r.

    Next to the corner (a = 0, ``gamma = e^r (1 - 1/alpha)``, delta = 1/alpha) the low ratio a
    grows from 0 so fast in b that, parametrised by beta = log b, the boundary jumps over a
    segment within one rounding step of beta = r; for orders near 1 the segment is long in eps
    (``a^{alpha-1}`` is far from 0 even for a = 1e-13: alpha = 1.01, r = 4.7 jumps from
    eps = 0.10 to 1.34). It ends at ``beta_end = r + 1e-12 max(1, r)``, where a is resolved
    (a > 1e-13). ``delta_alpha(gamma)`` is a supremum of the convex functions
    ``gamma -> E_gamma``, hence convex, so the chord between the two ends lies above it: a safe
    answer on the segment, and a tight one, since there ``b = e^r`` and ``w = e^-r`` to
    ~1e-12 and the boundary is the line ``1 - gamma e^-r`` of the pair {0, e^r}.
    """
    beta_end = r + 1e-12 * np.maximum(1.0, r)
    end_eps, end_delta = _boundary_point(_solve_log_w(beta_end, alpha, (alpha - 1.0) * r),
                                         beta_end, alpha)
    return r + np.log1p(-1.0 / alpha), beta_end, end_eps, end_delta


def optimal_deltas(orders: Sequence[float] | np.ndarray, rdp: Sequence[float] | np.ndarray,
                   epsilon: float) -> np.ndarray:
    """Per order, the smallest delta that (alpha, rdp(alpha))-RDP alone guarantees at eps."""
    orders_arr, rdp_arr = _as_curve(orders, rdp)
    epsilon = check_epsilon(epsilon)
    out = np.ones_like(rdp_arr)
    out[rdp_arr == 0.0] = 0.0
    finite = np.isfinite(rdp_arr) & (rdp_arr > 0.0)
    out[finite] = _optimal_deltas_elementwise(orders_arr[finite], rdp_arr[finite],
                                              np.full(int(finite.sum()), epsilon))
    return out


def optimal_delta_curve(orders: Sequence[float] | np.ndarray, rdp: Sequence[float] | np.ndarray,
                        epsilons: Sequence[float] | np.ndarray) -> np.ndarray:
    """delta(eps) of the optimal conversion at many eps at once; used for trade-off curves.

    Each value is a valid bound (a minimum over some orders). On a subgrid of at most
    ``_CURVE_ROWS`` eps it is the exact minimum over all orders (see :func:`_candidates`);
    elsewhere the minimum over the orders that win on that subgrid and their
    ``_CURVE_NEIGHBOURS`` nearest orders on each side (the best order moves steadily with eps), which keeps a 160-point curve of a
    small-q step at about a second instead of a minute.
    """
    eps_arr, alpha, r, settled = _curve_inputs(orders, rdp, epsilons)
    if settled is not None:
        return settled
    rows = np.unique(np.linspace(0, eps_arr.size - 1, min(_CURVE_ROWS, eps_arr.size)).astype(int))
    sub = _delta_curve_over(alpha, r, eps_arr[rows], np.ones(alpha.size, dtype=bool))
    positions = np.argsort(np.argsort(alpha))  # rank of each order
    winning = np.unique(positions[np.argmin(sub, axis=1)])
    winners = np.any(np.abs(positions[:, None] - winning[None, :]) <= _CURVE_NEIGHBOURS, axis=1)
    deltas = _delta_curve_over(alpha, r, eps_arr, winners).min(axis=1)
    deltas[rows] = sub.min(axis=1)
    return deltas


def optimal_deltas_at(orders: Sequence[float] | np.ndarray, rdp: Sequence[float] | np.ndarray,
                      epsilons: Sequence[float] | np.ndarray) -> np.ndarray:
    """:func:`delta_optimal`'s delta at each of many eps, in one vectorised solve: at every
    eps the minimum over all orders that can attain it (the same pruning, the same
    per-(eps, order) solve, which iterates each element on its own), so equal to calling
    :func:`delta_optimal` once per eps. Unlike :func:`optimal_delta_curve` no order is left
    out; the cost is one pass of the solver over every (eps, candidate order) pair instead of
    one pass per eps (Papernot & Steinke's Poisson tuning needs one eps per order).
    (An infinite order never changes the minimum: its bounds prune nothing and its delta is
    1, which every finite order's is at most.)"""
    eps_arr, alpha, r, settled = _curve_inputs(orders, rdp, epsilons)
    if settled is not None:
        return settled
    return np.asarray(_delta_curve_over(alpha, r, eps_arr, np.ones(alpha.size, dtype=bool))
                      .min(axis=1), dtype=float)


def _curve_inputs(
    orders: Sequence[float] | np.ndarray, rdp: Sequence[float] | np.ndarray,
    epsilons: Sequence[float] | np.ndarray,
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray | None]:
    """The checked eps, the orders of finite RDP and their RDP, and the deltas when no solve
    is needed (else None): 1 at every eps without a finite order, 0 with an order of RDP 0."""
    orders_arr, rdp_arr = _as_curve(orders, rdp)
    eps_arr = np.asarray(epsilons, dtype=float).ravel()
    if np.any(~np.isfinite(eps_arr)) or np.any(eps_arr < 0):
        raise ConfigError("epsilons must be finite and >= 0")
    finite = np.isfinite(rdp_arr)
    alpha, r = orders_arr[finite], rdp_arr[finite]
    if not alpha.size:
        return eps_arr, alpha, r, np.ones_like(eps_arr)
    if np.any(r == 0.0):
        return eps_arr, alpha, r, np.zeros_like(eps_arr)
    return eps_arr, alpha, r, None


def _delta_curve_over(alpha: np.ndarray, r: np.ndarray, eps: np.ndarray,
                      allowed: np.ndarray) -> np.ndarray:
    """Per (eps, order) optimal delta, inf where the order is not allowed or cannot win."""
    upper, lower = _delta_bounds(alpha[None, :], r[None, :], eps[:, None])
    rows, cols = np.nonzero(_candidates(upper, lower) & allowed[None, :])
    deltas = np.full(upper.shape, np.inf)
    deltas[rows, cols] = _optimal_deltas_elementwise(alpha[cols], r[cols], eps[rows])
    return deltas


def optimal_epsilons(orders: Sequence[float] | np.ndarray, rdp: Sequence[float] | np.ndarray,
                     delta: float) -> np.ndarray:
    """Per order, the smallest eps that (alpha, rdp(alpha))-RDP alone guarantees at delta."""
    orders_arr, rdp_arr = _as_curve(orders, rdp)
    delta = check_delta(delta)
    out = np.full_like(rdp_arr, np.inf)
    out[rdp_arr == 0.0] = 0.0
    finite = np.isfinite(rdp_arr) & (rdp_arr > 0.0)
    alpha, r = orders_arr[finite], rdp_arr[finite]
    corner = delta >= 1.0 / alpha
    result = np.where(corner, r + math.log1p(-delta), 0.0)
    interior = ~corner
    if np.any(interior):
        a_i, r_i = alpha[interior], r[interior]
        log_m = (a_i - 1.0) * r_i
        corner_eps, beta_end, end_eps, end_delta = _near_corner_segment(a_i, r_i)
        # the classic eps bounds the optimal one, and b <= gamma alpha/(alpha - 1)
        lo = np.minimum(beta_end, r_i + math.log(1.0 / delta) / (a_i - 1.0))
        hi = r_i + math.log(1.0 / delta) / (a_i - 1.0) - np.log1p(-1.0 / a_i)

        def log_delta_gap(beta: np.ndarray, a: np.ndarray, lm: np.ndarray) -> np.ndarray:
            _, delta_b = _boundary_point(_solve_log_w(beta, a, lm), beta, a)
            with np.errstate(divide="ignore"):
                return log_delta - np.log(delta_b)  # increasing in beta

        log_delta = math.log(delta)
        beta_hi = _root(log_delta_gap, lo, hi, (a_i, log_m), side="above")
        eps_hi, _ = _boundary_point(_solve_log_w(beta_hi, a_i, log_m), beta_hi, a_i)
        # targets between the corner's 1/alpha and delta at beta_end: on the chord of
        # _near_corner_segment, which lies above the boundary, so its eps is safe
        with np.errstate(invalid="ignore", divide="ignore", over="ignore"):
            fraction = (1.0 / a_i - delta) / (1.0 / a_i - end_delta)
            chord = corner_eps + np.log1p(fraction * np.expm1(end_eps - corner_eps))
        result[interior] = np.where(delta > end_delta, chord, eps_hi)
    out[finite] = np.maximum(result, 0.0)
    return out


def _eps_bounds(alpha: np.ndarray, r: np.ndarray, delta: float) -> tuple[np.ndarray, np.ndarray]:
    """(upper, lower) bounds on the optimal per-order eps at delta: Lemma 1 of Asoodeh et al.
    (Canonne, Kamath & Steinke 2020, Prop. 12) above, the pair {0, e^r} below."""
    with np.errstate(invalid="ignore"):
        upper = (r + np.log1p(-1.0 / alpha) - (math.log(delta) + np.log(alpha)) / (alpha - 1.0))
    return np.where(np.isnan(upper), np.inf, upper), r + math.log1p(-delta)


def _delta_bounds(alpha: np.ndarray, r: np.ndarray,
                  epsilon: np.ndarray | float) -> tuple[np.ndarray, np.ndarray]:
    """(upper, lower) bounds on the optimal per-order delta at eps: Lemma 1 of Asoodeh et al.
    solved for delta above, the pair {0, e^r} (``E_gamma = 1 - gamma e^-r``) below."""
    with np.errstate(invalid="ignore", over="ignore"):
        log_upper = (alpha - 1.0) * (r - epsilon + np.log1p(-1.0 / alpha)) - np.log(alpha)
        upper = np.exp(np.minimum(np.where(np.isnan(log_upper), 0.0, log_upper), 0.0))
        lower = np.maximum(-np.expm1(np.minimum(epsilon - r, 0.0)), 0.0)
    return upper, lower


def _candidates(upper: np.ndarray, lower: np.ndarray) -> np.ndarray:
    """Mask of the orders that can attain the minimum over orders (along the last axis): those
    whose lower bound does not exceed the smallest upper bound. The optimal value of every
    other order is above that minimum, so dropping them never changes it."""
    best = upper.min(axis=-1, keepdims=True)
    return lower <= best + _PRUNE_SLACK * np.maximum(1.0, np.abs(best))


def epsilon_optimal(orders: Sequence[float] | np.ndarray, rdp: Sequence[float] | np.ndarray,
                    delta: float) -> tuple[float, float]:
    """(eps, order): the optimal RDP -> (eps, delta) conversion (Asoodeh et al.), min over orders."""
    orders_arr, rdp_arr = _as_curve(orders, rdp)
    delta = check_delta(delta)
    pick = np.flatnonzero(_candidates(*_eps_bounds(orders_arr, rdp_arr, delta)))
    eps = optimal_epsilons(orders_arr[pick], rdp_arr[pick], delta)
    best = int(np.argmin(eps))
    return float(eps[best]), float(orders_arr[pick][best])


def delta_optimal(orders: Sequence[float] | np.ndarray, rdp: Sequence[float] | np.ndarray,
                  epsilon: float) -> tuple[float, float]:
    """(delta, order): the optimal RDP -> (eps, delta) conversion (Asoodeh et al.), min over orders."""
    orders_arr, rdp_arr = _as_curve(orders, rdp)
    epsilon = check_epsilon(epsilon)
    pick = np.flatnonzero(_candidates(*_delta_bounds(orders_arr, rdp_arr, epsilon)))
    deltas = optimal_deltas(orders_arr[pick], rdp_arr[pick], epsilon)
    best = int(np.argmin(deltas))
    return float(deltas[best]), float(orders_arr[pick][best])


def optimal_rdp_budget(orders: Sequence[float] | np.ndarray, epsilon: float,
                       delta: float) -> np.ndarray:
    """Per order alpha, the RDP value r*(alpha) above which (alpha, r)-RDP no longer implies
    (eps, delta)-DP: Asoodeh et al.'s Theorem 3,
    ``r* = log min_p [p^a w^{1-a} + (1-p)^a (1-w)^{1-a}] / (a - 1)``, ``w = (p - delta) e^{-eps}``.

    The bracket is convex in p; it is minimised by golden-section search over
    ``log(p - delta)``. An inexact minimiser over-states r*, so callers that need a guarantee
    confirm with :func:`optimal_deltas` (as :func:`fedsim.privacy.rdp.max_steps` does).
    """
    orders_arr = np.asarray(orders, dtype=float).ravel()
    if orders_arr.size == 0 or np.any(~np.isfinite(orders_arr)) or np.any(orders_arr <= 1.0):
        raise ConfigError("RDP orders must be finite and > 1")
    epsilon = check_epsilon(epsilon)
    delta = check_delta(delta)
    alpha = orders_arr

    def log_bracket(v: np.ndarray) -> np.ndarray:
        p = delta + np.exp(v)
        log_w = v - epsilon
        return np.logaddexp(alpha * np.log(p) + (1.0 - alpha) * log_w,
                            alpha * np.log1p(-np.minimum(p, 1.0))
                            + (1.0 - alpha) * np.log1p(-np.exp(log_w)))

    lo = np.full_like(alpha, math.log(delta) - 80.0)
    hi = np.full_like(alpha, math.log1p(-delta))
    inv_phi = (math.sqrt(5.0) - 1.0) / 2.0
    x1 = hi - inv_phi * (hi - lo)
    x2 = lo + inv_phi * (hi - lo)
    with np.errstate(divide="ignore"):
        f1, f2 = log_bracket(x1), log_bracket(x2)
        for _ in range(_GOLDEN_STEPS):
            left = f1 <= f2
            hi = np.where(left, x2, hi)
            lo = np.where(left, lo, x1)
            x1_new = np.where(left, hi - inv_phi * (hi - lo), x2)
            x2_new = np.where(left, x1, lo + inv_phi * (hi - lo))
            f1_new = np.where(left, log_bracket(x1_new), f2)
            f2_new = np.where(left, f1, log_bracket(x2_new))
            x1, x2, f1, f2 = x1_new, x2_new, f1_new, f2_new
        best = np.minimum(log_bracket(x1), log_bracket(x2))
    return np.maximum(best, 0.0) / (alpha - 1.0)
