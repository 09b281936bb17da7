"""Your own model: factories from YAML or Python, and the DP-compatibility checks with reasons."""

from __future__ import annotations

import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
from torch import nn

from fedsim.config import LoadedScenario, parse_scenario
from fedsim.config.model import Model
from fedsim.errors import ConfigError, ModelError
from fedsim.training.models import (
    build_scenario_model,
    check_dp_compatible,
    check_forward_is_per_example,
)
from fedsim.training.persample import PerSampleEngine

FACTORIES = '''
import torch
from torch import nn


class Gain(nn.Module):
    def __init__(self, width):
        super().__init__()
        self.gain = nn.Parameter(torch.ones(width))

    def forward(self, x):
        return x * self.gain


def small(num_classes, input_shape, hidden=8):
    width = 1
    for size in input_shape:
        width *= size
    return nn.Sequential(nn.Flatten(), nn.Linear(width, hidden), Gain(hidden), nn.PReLU(),
                         nn.Linear(hidden, num_classes))


def with_batchnorm(num_classes):
    return nn.Sequential(nn.Flatten(), nn.BatchNorm1d(20), nn.Linear(20, num_classes))


def broken():
    raise ValueError("no weights file")


def not_a_module():
    return {"weights": 1}


class Zoo:
    @staticmethod
    def tiny(num_classes=4):
        return nn.Linear(20, num_classes)
'''


@pytest.fixture
def factory_dir(tmp_path: Path) -> Iterator[Path]:
    """A directory outside sys.path holding the factories (as beside a scenario file)."""
    where = tmp_path / "models"
    where.mkdir()
    (where / "my_factories.py").write_text(textwrap.dedent(FACTORIES), encoding="utf-8")
    yield where
    for name in ("my_factories", "needs_dep"):
        sys.modules.pop(name, None)


def _build(factory: str, base_dir: Path, **options: object) -> nn.Module:
    return build_scenario_model(
        Model(factory=factory, options=options),
        options,
        sample=torch.randn(4, 20),
        num_classes=4,
        base_dir=base_dir,
    )


def test_a_factory_next_to_the_scenario_is_imported_with_options_and_data_sizes(
    factory_dir: Path,
) -> None:
    model = _build("my_factories:small", factory_dir, hidden=5)
    assert model[1].out_features == 5  # the option
    assert model[1].in_features == 20 and model[-1].out_features == 4  # from the data
    assert _build("my_factories:Zoo.tiny", factory_dir).out_features == 4


@pytest.mark.parametrize(
    ("factory", "message"),
    [
        ("no_such_module_xyz:make", "model.factory: cannot import module 'no_such_module_xyz'"),
        ("my_factories:missing", "model.factory: module 'my_factories' has no attribute 'missing'"),
        ("my_factories:broken", "model.factory: broken() raised ValueError: no weights file"),
        ("my_factories:not_a_module", "returned dict, not a torch.nn.Module"),
        ("my_factories:with_batchnorm", "module '1' (BatchNorm1d) cannot be trained with per-sample DP"),
    ],
)
def test_factory_failures_name_the_yaml_path(factory_dir: Path, factory: str, message: str) -> None:
    with pytest.raises(ConfigError, match="^model") as caught:
        _build(factory, factory_dir)
    assert message in str(caught.value)


def test_bad_options_and_a_missing_dependency_are_config_errors(factory_dir: Path) -> None:
    with pytest.raises(ConfigError, match=r"small\(.*colour='red'.*\) raised TypeError"):
        _build("my_factories:small", factory_dir, colour="red")
    (factory_dir / "needs_dep.py").write_text("import not_installed_pkg_q\n", encoding="utf-8")
    with pytest.raises(ConfigError, match="importing module 'needs_dep' failed.*not_installed_pkg_q"):
        _build("needs_dep:make", factory_dir)


def test_a_python_factory_and_a_built_in_name() -> None:
    made = build_scenario_model(
        Model(), {"bias": False}, sample=torch.randn(3, 20), num_classes=4,
        factory=lambda bias: nn.Linear(20, 4, bias=bias),
    )
    assert made.bias is None
    with pytest.raises(ConfigError, match="model \\(the Python factory\\): .* returned int"):
        build_scenario_model(Model(), {}, factory=lambda: 3)
    with pytest.raises(ModelError, match="model.name: unknown model 'resnet'"):
        # (the schema refuses the name first; a caller that built the section anyway:)
        build_scenario_model(Model.model_construct(name="resnet"), {})
    with pytest.raises(ModelError, match="model.options: bad arguments for model 'mlp'"):
        build_scenario_model(Model(name="mlp"), {"depth": 3})
    with pytest.raises(ConfigError, match="model: give name"):
        build_scenario_model(Model(), {})


