"""An on-arrival aggregation policy over a real mosquitto: ``fedsim launch`` of the four-client
scenario with FedBuff (K = 2) and polynomial staleness weighting (127.0.0.1, free port)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from fedsim.runtime.deployed.launcher import Launcher
from fedsim.runtime.deployed.options import LAUNCH_WAIT_FOR_CLIENTS, DeploymentOptions
from fedsim.transports.broker import find_mosquitto

pytestmark = [
    pytest.mark.mqtt,
    pytest.mark.slow,
    pytest.mark.skipif(find_mosquitto() is None, reason="mosquitto is not installed"),
]
torch.set_num_threads(1)

SCENARIO = Path(__file__).with_name("four_clients.yaml")


def test_fedbuff_over_mqtt_publishes_a_model_per_full_buffer(tmp_path: Path) -> None:
    out = tmp_path / "run"
    options = DeploymentOptions(time_scale=0.25, max_backoff=0.5,
                                wait_for_clients=LAUNCH_WAIT_FOR_CLIENTS)
    launcher = Launcher(SCENARIO, out, options=options, overrides=[
        "stop.windows=12", "server.aggregation={kind: fedbuff, buffer_size: 2}",
        "server.staleness_weight={kind: polynomial, a: 0.5}"])
    summary = launcher.run_to_end(timeout=200.0)
    applied = [json.loads(t) for t in (out / "applied.jsonl").read_text().splitlines() if t]
    keys = [(a["client_id"], a["round"]) for a in applied]
    assert len(keys) == len(set(keys)) == summary["updates"]["applied"] > 0
    # Every full buffer of 2 is one version, by the last window's end (a buffer may stay
    # part-full; one more may fill while the server publishes its last model, unreported).
    metrics = [json.loads(t) for t in (out / "metrics.jsonl").read_text().splitlines() if t]
    assert len(metrics) == 12
    assert metrics[-1]["version"] == summary["updates"]["applied"] // 2
    assert summary["final_version"] - metrics[-1]["version"] in (0, 1)
    assert summary["updates"]["rejected"] == 0
    assert summary["final_accuracy"] > 0.6  # chance is 1/3
    assert summary["time_kind"] == "scenario"  # the plots' time axis says so


def test_dp_normalisation_over_mqtt_charges_each_deployed_clients_ledger(tmp_path: Path) -> None:
    """The four deployed clients each release their feature moments once before round 0 (a
    round -1 event on their own ledger, q = 1, sigma 3) from OS entropy, keep them beside the
    ledger, train on the standardised records and learn; the server evaluates on its own
    standardised held-out set."""
    from fedsim.privacy.ledger import read_ledger_steps

    out = tmp_path / "run"
    options = DeploymentOptions(time_scale=0.25, max_backoff=0.5,
                                wait_for_clients=LAUNCH_WAIT_FOR_CLIENTS)
    launcher = Launcher(SCENARIO, out, options=options, overrides=[
        "stop.windows=10", "clients.groups[0].dp_normalisation={noise_multiplier: 3, bound: 8}"])
    summary = launcher.run_to_end(timeout=200.0)
    for client in ("c-000", "c-001", "c-002", "c-003"):
        lines = [json.loads(t) for t in (out / "ledgers" / f"{client}.jsonl").read_text()
                 .splitlines()[1:]]
        assert lines[0]["round"] == -1 and lines[0]["step"]["q"] == 1.0
        assert lines[0]["step"]["sigma"] == 3.0
        assert [line["round"] for line in lines[1:]] == list(range(len(lines) - 1))
        assert len(list(read_ledger_steps(out / "ledgers" / f"{client}.jsonl"))) == len(lines)
    rows = (out / "clients.csv").read_text().splitlines()
    header = rows[0].split(",")
    for row in rows[1:]:
        record = dict(zip(header, row.split(","), strict=True))
        assert int(record["steps"]) == int(record["rounds"]) + 1  # the release is no round
    assert summary["final_accuracy"] > 0.6  # chance is 1/3
