"""``fedsim launch`` as a newcomer uses it (issue 27, finding 5): Ctrl-C (SIGINT to the whole
process group, as a terminal sends it) still leaves a run directory ``fedsim report`` reads,
with a partial summary that says so; a second launch of the same scenario goes to a fresh
directory with a numeric suffix, as ``fedsim run`` does, instead of being refused."""

from __future__ import annotations

import csv
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from fedsim.cli import main
from fedsim.transports.broker import find_mosquitto

pytestmark = [
    pytest.mark.mqtt,
    pytest.mark.slow,
    pytest.mark.skipif(find_mosquitto() is None, reason="mosquitto is not installed"),
]

ROOT = Path(__file__).resolve().parents[2]
SCENARIO = Path(__file__).with_name("four_clients.yaml")


def _launch(cwd: Path, *extra: str) -> subprocess.Popen[str]:
    """``fedsim launch four_clients.yaml`` with the default run directory, in its own session
    (so a signal can go to its whole process group, as Ctrl-C's does)."""
    return subprocess.Popen(
        [sys.executable, "-m", "fedsim", "launch", str(SCENARIO), "--time-scale", "0.25",
         "--max-backoff", "1", "--no-plots", "--timeout", "100", *extra],
        cwd=cwd, env={**os.environ, "PYTHONPATH": str(ROOT)}, stdout=subprocess.PIPE,
        stderr=subprocess.PIPE, text=True, start_new_session=True)


def test_an_interrupted_launch_leaves_a_run_directory_and_a_second_gets_a_suffix(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    first = tmp_path / "runs" / "deploy-four-launch"
    proc = _launch(tmp_path, "--set", "stop.windows=400")
    metrics = first / "metrics.jsonl"
    deadline = time.monotonic() + 150
    while time.monotonic() < deadline:
        if metrics.exists() and len(metrics.read_text().splitlines()) >= 3:
            break
        time.sleep(0.2)
    else:
        os.killpg(proc.pid, signal.SIGKILL)
        pytest.fail(f"the launch did not get going: {proc.communicate()}")
    os.killpg(proc.pid, signal.SIGINT)  # Ctrl-C: to the terminal's whole foreground group
    stdout, stderr = proc.communicate(timeout=120)
    assert proc.returncode == 130, stderr
    # The launcher alone got it (its processes are in groups of their own) and stopped the
    # clients first, while the server and the broker were still there to acknowledge what
    # they sent: every client exits 0 with its report (a stranger: all were SIGKILLed, the
    # server and broker gone under them), then the server, then the broker; nothing is left.
    processes = json.loads((first / "processes.json").read_text())
    assert {name: p["exit_codes"] for name, p in processes.items()} == {
        name: [0] for name in processes}
    for client in (name for name in processes if name != "server"):
        assert (first / "state" / client / f"client-{client}.json").is_file()
    assert _processes_in(tmp_path) == []
    assert "interrupted by SIGINT" in stdout and "Traceback" not in stderr
    summary = json.loads((first / "summary.json").read_text())
    lines = [json.loads(line) for line in metrics.read_text().splitlines()]
    assert summary["interrupted"] == {"signal": "SIGINT", "partial": True}
    assert summary["windows"] == len(lines) >= 3
    assert summary["stop_reason"].startswith(
        f"it was interrupted by SIGINT after window {len(lines)} (scenario time")
    assert main(["report", str(first)]) == 0
    assert "interrupted by SIGINT" in capsys.readouterr().out

    second = _launch(tmp_path, "--set", "stop.windows=4")
    stdout, stderr = second.communicate(timeout=150)
    assert second.returncode == 0, stderr
    again = tmp_path / "runs" / "deploy-four-launch-1"
    assert stdout.startswith(f"{Path('runs') / 'deploy-four-launch-1'}: 4 windows")
    done = json.loads((again / "summary.json").read_text())
    assert "interrupted" not in done
    # The final model is the one evaluated (finding 7, deployed).
    assert done["final_evaluated_version"] == done["final_version"] > 0


def _processes_in(directory: Path) -> list[str]:
    """The processes (``pid: command``) whose working directory is ``directory`` (a launch's
    processes and its mosquitto inherit the launcher's)."""
    found = []
    for entry in Path("/proc").iterdir():
        try:
            if entry.name.isdigit() and Path(os.readlink(entry / "cwd")) == directory:
                found.append(f"{entry.name}: {(entry / 'cmdline').read_bytes()[:200]!r}")
        except OSError:  # gone meanwhile, or not ours to read
            continue
    return found


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="binding needs Linux prctl")
def test_a_killed_launcher_leaves_no_process_behind(tmp_path: Path) -> None:
    """A launcher killed outright (SIGKILL: no stop of its own) does not leave its processes
    or its private mosquitto running in their own groups: each is bound to it and stops."""
    proc = _launch(tmp_path, "--set", "stop.windows=400")
    metrics = tmp_path / "runs" / "deploy-four-launch" / "metrics.jsonl"
    deadline = time.monotonic() + 150
    while not (metrics.exists() and metrics.read_text().count("\n") >= 2):
        if time.monotonic() > deadline:
            os.killpg(proc.pid, signal.SIGKILL)
            pytest.fail(f"the launch did not get going: {proc.communicate()}")
        time.sleep(0.2)
    assert len(_processes_in(tmp_path)) >= 7  # launcher, mosquitto, server, four clients
    proc.kill()
    proc.communicate(timeout=30)
    deadline = time.monotonic() + 60
    while (left := _processes_in(tmp_path)) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert left == []


