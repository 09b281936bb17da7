"""f-DP views of any accountant: trade-off curves, a GDP fit, group privacy, conversions.

A trade-off curve is represented by its values ``beta_i`` on an increasing grid ``alpha_i``
in [0, 1]. For a guarantee the values are lower bounds on the true curve f at the grid points;
between grid points only monotonicity is used (``f(alpha) >= beta_{i+1}`` for
``alpha <= alpha_{i+1}``), so every derived quantity below stays a valid bound.

Results used:

* (eps, delta) from a curve: ``delta(eps) = sup_alpha 1 - f(alpha) - e^eps alpha``
  (Dong, Roth & Su, "Gaussian Differential Privacy", JRSS-B 2022, Prop. 2.12).
* Group privacy for a numerical curve: if a mechanism is f-DP for single records it is
  ``1 - (1 - f)^{o g}``-DP for groups of g records (same paper, Thm 2.14; ``o g`` is g-fold
  functional composition), computed on ``h = 1 - f`` (:func:`group_complement`: at small
  alpha a curve's ``1 - f`` is below double precision's resolution of f near 1). For ``f = G_mu`` this is ``G_{g mu}``. The neighbouring relation is
  the accountant's (add/remove for Poisson, replace-one for fixed-size); groups differ in g
  records under that relation.
* The curve of one (eps, delta) guarantee: ``f_{eps,delta}(alpha) = max(0, 1 - delta - e^eps
  alpha, e^-eps (1 - delta - alpha))`` (same paper, Prop. 2.5); under any neighbouring
  relation, the one the (eps, delta) pair was stated for.
* GDP fit (:func:`fit_gdp_mu_to_profile`): mu-GDP holds iff (eps, delta_mu(eps))-DP holds for
  every eps >= 0, ``delta_mu(eps) = Phi(-eps/mu + mu/2) - e^eps Phi(-eps/mu - mu/2)`` (same
  paper, Cor. 2.13), and ``G_mu <= f`` everywhere iff ``delta_mu(eps) >= delta_f(eps)`` for
  every eps (Prop. 2.12: each curve is the envelope of its profile's lines). The fit is the
  smallest mu whose profile dominates the accountant's privacy profile (upper bounds
  ``delta_i`` on an eps grid from 0 to the eps at a floor delta, by default fedsim's smallest,
  1e-12): ``delta_mu(eps_{i+1}) >= delta_i`` for every i, which covers every eps between grid
  points because both profiles decrease in eps. So every (eps, delta) pair of mu-GDP with
  ``floor <= delta <= 1 - 1e-9`` is a valid guarantee of the accountant (eps(mu) at delta >=
  the accountant's eps at delta); below the floor nothing is claimed (the profile is capped at
  ``1 - 1e-9``, :data:`DELTA_CEILING`: a PLD's delta of exactly 1.0 at tiny eps is met by no
  finite mu). The neighbouring relation is
  the accountant's. (Before session 61 the fit asked ``G_mu <= beta_i`` at the points of an
  alpha grid from 1e-9 only, which misses the far tail where the curves of subsampled
  mechanisms at eps >~ 10 cross G_mu: no guarantee; a stranger's reviewer found it.)
  ``dp_accounting`` offers a different, single-point estimate: the Gaussian mechanism that is
  exactly (eps, delta)-DP at one eps (:func:`gdp_mu_at_point`, via
  ``dp_accounting.get_sigma_gaussian``); it is never larger than the fit at the same curve,
  and it can be much smaller when the curve is not Gaussian.
"""

from __future__ import annotations

import math

import numpy as np
from dp_accounting import gaussian_mechanism

from fedsim.errors import AccountantOutOfRange, ConfigError
from fedsim.privacy.accountant import Accountant
from fedsim.privacy.gdp import MAX_MU, gdp_log_delta


