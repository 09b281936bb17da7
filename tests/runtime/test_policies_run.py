"""Each aggregation policy and server optimizer in a whole simulated run: it learns, it is
deterministic, and it costs the clients exactly the privacy the time windows cost."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from fedsim.config import LoadedScenario, load_scenario, parse_scenario
from fedsim.runtime.simulated.simulation import run_scenario

torch.set_num_threads(1)

REPO = Path(__file__).resolve().parents[2]
POLICIES = {
    "windows": {},
    "fedbuff": {"aggregation": {"kind": "fedbuff", "buffer_size": 3},
                "staleness_weight": {"kind": "polynomial", "a": 0.5}},
    "fedasync": {"aggregation": {"kind": "fedasync", "alpha": 0.6},
                 "staleness_weight": {"kind": "hinge", "a": 10, "b": 4}},
    "windows-momentum": {"optimizer": {"kind": "momentum", "beta1": 0.5},
                         "step_size": {"kind": "constant", "value": 0.5}},
    "fedbuff-adam": {"aggregation": {"kind": "fedbuff", "buffer_size": 4},
                     "optimizer": {"kind": "adam", "tau": 0.01},
                     "step_size": {"kind": "constant", "value": 0.05}},
    "windows-yogi": {"optimizer": {"kind": "yogi", "tau": 0.01},
                     "step_size": {"kind": "constant", "value": 0.05}},
}


def _scenario(server: dict[str, Any]) -> dict[str, Any]:
    return {
        "name": "policies", "seed": 4, "stop": {"virtual_seconds": 12.0},
        "dataset": {"name": "synthetic", "num_samples": 900, "num_test_samples": 300,
                    "num_features": 8, "num_classes": 3},
        "model": {"name": "logreg"},
        "clients": {"groups": [
            {"name": "fast", "count": 3, "data_share": 0.5, "batch_size": 16, "clip": 1.0,
             "noise": 1.0, "local_lr": 0.5, "rounds": 30,
             "speed": {"kind": "uniform", "low": 0.005, "high": 0.01}},
            {"name": "slow", "count": 3, "data_share": 0.5, "batch_size": 16, "clip": 1.0,
             "noise": 1.0, "local_lr": 0.5, "rounds": 10, "speed": 0.04},
        ]},
        "server": {"window": 0.5, "eval_every": 4, **server},
        "network": {"uplink": {"latency": {"kind": "exponential", "mean": 0.05}},
                    "downlink": {"latency": 0.02}},
    }


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    out = tmp_path_factory.mktemp("policies")
    return {name: (run_scenario(LoadedScenario(parse_scenario(_scenario(server)), None),
                                out / name, keep_history=True), out / name)
            for name, server in POLICIES.items()}


@pytest.mark.slow
@pytest.mark.parametrize("name", list(POLICIES))
def test_each_policy_learns_and_costs_what_windows_cost(runs: dict[str, Any], name: str) -> None:
    result, out = runs[name]
    assert result.summary["final_accuracy"] > 0.6, result.summary["final_accuracy"]  # chance 1/3
    assert result.summary["updates"]["applied"] > 50
    # Post-processing: the same rounds, the same privacy events, the same eps for every client.
    assert (out / "clients.csv").read_text() == (runs["windows"][1] / "clients.csv").read_text()
    if name.startswith("fed"):
        # On arrival: the model moves between window ends, several versions per window.
        assert result.summary["final_version"] > len(result.metrics)
        windows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
        assert sum(line["applied"] for line in windows) == result.summary["updates"]["applied"]


@pytest.mark.slow
def test_an_on_arrival_policy_is_deterministic(runs: dict[str, Any], tmp_path: Path) -> None:
    again = run_scenario(LoadedScenario(parse_scenario(_scenario(POLICIES["fedasync"])), None),
                         tmp_path / "again", keep_history=True)
    np.testing.assert_array_equal(again.final_params, runs["fedasync"][0].final_params)
    assert again.applied_log == runs["fedasync"][0].applied_log and again.applied_log
    # FedAsync: every applied update is its own version, applied to the model before it.
    assert [before for *_, before in again.applied_log] == list(range(len(again.applied_log)))


def test_the_async_scenario_file_validates_and_runs(tmp_path: Path) -> None:
    loaded = load_scenario(REPO / "scenarios" / "async-policies.yaml",
                           ["stop.virtual_seconds=4", "dataset.num_samples=3000"])
    server = loaded.scenario.server
    assert (server.aggregation.kind, server.optimizer.kind) == ("fedbuff", "yogi")
    assert {g.interrupt for g in loaded.scenario.clients.groups} == {"switch", "snapshot"}
    result = run_scenario(loaded, tmp_path / "run")
    assert result.summary["updates"]["applied"] > 0


def test_the_client_options_scenario_file_validates_and_runs(tmp_path: Path) -> None:
    loaded = load_scenario(REPO / "scenarios" / "async-client-options.yaml",
                           ["stop.virtual_seconds=3", "clients.groups[0].rounds=8",
                            "clients.groups[1].rounds=3"])
    adaptive, local = loaded.scenario.clients.groups
    assert adaptive.adaptive_clip is not None and adaptive.step_sequence.kind == "inverse_time"
    assert (local.per_example_steps, local.follow_server_step, local.interrupt) == (3, False,
                                                                                  "snapshot")
    result = run_scenario(loaded, tmp_path / "run")
    assert result.summary["updates"]["applied"] > 0
