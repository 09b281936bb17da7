"""The Python API: a scenario built in Python with a custom nn.Module and custom arrays runs
through ``fedsim.simulate``; results match the run directory and an independent accounting."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
import yaml
from torch import nn

import fedsim
from fedsim.errors import ConfigError, DataError, ModelError
from fedsim.privacy.accountant import make_accountant
from fedsim.privacy.events import GaussianStep
from fedsim.training.persample import PerSampleEngine

DELTA = 1e-5


def blobs(n: int, seed: int, features: int = 8, classes: int = 3) -> tuple[np.ndarray, np.ndarray]:
    """A separable Gaussian mixture: class k is N(2.5 e_k, I)."""
    rng = np.random.default_rng(seed)
    y = rng.integers(0, classes, n)
    x = rng.standard_normal((n, features)).astype(np.float32)
    x[np.arange(n), y] += 2.5
    return x, y


def arrays(train: int = 600, test: int = 300) -> dict[str, np.ndarray]:
    x_train, y_train = blobs(train, 0)
    x_test, y_test = blobs(test, 1)
    return {"x_train": x_train, "y_train": y_train, "x_test": x_test, "y_test": y_test}


class TwoLayer(nn.Module):
    """The user's own model, built from the data's shape and class count; its PReLU has no
    per-sample fast path (its gradients come from the torch.func fallback)."""

    def __init__(self, input_shape: tuple[int, ...], num_classes: int) -> None:
        super().__init__()
        self.hidden = nn.Linear(int(np.prod(input_shape)), 16)
        self.act = nn.PReLU(16)
        self.out = nn.Linear(16, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.out(self.act(self.hidden(x.flatten(1))))


def scenario(rounds: int = 6, sampling: str = "poisson", scheme: str = "dirichlet") -> dict:
    return {
        "name": "python-api",
        "seed": 3,
        "stop": {"windows": 12},
        "clients": {"groups": [{
            "name": "lab", "count": 3, "data_share": 1.0, "batch_size": 20,
            "sampling": sampling, "clip": 1.0, "noise": {"sigma": 1.1}, "local_lr": 0.5,
            "speed": 0.01, "rounds": rounds,
            "partition": {"scheme": scheme, **({"alpha": 5.0} if scheme == "dirichlet" else {})},
        }]},
        "server": {"window": 1.0},
    }


def _checked_fallback(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Spy on the torch.func fallback: every call's per-example PReLU gradients are checked
    against an independent per-example autograd loop on a fresh copy of the model."""
    from fedsim.training.persample import fallback

    real, calls = fallback.per_example_gradients, []

    def spy(model: nn.Module, names: list[str], x: torch.Tensor, y: torch.Tensor,
            loss_fn: object) -> object:
        per_example, losses = real(model, names, x, y, loss_fn)
        assert names == ["act.weight"]
        copy = TwoLayer(tuple(x.shape[1:]), model.out.out_features)
        copy.load_state_dict(model.state_dict())
        for i in range(len(x)):
            loss = nn.functional.cross_entropy(copy(x[i:i + 1]), y[i:i + 1])
            (expected,) = torch.autograd.grad(loss, copy.act.weight)
            torch.testing.assert_close(per_example[0][i], expected, rtol=1e-4, atol=1e-6)
        calls.append(len(x))
        return per_example, losses

    monkeypatch.setattr(fallback, "per_example_gradients", spy)
    return calls


