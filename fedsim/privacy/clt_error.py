"""A certified error for the GDP central limit theorem: the Berry-Esseen band around ``G_mu``.

The ``gdp-clt`` accountant reports ``mu`` from the CLT (:mod:`fedsim.privacy.gdp`), which is
exact only as T -> infinity. Dong, Roth & Su ("Gaussian Differential Privacy", JRSS-B 2022)
give a finite-T bound: their Berry-Esseen theorem for composition (Thm 3.5 of the arXiv
version, applied to NoisySGD in their Lemma 5.5 and Corollary 5.6) states that for symmetric
trade-off functions ``f_1..f_T`` with

    kl(f) = -int_0^1 log|f'(x)| dx,   kappa_2(f) = int_0^1 log^2|f'(x)| dx,
    kappa_3bar(f) = int_0^1 |log|f'(x)| + kl(f)|^3 dx,
    mu = 2 sum kl / sqrt(sum kappa_2 - sum kl^2),
    gamma = 0.56 sum kappa_3bar / (sum kappa_2 - sum kl^2)^{3/2},

the composition satisfies ``G_mu(alpha + gamma) - gamma <= f_1 (x) ... (x) f_T(alpha) <=
G_mu(alpha - gamma) + gamma`` (with ``G_mu = 1`` left of 0 and ``0`` right of 1). The moments
are those of the privacy loss ``L = log dQ/dP`` of a pair (P, Q) with ``T(P, Q) = f`` under P
(``x ~ U[0, 1]`` is the type I error of the likelihood-ratio test, ``|f'(x)|`` the ratio at its
boundary), so the theorem is the classical Berry-Esseen inequality for the sum of the losses
under P and under Q (constant 0.56 for non-identically distributed summands, Shevtsova 2010).

What fedsim certifies (:func:`clt_band`), for the ``mu`` it *reports*:

* the proof above, run separately under P and under Q, shows that every point of the composed
  trade-off curve is ``(1 - Phi(a(h)) +- gamma_P, Phi(b(h)) +- gamma_Q)`` for some threshold h,
  with ``a(h) = (h - m_P)/s_P`` and ``b(h) = (h - m_Q)/s_Q`` the standardised thresholds
  (m, s^2: the summed means and variances of L under P and under Q; randomised tests at an atom
  of L stay inside the same intervals because the bound also holds for left limits). Hence,
  for any ``mu``, the curve lies in the band of half-width

      gamma = max(gamma_P, gamma_Q + sup_h |Phi(a(h) - mu) - Phi(b(h))|)

  around ``G_mu``. For a symmetric pair and the Berry-Esseen ``mu`` above the supremum is 0
  and this is Dong-Roth-Su's gamma exactly; for the CLT ``mu`` (asymptotic) and for Poisson
  sampling's asymmetric pair the supremum adds the distance between the two Gaussians, found
  in closed form (``Phi(a - mu) - Phi(b)`` has at most two critical points, the roots of a
  quadratic).
* The band is symmetric about the diagonal and its edges are convex, so it also contains the
  inverse curve, the minimum of the two and its convex hull: the band of the remove pair
  bounds the whole guarantee.

Per-step pairs (see :mod:`fedsim.privacy.events`; ``mu_1 = 1/sigma``, ``l(z) = log(1 - q +
q e^{mu_1 z - mu_1^2/2})``, ``phi`` the standard normal density):

* ``poisson`` (add/remove neighbours): ``P = N(0, 1)``, ``Q = (1-q) N(0, 1) + q N(mu_1, 1)``,
  ``L = l(z)``; under P z has density ``phi``, under Q ``e^{l(z)} phi(z)``. The other direction
  is the inverse curve (covered by the band's symmetry).
* ``fixed`` (replace-one neighbours, noise ``2 C sigma``): the symmetric ``C_q(G_{1/sigma}) =
  min{f_q, f_q^{-1}}^**`` (Dong-Roth-Su Thm 4.2 and Thm 5.1), whose ``log|f'|`` is ``l(z)`` for
  ``z > mu_1/2`` (density ``phi``), 0 on the linear segment (mass ``(1-q)(Phi(mu_1/2) -
  Phi(-mu_1/2))``) and ``-l(z)`` for ``z > mu_1/2`` (density ``e^{l(z)} phi(z)``) - the
  integrals of Lemma 5.5. Under Q, L has the law of -L under P (symmetry).

The moments are computed by composite Simpson integration on a fine z-grid per kind of step
(vectorised, cached); ``tests/privacy/test_clt_error.py`` checks them against mpmath
quadrature and the band against the PLD accountant's curve.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass
from functools import lru_cache

import numpy as np
from scipy import integrate, special

from fedsim.errors import ConfigError
from fedsim.privacy.events import GaussianStep, Sampling
from fedsim.privacy.gdp import clt_mu

BERRY_ESSEEN_CONSTANT = 0.56
"""Shevtsova (2010) for independent, non-identically distributed summands; Dong-Roth-Su's."""
_GRID_POINTS = 4_001  # odd (Simpson); ~1e-11 relative error on the moments (see the tests)
_TAIL_Z = 14.0  # phi(14) ~ 1e-43: the integrands vanish beyond mean +- 14 standard deviations