def _three_windows(proc: subprocess.Popen[str], out: Path) -> Path:
    """The launch's ``metrics.jsonl`` once it holds three windows (the launch killed and the
    test failed if it does not get there in 150 s)."""
    metrics = out / "metrics.jsonl"
    deadline = time.monotonic() + 150
    while not (metrics.exists() and len(metrics.read_text().splitlines()) >= 3):
        if time.monotonic() > deadline:
            os.killpg(proc.pid, signal.SIGKILL)
            pytest.fail(f"the launch did not get going: {proc.communicate()}")
        time.sleep(0.2)
    return metrics


def _resume(cwd: Path, out: Path) -> subprocess.CompletedProcess[str]:
    """``fedsim launch --resume out``, run to its end."""
    return subprocess.run(
        [sys.executable, "-m", "fedsim", "launch", "--resume", str(out), "--time-scale",
         "0.25", "--max-backoff", "1", "--no-plots", "--timeout", "100"],
        cwd=cwd, env={**os.environ, "PYTHONPATH": str(ROOT)}, capture_output=True,
        text=True, timeout=200)


def test_an_interrupted_launch_resumes_to_its_end(tmp_path: Path,
                                                  capsys: pytest.CaptureFixture[str]) -> None:
    """A stranger could not resume an interrupted launch (the same command refused its
    directory), and resuming by hand left its report stale (43 windows "interrupted" over a
    metrics file of 80, ledgers of 20 records beside state ledgers of 43). ``fedsim launch
    --resume DIR`` starts its processes again from their state and writes the directory anew."""
    out = tmp_path / "runs" / "deploy-four-launch"
    proc = _launch(tmp_path, "--set", "stop.windows=14")
    metrics = _three_windows(proc, out)
    os.killpg(proc.pid, signal.SIGINT)
    stdout, stderr = proc.communicate(timeout=120)
    assert proc.returncode == 130, stderr
    assert f"'fedsim launch --resume {Path('runs') / 'deploy-four-launch'}' goes on" in stdout
    cut = len(metrics.read_text().splitlines())
    assert cut < 14
    # The same launch again is refused, and says how to go on
    assert main(["launch", str(SCENARIO), "--out", str(out)]) == 2
    assert f"fedsim launch --resume {out}" in capsys.readouterr().err
    resumed = _resume(tmp_path, out)
    assert resumed.returncode == 0, resumed.stderr
    # Off a terminal it says how the run goes, as fedsim run does (a stranger saw 43 s of
    # silence): a log line a window that evaluated the model.
    assert '"event": "window"' in resumed.stderr and '"accuracy"' in resumed.stderr
    summary = json.loads((out / "summary.json").read_text())
    assert "interrupted" not in summary and summary["windows"] == 14
    # ... and says it ran in two parts (a stranger: nothing but server.json said so)
    assert summary["resumed"] == {"parts": 2, "last_from_window": cut}
    assert f"It ran in 2 parts: interrupted and resumed (fedsim launch --resume), the last " \
           f"from window {cut}." in summary["explanation"]
    lines = [json.loads(line) for line in metrics.read_text().splitlines()]
    assert [m["window"] for m in lines] == list(range(1, 15))
    # The resumed server waited for its restarted clients (a review: 1-6 windows passed
    # empty while they started): the first window after the cut applies their updates.
    # (the first or, on a loaded machine where a round takes longer than a window of 0.25
    # wall s, the second: without the wait 1-6 windows passed empty)
    assert lines[cut]["applied"] > 0 or lines[cut + 1]["applied"] > 0, lines[cut:]
    server = json.loads((out / "server.json").read_text())
    # Every client's stop is within the run's span, on its clock: those the end stopped, at
    # the end (a stranger: 18.27-18.93 s after a run that ended at 14.10 s)
    assert server["finished"] is True and server["resumed_from_window"] == cut and {
        (e["kind"], e["time"]) for e in summary["stopped"]} == {
        ("server_finished", summary["virtual_time"])}
    processes = json.loads((out / "processes.json").read_text())
    assert {name: (p["starts"], p["exit_codes"]) for name, p in processes.items()  # unclean
            if p["starts"] != 2 or p["exit_codes"] != [0, 0]} == {}
    # The resumed server's command line differs (it waits for its restarted clients), so the
    # first part's is kept; the clients' differ only in the private broker's port: not kept.
    [first_server] = processes["server"]["earlier_commands"]
    assert "--wait-on-resume" in processes["server"]["command"] and \
        "--wait-on-resume" not in first_server
    assert not any("earlier_commands" in p for name, p in processes.items() if name != "server")
    acked = 0
    for client in (name for name in processes if name != "server"):
        state = out / "state" / client / "ledgers" / f"{client}.jsonl"
        assert (out / "ledgers" / f"{client}.jsonl").read_bytes() == state.read_bytes()
        # Its counts are over both processes, as its released rounds are (a stranger: they
        # were the last part's): every round it released was acknowledged, given up (stale
        # beyond max_staleness while unacknowledged, which a loaded machine's late receipts
        # make happen, or an outbox overflow, or another run's), or is listed.
        report = json.loads((out / "state" / client / f"client-{client}.json").read_text())
        counts = report["mqtt"]
        given_up = counts["expired"] + counts["abandoned"] + counts["other_run"]
        assert counts["acked"] + given_up + len(report["unacknowledged"]) == \
            len(report["released"]), counts
        acked += report["mqtt"]["acked"]
    assert server["mqtt"]["received"] >= acked  # the server's too, over both parts
    assert main(["report", str(out)]) == 0
    assert "interrupted by" not in capsys.readouterr().out
    # an ended launch has nothing to resume, and a new launch there is told so (not to resume)
    assert main(["launch", "--resume", str(out)]) == 2
    assert "its run ended" in capsys.readouterr().err
    assert main(["launch", str(SCENARIO), "--out", str(out)]) == 2
    assert "holds a launch that ended; choose a new --out" in capsys.readouterr().err


