"""The certified Berry-Esseen band around the CLT's G_mu (fedsim.privacy.clt_error).

Checked against independent computations: the band against the PLD accountant's trade-off
curve (a numerical guarantee) on the Dong-Roth-Su MNIST settings, the per-step loss moments
against mpmath quadrature of Dong-Roth-Su's integrals written in the trade-off function's own
coordinates (``int_0^1 g(log|f'(x)|) dx``; on the inverse piece by the substitution
``x = f_q(y)``), and the closed-form supremum against a dense grid.
"""

from __future__ import annotations

import math
from pathlib import Path

import mpmath
import numpy as np
import pytest

from fedsim.errors import ConfigError
from fedsim.privacy.accountant import make_accountant
from fedsim.privacy.clt_error import BERRY_ESSEEN_CONSTANT, _sup_gap, clt_band, loss_moments
from fedsim.privacy.events import GaussianStep, group_steps
from fedsim.privacy.gdp import clt_mu

DRS_Q = 256 / 60000
DRS_SIGMA = 1.3


@pytest.mark.parametrize("sampling", ["poisson", "fixed"])
@pytest.mark.parametrize("steps", [3516, 300])
def test_band_contains_the_pld_curve_on_the_drs_settings(sampling: str, steps: int) -> None:
    history = [GaussianStep(sampling, DRS_Q, DRS_SIGMA, steps)]  # type: ignore[arg-type]
    band = clt_band(history)
    assert band.mu == pytest.approx(clt_mu(history), rel=1e-12)
    alphas = np.linspace(0.0, 1.0, 1001)
    curve = make_accountant("pld", history).tradeoff(alphas)
    assert np.all(band.lower(alphas) <= curve + 1e-12)
    assert np.all(curve <= band.upper(alphas) + 1e-12)
    # the band is informative: narrow at T = 3516 (about 0.035), wider at the shorter T
    assert band.gamma < (0.04 if steps == 3516 else 0.13)
    # and the CLT's G_mu itself is off the PLD curve by far less than gamma
    from fedsim.privacy.gdp import gdp_tradeoff
    assert np.max(np.abs(gdp_tradeoff(alphas, band.mu) - curve)) < band.gamma


@pytest.mark.parametrize(("sampling", "q", "sigma", "steps"),
                         [("poisson", 0.5, 0.8, 10), ("fixed", 0.2, 1.0, 20),
                          ("poisson", 0.05, 0.7, 50), ("fixed", 0.05, 0.7, 50)])
def test_band_contains_the_pld_curve_where_the_clt_is_poor(sampling: str, q: float,
                                                           sigma: float, steps: int) -> None:
    """Few steps and large q: the CLT mu is far off; the certified band still holds."""
    history = [GaussianStep(sampling, q, sigma, steps)]  # type: ignore[arg-type]
    band = clt_band(history)
    alphas = np.linspace(0.0, 1.0, 1001)
    curve = make_accountant("pld", history).tradeoff(alphas)
    assert np.all(band.lower(alphas) <= curve + 1e-12)
    assert np.all(curve <= band.upper(alphas) + 1e-12)


def test_band_of_a_mixed_history_contains_the_pld_curve() -> None:
    history = [GaussianStep("poisson", 0.01, 1.0, 400), GaussianStep("poisson", 0.02, 2.0, 300),
               GaussianStep("poisson", 1.0, 8.0, 1)]
    band = clt_band(history)
    alphas = np.linspace(0.0, 1.0, 1001)
    curve = make_accountant("pld", history).tradeoff(alphas)
    assert np.all(band.lower(alphas) <= curve + 1e-12)
    assert np.all(curve <= band.upper(alphas) + 1e-12)


