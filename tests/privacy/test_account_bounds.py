"""`fedsim account` answers with the smallest valid bound, never inf where one is finite, and
the rdp accountant answers extreme sigma cleanly (issue 23, part 3)."""

from __future__ import annotations

import json
import math
from typing import Any

import mpmath
import numpy as np
import pytest

from fedsim.cli import main
from fedsim.privacy import calibration, rdp
from fedsim.privacy.accountant import make_accountant, smallest_epsilon
from fedsim.privacy.events import GaussianStep


def run_json(capsys: pytest.CaptureFixture[str], *argv: str) -> dict[str, Any]:
    assert main(["account", *argv, "--json"]) == 0
    return dict(json.loads(capsys.readouterr().out))


def gdp_epsilon_mp(mu: float, delta: float) -> float:
    """Exact eps(delta) of mu-GDP (Dong, Roth & Su, Cor. 2.13) in mpmath, by bisection."""
    mpmath.mp.dps = 40
    mu_m = mpmath.mpf(mu)

    def gap(eps: Any) -> Any:
        return (mpmath.ncdf(-eps / mu_m + mu_m / 2)
                - mpmath.e**eps * mpmath.ncdf(-eps / mu_m - mu_m / 2) - delta)

    low, high = mpmath.mpf(0), mpmath.mpf(200)
    for _ in range(200):
        middle = (low + high) / 2
        low, high = (middle, high) if gap(middle) > 0 else (low, middle)
    return float(high)


@pytest.mark.slow
def test_max_steps_is_the_largest_any_guarantee_allows(capsys: pytest.CaptureFixture[str]) -> None:
    # Issue 23's case: pld's answer stopped at 106,814 steps of this tiny per-step loss (its
    # upper tail, since fixed, went to inf); every bound now reaches the search's limit.
    out = run_json(capsys, "--q", "1e-4", "--sigma", "100", "--target-epsilon", "1",
                   "--max-steps")
    assert out["steps"] == calibration.MAX_STEPS_LIMIT == max(out["steps_pld"], out["steps_rdp"])
    assert out[f"steps_{out['bound']}"] == out["steps"]
    # Where pld resolves nothing (delta 1e-100: below its truncated tail) the answer is rdp's.
    out = run_json(capsys, "--q", "1e-4", "--sigma", "100", "--target-epsilon", "1",
                   "--max-steps", "--delta", "1e-100")
    assert out["bound"] == "rdp" and out["steps_pld"] < out["steps"] == out["steps_rdp"]
    allowed = make_accountant("rdp", [GaussianStep("poisson", 1e-4, 100.0, out["steps"])])
    assert allowed.epsilon(1e-100) <= 1.0


def test_epsilon_is_finite_where_rdp_is(capsys: pytest.CaptureFixture[str]) -> None:
    # pld resolves no delta this small (its tail is truncated near 1e-15); rdp does. (Issue
    # 23's own case, 10^6 steps at q = 1e-4, sigma = 100, delta 1e-5, is finite under pld since
    # its upper tail was fixed: 0.0020, below rdp's 0.0032.)
    step = GaussianStep("poisson", 1e-4, 100.0, 10**6)
    assert math.isinf(make_accountant("pld", [step]).epsilon(1e-100))  # the case at stake
    out = run_json(capsys, "--q", "1e-4", "--sigma", "100", "--steps", "1000000",
                   "--delta", "1e-100")
    assert out["bound"] == "rdp"
    assert out["epsilon"] == make_accountant("rdp", [step]).epsilon(1e-100)
    assert out["epsilon"] < 0.5
    # where pld is finite and tighter, it is the answer
    out = run_json(capsys, "--q", "0.01", "--sigma", "1", "--steps", "1000")
    pld = make_accountant("pld", [GaussianStep("poisson", 0.01, 1.0, 1000)]).epsilon(1e-5)
    assert out["bound"] == "pld" and out["epsilon"] == pld