def test_after_a_resume_clients_stop_times_lie_within_the_runs_span(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A launch interrupted (SIGTERM) and resumed, whose clients then spend their budgets (11
    rounds of eps 2.1) and the run stops on spent budgets: each client's stop time in the
    summary, clients.csv and the report lies within the run's span, before its end (they
    stop before it on one clock: the server's), where a stranger's resumed launch listed them
    4.5 s past the end (each on its own clock, which started where its ledger ended, ahead of
    the resumed server's)."""
    out = tmp_path / "runs" / "deploy-four-launch"
    budget = ("--set", "clients.groups[0].budget.epsilon=2.1", "--set", "stop.windows=60")
    proc = _launch(tmp_path, *budget)
    metrics = _three_windows(proc, out)
    os.kill(proc.pid, signal.SIGTERM)
    _, stderr = proc.communicate(timeout=120)
    assert proc.returncode == 128 + signal.SIGTERM, stderr
    cut = len(metrics.read_text().splitlines())
    resumed = _resume(tmp_path, out)
    assert resumed.returncode == 0, resumed.stderr
    summary = json.loads((out / "summary.json").read_text())
    assert summary["resumed"]["parts"] == 2 and summary["stop_kind"] == "budgets_spent"
    end = summary["virtual_time"]
    assert summary["windows"] > cut and end > 0
    stops = {e["client_id"]: e for e in summary["stopped"]}
    assert sorted(stops) == ["c-000", "c-001", "c-002", "c-003"]
    assert {e["kind"] for e in stops.values()} == {"budget"}
    for entry in stops.values():
        assert 0 <= entry["time"] < end, (entry, end)
    with (out / "clients.csv").open() as handle:
        rows = list(csv.DictReader(handle))
    assert {r["client_id"]: float(r["stopped_at"]) for r in rows} == {
        c: e["time"] for c, e in stops.items()}
    low, high = min(e["time"] for e in stops.values()), max(e["time"] for e in stops.values())
    assert f"4 client(s) stopped between {low:.2f} s and {high:.2f} s because their next " \
        in summary["explanation"]
    assert f"The run stopped at scenario time {end:.2f} s" in summary["explanation"]
    assert main(["report", str(out)]) == 0
    assert "Traceback" not in capsys.readouterr().err


def test_a_timed_out_launch_leaves_a_partial_summary_and_can_go_on(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A stranger's launch past its --timeout left metrics.jsonl and the state, but no
    summary.json until it was resumed: `fedsim report` had nothing to read. It now writes the
    partial summary an interrupted launch writes, says where, and can still go on."""
    out = tmp_path / "run"
    launch = subprocess.run(
        [sys.executable, "-m", "fedsim", "launch", str(SCENARIO), "--out", str(out),
         "--set", "stop.windows=4000", "--time-scale", "0.25", "--max-backoff", "1",
         "--no-plots", "--timeout", "12"],
        cwd=tmp_path, env={**os.environ, "PYTHONPATH": str(ROOT)}, capture_output=True,
        text=True, timeout=200)
    assert launch.returncode == 1, launch.stderr
    assert f"its partial summary is in {out / 'summary.json'}; its processes were stopped: " \
           f"'fedsim launch --resume {out} --timeout SECONDS' goes on with it" in launch.stderr
    summary = json.loads((out / "summary.json").read_text())
    lines = (out / "metrics.jsonl").read_text().splitlines()
    assert summary["interrupted"] == {"signal": "SIGTERM", "partial": True}
    assert summary["windows"] == len(lines)
    assert summary["stop_reason"].startswith(
        f"it was interrupted by the launch at its --timeout of 12 wall seconds "
        f"after window {len(lines)} (scenario time")
    assert summary["stop_kind"] == "signal"
    assert main(["report", str(out)]) == 0
    assert "--timeout of 12 wall seconds" in capsys.readouterr().out
    processes = json.loads((out / "processes.json").read_text())
    assert all(p["exit_codes"] for p in processes.values())
    server = json.loads((out / "server.json").read_text())
    assert server["finished"] is False  # what --resume goes on with
    assert _processes_in(tmp_path) == []
