"""``log_gauss_mass``: log(Phi(b) - Phi(a)) with relative accuracy in both tails, against
mpmath at 50 digits (the PLD's segment masses are built from it)."""

from __future__ import annotations

import math

import mpmath
import numpy as np

from fedsim.privacy.pld_step import log_gauss_mass


def _truth(a: float, b: float) -> float:
    with mpmath.workdps(50):
        low, high = mpmath.mpf(a), mpmath.mpf(b)
        if low > 0:  # upper tail: both masses tiny, mpmath's exponent does not underflow
            low, high = -high, -low
        mass = mpmath.ncdf(high) - mpmath.ncdf(low)
        return -math.inf if mass == 0 else float(mpmath.log(mass))


def test_both_tails_and_the_middle_to_relative_accuracy() -> None:
    rng = np.random.default_rng(7)
    centres = np.concatenate([rng.uniform(-38, 38, 300), rng.uniform(-3, 3, 100)])
    widths = 10.0 ** rng.uniform(-6, 1.5, centres.size)
    a, b = centres - widths / 2, centres + widths / 2
    got = log_gauss_mass(a, b)  # one vectorised call, every side of 0 mixed
    for low, high, value in zip(a, b, got, strict=True):
        truth = _truth(low, high)
        assert math.isclose(value, truth, rel_tol=1e-9, abs_tol=1e-12), (low, high, value, truth)


def test_infinite_ends_and_empty_intervals() -> None:
    cases = [(-math.inf, 0.3), (0.2, math.inf), (-math.inf, math.inf), (-40.0, -39.0),
             (39.0, 40.0), (1.5, 1.5)]
    got = log_gauss_mass(np.array([c[0] for c in cases]), np.array([c[1] for c in cases]))
    for (low, high), value in zip(cases, got, strict=True):
        truth = _truth(low, high)
        if truth == -math.inf:
            assert value == -math.inf
        else:
            assert math.isclose(value, truth, rel_tol=1e-9, abs_tol=1e-15), (low, high, value)
    assert float(log_gauss_mass(-math.inf, math.inf)) == 0.0


def test_segments_reuse_the_unshifted_mass_to_the_bit() -> None:
    """The segments hand their ``log_gauss_mass(a, b)`` to the mixture's mass instead of it
    being computed twice: the mixture's values are those it computes on its own."""
    from fedsim.privacy.pld_step import _boundaries, _log_mixture_mass

    for q, sigma in ((0.03, 1.5), (0.5, 0.8), (0.999, 4.0)):
        mu = 1.0 / sigma
        x = _boundaries(np.linspace(-8.0, 6.0, 2001), q, mu)  # -inf below log(1-q)
        a, b = x[:-1], x[1:]
        alone = _log_mixture_mass(a, b, q, mu)
        handed = _log_mixture_mass(a, b, q, mu, log_gauss_mass(a, b))
        assert np.array_equal(alone, handed)
        assert np.isneginf(x).sum() > 1 and np.isfinite(alone).any()  # empty gaps at -inf too
