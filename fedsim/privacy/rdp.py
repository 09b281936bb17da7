"""Renyi-DP accounting: the ``rdp`` accountant, a guarantee.

What is analysed (see :mod:`fedsim.privacy.events`); ``mu = 1/sigma`` throughout:

* ``poisson`` steps, add/remove neighbours, noise ``C sigma``. The RDP of one step at order
  alpha is the exact Renyi divergence of the Poisson-subsampled Gaussian,
  ``rdp(alpha) = log A_alpha / (alpha - 1)`` with

      A_alpha = E_{x ~ N(0,1)} [(1 - q + q exp(mu x - mu^2/2))^alpha],

  i.e. ``A_alpha = exp((alpha-1) D_alpha(P || Q))`` for ``P = (1-q) N(0,1) + q N(mu,1)`` and
  ``Q = N(0,1)`` (the *remove* direction). Mironov, Talwar & Zhang, "Renyi Differential
  Privacy of the Sampled Gaussian Mechanism" (2019), Sec. 3: ``A_alpha >= B_alpha``, i.e.
  this direction dominates the *add* direction ``D_alpha(Q || P)`` for alpha >= 1 (the tests
  re-check it with mpmath), so the sum of A-curves bounds every ordered pair of a run.
  Integer orders use their closed form, written so that every term is positive
  (``A_alpha - 1 = sum_{k>=2} C(alpha,k) q^k (1-q)^{alpha-k} (e^{k(k-1) mu^2/2} - 1)``);
  fractional orders integrate ``A_alpha - 1 = E[(1+t)^alpha - 1 - alpha t]`` with
  ``t = q (exp(mu x - mu^2/2) - 1)`` (``E t = 0``, and the integrand is >= 0 so nothing
  cancels) by composite Gauss-Legendre quadrature in log space. No series: dp_accounting
  0.6.0's fractional-order series adds the absolute values of an alternating series and
  drops orders where it does not converge.
* ``fixed`` steps (m of N without replacement), replace-one neighbours, noise ``2 C sigma``:
  Wang, Balle & Kasiviswanathan, "Subsampled Renyi DP and analytical moments accountant"
  (AISTATS 2019), Thm 9 with the refined moment bound of their Thm 27 (the bound
  dp_accounting implements), for integer alpha >= 2::

      A'_alpha = 1 + q^2 C(alpha,2) min(4 (e^{mu^2} - 1), 2 e^{mu^2})
                   + sum_{j=3}^alpha q^j C(alpha,j) min(4 sqrt(m_{2 floor(j/2)} m_{2 ceil(j/2)}),
                                                      2 e^{(j-1) j mu^2 / 2})

  with ``m_k = E_{N(0,1)}[(exp(mu x - mu^2/2) - 1)^k]`` (even k), and fractional orders by
  the convexity of ``(alpha - 1) rdp(alpha)`` (their Cor. 10). The even moments are
  computed by quadrature of a non-negative integrand, not by dp_accounting's alternating
  binomial sums, which lose all precision for large sigma (dp_accounting 0.6.0 gives 0.109
  at q=0.5, sigma=20, alpha=64, above even the unsampled Gaussian's 0.08; this gives 0.046). Above order 256 only the
  second branch of the minimum is used (as in dp_accounting). The result is also capped by
  the unsampled Gaussian's ``alpha/(2 sigma^2)``: sampling can only help (joint
  quasi-convexity of the Renyi divergence).
* ``q == 1`` (either scheme): the Gaussian mechanism, ``rdp(alpha) = alpha/(2 sigma^2)``
  (``sigma`` is already relative to the relation's sensitivity, C or 2C).

A history's RDP is the sum over steps (Mironov 2017, Prop. 1); conversions to (eps, delta)
are in :mod:`fedsim.privacy.rdp_conversion`: ``epsilon`` / ``delta`` use the optimal
conversion of Asoodeh et al. (paper 001), ``epsilon_classic`` the classic one.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from functools import lru_cache
from typing import Any, Literal

import numpy as np
from scipy import special

from fedsim.errors import ConfigError
from fedsim.privacy import rdp_conversion
from fedsim.privacy.accountant import Accountant
from fedsim.privacy.events import GaussianStep, Sampling

__all__ = [
    "DEFAULT_ORDERS",
    "RDPAccountant",
    "fixed_size_rdp",
    "gaussian_rdp",
    "history_rdp",
    "max_steps",
    "poisson_rdp",
    "step_rdp",
]

Conversion = Literal["optimal", "classic"]

DEFAULT_ORDERS: tuple[float, ...] = tuple(
    [1.01, 1.02, 1.03, 1.05, 1.075]
    + [round(1.1 + 0.1 * i, 2) for i in range(9)]              # 1.1 ... 1.9
    + [round(2.0 + 0.125 * i, 3) for i in range(48) if i % 8]   # 2.125 ... 7.875
    + [8.5, 9.5, 10.5, 11.5]
    + list(range(2, 65))
    + [72, 80, 96, 112, 128, 160, 192, 224, 256, 320, 384, 448, 512, 640, 768, 896, 1024]
)
"""Wide and dense at small orders, where the RDP curve of subsampled Gaussians bends most."""

_WBK_EXACT_MAX_ORDER = 256
_GL_NODES = 8
_TAIL = 40.0  # standard deviations: exp(-40^2/2) is far below double precision
_TRADEOFF_GRID = 160


# -- quadrature -----------------------------------------------------------------------
def _log_integral(log_integrand: Any, lo: float, hi: float, panel: float) -> np.ndarray:
    """log of the integral over [lo, hi] of exp(log_integrand(x)) (rows = functions), by
    composite 8-point Gauss-Legendre on panels of width <= ``panel``, scaled per row."""
    n_panels = max(1, math.ceil((hi - lo) / panel))
    edges = np.linspace(lo, hi, n_panels + 1)
    nodes, weights = np.polynomial.legendre.leggauss(_GL_NODES)
    half = 0.5 * (edges[1] - edges[0])
    x = (0.5 * (edges[:-1] + edges[1:]))[:, None] + half * nodes[None, :]
    x = x.ravel()
    w = np.tile(weights * half, n_panels)
    with np.errstate(divide="ignore", over="ignore", invalid="ignore"):
        values = log_integrand(x)
    values = np.where(np.isnan(values), -np.inf, values)
    peak = np.max(values, axis=-1, keepdims=True)
    peak = np.where(np.isfinite(peak), peak, 0.0)
    total = np.sum(np.exp(values - peak) * w, axis=-1)
    with np.errstate(divide="ignore"):
        return peak[..., 0] + np.log(total)


def _log_abs_expm1(u: np.ndarray) -> np.ndarray:
    """log|e^u - 1| without overflow."""
    with np.errstate(divide="ignore"):
        return np.where(u > 30.0, u + np.log1p(-np.exp(-np.abs(u))),
                        np.log(np.abs(np.expm1(np.minimum(u, 30.0)))))


def _log_normal_pdf(x: np.ndarray) -> np.ndarray:
    return -0.5 * x * x - 0.5 * math.log(2.0 * math.pi)


# -- Poisson subsampling, add/remove ---------------------------------------------------
def _poisson_log_excess_integer(q: float, sigma: float, orders: np.ndarray) -> np.ndarray:
    """log(A_alpha - 1) for integer orders >= 2 (Mironov, Talwar & Zhang 2019, Sec. 3.3)."""
    top = int(orders.max())
    k = np.arange(2, top + 1, dtype=float)
    alpha = orders[:, None]
    log_binom = special.gammaln(alpha + 1) - special.gammaln(k + 1) - special.gammaln(alpha - k + 1)
    x = k * (k - 1) / (2.0 * sigma**2)
    with np.errstate(invalid="ignore"):
        terms = log_binom + k * math.log(q) + (alpha - k) * math.log1p(-q) + _log_abs_expm1(x)
    terms = np.where(k[None, :] <= alpha, terms, -np.inf)
    return special.logsumexp(terms, axis=1)


def _poisson_log_excess_fractional(q: float, sigma: float, orders: np.ndarray) -> np.ndarray:
    """log(A_alpha - 1) for any order > 1 by quadrature of E[(1+t)^a - 1 - a t] >= 0."""
    mu = 1.0 / sigma
    alpha = orders[:, None]
    log1mq, logq = math.log1p(-q), math.log(q)

    def log_integrand(x: np.ndarray) -> np.ndarray:
        u = mu * x - 0.5 * mu * mu
        t = q * np.expm1(np.minimum(u, 700.0))
        power = alpha * np.logaddexp(log1mq, logq + u)  # alpha log(1 + t)
        # (1+t)^a - 1 - a t: factor out (1+t)^a where it is large, a short series where |t|
        # is small (the direct difference cancels there), the direct difference elsewhere.
        # (1 + a t) / (1+t)^a is formed in log space where t is large (it may overflow).
        log_t = logq + _log_abs_expm1(u)
        ratio = np.where(t > 1.0, np.exp(np.logaddexp(0.0, np.log(alpha) + log_t)
                                          - power),
                         np.exp(-np.maximum(power, 0.5)) * (1.0 + alpha * t))
        large = power + np.log1p(-ratio)
        c2 = alpha * (alpha - 1.0) / 2.0
        c3 = c2 * (alpha - 2.0) / 3.0
        c4 = c3 * (alpha - 3.0) / 4.0
        c5 = c4 * (alpha - 4.0) / 5.0
        c6 = c5 * (alpha - 5.0) / 6.0
        series = t * t * (c2 + t * (c3 + t * (c4 + t * (c5 + t * c6))))
        direct = np.expm1(np.minimum(power, 0.5)) - alpha * t
        small = np.log(np.where(np.abs(t) < 1e-3, series, direct))
        return np.where(power > 0.5, large, small) + _log_normal_pdf(x)

    hi = max(float(orders.max()) * mu, 2.0 * mu) + _TAIL
    panel = min(0.5, 0.5 * sigma)  # the integrand bends on the scale sigma in x
    return _log_integral(log_integrand, -_TAIL, hi, panel)


def gaussian_rdp(sigma: float, orders: Sequence[float] | np.ndarray) -> np.ndarray:
    """RDP of the Gaussian mechanism with noise multiplier sigma: ``alpha / (2 sigma^2)``."""
    return np.asarray(orders, dtype=float) / (2.0 * sigma**2)


def poisson_rdp(q: float, sigma: float, orders: Sequence[float] | np.ndarray) -> np.ndarray:
    """Exact RDP of one Poisson-subsampled Gaussian step (add/remove neighbours)."""
    orders_arr = _check_orders(orders)
    _check_q_sigma(q, sigma)
    if q == 1.0:
        return gaussian_rdp(sigma, orders_arr)
    integer = orders_arr == np.round(orders_arr)
    log_excess = np.empty_like(orders_arr)
    if np.any(integer):
        log_excess[integer] = _poisson_log_excess_integer(q, sigma, orders_arr[integer])
    if np.any(~integer):
        log_excess[~integer] = _poisson_log_excess_fractional(q, sigma, orders_arr[~integer])
    rdp = np.logaddexp(0.0, log_excess) / (orders_arr - 1.0)
    return np.minimum(rdp, gaussian_rdp(sigma, orders_arr))


# -- fixed-size sampling without replacement, replace-one -------------------------------
@lru_cache(maxsize=256)
def _gaussian_log_even_moments(sigma: float, top: int) -> np.ndarray:
    """log m_k, k = 0, 2, 4, ..., top: m_k = E_{N(0,1)}[(exp(mu x - mu^2/2) - 1)^k]."""
    mu = 1.0 / sigma
    even = np.arange(2, top + 1, 2, dtype=float)[:, None]

    def log_integrand(x: np.ndarray) -> np.ndarray:
        return even * _log_abs_expm1(mu * x - 0.5 * mu * mu) + _log_normal_pdf(x)

    hi = float(even.max()) * mu + _TAIL
    panel = min(0.5, 0.5 * sigma)
    moments = _log_integral(log_integrand, -_TAIL, hi, panel)
    moments.setflags(write=False)
    return np.concatenate([[0.0], moments])


def _wbk_log_a(q: float, sigma: float, alpha: int) -> float:
    """log A'_alpha of Wang-Balle-Kasiviswanathan (Thm 9 / Thm 27) for integer alpha >= 2."""
    mu2 = 1.0 / sigma**2
    j = np.arange(2, alpha + 1, dtype=float)
    log_binom = special.gammaln(alpha + 1) - special.gammaln(j + 1) - special.gammaln(alpha - j + 1)
    rough = math.log(2.0) + (j - 1.0) * j * mu2 / 2.0   # 2 e^{(j-1) eps(j)}
    if alpha <= _WBK_EXACT_MAX_ORDER:
        top = 2 * math.ceil(alpha / 2)
        moments = _gaussian_log_even_moments(sigma, max(top, 2))
        lo = moments[(np.floor(j / 2)).astype(int)]
        hi = moments[(np.ceil(j / 2)).astype(int)]
        fine = math.log(4.0) + 0.5 * (lo + hi)
        bound = np.minimum(fine, rough)
    else:
        bound = rough
    # j = 2: min(4 (e^{eps(2)} - 1), 2 e^{eps(2)}), eps(2) = mu^2
    bound[0] = min(math.log(4.0) + mu2 + math.log(-math.expm1(-mu2)), math.log(2.0) + mu2)
    terms = log_binom + j * math.log(q) + bound
    return float(np.logaddexp(0.0, special.logsumexp(terms)))


