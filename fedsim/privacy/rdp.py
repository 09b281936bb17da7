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
  cancels) by composite Gauss-Legendre quadrature in log space (agrees with mpmath to 1e-9). No series: dp_accounting
  0.6.0's fractional-order series adds the absolute values of an alternating series and
  drops orders where it does not converge.
* ``fixed`` steps (m of N without replacement), replace-one neighbours, noise ``2 C sigma``:
  the Renyi divergence of the canonical pair of the exact f-DP curve
  ``C_q(G_{1/sigma})`` (Dong, Roth & Su, Thm 4.2 / 5.1; the same model as the ``pld``
  accountant). Every neighbouring pair has a trade-off curve above it, hence (Blackwell) is a
  garbling of that pair and has no larger Renyi divergence. With ``x = Phi(-z)``::

      e^{(alpha-1) rdp(alpha)} = int_0^1 |f'|^alpha
          = I_alpha + (1-q) (Phi(mu/2) - Phi(-mu/2)) + I_{1-alpha},
      I_b = int_{mu/2}^inf (1 - q + q e^{mu z - mu^2/2})^b phi(z) dz

  (derivation in :func:`fixed_size_rdp`). It lies between the Poisson value at the same q
  and sigma and the Wang-Balle-Kasiviswanathan (AISTATS 2019) bound that dp_accounting
  implements (measured: 2-3x below it at orders <= 10), and it is capped by the unsampled
  Gaussian's ``alpha/(2 sigma^2)``.
