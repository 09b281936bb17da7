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
"""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np

from fedsim.errors import AccountantOutOfRange
from fedsim.privacy import fdp, gdp
from fedsim.privacy.accountant import GUARANTEES, Accountant, make_accountant

__all__ = ["group_alphas", "group_complements", "group_delta", "group_epsilon", "group_measure"]


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


def _smallest(curves: dict[str, np.ndarray],
              value: Callable[[np.ndarray], float]) -> tuple[float, str]:
    """(the smallest ``value`` of ``curves``, its curve): one guarantee's before a
    combination's at a tie."""
    values = {name: value(curve) for name, curve in curves.items()}
    best = min(values, key=lambda name: (values[name], "+" in name))
    return values[best], best


def group_epsilon(curves: dict[str, np.ndarray], alphas: np.ndarray,
                  delta: float) -> tuple[float, str]:
    """(eps at ``delta``, the curve that gave it): the smallest of ``curves``' (Prop. 2.12)."""
    return _smallest(curves, lambda curve: fdp.epsilon_from_complement(alphas, curve, delta))


def group_delta(curves: dict[str, np.ndarray], alphas: np.ndarray,
                epsilon: float) -> tuple[float, str]:
    """(delta at ``epsilon``, the curve that gave it): the smallest of ``curves``'."""
    return _smallest(curves, lambda curve: fdp.delta_from_complement(alphas, curve, epsilon))


def group_measure(group: int, compare_kinds: int) -> Callable[[Accountant, float], float]:
    """eps at delta of a history for groups of ``group`` records, as a calibration's measure
    (:func:`fedsim.privacy.calibration.calibrate_sigma`, ``max_steps``): a target eps for a
    group is then met by the group, not by one record. ``gdp-clt``: G_{g mu}'s (Cor. 2.15; an
    approximation, as its own answers are)."""
    alphas = group_alphas()

    def measure(accountant: Accountant, delta: float) -> float:
        if isinstance(accountant, gdp.GDPCLTAccountant):
            return gdp.gdp_epsilon(delta, accountant.mu * group)
        try:
            betas: np.ndarray | None = fdp.group_tradeoff(alphas, accountant.tradeoff(alphas),
                                                          group)
        except AccountantOutOfRange:
            betas = None
        curves = group_complements(
            accountant, group, alphas, betas, compare_kinds=compare_kinds,
            vacuous=lambda own: math.isinf(fdp.epsilon_from_complement(alphas, own, delta)))
        return group_epsilon(curves, alphas, delta)[0]
    return measure
