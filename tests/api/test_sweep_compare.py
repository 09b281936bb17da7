"""``fedsim sweep`` (grid x seeds, one run directory each, sweep.csv / sweep.json, --jobs) and
``fedsim compare`` (table, stop reasons by kind, overlaid plots); ``report A B`` points there."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest
import yaml

from fedsim.cli import main
from fedsim.reporting.rundir import RunDirectory

GRID = "clients.groups[*].noise.sigma=1.0,2.0"


def _rows(path: Path) -> list[dict[str, str]]:
    with path.open(encoding="utf-8", newline="") as handle:
        return list(csv.DictReader(handle))


@pytest.mark.slow
def test_sweep_runs_every_combination_and_jobs_do_not_change_results(
        tiny_scenario: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    parallel, serial = tmp_path / "parallel", tmp_path / "serial"
    assert main(["sweep", str(tiny_scenario), "--grid", GRID, "--seeds", "0,3", "--jobs", "2",
                 "--out", str(parallel), "--no-plots"]) == 0
    rows = _rows(parallel / "sweep.csv")
    assert [(r["clients.groups[*].noise.sigma"], r["seed"]) for r in rows] == [
        ("1.0", "0"), ("1.0", "3"), ("2.0", "0"), ("2.0", "3")]
    table = json.loads((parallel / "sweep.json").read_text())
    assert table["grid"] == {"clients.groups[*].noise.sigma": ["1.0", "2.0"]}
    for row, entry in zip(rows, table["runs"], strict=True):
        run = parallel / row["run"]
        resolved = yaml.safe_load((run / "scenario.resolved.yaml").read_text())
        assert resolved["seed"] == int(row["seed"])
        assert {g["noise"]["sigma"] for g in resolved["clients"]["groups"]} == {
            float(row["clients.groups[*].noise.sigma"])}
        summary = RunDirectory.load(run).summary
        assert entry["final_accuracy"] == summary["final_accuracy"]
        assert entry["eps_max"] == summary["privacy"]["epsilon_max"]
        assert entry["virtual_time"] == summary["virtual_time"]
        assert row["status"] == "ok"
    # more noise, less privacy spent by the end: sigma 1.0 runs into the budgets, 2.0 does not
    by_sigma = {r["clients.groups[*].noise.sigma"]: r for r in rows}
    assert float(by_sigma["2.0"]["eps_max"]) < float(by_sigma["1.0"]["eps_max"]) <= 5.0
    assert by_sigma["1.0"]["stops"] == "budget=4" and by_sigma["2.0"]["stops"] == ""
    # The same sweep one run at a time gives the same table (runs depend on scenario and seed).
    assert main(["sweep", str(tiny_scenario), "--grid", GRID, "--seeds", "0,3",
                 "--out", str(serial), "--no-plots"]) == 0
    strip = [{k: v for k, v in r.items() if k != "wall_seconds"} for r in _rows(serial / "sweep.csv")]
    assert strip == [{k: v for k, v in r.items() if k != "wall_seconds"} for r in rows]
    out = capsys.readouterr().out
    assert "table:" in out
    # Its clients are Poisson and fixed-size: the table says so, with compare's own note.
    note = ("note: every run's eps columns span add/remove and replace-one clients, guarantees "
            "about different neighbours")
    assert table["notes"] and table["notes"][0].startswith(note)
    assert out.splitlines()[-2] == table["notes"][0]
    assert main(["compare", *(str(serial / r["run"]) for r in rows), "--no-plots"]) == 0
    assert table["notes"][0] in capsys.readouterr().out.splitlines()


def test_sweep_refuses_before_running(tiny_scenario: Path, tmp_path: Path,
                                      capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "never"
    assert main(["sweep", str(tiny_scenario), "--grid", "clients.groups[tablet].batch_size=8,16",
                 "--out", str(out)]) == 2
    assert "no group named 'tablet' (groups: phone, laptop)" in capsys.readouterr().err
    assert main(["sweep", str(tiny_scenario), "--grid", "clients.groups[*].batch_size=8,-1",
                 "--out", str(out)]) == 2
    err = capsys.readouterr().err
    # The run at fault is named by the --grid value that made it (its path was a --set line).
    assert "the sweep's run --grid clients.groups[*].batch_size=-1: " in err
    assert "batch_size" in err
    assert main(["sweep", str(tiny_scenario), "--grid", "clients.grups[*].batch_size=8",
                 "--out", str(out)]) == 2
    assert "clients.grups is not in the scenario - did you mean 'groups'?" in \
        capsys.readouterr().err
    assert not out.exists()


def test_compare_table_and_plots(tiny_scenario: Path, tmp_path: Path,
                                 capsys: pytest.CaptureFixture[str]) -> None:
    low, high = tmp_path / "low", tmp_path / "high"
    assert main(["run", str(tiny_scenario), "--out", str(low), "--no-plots"]) == 0
    assert main(["run", str(tiny_scenario), "--out", str(high), "--no-plots",
                 "--set", "clients.groups[*].noise.sigma=2.0"]) == 0
    capsys.readouterr()
    plots = tmp_path / "cmp"
    assert main(["compare", str(low), str(high), "--plots", str(plots), "--json"]) == 0
    answer = json.loads(capsys.readouterr().out)
    rows = {row["run"]: row for row in answer["runs"]}
    for name, path in (("low", low), ("high", high)):
        summary = json.loads((path / "summary.json").read_text())
        clients = RunDirectory.load(path).clients
        epsilons = sorted(c["epsilon"] for c in clients)
        assert rows[name]["final_accuracy"] == summary["final_accuracy"]
        assert rows[name]["eps_min"] == pytest.approx(epsilons[0], rel=1e-12)
        assert rows[name]["eps_max"] == pytest.approx(epsilons[-1], rel=1e-12)
        assert rows[name]["virtual_time"] == summary["virtual_time"]
        budget_stops = sum("budget" in c["stop_reason"] for c in clients)
        assert rows[name]["stops"] == ({"budget": budget_stops} if budget_stops else {})
    assert rows["low"]["stops"] == {"budget": 4}
    for png in ("accuracy.png", "epsilon.png"):
        assert (plots / png).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert main(["compare", str(low), str(high), "--no-plots"]) == 0
    text = capsys.readouterr().out
    assert "budget 4" in text and "final acc" in text and "eps median" in text


def test_report_with_two_directories_points_to_compare(
        tiny_scenario: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["report", str(tmp_path / "a"), str(tmp_path / "b")]) == 2
    assert f"fedsim compare {tmp_path / 'a'} {tmp_path / 'b'}" in capsys.readouterr().err


def test_compare_shows_an_interrupted_run_that_lies_under_a_finished_one(
        tiny_scenario: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    """Issue 27, finding 8: an interrupted run of the same scenario and seed is the finished
    run's prefix; a plain line lay hidden under it. It now has markers, a cross where it
    stopped and a label that says it was interrupted."""
    from fedsim.reporting import compare

    full, cut = tmp_path / "full", tmp_path / "cut"
    assert main(["run", str(tiny_scenario), "--out", str(full), "--no-plots"]) == 0
    assert main(["run", str(tiny_scenario), "--out", str(cut), "--no-plots",
                 "--set", "stop.windows=4"]) == 0
    summary = json.loads((cut / "summary.json").read_text())
    summary["interrupted"] = {"signal": "SIGINT", "partial": True}
    (cut / "summary.json").write_text(json.dumps(summary))
    figures = {}
    original = compare._save

    def recording_save(figure, path, **options):  # type: ignore[no-untyped-def]
        figures[path.name] = figure
        return original(figure, path, **options)

    monkeypatch.setattr(compare, "_save", recording_save)
    capsys.readouterr()
    assert main(["compare", str(full), str(cut), "--plots", str(tmp_path / "cmp")]) == 0
    for name in ("accuracy.png", "epsilon.png"):
        axes = figures[name].axes[0]
        lines = {line.get_label(): line for line in axes.get_lines()}
        interrupted = lines["cut (interrupted by SIGINT)"]
        assert interrupted.get_marker() == "o" or name == "epsilon.png"
        # a cross at its last point
        crosses = [line for line in axes.get_lines() if line.get_marker() == "X"
                   and len(line.get_xdata()) == 1]
        assert crosses and crosses[0].get_xdata()[0] == interrupted.get_xdata()[-1]
        assert axes.get_xlabel() == "virtual time (s)"
    # The table says it too (a stranger read the cut run's row as a finished run's).
    table = capsys.readouterr().out.splitlines()
    assert "ended" in table[0]
    rows = {line.split()[0]: line for line in table[2:4]}
    assert "interrupted (SIGINT)" in rows["cut"] and "interrupted" not in rows["full"]
    ended = json.loads((full / "summary.json").read_text())["stop_kind"]
    assert f" {ended} " in rows["full"]


def test_report_and_compare_read_an_rdp_run(tiny_scenario: Path, tmp_path: Path,
                                            capsys: pytest.CaptureFixture[str]) -> None:
    """A run whose ledgers enforce with rdp: its plots, report and compare work (the epsilon
    cache's key held the rdp orders' list: TypeError), and compare's eps is pld's, as
    summary.json reports it, with no false disagreement (a review of session 49's change)."""
    import fedsim

    run = tmp_path / "rdp"
    fedsim.simulate(tiny_scenario, out=run, overrides={"clients.groups[*].accountant": "rdp",
                                                       "stop.windows": 4})
    assert (run / "plots" / "epsilon.png").exists()
    assert main(["report", str(run)]) == 0
    capsys.readouterr()
    assert main(["compare", str(run), "--no-plots", "--json"]) == 0
    (row,) = json.loads(capsys.readouterr().out)["runs"]
    privacy = json.loads((run / "summary.json").read_text())["privacy"]
    assert row["eps_max"] == pytest.approx(privacy["epsilon_max"], rel=1e-3)
    assert row["warnings"] == []


def test_an_interrupted_sweep_keeps_the_table_of_its_finished_runs(
        tiny_scenario: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    """A stranger's Ctrl-C after 3 of 6 runs left no sweep.csv or sweep.json (and the
    directory, not empty, could not be swept again)."""
    from fedsim.commands import sweep

    real, calls = sweep.run_one, []

    def first_then_ctrl_c(*args: object, **kwargs: object) -> dict[str, object]:
        calls.append(args)
        if len(calls) > 1:
            raise KeyboardInterrupt
        return real(*args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(sweep, "run_one", first_then_ctrl_c)
    out = tmp_path / "sweep"
    assert main(["sweep", str(tiny_scenario), "--grid", "clients.groups[*].noise.sigma=1.0,1.5,2.0",
                 "--out", str(out), "--no-plots"]) == 130
    rows = _rows(out / "sweep.csv")
    assert [r["status"] for r in rows] == ["ok", *["not run: the sweep was interrupted"] * 2]
    assert rows[0]["final_accuracy"] != ""
    table = json.loads((out / "sweep.json").read_text())
    assert table["interrupted"] is True and len(table["runs"]) == 3
    captured = capsys.readouterr()
    # (a stranger: it said "table of the finished runs" over rows not run)
    assert "interrupted by SIGINT; table of every run, its status finished, partial or not " \
        "run: " in captured.out


def test_an_interrupted_parallel_sweep_keeps_a_run_that_finished_out_of_order(
        tiny_scenario: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """With --jobs above 1 the rows were collected in the plans' order, so a Ctrl-C while the
    first run was still going listed the second, finished, as not run (a stranger's)."""
    import concurrent.futures

    from fedsim.commands import sweep

    def last_first_then_ctrl_c(futures):  # type: ignore[no-untyped-def]
        concurrent.futures.wait(futures)  # both finished; the later plan is reported first
        yield max(futures, key=futures.__getitem__)
        raise KeyboardInterrupt

    monkeypatch.setattr(sweep, "as_completed", last_first_then_ctrl_c)
    out = tmp_path / "sweep"
    assert main(["sweep", str(tiny_scenario), "--grid", "clients.groups[*].noise.sigma=1.0,1.5",
                 "--out", str(out), "--no-plots", "--jobs", "2"]) == 130
    rows = _rows(out / "sweep.csv")
    # both had finished: the one reported and the one the interrupt cut off from its report
    assert [r["status"] for r in rows] == ["ok", "ok"]
    assert rows[0]["final_accuracy"] != "" and rows[1]["final_accuracy"] != ""


def test_an_interrupted_parallel_sweep_starts_no_queued_run_and_lists_what_it_finished(
        tiny_scenario: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A review: after the interrupt the pool's exit still started every queued run, ran it
    to its end and listed it as not run. Now the queued ones are cancelled, the running ones
    interrupted (a second review: they were waited out), and a row says "ok" exactly where a
    run directory holds a finished run's summary, "interrupted: partial run" where it holds an
    interrupted one's."""
    import concurrent.futures

    from fedsim.commands import sweep

    def first_then_ctrl_c(futures):  # type: ignore[no-untyped-def]
        finished, _ = concurrent.futures.wait(futures, return_when="FIRST_COMPLETED")
        yield next(iter(finished))
        raise KeyboardInterrupt

    monkeypatch.setattr(sweep, "as_completed", first_then_ctrl_c)
    out = tmp_path / "sweep"
    sigmas = "1.0,1.2,1.4,1.6,1.8,2.0,2.2,2.4,2.6,2.8"
    assert main(["sweep", str(tiny_scenario), "--grid", f"clients.groups[*].noise.sigma={sigmas}",
                 "--out", str(out), "--no-plots", "--jobs", "2"]) == 130
    rows = _rows(out / "sweep.csv")
    assert len(rows) == 10
    for row in rows:
        summary = out / row["run"] / "summary.json"
        cut = summary.exists() and "interrupted" in json.loads(summary.read_text())
        assert (row["status"] == "ok") == (summary.exists() and not cut), row
        assert (row["status"] == "interrupted: partial run") == cut, row
    # At most 7 ever start: those finished when the interrupt came (one, rarely two), 2
    # running and the 3 the pool had handed to its workers' queue (max_workers + 1); the
    # rest are cancelled (before, all 10 ran).
    assert sum(row["status"] != "ok" for row in rows) >= 3


@pytest.mark.slow
@pytest.mark.parametrize(("name", "jobs", "target", "twice", "status"), [
    ("SIGINT", 2, "group", False, 130),  # a terminal's Ctrl-C reaches every process
    ("SIGTERM", 2, "group", False, 143),  # a batch scheduler's stop of a job's every process
    ("SIGTERM", 1, "sweep", False, 143),  # `timeout`'s, or kill PID: the sweep's own only
    # A review: the sweep alone signalled waited for its running runs to finish; signalled
    # twice it hung for ever in its pool's shutdown; one worker signalled ran on and the
    # sweep said SIGINT.
    ("SIGTERM", 2, "sweep", False, 143),
    ("SIGTERM", 2, "sweep", True, 143),
    ("SIGTERM", 2, "group", True, 143),
    ("SIGTERM", 2, "worker", False, 143),
])
def test_a_real_signal_leaves_a_sweep_table_that_matches_its_run_directories(
        tiny_scenario: Path, tmp_path: Path, name: str, jobs: int, target: str, twice: bool,
        status: int) -> None:
    """A stranger's Ctrl-C (SIGINT to the process group) during `sweep --jobs 2`: two runs
    that had written their summaries were listed as not run, and a queued run started after
    the signal (the pool's workers outlive it) and was the one listed as done. Now every row
    says what its run directory holds, and no run starts after the signal. A second
    stranger's SIGTERM killed the sweep: no table, and a run directory without its summary;
    it now stops the sweep as Ctrl-C does."""
    import os
    import signal
    import subprocess
    import sys
    import time

    out = tmp_path / "sweep"
    sigmas = ",".join(f"{1.0 + 0.1 * k:.1f}" for k in range(8))
    process = subprocess.Popen(
        [sys.executable, "-m", "fedsim", "sweep", str(tiny_scenario), "--grid",
         f"clients.groups[*].noise.sigma={sigmas}", "--out", str(out), "--no-plots",
         "--jobs", str(jobs), "--set", "stop.windows=400"],
        start_new_session=True, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        # a job a shell starts with `&` inherits SIGINT ignored, and Python keeps ignoring it
        # (CI's run did: the sweep never saw the Ctrl-C); a terminal's Ctrl-C is the default
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    try:
        deadline = time.monotonic() + 120
        while not list(out.glob("*/summary.json")) and time.monotonic() < deadline:
            time.sleep(0.2)  # a run finished: the others are running or queued
        interrupted_at = time.time()
        number = getattr(signal, name)
        for _ in range(2 if twice else 1):
            if target == "group":
                os.killpg(process.pid, number)
            elif target == "sweep":
                os.kill(process.pid, number)
            else:  # one of the sweep's workers
                children = subprocess.run(["pgrep", "-P", str(process.pid), "-f", "spawn_main"],
                                          capture_output=True, text=True).stdout.split()
                os.kill(int(children[0]), number)
            time.sleep(0.3)
        out_text, err = process.communicate(timeout=120)
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()
    assert process.returncode == status, err
    assert f"interrupted by {name}; table of every run, its status" in out_text, out_text
    rows = _rows(out / "sweep.csv")
    assert len(rows) == 8
    for row in rows:
        summary = out / row["run"] / "summary.json"
        if row["status"] == "not run: the sweep was interrupted":
            assert not summary.exists(), row
            continue
        written = json.loads(summary.read_text())
        assert row["status"] == ("interrupted: partial run" if written.get("interrupted")
                                 else "ok"), row
        metrics = out / row["run"] / "metrics.jsonl"
        first_window = metrics.stat().st_mtime if metrics.exists() else interrupted_at
        started = min(p.stat().st_mtime for p in (out / row["run"]).rglob("*"))
        assert started <= interrupted_at + 1.0 or first_window <= interrupted_at + 1.0, \
            f"{row['run']} started after the interrupt"
    assert any(row["status"] == "not run: the sweep was interrupted" for row in rows)


def test_a_sweep_value_given_twice_is_refused(tiny_scenario: Path, tmp_path: Path,
                                              capsys: pytest.CaptureFixture[str]) -> None:
    """A stranger's `--grid stop.windows=4,4` ran the same run twice, in two directories."""
    out = tmp_path / "never"
    assert main(["sweep", str(tiny_scenario), "--grid", "stop.windows=4,4", "--out",
                 str(out)]) == 2
    assert "--grid stop.windows: the value '4' is given twice" in capsys.readouterr().err
    assert not out.exists()


def test_a_grid_of_seeds_with_seeds_is_refused(tiny_scenario: Path, tmp_path: Path,
                                              capsys: pytest.CaptureFixture[str]) -> None:
    """A stranger's `--grid seed=1,2 --seeds 3` ran seed 3 twice, in directories named
    seed=1 and seed=2 whose grid column read 3 (--seeds sets every run's seed)."""
    out = tmp_path / "never"
    assert main(["sweep", str(tiny_scenario), "--grid", "seed=1,2", "--seeds", "3", "--out",
                 str(out)]) == 2
    assert "--grid seed=... and --seeds both set the seed: give the seeds with --seeds alone" \
        in capsys.readouterr().err
    assert not out.exists()