* ``q == 1`` (either scheme): the Gaussian mechanism, ``rdp(alpha) = alpha/(2 sigma^2)``
  (``sigma`` is already relative to the relation's sensitivity, C or 2C).

A history's RDP is the sum over steps (Mironov 2017, Prop. 1); conversions to (eps, delta)
are in :mod:`fedsim.privacy.rdp_conversion`: ``epsilon`` / ``delta`` use the optimal
conversion of Asoodeh et al., ``epsilon_classic`` the classic one.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from functools import lru_cache
from typing import Any, Literal

import numpy as np
from scipy import special

from fedsim.errors import ConfigError, UnsupportedEventError
from fedsim.privacy import rdp_conversion
from fedsim.privacy.accountant import Accountant
from fedsim.privacy.events import GaussianStep, Sampling, TunedSelection
from fedsim.privacy.tuning import base_rdp, trials_of, tuned_rdp

__all__ = [
    "DEFAULT_ORDERS",
    "RDPAccountant",
    "fixed_size_rdp",
    "gaussian_rdp",
    "history_rdp",
    "max_steps",
    "poisson_rdp",
    "selection_rdp",
    "step_rdp",
]

Conversion = Literal["optimal", "classic"]

DEFAULT_ORDERS: tuple[float, ...] = tuple(sorted(
    [1.01, 1.02, 1.03, 1.05, 1.075]
    + [round(1.1 + 0.1 * i, 2) for i in range(9)]              # 1.1 ... 1.9
    + [round(2.0 + 0.125 * i, 3) for i in range(48) if i % 8]   # 2.125 ... 7.875
    + [8.5, 9.5, 10.5, 11.5]
    + list(range(2, 65))
    + [72, 80, 96, 112, 128, 160, 192, 224, 256, 320, 384, 448, 512, 640, 768, 896, 1024]
))
"""Wide and dense at small orders, where the RDP curve of subsampled Gaussians bends most."""

_GL_NODES = 8
_TAIL = 15.0  # standard deviations: exp(-15^2/2) = 2e-49, far below double precision
# Most quadrature panels per integral. The panels are sigma/2 wide (the integrand bends on that
# scale) over a range of about alpha/sigma, so small sigma needs ~alpha/sigma^2 of them (sigma
# = 0.01 took 37 s); beyond this count a step uses a bound instead (see poisson_rdp and
# fixed_size_rdp), which only happens where the RDP is already large.
_MAX_PANELS = 4096
_TRADEOFF_GRID = 160


# -- quadrature -----------------------------------------------------------------------
def _panels(lo: float, hi: float, panel: float) -> float:
    """How many panels of width <= ``panel`` cover [lo, hi] (inf if that overflows)."""
    span = (hi - lo) / panel
    return max(1.0, math.ceil(span)) if math.isfinite(span) else math.inf


def _log_integral(log_integrand: Any, lo: float, hi: float, panel: float) -> np.ndarray:
    """log of the integral over [lo, hi] of exp(log_integrand(x)) (rows = functions), by
    composite 8-point Gauss-Legendre on panels of width <= ``panel``, scaled per row."""
    n_panels = int(_panels(lo, hi, panel))
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
    mu = 1.0 / sigma
    with np.errstate(over="ignore"):  # mu^2 = inf: no noise, infinite RDP
        x = k * (k - 1) / 2.0 * (mu * mu)
    with np.errstate(invalid="ignore"):
        terms = log_binom + k * math.log(q) + (alpha - k) * math.log1p(-q) + _log_abs_expm1(x)
    terms = np.where(k[None, :] <= alpha, terms, -np.inf)
    return special.logsumexp(terms, axis=1)


def _log_binomial_remainder(beta: np.ndarray, t: np.ndarray, log_t: np.ndarray) -> np.ndarray:
    """log((1+t)^beta - 1 - beta t), which is >= 0 for beta > 1 or beta < 0 and t > -1.

    Stable in every regime: a six-term binomial series where |beta t| is small (the direct
    difference cancels there), log-space forms where t or (1+t)^beta would overflow, and
    the direct difference elsewhere. ``log_t`` is log|t|, supplied so that t may be huge.
    """
    log1p_t = np.where(t > 1.0, np.logaddexp(0.0, log_t), np.log1p(np.minimum(t, 1.0)))
    power = beta * log1p_t  # log (1+t)^beta
    log_abs_beta = np.log(np.abs(beta))
    with np.errstate(over="ignore", invalid="ignore", divide="ignore"):
        c2 = beta * (beta - 1.0) / 2.0
        c3 = c2 * (beta - 2.0) / 3.0
        c4 = c3 * (beta - 3.0) / 4.0
        c5 = c4 * (beta - 4.0) / 5.0
        c6 = c5 * (beta - 5.0) / 6.0
        series = np.log(t * t * (c2 + t * (c3 + t * (c4 + t * (c5 + t * c6)))))
        # beta > 1 and (1+t)^beta large: factor it out; (1 + beta t) in log space if t > 1
        log_one_beta_t = np.where(t > 1.0, np.logaddexp(0.0, log_abs_beta + log_t),
                                  np.log1p(beta * np.minimum(t, 1.0)))
        grows = power + np.log1p(-np.exp(log_one_beta_t - power))
        # beta < 0 and t > 1: |beta| t dominates
        shrinks = log_abs_beta + log_t + np.log1p(np.expm1(power) * np.exp(-log_abs_beta - log_t))
        direct = np.log(np.expm1(np.minimum(power, 0.5)) - beta * np.minimum(t, 1.0))
    # the series' first omitted term is ~ (beta t)^7 / 7!, relative to (beta t)^2 / 2
    return np.where(np.abs(beta * t) < 1e-3, series,
                    np.where((beta > 0) & (power > 0.5), grows,
                             np.where((beta < 0) & (t > 1.0), shrinks, direct)))


def _poisson_fractional_panels(sigma: float, orders: np.ndarray) -> float:
    """Panels :func:`_poisson_log_excess_fractional` would integrate over."""
    mu = 1.0 / sigma
    return _panels(-_TAIL, max(float(orders.max()) * mu, 2.0 * mu) + _TAIL, min(0.5, 0.5 * sigma))


def _poisson_log_excess_fractional(q: float, sigma: float, orders: np.ndarray) -> np.ndarray:
    """log(A_alpha - 1) for any order > 1 by quadrature of E[(1+t)^a - 1 - a t] >= 0,
    t = q (exp(mu x - mu^2/2) - 1), x ~ N(0, 1)."""
    mu = 1.0 / sigma
    alpha = orders[:, None]

    def log_integrand(x: np.ndarray) -> np.ndarray:
        u = mu * x - 0.5 * mu * mu
        t = q * np.expm1(np.minimum(u, 700.0))
        log_t = math.log(q) + _log_abs_expm1(u)
        return _log_binomial_remainder(alpha, t, log_t) + _log_normal_pdf(x)

    hi = max(float(orders.max()) * mu, 2.0 * mu) + _TAIL
    panel = min(0.5, 0.5 * sigma)  # the integrand bends on the scale sigma in x
    return _log_integral(log_integrand, -_TAIL, hi, panel)


def gaussian_rdp(sigma: float, orders: Sequence[float] | np.ndarray) -> np.ndarray:
    """RDP of the Gaussian mechanism with noise multiplier sigma: ``alpha / (2 sigma^2)``
    (``inf`` where sigma is so small that 1/sigma^2 overflows: no noise)."""
    mu = 1.0 / sigma
    with np.errstate(over="ignore"):
        return np.asarray(orders, dtype=float) * (0.5 * mu * mu)


def poisson_rdp(q: float, sigma: float, orders: Sequence[float] | np.ndarray) -> np.ndarray:
    """Exact RDP of one Poisson-subsampled Gaussian step (add/remove neighbours).

    Where the quadrature of fractional orders would need more than ``_MAX_PANELS`` panels
    (sigma below about 0.1 at the default orders), a fractional order alpha gets the exact
    value at ``ceil(alpha)`` instead: an upper bound, since the Renyi divergence is
    non-decreasing in its order (van Erven & Harremoes, "Renyi divergence and
    Kullback-Leibler divergence", IEEE Trans. Inf. Theory 2014, Thm 3).
    """
    orders_arr = _check_orders(orders)
    _check_q_sigma(q, sigma)
    if q == 1.0:
        return gaussian_rdp(sigma, orders_arr)
    if not math.isfinite(0.5 / sigma / sigma):  # no noise at double precision
        return np.full_like(orders_arr, np.inf)
    integer = orders_arr == np.round(orders_arr)
    fractional = orders_arr[~integer]
    bounded = fractional.size > 0 and _poisson_fractional_panels(sigma, fractional) > _MAX_PANELS
    exact = np.ceil(orders_arr) if bounded else orders_arr
    integer = exact == np.round(exact)
    log_excess = np.empty_like(orders_arr)
    if np.any(integer):
        log_excess[integer] = _poisson_log_excess_integer(q, sigma, exact[integer])
    if np.any(~integer):
        log_excess[~integer] = _poisson_log_excess_fractional(q, sigma, exact[~integer])
    rdp = np.logaddexp(0.0, log_excess) / (exact - 1.0)
    return np.minimum(rdp, gaussian_rdp(sigma, exact))


# -- fixed-size sampling without replacement, replace-one -------------------------------
def _fixed_log_excess(q: float, sigma: float, orders: np.ndarray) -> np.ndarray:
    """log(e^{(alpha-1) rdp(alpha)} - 1) = log(H_alpha + H_{1-alpha}) for C_q(G_{1/sigma}).

    ``H_b = int_{mu/2}^inf [(1+t)^b - 1 - b t] phi(z) dz`` with ``t = q (e^{mu z - mu^2/2} - 1)``
    (>= 0 on the domain). Integer alpha use the closed form of H_alpha, regrouped so that every
    term is >= 0: ``sum_{k>=2} C(a,k) q^k (1-q)^{a-k} [e^{k(k-1) mu^2/2} Phi((k-1/2) mu)
    - Phi(-mu/2) - k D]``, ``D = Phi(mu/2) - Phi(-mu/2)``; the rest is quadrature.
    """
    mu = 1.0 / sigma
    lower = 0.5 * mu
    panel = min(0.5, 0.5 * sigma)
    alpha = orders[:, None]

    def remainder(beta: np.ndarray) -> Any:
        def log_integrand(z: np.ndarray) -> np.ndarray:
            u = mu * z - 0.5 * mu * mu
            t = q * np.expm1(np.minimum(u, 700.0))
            log_t = math.log(q) + _log_abs_expm1(u)
            return _log_binomial_remainder(beta, t, log_t) + _log_normal_pdf(z)
        return log_integrand

    # H_{1-alpha}: the integrand is at most ((alpha-1) t + 1) phi, negligible beyond 2 mu + 40
    log_h_low = _log_integral(remainder(1.0 - alpha), lower, 2.0 * mu + _TAIL, panel)
    log_h_high = np.empty_like(orders)
    integer = orders == np.round(orders)
    if np.any(~integer):
        frac = orders[~integer]
        hi = max(float(frac.max()), 2.0) * mu + _TAIL
        log_h_high[~integer] = _log_integral(remainder(frac[:, None]), lower, hi, panel)
    if np.any(integer):
        ints = orders[integer][:, None]
        k = np.arange(2, int(ints.max()) + 1, dtype=float)
        log_binom = (special.gammaln(ints + 1) - special.gammaln(k + 1)
                     - special.gammaln(ints - k + 1))
        log_tilted = k * (k - 1) * mu * mu / 2 + special.log_ndtr((k - 0.5) * mu)
        log_linear = np.log(special.ndtr(-lower) + k * math.erf(lower / math.sqrt(2.0)))
        with np.errstate(divide="ignore", invalid="ignore"):
            log_bracket = log_tilted + np.log(-np.expm1(np.minimum(log_linear - log_tilted, 0.0)))
            terms = log_binom + k * math.log(q) + (ints - k) * math.log1p(-q) + log_bracket
        terms = np.where(k[None, :] <= ints, terms, -np.inf)
        log_h_high[integer] = special.logsumexp(terms, axis=1)
    return np.logaddexp(log_h_high, log_h_low)


def fixed_size_rdp(q: float, sigma: float, orders: Sequence[float] | np.ndarray) -> np.ndarray:
    """RDP of one fixed-size (without replacement) subsampled Gaussian step, replace-one
    neighbours: the Renyi divergence of the pair realising ``C_q(G_{1/sigma})``.

    Dong, Roth & Su (Thm 4.2 / 5.1): every replace-one neighbouring pair of outputs has a
    trade-off curve >= ``f = C_q(G_mu) = min{f_q, f_q^{-1}}^**``, ``f_q = q G_mu + (1-q) Id``.
    By Blackwell's theorem such a pair is a garbling of the canonical pair of f
    (P = U[0,1], dQ/dP = -f'), so its Renyi divergence is at most
    ``D_alpha(f) = log int_0^1 |f'(x)|^alpha dx / (alpha - 1)`` (the same in both directions, f
    is symmetric). ``f`` is ``f_q`` up to ``x* = Phi(-mu/2)`` (slope -1), then a segment of
    slope -1 and length ``(1-q) D``, then ``f_q^{-1}``; substituting ``x = Phi(-z)`` gives
    ``int |f'|^alpha = I_alpha + (1-q) D + I_{1-alpha}`` with
    ``I_b = int_{mu/2}^inf (1 - q + q e^{mu z - mu^2/2})^b phi(z) dz``, hence
    ``e^{(alpha-1) rdp} - 1 = H_alpha + H_{1-alpha}`` (see :func:`_fixed_log_excess`).
    For q = 1 this is the Gaussian's ``alpha / (2 sigma^2)``.

    Where its quadrature would need more than ``_MAX_PANELS`` panels (sigma below about 0.1),
    the step gets the Gaussian's value, an upper bound (subsampling never hurts privacy).
    """
    orders_arr = _check_orders(orders)
    _check_q_sigma(q, sigma)
    mu = 1.0 / sigma
    fractional = orders_arr[orders_arr != np.round(orders_arr)]
    top = max(float(fractional.max()) if fractional.size else 0.0, 2.0)
    if q == 1.0 or _panels(0.5 * mu, top * mu + _TAIL, min(0.5, 0.5 * sigma)) > _MAX_PANELS:
        return gaussian_rdp(sigma, orders_arr)
    rdp = np.logaddexp(0.0, _fixed_log_excess(q, sigma, orders_arr)) / (orders_arr - 1.0)
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


def selection_rdp(event: TunedSelection,
                  orders: Sequence[float] | np.ndarray = DEFAULT_ORDERS) -> np.ndarray:
    """RDP of a tuned selection (all its trials and the release of the best): the candidates'
    per-trial curves (:func:`history_rdp`) combined by their pointwise maximum
    (:func:`fedsim.privacy.tuning.base_rdp`), then Papernot & Steinke's Thm 2 / Thm 6 for the
    event's distribution of K (:func:`fedsim.privacy.tuning.tuned_rdp`). Neighbouring
    relation: the candidates' steps'. The orders may come in any order."""
    orders_arr = _check_orders(orders)
    rank = np.argsort(orders_arr, kind="stable")
    ordered, first = np.unique(orders_arr[rank], return_inverse=True)
    curves = [history_rdp(candidate, ordered) for candidate in event.candidates]
    tuned = tuned_rdp(ordered, base_rdp(curves),
                      trials_of(event.distribution, event.parameters))
    out = np.empty_like(orders_arr)
    out[rank] = tuned[first]
    return out


def max_steps(step: GaussianStep, epsilon: float, delta: float,
              conversion: Conversion = "optimal",
              orders: Sequence[float] | np.ndarray = DEFAULT_ORDERS) -> int:
    """Largest T such that T releases of ``step`` (its ``count`` ignored) are (eps, delta)-DP
    by RDP accounting with the given conversion; 0 if not even one release is.

    ``"classic"``: ``T = max_alpha floor((eps - log(1/delta)/(alpha-1)) / rdp(alpha))``.
    ``"optimal"``: ``T = max_alpha floor(r*(alpha) / rdp(alpha))`` with ``r*`` from Asoodeh et al.'s
    Theorem 3 (:func:`fedsim.privacy.rdp_conversion.optimal_rdp_budget`), then confirmed and
    corrected by the certified ``delta(eps) <= delta`` test of
    :func:`fedsim.privacy.rdp_conversion.delta_optimal`.
    """
    _check_conversion(conversion)
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
    # the closed forms are exact up to rounding; the certified test decides, by a search
    # that costs O(1) conversions when the guess is right and O(log T) when it is not
    low, high = 0, guess  # allowed(0) holds: nothing released
    if allowed(guess):
        low, span = guess, 1
        while allowed(low + span):
            low, span = low + span, 2 * span
        high = low + span
    while high - low > 1:
        middle = (low + high) // 2
        low, high = (middle, high) if allowed(middle) else (low, middle)
    return low


# -- the accountant ----------------------------------------------------------------------
class RDPAccountant(Accountant):
    """Renyi-DP accountant (a guarantee) with the optimal RDP -> (eps, delta) conversion.

    Neighbouring relation: add/remove for ``poisson`` steps, replace-one for ``fixed`` steps
    (one relation per accountant, see :class:`fedsim.privacy.accountant.Accountant`).
    ``epsilon``/``delta`` use the optimal conversion of Asoodeh et al. 2021;
    ``epsilon_classic``/``delta_classic`` the classic one (Mironov 2017) for comparison.

    Settings: ``orders``, the Renyi orders (> 1) the curve is evaluated at
    (default :data:`DEFAULT_ORDERS`, 1.01 ... 1024). ``selections``: tuned selections
    (:class:`~fedsim.privacy.events.TunedSelection`) composed with the steps by adding their
    curves (:func:`selection_rdp`); the only accountant that holds them.
    """

    name = "rdp"
    holds_selections = True

    def __init__(self, steps: Iterable[GaussianStep] = (), *,
                 orders: Sequence[float] | None = None,
                 selections: Iterable[TunedSelection] = ()) -> None:
        self._orders = _check_orders(DEFAULT_ORDERS if orders is None else orders)
        self._orders.setflags(write=False)
        self._composed: np.ndarray | None = None
        self._selections: tuple[TunedSelection, ...] = ()
        self._selection_curve: np.ndarray | None = None  # their summed RDP at the orders
        super().__init__(steps)
        self.compose_selections(selections)

    @property
    def orders(self) -> np.ndarray:
        return self._orders

    @property
    def selections(self) -> tuple[TunedSelection, ...]:
        return self._selections

    def _schemes(self) -> set[Sampling]:
        held = {sel.sampling for sel in self._selections if sel.sampling is not None}
        return held | ({self.sampling} if self.sampling is not None else set())

    def check(self, steps: Iterable[GaussianStep]) -> None:
        steps = tuple(steps)
        super().check(steps)
        if len(self._schemes() | {s.sampling for s in steps}) > 1:
            raise UnsupportedEventError(
                "one accountant analyses one neighbouring relation; a tuned selection and "
                "the steps use different sampling schemes")

    def compose_selections(self, selections: Iterable[TunedSelection]) -> None:
        """Compose tuned selections with the history: their RDP curves
        (:func:`selection_rdp`) add to the steps' (Mironov 2017, Prop. 1). Checks first and
        changes nothing when it raises."""
        new = tuple(selections)
        if not new:
            return
        for selection in new:
            if not isinstance(selection, TunedSelection):
                raise ConfigError(f"expected TunedSelection, got {type(selection).__name__}")
        schemes = self._schemes() | {sel.sampling for sel in new if sel.sampling is not None}
        if len(schemes) > 1:
            raise UnsupportedEventError(
                "one accountant analyses one neighbouring relation; got both poisson "
                "(add/remove) and fixed (replace-one) releases")
        curve = sum((selection_rdp(sel, self._orders) for sel in new),
                    np.zeros_like(self._orders) if self._selection_curve is None
                    else self._selection_curve)
        curve.setflags(write=False)
        self._selections += new
        self._selection_curve = curve
        self._composed = None

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
            return history_rdp(self.steps, orders) + sum(
                (selection_rdp(sel, orders) for sel in self._selections),
                np.zeros(np.size(orders)))
        if self._composed is None:
            composed = history_rdp(self.steps, self._orders)
            if self._selection_curve is not None:
                composed = composed + self._selection_curve
            composed.setflags(write=False)
            self._composed = composed
        return self._composed

    def _convert(self, convert: Any, value: float) -> tuple[float, float | None]:
        """(answer, order) of a conversion from :mod:`rdp_conversion`; (0, None) if empty."""
        if not self.steps and not self._selections:
            return 0.0, None
        return convert(self._orders, self.rdp(), value)

    def epsilon(self, delta: float) -> float:
        """eps(delta) by the optimal conversion (Asoodeh et al.), minimised over orders."""
        return self.epsilon_optimal(delta)

    def epsilon_optimal(self, delta: float) -> float:
        return self._convert(rdp_conversion.epsilon_optimal, rdp_conversion.check_delta(delta))[0]

    def epsilon_classic(self, delta: float) -> float:
        """eps = min_a rdp(a) + log(1/delta)/(a - 1) (Mironov 2017, Prop. 3)."""
        return self._convert(rdp_conversion.epsilon_classic, rdp_conversion.check_delta(delta))[0]

    def best_order(self, delta: float, conversion: Conversion = "optimal") -> float | None:
        """The Renyi order that gives eps(delta); None for an empty history."""
        _check_conversion(conversion)
        convert = (rdp_conversion.epsilon_optimal if conversion == "optimal"
                   else rdp_conversion.epsilon_classic)
        return self._convert(convert, rdp_conversion.check_delta(delta))[1]

    def delta(self, epsilon: float) -> float:
        """delta(eps) by the optimal conversion (Asoodeh et al.), minimised over orders."""
        return self._convert(rdp_conversion.delta_optimal, rdp_conversion.check_epsilon(epsilon))[0]

    def delta_curve(self, epsilons: np.ndarray) -> np.ndarray:
        """delta(eps) of the optimal conversion at many eps at once
        (:func:`~fedsim.privacy.rdp_conversion.optimal_delta_curve`: each value a valid
        bound, a minimum over some of the orders)."""
        eps = np.asarray(epsilons, dtype=float)
        if not self.steps and not self._selections:
            return np.asarray(np.maximum(0.0, -np.expm1(eps)), dtype=float)
        return np.asarray(rdp_conversion.optimal_delta_curve(self._orders, self.rdp(), eps),
                          dtype=float)

    def delta_classic(self, epsilon: float) -> float:
        """delta = min_a exp((a - 1)(rdp(a) - eps)) (Mironov 2017)."""
        return self._convert(rdp_conversion.delta_classic, rdp_conversion.check_epsilon(epsilon))[0]

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
        if not self.steps and not self._selections:
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


    def tradeoff_complement(self, alpha: np.ndarray) -> np.ndarray:
        """Upper bounds on ``1 - f`` that keep their digits at small alpha (for groups of
        records, :func:`fedsim.privacy.fdp.group_complement`): the smaller of ``1 -``
        :meth:`tradeoff` (plus :data:`_ROUNDING`, its rounding near 1) and the direct
        RDP bound (:func:`~fedsim.privacy.rdp_conversion.tradeoff_complement`; like
        :meth:`tradeoff`, it uses that the curve bounds both orderings of a pair)."""
        alpha_arr = np.asarray(alpha, dtype=float)
        envelope = 1.0 - self.tradeoff(alpha_arr) + _ROUNDING  # (checks alpha)
        if not self.steps and not self._selections:
            return alpha_arr.copy()  # no release: 1 - f is exactly alpha
        direct = rdp_conversion.tradeoff_complement(self._orders, self.rdp(), alpha_arr)
        return np.minimum(np.minimum(envelope, direct), 1.0)


_ROUNDING = 1e-15
"""A bound on the rounding of a trade-off value near 1 (a few units in the last place of 1.0):
``1 - beta`` plus this is an upper bound on ``1 - f`` wherever beta is one."""

# -- validation ------------------------------------------------------------------------------
def _check_orders(orders: Sequence[float] | np.ndarray) -> np.ndarray:
    try:
        arr = np.asarray(orders, dtype=float).ravel()
    except (TypeError, ValueError) as exc:
        raise ConfigError(f"RDP orders must be numbers: {exc}") from exc
    if arr.size == 0 or np.any(~np.isfinite(arr)) or np.any(arr <= 1.0):
        raise ConfigError("RDP orders must be a non-empty list of finite numbers > 1")
    return arr


def _check_conversion(conversion: str) -> None:
    if conversion not in ("optimal", "classic"):
        raise ConfigError(f"conversion must be 'optimal' or 'classic', got {conversion!r}")


def _check_q_sigma(q: float, sigma: float) -> None:
    if not (math.isfinite(q) and 0.0 < q <= 1.0):
        raise ConfigError(f"q must be in (0, 1], got {q!r}")
    if not (math.isfinite(sigma) and sigma > 0.0):
        raise ConfigError(f"sigma must be a finite number > 0, got {sigma!r}")
