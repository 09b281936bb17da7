"""``fedsim launch`` as a newcomer uses it (issue 27, finding 5): Ctrl-C (SIGINT to the whole
process group, as a terminal sends it) still leaves a run directory ``fedsim report`` reads,
with a partial summary that says so; a second launch of the same scenario goes to a fresh
directory with a numeric suffix, as ``fedsim run`` does, instead of being refused."""

from __future__ import annotations

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
    os.killpg(proc.pid, signal.SIGINT)  # Ctrl-C: the launcher and every process it started
    stdout, stderr = proc.communicate(timeout=120)
    assert proc.returncode == 130, stderr
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