@dataclass(frozen=True, slots=True)
class LossMoments:
    """Moments of one step's privacy loss ``L = log dQ/dP``: mean, variance and third absolute
    central moment under P and under Q."""

    mean_p: float
    var_p: float
    abs3_p: float
    mean_q: float
    var_q: float
    abs3_q: float


@dataclass(frozen=True, slots=True)
class CLTBand:
    """The composed trade-off curve lies in ``[G_mu(alpha + gamma) - gamma, G_mu(alpha - gamma)
    + gamma]`` (a certified statement; ``gamma >= 1`` says nothing)."""

    mu: float
    gamma: float
    gamma_p: float  # Berry-Esseen error of the loss's law under P
    gamma_q: float  # ... under Q
    mu_berry_esseen: float  # Dong-Roth-Su's mu: 2 sum kl / sqrt(sum kappa_2 - sum kl^2)

    def lower(self, alpha: np.ndarray | float) -> np.ndarray:
        """``G_mu(alpha + gamma) - gamma`` (``G_mu = 0`` right of 1)."""
        return _shifted_gdp(np.asarray(alpha, dtype=float) + self.gamma, self.mu) - self.gamma

    def upper(self, alpha: np.ndarray | float) -> np.ndarray:
        """``G_mu(alpha - gamma) + gamma`` (``G_mu = 1`` left of 0)."""
        return _shifted_gdp(np.asarray(alpha, dtype=float) - self.gamma, self.mu) + self.gamma


def _shifted_gdp(alpha: np.ndarray, mu: float) -> np.ndarray:
    """``G_mu`` extended by 1 left of 0 and 0 right of 1."""
    inside = np.clip(alpha, 0.0, 1.0)
    values = special.ndtr(-special.ndtri(inside) - mu)  # Phi(Phi^-1(1 - a) - mu)
    return np.asarray(np.where(alpha <= 0.0, 1.0, np.where(alpha >= 1.0, 0.0, values)),
                      dtype=float)


def _loss(z: np.ndarray, q: float, mu_1: float) -> np.ndarray:
    """``l(z) = log(1 - q + q e^{mu_1 z - mu_1^2/2})`` without overflow (q = 1: the Gaussian)."""
    shift = math.log(q) + mu_1 * z - 0.5 * mu_1 * mu_1
    if q == 1.0:
        return np.asarray(shift, dtype=float)
    return np.asarray(np.logaddexp(math.log1p(-q), shift), dtype=float)


def _mixture_density(loss: np.ndarray, z: np.ndarray) -> np.ndarray:
    """``e^{l(z)} phi(z)``, the density of the other distribution of the pair, formed in log
    space: ``e^{l(z)}`` alone overflows once ``mu_1 z`` passes ~709 (sigma below ~0.04), where
    the product is still an ordinary density."""
    return np.asarray(np.exp(loss - 0.5 * z * z - 0.5 * math.log(2.0 * math.pi)), dtype=float)


def _simpson(values: np.ndarray, z: np.ndarray) -> float:
    return float(integrate.simpson(values, x=z))


def _central(expect: dict[str, float]) -> tuple[float, float]:
    return expect["m"], max(0.0, expect["m2"] - expect["m"] ** 2)


def _abs3(values: np.ndarray, weights: np.ndarray, z: np.ndarray, mean: float) -> float:
    return _simpson(np.abs(values - mean) ** 3 * weights, z)


@lru_cache(maxsize=4096)
def loss_moments(sampling: Sampling, q: float, sigma: float) -> LossMoments:
    """Moments of one step's privacy loss (see the module docstring for the pairs)."""
    if not (0.0 < q <= 1.0 and math.isfinite(sigma) and sigma > 0):
        raise ConfigError(f"need q in (0, 1] and sigma > 0, got q={q!r}, sigma={sigma!r}")
    mu_1 = 1.0 / sigma
    if sampling == "poisson":
        z = np.linspace(-_TAIL_Z, mu_1 + _TAIL_Z, _GRID_POINTS)
        loss = _loss(z, q, mu_1)
        phi = np.exp(-0.5 * z * z) / math.sqrt(2.0 * math.pi)
        mixture = _mixture_density(loss, z)
        mean_p = _simpson(loss * phi, z)
        var_p = max(0.0, _simpson((loss - mean_p) ** 2 * phi, z))
        mean_q = _simpson(loss * mixture, z)
        var_q = max(0.0, _simpson((loss - mean_q) ** 2 * mixture, z))
        return LossMoments(mean_p, var_p, _abs3(loss, phi, z, mean_p),
                           mean_q, var_q, _abs3(loss, mixture, z, mean_q))
    if sampling != "fixed":
        raise ConfigError(f"unknown sampling {sampling!r}")
    # C_q(G_{1/sigma}): l(z) (density phi) and -l(z) (density e^l phi) for z > mu_1/2, plus an
    # atom at 0 of mass (1-q)(Phi(mu_1/2) - Phi(-mu_1/2)) (the linear segment).
    z = np.linspace(0.5 * mu_1, mu_1 + _TAIL_Z, _GRID_POINTS)
    loss = _loss(z, q, mu_1)
    phi = np.exp(-0.5 * z * z) / math.sqrt(2.0 * math.pi)
    mixture = _mixture_density(loss, z)
    atom = (1.0 - q) * (special.ndtr(0.5 * mu_1) - special.ndtr(-0.5 * mu_1))

    def expect(power: int, centre: float = 0.0, absolute: bool = False) -> float:
        def g(v: np.ndarray) -> np.ndarray:
            d = v - centre
            return np.abs(d) ** power if absolute else d ** power
        at_zero = float(abs(centre) ** power if absolute else (-centre) ** power)
        return _simpson(g(loss) * phi + g(-loss) * mixture, z) + atom * at_zero

    mean = float(expect(1))
    var = max(0.0, float(expect(2, mean)))
    abs3 = float(expect(3, mean, absolute=True))
    return LossMoments(mean, var, abs3, -mean, var, abs3)


