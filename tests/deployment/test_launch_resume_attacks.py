"""``fedsim launch --resume`` against what an attacker's review tried (session 57): an edited
scenario, a second launcher in the same directory, a damaged or still-held ledger, a lost
client state, and a new launch into a directory holding a launch's state."""

from __future__ import annotations

import fcntl
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from fedsim.cli import main
from fedsim.transports.broker import find_mosquitto
from tests.deployment.test_launch_twice_and_interrupted import ROOT, SCENARIO, _launch

pytestmark = [
    pytest.mark.mqtt,
    pytest.mark.slow,
    pytest.mark.skipif(find_mosquitto() is None, reason="mosquitto is not installed"),
]


def _interrupted(tmp_path: Path, *extra: str, windows: int = 4) -> Path:
    """A launch of four_clients.yaml (``extra`` its options), SIGINTed at ``windows``."""
    out = tmp_path / "runs" / "deploy-four-launch"
    # At scenario time (a window a wall second, not a quarter): the launcher stops the clients
    # first, waiting for their last receipts while the server runs on, and 7-9 windows of a
    # quarter second each were sometimes run out before the server's turn (the launch then
    # ended, "nothing to resume": 1 run in 3 on a quiet machine).
    proc = _launch(tmp_path, *(extra or ("--set", "stop.windows=12")), "--time-scale", "1")
    metrics = out / "metrics.jsonl"
    deadline = time.monotonic() + 150
    while not (metrics.exists() and len(metrics.read_text().splitlines()) >= windows):
        if time.monotonic() > deadline:
            os.killpg(proc.pid, signal.SIGKILL)
            pytest.fail(f"the launch did not get going: {proc.communicate()}")
        time.sleep(0.2)
    os.killpg(proc.pid, signal.SIGINT)
    proc.communicate(timeout=120)
    assert proc.returncode == 130
    return out


def _resume(out: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "fedsim", "launch", "--resume", str(out), "--time-scale", "0.25",
         "--max-backoff", "1", "--no-plots", "--timeout", "100"],
        cwd=out.parent, env={**os.environ, "PYTHONPATH": str(ROOT)}, capture_output=True,
        text=True, timeout=200)


def test_resume_refuses_what_would_lose_or_misstate_spending(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = _interrupted(tmp_path)
    copy = out / "ledgers" / "c-000.jsonl"
    kept = copy.read_bytes()
    assert kept.count(b"\n") > 2  # a header and some rounds

    # An edited scenario (sigma halved) is not the one the ledgers were written under.
    resolved = out / "scenario.resolved.yaml"
    original = resolved.read_text(encoding="utf-8")
    edited = original.replace("sigma: 1.0", "sigma: 0.5", 1)
    assert edited != original
    resolved.write_text(edited, encoding="utf-8")
    assert main(["launch", "--resume", str(out)]) == 2
    assert "is not the scenario this launch started with" in capsys.readouterr().err
    resolved.write_text(original, encoding="utf-8")

    # A second launcher while one runs: refused before it touches the broker's files.
    fd = os.open(out / "launch.lock", os.O_RDWR)
    fcntl.flock(fd, fcntl.LOCK_EX)
    secrets = (out / "broker" / "secrets.json").read_bytes()
    try:
        result = _resume(out)
        assert result.returncode == 2 and "another fedsim launch is running" in result.stderr
        assert (out / "broker" / "secrets.json").read_bytes() == secrets
    finally:
        os.close(fd)

    # A client's ledger that would not open (its last line damaged): named, nothing started.
    state_ledger = out / "state" / "c-001" / "ledgers" / "c-001.jsonl"
    intact = state_ledger.read_bytes()
    state_ledger.write_bytes(intact[:-20] + b"#" * 19 + b"\n")
    assert main(["launch", "--resume", str(out)]) == 2
    assert "cannot resume: c-001:" in capsys.readouterr().err
    state_ledger.write_bytes(intact)

    # A new launch into the directory: refused, it holds a launch's state.
    assert main(["launch", str(SCENARIO), "--out", str(out)]) == 2
    assert f"go on with it (fedsim launch --resume {out})" in capsys.readouterr().err

    # A client's state lost: the server refuses the fresh client, and the run directory keeps
    # the spending its copy recorded (a resume copied the empty ledger over it: eps 0).
    shutil.rmtree(out / "state" / "c-000")
    result = _resume(out)
    assert result.returncode == 0, result.stderr
    assert copy.read_bytes() == kept
    summary = json.loads((out / "summary.json").read_text())
    warnings = summary["warnings"]
    assert any(w.startswith("c-000: its state ledger") and "which is kept" in w
               for w in warnings), warnings
    assert any(w.startswith("c-000 was refused by the server") for w in warnings), warnings
    assert summary["privacy"]["epsilon_min"] > 0


def test_a_client_done_before_the_interrupt_keeps_its_stop_across_a_resume(
        tmp_path: Path) -> None:
    """A resumed launch restarts every client; one that had stopped for good stopped again on
    its new process's clock, and its report's stop moved (a stranger: 253 s -> 261 s)."""
    group = ("{name: %s, count: 2, data_share: 0.5, batch_size: 32, sampling: poisson, clip: "
             "1.0, noise: 1.0, local_lr: 0.5, speed: 0.005, staleness: {max_versions_behind: "
             "1}, budget: {epsilon: 8.0, delta: 1.0e-5}%s}")
    out = _interrupted(tmp_path, "--set", "stop.windows=14", "--set",
                       f"clients.groups=[{group % ('c', '')}, {group % ('d', ', rounds: 2')}]",
                       windows=5)
    reports = [out / "state" / c / f"client-{c}.json" for c in ("d-000", "d-001")]
    first = [json.loads(r.read_text()) for r in reports]
    assert all(r["state"] == "done" and r["stopped_at"] is not None for r in first), first
    result = _resume(out)
    assert result.returncode == 0, result.stderr
    again = [json.loads(r.read_text()) for r in reports]
    for before, after in zip(first, again, strict=True):
        for key in ("state", "stop_reason", "stop_kind", "stopped_at"):
            assert after[key] == before[key], (key, before, after)
    rows = {r["client_id"]: r for r in json.loads((out / "summary.json").read_text())["stopped"]}
    assert [rows[r["client_id"]]["time"] for r in first] == [r["stopped_at"] for r in first]