def fixed_size_rdp(q: float, sigma: float, orders: Sequence[float] | np.ndarray) -> np.ndarray:
    """RDP upper bound of one fixed-size (without replacement) subsampled Gaussian step,
    replace-one neighbours (Wang, Balle & Kasiviswanathan 2019; see the module docstring)."""
    orders_arr = _check_orders(orders)
    _check_q_sigma(q, sigma)
    if q == 1.0:
        return gaussian_rdp(sigma, orders_arr)
    needed = sorted({int(math.floor(a)) for a in orders_arr} | {int(math.ceil(a)) for a in orders_arr})
    log_a = {a: (0.0 if a == 1 else _wbk_log_a(q, sigma, a)) for a in needed}
    floor = np.floor(orders_arr)
    frac = orders_arr - floor
    low = np.array([log_a[int(a)] for a in floor])
    high = np.array([log_a[int(math.ceil(a))] for a in orders_arr])
    rdp = ((1.0 - frac) * low + frac * high) / (orders_arr - 1.0)
    return np.minimum(rdp, gaussian_rdp(sigma, orders_arr))


# -- steps and histories ---------------------------------------------------------------------
@lru_cache(maxsize=8192)
def _step_curve(sampling: Sampling, q: float, sigma: float, orders: tuple[float, ...]) -> np.ndarray:
    compute = poisson_rdp if sampling == "poisson" else fixed_size_rdp
    curve = compute(q, sigma, np.asarray(orders))
    curve.setflags(write=False)
    return curve


