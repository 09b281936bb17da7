"""Two runs of the same name on one persistent mosquitto: the second must neither adopt the
first's retained global model (a higher version, which made every new broadcast look older)
nor apply the first run's updates queued in the server's persistent session.

Run 1 (``four_clients.yaml``, 20 windows) has its server SIGKILLed at window 16 while its
clients go on and resend what was never acknowledged: those updates wait in the server's
broker session, and the retained model is run 1's version ~16. Run 2 (same scenario name, fresh
state, 12 windows) starts on the same broker.
"""

from __future__ import annotations

import json
import signal
import time
from pathlib import Path
from typing import Any

import pytest
import torch

from fedsim.runtime.deployed.launcher import Launcher
from fedsim.runtime.deployed.options import LAUNCH_WAIT_FOR_CLIENTS, DeploymentOptions
from fedsim.transports.broker import LocalMosquitto, find_mosquitto
from tests.deployment.broker_log import log_debug, log_offset, wait_for_client_update

pytestmark = [
    pytest.mark.mqtt,
    pytest.mark.slow,
    pytest.mark.skipif(find_mosquitto() is None, reason="mosquitto is not installed"),
]
torch.set_num_threads(1)

SCENARIO = Path(__file__).with_name("four_clients.yaml")
IDS = [f"c-{i:03d}" for i in range(4)]
ACCURACY_FLOOR = 0.70  # the deployed runs' floor (test_deployed_run.py); chance is 1/3


def _lines(path: Path) -> list[dict[str, Any]]:
    return [json.loads(t) for t in path.read_text().splitlines() if t.strip()]


def _wait_for_window(out: Path, window: int, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        path = out / "metrics.jsonl"
        if path.exists() and any(m["window"] >= window for m in _lines(path)):
            return
        time.sleep(0.05)
    raise AssertionError(f"window {window} not reached")


def _launcher(out: Path, broker: LocalMosquitto, windows: int) -> Launcher:
    options = DeploymentOptions(time_scale=0.25, max_backoff=0.5,
                                wait_for_clients=LAUNCH_WAIT_FOR_CLIENTS, broker=broker.url(),
                                secrets_file=str(broker.files.secrets_file))
    return Launcher(SCENARIO, out, options=options, overrides=[f"stop.windows={windows}"])


def test_a_second_run_of_the_same_name_ignores_the_first_runs_leftovers(tmp_path: Path) -> None:
    broker = LocalMosquitto(tmp_path / "broker", "deploy-four", IDS, persistence=True)
    log_debug(broker)  # the broker's log shows the clients' updates queued for the server
    broker.start()
    try:
        first = _launcher(tmp_path / "run1", broker, 20)
        try:
            first.prepare()
            first.start_all()
            _wait_for_window(tmp_path / "run1", 16)
            offset = log_offset(broker)
            first.kill("server", signal.SIGKILL)
            # The clients go on (and resend what was never acknowledged) into the queue.
            wait_for_client_update(broker, offset)
            first.stop_all(grace=3.0)
        finally:
            first.close()
        old_version = max(m["version"] for m in _lines(tmp_path / "run1" / "metrics.jsonl"))

        second = _launcher(tmp_path / "run2", broker, 12)
        summary = second.run_to_end(120)
    finally:
        broker.kill(signal.SIGTERM)

    out = tmp_path / "run2"
    server = json.loads((out / "server.json").read_text())
    metrics = _lines(out / "metrics.jsonl")
    print(f"run 1 reached version {old_version}; run 2: accuracy {summary['final_accuracy']}, "
          f"ignored by the server {server['mqtt']['other_incarnation']}")
    assert old_version > 12  # run 1's retained model is newer than anything run 2 publishes
    assert [m["window"] for m in metrics] == list(range(1, 13))
    assert summary["final_accuracy"] >= ACCURACY_FLOOR
    # Run 1's queued updates reached run 2's server and were ignored, never judged.
    assert server["mqtt"]["other_incarnation"] >= 1
    assert sum(m["rejections"].get("other_incarnation", 0) for m in metrics) >= 1
    assert not any(m["rejections"].get("future_version") for m in metrics)
    assert "message of another run incarnation ignored" in (out / "logs" / "server.log").read_text()
    # Every client ignored run 1's retained model and trained on run 2's broadcasts.
    for client_id in IDS:
        state = json.loads((out / "state" / client_id / f"client-{client_id}.json").read_text())
        assert state["mqtt"]["other_incarnation"] >= 1, client_id
        bases = [r["base_version"] for r in state["released"]]
        assert bases and max(bases) <= server["final_version"], client_id
        assert len(bases) >= 6, client_id
