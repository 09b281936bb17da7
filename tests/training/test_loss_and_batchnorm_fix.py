"""Your own loss (``model.loss`` / ``simulate(loss=...)``), checked to be per-example on a probe
batch, and the GroupNorm replacement of BatchNorm behind ``fix_batchnorm`` (issue 27,
finding 9)."""

from __future__ import annotations

import textwrap
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
import torch.nn.functional as F
import yaml
from torch import nn

import fedsim
from fedsim.config import load_scenario
from fedsim.errors import ConfigError, ModelError
from fedsim.runtime.population import build_population
from fedsim.training.models import replace_batchnorm

torch.set_num_threads(1)

LOSSES = '''
import torch
import torch.nn.functional as F

CALLS = []


def smoothed(smoothing=0.1):
    def loss(outputs, targets):
        CALLS.append(len(targets))
        return F.cross_entropy(outputs, targets, reduction="none", label_smoothing=smoothing)
    return loss


def mean_reduced():
    return lambda outputs, targets: F.cross_entropy(outputs, targets)


def batch_centred():
    def loss(outputs, targets):
        values = F.cross_entropy(outputs, targets, reduction="none")
        return values - values.mean()
    return loss


def not_callable():
    return 3
'''


def _scenario(**model: Any) -> dict[str, Any]:
    return {
        "name": "own-loss", "seed": 2, "stop": {"windows": 12},
        "dataset": {"name": "synthetic", "num_samples": 600, "num_test_samples": 300,
                    "num_features": 8, "num_classes": 3},
        "model": {"name": "logreg", **model},
        "clients": {"groups": [
            {"name": "a", "count": 2, "data_share": 1.0, "batch_size": 32, "clip": 1.0,
             "noise": 0.7, "local_lr": 0.5, "speed": 0.01}]},
        "server": {"window": 1.0, "eval_every": 4},
    }


def _write(tmp_path: Path, module: str, **model: Any) -> Path:
    (tmp_path / f"{module}.py").write_text(textwrap.dedent(LOSSES), encoding="utf-8")
    path = tmp_path / "scenario.yaml"
    path.write_text(yaml.safe_dump(_scenario(**model)), encoding="utf-8")
    return path


def test_a_scenarios_own_loss_trains_and_is_the_evaluated_loss(tmp_path: Path) -> None:
    import sys

    path = _write(tmp_path, "own_losses_a", loss="own_losses_a:smoothed",
                  loss_options={"smoothing": 0.2})
    result = fedsim.simulate(path, out=tmp_path / "run", progress=False, plots=False,
                             allow_factories=True)
    module = sys.modules["own_losses_a"]  # imported by the run, from the scenario's folder
    assert any(size > 1 for size in module.CALLS)  # the training batches went through it
    summary = result.summary
    assert summary["updates"]["applied"] > 0 and summary["final_accuracy"] > 0.5
    # The evaluation's loss is the scenario's loss, on the final model (finding 7).
    population = build_population(load_scenario(path, allow_factories=True))
    with torch.no_grad():
        outputs = result.model(population.test_x.float())
        expected = float(F.cross_entropy(outputs, population.test_y, reduction="none",
                                         label_smoothing=0.2).mean())
        plain = float(F.cross_entropy(outputs, population.test_y))
    assert summary["final_loss"] == pytest.approx(expected, rel=1e-5)
    assert abs(expected - plain) > 1e-3  # smoothing makes a difference the check can see


@pytest.mark.parametrize(("factory", "error", "message"), [
    ("mean_reduced", ModelError, "one value per example"),
    ("batch_centred", ModelError, "depends on the other examples"),
    ("not_callable", ConfigError, "not a loss function"),
    ("missing", ConfigError, "has no attribute"),
])
def test_a_loss_that_is_not_per_example_is_refused_before_training(
        tmp_path: Path, factory: str, error: type[Exception], message: str) -> None:
    module = f"own_losses_{factory}"
    path = _write(tmp_path, module, loss=f"{module}:{factory}")
    with pytest.raises(error, match=message) as caught:
        build_population(load_scenario(path, allow_factories=True))
    assert "model.loss" in str(caught.value)


