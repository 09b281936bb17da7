"""The Ray executor (fedsim.runtime.simulated.ray_executor): the batched passes on two local Ray
workers give the same run directory, byte for byte, as the in-process run."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from fedsim.config import LoadedScenario, parse_scenario
from fedsim.runtime.simulated.ray_executor import ray_available
from fedsim.runtime.simulated.simulation import run_scenario

pytestmark = pytest.mark.skipif(not ray_available(),
                                reason="ray is not installed (pip install 'fedsim[ray]')")

OUTPUT_FILES = ("metrics.jsonl", "clients.csv", "summary.json", "scenario.resolved.yaml")


def _scenario() -> dict[str, Any]:
    group: dict[str, Any] = {"count": 4, "data_share": 0.3, "clip": 1.0, "local_lr": 0.5,
                             "speed": {"kind": "uniform", "low": 0.01, "high": 0.03},
                             "staleness": {"max_versions_behind": 3}}
    return {
        "name": "ray-tiny", "seed": 5, "stop": {"virtual_seconds": 12.0},
        "dataset": {"name": "synthetic", "num_samples": 1200, "num_test_samples": 200,
                    "num_features": 12, "num_classes": 3},
        "model": {"name": "mlp", "options": {"hidden": [16]}},
        "clients": {"groups": [
            {**group, "name": "a", "batch_size": 1, "sampling": "poisson", "noise": 1.0,
             "budget": {"epsilon": 4.0, "delta": 1e-5}},
            {**group, "name": "b", "batch_size": 4, "sampling": "fixed", "noise": 1.5},
            {**group, "name": "c", "count": 3, "data_share": 0.4, "batch_size": 8,
             "sampling": "poisson", "noise": 1.2},
        ]},
        "server": {"window": 0.5, "max_staleness": 4},
        "network": {"uplink": {"latency": {"kind": "exponential", "mean": 0.05}, "drop": 0.05,
                               "reorder": 0.2}, "downlink": {"latency": 0.02}},
    }


def _files(out: Path) -> dict[str, bytes]:
    files = {name: (out / name).read_bytes() for name in OUTPUT_FILES}
    files.update({f"ledgers/{p.name}": p.read_bytes() for p in (out / "ledgers").iterdir()})
    return files


def test_ray_workers_give_the_in_process_outputs_byte_for_byte(tmp_path: Path) -> None:
    import ray

    from fedsim.runtime.simulated.ray_executor import ray_batcher

    torch.set_num_threads(1)
    loaded = LoadedScenario(parse_scenario(_scenario()), None)
    local = run_scenario(loaded, tmp_path / "local")
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    try:
        made: list[Any] = []

        def make(population: Any) -> Any:
            made.append(ray_batcher(workers=2)(population))
            return made[-1]

        remote = run_scenario(loaded, tmp_path / "ray", make_batcher=make)
    finally:
        ray.shutdown()
    assert made and made[0].remote_passes > 10  # the passes really ran on the workers
    assert made[0].rounds_batched > 50
    assert _files(tmp_path / "ray") == _files(tmp_path / "local")
    assert (remote.final_params == local.final_params).all()
    assert local.summary["updates"]["applied"] > 50
