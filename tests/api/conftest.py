"""A tiny two-group scenario file (Poisson and fixed-size groups, budgets) for the CLI tests."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

TINY = {
    "name": "tiny-sweep", "seed": 1, "stop": {"windows": 8},
    "dataset": {"name": "synthetic", "num_samples": 400, "num_test_samples": 100,
                "num_features": 6, "num_classes": 3},
    "model": {"name": "logreg"},
    "clients": {"groups": [
        {"name": "phone", "count": 2, "data_share": 0.5, "batch_size": 16, "clip": 1.0,
         "noise": {"sigma": 1.0}, "speed": 0.01, "budget": {"epsilon": 5.0, "delta": 1e-5}},
        {"name": "laptop", "count": 2, "data_share": 0.5, "batch_size": 16, "sampling": "fixed",
         "clip": 1.0, "noise": {"sigma": 1.0}, "speed": 0.02,
         "budget": {"epsilon": 5.0, "delta": 1e-5}},
    ]},
    "server": {"window": 1.0},
}


@pytest.fixture
def tiny_scenario(tmp_path: Path) -> Path:
    path = tmp_path / "tiny.yaml"
    path.write_text(yaml.safe_dump(TINY), encoding="utf-8")
    return path
