"""What ``fedsim report`` and ``fedsim compare`` verify of a handed-over run directory, from an
attacker's review: a private tuning's release whose tuning ledger is damaged (its tuned eps
was stated from summary.json, "not beside this trial", with no warning), a client whose
ledger and clients.csv row are gone (left out of the eps spread without a word), each
client's neighbouring relation from its own ledger's header, and files that gave tracebacks
(a clients.csv field over 128 KiB, a 2,000-character scenario name in a plot's title) or
printed a file name's terminal escapes raw."""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml

from fedsim.cli import main as cli_main
from fedsim.privacy.accountant import make_accountant
from fedsim.privacy.events import GaussianStep, TunedSelection
from fedsim.privacy.ledger import PrivacyLedger
from fedsim.reporting import figures
from fedsim.reporting.rundir import RunDirectory
from fedsim.reporting.values import epsilon_text

SyntheticRun = Any  # conftest.SyntheticRun (conftest is not importable under importlib mode)
DELTA = 1e-5
TUNED_CLIENTS = ("c000", "c001", "c002")


def _selection(sigma: float) -> TunedSelection:
    step = GaussianStep("poisson", 0.1, sigma)
    return TunedSelection("poisson", (2.0,), ((step.times(20),), (step.times(30),)))


def _tuning_release(small_run: SyntheticRun, root: Path, *, summary_eps: float | None = None
                    ) -> tuple[Path, dict[str, float]]:
    """A sweep directory ``root`` whose trial (a copy of ``small_run``) is a private tuning's
    release, beside its tuning ledgers; summary.json states each client's tuned eps (as the
    ledgers give it, or ``summary_eps``). Returns the trial and the ledgers' tuned eps."""
    trial = root / "trial-ab12cd34-sigma=1"
    shutil.copytree(small_run.path, trial)
    folder = root / "tuning" / "ledgers"
    tuned = {}
    for index, client in enumerate(TUNED_CLIENTS):
        selection = _selection(1.0 + 0.25 * index)
        with PrivacyLedger.open(folder / f"{client}.jsonl", client_id=client, sampling="poisson",
                                budget=None, accountant="rdp") as ledger:
            ledger.spend_selection(selection, time=0.0, round=-1)
        tuned[client] = make_accountant("rdp", [selection]).epsilon(DELTA)
    summary = json.loads((trial / "summary.json").read_text())
    said = {c: summary_eps if summary_eps is not None else e for c, e in tuned.items()}
    summary["private_tuning"] = {"release": True, "selected_trial": trial.name,
                                 "epsilon_max": max(said.values()), "tuned_epsilon": said}
    (trial / "summary.json").write_text(json.dumps(summary))
    return trial, tuned