@pytest.mark.slow
def test_custom_model_and_arrays_through_simulate(tmp_path: Path,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    data = arrays()
    fallback_batches = _checked_fallback(monkeypatch)
    result = fedsim.simulate(scenario(), model=TwoLayer, dataset=data, progress=False,
                             out=tmp_path / "run")
    # The user's own model came back trained, and its accuracy is the reported one.
    assert isinstance(result.model, TwoLayer)
    assert PerSampleEngine(result.model).fallback_parameters == ["act.weight"]
    # Every DP-SGD step took the PReLU's per-example gradients from the fallback (checked
    # above): 3 clients x 6 rounds of one step.
    assert len(fallback_batches) == 18 and sum(fallback_batches) > 0
    assert not torch.equal(result.model.act.weight, torch.full((16,), 0.25))  # PReLU trained
    with torch.no_grad():
        logits = result.model(torch.from_numpy(data["x_test"]))
    accuracy = float((logits.argmax(1).numpy() == data["y_test"]).mean())
    assert accuracy == pytest.approx(result.final_accuracy, abs=1e-9)
    assert result.final_accuracy > 0.6  # 3 separable classes: chance is 1/3
    assert result.best_accuracy >= result.final_accuracy
    # Per-window rows are the run directory's metrics.jsonl.
    lines = (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()
    assert result.windows == [json.loads(line) for line in lines]
    assert [w["window"] for w in result.windows] == list(range(1, len(lines) + 1))
    # Each client: 6 Poisson rounds of one step at q = 20 / its records, sigma 1.1; its eps is
    # recomputed here from those numbers alone (independent of the ledger files).
    assert len(result.clients) == 3
    for client in result.clients:
        assert client.rounds == 6 and client.stop_reason == "finished its 6 rounds"
        records = _records(tmp_path / "run" / "ledgers" / f"{client.client_id}.jsonl")
        q = records[0]["step"]["q"]
        assert 0 < q < 1 and all(r["step"]["q"] == q for r in records)
        expected = make_accountant("pld", [GaussianStep("poisson", q, 1.1, 6)]).epsilon(DELTA)
        assert client.epsilon == pytest.approx(expected, rel=1e-6)
        assert client.budget_left is None and client.mu > 0
    assert result.epsilon_min <= result.epsilon_median <= result.epsilon_max
    # The resolved scenario records where model and data came from.
    resolved = yaml.safe_load((tmp_path / "run" / "scenario.resolved.yaml").read_text())
    assert resolved["model"]["name"] is None and resolved["model"]["factory"] is None
    assert resolved["dataset"]["name"] == "arrays" and resolved["dataset"]["path"] is None


def _records(path: Path) -> list[dict]:
    lines = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return [line for line in lines[1:] if "step" in line]


def test_out_none_leaves_nothing_on_disk(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import tempfile

    # torch.func's first use imports torch._dynamo, which makes torch's own cache directory
    # under the temporary directory: torch's, not the run's (imported before it is redirected).
    import torch._dynamo  # noqa: F401

    monkeypatch.chdir(tmp_path)
    scratch = tmp_path / "tmp"
    scratch.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(scratch))
    result = fedsim.simulate(scenario(rounds=2), model=TwoLayer, dataset=arrays(), progress=False)
    assert result.run_dir is None
    assert list(scratch.iterdir()) == [] and sorted(p.name for p in tmp_path.iterdir()) == ["tmp"]
    assert len(result.clients) == 3 and all(c.rounds == 2 for c in result.clients)


def test_same_seed_same_results_and_seed_override() -> None:
    first = fedsim.simulate(scenario(rounds=3), model=TwoLayer, dataset=arrays(), progress=False)
    again = fedsim.simulate(scenario(rounds=3), model=TwoLayer, dataset=arrays(), progress=False)
    other = fedsim.simulate(scenario(rounds=3), model=TwoLayer, dataset=arrays(), progress=False,
                            seed=4)
    assert first.windows == again.windows and first.summary["seed"] == 3
    assert other.summary["seed"] == 4 and other.windows != first.windows


@pytest.mark.parametrize("scheme", ["iid", "shards", "dirichlet", "unequal"])
def test_every_partition_works_on_arrays(scheme: str) -> None:
    from fedsim.data.arrays import check_arrays
    from fedsim.runtime.simulated.simulation import build_population

    data = arrays()
    loaded = fedsim.load_scenario(scenario(scheme=scheme), {"dataset": {"name": "arrays"},
                                                            "model": {"name": "logreg"}})
    population = build_population(loaded, data=check_arrays(data))
    indices = np.concatenate([plan.indices for plan in population.plans])
    # disjoint and covering: every training record held by exactly one client
    assert np.array_equal(np.sort(indices), np.arange(len(data["y_train"])))
    sizes = sorted(len(plan.indices) for plan in population.plans)
    if scheme in ("iid", "shards"):
        assert sizes == [200, 200, 200]
    if scheme == "shards":  # two blocks of the label-sorted order each (McMahan et al.)
        order = np.argsort(data["y_train"], kind="stable")
        position = np.empty_like(order)
        position[order] = np.arange(len(order))
        for plan in population.plans:
            blocks = 1 + int(np.count_nonzero(np.diff(np.sort(position[plan.indices])) != 1))
            assert blocks <= 2


def test_overrides_as_mapping_and_selectors() -> None:
    base = scenario()
    base["clients"]["groups"].append({**base["clients"]["groups"][0], "name": "phone",
                                      "data_share": 0.5})
    base["clients"]["groups"][0]["data_share"] = 0.5
    loaded = fedsim.load_scenario(base, {"clients.groups[*].noise.sigma": 1.7,
                                         "clients.groups[phone].batch_size": 10,
                                         "dataset": {"name": "arrays"},
                                         "model": {"name": "logreg"}})
    groups = loaded.scenario.clients.groups
    assert [g.noise.sigma for g in groups] == [1.7, 1.7]
    assert [g.batch_size for g in groups] == [20, 10]
    with pytest.raises(ConfigError, match="no group named 'tablet' \\(groups: lab, phone\\)"):
        fedsim.load_scenario(base, ["clients.groups[tablet].batch_size=3"])


def test_override_errors_from_python_name_overrides_not_the_command_line(tmp_path: Path) -> None:
    """A Python caller passed ``overrides=``, not ``--set`` (a stranger's review)."""
    file = tmp_path / "s.yaml"
    file.write_text(yaml.safe_dump(scenario()), encoding="utf-8")
    for source in (scenario(), file):
        with pytest.raises(ConfigError) as error:
            fedsim.load_scenario(source, ["clients.groups[tablet].batch_size=3"])
        assert str(error.value).startswith("overrides clients.groups[tablet].batch_size:")
        with pytest.raises(ConfigError) as error:
            fedsim.load_scenario(source, ["seed"])
        assert str(error.value) == "overrides 'seed': expected path=value"
    with pytest.raises(ConfigError) as error:  # a value the schema refuses: in the source line
        fedsim.load_scenario(file, {"seed": "x"})
    assert f"{file} with overrides seed=" in str(error.value) and "--set" not in str(error.value)


def test_bad_model_and_data_are_clear_errors() -> None:
    with pytest.raises(ModelError, match="BatchNorm"):
        fedsim.simulate(scenario(), dataset=arrays(), progress=False,
                        model=lambda: nn.Sequential(nn.Linear(8, 3), nn.BatchNorm1d(3)))
    with pytest.raises(ConfigError, match="not a torch.nn.Module"):
        fedsim.simulate(scenario(), dataset=arrays(), progress=False, model=lambda: 3)
    bad = arrays()
    bad["y_train"] = bad["y_train"][:-1]
    with pytest.raises(DataError, match="y_train has 599 labels but x_train has 600"):
        fedsim.simulate(scenario(), model=TwoLayer, dataset=bad, progress=False)
    with pytest.raises(DataError, match="dataset: name 'arrays' needs path"):
        fedsim.simulate({**scenario(), "dataset": {"name": "arrays"}}, model=TwoLayer,
                        progress=False)


@pytest.mark.slow
def test_account_mirrors_the_command() -> None:
    answer = fedsim.account(q=0.01, sigma=1.1, steps=1000)
    command = subprocess.run(
        [sys.executable, "-m", "fedsim", "account", "--q", "0.01", "--sigma", "1.1", "--steps",
         "1000", "--json"], capture_output=True, text=True, check=True)
    assert answer == json.loads(command.stdout)
    expected = make_accountant("pld", [GaussianStep("poisson", 0.01, 1.1, 1000)]).epsilon(DELTA)
    assert answer["epsilon"] == pytest.approx(expected, rel=1e-9)
    sigma = fedsim.account(q=0.01, steps=1000, target_epsilon=answer["epsilon"])["sigma"]
    assert sigma == pytest.approx(1.1, rel=1e-3)
    with pytest.raises(ConfigError, match="give --steps or --epochs"):
        fedsim.account(q=0.01, sigma=1.1)
    with pytest.raises(ConfigError, match="accountant must be one of"):
        fedsim.account(q=0.01, sigma=1.1, steps=10, accountant="moments")


@pytest.mark.slow
def test_import_fedsim_is_cheap() -> None:
    code = ("import sys, fedsim; assert 'torch' not in sys.modules; "
            "assert callable(fedsim.simulate) and 'torch' in sys.modules")
    subprocess.run([sys.executable, "-c", code], check=True)


def test_too_few_outputs_for_the_classes_and_unseen_test_labels_are_said() -> None:
    """A model with fewer outputs than the data has classes is refused before training (a
    stranger's 5 outputs for 10 classes failed on a probe label, or would fail mid-run on the
    first batch holding a larger one), and held-out labels that no training record has
    (1-based test labels) are logged: their accuracy is 0 with nothing else to say why."""
    from structlog.testing import capture_logs

    with pytest.raises(ModelError, match=r"gives 2 values an example, but the data has 3 "
                                         r"classes \(labels 0 to 2\)"):
        fedsim.simulate(scenario(), dataset=arrays(), progress=False,
                        model=lambda: nn.Linear(8, 2))
    shifted = arrays()
    shifted["y_test"] = shifted["y_test"] + 1  # 1..3, where training has 0..2
    with capture_logs() as logs:
        fedsim.simulate(scenario(rounds=1), model=TwoLayer, dataset=shifted, progress=False)
    [warning] = [e for e in logs if e["event"].startswith("held-out labels")]
    assert (warning["labels"], warning["count"]) == ([3], 1)
