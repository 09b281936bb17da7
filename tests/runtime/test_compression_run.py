"""Compressed updates in whole simulated runs: each kind completes and learns, sends fewer
bytes on the simulated uplink, is never refused by the server's norm bound, and costs every
client exactly the privacy the uncompressed run costs (post-processing)."""

from __future__ import annotations

import csv
from pathlib import Path
from typing import Any

import pytest
import torch

from fedsim.config import LoadedScenario, load_scenario, parse_scenario
from fedsim.runtime.simulated.simulation import run_scenario

torch.set_num_threads(1)

REPO = Path(__file__).resolve().parents[2]
KINDS: dict[str, dict[str, Any] | None] = {
    "none": None,
    "top_k": {"kind": "top_k", "fraction": 0.1},
    "threshold": {"kind": "threshold", "threshold": 0.1},
    "quantise8": {"kind": "quantise", "bits": 8},
    "quantise4": {"kind": "quantise", "bits": 4},
}


def _scenario(compression: dict[str, Any] | None) -> dict[str, Any]:
    extra = {} if compression is None else {"compression": compression}
    return {
        "name": "compression", "seed": 4, "stop": {"virtual_seconds": 10.0},
        "dataset": {"name": "synthetic", "num_samples": 900, "num_test_samples": 300,
                    "num_features": 32, "num_classes": 3},
        "model": {"name": "logreg"},
        "clients": {"groups": [
            {"name": "poisson", "count": 3, "data_share": 0.5, "batch_size": 16, "clip": 1.0,
             "noise": 1.0, "local_lr": 0.5, "rounds": 30,
             "speed": {"kind": "uniform", "low": 0.005, "high": 0.01}, **extra},
            {"name": "fixed", "count": 3, "data_share": 0.5, "batch_size": 16, "clip": 1.0,
             "noise": 1.0, "local_lr": 0.5, "rounds": 15, "sampling": "fixed",
             "speed": 0.02, **extra},
        ]},
        "server": {"window": 0.5, "eval_every": 4},
        "network": {"uplink": {"latency": {"kind": "exponential", "mean": 0.05}, "drop": 0.05},
                    "downlink": {"latency": 0.02}},
    }


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    out = tmp_path_factory.mktemp("compression")
    return {name: (run_scenario(LoadedScenario(parse_scenario(_scenario(spec)), None),
                                out / name), out / name)
            for name, spec in KINDS.items()}


def _epsilons(out: Path) -> dict[str, tuple[str, str, str]]:
    with open(out / "clients.csv", encoding="utf-8") as handle:
        return {row["client_id"]: (row["rounds"], row["epsilon"], row["sigma"])
                for row in csv.DictReader(handle)}


@pytest.mark.slow
@pytest.mark.parametrize("name", list(KINDS))
def test_each_kind_learns_costs_no_privacy_and_saves_bytes(runs: dict[str, Any], name: str) -> None:
    result, out = runs[name]
    summary = result.summary
    assert summary["final_accuracy"] > 0.55, summary["final_accuracy"]  # chance 1/3
    assert summary["updates"]["applied"] > 50
    assert summary["updates"]["rejected"] == 0  # honest compressed updates pass the bound
    # Post-processing: the same rounds, the same privacy events, the same eps for every client.
    assert _epsilons(out) == _epsilons(runs["none"][1]) and len(_epsilons(out)) == 6
    assert (out / "ledgers").is_dir()
    base = runs["none"][0].summary["network"]["uplink"]
    uplink = summary["network"]["uplink"]
    assert uplink["sent"] == base["sent"]
    if name != "none":
        assert uplink["bytes_sent"] < 0.75 * base["bytes_sent"], (uplink, base)


@pytest.mark.slow
def test_the_compression_scenario_file_validates_and_runs(tmp_path: Path) -> None:
    loaded = load_scenario(REPO / "scenarios" / "compressed-updates.yaml",
                           ["stop.virtual_seconds=1.5", "dataset.test_subset=200"])
    kinds = [g.compression.kind for g in loaded.scenario.clients.groups if g.compression]
    assert kinds == ["quantise", "top_k", "quantise"]
    result = run_scenario(loaded, tmp_path / "run")
    assert result.summary["updates"]["applied"] > 0
    assert result.summary["updates"]["rejected"] == 0
