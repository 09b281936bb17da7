"""`fedsim account`: answers, --json keys, exit codes."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from fedsim.cli import main
from fedsim.privacy.accountant import make_accountant
from fedsim.privacy.events import GaussianStep

DRS_B = ["--batch-size", "256", "--dataset-size", "60000", "--epochs", "60", "--sigma", "1.1"]


def run_json(capsys: pytest.CaptureFixture[str], *argv: str) -> dict:
    assert main(["account", *argv, "--json"]) == 0
    return json.loads(capsys.readouterr().out)


def test_default_is_pld_poisson(capsys: pytest.CaptureFixture[str]) -> None:
    out = run_json(capsys, *DRS_B)
    for key in ("epsilon", "delta", "accountant", "sampling", "q", "sigma", "steps", "mu"):
        assert key in out
    assert out["accountant"] == "pld" and out["sampling"] == "poisson"
    assert out["steps"] == 14063 and out["is_guarantee"] is True
    assert out["epsilon"] == pytest.approx(2.3817, rel=1.5e-3)


def test_fixed_size_gdp_clt_is_labelled(capsys: pytest.CaptureFixture[str]) -> None:
    out = run_json(capsys, *DRS_B, "--sampling", "fixed", "--accountant", "gdp-clt")
    assert out["is_guarantee"] is False and "approximation" in out["note"]
    assert round(out["mu"], 3) == 0.737 and round(out["epsilon"], 2) == 3.09
    assert main(["account", *DRS_B, "--accountant", "gdp-clt"]) == 0
    assert "APPROXIMATION" in capsys.readouterr().out


def test_delta_at_epsilon_and_target_sigma(capsys: pytest.CaptureFixture[str]) -> None:
    out = run_json(capsys, "--q", "0.01", "--sigma", "1", "--steps", "500", "--epsilon", "1.0")
    direct = make_accountant("pld", [GaussianStep("poisson", 0.01, 1.0, 500)]).delta(1.0)
    assert out["delta"] == pytest.approx(direct)
    out = run_json(capsys, "--q", "0.01", "--steps", "500", "--target-epsilon", "1.0")
    eps = make_accountant("pld", [GaussianStep("poisson", 0.01, out["sigma"], 500)]).epsilon(1e-5)
    assert eps <= 1.0


def test_max_steps(capsys: pytest.CaptureFixture[str]) -> None:
    out = run_json(capsys, "--q", "0.01", "--sigma", "1", "--target-epsilon", "1", "--max-steps")
    steps = out["steps"]
    eps = [make_accountant("pld", [GaussianStep("poisson", 0.01, 1.0, t)]).epsilon(1e-5)
           for t in (steps, steps + 1)]
    assert eps[0] <= 1.0 < eps[1]
    assert out.get("note") is None
    none = run_json(capsys, "--q", "0.01", "--sigma", "1", "--target-epsilon", "0.01",
                    "--max-steps")  # one step spends more than the target
    assert make_accountant("pld", [GaussianStep("poisson", 0.01, 1.0, 1)]).epsilon(1e-5) > 0.01
    assert none["steps"] == 0 and none["note"] == (
        "no step fits: one step of q = 0.01, sigma = 1 already spends more than eps 0.01 at "
        "delta 1e-05")


def test_rdp_reports_both_conversions(capsys: pytest.CaptureFixture[str]) -> None:
    pytest.importorskip("fedsim.privacy.rdp")
    out = run_json(capsys, "--q", "0.01", "--sigma", "1", "--steps", "300", "--accountant", "rdp")
    assert out["epsilon_optimal"] <= out["epsilon_classic"]
    assert out["epsilon"] == out["epsilon_optimal"]
    out = run_json(capsys, "--q", "0.01", "--sigma", "1", "--target-epsilon", "2", "--max-steps",
                   "--accountant", "rdp")
    assert out["steps_optimal"] >= out["steps_classic"] >= 1


def test_group_size_is_weaker(capsys: pytest.CaptureFixture[str]) -> None:
    one = run_json(capsys, "--q", "0.01", "--sigma", "1", "--steps", "100")
    two = run_json(capsys, "--q", "0.01", "--sigma", "1", "--steps", "100", "--group-size", "2")
    assert two["epsilon"] > one["epsilon"] and two["group_size"] == 2
    clt = run_json(capsys, "--q", "0.01", "--sigma", "1", "--steps", "100",
                   "--accountant", "gdp-clt", "--group-size", "3")
    assert clt["mu"] == pytest.approx(3 * 0.01 * math.sqrt(100 * math.expm1(1.0)))


def test_ledger_input_and_plot(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    ledger = tmp_path / "plan.json"
    ledger.write_text(json.dumps([{"sampling": "poisson", "q": 0.01, "sigma": 1.0, "count": 50},
                                  {"sampling": "poisson", "q": 0.02, "sigma": 2.0, "count": 50}]))
    plot = tmp_path / "curve.png"
    out = run_json(capsys, "--ledger", str(ledger), "--plot", str(plot))
    direct = make_accountant("pld", [GaussianStep("poisson", 0.01, 1.0, 50),
                                     GaussianStep("poisson", 0.02, 2.0, 50)]).epsilon(1e-5)
    assert out["epsilon"] == pytest.approx(direct) and out["steps"] == 100
    assert plot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_a_ledger_brings_its_own_sampling(tmp_path: Path,
                                          capsys: pytest.CaptureFixture[str]) -> None:
    """A fixed-size ledger is accounted as fixed-size without --sampling (or sampling= from
    Python); a scheme given that is not the ledger's is refused."""
    import fedsim

    ledger = tmp_path / "fixed.json"
    ledger.write_text(json.dumps([{"sampling": "fixed", "q": 0.01, "sigma": 1.0, "count": 50}]))
    direct = make_accountant("pld", [GaussianStep("fixed", 0.01, 1.0, 50)]).epsilon(1e-5)
    out = run_json(capsys, "--ledger", str(ledger))
    assert out["sampling"] == "fixed" and out["epsilon"] == pytest.approx(direct)
    assert fedsim.account(ledger=ledger)["epsilon"] == pytest.approx(direct)
    assert main(["account", "--ledger", str(ledger), "--sampling", "poisson"]) == 2
    assert "has fixed steps but sampling is poisson" in capsys.readouterr().err


