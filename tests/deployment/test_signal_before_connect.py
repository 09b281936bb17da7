"""A signal while a deployed process is still making its first broker connection ends it at
once, cleanly, with its report written: it no longer keeps trying for the connect timeout
(30 s) before honouring SIGTERM or Ctrl-C (``docker stop`` gives 10 s before a SIGKILL)."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

import fedsim

SCENARIO = Path(__file__).with_name("four_clients.yaml")
REPO = Path(fedsim.__file__).resolve().parents[1]
# Long enough to see a signal honoured at once, well short of the 30 s connect timeout.
PROMPT_S = 10.0


def _closed_port() -> int:
    """A loopback port nothing listens on (bound, then released)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.mark.parametrize(
    ("role", "extra", "report"),
    [
        ("client", ["--client-id", "c-000"], "state/client-c-000.json"),
        ("server", ["--out", "out"], "out/server.json"),
        ("aggregator", ["--aggregator-id", "aggregator-0", "--set", "aggregators.count=1"],
         "state/aggregator-0.json"),
    ],
    ids=["client", "server", "aggregator"],
)
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_a_signal_during_the_first_connection_stops_the_process_at_once(
    role: str, extra: list[str], report: str, sig: signal.Signals, tmp_path: Path
) -> None:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        [str(REPO), *filter(None, [os.environ.get("PYTHONPATH")])])}
    argv = [sys.executable, "-m", "fedsim", role, "--scenario", str(SCENARIO), *extra,
            "--broker", f"mqtt://127.0.0.1:{_closed_port()}", "--state", "state", "--json-logs"]
    stderr, stdout = tmp_path / "stderr.txt", tmp_path / "stdout.txt"
    with stderr.open("wb") as err, stdout.open("wb") as out:
        process = subprocess.Popen(argv, cwd=tmp_path, env=env, stdout=out, stderr=err)
        try:
            deadline = time.monotonic() + 120  # imports and the population first
            while b"connection attempt failed" not in stderr.read_bytes():
                assert process.poll() is None, stderr.read_text()
                assert time.monotonic() < deadline, "never tried to connect"
                time.sleep(0.1)
            signalled = time.monotonic()
            process.send_signal(sig)
            code = process.wait(timeout=60)
            took = time.monotonic() - signalled
        finally:
            if process.poll() is None:
                process.kill()
                process.wait()
    log = stderr.read_text()
    assert code == 0, log
    assert took < PROMPT_S, f"exited {took:.1f} s after the signal"
    assert "Traceback" not in log
    outcome = json.loads((tmp_path / report).read_text())
    assert outcome["stop_reason"] == "stopped by a signal before the first connection to the broker"
    if role == "client":  # nothing was trained or released; its ledger is there, empty
        assert outcome["state"] == "waiting" and outcome["stop_kind"] is None
        assert outcome["signalled"] is True  # (a stranger: the server's said "signal")
        assert outcome["ledger_rounds"] == [] and outcome["released"] == []
        assert (tmp_path / "state" / "ledgers").is_dir()
    else:
        assert outcome["finished"] is False
    if role == "server":
        assert outcome["stop_kind"] == "signal"
        # (a stranger's printed "server four: None windows, version None, accuracy n/a")
        assert stdout.read_text().strip() == (
            f"server {outcome['run']}: no window closed; {outcome['stop_reason']}")