def default_alphas(points: int = 2001) -> np.ndarray:
    """A grid on [0, 1], dense near 0 where DP curves bend (log-spaced from 1e-9)."""
    return np.unique(np.concatenate([[0.0], np.logspace(-9, -2, points // 4),
                                     np.linspace(0.0, 1.0, points - points // 4)]))


def tradeoff_curve(accountant: Accountant,
                   alphas: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
    """(alpha, beta) of an accountant's trade-off curve (a lower bound for guarantees)."""
    grid = default_alphas() if alphas is None else np.asarray(alphas, dtype=float)
    if grid.ndim != 1 or grid.size < 2 or np.any(np.diff(grid) <= 0) or grid[0] < 0 or grid[-1] > 1:
        raise ConfigError("alphas must be an increasing grid in [0, 1] with at least 2 points")
    return grid, np.asarray(accountant.tradeoff(grid), dtype=float)


def eps_delta_tradeoff(alphas: np.ndarray, epsilon: float, delta: float) -> np.ndarray:
    """The trade-off curve of an (eps, delta)-DP guarantee on the grid ``alphas``:
    ``max(0, 1 - delta - e^eps alpha, e^-eps (1 - delta - alpha))`` (Dong, Roth & Su 2022,
    Prop. 2.5; the neighbouring relation is the guarantee's own)."""
    alphas = np.asarray(alphas, dtype=float)
    return np.maximum.reduce(
        [
            np.zeros_like(alphas),
            1.0 - delta - math.exp(epsilon) * alphas,
            math.exp(-epsilon) * (1.0 - delta - alphas),
        ]
    )


# eps grid points of a fitted privacy profile (uniform from 0 to the eps at the floor delta)
PROFILE_POINTS = 2001
# relative slack on the dominance check (log_ndtr's rounding, far below it), and the
# bisection's relative tolerance on mu (the answer is the feasible end, rounded up)
_DOMINANCE_SLACK = 1e-12
# The largest delta a fit answers for: an accountant's delta within rounding of 1 (a PLD's
# pessimistic discretisation gives exactly 1.0 at small eps where a Gaussian's is 1 - 1e-10)
# is met by no finite mu, so the profile is capped here (see fit_gdp_mu_to_profile).
DELTA_CEILING = 1.0 - 1e-9
_MU_TOLERANCE = 1e-9


def fit_gdp_mu_to_profile(epsilons: np.ndarray, deltas: np.ndarray,
                          delta_ceiling: float = DELTA_CEILING) -> float:
    """Smallest mu (to relative 1e-9, rounded up) whose mu-GDP privacy profile dominates a
    privacy profile given by upper bounds ``deltas`` at an increasing grid ``epsilons`` from 0,
    capped at ``delta_ceiling`` (``c_i = min(delta_i, ceiling)``):
    ``delta_mu(eps_{i+1}) >= c_i`` for every i. Both profiles decrease in eps, so then
    ``delta_mu(eps) >= delta_mu(eps_{i+1}) >= c_i >= min(delta(eps), ceiling)`` on every
    ``[eps_i, eps_{i+1}]`` (Dong, Roth & Su 2022, Cor. 2.13 for ``delta_mu``; the neighbouring
    relation is the profile's). Hence for every delta with ``delta(eps_last) <= delta <=
    ceiling``, mu-GDP's eps at delta is at least the profile's: its eps* has
    ``delta_mu(eps*) = delta``, and either eps* > eps_last (the profile's eps at delta is at
    most eps_last) or ``delta(eps*) <= delta_mu(eps*)`` (where ``delta(eps*) > ceiling`` then
    ``delta_mu(eps*) >= ceiling >= delta`` forces equality). ``delta_mu`` increases with mu at
    every eps, so the feasible mu form an interval, found by bisection. Raises
    :class:`ConfigError` where no mu up to ``MAX_MU`` dominates."""
    eps = np.asarray(epsilons, dtype=float)
    deltas = np.minimum(np.asarray(deltas, dtype=float), delta_ceiling)
    if eps.ndim != 1 or eps.size < 2 or deltas.shape != eps.shape or np.any(np.diff(eps) <= 0):
        raise ConfigError("a privacy profile needs an increasing eps grid of >= 2 points")
    positive = deltas[:-1] > 0
    need = np.log(deltas[:-1][positive]) + _DOMINANCE_SLACK
    at = eps[1:][positive]
    if need.size == 0:
        return 0.0

    def dominates(mu: float) -> bool:
        return bool(np.all(gdp_log_delta(at, mu) >= need))

    high = 1.0
    while not dominates(high):
        high *= 2.0
        if high > MAX_MU:
            raise ConfigError(f"no mu up to {MAX_MU:g} dominates the privacy profile")
    low = high / 2.0 if high > 1.0 else 0.0
    if high == 1.0 and low == 0.0 and dominates(0.0):
        return 0.0
    while high - low > _MU_TOLERANCE * high:
        middle = 0.5 * (low + high)
        if dominates(middle):
            high = middle
        else:
            low = middle
    return float(high)


def _profile_grid(eps_max: float, points: int) -> np.ndarray:
    if not math.isfinite(eps_max):
        raise ConfigError("the privacy profile does not reach the floor delta at any finite eps")
    return np.linspace(0.0, max(eps_max, 1e-9), max(points, 2))


def fit_gdp_mu_accountant(accountant: Accountant, delta_floor: float,
                          points: int = PROFILE_POINTS) -> float:
    """:func:`fit_gdp_mu_to_profile` of an accountant's own privacy profile
    (:meth:`~fedsim.privacy.accountant.Accountant.delta_curve`, upper bounds for guarantees)
    on a grid from eps 0 to its eps at ``delta_floor``: mu-GDP's (eps, delta) pairs are then
    guarantees of the accountant for every delta in ``[delta_floor, DELTA_CEILING]`` (beyond
    that grid the accountant's delta is below the floor), under the accountant's neighbouring
    relation. An accountant that cannot answer there (:class:`AccountantOutOfRange`) has no
    fit: a :class:`ConfigError`, as every other "no fit" (its callers' one refusal)."""
    try:
        epsilons = _profile_grid(accountant.epsilon(delta_floor), points)
        deltas = accountant.delta_curve(epsilons)
    except AccountantOutOfRange as exc:
        raise ConfigError(f"no GDP fit: {exc}") from None
    return fit_gdp_mu_to_profile(epsilons, deltas)


def fit_gdp_mu_complement(alphas: np.ndarray, complements: np.ndarray, delta_floor: float,
                          points: int = PROFILE_POINTS) -> float:
    """:func:`fit_gdp_mu_to_profile` of the privacy profile of a curve given by upper bounds
    on ``1 - f`` at grid points (:func:`delta_from_complement`, Prop. 2.12), from eps 0 to its
    eps at ``delta_floor`` (for groups of records: their curve, their relation)."""
    epsilons = _profile_grid(epsilon_from_complement(alphas, complements, delta_floor), points)
    deltas = [delta_from_complement(alphas, complements, float(e)) for e in epsilons]
    return fit_gdp_mu_to_profile(epsilons, np.asarray(deltas))


def gdp_mu_at_point(epsilon: float, delta: float) -> float:
    """mu of the Gaussian mechanism that is exactly (eps, delta)-DP (Balle & Wang 2018,
    through ``dp_accounting.gaussian_mechanism.get_sigma_gaussian``): ``1 / sigma``."""
    if epsilon < 0 or not 0 < delta < 1:
        raise ConfigError(f"need eps >= 0 and delta in (0, 1), got {epsilon!r}, {delta!r}")
    sigma = gaussian_mechanism.get_sigma_gaussian(epsilon, delta)
    return math.inf if sigma == 0 else 1.0 / sigma


def group_tradeoff(alphas: np.ndarray, betas: np.ndarray, group_size: int) -> np.ndarray:
    """Lower bound on the trade-off curve for groups of ``group_size`` records:
    ``1 - (1 - f)^{o g}`` (Dong-Roth-Su Thm 2.14), with f bounded between grid points by
    monotonicity (rounding the argument up to the next grid point): :func:`group_complement`
    of ``1 - betas``."""
    betas = np.asarray(betas, dtype=float)
    return np.clip(1.0 - group_complement(alphas, 1.0 - betas, group_size), 0.0, 1.0)


def group_complement(alphas: np.ndarray, complements: np.ndarray, group_size: int) -> np.ndarray:
    """Upper bound on ``1 - f_g`` at the grid points, for groups of ``group_size`` records,
    from upper bounds ``complements`` on ``h = 1 - f`` there: ``f_g = 1 - h^{o g}`` (Dong, Roth
    & Su, Thm 2.14), h bounded between grid points by monotonicity (h is nondecreasing: the
    argument rounded up to the next grid point; 1 past the last). Where ``h`` is tiny (small
    alpha) it keeps the digits that ``1 - f`` computed from f near 1 loses."""
    if isinstance(group_size, bool) or not isinstance(group_size, int) or group_size < 1:
        raise ConfigError(f"group size must be an integer >= 1, got {group_size!r}")
    alphas = np.asarray(alphas, dtype=float)
    padded = np.append(np.asarray(complements, dtype=float), 1.0)
    level = alphas.copy()  # h^{o 0} = identity
    for _ in range(group_size):
        index = np.searchsorted(alphas, np.clip(level, 0.0, 1.0), side="left")
        level = padded[np.minimum(index, alphas.size)]
    return np.clip(level, 0.0, 1.0)


def delta_from_tradeoff(alphas: np.ndarray, betas: np.ndarray, epsilon: float) -> float:
    """Upper bound on delta(eps) = sup_alpha 1 - f(alpha) - e^eps alpha for a curve given by
    lower bounds on a grid (Prop. 2.12; f >= beta_{i+1} on (alpha_i, alpha_{i+1}]):
    :func:`delta_from_complement` of ``1 - betas``."""
    return delta_from_complement(alphas, 1.0 - np.asarray(betas, dtype=float), epsilon)


def delta_from_complement(alphas: np.ndarray, complements: np.ndarray, epsilon: float) -> float:
    """Upper bound on delta(eps) = sup_alpha h(alpha) - e^eps alpha (Prop. 2.12) from upper
    bounds ``complements`` on ``h = 1 - f`` on the grid (``h <= h_{i+1}`` on
    ``(alpha_i, alpha_{i+1}]``)."""
    alphas = np.asarray(alphas, dtype=float)
    complements = np.asarray(complements, dtype=float)
    # e^eps alpha in log space, capped at e^700 (any such line is far below 0 already)
    with np.errstate(divide="ignore"):  # log(0) = -inf: the alpha = 0 line, exactly
        scaled = np.exp(np.minimum(epsilon + np.log(alphas[:-1]), 700.0))
    candidates = np.concatenate([[complements[0]], complements[1:] - scaled])
    return float(np.clip(np.max(candidates), 0.0, 1.0))


def epsilon_from_tradeoff(alphas: np.ndarray, betas: np.ndarray, delta: float,
                          tolerance: float = 1e-6) -> float:
    """Smallest eps (bisection to ``tolerance``, rounded up) with
    :func:`delta_from_tradeoff` <= delta; ``inf`` if even a huge eps does not reach it."""
    return epsilon_from_complement(alphas, 1.0 - np.asarray(betas, dtype=float), delta,
                                   tolerance)


def epsilon_from_complement(alphas: np.ndarray, complements: np.ndarray, delta: float,
                            tolerance: float = 1e-6) -> float:
    """Smallest eps (bisection to ``tolerance``, rounded up) with
    :func:`delta_from_complement` <= delta; ``inf`` if even a huge eps does not reach it."""
    if not 0 < delta < 1:
        raise ConfigError(f"delta must be in (0, 1), got {delta!r}")
    if delta_from_complement(alphas, complements, 0.0) <= delta:
        return 0.0
    high = 1.0
    while delta_from_complement(alphas, complements, high) > delta:
        high *= 2.0
        if high > 1e4:
            return math.inf
    low = 0.0
    while high - low > tolerance:
        middle = 0.5 * (low + high)
        if delta_from_complement(alphas, complements, middle) > delta:
            low = middle
        else:
            high = middle
    return high

