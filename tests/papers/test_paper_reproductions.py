"""Light checks of the paper-reproduction scripts (benchmarks/papers/): published privacy
numbers, calibration identities, and that each script's smoke mode runs and writes its keys."""

from __future__ import annotations

import json
import math
from pathlib import Path
from types import ModuleType

import pytest
import torch

from fedsim.data.datasets import Found
from tests.scripts import load_script

REPO = Path(__file__).resolve().parents[2]


def _script(name: str) -> ModuleType:
    return load_script(REPO / "benchmarks" / "papers" / f"{name}.py", f"papers_{name}")


@pytest.fixture(autouse=True)
def _one_thread() -> None:
    torch.set_num_threads(1)


@pytest.fixture(scope="module")
def drs() -> ModuleType:
    return _script("drs_mnist")


@pytest.fixture(scope="module")
def du() -> ModuleType:
    return _script("du_dynamic")


@pytest.fixture(scope="module")
def drs_rows(drs: ModuleType, tmp_path_factory: pytest.TempPathFactory) -> list[dict]:
    """drs_mnist.py --no-train into a scratch directory (privacy numbers and the plot)."""
    out = tmp_path_factory.mktemp("drs")
    assert drs.main(["--no-train", "--results", str(out), "--plot", str(out / "drs.png")]) == 0
    assert (out / "drs.png").stat().st_size > 10_000
    return json.loads((out / "drs_mnist.json").read_text())["rows"]


# -- Dong, Roth & Su (paper 003) ----------------------------------------------------------------
def test_drs_rows_have_the_issue_keys(drs_rows: list[dict]) -> None:
    keys = {"run", "full", "epochs", "accuracy", "paper_accuracy", "mu_clt", "eps_pld",
            "eps_gdp_clt", "eps_rdp"}
    # rows A, B, C, plus optionally a tuned-lr/C row with A's privacy ("A (lr .., C ..)")
    assert [r["run"] for r in drs_rows if len(r["run"]) == 1] == ["A", "B", "C"]
    for row in drs_rows:
        assert keys <= set(row)
    assert [r["paper_accuracy"] for r in drs_rows if len(r["run"]) == 1] == [95.0, 96.6, 97.0]


def test_drs_clt_mu_matches_the_paper_to_its_printed_precision(drs_rows: list[dict]) -> None:
    for row in drs_rows:
        if row["sampling"] == "fixed":
            assert round(row["mu_clt"], 3) == row["paper_mu_clt"]
        else:  # Bu et al.'s Poisson CLT, written out here; the paper prints no value for it
            q, steps = 256 / 60000, row["steps_full"]
            mu = q * math.sqrt(steps * math.expm1(row["sigma"] ** -2))
            assert row["paper_mu_clt"] is None and row["mu_clt"] == pytest.approx(mu, rel=1e-3)


def test_drs_moments_accountant_matches_tensorflow_privacy(drs_rows: list[dict]) -> None:
    """The paper's moments-accountant eps (TF Privacy: Poisson, add/remove, classic RDP
    conversion) is 1.19 / 3.01 / 7.1 at delta = 1e-5."""
    for row in drs_rows:
        digits = len(str(row["paper_eps_rdp_ma"]).split(".")[1])
        assert round(row["eps_rdp_ma"], digits) == row["paper_eps_rdp_ma"]


def test_drs_exact_accounting_is_tighter_than_rdp_and_close_to_the_clt(drs_rows: list[dict]) -> None:
    fixed = [row for row in drs_rows if row["sampling"] == "fixed"]
    assert len(fixed) >= 3
    for row in fixed:
        # same scheme (fixed size, replace-one): the PLD guarantee beats the RDP guarantee
        assert row["eps_pld"] < row["eps_rdp"]
        # the CLT is an approximation of the same curve: within 2 % at these T
        assert row["eps_pld"] == pytest.approx(row["eps_gdp_clt"], rel=0.02)