def test_the_schema_checks_the_factory_string_shape() -> None:
    base = {"stop": {"windows": 1}, "dataset": {"name": "synthetic"}, "server": {"window": 1.0},
            "clients": {"groups": [{"name": "a", "count": 1, "data_share": 1.0, "batch_size": 4,
                                    "clip": 1.0, "noise": 1.0, "speed": 0.01}]}}
    for bad, message in [
        ({"factory": "pkg.module"}, "is not of the form 'package.module:function'"),
        ({"factory": "pkg:1f"}, "is not of the form"),
        ({"name": "mlp", "factory": "a:b"}, "not both"),
    ]:
        with pytest.raises(ConfigError, match=message):
            parse_scenario({**base, "model": bad})
    parsed = parse_scenario({**base, "model": {"factory": "a.b:c", "options": {"d": {"e": [1]}}}})
    assert parsed.model.factory == "a.b:c" and parsed.model.options == {"d": {"e": [1]}}


class BatchCentre(nn.Module):
    """Subtracts the batch mean: mixes examples with no telltale module type."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x - x.mean(0, keepdim=True)


class Counter(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("seen", torch.zeros(()))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.seen += x.shape[0]
        return x


class RunningMean(nn.Module):
    """Replaces its buffer (no in-place write) with a statistic of the batch."""

    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("mean", torch.zeros(5))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.mean = 0.9 * self.mean + 0.1 * x.mean(0).detach()
        return x


@pytest.mark.parametrize(
    ("module", "reason"),
    [
        (nn.BatchNorm1d(5), "statistics of the whole batch"),
        (nn.LazyBatchNorm1d(), "statistics of the whole batch"),
        (nn.SyncBatchNorm(5), "statistics of the whole batch"),
        (nn.InstanceNorm1d(5, track_running_stats=True), "track_running_stats=True"),
        (nn.Embedding(5, 5, max_norm=1.0), "max_norm rewrites the weights"),
        (nn.EmbeddingBag(5, 5, scale_grad_by_freq=True), "scale_grad_by_freq=True"),
        (nn.LazyLinear(5), "not initialised yet"),
    ],
)
def test_static_refusals_give_the_module_and_the_reason(module: nn.Module, reason: str) -> None:
    model = nn.Sequential(nn.Linear(5, 5), module)
    with pytest.raises(ModelError, match=f"module '1' \\({type(module).__name__}\\).*{reason}"):
        check_dp_compatible(model)
    with pytest.raises(ModelError, match=reason):
        PerSampleEngine(model)


@pytest.mark.parametrize(
    ("module", "reason"),
    [
        (BatchCentre(), "an example's output changes with the other examples"),
        (Counter(), "module '1' \\(Counter\\) changes 'seen' during forward"),
        (RunningMean(), "module '1' \\(RunningMean\\) changes 'mean' during forward"),
    ],
)
def test_the_forward_probe_and_the_engine_refuse_what_no_type_reveals(
    module: nn.Module, reason: str
) -> None:
    model = nn.Sequential(nn.Linear(5, 5), module, nn.Linear(5, 3))
    check_dp_compatible(model)  # nothing static to see
    x, y = torch.randn(6, 5), torch.randint(0, 3, (6,))
    with pytest.raises(ModelError, match=reason):
        check_forward_is_per_example(model, x)
    with pytest.raises(ModelError, match=reason):
        PerSampleEngine(model).clipped_sum(x, y, 1.0)


def test_the_probe_accepts_per_example_models_with_dropout_and_leaves_rng_and_mode() -> None:
    model = nn.Sequential(nn.Linear(5, 8), nn.Dropout(0.5), nn.GroupNorm(2, 8), nn.Linear(8, 3))
    model.train()
    x = torch.randn(4, 5)
    state = torch.random.get_rng_state()
    check_forward_is_per_example(model, x)
    assert torch.equal(torch.random.get_rng_state(), state)
    assert model.training
    with pytest.raises(ModelError, match="does not run on the data set's examples \\(shape \\(7,\\)"):
        check_forward_is_per_example(model, torch.randn(4, 7))


@pytest.mark.slow
def test_a_scenario_with_a_factory_model_runs_end_to_end(
    factory_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A YAML factory with layers without a fast path, built next to the scenario file and run
    through the simulator; the same model from a Python factory gives the same run."""
    from fedsim.runtime.population import build_population
    from fedsim.runtime.simulated.simulation import run_scenario

    monkeypatch.chdir(tmp_path)
    data = {
        "seed": 3, "stop": {"windows": 3},
        "dataset": {"name": "synthetic", "num_samples": 200, "num_test_samples": 50},
        "model": {"factory": "my_factories:small", "options": {"hidden": 6}},
        "clients": {"groups": [{"name": "a", "count": 2, "data_share": 1.0, "batch_size": 10,
                                "clip": 1.0, "noise": 1.0, "speed": 0.001}]},
        "server": {"window": 1.0},
    }
    scenario = parse_scenario(data)
    loaded = LoadedScenario(scenario, factory_dir / "scenario.yaml", allow_factories=True)
    result = run_scenario(loaded, tmp_path / "yaml")
    assert result.summary["windows"] == 3
    assert result.sample_grads > 0
    import my_factories  # importable now: the scenario's directory was searched

    python = build_population(
        LoadedScenario(parse_scenario({**data, "model": {"options": {"hidden": 6}}}), None),
        model_factory=my_factories.small,
    )
    again = run_scenario(loaded, tmp_path / "python", population=python)
    assert torch.equal(torch.as_tensor(again.final_params), torch.as_tensor(result.final_params))
