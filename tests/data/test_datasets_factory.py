"""Your own data from your own code: ``dataset: {factory: ...}`` returning arrays or torch
Datasets, and torch Datasets from Python; every partition on each; bad factories and bad
Datasets refused with the factory, split and item named."""

from __future__ import annotations

import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
import yaml
from torch.utils.data import Dataset, IterableDataset, TensorDataset

import fedsim
from fedsim.cli import main
from fedsim.config import LoadedScenario, parse_scenario
from fedsim.data.factory_data import dataset_arrays, user_data
from fedsim.data.load import dataset_file
from fedsim.errors import ConfigError, DataError
from fedsim.runtime.simulated.simulation import build_population

MODULE = "user_data_factories"
FACTORIES = '''
import numpy as np
import torch
from torch.utils.data import Dataset

CALLS = []


def blobs(n, seed, features=8, classes=3):
    rng = np.random.default_rng(seed)
    y = rng.integers(0, classes, n)
    x = rng.standard_normal((n, features)).astype(np.float32)
    x[np.arange(n), y] += 2.5
    return x, y


def arrays(n=600, seed=0):
    CALLS.append({"n": n, "seed": seed})
    (xt, yt), (xs, ys) = blobs(n, 0), blobs(200, 1)
    return {"x_train": xt, "y_train": yt, "x_test": xs, "y_test": ys}


class Blobs(Dataset):
    def __init__(self, n, seed):
        self.x, self.y = blobs(n, seed)

    def __len__(self):
        return len(self.y)

    def __getitem__(self, i):
        return torch.from_numpy(self.x[i]), torch.tensor(self.y[i])


def torch_sets(n=600):
    return Blobs(n, 0), Blobs(200, 1)


def torch_mapping(n=600):
    return {"train": Blobs(n, 0), "test": Blobs(200, 1)}


NOT_CALLABLE = 3


def raises():
    raise RuntimeError("disk on fire")


def wrong():
    return 42


def one_dataset():
    return Blobs(10, 0)


def with_nan():
    data = arrays()
    data["x_train"][5, 2] = np.nan
    return data
'''


@pytest.fixture
def factory_dir(tmp_path: Path) -> Iterator[Path]:
    """A directory outside sys.path holding the factories (as beside a scenario file)."""
    where = tmp_path / "project"
    where.mkdir()
    (where / f"{MODULE}.py").write_text(textwrap.dedent(FACTORIES), encoding="utf-8")
    yield where
    for name in (MODULE, "broken_factories"):
        sys.modules.pop(name, None)


