"""The terminal side of ``fedsim run``: the progress bar's total is the run's horizon, log lines
never garble the bar, --quiet / --verbose / --log-level, per-client events summarised for large
populations, and an interrupted run (SIGINT, SIGTERM) leaves a partial summary that
``fedsim report`` reads."""

from __future__ import annotations

import fcntl
import json
import os
import pty
import re
import signal
import struct
import subprocess
import sys
import termios
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml

from fedsim.cli import main

ROOT = Path(__file__).resolve().parents[2]
ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")


def scenario(**stop: Any) -> dict[str, Any]:
    return {
        "name": "terminal",
        "seed": 2,
        "stop": stop or {"windows": 30},
        "dataset": {"name": "synthetic", "num_samples": 600, "num_test_samples": 100,
                    "num_features": 6, "num_classes": 3},
        "model": {"name": "logreg"},
        "clients": {"groups": [
            {"name": "a", "count": 3, "data_share": 1.0, "batch_size": 20, "clip": 1.0,
             "noise": 1.0, "speed": 0.01, "budget": {"epsilon": 1.0, "delta": 1e-5}},
        ]},
        "server": {"window": 0.5, "eval_every": 4},
    }


def write(tmp_path: Path, data: dict[str, Any]) -> Path:
    path = tmp_path / "scenario.yaml"
    path.write_text(yaml.safe_dump(data), encoding="utf-8")
    return path


def env() -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(ROOT), "COLUMNS": "150"}


def run_on_terminal(args: list[str]) -> tuple[int, str]:
    """Run ``python -m fedsim ARGS`` with stderr and stdout on a 150-column pseudo-terminal."""
    leader, follower = pty.openpty()
    fcntl.ioctl(follower, termios.TIOCSWINSZ, struct.pack("HHHH", 40, 150, 0, 0))
    proc = subprocess.Popen([sys.executable, "-m", "fedsim", *args], stdout=follower,
                            stderr=follower, stdin=subprocess.DEVNULL, env=env(), cwd=ROOT)
    os.close(follower)
    output = b""
    while True:
        try:
            chunk = os.read(leader, 65536)
        except OSError:  # the terminal closed: all output read
            break
        if not chunk:
            break
        output += chunk
    os.close(leader)
    return proc.wait(timeout=120), ANSI.sub("", output.decode("utf-8", "replace"))


@pytest.mark.slow
def test_bar_total_is_the_horizon_and_log_lines_keep_their_own_lines(tmp_path: Path) -> None:
    path = write(tmp_path, scenario(windows=30))  # 30 windows of 0.5 s: the bar ends at 15 s
    data = yaml.safe_load(path.read_text())
    data["stop"]["all_budgets_spent"] = False
    path.write_text(yaml.safe_dump(data))
    code, text = run_on_terminal(["run", str(path), "--out", str(tmp_path / "run"), "--no-plots"])
    assert code == 0, text
    segments = [s for s in re.split(r"[\r\n]", text) if s.strip()]
    bars = [s for s in segments if s.startswith("virtual time:")]
    logs = [s for s in segments if "[info" in s]
    assert bars and any("window" in s and "accuracy=" in s for s in logs)
    assert all("/15.0" in bar for bar in bars)  # the total: 30 windows of 0.5 s
    assert "15.0/15.0" in bars[-1]
    # No segment holds both a bar and a log line: each log line was written above the bar.
    for segment in segments:
        assert not ("virtual time:" in segment and "[info" in segment), segment
        assert segment.count("virtual time:") <= 1, segment


@pytest.mark.slow
def test_bar_shrinks_to_the_budgets_end(tmp_path: Path) -> None:
    """With a distant duration limit the budgets end the run first: the bar's total is their
    estimated end, and becomes the real end once no client can train any more."""
    data = scenario(virtual_seconds=5000)
    data["clients"]["groups"][0]["budget"]["epsilon"] = 8.0  # about 50 windows of training
    path = write(tmp_path, data)
    code, text = run_on_terminal(["run", str(path), "--out", str(tmp_path / "run"), "--no-plots"])
    assert code == 0, text
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["stop_reason"].startswith("no client can train any more")
    bars = [s for s in re.split(r"[\r\n]", text) if s.startswith("virtual time:")]
    totals = [float(m.group(1)) for bar in bars if (m := re.search(r"/([0-9.]+) \[", bar))]
    assert totals and max(totals) < 5000  # never the distant limit
    end = summary["virtual_time"]
    assert end > 10
    assert 0.75 * end <= totals[0] <= 1.25 * end  # the estimate, before the first window
    assert totals[-1] == pytest.approx(end)  # the real end, once it is known
    assert f"{end}/{end}" in bars[-1]


