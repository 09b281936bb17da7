"""Model registry and the rejection of batch-mixing modules."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from fedsim.errors import ModelError
from fedsim.training.models import MODELS, build_model, check_dp_compatible


def test_classic_cnn_matches_the_published_architecture() -> None:
    model = build_model("dp_mnist_cnn")
    # Abadi et al. / TF Privacy tutorial CNN: 1040 + 8224 + 16416 + 330 parameters.
    assert sum(p.numel() for p in model.parameters()) == 26010
    assert model(torch.zeros(3, 1, 28, 28)).shape == (3, 10)


@pytest.mark.parametrize(
    ("name", "kwargs", "shape"),
    [
        ("logreg", {}, (2, 1, 28, 28)),
        ("mlp", {"hidden": (16, 8), "activation": "tanh"}, (2, 784)),
        ("groupnorm_cnn", {"width": 8, "groups": 4}, (2, 3, 32, 32)),
    ],
)
def test_registry_builds_every_model(name: str, kwargs: dict, shape: tuple[int, ...]) -> None:
    assert name in MODELS
    assert build_model(name, **kwargs)(torch.zeros(shape)).shape == (2, 10)


def test_unknown_model_and_bad_arguments_are_model_errors() -> None:
    with pytest.raises(ModelError, match="unknown model 'resnet'"):
        build_model("resnet")
    with pytest.raises(ModelError, match="bad arguments for model 'mlp'"):
        build_model("mlp", depth=3)
    with pytest.raises(ModelError, match="activation"):
        build_model("mlp", activation="gelu")


@pytest.mark.parametrize(
    "module",
    [
        nn.BatchNorm1d(4),
        nn.BatchNorm2d(4),
        nn.SyncBatchNorm(4),
        nn.InstanceNorm2d(4, track_running_stats=True),
    ],
)
def test_batch_mixing_modules_are_rejected_by_name(module: nn.Module) -> None:
    model = nn.Sequential(nn.Linear(4, 4), module)
    with pytest.raises(ModelError) as info:
        check_dp_compatible(model)
    message = str(info.value)
    assert "'1'" in message and type(module).__name__ in message
    assert "GroupNorm" in message and "LayerNorm" in message


def test_per_sample_normalisation_is_accepted() -> None:
    check_dp_compatible(nn.Sequential(nn.Conv2d(1, 4, 3), nn.GroupNorm(2, 4), nn.InstanceNorm2d(4)))