def blobs(n: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """The same mixture as the factories' (an independent copy)."""
    rng = np.random.default_rng(seed)
    y = rng.integers(0, 3, n)
    x = rng.standard_normal((n, 8)).astype(np.float32)
    x[np.arange(n), y] += 2.5
    return x, y


def scenario(dataset: dict[str, Any], scheme: str = "iid", windows: int = 6) -> dict[str, Any]:
    return {
        "name": "own-data", "seed": 2, "stop": {"windows": windows},
        "dataset": dataset, "model": {"name": "logreg"},
        "clients": {"groups": [{
            "name": "lab", "count": 3, "data_share": 1.0, "batch_size": 20, "clip": 1.0,
            "noise": {"sigma": 1.0}, "local_lr": 0.5, "speed": 0.01, "rounds": 4,
            "partition": {"scheme": scheme, **({"alpha": 0.5} if scheme == "dirichlet" else {})},
        }]},
        "server": {"window": 1.0},
    }


def _population(tree: dict[str, Any], base_dir: Path | None, data: Any = None) -> Any:
    loaded = LoadedScenario(parse_scenario(tree), base_dir / "s.yaml" if base_dir else None,
                            allow_factories=True)
    splits = None if data is None else user_data(data, "dataset (from Python)")
    return build_population(loaded, data=splits)


# ---------------------------------------------------------------------------------------
# what a factory returns becomes exactly the data
# ---------------------------------------------------------------------------------------
@pytest.mark.parametrize("factory", ["arrays", "torch_sets", "torch_mapping"])
def test_a_factory_gives_exactly_its_data(factory_dir: Path, factory: str) -> None:
    tree = scenario({"factory": f"{MODULE}:{factory}", "options": {"n": 300}})
    population = _population(tree, factory_dir)
    (x_train, y_train), (x_test, y_test) = blobs(300, 0), blobs(200, 1)
    assert torch.equal(population.train_x, torch.from_numpy(x_train))
    assert torch.equal(population.train_y, torch.from_numpy(y_train.astype(np.int64)))
    assert torch.equal(population.test_x, torch.from_numpy(x_test))
    assert population.train_y.dtype == torch.int64 and population.train_x.dtype == torch.float32
    assert torch.equal(population.test_y, torch.from_numpy(y_test.astype(np.int64)))


def test_the_factory_gets_its_options_and_the_runs_seed(factory_dir: Path) -> None:
    tree = scenario({"factory": f"{MODULE}:arrays", "options": {"n": 120}})
    _population(tree, factory_dir)
    _population({**tree, "seed": 3}, factory_dir)
    _population({**tree, "dataset": {**tree["dataset"], "options": {"n": 120, "seed": 7}}},
                factory_dir)
    calls = sys.modules[MODULE].CALLS
    assert [c["n"] for c in calls] == [120, 120, 120]
    assert calls[0]["seed"] != calls[1]["seed"] and calls[2]["seed"] == 7  # options win


def _sizes_and_plans(population: Any) -> list[np.ndarray]:
    return [np.asarray(plan.indices) for plan in population.plans]


@pytest.mark.parametrize("scheme", ["iid", "shards", "dirichlet", "unequal"])
def test_every_partition_on_factory_arrays_torch_datasets_and_python_datasets(
    factory_dir: Path, scheme: str
) -> None:
    x, y = blobs(600, 0)
    from_arrays = _population(scenario({"factory": f"{MODULE}:arrays"}, scheme), factory_dir)
    from_torch = _population(scenario({"factory": f"{MODULE}:torch_sets"}, scheme), factory_dir)
    python_pair = (TensorDataset(torch.from_numpy(x), torch.from_numpy(y)),
                   TensorDataset(*(torch.from_numpy(a) for a in blobs(200, 1))))
    from_python = _population(scenario({"name": "arrays"}, scheme), None, python_pair)
    plans = _sizes_and_plans(from_arrays)
    for other in (from_torch, from_python):  # the same labels: the same partition
        assert all(np.array_equal(a, b) for a, b in zip(plans, _sizes_and_plans(other),
                                                        strict=True))
    held = np.concatenate(plans)
    assert np.array_equal(np.sort(held), np.arange(600))  # disjoint and covering
    sizes = sorted(len(p) for p in plans)
    if scheme in ("iid", "shards"):
        assert sizes == [200, 200, 200]
    if scheme == "shards":  # two label-sorted blocks each: at most 2 + 1 labels per client
        assert all(len(np.unique(y[p])) <= 3 for p in plans)
    if scheme == "dirichlet":  # alpha 0.5 skews labels: some client's mix is far from 1/3 each
        mixes = [np.bincount(y[p], minlength=3) / len(p) for p in plans]
        assert max(float(np.abs(m - 1 / 3).max()) for m in mixes) > 0.15


def test_a_scenario_file_with_a_torch_dataset_factory_runs(
    factory_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (factory_dir / "s.yaml").write_text(yaml.safe_dump(scenario(
        {"factory": f"{MODULE}:torch_mapping", "options": {"n": 600}}, windows=8)))
    assert main(["run", str(factory_dir / "s.yaml"), "--out", str(factory_dir / "run"),
                 "--no-plots", "--allow-factory"]) == 0, capsys.readouterr().err
    resolved = yaml.safe_load((factory_dir / "run" / "scenario.resolved.yaml").read_text())
    assert resolved["dataset"]["factory"] == f"{MODULE}:torch_mapping"
    assert resolved["dataset"]["name"] is None and resolved["dataset"]["options"] == {"n": 600}


def test_simulate_takes_a_torch_dataset_pair() -> None:
    (x_train, y_train), (x_test, y_test) = blobs(600, 0), blobs(200, 1)
    train = TensorDataset(torch.from_numpy(x_train), torch.from_numpy(y_train))
    test = _ItemByItem(x_test, y_test)
    result = fedsim.simulate(scenario({"name": "synthetic"}, windows=10), progress=False,
                             dataset=(train, test))
    with torch.no_grad():
        predicted = result.model(torch.from_numpy(x_test)).argmax(1).numpy()
    assert float((predicted == y_test).mean()) == pytest.approx(result.final_accuracy, abs=1e-9)
    assert result.final_accuracy > 0.6  # 3 separable classes; chance is 1/3


# ---------------------------------------------------------------------------------------
# torch Datasets: converted once, refused with the item named
# ---------------------------------------------------------------------------------------
class _ItemByItem(Dataset):
    def __init__(self, x: Any, y: Any) -> None:
        self.x, self.y = x, y

    def __len__(self) -> int:
        return len(self.y)

    def __getitem__(self, i: int) -> Any:
        return self.x[i], self.y[i]


class _Sized(Dataset):
    def __init__(self, count: int, item: Any) -> None:
        self.count, self.item = count, item

    def __len__(self) -> int:
        return self.count

    def __getitem__(self, i: int) -> Any:
        return self.item(i)


class _Stream(IterableDataset):
    def __iter__(self) -> Iterator[Any]:
        yield torch.zeros(3), 0


def test_uint8_items_are_scaled_like_arrays_and_a_tensor_dataset_is_read_directly() -> None:
    rng = np.random.default_rng(4)
    images, labels = rng.integers(0, 256, (50, 5, 5), dtype=np.uint8), rng.integers(0, 4, 50)
    generic = user_data((_ItemByItem(images, labels), _ItemByItem(images, labels)), "here")
    direct = user_data((TensorDataset(torch.from_numpy(images), torch.from_numpy(labels)),
                        _ItemByItem(images, labels)), "here")
    expected = torch.from_numpy(images.astype(np.float32) / 255.0)
    assert torch.equal(generic[0], expected) and torch.equal(direct[0], expected)
    assert torch.equal(generic[1], direct[1]) and generic[1].tolist() == labels.tolist()
    # labels as Python ints, numpy integers, 0-d and one-element tensors
    for label in (int, np.int16, torch.tensor, lambda v: torch.tensor([v])):
        x, y = dataset_arrays(_Sized(3, lambda i, f=label: (np.ones(2), f(i))), "here")
        assert y.tolist() == [0, 1, 2] and x.shape == (3, 2)


def _pair(train: Any) -> tuple[Any, Any]:
    return train, _ItemByItem(np.ones((4, 3), np.float32), np.arange(4) % 2)


@pytest.mark.parametrize(("data", "message"), [
    (_pair(_Sized(4, lambda i: (torch.zeros(3 + (i == 2)), 0))),
     r"train set: item 2 has shape \(4,\) and dtype float32, item 0 \(3,\) float32"),
    (_pair(_Sized(4, lambda i: (torch.zeros(3, dtype=torch.float64 if i else torch.float32),
                                0))), "item 1 has shape"),
    (_pair(_Sized(4, lambda i: (torch.zeros(3), 1.0))), r"item 0's label is 1.0 \(float\)"),
    (_pair(_Sized(4, lambda i: (torch.zeros(3), True))), "item 0's label is True"),
    (_pair(_Sized(4, lambda i: (torch.zeros(3), torch.tensor([0, 1])))), "item 0's label is"),
    (_pair(_Sized(4, lambda i: (torch.zeros(3), "cat"))), "item 0's label is 'cat'"),
    (_pair(_Sized(0, lambda i: (torch.zeros(3), 0))), r"train set: the _Sized is empty"),
    (_pair(_Sized(4, lambda i: torch.zeros(3))), "item 0 is a Tensor; expected an"),
    (_pair(_Sized(4, lambda i: (torch.zeros(3), 0, 0))), "item 0 is a tuple of 3"),
    (_pair(_Sized(4, lambda i: (["a", "b"], 0))), "item 0's x has dtype <U1"),
    (_pair(_Sized(4, lambda i: 1 / 0)), "item 0 raised ZeroDivisionError"),
    (_pair(_Sized(4, lambda i: (torch.full((3,), float("nan")), i % 2))),
     "x_train holds 12 NaN"),
    (_pair(_Sized(10_000_001, lambda i: (torch.zeros(1), 0))), "more than the 10000000"),
    (_pair(_Sized(2_000_000, lambda i: (torch.zeros(28, 28), 0))),
     "1568000000 values, more than the 1000000000"),
    (_pair(_Stream()), "_Stream is an iterable-style torch Dataset"),
    (_pair(TensorDataset(torch.zeros(4, 3), torch.zeros(4))), "labels tensor has dtype float32"),
    (_Sized(4, lambda i: (torch.zeros(3), 0)), "got one _Sized; give a"),
    ((_ItemByItem(np.ones((4, 3)), np.arange(4) % 2), [1, 2]), "test set: list is not a"),
    ({"x_train": [[1.0, 2.0], [3.0]], "y_train": [0, 1], "x_test": [[1.0]], "y_test": [0]},
     "x_train is not an array"),
    ("data", "got str; expected arrays"),
])
def test_bad_datasets_are_refused_with_the_split_and_item(data: Any, message: str) -> None:
    with pytest.raises(DataError, match=message) as caught:
        user_data(data, "dataset (from Python)")
    assert str(caught.value).startswith("dataset (from Python)")


def test_tensors_with_grad_on_any_device_are_taken_as_arrays() -> None:
    x, y = blobs(40, 0)
    splits = user_data({"x_train": torch.from_numpy(x).requires_grad_(), "y_train": y,
                        "x_test": torch.from_numpy(x), "y_test": torch.from_numpy(y)}, "here")
    assert torch.equal(splits[0], torch.from_numpy(x)) and not splits[0].requires_grad


# ---------------------------------------------------------------------------------------
# bad factories: a clear error naming the factory, never a traceback
# ---------------------------------------------------------------------------------------
@pytest.mark.parametrize(("factory", "error", "message"), [
    ("absent_module_xyz:make", ConfigError, "cannot import module 'absent_module_xyz'"),
    ("broken_factories:make", ConfigError,
     "importing module 'broken_factories' failed: ModuleNotFoundError"),
    (f"{MODULE}:absent", ConfigError, f"module '{MODULE}' has no attribute 'absent'"),
    (f"{MODULE}:NOT_CALLABLE", ConfigError, "is a int, not a callable"),
    (f"{MODULE}:raises", ConfigError, r"raises\(\) raised RuntimeError: disk on fire"),
    (f"{MODULE}:wrong", DataError, "got int; expected arrays"),
    (f"{MODULE}:one_dataset", DataError, "got one Blobs; give a"),
    (f"{MODULE}:with_nan", DataError, "x_train holds 1 NaN"),
])
def test_bad_factories_name_the_factory(factory_dir: Path, factory: str, error: type,
                                        message: str, capsys: pytest.CaptureFixture[str]) -> None:
    (factory_dir / "broken_factories.py").write_text("import absent_dependency_xyz\n")
    tree = scenario({"factory": factory})
    with pytest.raises(error, match=message) as caught:
        _population(tree, factory_dir)
    assert str(caught.value).startswith(f"dataset.factory {factory}: ")
    (factory_dir / "s.yaml").write_text(yaml.safe_dump(tree))
    assert main(["run", str(factory_dir / "s.yaml"), "--out", str(factory_dir / "run"),
                 "--allow-factory"]) == 2
    err = capsys.readouterr().err
    assert f"dataset.factory {factory}: " in err and "Traceback" not in err


@pytest.mark.parametrize(("dataset", "message"), [
    ({"name": "mnist", "factory": "a.b:c"}, "not both"),
    ({}, "one of them"),
    ({"factory": "a.b c"}, "is not of the form 'package.module:function'"),
    ({"name": "arrays", "options": {"n": 1}}, "only a data set factory takes options"),
    ({"factory": "a.b:c", "path": "x.npz"}, "a data set factory finds its own data"),
])
def test_the_schema_refuses_a_malformed_dataset_section(dataset: dict, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        parse_scenario(scenario(dataset))


def test_processes_get_the_arrays_file_by_its_absolute_path(tmp_path: Path) -> None:
    (tmp_path / "mine.npz").write_bytes(b"")
    assert dataset_file("arrays", "mine.npz", base_dir=tmp_path) == tmp_path / "mine.npz"
    assert dataset_file("arrays", None, base_dir=tmp_path) is None
    assert dataset_file(None, None, base_dir=tmp_path) is None  # a factory: each process calls it
