"""The run's final_accuracy is the final model's (issue 27, finding 7): the server evaluates
the model the run ends with, whatever version the last periodic evaluation saw."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import torch

from fedsim.config import LoadedScenario, parse_scenario
from fedsim.runtime.population import build_population
from fedsim.runtime.simulated.simulation import run_scenario
from fedsim.training.local import load_flat_params

torch.set_num_threads(1)

# 23 windows, evaluated every 5th: the last periodic evaluation (window 20) is of an older
# model than the one window 23 leaves.
SCENARIO = {
    "name": "final-eval", "seed": 5, "stop": {"windows": 23},
    "dataset": {"name": "synthetic", "num_samples": 600, "num_test_samples": 300,
                "num_features": 8, "num_classes": 3},
    "model": {"name": "logreg"},
    "clients": {"groups": [
        {"name": "p", "count": 3, "data_share": 1.0, "batch_size": 16, "clip": 1.0, "noise": 0.8,
         "local_lr": 0.5, "speed": 0.01},
    ]},
    "server": {"window": 1.0, "eval_every": 5},
}


def _independent_accuracy(loaded: LoadedScenario, params: np.ndarray) -> float:
    """Accuracy of ``params`` on the test set, by argmax of the model's outputs."""
    population = build_population(loaded)
    load_flat_params(population.model, params)
    with torch.no_grad():
        predicted = population.model(population.test_x.float()).argmax(dim=1)
    return float((predicted == population.test_y).double().mean())


def test_final_accuracy_is_the_final_models_and_periodic_ones_are_kept(tmp_path: Path) -> None:
    loaded = LoadedScenario(parse_scenario(SCENARIO), None)
    result = run_scenario(loaded, tmp_path / "run")
    summary = result.summary
    metrics = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").open()]
    periodic = [m for m in metrics if m["accuracy"] is not None]
    assert [m["window"] for m in periodic] == [5, 10, 15, 20]
    # The final model is newer than the last one evaluated in a window...
    assert summary["final_version"] > periodic[-1]["version"]
    # ...and it is the one final_accuracy describes.
    assert summary["final_evaluated_version"] == summary["final_version"]
    expected = _independent_accuracy(loaded, result.final_params)
    assert abs(summary["final_accuracy"] - expected) < 1e-9
    assert summary["last_periodic_accuracy"] == periodic[-1]["accuracy"]
    assert summary["best_accuracy"] == max([m["accuracy"] for m in periodic]
                                           + [summary["final_accuracy"]])
    # The periodic evaluations stay in metrics.jsonl, unchanged in number.
    assert len(periodic) == 4


def test_a_message_only_run_reports_no_final_evaluation(tmp_path: Path) -> None:
    loaded = LoadedScenario(parse_scenario(SCENARIO), None)
    summary = run_scenario(loaded, tmp_path / "run", message_only=True).summary
    assert summary["final_accuracy"] is None and summary["final_evaluated_version"] is None