def run_logged(args: list[str], tmp_path: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "fedsim", *args], capture_output=True, text=True,
                          env=env(), cwd=ROOT, timeout=300)


def records(stderr: str) -> list[dict[str, Any]]:
    return [json.loads(line) for line in stderr.splitlines() if line.startswith("{")]


@pytest.mark.slow
def test_quiet_verbose_and_per_client_summary(tmp_path: Path) -> None:
    data = scenario(virtual_seconds=5000)
    data["clients"]["groups"][0]["count"] = 25  # above PER_CLIENT_INFO_LIMIT
    data["dataset"]["num_samples"] = 2000
    path = write(tmp_path, data)

    plain = run_logged(["run", str(path), "--out", str(tmp_path / "plain"), "--no-plots"], tmp_path)
    assert plain.returncode == 0, plain.stderr
    events = records(plain.stderr)
    assert not [e for e in events if e["event"] == "client stopped"]  # details at debug
    (summary_line,) = [e for e in events if "clients stopped" in e["event"]]
    assert summary_line["event"] == "25 clients stopped: 25 budget" and summary_line["level"] == "info"

    verbose = run_logged(["run", str(path), "--out", str(tmp_path / "verbose"), "--no-plots",
                          "--verbose"], tmp_path)
    stopped = [e for e in records(verbose.stderr) if e["event"] == "client stopped"]
    assert len(stopped) == 25 and {e["level"] for e in stopped} == {"debug"}

    quiet = run_logged(["run", str(path), "--out", str(tmp_path / "quiet"), "--no-plots", "-q"],
                       tmp_path)
    assert quiet.returncode == 0
    assert all(e["level"] in ("warning", "error", "critical") for e in records(quiet.stderr))
    assert "final accuracy" in quiet.stdout  # the command's own answer still prints

    level = run_logged(["run", str(path), "--out", str(tmp_path / "level"), "--no-plots",
                        "--log-level", "WARNING"], tmp_path)
    assert level.returncode == 0 and not [e for e in records(level.stderr) if e["level"] == "info"]


def _sigint(disposition: signal.Handlers) -> Callable[[], None]:
    def set_in_child() -> None:
        signal.signal(signal.SIGINT, disposition)
    return set_in_child


