"""Independent references for the PLD accountant's upper tail (issue 23 part 2), test-only.

Nothing here imports fedsim. Two references:

* :func:`gdp_epsilon`: exact eps(delta) of mu-GDP (Dong, Roth & Su 2022, Cor. 2.13:
  ``delta(eps) = Phi(-eps/mu + mu/2) - e^eps Phi(-eps/mu - mu/2)``) solved in mpmath. T
  Gaussian releases of noise multiplier sigma are exactly ``sqrt(T)/sigma``-GDP.
* :func:`ctd_epsilon`: a subsampled Gaussian step (Poisson: the remove and the add pair,
  composed separately; fixed-size: ``delta_C = max(delta_remove, delta_add)`` per step, DRS
  Thm 4.2) discretised on a *uniform* grid by Doroshenko et al.'s connect-the-dots formula
  (PETS 2022, Alg. 1, as written in dp_accounting's docstring) with every hockey-stick value
  and every mass computed in mpmath at 40 digits (so the differences of nearly equal deltas
  cost nothing), then composed by dp_accounting's ``DensePLDPmf.self_compose``. It shares no
  code with fedsim (which splits interval masses in log space on a non-uniform grid and
  composes in its own fixed-point Fourier state). Connect-the-dots is pessimistic and its
  error falls like h^2, so :func:`bracketed_epsilon` refines it over two grids (h, h/2): the
  finer value is an upper estimate of the truth, and the finer value less the gap between
  the two a lower one (its error is at most the gap for any order of convergence >= 1). The
  composition is dp_accounting's double-precision FFT without noise control, so at delta
  1e-11 the two grids may come out in either order; the gap then still bounds the noise.
"""

from __future__ import annotations

import functools
import math

import mpmath
import numpy as np
from dp_accounting.pld import pld_pmf

_DPS = 40


def _phi(x: mpmath.mpf) -> mpmath.mpf:
    return mpmath.erfc(-x / mpmath.sqrt(2)) / 2


def gdp_delta(eps: float, mu: float) -> mpmath.mpf:
    with mpmath.workdps(_DPS):
        e, m = mpmath.mpf(eps), mpmath.mpf(mu)
        return _phi(-e / m + m / 2) - mpmath.exp(e) * _phi(-e / m - m / 2)


def gdp_epsilon(delta: float, mu: float) -> float:
    """Exact eps(delta) of mu-GDP (bisection in mpmath; delta(eps) is decreasing)."""
    with mpmath.workdps(_DPS):
        lo, hi = mpmath.mpf(0), mpmath.mpf(1)
        while gdp_delta(float(hi), mu) > delta:
            hi *= 2
        for _ in range(80):
            mid = (lo + hi) / 2
            lo, hi = (mid, hi) if gdp_delta(float(mid), mu) > delta else (lo, mid)
        return float(hi)


def _hockey_remove(eps: mpmath.mpf, q: mpmath.mpf, mu: mpmath.mpf) -> mpmath.mpf:
    """P = (1-q)N(0,1) + qN(mu,1) against Q = N(0,1)."""
    if q < 1 and eps <= mpmath.log(1 - q):
        return 1 - mpmath.exp(eps)
    x = (mpmath.log((mpmath.exp(eps) - (1 - q)) / q) + mu * mu / 2) / mu
    return (1 - q) * _phi(-x) + q * _phi(mu - x) - mpmath.exp(eps) * _phi(-x)


def _hockey_add(eps: mpmath.mpf, q: mpmath.mpf, mu: mpmath.mpf) -> mpmath.mpf:
    """Q = N(0,1) against P = (1-q)N(0,1) + qN(mu,1)."""
    if q < 1 and eps >= -mpmath.log(1 - q):
        return mpmath.mpf(0)
    x = (mpmath.log((mpmath.exp(-eps) - (1 - q)) / q) + mu * mu / 2) / mu
    return _phi(x) - mpmath.exp(eps) * ((1 - q) * _phi(x) + q * _phi(x - mu))


def _ctd_pmf(h: float, lower: int, deltas: list[mpmath.mpf]) -> pld_pmf.DensePLDPmf:
    """Connect-the-dots masses (dp_accounting's fixed-gap formula) in mpmath."""
    e = mpmath.exp(mpmath.mpf(h))
    n = len(deltas)
    masses = [mpmath.mpf(0)] * n
    masses[0] = (1 - deltas[0]) + (deltas[1] - deltas[0]) / (e - 1)
    for i in range(1, n - 1):
        masses[i] = ((deltas[i + 1] - deltas[i]) - e * (deltas[i] - deltas[i - 1])) / (e - 1)
    masses[-1] = (deltas[-1] - deltas[-2]) / (1 / e - 1)
    probs = np.array([float(m) for m in masses])
    return pld_pmf.DensePLDPmf(h, lower, probs, float(deltas[-1]), True)


@functools.lru_cache(maxsize=64)
def step_pmfs(sampling: str, q: float, sigma: float, h: float) -> tuple[pld_pmf.DensePLDPmf, ...]:
    """One step's connect-the-dots PMFs on the uniform grid h Z (see module docstring)."""
    with mpmath.workdps(_DPS):
        qm, mu = mpmath.mpf(q), 1 / mpmath.mpf(sigma)
        x_top = 13 + mu  # Phi(-13) ~ 6e-39: nothing above the top grid point matters
        top = float(mpmath.log((1 - qm) + qm * mpmath.exp(mu * x_top - mu * mu / 2)))
        k_top = math.ceil(top / h)
        if sampling == "poisson":
            k_low = math.floor(math.log1p(-q) / h) if q < 1 else -k_top
            k_high = math.ceil(-math.log1p(-q) / h) + 1 if q < 1 else k_top
            remove = [_hockey_remove(k * mpmath.mpf(h), qm, mu) for k in range(k_low, k_top + 1)]
            add = [_hockey_add(k * mpmath.mpf(h), qm, mu) for k in range(-k_top, k_high + 1)]
            return _ctd_pmf(h, k_low, remove), _ctd_pmf(h, -k_top, add)
        both = [max(_hockey_remove(k * mpmath.mpf(h), qm, mu), _hockey_add(k * mpmath.mpf(h), qm, mu))
                for k in range(-k_top, k_top + 1)]
        return (_ctd_pmf(h, -k_top, both),)


def ctd_epsilon(sampling: str, q: float, sigma: float, count: int, delta: float,
                h: float) -> float:
    """eps(delta) of ``count`` steps from the connect-the-dots reference at grid h."""
    composed = [p.self_compose(count, tail_mass_truncation=1e-18)
                for p in step_pmfs(sampling, q, sigma, h)]
    return max(p.get_epsilon_for_delta(delta) for p in composed)


def bracketed_epsilon(sampling: str, q: float, sigma: float, count: int, delta: float,
                      h: float) -> tuple[float, float]:
    """(lower, upper) estimates of the true eps(delta) from the grids h and h/2."""
    coarse = ctd_epsilon(sampling, q, sigma, count, delta, h)
    fine = ctd_epsilon(sampling, q, sigma, count, delta, h / 2)
    return fine - abs(coarse - fine), fine