def test_simulate_takes_a_loss_from_python(tmp_path: Path) -> None:
    seen: list[int] = []

    def doubled(outputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        seen.append(len(targets))
        return 2.0 * F.cross_entropy(outputs, targets, reduction="none")

    result = fedsim.simulate(_scenario(), loss=doubled, progress=False)
    assert any(size > 1 for size in seen)
    with pytest.raises(ModelError, match="one value per example"):
        fedsim.simulate(_scenario(), loss=lambda o, t: F.cross_entropy(o, t), progress=False)
    assert result.final_accuracy is not None


class _BatchNormNet(nn.Module):
    """A small CNN with BatchNorm2d (16 channels) and BatchNorm1d (48 features)."""

    def __init__(self, num_classes: int = 3) -> None:
        super().__init__()
        self.conv = nn.Conv2d(1, 16, 3, padding=1)
        self.bn = nn.BatchNorm2d(16)
        self.fc = nn.Linear(16 * 4 * 4, 48)
        self.bn1 = nn.BatchNorm1d(48)
        self.out = nn.Linear(48, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x.view(-1, 1, 4, 4)
        h = F.relu(self.bn(self.conv(x)))
        return self.out(F.relu(self.bn1(self.fc(h.flatten(1)))))


def test_replace_batchnorm_gives_groupnorm_over_the_same_channels() -> None:
    model, replaced = replace_batchnorm(_BatchNormNet())
    assert replaced == 2
    assert not any(isinstance(m, nn.modules.batchnorm._BatchNorm) for m in model.modules())
    norms = [m for m in model.modules() if isinstance(m, nn.GroupNorm)]
    # BatchNorm2d: gcd(32, C) groups; BatchNorm1d: one group (its features normalised together).
    assert [(m.num_groups, m.num_channels) for m in norms] == [(16, 16), (1, 48)]
    # Each example is now normalised on its own: the batch does not change its output.
    x = torch.randn(5, 16)
    assert torch.allclose(model(x)[:1], model(x[:1]), atol=1e-6)


@pytest.mark.parametrize("width", [16, 64])
def test_batchnorm1d_on_features_becomes_one_group_and_trains(width: int) -> None:
    """BatchNorm1d on (N, C): gcd(32, C) groups would leave one value a group for C = 16
    (GroupNorm then fails in training: "Expected more than 1 value per channel") and two for
    C = 64; one group normalises each example over its C features, and the run goes."""
    data = _scenario()
    data["dataset"]["num_features"] = 16
    data["stop"] = {"windows": 4}

    def make() -> nn.Module:
        return nn.Sequential(nn.Flatten(), nn.Linear(16, width), nn.BatchNorm1d(width), nn.ReLU(),
                             nn.Linear(width, 3))

    result = fedsim.simulate(data, model=make, fix_batchnorm=True, progress=False)
    norms = [m for m in result.model.modules() if isinstance(m, (nn.GroupNorm, nn.BatchNorm1d))]
    assert [(type(m).__name__, m.num_groups, m.num_channels) for m in norms] == [
        ("GroupNorm", 1, width)]
    assert result.summary["updates"]["applied"] > 0 and result.final_accuracy is not None
    # Per example: an example's output does not depend on the rest of its batch.
    x = torch.randn(6, 16)
    with torch.no_grad():
        result.model.train()
        assert torch.allclose(result.model(x)[:2], result.model(x[:2]), atol=1e-5)


def test_a_batchnorm_model_is_refused_with_the_fix_named_and_trains_with_it(
        tmp_path: Path) -> None:
    data = _scenario()
    data["dataset"]["num_features"] = 16
    data["stop"] = {"windows": 16}
    with pytest.raises(ModelError, match="fix_batchnorm"):
        fedsim.simulate(data, model=_BatchNormNet, progress=False)
    result = fedsim.simulate(data, model=_BatchNormNet, fix_batchnorm=True, progress=False)
    assert not any(isinstance(m, nn.modules.batchnorm._BatchNorm) for m in result.model.modules())
    assert sum(isinstance(m, nn.GroupNorm) for m in result.model.modules()) == 2
    accuracies = [w["accuracy"] for w in result.windows if w["accuracy"] is not None]
    assert result.summary["updates"]["applied"] > 0
    # It trains: above chance (1/3) and better than where it started.
    assert result.final_accuracy is not None and result.final_accuracy > 0.5
    assert result.final_accuracy > accuracies[0] - 0.05 and np.isfinite(result.summary["final_loss"])
    # The scenario option does the same (a factory named in YAML).
    (tmp_path / "bn_models.py").write_text(textwrap.dedent('''
        from torch import nn

        def bn(num_classes):
            return nn.Sequential(nn.Linear(16, 24), nn.BatchNorm1d(24), nn.ReLU(),
                                 nn.Linear(24, num_classes))
    '''), encoding="utf-8")
    data["model"] = {"factory": "bn_models:bn", "fix_batchnorm": True}
    path = tmp_path / "bn.yaml"
    path.write_text(yaml.safe_dump(data), encoding="utf-8")
    population = build_population(load_scenario(path, allow_factories=True))
    assert [type(m).__name__ for m in population.model.modules()][2] == "GroupNorm"