def _mp_moments_poisson(q: float, sigma: float) -> tuple[float, ...]:
    """E_P and E_Q of L, (L - m)^2, |L - m|^3 for P = N(0,1), Q = (1-q)N(0,1) + qN(1/sigma,1)."""
    mpmath.mp.dps = 30
    mu = mpmath.mpf(1) / sigma
    phi = lambda z: mpmath.exp(-z * z / 2) / mpmath.sqrt(2 * mpmath.pi)  # noqa: E731
    loss = lambda z: mpmath.log(1 - q + q * mpmath.exp(mu * z - mu * mu / 2))  # noqa: E731
    p = phi
    qd = lambda z: (1 - q) * phi(z) + q * phi(z - mu)  # noqa: E731
    out = []
    for density in (p, qd):
        m = mpmath.quad(lambda z, d=density: loss(z) * d(z), [-mpmath.inf, 0, mu, mpmath.inf])
        v = mpmath.quad(lambda z, d=density, m=m: (loss(z) - m) ** 2 * d(z),
                        [-mpmath.inf, 0, mu, mpmath.inf])
        # split |L - m|^3 at the root of L(z) = m (L is increasing)
        root = (mpmath.log((mpmath.exp(m) - 1 + q) / q) + mu * mu / 2) / mu
        r = mpmath.quad(lambda z, d=density, m=m: abs(loss(z) - m) ** 3 * d(z),
                        [-mpmath.inf, root, mpmath.inf])
        out += [float(m), float(v), float(r)]
    return tuple(out)


def _mp_moments_fixed(q: float, sigma: float) -> tuple[float, float, float]:
    """kl, kappa_2 - kl^2 and kappa_3bar of C_q(G_{1/sigma}) as Dong-Roth-Su define them:
    integrals over x in [0, 1] of functions of log|f'(x)|, f the symmetrised trade-off."""
    mpmath.mp.dps = 25
    mu = mpmath.mpf(1) / sigma

    def g_mu(x: mpmath.mpf) -> mpmath.mpf:
        return mpmath.ncdf(-mpmath.sqrt(2) * mpmath.erfinv(2 * x - 1) - mu)

    def f_q(x: mpmath.mpf) -> mpmath.mpf:
        return q * g_mu(x) + (1 - q) * (1 - x)

    def slope_f_q(x: mpmath.mpf) -> mpmath.mpf:  # f_q'(x), by G_mu' = -e^{mu z - mu^2/2}
        z = mpmath.sqrt(2) * mpmath.erfinv(1 - 2 * x)
        return -(1 - q) - q * mpmath.exp(mu * z - mu * mu / 2)

    x_star = mpmath.ncdf(-mu / 2)  # f_q'(x*) = -1
    y_star = f_q(x_star)

    def expect(g):  # int_0^1 g(log|f'(x)|) dx over the three pieces of C_q
        on_f = mpmath.quad(lambda x: g(mpmath.log(-slope_f_q(x))), [0, x_star])
        on_segment = (y_star - x_star) * g(mpmath.mpf(0))
        # on [y*, 1] f = f_q^{-1}: substitute x = f_q(y), dx = |f_q'(y)| dy, y in [0, x*]
        on_inverse = mpmath.quad(
            lambda y: g(-mpmath.log(-slope_f_q(y))) * -slope_f_q(y), [0, x_star])
        return on_f + on_segment + on_inverse

    kl = -expect(lambda v: v)
    k2 = expect(lambda v: v * v)
    k3 = expect(lambda v: abs(v + kl) ** 3)
    return float(kl), float(k2 - kl * kl), float(k3)


@pytest.mark.parametrize(("q", "sigma"), [(DRS_Q, DRS_SIGMA), (0.3, 0.7), (0.02, 2.0)])
def test_poisson_moments_match_mpmath(q: float, sigma: float) -> None:
    m = loss_moments("poisson", q, sigma)
    expected = _mp_moments_poisson(q, sigma)
    got = (m.mean_p, m.var_p, m.abs3_p, m.mean_q, m.var_q, m.abs3_q)
    assert got == pytest.approx(expected, rel=1e-7)