def step_rdp(step: GaussianStep, orders: Sequence[float] | np.ndarray = DEFAULT_ORDERS) -> np.ndarray:
    """RDP of ONE release of ``step`` (its ``count`` ignored), cached per (sampling, q, sigma)."""
    orders_t = tuple(float(a) for a in _check_orders(orders))
    return _step_curve(step.sampling, step.q, step.sigma, orders_t)


def history_rdp(steps: Iterable[GaussianStep],
                orders: Sequence[float] | np.ndarray = DEFAULT_ORDERS) -> np.ndarray:
    """RDP of the composition of ``steps`` (``count`` releases each): the sum of the curves."""
    orders_arr = _check_orders(orders)
    total = np.zeros_like(orders_arr)
    for step in steps:
        total = total + step.count * step_rdp(step, orders_arr)
    return total


def max_steps(step: GaussianStep, epsilon: float, delta: float,
              conversion: Conversion = "optimal",
              orders: Sequence[float] | np.ndarray = DEFAULT_ORDERS) -> int:
    """Largest T such that T releases of ``step`` (its ``count`` ignored) are (eps, delta)-DP
    by RDP accounting with the given conversion; 0 if not even one release is.

    ``"classic"``: ``T = max_alpha floor((eps - log(1/delta)/(alpha-1)) / rdp(alpha))``.
    ``"optimal"``: ``T = max_alpha floor(r*(alpha) / rdp(alpha))`` with ``r*`` from paper 001's
    Theorem 3 (:func:`fedsim.privacy.rdp_conversion.optimal_rdp_budget`), then confirmed and
    corrected by the certified ``delta(eps) <= delta`` test of
    :func:`fedsim.privacy.rdp_conversion.delta_optimal`.
    """
    if conversion not in ("optimal", "classic"):
        raise ConfigError(f"conversion must be 'optimal' or 'classic', got {conversion!r}")
    epsilon = rdp_conversion.check_epsilon(epsilon)
    delta = rdp_conversion.check_delta(delta)
    orders_arr = _check_orders(orders)
    unit = step_rdp(step, orders_arr)

    if conversion == "classic":
        budget = epsilon - math.log(1.0 / delta) / (orders_arr - 1.0)

        def allowed(t: int) -> bool:
            return rdp_conversion.epsilon_classic(orders_arr, t * unit, delta)[0] <= epsilon
    else:
        budget = rdp_conversion.optimal_rdp_budget(orders_arr, epsilon, delta)

        def allowed(t: int) -> bool:
            return rdp_conversion.delta_optimal(orders_arr, t * unit, epsilon)[0] <= delta

    with np.errstate(divide="ignore", invalid="ignore"):
        per_order = np.where(budget > 0, np.floor(budget / unit), 0.0)
    guess = int(min(np.nanmax(per_order), 1e15))
    # the closed forms are exact up to rounding: move by single steps to the certified answer
    while guess > 0 and not allowed(guess):
        guess -= 1
    while allowed(guess + 1):
        guess += 1
    return guess