@pytest.mark.slow
# The child's SIGINT is set explicitly: a job a shell starts with `&` (no job control) inherits
# SIGINT ignored, and Python then keeps ignoring Ctrl-C, as every Unix program should: a test
# suite run in the background once lost its Ctrl-C that way. The "nohup" case is that one:
# SIGINT ignored, and SIGTERM must still stop the run cleanly (no KeyboardInterrupt raised at an
# arbitrary line: it once left clients.csv one spend below the ledger).
@pytest.mark.parametrize(("sig", "name", "code", "inherited"), [
    (signal.SIGINT, "SIGINT", 130, signal.SIG_DFL),
    (signal.SIGTERM, "SIGTERM", 143, signal.SIG_DFL),
    (signal.SIGTERM, "SIGTERM", 143, signal.SIG_IGN),
], ids=["SIGINT", "SIGTERM", "SIGTERM-nohup"])
def test_interrupted_run_writes_a_partial_summary_that_report_reads(
        sig: int, name: str, code: int, inherited: signal.Handlers, tmp_path: Path,
        capsys: pytest.CaptureFixture[str]) -> None:
    data = scenario(virtual_seconds=10**6)
    data["clients"]["groups"][0].pop("budget")  # would run for ages
    path = write(tmp_path, data)
    out = tmp_path / "run"
    proc = subprocess.Popen([sys.executable, "-m", "fedsim", "run", str(path), "--out", str(out)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=env(), cwd=ROOT, preexec_fn=_sigint(inherited))
    metrics = out / "metrics.jsonl"
    deadline = time.monotonic() + 600  # generous: a loaded 2-core machine starts torch slowly
    while time.monotonic() < deadline:
        if metrics.exists() and len(metrics.read_text().splitlines()) >= 20:
            break
        time.sleep(0.1)
    else:
        proc.kill()
        pytest.fail("the run did not get going")
    proc.send_signal(sig)
    stdout, stderr = proc.communicate(timeout=120)
    assert proc.returncode == code, stderr
    assert f"interrupted by {name}" in stdout
    assert "Traceback" not in stderr
    summary = json.loads((out / "summary.json").read_text())
    lines = [json.loads(line) for line in metrics.read_text().splitlines()]
    assert summary["interrupted"] == {"signal": name, "partial": True}
    assert summary["windows"] == len(lines) >= 20
    assert summary["virtual_time"] == lines[-1]["time"]
    assert summary["stop_reason"] == (f"it was interrupted by {name} after window {len(lines)} "
                                      f"(virtual time {lines[-1]['time']:.2f} s)")
    # Every client's eps in clients.csv comes from its ledger, as in a finished run.
    assert main(["report", str(out)]) == 0
    report = capsys.readouterr().out
    assert f"interrupted by {name}" in report
    assert "clients.csv says" not in report
    assert sorted(p.name for p in (out / "plots").glob("*.png")) == [
        "accuracy.png", "epsilon.png", "tradeoff.png"]


def test_horizon_is_the_first_stop() -> None:
    from fedsim.config import parse_scenario
    from fedsim.reporting.horizon import HorizonTracker, bound_horizon, run_horizon

    data = scenario(windows=30, virtual_seconds=10.2)
    hard = bound_horizon(parse_scenario(data))
    # 10.2 s ends with the first window end at or after it: window 21 at 10.5 s (before 15 s).
    assert (hard.seconds, hard.source) == (10.5, "virtual_seconds")
    data = scenario(windows=30)
    parsed = parse_scenario(data)
    group = parsed.clients.groups[0]
    # No budget horizon past the hard bound; none at all for a client without a budget.
    assert run_horizon(parsed, [(group, 200)] * 3).source in ("windows", "budgets")
    unbounded = scenario(virtual_seconds=100.0)
    unbounded["clients"]["groups"][0].pop("budget")
    parsed = parse_scenario(unbounded)
    assert run_horizon(parsed, [(parsed.clients.groups[0], 200)]).source == "virtual_seconds"
    tracker = HorizonTracker(run_horizon(parsed, [(parsed.clients.groups[0], 200)]), 0.5)
    assert tracker.observe(3.0, 3) == 100.0
    assert tracker.observe(4.0, 0) == 4.5  # nobody can train: the run ends within a window
    assert tracker.observe(4.2, 0) == 4.5
    assert tracker.observe(4.5, 0) == 5.0  # updates still in flight: one window more


def test_affordable_rounds_are_the_ledgers_count() -> None:
    from fedsim.config import parse_scenario
    from fedsim.privacy.accountant import make_accountant
    from fedsim.privacy.events import GaussianStep
    from fedsim.reporting.horizon import affordable_rounds, round_seconds

    data = scenario(windows=30)
    data["clients"]["groups"][0].update(local_steps=2, budget={"epsilon": 2.0, "delta": 1e-5})
    group = parse_scenario(data).clients.groups[0]
    rounds = affordable_rounds(group, 400, limit=10**6)
    assert rounds is not None and rounds > 5

    def eps(r: int) -> float:
        return make_accountant("pld", [GaussianStep("poisson", 20 / 400, 1.0, 2 * r)]).epsilon(1e-5)

    assert eps(rounds) <= 2.0 < eps(rounds + 1)
    # 20 records x 2 local steps x 0.01 s; at one round per global model, the window (0.5 s)
    assert round_seconds(group, parse_scenario(data)) == pytest.approx(0.4)
    data["clients"]["groups"][0]["staleness"] = {"max_versions_behind": 1}
    assert round_seconds(parse_scenario(data).clients.groups[0], parse_scenario(data)) == 0.5


def test_ctrl_c_while_the_commands_load_is_no_traceback(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """A stranger's Ctrl-C in the first two seconds (the commands' imports, before a command
    runs) printed a KeyboardInterrupt traceback; later it printed "interrupted"."""
    import fedsim.cli

    def interrupted() -> None:
        raise KeyboardInterrupt

    monkeypatch.setattr(fedsim.cli, "build_parser", interrupted)
    assert fedsim.cli.main(["run", "scenarios/quickstart.yaml"]) == 130
    captured = capsys.readouterr()
    assert captured.err.strip() == "interrupted" and captured.out == ""