def _report(path: Path, capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    code = cli_main(["report", str(path)])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def _compare(path: Path, capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    code = cli_main(["compare", str(path), "--no-plots"])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def test_a_damaged_tuning_ledger_is_reported_as_damaged_not_as_absent(
        small_run: SyntheticRun, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """One bad line appended to one tuning ledger: report and compare stop (exit 2, as for a
    damaged client ledger) saying the tuned eps cannot be verified and why; they never state
    summary.json's lowered figures as the release's privacy "(the sweep's tuning ledgers are
    not beside this trial)"."""
    trial, _ = _tuning_release(small_run, tmp_path / "sweep", summary_eps=0.5)
    damaged = tmp_path / "sweep" / "tuning" / "ledgers" / "c001.jsonl"
    with damaged.open("a") as handle:
        handle.write("x\n")
    for run in (_report(trial, capsys), _compare(trial, capsys)):
        code, out, err = run
        assert code == 2, (out, err)
        assert "c001.jsonl" in err and "a damaged tuning ledger" in err
        assert "tuned eps cannot be verified" in err and "fedsim ledger check" in err
        assert "not beside this trial" not in out + err and "max 0.5" not in out


def test_report_and_compare_verify_the_tuned_eps_in_the_same_words(
        small_run: SyntheticRun, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """compare verified nothing ("its privacy is the tuned eps (max 0.5, summary.json
    private_tuning)"): now both recompute it from the tuning ledgers beside the trial and
    print the same line and warnings; a tuning ledger moved away leaves its client's figure
    said to be unverified; with no tuning folder beside the trial the figures are
    summary.json's, said so."""
    trial, tuned = _tuning_release(small_run, tmp_path / "sweep", summary_eps=0.5)
    code, out, _ = _report(trial, capsys)
    assert code == 0
    [release] = [line for line in out.splitlines() if line.startswith("release privacy")]
    statement = release.removesuffix("; this trial is the tuning's release")
    assert "from its sweep's tuning ledgers" in statement
    assert f"max {max(tuned.values()):.4g}" in statement
    warned = [line for line in out.splitlines() if "summary.json's tuned eps 0.5" in line]
    assert len(warned) == len(TUNED_CLIENTS)
    code, out, _ = _compare(trial, capsys)
    assert code == 0
    assert f"a private tuning's release, whose privacy is not its eps columns (this trial " \
           f"alone): {statement}" in out
    for line in warned:  # the same warnings, after the run's name
        assert line.replace("warning: ", f"warning: {trial.name}: ", 1) in out
    assert (f"tuned eps, max {epsilon_text(max(tuned.values()))} (its tuning ledgers)"
            in figures.tuning_note(RunDirectory.load(trial)))  # (the eps plot's title)

    (tmp_path / "sweep" / "tuning" / "ledgers" / "c002.jsonl").unlink()
    code, out, _ = _report(trial, capsys)
    assert code == 0
    assert "1 client(s) of summary.json's tuned eps have no tuning ledger" in out
    assert "(c002): their tuned eps cannot be verified" in out
    assert "summary.json's, unverified, for 1 client(s) without one" in out

    shutil.rmtree(tmp_path / "sweep" / "tuning")
    code, out, _ = _report(trial, capsys)
    assert code == 0
    assert "(from summary.json (the sweep's tuning ledgers are not beside this trial))" in out
    assert "max 0.5000 (summary.json, unverified)" in figures.tuning_note(
        RunDirectory.load(trial))


def _scenario_run(root: Path, build: Callable[..., SyntheticRun]) -> tuple[Path, list[float]]:
    """A synthetic run whose clients are a scenario's (group c: c-000 to c-003, Poisson
    sampling; group d: d-000, fixed-size batches, replace-one) with its scenario.resolved.yaml
    and summary.json's eps figures. Returns the run directory and its clients' eps."""
    run = build(root, clients=4, id_format="c-{:03d}")
    group = {"count": 4, "data_share": 0.4, "batch_size": 16, "clip": 1.0,
             "noise": {"sigma": 1.0}, "speed": 0.01}
    scenario = {"name": "synthetic", "seed": 7, "stop": {"windows": 12},
                "dataset": {"name": "synthetic", "num_samples": 400, "num_test_samples": 100,
                            "num_features": 6, "num_classes": 3},
                "model": {"name": "logreg"}, "server": {"window": 5.0},
                "clients": {"groups": [{"name": "c", **group},
                                       {"name": "d", **group, "count": 1,
                                        "sampling": "fixed"}]}}
    (root / "scenario.resolved.yaml").write_text(yaml.safe_dump(scenario))
    step = GaussianStep("fixed", 0.05, 1.0)
    with PrivacyLedger.open(root / "ledgers" / "d-000.jsonl", client_id="d-000",
                            sampling="fixed", budget=None, accountant="pld") as ledger:
        for round_index in range(5):
            ledger.spend([step], time=5.0 * (round_index + 1), round=round_index)
    eps = sorted([*(run.final_epsilon(c) for c in run.histories),
                  make_accountant("pld", [step.times(5)]).epsilon(DELTA)])
    summary = json.loads((root / "summary.json").read_text())
    summary["privacy"].update(epsilon_min=eps[0], epsilon_median=eps[2], epsilon_max=eps[-1])
    (root / "summary.json").write_text(json.dumps(summary))
    return root, eps


def _final(root: Path, client: str) -> float:
    from fedsim.reporting.ledgers import read_ledger

    ledger = read_ledger(root / "ledgers" / f"{client}.jsonl")
    return make_accountant("pld", [step for _, step in ledger.steps]).epsilon(DELTA)


def test_report_names_a_scenario_client_whose_ledger_and_row_are_gone(
        tmp_path: Path, build_run_of: Callable[..., SyntheticRun],
        capsys: pytest.CaptureFixture[str]) -> None:
    """With clients.csv and one client's ledger removed, the report printed the others' eps
    spread as the run's with no word, although the scenario lists the client and summary.json's
    max is the removed one's; it also pooled add/remove and replace-one clients into one line
    (each client's sampling was read from clients.csv)."""
    root, eps = _scenario_run(tmp_path / "run", build_run_of)
    code, out, _ = _report(root, capsys)
    assert code == 0 and "warning: " not in out.replace("warning: CLT mu", "")
    assert "replace-one neighbours: eps" in out  # (clients.csv has no d-000: its header)
    (root / "clients.csv").unlink()
    removed = "c-001"  # (its eps is not the median of the five: summary.json's median moves)
    assert _final(root, removed) != pytest.approx(eps[2])
    for name in (f"{removed}.jsonl", f"{removed}.jsonl.hwm"):
        (root / "ledgers" / name).unlink()
    code, out, _ = _report(root, capsys)
    assert code == 0
    assert ("warning: 1 client(s) of the scenario have no ledger in "
            f"{root / 'ledgers'} ({removed})") in out
    assert f"warning: summary.json says eps_median {eps[2]:.6g}, the ledgers give" in out
    privacy = [line for line in out.splitlines() if line.startswith("privacy (")]
    assert [line.split(":")[0].split(", ")[-1] for line in privacy] == [
        "add/remove neighbours", "replace-one neighbours"]


def test_a_scenario_file_that_is_no_scenario_is_said_not_fatal(
        small_run: SyntheticRun, copy_run: Callable[..., SyntheticRun],
        capsys: pytest.CaptureFixture[str]) -> None:
    run = copy_run(small_run)
    (run.path / "scenario.resolved.yaml").write_text("clients: [1, 2\n")
    code, out, _ = _report(run.path, capsys)
    assert code == 0
    assert "the ledgers are not checked against the scenario's clients" in out


def test_a_clients_csv_field_over_the_csv_limit_is_a_config_error(
        small_run: SyntheticRun, copy_run: Callable[..., SyntheticRun],
        edit_clients_csv: Callable[..., Path], capsys: pytest.CaptureFixture[str]) -> None:
    """A 200 KB field gave a _csv.Error traceback (exit 1)."""
    run = copy_run(small_run)
    path = edit_clients_csv(run, 0, group="x" * 200_000)
    code, _, err = _report(run.path, capsys)
    assert code == 2
    assert f"{path}: line 2: not readable as CSV (field larger than field limit" in err


@pytest.mark.parametrize("field", ["scenario", "signal"])
def test_a_long_name_in_a_title_is_cut_not_a_crash(
        small_run: SyntheticRun, copy_run: Callable[..., SyntheticRun],
        edit_summary: Callable[..., dict[str, Any]], capsys: pytest.CaptureFixture[str],
        field: str) -> None:
    """A 2,000-character scenario name (or interrupting signal) in summary.json: matplotlib
    raised "bottom cannot be >= top" laying out the wrapped title."""
    run = copy_run(small_run)
    if field == "scenario":
        edit_summary(run, scenario="A" * 2000)
    else:
        edit_summary(run, interrupted={"signal": "S" * 2000})
    code, out, _ = _report(run.path, capsys)
    assert code == 0
    loaded = RunDirectory.load(run.path)
    name = figures.title_name(loaded)
    assert len(name) <= figures.TITLE_NAME_CHARS
    assert name.endswith("\u2026") == (field == "scenario")
    if field == "scenario":
        assert f"scenario {'A' * 2000}," in out  # the text says it whole
    else:  # the signal's name is read bounded (titles and text print it)
        assert loaded.interrupted is not None and len(loaded.interrupted) <= 40


def test_a_title_of_more_lines_than_the_figure_has_room_for_is_cut(tmp_path: Path) -> None:
    """Whatever makes a title long (a name, a signal, a note), it is wrapped onto at most
    MAX_TITLE_LINES lines, the last ending with an ellipsis: the shared guard against
    matplotlib's "bottom cannot be >= top"."""
    figure, _ = figures.new_figure()
    figure.suptitle(" ".join(["word"] * 2000))
    figures.save(figure, tmp_path / "long.png")
    lines = figure._suptitle.get_text().split("\n")  # type: ignore[attr-defined]
    assert len(lines) == figures.MAX_TITLE_LINES and lines[-1].endswith("\u2026")
    assert (tmp_path / "long.png").stat().st_size > 0


def test_a_ledger_file_name_is_printed_escaped(
        small_run: SyntheticRun, copy_run: Callable[..., SyntheticRun],
        capsys: pytest.CaptureFixture[str]) -> None:
    """A ledger named with a terminal escape sequence and a newline was printed raw in the
    report's error."""
    run = copy_run(small_run)
    (run.path / "ledgers" / "a\x1b[2Jb\nc.jsonl").write_text("x\n")
    code, _, err = _report(run.path, capsys)
    assert code == 2
    assert "a\\x1b[2Jb\\nc.jsonl: line 1" in err
    assert "\x1b" not in err and err.count("\n") == 1


def test_report_verifies_a_releases_tuned_eps_once(
        small_run: SyntheticRun, tmp_path: Path, capsys: pytest.CaptureFixture[str],
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The summary's lines and the eps plot's title state the same verified tuned eps: read
    from the tuning ledgers once (a review found report reading each of them twice)."""
    from fedsim.reporting import ledgers

    trial, _ = _tuning_release(small_run, tmp_path / "sweep")
    calls: list[Path] = []
    verify = ledgers.tuned_privacy

    def counted(run: RunDirectory, tuning: Any) -> Any:
        calls.append(run.path)
        return verify(run, tuning)

    monkeypatch.setattr(ledgers, "tuned_privacy", counted)
    code, out, _ = _report(trial, capsys)
    assert code == 0 and "from its sweep's tuning ledgers" in out
    assert len(calls) == 1


def test_report_checks_summary_json_whatever_accountant_the_ledgers_enforce_with(
        build_run_of: Callable[..., SyntheticRun], edit_summary: Callable[..., dict[str, Any]],
        edit_clients_csv: Callable[..., Path], tmp_path: Path,
        capsys: pytest.CaptureFixture[str]) -> None:
    """summary.json and clients.csv state eps under pld; report checked them against the
    ledgers only where the ledgers enforce with pld (a review edited an rdp run's
    summary.json eps_max to 0.001: compare warned, report did not)."""
    run = build_run_of(tmp_path / "run", clients=4, accountant="rdp")
    edit_summary(run, privacy={"epsilon_max": 0.001})
    edit_clients_csv(run, 0, epsilon="0.001")
    code, out, _ = _report(run.path, capsys)
    assert code == 0
    assert "warning: summary.json says eps_max 0.001, the ledgers give" in out
    assert "warning: client c000: clients.csv says eps 0.001" in out


def test_an_accuracy_that_is_no_accuracy_is_left_out_and_said(
        small_run: SyntheticRun, copy_run: Callable[..., SyntheticRun],
        edit_summary: Callable[..., dict[str, Any]],
        capsys: pytest.CaptureFixture[str]) -> None:
    """An attacker's review: summary.json stating final_accuracy 1e308 and best -5 was printed
    as a 309-digit accuracy, and a metrics line's 400-digit accuracy broke the accuracy plot
    (float() overflows). Neither is an accuracy: the report uses the run's evaluations that
    are, says what it left out, and draws its plots; compare does the same."""
    run = copy_run(small_run)
    edit_summary(run, final_accuracy=1e308, best_accuracy=-5)
    lines = (run.path / "metrics.jsonl").read_text().splitlines()
    rows = [json.loads(line) for line in lines]
    evaluated = [i for i, row in enumerate(rows) if row["accuracy"] is not None]
    honest = [rows[i]["accuracy"] for i in evaluated[:-2]]
    lines[evaluated[-1]] = lines[evaluated[-1]].replace(
        json.dumps(rows[evaluated[-1]]["accuracy"]), "1" + "0" * 400)
    lines[evaluated[-2]] = lines[evaluated[-2]].replace(
        json.dumps(rows[evaluated[-2]]["accuracy"]), "true")
    (run.path / "metrics.jsonl").write_text("\n".join(lines) + "\n")
    code, out, err = _report(run.path, capsys)
    assert code == 0, err
    assert (f"accuracy: last evaluated {honest[-1]:.4f} (summary.json states no final "
            f"accuracy), best {max(honest):.4f}") in out
    assert "000000000" not in out
    assert "summary.json's final_accuracy 1e+308 is not an accuracy" in out
    assert "summary.json's best_accuracy -5 is not an accuracy" in out
    assert "warning: 2 line(s) of metrics.jsonl state an accuracy that is not a number" in out
    assert (run.path / "plots" / "accuracy.png").stat().st_size > 0
    code, out, err = _compare(run.path, capsys)
    assert code == 0, err
    assert "000000000" not in out and f"{honest[-1]:.4f}" in out
    # compare says what it left out too (its final acc is then a metrics line's, not
    # summary.json's): the same sentences as the report, each after the run's name
    name = run.path.name
    assert f"warning: {name}: summary.json's final_accuracy 1e+308 is not an accuracy" in out
    assert f"warning: {name}: summary.json's best_accuracy -5 is not an accuracy" in out
    assert (f"warning: {name}: 2 line(s) of metrics.jsonl state an accuracy that is not a "
            "number") in out


def test_a_damaged_json_file_is_named_with_where_it_breaks(
        small_run: SyntheticRun, copy_run: Callable[[SyntheticRun], SyntheticRun],
        capsys: pytest.CaptureFixture[str]) -> None:
    """A stranger's damaged summary.json was reported as "not JSON (Invalid control
    character at at line 1)": Python's message ends in "at", written to stand before its
    own ": line 1 column 6". The line and column now follow the message once."""
    run = copy_run(small_run)
    (run.path / "summary.json").write_text('{"bad\n', encoding="utf-8")
    assert cli_main(["report", str(run.path)]) == 2
    err = capsys.readouterr().err.strip()
    assert err == (f"fedsim report: error: {run.path / 'summary.json'}: not JSON (Invalid "
                   "control character at line 1, column 6)")
    run = copy_run(small_run)
    metrics = run.path / "metrics.jsonl"
    first, second = metrics.read_text(encoding="utf-8").splitlines()[:2]
    metrics.write_text(f"{first}\n{second[:30]}\n", encoding="utf-8")  # a torn second line
    assert cli_main(["report", str(run.path)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith(f"fedsim report: error: {metrics}:2: not JSON (Unterminated string "
                          "starting at column ") and " at at " not in err, err