def test_drs_poisson_row_is_accounted_as_the_moments_accountant_mechanism(
    drs_rows: list[dict],
) -> None:
    """Run A under TF Privacy's mechanism (Poisson, add/remove): its RDP column is the moments
    accountant's own number, and the exact PLD guarantee is tighter."""
    (row,) = [row for row in drs_rows if row["sampling"] == "poisson"]
    assert row["run"].startswith("A")
    assert row["eps_rdp"] == row["eps_rdp_ma"]
    assert row["eps_pld"] < row["eps_rdp"]
    # issue 2's reference for run A under Poisson sampling: eps ~ 0.8645 at delta = 1e-5
    assert row["eps_pld"] == pytest.approx(0.8645, rel=0.005)


def test_drs_single_pair_curve_lies_below_the_fdp_curve(drs: ModuleType) -> None:
    """DRS Fig. 7: the piecewise-linear curve of one (eps, delta) pair is a weaker guarantee
    than the f-DP curve it was derived from (pointwise below, strictly somewhere)."""
    import numpy as np

    from fedsim.privacy.accountant import make_accountant
    from fedsim.privacy.fdp import eps_delta_tradeoff

    run = drs.RUNS[0]
    alpha = np.linspace(0.0, 1.0, 101)
    fdp = make_accountant("pld", [run.full_step]).tradeoff(alpha)
    eps = make_accountant("pld", [run.full_step]).epsilon(1e-5)
    pair = eps_delta_tradeoff(alpha, eps, 1e-5)
    assert np.all(pair <= fdp + 1e-6)
    assert np.max(fdp - pair) > 0.1


# -- Du et al. (paper 002) ----------------------------------------------------------------------
def test_du_gdp_mu_inverts_the_gdp_privacy_profile(du: ModuleType) -> None:
    mu = du.gdp_mu_for(1.2, 1e-5)
    assert du.gdp_delta(1.2, mu) == pytest.approx(1e-5, rel=1e-8)
    # DRS Cor. 2.13 run the other way: 0.285-GDP is about (1.07, 1e-5)-DP (paper 003 example)
    assert du.gdp_mu_for(1.07, 1e-5) == pytest.approx(0.285, abs=2e-3)


@pytest.mark.parametrize(("decay_clip", "grow_mu"), [(False, False), (True, True)])
def test_du_schedules_spend_exactly_the_clt_budget(du: ModuleType, decay_clip: bool,
                                                   grow_mu: bool) -> None:
    q, epochs, per_epoch = 256 / 60000, 20, 234
    mu_total = du.gdp_mu_for(1.2, 1 / 60000)
    schedule = du.variant_schedule(du.Variant("v", decay_clip, grow_mu), mu_total=mu_total, q=q,
                                   epochs=epochs, steps_per_epoch=per_epoch)
    sigmas = [schedule.sigma(t) for t in range(epochs * per_epoch)]
    # heterogeneous Poisson CLT (Du et al. Thm 1), written out here independently
    clt = q * math.sqrt(sum(math.expm1(s**-2) for s in sigmas))
    assert clt == pytest.approx(mu_total, rel=1e-6)
    if grow_mu:  # noise ends at rho_mu = 0.8 of its start, one value per epoch
        assert sigmas[-1] / sigmas[0] == pytest.approx(0.8 ** ((epochs - 1) / epochs))
        assert len(set(sigmas[:per_epoch])) == 1
    if decay_clip:
        assert schedule.clip(epochs * per_epoch - 1) / schedule.clip(0) == pytest.approx(
            0.3 ** ((epochs - 1) / epochs))


