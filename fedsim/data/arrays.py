"""Your own data set as arrays: ``dataset: {name: arrays, path: file.npz}`` in a scenario, or
``simulate(..., dataset=...)`` from Python.

Four arrays, named as in the Keras ``.npz`` layout:

* ``x_train`` (N, ...) and ``x_test`` (M, ...): the examples, with the same per-example shape
  (for example (N, 20) features, (N, 28, 28) grey images, (N, 3, 32, 32) colour images, as the
  model expects them). ``uint8`` arrays are images and are scaled to [0, 1]; every other real
  dtype (floats, other integers) is converted to float32 unchanged. Values must be finite.
* ``y_train`` (N,) and ``y_test`` (M,): integer class labels 0..K-1 (K = the largest label + 1).

:func:`check_arrays` turns a mapping (or a 4-tuple in that order) into the tensors the
simulator trains on, and refuses anything else with a :class:`~fedsim.errors.DataError`
that names the array and what is wrong. Partitions (``iid``, ``shards``, ``dirichlet``,
``unequal``) only read the labels, so they work on any such data set.
"""

from __future__ import annotations

import os
import zipfile
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch

from fedsim.errors import DataError

ARRAY_NAMES = ("x_train", "y_train", "x_test", "y_test")
MAX_CLASSES = 100_000
"""Labels at or above this are refused (the model's output layer would have that many units)."""

TensorSplits = tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]


def _as_mapping(data: Any, where: str) -> Mapping[str, Any]:
    if isinstance(data, Mapping):
        return data
    if isinstance(data, Sequence) and not isinstance(data, str | bytes) and len(data) == 4:
        return dict(zip(ARRAY_NAMES, data, strict=True))
    raise DataError(
        f"{where}: expected a mapping with {list(ARRAY_NAMES)} or a tuple of these four "
        f"arrays in that order, got {type(data).__name__}"
    )


def _asarray(name: str, value: Any, where: str) -> np.ndarray:
    try:
        return np.asarray(value)
    except (ValueError, TypeError, RuntimeError) as exc:  # ragged lists, tensors with grad
        raise DataError(f"{where}: {name} is not an array ({exc})") from None


def _examples(name: str, value: Any, where: str) -> np.ndarray:
    array = _asarray(name, value, where)
    if array.dtype == np.bool_ or array.dtype.kind not in "fiu":
        raise DataError(f"{where}: {name} has dtype {array.dtype}; expected real numbers "
                        "(float, or uint8 images)")
    if array.ndim < 2 or array.shape[0] == 0:
        raise DataError(f"{where}: {name} has shape {array.shape}; expected (examples, ...) "
                        "with at least one example and one feature")
    if array.dtype.kind == "f" and not np.isfinite(array).all():
        bad = int(np.count_nonzero(~np.isfinite(array)))
        raise DataError(f"{where}: {name} holds {bad} NaN or infinite value(s)")
    return array


def _labels(name: str, value: Any, count: int, where: str) -> np.ndarray:
    array = _asarray(name, value, where)
    if array.dtype == np.bool_ or array.dtype.kind not in "iu":
        raise DataError(f"{where}: {name} has dtype {array.dtype}; expected integer class "
                        "labels 0..K-1")
    if array.ndim != 1:
        raise DataError(f"{where}: {name} has shape {array.shape}; expected one label per "
                        "example, shape (examples,)")
    if len(array) != count:
        x_name = "x" + name[1:]
        raise DataError(f"{where}: {name} has {len(array)} labels but {x_name} has {count} "
                        "examples")
    low, high = int(array.min()), int(array.max())
    if low < 0:
        raise DataError(f"{where}: {name} has negative label {low}; labels must be 0..K-1")
    if high >= MAX_CLASSES:
        raise DataError(f"{where}: {name} has label {high}; labels must be below {MAX_CLASSES}")
    return array


def _tensor(array: np.ndarray) -> torch.Tensor:
    if array.dtype == np.uint8:
        return torch.from_numpy(np.ascontiguousarray(array, dtype=np.float32) / 255.0)
    return torch.from_numpy(np.ascontiguousarray(array, dtype=np.float32))


def check_arrays(data: Any, where: str = "dataset") -> TensorSplits:
    """(train_x, train_y, test_x, test_y) as float32 / int64 tensors from user arrays.

    ``data``: a mapping with exactly the keys ``x_train``, ``y_train``, ``x_test``,
    ``y_test`` (numpy arrays or anything :func:`numpy.asarray` takes), or a tuple of the four
    in that order. Raises :class:`DataError` naming ``where`` and the array at fault.
    """
    arrays = _as_mapping(data, where)
    missing = [n for n in ARRAY_NAMES if n not in arrays]
    extra = sorted(str(k) for k in arrays if k not in ARRAY_NAMES)
    if missing or extra:
        parts = ([f"missing {missing}"] if missing else []) + (
            [f"unexpected {extra}"] if extra else [])
        raise DataError(f"{where}: {' and '.join(parts)}; expected exactly {list(ARRAY_NAMES)}")
    x_train = _examples("x_train", arrays["x_train"], where)
    x_test = _examples("x_test", arrays["x_test"], where)
    if x_train.shape[1:] != x_test.shape[1:]:
        raise DataError(f"{where}: x_train examples have shape {x_train.shape[1:]} but x_test "
                        f"examples {x_test.shape[1:]}; they must match")
    y_train = _labels("y_train", arrays["y_train"], len(x_train), where)
    y_test = _labels("y_test", arrays["y_test"], len(x_test), where)
    if len(np.unique(y_train)) < 2:
        raise DataError(f"{where}: y_train holds a single class ({int(y_train[0])}); a "
                        "classifier needs at least two")
    return (_tensor(x_train), torch.from_numpy(y_train.astype(np.int64)),
            _tensor(x_test), torch.from_numpy(y_test.astype(np.int64)))


def load_arrays_file(path: str | os.PathLike[str]) -> TensorSplits:
    """:func:`check_arrays` of an ``.npz`` file (read without pickle)."""
    file = Path(path)
    try:
        loaded = np.load(file, allow_pickle=False)
        if not isinstance(loaded, np.lib.npyio.NpzFile):
            raise ValueError("a single array, not an archive of named arrays")
        with loaded as npz:
            arrays = {name: npz[name] for name in npz.files}
    except FileNotFoundError:
        raise DataError(f"dataset.path: no such file: {file} (a relative path is looked for "
                        "beside the scenario's file if it has one, then in the working "
                        "directory)") from None
    except (OSError, ValueError, zipfile.BadZipFile) as exc:
        raise DataError(f"dataset.path: {file} is not a readable .npz of arrays ({exc})") from None
    return check_arrays(arrays, where=f"dataset.path {file}")


def arrays_dataset(path: str | os.PathLike[str] | None) -> TensorSplits:
    """The scenario's ``dataset: {name: arrays, path: ...}``; without a path the arrays must
    come from Python."""
    if path is None:
        raise DataError(
            "dataset: name 'arrays' needs path: FILE.npz (holding x_train, y_train, x_test, "
            "y_test), or the arrays from Python: fedsim.simulate(scenario, dataset=...)"
        )
    return load_arrays_file(path)