@pytest.mark.parametrize(("q", "sigma"), [(DRS_Q, DRS_SIGMA), (0.3, 0.7)])
def test_fixed_moments_match_drs_integrals_in_mpmath(q: float, sigma: float) -> None:
    m = loss_moments("fixed", q, sigma)
    kl, var, k3bar = _mp_moments_fixed(q, sigma)
    assert (-m.mean_p, m.var_p, m.abs3_p) == pytest.approx((kl, var, k3bar), rel=1e-6)
    assert (m.mean_q, m.var_q, m.abs3_q) == (-m.mean_p, m.var_p, m.abs3_p)  # symmetric


def test_gamma_is_drs_corollary_at_their_mu_and_grows_with_distance_from_it() -> None:
    """At Dong-Roth-Su's own mu (2 T kl / sqrt(T (kappa_2 - kl^2))) a symmetric history's band
    is their gamma = 0.56 T kappa_3bar / (T (kappa_2 - kl^2))^{3/2}, recomputed here."""
    steps = 3516
    m = loss_moments("fixed", DRS_Q, DRS_SIGMA)
    history = [GaussianStep("fixed", DRS_Q, DRS_SIGMA, steps)]
    mu_drs = 2 * steps * (-m.mean_p) / math.sqrt(steps * m.var_p)
    gamma_drs = BERRY_ESSEEN_CONSTANT * steps * m.abs3_p / (steps * m.var_p) ** 1.5
    at_drs = clt_band(history, mu_drs)
    assert at_drs.gamma == pytest.approx(gamma_drs, rel=1e-9)
    assert at_drs.mu_berry_esseen == pytest.approx(mu_drs, rel=1e-12)
    # gamma ~ 1/sqrt(T) for one kind of step
    longer = clt_band([history[0].times(4 * steps)])
    assert longer.gamma_p == pytest.approx(at_drs.gamma_p / 2, rel=1e-9)
    assert clt_band(history, mu_drs * 1.5).gamma > at_drs.gamma


@pytest.mark.parametrize(("mu", "m_p", "s_p", "m_q", "s_q"),
                         [(0.3, -0.05, 0.3, 0.05, 0.32), (1.0, -0.2, 0.5, 0.1, 0.4),
                          (0.2, -0.02, 0.2, 0.02, 0.2), (2.0, -1.0, 1.5, 1.2, 1.6)])
def test_sup_gap_closed_form_matches_a_dense_grid(mu: float, m_p: float, s_p: float, m_q: float,
                                                  s_q: float) -> None:
    from scipy.stats import norm

    h = np.linspace(-30, 30, 2_000_001)
    grid = np.max(np.abs(norm.cdf((h - m_p) / s_p - mu) - norm.cdf((h - m_q) / s_q)))
    assert _sup_gap(mu, m_p, s_p, m_q, s_q) == pytest.approx(grid, rel=1e-6, abs=1e-12)


def test_bad_input_is_refused() -> None:
    with pytest.raises(ConfigError):
        clt_band([])
    with pytest.raises(ConfigError):
        clt_band([GaussianStep("poisson", 0.1, 1.0), GaussianStep("fixed", 0.1, 1.0)])
    with pytest.raises(ConfigError):
        clt_band([GaussianStep("poisson", 0.1, 1.0)], mu=math.nan)


def test_account_gdp_clt_reports_the_band(capsys: pytest.CaptureFixture[str]) -> None:
    import json

    from fedsim.cli import main

    argv = ["account", "--batch-size", "256", "--dataset-size", "60000", "--epochs", "15",
            "--sigma", "1.3", "--sampling", "fixed", "--accountant", "gdp-clt", "--json"]
    assert main(argv) == 0
    out = json.loads(capsys.readouterr().out)
    band = clt_band([GaussianStep("fixed", DRS_Q, DRS_SIGMA, 3516)])
    assert out["mu"] == pytest.approx(band.mu, rel=1e-12)
    assert out["clt_gamma"] == pytest.approx(band.gamma, rel=1e-12)
    assert main(argv[:-1]) == 0
    assert "clt_gamma:" in capsys.readouterr().out