@pytest.mark.parametrize("argv", [
    ["--q", "0", "--sigma", "1", "--steps", "10"],
    ["--q", "1.5", "--sigma", "1", "--steps", "10"],
    ["--q", "0.1", "--sigma", "0", "--steps", "10"],
    ["--q", "0.1", "--sigma", "-1", "--steps", "10"],
    ["--q", "0.1", "--sigma", "1", "--steps", "0"],
    ["--q", "0.1", "--sigma", "1", "--steps", "10", "--delta", "1"],
    ["--q", "0.1", "--sigma", "1", "--steps", "10", "--delta", "0"],
    ["--q", "0.1", "--batch-size", "10", "--dataset-size", "100", "--sigma", "1", "--steps", "5"],
    ["--q", "0.1", "--sigma", "1", "--steps", "10", "--epochs", "2"],
    ["--q", "0.1", "--sigma", "1", "--steps", "10", "--epsilon", "1", "--target-epsilon", "1"],
    ["--q", "0.1", "--sigma", "1", "--max-steps"],
    ["--q", "0.1", "--sigma", "1", "--steps", "10", "--accountant", "nope"],
    ["--sigma", "1", "--steps", "10"],
    ["--ledger", "/nonexistent/file.json"],
])
def test_bad_flags_exit_2_with_a_message(argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:  # argparse errors exit via SystemExit(2)
        code = main(["account", *argv])
        raise SystemExit(code)
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert "error" in err and "Traceback" not in err


def test_the_table_for_people_is_one_column_of_values(capsys: pytest.CaptureFixture[str]) -> None:
    """A stranger: 'accountant:' and 'sampling:' were padded to one width, the rest to
    another; every row's value now starts in the same column."""
    assert main(["account", *DRS_B]) == 0
    rows = [line for line in capsys.readouterr().out.splitlines() if ": " in line]
    assert [r.split(":")[0] for r in rows[:2]] == ["accountant", "sampling"] and len(rows) > 4
    starts = {len(r) - len(r.split(":", 1)[1].lstrip()) for r in rows}
    assert starts == {17}


def test_the_plots_title_says_a_clt_eps_is_an_approximation() -> None:
    """A stranger: `--accountant gdp-clt --plot` put its eps in the title as a guarantee's
    (only the legend said CLT); a guarantee's title stays as it was."""
    from fedsim.commands.account import plot_title
    from fedsim.privacy.answers import account

    clt = account(q=0.01, sigma=1.0, steps=1000, accountant="gdp-clt")
    pld = account(q=0.01, sigma=1.0, steps=1000)
    assert plot_title(clt).endswith("(CLT approximation, not a guarantee)")
    assert "approximation" not in plot_title(pld)
    assert plot_title(pld) == f"poisson (add/remove), eps = {pld.epsilon:.4g} at delta = 1e-05"


def test_plot_lands_at_the_path_given_or_is_refused_in_one_line(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A stranger's ``--plot curve.txt`` ended in matplotlib's ValueError traceback, and
    ``--plot DIR`` (an existing directory) wrote ``DIR.png`` beside it while the answer said
    ``plot: DIR``. The image is written at the path given (PNG without a suffix, the suffix's
    format where matplotlib has it); anything else is one line and exit 2, nothing written."""
    import fedsim

    posture = ["--q", "0.01", "--sigma", "1", "--steps", "100"]
    bare = tmp_path / "curve"
    assert run_json(capsys, *posture, "--plot", str(bare))["plot"] == str(bare)
    assert bare.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and not (tmp_path / "curve.png").exists()
    svg = tmp_path / "curve.svg"
    run_json(capsys, *posture, "--plot", str(svg))
    assert b"<svg" in svg.read_bytes()[:400]

    for target, says in ((tmp_path / "curve.txt", "cannot draw a .txt image; name a .png file"),
                         (tmp_path, "is a directory; name the image file")):
        assert main(["account", *posture, "--plot", str(target)]) == 2
        err = capsys.readouterr().err.strip()
        assert err.count("\n") == 0 and says in err and "Traceback" not in err, err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["curve", "curve.svg"]
    assert not (tmp_path.parent / f"{tmp_path.name}.png").exists()
    with pytest.raises(fedsim.ConfigError, match=r"cannot draw a \.txt image"):
        fedsim.account(q=0.01, sigma=1.0, steps=100, plot=tmp_path / "api.txt")


@pytest.mark.parametrize(("flag", "value"), [("--sigma", "inf"), ("--sigma", "nan"),
                                             ("--sigma", "0"), ("--epochs", "inf")])
def test_a_non_finite_sigma_or_epochs_is_refused_as_what_it_is(
        flag: str, value: str, capsys: pytest.CaptureFixture[str]) -> None:
    """A stranger's ``--sigma inf`` was told "--sigma must be > 0, got inf" (inf is > 0)."""
    argv = {"--sigma": ["--q", "0.01", "--steps", "10", "--sigma", value],
            "--epochs": ["--q", "0.01", "--sigma", "1", "--epochs", value]}[flag]
    assert main(["account", *argv]) == 2
    err = capsys.readouterr().err.strip()
    assert err == f"fedsim account: error: {flag} must be a finite number > 0, got {float(value)}"