def _sup_gap(mu: float, m_p: float, s_p: float, m_q: float, s_q: float) -> float:
    """``sup_h |Phi((h - m_p)/s_p - mu) - Phi((h - m_q)/s_q)|``: the difference vanishes at
    +-infinity, and its critical points solve ``phi(a - mu)/s_p = phi(b)/s_q``, a quadratic in h
    (linear when s_p = s_q)."""
    # a - mu = A h + B, b = C h + D
    a_, b_ = 1.0 / s_p, -m_p / s_p - mu
    c_, d_ = 1.0 / s_q, -m_q / s_q
    # -(A h + B)^2/2 - log s_p = -(C h + D)^2/2 - log s_q
    # (C^2 - A^2) h^2 + 2 (C D - A B) h + (D^2 - B^2) + 2 log(s_q / s_p) = 0
    qa = c_ * c_ - a_ * a_
    qb = 2.0 * (c_ * d_ - a_ * b_)
    qc = d_ * d_ - b_ * b_ + 2.0 * math.log(s_q / s_p)
    roots: list[float] = []
    if abs(qa) <= 1e-14 * max(a_ * a_, c_ * c_):
        if qb != 0.0:
            roots.append(-qc / qb)
    else:
        disc = qb * qb - 4.0 * qa * qc
        if disc >= 0.0:
            root = math.sqrt(disc)
            roots.extend([(-qb + root) / (2.0 * qa), (-qb - root) / (2.0 * qa)])
    gap = 0.0
    for h in roots:
        gap = max(gap, abs(float(special.ndtr(a_ * h + b_) - special.ndtr(c_ * h + d_))))
    return gap


def clt_band(steps: Iterable[GaussianStep], mu: float | None = None) -> CLTBand:
    """The certified Berry-Esseen band of the composed ``steps`` around ``G_mu``.

    ``mu`` defaults to the CLT mu that fedsim reports (:func:`fedsim.privacy.gdp.clt_mu`).
    Neighbouring relation: the steps' own (add/remove for ``poisson``, replace-one for
    ``fixed``; one relation per history). The result: Dong-Roth-Su's Berry-Esseen theorem
    (Thm 3.5; Lemma 5.5 and Cor. 5.6 for NoisySGD) in the two-sided form of the module
    docstring.
    """
    steps = tuple(steps)
    if not steps:
        raise ConfigError("an empty history has no CLT band (it is exactly Id)")
    if len({s.sampling for s in steps}) > 1:
        raise ConfigError("one band analyses one neighbouring relation; got both poisson and "
                          "fixed steps")
    sums = np.zeros(6)
    for step in steps:
        m = loss_moments(step.sampling, step.q, step.sigma)
        sums += step.count * np.array([m.mean_p, m.var_p, m.abs3_p, m.mean_q, m.var_q,
                                       m.abs3_q])
    m_p, v_p, r_p, m_q, v_q, r_q = (float(v) for v in sums)
    if v_p <= 0 or v_q <= 0:
        raise ConfigError("the privacy loss has no variance (no privacy is spent)")
    s_p, s_q = math.sqrt(v_p), math.sqrt(v_q)
    gamma_p = BERRY_ESSEEN_CONSTANT * r_p / v_p ** 1.5
    gamma_q = BERRY_ESSEEN_CONSTANT * r_q / v_q ** 1.5
    mu_be = -2.0 * m_p / s_p
    target = clt_mu(steps) if mu is None else float(mu)
    if not (math.isfinite(target) and target >= 0):
        raise ConfigError(f"mu must be a finite number >= 0, got {mu!r}")
    gap = _sup_gap(target, m_p, s_p, m_q, s_q)
    return CLTBand(target, max(gamma_p, gamma_q + gap), gamma_p, gamma_q, mu_be)
