"""A scenario's data as tensors: :func:`scenario_data` is where a run gets its data, whatever
the ``dataset:`` section names.

Named data sets (``mnist``, ...) are found, downloaded and verified by
:mod:`fedsim.data.datasets` (the registry) in the places of :mod:`fedsim.data.locate`; this
module turns their arrays into tensors. The user's arrays are :mod:`fedsim.data.arrays`', a
factory's data :mod:`fedsim.data.factory_data`'s; synthetic data is drawn here from a
``numpy.random.Generator``.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from fedsim.data import datasets
from fedsim.data.arrays import TensorSplits, arrays_dataset
from fedsim.data.factory_data import factory_dataset
from fedsim.data.locate import resolve_path
from fedsim.errors import ConfigError

if TYPE_CHECKING:
    from fedsim.config.dataset import Dataset


def image_tensors(arrays: Mapping[str, np.ndarray]) -> TensorSplits:
    """(train_x, train_y, test_x, test_y) from uint8 image arrays: images float32 in [0, 1],
    channels first ((N, 28, 28) -> (N, 1, 28, 28); (N, H, W, C) -> (N, C, H, W)), int64 labels."""

    def images(a: np.ndarray) -> torch.Tensor:
        x = torch.from_numpy(a.astype(np.float32) / 255.0)
        return x.unsqueeze(1) if x.ndim == 3 else x.permute(0, 3, 1, 2).contiguous()

    def labels(a: np.ndarray) -> torch.Tensor:
        return torch.from_numpy(a.astype(np.int64))

    return (
        images(arrays["x_train"]),
        labels(arrays["y_train"]),
        images(arrays["x_test"]),
        labels(arrays["y_test"]),
    )


def synthetic_classification(
    num_train: int,
    num_test: int,
    *,
    rng: np.random.Generator,
    num_features: int = 20,
    num_classes: int = 4,
    separation: float = 2.0,
) -> TensorSplits:
    """A Gaussian mixture: class ``k`` is ``N(mu_k, I)`` with ``||mu_k|| = separation``.

    Labels are uniform; train and test come from the same distribution.
    """
    for name, value in (
        ("num_train", num_train),
        ("num_test", num_test),
        ("num_features", num_features),
    ):
        if value < 1:
            raise ConfigError(f"{name} must be >= 1, got {value}")
    if num_classes < 2:
        raise ConfigError(f"num_classes must be >= 2, got {num_classes}")
    means = rng.standard_normal((num_classes, num_features))
    means *= separation / np.linalg.norm(means, axis=1, keepdims=True)

    def draw(n: int) -> tuple[torch.Tensor, torch.Tensor]:
        y = rng.integers(0, num_classes, n)
        x = means[y] + rng.standard_normal((n, num_features))
        return torch.from_numpy(x.astype(np.float32)), torch.from_numpy(y.astype(np.int64))

    train_x, train_y = draw(num_train)
    test_x, test_y = draw(num_test)
    return train_x, train_y, test_x, test_y


@dataclass(frozen=True)
class ScenarioData:
    """A data set as tensors, the file it was read from (None: generated, given from Python,
    or a factory's), and (for a data set with a natural partition, FEMNIST) each training
    record's writer index."""

    tensors: TensorSplits
    path: Path | None
    train_writers: np.ndarray | None = None


def load_named_data(
    name: str,
    path: str | os.PathLike[str] | None = None,
    *,
    base_dir: Path | None = None,
    download: bool | None = None,
) -> ScenarioData:
    """A registered data set, looked for as :func:`fedsim.data.datasets.resolve` says:
    ``path`` (beside the scenario file ``base_dir``, then the working directory),
    ``$FEDSIM_DATA_DIR``, the user cache, a verified download (``download``: None follows
    ``FEDSIM_OFFLINE``)."""
    found = datasets.resolve(name, path, base_dir=base_dir, download=download)
    return ScenarioData(image_tensors(found.arrays), found.path, found.arrays.get("w_train"))


def load_named(
    name: str,
    path: str | os.PathLike[str] | None = None,
    *,
    base_dir: Path | None = None,
    download: bool | None = None,
) -> tuple[TensorSplits, Path]:
    """A registered data set as tensors, and the file it was read from (see
    :func:`load_named_data`)."""
    data = load_named_data(name, path, base_dir=base_dir, download=download)
    assert data.path is not None  # a registered data set is read from a file
    return data.tensors, data.path


def dataset_file(
    name: str | None, path: str | os.PathLike[str] | None = None, *,
    base_dir: Path | None = None,
) -> Path | None:
    """Where a registered data set is read from (fetched first where it is nowhere), the
    absolute path of an ``arrays`` file, or None (``"synthetic"``, a factory's data: name
    None): run once before starting many processes, so they do not all fetch, and so the
    scenario they read (written elsewhere) still points at the data."""
    if name is None or name == "synthetic" or (name == "arrays" and path is None):
        return None
    if name == "arrays":
        assert path is not None
        return resolve_path(path, base_dir)
    return datasets.resolve(name, path, base_dir=base_dir).path


def load_dataset(
    name: str,
    *,
    path: str | os.PathLike[str] | None = None,
    base_dir: Path | None = None,
    download: bool | None = None,
    seed: int = 0,
    **synthetic: Any,
) -> TensorSplits:
    """(train_x, train_y, test_x, test_y) for a registered data set or ``"synthetic"``.

    ``path``, ``base_dir`` and ``download`` locate a registered set (see :func:`load_named`);
    ``seed`` and the keyword arguments of :func:`synthetic_classification` (``num_train``,
    ``num_test``, ...) shape the synthetic set.
    """
    if name == "synthetic":
        sizes = {
            "num_train": synthetic.pop("num_train", 5000),
            "num_test": synthetic.pop("num_test", 1000),
        }
        return synthetic_classification(**sizes, rng=np.random.default_rng(seed), **synthetic)
    if name not in datasets.names():
        raise ConfigError(f"unknown dataset {name!r}; known: {[*datasets.names(), 'synthetic']}")
    return load_named(name, path, base_dir=base_dir, download=download)[0]


def scenario_data(dataset: Dataset, *, base_dir: Path, seed: int,
                  given: TensorSplits | None = None) -> ScenarioData:
    """The data of a scenario's ``dataset:`` section (``base_dir``: the scenario file's
    directory; ``seed``: the data set's seed, for synthetic data and factories), or the
    tensors ``given`` from Python, cut to ``test_subset`` held-out records."""
    path, writers = None, None
    data = given
    if data is None and dataset.name == "arrays":
        path = resolve_path(dataset.path, base_dir) if dataset.path is not None else None
        data = arrays_dataset(path)
    if data is None and dataset.factory is not None:
        data = factory_dataset(dataset, base_dir=base_dir, seed=seed)
    if data is not None:
        train_x, train_y, test_x, test_y = data
    elif dataset.name == "synthetic":
        train_x, train_y, test_x, test_y = load_dataset(
            "synthetic",
            seed=seed,
            num_train=dataset.num_samples,
            num_test=dataset.num_test_samples,
            num_features=dataset.num_features,
            num_classes=dataset.num_classes,
        )
    else:
        assert dataset.name is not None  # a factory's data is in hand above
        named = load_named_data(dataset.name, dataset.path, base_dir=base_dir)
        (train_x, train_y, test_x, test_y), path, writers = (
            named.tensors, named.path, named.train_writers)
    if dataset.test_subset is not None:
        test_x, test_y = test_x[: dataset.test_subset], test_y[: dataset.test_subset]
    return ScenarioData((train_x, train_y, test_x, test_y), path, writers)