@pytest.mark.slow
def test_du_quick_run_writes_every_variant(du: ModuleType, tmp_path: Path,
                                           real_mnist: Found) -> None:
    args = ["--quick", "--seeds", "2", "--data", str(real_mnist.path), "--results", str(tmp_path),
            "--plot", str(tmp_path / "du.png")]
    assert du.main(args) == 0
    document = json.loads((tmp_path / "du_dynamic.json").read_text())
    rows = {r["variant"]: r for r in document["rows"]}
    assert set(rows) == {"non_dp", "vanilla", "sensitivity_decay", "growing_mu", "dynamic"}
    for name, row in rows.items():
        assert 0.0 <= row["accuracy"] <= 100.0 and row["full"] is False
        assert row["seeds"] == [0, 1] and len(row["accuracy_per_seed"]) == 2
        assert row["accuracy"] == pytest.approx(sum(row["accuracy_per_seed"]) / 2, abs=0.006)
        if name != "non_dp":
            assert math.isclose(row["gap"], rows["non_dp"]["accuracy"] - row["accuracy"],
                                abs_tol=0.011)
            assert row["eps_pld"] > 0
    assert rows["dynamic"]["clip_last"] < rows["dynamic"]["clip_first"]
    assert rows["dynamic"]["sigma_last"] < rows["dynamic"]["sigma_first"]
    assert (tmp_path / "du.png").is_file()
    # --refresh rebuilds notes and command from the stored rows, without training
    (tmp_path / "du.png").unlink()
    assert du.main(["--refresh", "--results", str(tmp_path), "--plot", str(tmp_path / "du.png")]) == 0
    again = json.loads((tmp_path / "du_dynamic.json").read_text())
    assert again["rows"] == document["rows"] and (tmp_path / "du.png").is_file()
    ranked = next(n for n in again["notes"] if n.startswith("Centralized, smallest to largest"))
    assert all(name in ranked for name in rows if name != "non_dp")
    assert "--full" not in again["command"]  # a reduced (quick) run
    # each seed's runs are cached: a second run with the same settings trains nothing
    cached = tmp_path / "du_dynamic_runs" / "centralized_seed1.json"
    before = cached.stat().st_mtime_ns
    assert du.main(args) == 0
    assert cached.stat().st_mtime_ns == before
    assert json.loads((tmp_path / "du_dynamic.json").read_text())["rows"] == document["rows"]


# -- van Dijk et al. (paper 000) ----------------------------------------------------------------
def test_vandijk_variants_are_valid_scenario_overrides() -> None:
    from fedsim.config import load_scenario

    vandijk = _script("vandijk_async")
    scenario = REPO / "scenarios" / "papers" / "vandijk_async.yaml"
    assert load_scenario(scenario).scenario.clients.total == 100
    base_groups = {g.name: {"sigma": 1.0}
                   for g in load_scenario(scenario).scenario.clients.groups}
    for variant in vandijk.variants(scenario, ()):
        if variant.name == vandijk.THOUGHT:
            variant = vandijk.thought_experiment(variant, scenario, (), base_groups)
        loaded = load_scenario(scenario, list(variant.overrides)).scenario
        if variant.name == "fixed":
            assert {g.sampling for g in loaded.clients.groups} == {"fixed"}
        if variant.name == vandijk.THOUGHT:
            for group, base in zip(loaded.clients.groups,
                                   load_scenario(scenario).scenario.clients.groups, strict=True):
                assert group.batch_size == 2 * base.batch_size
                assert group.noise.sigma == pytest.approx(2.0)
                assert group.rounds == base.rounds  # E -> 2E epochs at twice the batch


@pytest.mark.slow
def test_vandijk_quick_run_reports_accuracy_and_per_client_eps(tmp_path: Path,
                                                               real_mnist: Found) -> None:
    """One `fedsim run` of the base scenario in smoke mode (10 clients, 5 rounds each); the
    scenario finds MNIST by name, where ``real_mnist`` found it."""
    pytest.importorskip("fedsim.privacy.ledger")
    vandijk = _script("vandijk_async")
    assert vandijk.main(["--quick", "--variants", "poisson", "--seeds", "2", "--results",
                         str(tmp_path), "--plot", str(tmp_path / "vd.png"),
                         "--runs", str(tmp_path / "runs")]) == 0
    document = json.loads((tmp_path / "vandijk_async.json").read_text())
    (row,) = document["rows"]
    assert row["variant"] == "poisson" and row["quick"] is True and row["seeds"] == 2
    per_seed = row["final_accuracy_per_seed"]
    assert len(per_seed) == 2 and all(0.0 <= a <= 1.0 for a in per_seed)
    assert row["final_accuracy"] == pytest.approx(sum(per_seed) / 2, abs=1e-4)
    assert row["final_accuracy_sd"] == pytest.approx(abs(per_seed[0] - per_seed[1]) / 2**0.5,
                                                     abs=1e-4)
    assert (tmp_path / "runs" / "poisson" / "seed1" / "summary.json").is_file()
    # every group's sigma is calibrated to eps = 2: no client may exceed it
    assert 0.0 < row["eps_min"] <= row["eps_median"] <= row["eps_max"] <= 2.0 + 1e-9
    assert len(document["curves"]["poisson"]["epsilons"]) == 20  # 10 clients x 2 seeds
