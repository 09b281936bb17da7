"""One lock for a directory of ledgers: how one process writes many ledgers with one descriptor.

*Many ledgers in one process* (a simulation of 10^4-10^5 clients; a held ledger costs two
file descriptors, and common limits are 1,024-20,000): the process takes a
:class:`DirectoryLock`, an exclusive ``flock`` on the ledgers' directory itself, held for the
run. Each ledger opened under it takes its own lock to open (so a ledger another writer holds
is refused), then keeps no file open: a spend opens, appends, fsyncs and closes the ledger,
then the mark. Every writer of a single ledger checks, after taking that ledger's lock, that
no process holds its directory's lock (:func:`check_directory_free`), so whichever of the two
comes second fails at open; inside the process the directory lock refuses a second open of
the same ledger. One descriptor for any number of ledgers, and the same files byte for byte.

The single ledger's own lock (its mark file's ``flock``) is :mod:`fedsim.privacy.ledger_file`'s.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

from fedsim.atomic import locked_or_closed
from fedsim.errors import LedgerError, LedgerInUse

try:
    import fcntl
except ImportError:  # pragma: no cover - not POSIX
    fcntl = None  # type: ignore[assignment]

__all__ = ["DirectoryLock", "check_directory_free", "file_identity"]


def file_identity(status: os.stat_result) -> tuple[int, int]:
    """A file's (device, inode): what a lock is held on, whatever name leads to it."""
    return status.st_dev, status.st_ino


def _directory_fd(directory: Path) -> int:
    try:
        return os.open(directory, os.O_RDONLY)
    except FileNotFoundError:
        raise LedgerError(f"{directory}: no such ledger directory") from None


def check_directory_free(directory: Path) -> None:
    """Refuse to write a ledger in ``directory`` while a process holds its
    :class:`DirectoryLock` (a run writing every ledger there)."""
    if fcntl is None:  # pragma: no cover
        return
    fd = _directory_fd(directory)
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except OSError:
        raise LedgerError(
            f"{directory}: a run holds this directory's ledgers (its lock); one ledger has one "
            f"writer") from None
    finally:
        os.close(fd)  # releases the shared lock at once


_FileKey = tuple[tuple[int, int], str]
"""A file as (its directory's (device, inode), its name)."""


class DirectoryLock:
    """An exclusive ``flock`` on a directory of ledgers, held by the one process that writes
    them (see the module docstring): its ledgers keep no file open between spends."""

    def __init__(self, directory: Path) -> None:
        if fcntl is None:  # pragma: no cover
            raise LedgerError("ledger locking needs a POSIX system (fcntl)")
        self.directory = Path(directory)
        # Resolved first, and the resolved path opened and locked: claims compare with the
        # directory the lock is on, whatever a symlink on the way points to later.
        self._fd = _directory_fd(self.directory.resolve())
        if not locked_or_closed(self._fd):
            self._fd = -1
            raise LedgerInUse(
                f"{directory}: its ledgers are open elsewhere (another process holds the "
                f"directory's lock); one ledger has one writer")
        self._locked = file_identity(os.fstat(self._fd))
        """The locked directory's (device, inode): what a claim's directory must be."""
        self._claimed: dict[str, tuple[_FileKey, ...]] = {}
        """Each claimed path (as given) -> its name here and, if another, the file it names
        (:func:`_file_key`; one key for a plain name: 10^6 ledgers share one lock)."""
        self._open: set[_FileKey] = set()

    @property
    def held(self) -> bool:
        return self._fd >= 0

    def claim(self, path: Path) -> None:
        """Register ``path`` as open in this process (a second open of it is refused).

        The path's directory must be the one locked (the same device and inode as the locked
        descriptor's, whatever symlinks lead there now); the ledger is known by that directory
        and its name, and by the file the name leads to if it is a symlink (two stats, where
        resolving both paths took some 50 lstats: 1.5 s of set-up at 10^4 clients)."""
        if not self.held:
            raise LedgerError(f"{self.directory}: the directory lock was released")
        if not _in_directory(path, self._locked):
            raise LedgerError(f"{path}: not in the locked directory {self.directory}")
        # Known by its name here too, whatever the name leads to: a name re-pointed, or a
        # symlinked name replaced by the file itself (a new ledger's _create), names the file
        # a handle of it may still be writing through that name.
        named: _FileKey = (self._locked, path.name)
        followed = _file_key(path, self._locked)
        keys = (named,) if followed == named else (named, followed)
        if any(key in self._open for key in keys):
            raise LedgerError(f"{path}: the ledger is open elsewhere (another handle in this "
                              f"process); one ledger has one writer")
        self._open.update(keys)
        self._claimed[str(path)] = keys

    def release(self, path: Path) -> None:
        self._open.difference_update(self._claimed.pop(str(path), ()))

    def close(self) -> None:
        """Release the lock (idempotent); the ledgers opened under it can no longer spend."""
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1
        self._open.clear()
        self._claimed.clear()

    def __enter__(self) -> DirectoryLock:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _file_key(path: Path, directory: tuple[int, int]) -> _FileKey:
    """The file ``path`` names, as (its directory's identity, its name): ``directory`` and the
    name itself unless the name is a symlink, which is followed first and must lead to a file
    of the same directory (elsewhere the directory's lock would not cover it: another
    process could write it under a lock of its own)."""
    try:
        link = stat.S_ISLNK(os.lstat(path).st_mode)
    except FileNotFoundError:
        link = False  # not there yet: created under this name
    if not link:
        return directory, path.name
    try:
        target = path.resolve()
    except (RuntimeError, OSError) as exc:  # a symlink loop (RuntimeError before 3.13)
        raise LedgerError(f"{path}: its name leads nowhere ({exc})") from None
    if not _in_directory(target, directory):
        raise LedgerError(f"{path}: a symlink to {target}, outside the locked directory")
    return directory, target.name


def _in_directory(path: Path, directory: tuple[int, int]) -> bool:
    """Whether ``path``'s directory is ``directory`` (its device and inode; False if it
    cannot be read)."""
    try:
        return file_identity(os.stat(path.parent)) == directory
    except OSError:
        return False
