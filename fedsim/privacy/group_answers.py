"""Privacy for groups of records: a history's curve for a group, and its eps and delta.

A mechanism that is f-DP for single records is ``1 - (1 - f)^{o g}``-DP for groups of g
records (Dong, Roth & Su, "Gaussian Differential Privacy", JRSS-B 2022, Thm 2.14; the
neighbouring relation is the history's: add/remove for Poisson steps, replace-one for
fixed-size ones, groups differing in g records under it). The group's answers reach type I
errors far below 1e-15, where a curve's ``1 - f`` computed from f near 1 keeps no digits: the
PLD's ``1 - f(0)`` is its truncated tail (about 1e-15) and RDP's own curve is floored at 1e-12,
and a group of 8 amplified either past delta = 1e-5 (eps inf for q = 0.01, sigma = 1, 1,000
steps). So each guarantee's group curve is kept as upper bounds on ``1 - f_g``
(:func:`fedsim.privacy.fdp.group_complement`), the RDP one from a bound on ``1 - f`` that is
exact at small alpha (:meth:`fedsim.privacy.rdp.RDPAccountant.tradeoff_complement`), and an
answer is the smallest of the guarantees' curves' and of their pointwise best (every one a valid
upper bound on ``1 - f_g`` at each grid point, so their minimum is one too).

These generic routes hold for any mechanism and are far from tight for subsampled ones (q =
0.01, sigma = 1, 1,000 steps, a group of 8: eps 31.6 at delta 1e-5 against the exact 20.9). For
the ``pld`` accountant's Poisson histories (add/remove) the answers therefore also ask the tight
mixture-of-Gaussians bound (:mod:`fedsim.privacy.group_mixture`, Ganesh 2024), named
``mixture``, and take the least of all; fixed-size histories (replace-one) keep the generic
bounds only.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np

from fedsim.errors import AccountantOutOfRange, PrivacyError
from fedsim.privacy import calibration, fdp, gdp
from fedsim.privacy.accountant import GUARANTEES, Accountant, make_accountant
from fedsim.privacy.events import GaussianStep, Sampling
from fedsim.privacy.group_mixture import MixtureBound, mixture_bound

__all__ = ["MIXTURE", "group_alphas", "group_calibrate_sigma", "group_complements", "group_delta",
           "group_epsilon", "group_epsilon_named", "group_max_steps", "group_measure",
           "group_mixture"]

MIXTURE = "mixture"
"""The tight mixture-of-Gaussians bound's name in ``bound``."""


def group_alphas() -> np.ndarray:
    """The alpha grid of a group's curve: (1 - f)^{o g} is tangent to eps's line at alpha
    ~ e^-eps delta, far below 1e-9 for a group eps of 20 or more, so the grid reaches the
    smallest doubles' scale (a floor at 1e-15 made every group eps above about 20 infinite)."""
    return np.unique(np.concatenate([fdp.default_alphas(20001), np.logspace(-300.0, -9.0, 6000)]))


def group_complements(accountant: Accountant, group: int, alphas: np.ndarray,
                      betas: np.ndarray | None, *, vacuous: Callable[[np.ndarray], bool],
                      compare_kinds: int) -> dict[str, np.ndarray]:
    """Upper bounds on ``1 - f_g`` at ``alphas`` for groups of ``group`` records, by curve:
    the accountant's own group curve ``betas`` (None: it cannot represent the history), and,
    for ``rdp`` or for histories of at most ``compare_kinds`` kinds or where the accountant's
    own answer is ``vacuous``, RDP's computed on ``1 - f`` and (for ``pld``) the pointwise
    best of the two, named ``pld+rdp`` (RDP costs a quadrature a kind of step)."""
    curves: dict[str, np.ndarray] = {}
    own = None if betas is None else 1.0 - np.asarray(betas, dtype=float)
    if own is not None:
        curves[accountant.name] = own
    if accountant.name not in GUARANTEES:
        return curves
    if accountant.name == "rdp":
        rdp = accountant
    elif own is None or accountant.kinds <= compare_kinds or vacuous(own):
        rdp = make_accountant("rdp", accountant.steps)
    else:
        return curves
    from fedsim.privacy.rdp import RDPAccountant

    assert isinstance(rdp, RDPAccountant)
    routed = fdp.group_complement(alphas, rdp.tradeoff_complement(alphas), group)
    if own is None:
        curves["rdp"] = routed
    elif accountant.name == "rdp":
        curves["rdp"] = np.minimum(own, routed)
    else:
        curves["rdp"] = routed
        curves[f"{accountant.name}+rdp"] = np.minimum(own, routed)
    return curves


