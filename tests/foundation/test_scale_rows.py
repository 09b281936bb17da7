"""benchmarks/scale.py builds the 10^6 message-only row within fedsim's limit on generated
data, with a model of 784-128-10's parameter count, and the 10^5 training row on its small
model (issue 24 items 5 and 6)."""

from __future__ import annotations

import importlib
import sys
from pathlib import Path

from fedsim.config.limits import MAX_SYNTHETIC_VALUES
from fedsim.training.models import build_model

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"


def _scale():  # type: ignore[no-untyped-def]
    if str(BENCHMARKS) not in sys.path:
        sys.path.insert(0, str(BENCHMARKS))
    return importlib.import_module("scale")


def _parameters(features: int, hidden: int) -> int:
    model = build_model("mlp", in_features=features, hidden=[hidden], num_classes=10)
    return sum(p.numel() for p in model.parameters())


def test_message_rows_fit_the_limit_with_the_reference_parameter_count() -> None:
    scale = _scale()
    reference = _parameters(784, 128)
    assert reference == scale.REFERENCE_PARAMETERS == 101_770
    for clients, features in ((100_000, 120), (1_000_000, 12)):
        scenario = scale.scaled(clients, 60.0, cross_device=True).scenario  # the schema's check
        dataset = scenario.dataset
        assert (dataset.num_samples, dataset.num_features) == (4 * clients, features)
        assert dataset.num_samples * dataset.num_features <= MAX_SYNTHETIC_VALUES
        hidden = scenario.model.options["hidden"][0]
        count = _parameters(features, hidden)
        # the nearest: one unit more or fewer is further from the reference
        assert all(abs(count - reference) <= abs(_parameters(features, h) - reference)
                   for h in (hidden - 1, hidden + 1))
        assert abs(count - reference) < 40
        assert sum(group.count for group in scenario.clients.groups) == clients
    assert scale.scaled(100_000, 60.0, cross_device=True).scenario.model.options["hidden"] == [777]


def test_the_large_training_row_uses_the_small_model() -> None:
    scale = _scale()
    scenario = scale.scaled(100_000, 2.0, cross_device=False).scenario
    assert scenario.model.options["hidden"] == [scale.LARGE_TRAINING_HIDDEN]
    assert _parameters(scenario.dataset.num_features, scale.LARGE_TRAINING_HIDDEN) == 4_202
    assert scale.scaled(10_000, 2.0, cross_device=False).scenario.dataset.name == "mnist"
