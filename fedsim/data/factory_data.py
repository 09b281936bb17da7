"""Your own data from your own code: ``dataset: {factory: "package.module:function"}`` in a
scenario, or ``simulate(..., dataset=...)`` from Python.

The contract (what a data set factory may return, and what ``simulate`` takes):

* **arrays** (:data:`ArraysData`): a mapping with exactly the keys ``x_train``, ``y_train``,
  ``x_test``, ``y_test``, or a 4-tuple of them in that order; each a numpy array, a CPU torch
  tensor or a nested list. The rules are :mod:`fedsim.data.arrays`': examples (N, ...) of
  one shape, real and finite (``uint8`` images are scaled to [0, 1], everything else becomes
  float32 unchanged), integer labels 0..K-1, at least two classes.
* **torch data sets** (:data:`DatasetPair`): a ``(train, test)`` pair (tuple or list) or a
  mapping ``{"train": ..., "test": ...}`` of *map-style* ``torch.utils.data.Dataset`` s
  (``len(ds)`` and ``ds[i]``), each item an ``(x, y)`` pair: ``x`` a tensor, array or
  anything numpy converts (a PIL image too), every item of the same shape and dtype; ``y`` an
  integer class (a Python int, numpy integer, or an integer tensor of one element). Each data
  set is read once, item by item (a ``TensorDataset`` of two tensors directly), into arrays
  that then follow the rules above. An empty data set, an iterable-style one, items of
  differing shapes, a label that is not an integer, or more than
  :data:`~fedsim.config.limits.MAX_DATASET_RECORDS` records or
  :data:`~fedsim.config.limits.MAX_DATASET_VALUES` values (checked before anything is
  allocated) is refused.

Every refusal is a :class:`~fedsim.errors.DataError` naming where the data came from (the
factory's reference, or "from Python"), the split and the item at fault; a factory that cannot
be imported, is not callable or raises is a :class:`~fedsim.errors.ConfigError` naming it
(:mod:`fedsim.config.factories`, shared with ``model.factory``). Partitions only read the
labels, so every scheme works on data of either kind.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeAlias

import numpy as np
import torch
from torch.utils.data import Dataset, IterableDataset, TensorDataset

from fedsim.config import limits
from fedsim.config.factories import call_factory, resolve_factory, search_places
from fedsim.data.arrays import ARRAY_NAMES, TensorSplits, check_arrays
from fedsim.errors import DataError

if TYPE_CHECKING:
    from fedsim.config.dataset import Dataset as DatasetSpec

ArrayLike: TypeAlias = np.ndarray | torch.Tensor | Sequence[Any]
ArraysData: TypeAlias = Mapping[str, ArrayLike] | tuple[ArrayLike, ArrayLike, ArrayLike, ArrayLike]
"""Arrays: ``{"x_train", "y_train", "x_test", "y_test"}`` or a 4-tuple in that order."""
DatasetPair: TypeAlias = (
    tuple[Dataset[Any], Dataset[Any]] | Sequence[Dataset[Any]] | Mapping[str, Dataset[Any]]
)
"""Two map-style torch data sets: ``(train, test)`` or ``{"train": ..., "test": ...}``."""
UserData: TypeAlias = ArraysData | DatasetPair
"""What a data set factory returns and ``simulate(dataset=...)`` takes."""

_EXPECTED = (
    f"expected arrays (a mapping with exactly {list(ARRAY_NAMES)}, or a tuple of the four in "
    "that order) or a (train, test) pair of map-style torch Datasets"
)


def _dataset_pair(data: Any) -> tuple[Any, Any] | None:
    """``(train, test)`` where ``data`` holds torch data sets, else None (arrays, or wrong)."""
    if isinstance(data, Mapping) and set(data) == {"train", "test"}:
        return data["train"], data["test"]
    if isinstance(data, Sequence) and not isinstance(data, str | bytes) and len(data) == 2:
        if any(isinstance(part, Dataset) for part in data):
            return data[0], data[1]
    return None


def user_data(data: Any, where: str) -> TensorSplits:
    """(train_x, train_y, test_x, test_y) tensors from :data:`UserData`; a
    :class:`DataError` naming ``where`` otherwise."""
    if isinstance(data, Dataset):
        raise DataError(f"{where}: got one {type(data).__name__}; give a (train, test) pair of "
                        "torch Datasets (the held-out one is evaluated on)")
    pair = _dataset_pair(data)
    if pair is not None:
        arrays: dict[str, Any] = {}
        for split, part in zip(("train", "test"), pair, strict=True):
            arrays[f"x_{split}"], arrays[f"y_{split}"] = dataset_arrays(part, f"{where}, {split} set")
        return check_arrays(arrays, where)
    if isinstance(data, Mapping):
        return check_arrays({k: _numpy(v) for k, v in data.items()}, where)
    if isinstance(data, Sequence) and not isinstance(data, str | bytes) and len(data) == 4:
        return check_arrays(tuple(_numpy(v) for v in data), where)
    raise DataError(f"{where}: got {type(data).__name__}; {_EXPECTED}")


def _numpy(value: Any) -> Any:
    """A CPU copy of a tensor as numpy (whatever its device and autograd state); others as is."""
    return value.detach().cpu().numpy() if isinstance(value, torch.Tensor) else value


def factory_dataset(spec: DatasetSpec, *, base_dir: Path | None, seed: int) -> TensorSplits:
    """The scenario's ``dataset: {factory: ..., options: ...}``: imported (as ``model.factory``
    is), called with ``options`` (and ``seed`` when it takes one), its result checked as
    :func:`user_data`."""
    assert spec.factory is not None
    where = f"dataset.factory {spec.factory}"
    factory = resolve_factory(spec.factory, where=where, search=search_places(base_dir))
    result, _ = call_factory(factory, spec.options, where=where, data={"seed": seed})
    return user_data(result, where)


# ---------------------------------------------------------------------------------------
# torch data sets
# ---------------------------------------------------------------------------------------
def dataset_arrays(dataset: Any, where: str) -> tuple[np.ndarray, np.ndarray]:
    """(examples, labels) of a map-style torch data set, read once; see the module docstring."""
    if isinstance(dataset, IterableDataset) or not isinstance(dataset, Dataset):
        kind = "an iterable-style" if isinstance(dataset, IterableDataset) else "not a"
        raise DataError(f"{where}: {type(dataset).__name__} is {kind} torch Dataset; expected "
                        "a map-style torch.utils.data.Dataset (len(ds) and ds[i] -> (x, y))")
    try:
        count = len(dataset)  # type: ignore[arg-type]  # map-style data sets define it
    except Exception as exc:
        raise DataError(f"{where}: len() of the {type(dataset).__name__} failed "
                        f"({type(exc).__name__}: {exc}); a map-style Dataset defines it") from None
    if count == 0:
        raise DataError(f"{where}: the {type(dataset).__name__} is empty (no records)")
    if count > limits.MAX_DATASET_RECORDS:
        raise DataError(f"{where}: {count} records, more than the "
                        f"{limits.MAX_DATASET_RECORDS} a data set may hold")
    if isinstance(dataset, TensorDataset) and len(dataset.tensors) == 2:
        x_all, y_all = (_numpy(t) for t in dataset.tensors)
        _check_size(where, count, x_all.shape[1:])
        return x_all, _tensor_labels(y_all, where)
    first = _features(_item(dataset, 0, where), 0, where)
    _check_size(where, count, first.shape)
    examples = np.empty((count, *first.shape), dtype=first.dtype)
    labels = np.empty(count, dtype=np.int64)
    for index in range(count):
        item = _item(dataset, index, where)
        x = first if index == 0 else _features(item, index, where)
        if x.shape != first.shape or x.dtype != first.dtype:
            raise DataError(f"{where}: item {index} has shape {tuple(x.shape)} and dtype "
                            f"{x.dtype}, item 0 {tuple(first.shape)} {first.dtype}; every "
                            "item must have the same shape and dtype (resize or pad them)")
        examples[index] = x
        labels[index] = _label(item[1], index, where)
    return examples, labels


def _check_size(where: str, count: int, shape: tuple[int, ...]) -> None:
    values = count * int(np.prod(shape))
    if values > limits.MAX_DATASET_VALUES:
        raise DataError(f"{where}: {count} records of shape {tuple(shape)} are {values} values, "
                        f"more than the {limits.MAX_DATASET_VALUES} a data set may hold")


def _item(dataset: Any, index: int, where: str) -> tuple[Any, Any]:
    try:
        item = dataset[index]
    except Exception as exc:
        raise DataError(f"{where}: item {index} raised {type(exc).__name__}: {exc}") from None
    if not isinstance(item, tuple | list) or len(item) != 2:
        raise DataError(f"{where}: item {index} is a {type(item).__name__}"
                        + (f" of {len(item)}" if isinstance(item, tuple | list) else "")
                        + "; expected an (x, y) pair")
    return item[0], item[1]


def _features(item: tuple[Any, Any], index: int, where: str) -> np.ndarray:
    try:
        x = np.asarray(_numpy(item[0]))
    except (ValueError, TypeError) as exc:
        raise DataError(f"{where}: item {index}'s x is not an array ({exc})") from None
    if x.dtype == np.bool_ or x.dtype.kind not in "fiu":
        raise DataError(f"{where}: item {index}'s x has dtype {x.dtype}; expected real numbers "
                        "(float, or uint8 images)")
    return x


def _label(value: Any, index: int, where: str) -> int:
    value = _numpy(value)
    if isinstance(value, np.ndarray) and value.size == 1:
        value = value.reshape(()).item()
    elif isinstance(value, np.generic):
        value = value.item()
    if isinstance(value, bool) or not isinstance(value, int):
        raise DataError(f"{where}: item {index}'s label is {value!r} ({type(value).__name__}); "
                        "expected an integer class 0..K-1")
    return value


def _tensor_labels(labels: np.ndarray, where: str) -> np.ndarray:
    if labels.dtype == np.bool_ or labels.dtype.kind not in "iu":
        raise DataError(f"{where}: the labels tensor has dtype {labels.dtype}; expected "
                        "integer classes 0..K-1")
    return labels