def group_mixture(accountant: Accountant, group: int) -> MixtureBound | None:
    """The tight mixture bound of ``accountant``'s history for groups of ``group`` records
    where the answers ask it: the ``pld`` accountant's Poisson histories (add/remove; the
    ``rdp`` accountant answers RDP's bounds, fixed-size histories keep the generic ones)."""
    if accountant.name != "pld" or accountant.selections or not accountant.steps:
        return None
    return mixture_bound(accountant.steps, group)


def _smallest(values: dict[str, float]) -> tuple[float, str]:
    """(the smallest of ``values``, its name): one guarantee's before a combination's at a
    tie, the mixture's before the generic curves' at a finite tie (after them where none is
    finite: no bound answers, and the mixture's is the one asked last)."""
    def rank(name: str) -> tuple[float, bool, bool]:
        finite = math.isfinite(values[name])
        return values[name], "+" in name, (name != MIXTURE) == finite
    best = min(values, key=rank)
    return values[best], best


def group_epsilon(curves: dict[str, np.ndarray], alphas: np.ndarray, delta: float,
                  mixture: MixtureBound | None = None) -> tuple[float, str]:
    """(eps at ``delta``, the bound that gave it): the smallest of ``curves``' (Prop. 2.12)
    and the ``mixture``'s, where given."""
    values = {name: fdp.epsilon_from_complement(alphas, curve, delta)
              for name, curve in curves.items()}
    if mixture is not None:
        values[MIXTURE] = mixture.epsilon(delta)
    return _smallest(values)


def group_delta(curves: dict[str, np.ndarray], alphas: np.ndarray, epsilon: float,
                mixture: MixtureBound | None = None) -> tuple[float, str]:
    """(delta at ``epsilon``, the bound that gave it): the smallest of ``curves``' and the
    ``mixture``'s, where given."""
    values = {name: fdp.delta_from_complement(alphas, curve, epsilon)
              for name, curve in curves.items()}
    if mixture is not None:
        values[MIXTURE] = mixture.delta(epsilon)
    return _smallest(values)


def group_epsilon_named(accountant: Accountant, group: int, delta: float,
                        compare_kinds: int) -> tuple[float, str]:
    """(eps at ``delta`` of ``accountant``'s history for groups of ``group`` records, the
    bound that gave it): the least of every guarantee's group curve and the mixture's (for
    ``gdp-clt``: G_{g mu}'s, Cor. 2.15; an approximation, as its own answers are)."""
    if isinstance(accountant, gdp.GDPCLTAccountant):
        return gdp.gdp_epsilon(delta, accountant.mu * group), accountant.name
    alphas = group_alphas()
    try:
        betas: np.ndarray | None = fdp.group_tradeoff(alphas, accountant.tradeoff(alphas), group)
    except AccountantOutOfRange:
        betas = None
    curves = group_complements(
        accountant, group, alphas, betas, compare_kinds=compare_kinds,
        vacuous=lambda own: math.isinf(fdp.epsilon_from_complement(alphas, own, delta)))
    return group_epsilon(curves, alphas, delta, group_mixture(accountant, group))