def test_smallest_epsilon_is_the_minimum_of_the_guarantees() -> None:
    for step in (GaussianStep("poisson", 1e-4, 100.0, 10**6),
                 GaussianStep("fixed", 0.01, 1.0, 300)):
        values = {name: make_accountant(name, [step]).epsilon(1e-5) for name in ("pld", "rdp")}
        eps, source = smallest_epsilon(make_accountant("pld", [step]), 1e-5)
        assert eps == min(values.values()) and values[source] == eps


@pytest.mark.parametrize(("group", "sampling"), [(4, "poisson"), (4, "fixed")])
def test_group_privacy_above_twenty_is_finite(capsys: pytest.CaptureFixture[str], group: int,
                                              sampling: str) -> None:
    # q = 1: each release is the Gaussian mechanism, mu = 1 per record, g mu for a group
    out = run_json(capsys, "--q", "1", "--sigma", "1", "--steps", "1", "--sampling", sampling,
                   "--group-size", str(group))
    exact = gdp_epsilon_mp(float(group), 1e-5)
    assert exact > 20
    assert out["epsilon"] is not None and exact <= out["epsilon"] <= exact * 1.02


@pytest.mark.filterwarnings("error")
@pytest.mark.parametrize("sampling", ["poisson", "fixed"])
@pytest.mark.parametrize("sigma", ["1e-300", "0.01", "1e300"])
def test_rdp_extreme_sigma_answers_cleanly(capsys: pytest.CaptureFixture[str],
                                           monkeypatch: pytest.MonkeyPatch, sampling: str,
                                           sigma: str) -> None:
    panels: list[float] = []
    real = rdp._log_integral

    def counted(log_integrand: Any, lo: float, hi: float, panel: float) -> np.ndarray:
        panels.append(rdp._panels(lo, hi, panel))
        return real(log_integrand, lo, hi, panel)

    monkeypatch.setattr(rdp, "_log_integral", counted)
    rdp._step_curve.cache_clear()
    out = run_json(capsys, "--accountant", "rdp", "--sampling", sampling, "--q", "0.01",
                   "--sigma", sigma, "--steps", "100")
    # the work is bounded: no integral over more than _MAX_PANELS panels (sigma = 0.01 took
    # 37 s with ~2e5 of them)
    assert all(p <= rdp._MAX_PANELS for p in panels)
    if sigma == "1e-300":  # no noise: no finite guarantee, said as such
        assert out["epsilon"] is None and "epsilon" in out["infinite"]
    elif sigma == "1e300":
        assert out["epsilon"] == 0.0
    else:
        assert 0 < out["epsilon"] < math.inf


@pytest.mark.filterwarnings("error")
@pytest.mark.parametrize("sampling", ["poisson", "fixed"])
def test_rdp_target_epsilon_700_is_clean(capsys: pytest.CaptureFixture[str],
                                         sampling: str) -> None:
    out = run_json(capsys, "--accountant", "rdp", "--sampling", sampling, "--q", "0.01",
                   "--steps", "100", "--target-epsilon", "700")
    meets = make_accountant("rdp", [GaussianStep(sampling, 0.01, out["sigma"], 100)])  # type: ignore[arg-type]
    assert meets.epsilon(1e-5) <= 700


def test_small_sigma_bound_is_an_upper_bound() -> None:
    # the bound taken where quadrature would be too long is never below the exact value
    orders = np.array([1.5, 2.5, 3.5, 6.25])
    bounded = rdp.poisson_rdp(0.01, 0.04, orders)
    exact = np.array([rdp._poisson_log_excess_fractional(0.01, 0.04, np.array([a]))[0]
                      for a in orders])
    exact_rdp = np.minimum(np.logaddexp(0.0, exact) / (orders - 1.0),
                           rdp.gaussian_rdp(0.04, orders))
    assert rdp._poisson_fractional_panels(0.04, orders) > rdp._MAX_PANELS
    assert np.all(bounded >= exact_rdp * (1 - 1e-9))
