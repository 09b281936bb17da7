"""The deployed aggregation tier over a real mosquitto (127.0.0.1, free port, stopped by PID):
``fedsim launch four_clients.yaml --aggregators 2`` reaches the flat run's accuracy, and an
aggregator killed with SIGKILL mid-run is restarted by the launcher, rejoins, and nothing is
applied twice (``applied.jsonl`` holds each ``(client, round)`` once). The server's receipts
reach every client through its aggregator: no client ends with an update unacknowledged.

Scenario: the shipped ``four_clients.yaml`` (4 logistic-regression clients; two per aggregator),
at 0.25 wall seconds per scenario second.
"""

from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path

import pytest
import torch

from fedsim.cli import main
from fedsim.config import load_scenario
from fedsim.runtime.deployed.launcher import Launcher
from fedsim.runtime.deployed.options import LAUNCH_WAIT_FOR_CLIENTS, DeploymentOptions
from fedsim.runtime.simulated.simulation import run_scenario
from fedsim.transports.broker import MOSQUITTO_MISSING, find_mosquitto
from fedsim.transports.topics import aggregator_ids, aggregator_of
from tests.deployment.test_deployed_run import (
    ACCURACY_FLOOR,
    SCENARIO,
    TIME_SCALE,
    TOLERANCE,
    _check_applied_against_ledgers,
    _lines,
    _wait_for_window,
)

pytestmark = [
    pytest.mark.mqtt,
    pytest.mark.slow,
    pytest.mark.skipif(find_mosquitto() is None, reason=MOSQUITTO_MISSING),
]
torch.set_num_threads(1)

AGGREGATORS = aggregator_ids(2)


def _routed(client_ids: list[str]) -> dict[str, set[str]]:
    return {a: {c for c in client_ids if aggregator_of(c, AGGREGATORS) == a} for a in AGGREGATORS}


def test_launch_with_two_aggregators_reaches_the_flat_accuracy(tmp_path: Path) -> None:
    out = tmp_path / "launch"
    code = main(["launch", str(SCENARIO), "--aggregators", "2", "--out", str(out),
                 "--time-scale", TIME_SCALE, "--max-backoff", "1", "--no-plots",
                 "--timeout", "150"])
    assert code == 0
    deployed = json.loads((out / "summary.json").read_text())
    flat = run_scenario(load_scenario(SCENARIO), tmp_path / "sim").summary
    print(f"accuracy: 2 aggregators {deployed['final_accuracy']:.4f}, flat in-process "
          f"{flat['final_accuracy']:.4f}; applied {deployed['updates']['applied']} vs "
          f"{flat['updates']['applied']}")
    assert deployed["windows"] == 24
    assert deployed["final_accuracy"] >= ACCURACY_FLOOR
    assert abs(deployed["final_accuracy"] - flat["final_accuracy"]) <= TOLERANCE
    applied = _check_applied_against_ledgers(out)
    assert len(applied) == deployed["updates"]["applied"] > 0
    # The server refused none of its aggregators' messages (a partial of several base
    # versions was once refused as oversized).
    server = json.loads((out / "server.json").read_text())
    assert server["mqtt"]["refused_by_kind"] == {}, server["mqtt"]
    # Every client's updates went through its one aggregator, which pre-mixed them.
    processes = json.loads((out / "processes.json").read_text())
    routed = _routed([f"c-{i:03d}" for i in range(4)])
    for aggregator in AGGREGATORS:
        assert processes[aggregator]["command"][:2] == ["fedsim", "aggregator"]
        outcome = json.loads((out / "state" / aggregator / f"{aggregator}.json").read_text())
        assert outcome["finished"] and outcome["clients"] == len(routed[aggregator])
        assert outcome["folded"] > 0 and outcome["partials"] >= 20
        assert {c for c, _ in applied} >= routed[aggregator]
        # It passed the server's receipts on to its clients (one message per client a batch).
        assert outcome["mqtt"]["acks_sent"] >= len(routed[aggregator])
    # Every client's updates were acknowledged by the end of the run: the receipts, decided by
    # the server after its checkpoints, reached them through their aggregators.
    for client_id in sorted(set().union(*routed.values())):
        state = json.loads((out / "state" / client_id / f"client-{client_id}.json").read_text())
        assert state["unacknowledged"] == [], f"{client_id}: released, never acknowledged"
        assert state["mqtt"]["acked"] == len(state["released"]) > 0, client_id


def test_a_killed_aggregator_restarts_rejoins_and_nothing_is_applied_twice(
        tmp_path: Path) -> None:
    out = tmp_path / "kill"
    options = DeploymentOptions(time_scale=float(TIME_SCALE), max_backoff=0.5,
                                wait_for_clients=LAUNCH_WAIT_FOR_CLIENTS)
    launcher = Launcher(SCENARIO, out, options=options, overrides=["aggregators.count=2"])
    victim = "aggregator-0"
    try:
        launcher.prepare()
        launcher.start_all()
        _wait_for_window(out, 6)
        child = launcher.processes[victim].child
        assert child is not None
        os.kill(child.pid, signal.SIGKILL)  # a crash: nothing flushed, nothing said
        deadline = time.monotonic() + 10
        while launcher.processes[victim].running and time.monotonic() < deadline:
            time.sleep(0.05)
        killed_in = len(_lines(out / "metrics.jsonl"))
        assert launcher.supervise_aggregators() == [victim]
        code = None
        deadline = time.monotonic() + 150
        while code is None and time.monotonic() < deadline:
            code = launcher.wait("server", 0.5)
            launcher.supervise_aggregators()
        assert code == 0
        launcher.stop_all()
    finally:
        launcher.close()
    summary = launcher.collect()
    assert launcher.exit_codes[victim] == [-signal.SIGKILL, 0]  # then saw the end of the run
    assert launcher.processes[victim].starts == 2
    applied = _check_applied_against_ledgers(out)  # no (client, round) twice
    windows = [(line["client_id"], line["window"]) for line in _lines(out / "applied.jsonl")]
    routed = _routed(launcher.client_ids)[victim]
    after = {c for c, w in windows if w > killed_in + 2}
    assert routed <= after, "the restarted aggregator's clients were applied again"
    rejoined = json.loads((out / "state" / victim / f"{victim}.json").read_text())
    assert rejoined["finished"] and rejoined["folded"] + rejoined["forwarded"] > 0
    metrics = _lines(out / "metrics.jsonl")
    print(f"killed in window {killed_in}; applied {len(applied)}; dropped in flight "
          f"{sum(m['dropped_in_flight'] for m in metrics)}; rejoined: folded "
          f"{rejoined['folded']}, forwarded {rejoined['forwarded']}; accuracy "
          f"{summary['final_accuracy']}")
    assert summary["windows"] == 24 and summary["final_accuracy"] >= ACCURACY_FLOOR