# -- the accountant ----------------------------------------------------------------------
class RDPAccountant(Accountant):
    """Renyi-DP accountant (a guarantee) with the optimal RDP -> (eps, delta) conversion.

    Neighbouring relation: add/remove for ``poisson`` steps, replace-one for ``fixed`` steps
    (one relation per accountant, see :class:`fedsim.privacy.accountant.Accountant`).
    ``epsilon``/``delta`` use the optimal conversion of Asoodeh et al. 2021 (paper 001);
    ``epsilon_classic``/``delta_classic`` the classic one (Mironov 2017) for comparison.

    Settings: ``orders``, the Renyi orders (> 1) the curve is evaluated at
    (default :data:`DEFAULT_ORDERS`, 1.01 ... 1024).
    """

    name = "rdp"

    def __init__(self, steps: Iterable[GaussianStep] = (), *,
                 orders: Sequence[float] | None = None) -> None:
        self._orders = _check_orders(DEFAULT_ORDERS if orders is None else orders)
        self._orders.setflags(write=False)
        self._composed: np.ndarray | None = None
        super().__init__(steps)

    @property
    def orders(self) -> np.ndarray:
        return self._orders

    def settings(self) -> dict[str, Any]:
        return {"orders": [float(a) for a in self._orders]}

    def _invalidate(self) -> None:
        self._composed = None

    def _copy_caches_from(self, other: Accountant) -> None:
        # the composed curve is read-only and shared; compose() replaces it
        self._composed = other._composed if isinstance(other, RDPAccountant) else None

    def rdp(self, orders: Sequence[float] | np.ndarray | None = None) -> np.ndarray:
        """The composed RDP curve at ``orders`` (default: the accountant's orders)."""
        if orders is not None:
            return history_rdp(self.steps, orders)
        if self._composed is None:
            composed = history_rdp(self.steps, self._orders)
            composed.setflags(write=False)
            self._composed = composed
        return self._composed

    def epsilon(self, delta: float) -> float:
        """eps(delta) by the optimal conversion (paper 001), minimised over orders."""
        return self.epsilon_optimal(delta)

    def epsilon_optimal(self, delta: float) -> float:
        rdp_conversion.check_delta(delta)
        if not self.steps:
            return 0.0
        return rdp_conversion.epsilon_optimal(self._orders, self.rdp(), delta)[0]

    def epsilon_classic(self, delta: float) -> float:
        """eps = min_a rdp(a) + log(1/delta)/(a - 1) (Mironov 2017, Prop. 3)."""
        rdp_conversion.check_delta(delta)
        if not self.steps:
            return 0.0
        return rdp_conversion.epsilon_classic(self._orders, self.rdp(), delta)[0]

    def best_order(self, delta: float, conversion: Conversion = "optimal") -> float | None:
        """The Renyi order that gives eps(delta); None for an empty history."""
        rdp_conversion.check_delta(delta)
        if not self.steps:
            return None
        convert = (rdp_conversion.epsilon_optimal if conversion == "optimal"
                   else rdp_conversion.epsilon_classic)
        return convert(self._orders, self.rdp(), delta)[1]

    def delta(self, epsilon: float) -> float:
        """delta(eps) by the optimal conversion (paper 001), minimised over orders."""
        rdp_conversion.check_epsilon(epsilon)
        if not self.steps:
            return 0.0
        return rdp_conversion.delta_optimal(self._orders, self.rdp(), epsilon)[0]

    def delta_classic(self, epsilon: float) -> float:
        rdp_conversion.check_epsilon(epsilon)
        if not self.steps:
            return 0.0
        return rdp_conversion.delta_classic(self._orders, self.rdp(), epsilon)[0]

    def tradeoff(self, alpha: np.ndarray) -> np.ndarray:
        """A lower bound on the trade-off curve: the envelope of the optimal (eps, delta(eps))
        guarantees on a grid of eps,
        ``beta(a) = max_eps max(0, 1 - delta(eps) - e^eps a, e^-eps (1 - delta(eps) - a))``
        (Dong, Roth & Su, Prop. 2.5 / Wasserman-Zhou; both inequalities hold because every
        (eps, delta) bound here covers both orderings of a neighbouring pair). Each grid point
        is a valid bound, so a finite grid only loosens the curve. It is not the direct
        RDP -> f-DP conversion, which can be tighter.
        """
        alpha_arr = np.asarray(alpha, dtype=float)
        if np.any(~np.isfinite(alpha_arr)) or np.any((alpha_arr < 0) | (alpha_arr > 1)):
            raise ConfigError("type I errors alpha must lie in [0, 1]")
        if not self.steps:
            return 1.0 - alpha_arr
        # beyond eps = 700 the bounds 1 - delta - e^eps a are vacuous for any a > e^-700
        eps_top = min(max(self.epsilon_optimal(1e-12), 1e-6), 700.0)
        eps_grid = np.concatenate([[0.0], np.geomspace(eps_top * 1e-4, eps_top, _TRADEOFF_GRID)])
        deltas = rdp_conversion.optimal_delta_curve(self._orders, self.rdp(), eps_grid)
        flat = alpha_arr.reshape(-1, 1)
        exp_eps = np.exp(eps_grid)[None, :]
        remain = 1.0 - deltas[None, :]
        beta = np.maximum(remain - exp_eps * flat, (remain - flat) / exp_eps)
        return np.clip(beta.max(axis=1), 0.0, 1.0).reshape(alpha_arr.shape)


# -- validation ------------------------------------------------------------------------------
def _check_orders(orders: Sequence[float] | np.ndarray) -> np.ndarray:
    try:
        arr = np.asarray(orders, dtype=float).ravel()
    except (TypeError, ValueError) as exc:
        raise ConfigError(f"RDP orders must be numbers: {exc}") from exc
    if arr.size == 0 or np.any(~np.isfinite(arr)) or np.any(arr <= 1.0):
        raise ConfigError("RDP orders must be a non-empty list of finite numbers > 1")
    return arr


def _check_q_sigma(q: float, sigma: float) -> None:
    if not (math.isfinite(q) and 0.0 < q <= 1.0):
        raise ConfigError(f"q must be in (0, 1], got {q!r}")
    if not (math.isfinite(sigma) and sigma > 0.0):
        raise ConfigError(f"sigma must be a finite number > 0, got {sigma!r}")