def group_measure(group: int, compare_kinds: int) -> Callable[[Accountant, float], float]:
    """eps at delta of a history for groups of ``group`` records (:func:`group_epsilon_named`),
    as a calibration's measure (:func:`fedsim.privacy.calibration.calibrate_sigma`,
    ``max_steps``): a target eps for a group is then met by the group, not by one record."""
    def measure(accountant: Accountant, delta: float) -> float:
        return group_epsilon_named(accountant, group, delta, compare_kinds)[0]
    return measure


def _mixture_measure(group: int) -> Callable[[Accountant, float], float]:
    """The mixture bound's eps alone (``inf`` where it does not apply), as a measure."""
    def measure(accountant: Accountant, delta: float) -> float:
        mixture = group_mixture(accountant, group)
        return math.inf if mixture is None else mixture.epsilon(delta)
    return measure


def group_calibrate_sigma(name: str, sampling: Sampling, q: float, steps: int, epsilon: float,
                          delta: float, group: int, *, compare_kinds: int,
                          rel_tol: float) -> tuple[float, str | None]:
    """(the smallest sigma, to ``rel_tol``, whose ``steps`` meet ``epsilon`` for groups of
    ``group`` records by the least of all bounds (:func:`group_measure`), the bound that met
    it, None where not asked). Where the mixture applies it is searched first (it is the
    tightest but for discretisation, and a tenth of the generic bounds' cost); its answer
    stands when no bound meets the target just below it, else the search is run again on the
    least of all."""
    full = group_measure(group, compare_kinds)
    if name != "pld" or sampling != "poisson":
        return calibration.calibrate_sigma(name, sampling, q, steps, epsilon, delta,
                                           measure=full, rel_tol=rel_tol), None
    mixture = _mixture_measure(group)

    def excess(sigma: float) -> float:
        try:
            found = calibration.epsilon_for(name, sampling, q, sigma, steps, delta, mixture)
        except PrivacyError:  # a noise level too small to account cannot meet a target
            return math.inf
        return math.log(found) - math.log(epsilon) if found > 0 else -math.inf

    sigma = calibration.calibrate_sigma_smooth(excess, rel_tol=rel_tol)
    below = sigma / (1.0 + rel_tol)
    if below >= calibration.SIGMA_RANGE[0] and full(
            make_accountant(name, [GaussianStep(sampling, q, below, steps)]), delta) > epsilon:
        return sigma, MIXTURE
    sigma = calibration.calibrate_sigma(name, sampling, q, steps, epsilon, delta, measure=full,
                                        rel_tol=rel_tol)
    found = make_accountant(name, [GaussianStep(sampling, q, sigma, steps)])
    return sigma, group_epsilon_named(found, group, delta, compare_kinds)[1]


def group_max_steps(name: str, sampling: Sampling, q: float, sigma: float, epsilon: float,
                    delta: float, group: int, *, compare_kinds: int) -> tuple[int, str | None]:
    """(the most steps whose eps for groups of ``group`` records is at most ``epsilon`` by the
    least of all bounds, the bound that allows them, None where not asked), the mixture's
    searched first as in :func:`group_calibrate_sigma`."""
    full = group_measure(group, compare_kinds)
    if name != "pld" or sampling != "poisson":
        return calibration.max_steps(name, sampling, q, sigma, epsilon, delta,
                                     measure=full), None
    most = calibration.max_steps(name, sampling, q, sigma, epsilon, delta,
                                 measure=_mixture_measure(group))

    def fits(count: int) -> bool:
        return calibration.epsilon_for(name, sampling, q, sigma, count, delta, full) <= epsilon

    if most >= calibration.MAX_STEPS_LIMIT or not fits(most + 1):
        return most, MIXTURE
    most = calibration.largest_fitting(fits, start=most + 1)
    found = make_accountant(name, [GaussianStep(sampling, q, sigma, max(most, 1))])
    return most, group_epsilon_named(found, group, delta, compare_kinds)[1]