def test_clients_csv_reports_the_band_beside_mu(tmp_path: Path) -> None:
    import csv

    import yaml

    from fedsim.cli import main
    from fedsim.privacy.ledger import read_ledger_steps

    scenario = {
        "name": "tiny-band", "seed": 1, "stop": {"windows": 6},
        "dataset": {"name": "synthetic", "num_samples": 400, "num_test_samples": 100,
                    "num_features": 6, "num_classes": 3},
        "model": {"name": "logreg"},
        "clients": {"groups": [{"name": "a", "count": 4, "data_share": 0.5, "batch_size": 16,
                                "clip": 1.0, "noise": 1.0, "speed": 0.01},
                               {"name": "b", "count": 2, "data_share": 0.5, "batch_size": 8,
                                "clip": 1.0, "noise": 1.3, "speed": 0.01}]},
        "server": {"window": 1.0},
    }
    path = tmp_path / "tiny.yaml"
    path.write_text(yaml.safe_dump(scenario), encoding="utf-8")
    out = tmp_path / "run"
    assert main(["run", str(path), "--out", str(out), "--no-plots"]) == 0
    with (out / "clients.csv").open(encoding="utf-8") as handle:
        rows = list(csv.DictReader(handle))
    histories = set()
    for row in rows:
        steps = list(read_ledger_steps(out / "ledgers" / f"{row['client_id']}.jsonl"))
        histories.add(tuple(group_steps(steps)))
        band = clt_band(steps)  # each row's figures computed afresh, for its own history
        assert float(row["mu_clt"]) == pytest.approx(band.mu, rel=1e-12)
        assert float(row["mu_clt_gamma"]) == pytest.approx(band.gamma, rel=1e-12)
        assert 0 < band.gamma < 1
    # clients share histories (the rows compute a shared history's figures once) and not all
    assert 1 < len(histories) < len(rows)


@pytest.mark.parametrize("sigma", [0.03, 0.01])
def test_moments_at_a_tiny_sigma_are_the_gaussian_closed_form(sigma: float) -> None:
    """q = 1 is the Gaussian pair: the loss is N(-+mu^2/2, mu^2) under P / Q, so its absolute
    third central moment is 2 sqrt(2/pi) mu^3. e^{l(z)} alone overflows here (mu z > 709)."""
    mu = 1.0 / sigma
    m = loss_moments("poisson", 1.0, sigma)
    abs3 = 2.0 * math.sqrt(2.0 / math.pi) * mu ** 3
    assert (m.mean_p, m.var_p, m.abs3_p) == pytest.approx((-mu * mu / 2, mu * mu, abs3), rel=1e-7)
    assert (m.mean_q, m.var_q, m.abs3_q) == pytest.approx((mu * mu / 2, mu * mu, abs3), rel=1e-7)


def test_a_run_with_a_near_zero_sigma_writes_its_outputs(tmp_path: Path) -> None:
    """A non-private reference (sigma 0.01, as Du et al.'s federated study runs one) has an
    infinite CLT mu: the run still finishes, with no band around it (blank cells)."""
    import csv

    import yaml

    from fedsim.cli import main

    scenario = {
        "name": "tiny-sigma", "seed": 1, "stop": {"windows": 4},
        "dataset": {"name": "synthetic", "num_samples": 400, "num_test_samples": 100,
                    "num_features": 6, "num_classes": 3},
        "model": {"name": "logreg"},
        "clients": {"groups": [{"name": "a", "count": 2, "data_share": 1.0, "batch_size": 16,
                                "clip": 1.0, "noise": 0.01, "speed": 0.01}]},
        "server": {"window": 1.0},
    }
    path = tmp_path / "tiny.yaml"
    path.write_text(yaml.safe_dump(scenario), encoding="utf-8")
    out = tmp_path / "run"
    assert main(["run", str(path), "--out", str(out), "--no-plots"]) == 0
    with (out / "clients.csv").open(encoding="utf-8") as handle:
        rows = list(csv.DictReader(handle))
    assert len(rows) == 2
    assert all(r["mu_clt"] == "" and r["mu_clt_gamma"] == "" for r in rows)
    assert all(float(r["epsilon"]) > 100 for r in rows)
