"""Atomic file replacement: the one way fedsim rewrites a file that a reader or a restart relies on.

:func:`write_atomically` writes into a temporary file in the target's directory and renames it
over the target (:func:`os.replace`, atomic on POSIX and on Windows within one volume), so a
reader, or a process killed at any moment, sees the old file or the new one, never half of one;
a write that raises leaves the old file untouched and removes its temporary file.

What survives a *power failure* (or a kernel crash) depends on what is flushed to the disk; a
caller chooses, per file, one of two levels (:data:`Durability`):

* ``"file"``: the new content is fsynced before the rename. After a power failure the target
  holds the old content or the new content in full (without this fsync some file systems
  persist the rename before the data and leave an empty or zero-filled file), but the rename
  itself may be lost: the *old* version may come back. For files whose loss on power failure is
  harmless because they are derived or re-created: run outputs (``summary.json``, a client's
  report), the cached feature moments of DP normalisation (the ledger, not this file, says
  whether the release was charged), a downloaded data set (verified by its digest), the
  compiled noise kernel.
* ``"durable"``: the file is fsynced, renamed, and then its directory is fsynced
  (:func:`fsync_directory`), so once the call returns the new version survives a power
  failure. For state that acknowledgements or privacy spending depend on: the deployed
  server's checkpoint (updates are acknowledged after it is saved), a repaired privacy ledger,
  the per-window files a restarted server trims back to its checkpoint (their later appends are
  fsynced, which is worth nothing if the file they were appended to can revert).

The privacy ledger itself is append-only and is not rewritten through this module; it shares
:func:`fsync_directory` for the directory entry of a new ledger, and a simulated run makes its
ledgers durable together with :class:`FileSystemSync`.

This module sits in the lowest layer (with :mod:`fedsim.errors`, the one module of fedsim it
imports), so the privacy code can use it.
"""

from __future__ import annotations

import _signal  # type: ignore[import-not-found]  # no stub: signal's C module
import ctypes
import errno
import os
import secrets
import signal
import stat
import sys
import threading
from collections.abc import Callable, Mapping
from pathlib import Path
from types import FrameType
from typing import IO, Literal, TypeGuard

from fedsim.errors import FedsimError

__all__ = ["Durability", "LINK_REFUSED", "LinkRefused", "TooLarge", "fsync_directory",
           "holds_for_a_block", "move_into_place", "locked_or_closed", "open_log", "open_no_link", "open_regular",
           "read_regular", "replace_together", "FileSystemSync", "uninterrupted",
           "write_atomically"]

Durability = Literal["file", "durable"]
DURABILITIES: tuple[Durability, ...] = ("file", "durable")

Content = bytes | bytearray | memoryview | str | Callable[[IO[bytes]], object]


def fsync_directory(directory: str | Path) -> None:
    """Flush ``directory``'s entries (a rename or a new file in it) to the disk.

    Where the platform cannot open a directory for reading (Windows) there is nothing to do:
    its file systems persist renames with the metadata journal."""
    try:
        fd = os.open(directory, os.O_RDONLY)
    except (IsADirectoryError, PermissionError):
        if os.name == "nt":
            return
        raise
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def locked_or_closed(fd: int) -> bool:
    """Take an exclusive ``flock`` on ``fd`` without waiting: True, or False with ``fd`` closed
    (another open file holds it: a second writer). POSIX only; the one way fedsim's
    single-writer locks (a ledger's mark, a directory of ledgers, a server's state directory)
    are taken."""
    import fcntl  # POSIX (the callers check)

    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        os.close(fd)
        return False
    return True


class FileSystemSync:
    """One ``syncfs(2)`` of the file system that holds a directory: every file's data and every
    directory entry written there, flushed to the disk in one call.

    For many files written without an fsync each (a simulated run's ledgers,
    :meth:`fedsim.privacy.ledger.PrivacyLedger.open` with ``fsync=False``) this is one journal
    commit where an fsync of each would be two a file. Open it *before* the writes it is to
    cover and keep it until :meth:`sync`: Linux (5.8 and later) reports to a descriptor only
    the write-back errors since it was opened that nobody else has seen, so one opened just
    before the sync could miss an error another process's sync saw first (earlier kernels
    report none to ``syncfs`` at all). Linux only (:data:`AVAILABLE`): elsewhere the callers
    fsync each file as they write it, since ``sync(2)`` may return before its writes are done.
    """

    AVAILABLE: bool = False  # set below: whether this system has syncfs(2)

    def __init__(self, directory: str | Path) -> None:
        if _syncfs is None:
            raise OSError(errno.ENOSYS, "syncfs(2) is not available here", str(directory))
        self.directory = Path(directory)
        self._fd = os.open(directory, os.O_RDONLY)

    def sync(self) -> None:
        """Flush the file system; an ``OSError`` (EIO: a write-back failed) if it failed."""
        assert _syncfs is not None
        if self._fd < 0:
            raise ValueError(f"{self.directory}: this file-system sync is closed")
        if _syncfs(self._fd) != 0:
            error = ctypes.get_errno()
            raise OSError(error, f"syncfs: {os.strerror(error)}", str(self.directory))

    def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1


def _find_syncfs() -> Callable[[int], int] | None:
    if not sys.platform.startswith("linux"):
        return None
    try:
        function = ctypes.CDLL(None, use_errno=True).syncfs
    except (OSError, AttributeError):  # a libc without it (very old, or not glibc/musl)
        return None
    function.argtypes = [ctypes.c_int]  # a descriptor, checked as a C int (not truncated)
    function.restype = ctypes.c_int
    return function


_syncfs = _find_syncfs()
FileSystemSync.AVAILABLE = _syncfs is not None


def _check(durability: str) -> None:
    if durability not in DURABILITIES:
        raise ValueError(f"durability must be one of {DURABILITIES}, got {durability!r}")


LINK_REFUSED = "is a symbolic link; fedsim does not write through links"
"""The reason :class:`LinkRefused` gives (its ``strerror``)."""


class LinkRefused(OSError, FedsimError):
    """A file fedsim was to write (or lock) is a symbolic link: refused, never followed
    (:func:`open_no_link`). An :class:`OSError` (ELOOP) whose ``strerror`` is
    :data:`LINK_REFUSED` and whose ``filename`` is the link, and a
    :class:`~fedsim.errors.FedsimError` (the CLI prints it as one line, exit 2)."""

    exit_code = 2

    def __init__(self, path: str | Path) -> None:
        super().__init__(errno.ELOOP, LINK_REFUSED, str(path))

    def __str__(self) -> str:
        return f"{self.filename}: {LINK_REFUSED}"


class TooLarge(OSError, FedsimError):
    """A file :func:`read_regular` was asked to read whole is larger than its caller's cap
    (``refuse_over``): refused before anything is read. An :class:`OSError` (EFBIG) and a
    :class:`~fedsim.errors.FedsimError` (exit 2)."""

    exit_code = 2

    def __init__(self, path: str | Path, size: int, cap: int) -> None:
        super().__init__(errno.EFBIG, f"{size:,} bytes, larger than the {cap:,} bytes "
                                      f"such a file can hold", str(path))
        self.size, self.cap = size, cap

    def __str__(self) -> str:
        return f"{self.filename}: {self.strerror}; not read"


_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)


def open_no_link(path: str | Path, flags: int, mode: int = 0o666) -> int:
    """``os.open(path, flags, mode)`` that never follows a symbolic link as the final
    component (``O_NOFOLLOW``; with ``O_CREAT`` a dangling link is refused too, not created
    through): a link raises :class:`LinkRefused` naming it. For every file fedsim writes,
    appends to or locks in a directory someone else may have prepared (a ledger and its mark,
    a state or run directory handed over, a launch's logs): an attacker's review planted links
    there and had a repair and a resume overwrite and append to files elsewhere."""
    try:
        return os.open(path, flags | _NOFOLLOW | os.O_CLOEXEC, mode)
    except OSError as exc:
        # ELOOP on Linux; EMLINK (FreeBSD) and EFTYPE (NetBSD) elsewhere.
        if exc.errno in (errno.ELOOP, errno.EMLINK, getattr(errno, "EFTYPE", -1)) \
                and os.path.islink(path):
            raise LinkRefused(path) from None
        raise


def open_log(path: str | Path) -> int:
    """A descriptor appending to the log file ``path`` (created if missing, ``0o644``): a
    symbolic link there is refused (:class:`LinkRefused`), never appended through (an
    attacker's review: ``logs/c-001.log`` linked to a file elsewhere had a resumed client's log
    lines appended to it). A launch's process logs and its private broker's log."""
    return open_no_link(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)


def open_regular(path: str | Path, *, no_link: bool = False) -> IO[bytes]:
    """``path`` opened for reading if it is a regular file, for readers of files someone else
    may have put there (a run directory handed over, a ledger to check, a checkpoint to
    resume from): anything else - a FIFO, a device - raises :class:`OSError` (EINVAL) instead
    of blocking the reader for ever (a review: a FIFO named ``ledgers/<id>.jsonl`` hung
    ``fedsim report``). Opened without blocking, then checked on the open descriptor;
    ``no_link``: a symbolic link raises :class:`LinkRefused`."""
    flags = os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC
    fd = open_no_link(path, flags) if no_link else os.open(path, flags)
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise OSError(errno.EINVAL, "not a regular file", str(path))
        return open(fd, "rb")
    except BaseException:
        os.close(fd)
        raise


def read_regular(path: str | Path, limit: int | None = None, *,
                 refuse_over: int | None = None, no_link: bool = False) -> bytes:
    """The bytes of the regular file ``path`` (at most ``limit``; :func:`open_regular`).

    ``refuse_over``: a file longer than this (its size from ``fstat``, before anything is
    read: a sparse file of 1 GiB takes 4 KB on disk) raises :class:`TooLarge`; ``no_link``:
    a symbolic link raises :class:`LinkRefused` (a file fedsim itself writes in place, such
    as a ledger's mark, is never a link)."""
    with open_regular(path, no_link=no_link) as handle:
        size = os.fstat(handle.fileno()).st_size
        if refuse_over is not None and size > refuse_over:
            raise TooLarge(path, size, refuse_over)
        if refuse_over is not None:  # (grown since the fstat: read no more than the cap)
            limit = refuse_over + 1 if limit is None else min(limit, refuse_over + 1)
        data = handle.read() if limit is None else handle.read(limit)
    if refuse_over is not None and len(data) > refuse_over:
        raise TooLarge(path, len(data), refuse_over)
    return data


def move_into_place(source: str | Path, target: str | Path, *, durability: Durability) -> None:
    """Rename the finished file ``source`` over ``target`` (same directory or file system),
    flushed as ``durability`` says (module docstring). For a file another program wrote (a
    compiler's output); :func:`write_atomically` writes and moves in one call."""
    _check(durability)
    with open(source, "rb") as handle:
        os.fsync(handle.fileno())
    os.replace(source, target)
    if durability == "durable":
        fsync_directory(Path(target).parent)


def write_atomically(
    path: str | Path, content: Content, *, durability: Durability, mode: int | None = None
) -> None:
    """Replace ``path`` by ``content`` atomically, flushed as ``durability`` says.

    ``content`` is bytes, text (UTF-8) or a function that writes into the open binary file
    (``np.savez``). ``mode``: the new file's permission bits (default: what ``open`` gives,
    0o666 less the umask). If writing raises, ``path`` keeps its old content (or stays absent)
    and the temporary file is removed."""
    replace_together({Path(path): (content, mode)}, durability=durability)


def replace_together(
    files: Mapping[Path, tuple[Content, int | None]], *, durability: Durability
) -> None:
    """Replace each path of ``files`` by its ``(content, mode)`` (as :func:`write_atomically`)
    as one step as far as a process can: every new content is written to a temporary file
    beside its target and fsynced first, so an error (a full disk) or an interrupt while
    writing leaves every target as it was and removes the temporary files; then all are
    renamed over their targets back to back, with Ctrl-C and SIGTERM held
    (:class:`uninterrupted`). For files that are only right together (a broker's password
    file, access list and the secrets they were made from). A power failure between two of
    the renames can still leave some replaced (``"durable"`` fsyncs the directories after)."""
    _check(durability)
    staged: list[tuple[Path, Path]] = []
    try:
        for target, (content, mode) in files.items():
            staged.append((_stage(target, content, mode), target))
        with uninterrupted():
            for temporary, target in staged:
                os.replace(temporary, target)
    except BaseException:
        for temporary, _ in staged:
            temporary.unlink(missing_ok=True)
        raise
    if durability == "durable":
        for directory in dict.fromkeys(target.parent for target in files):
            fsync_directory(directory)


def _stage(target: Path, content: Content, mode: int | None) -> Path:
    """``content`` in a new, fsynced temporary file beside ``target``, with ``mode``; removed
    if writing raises."""
    temporary = target.with_name(f".{target.name}.{os.getpid()}-{secrets.token_hex(4)}.tmp")
    # Created with ``mode`` already (less the umask), so a private file's content is never
    # readable by others between the write and the chmod below.
    fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666 if mode is None else mode)
    try:
        with open(fd, "wb") as handle:
            if isinstance(content, str):
                handle.write(content.encode("utf-8"))
            elif isinstance(content, bytes | bytearray | memoryview):
                handle.write(content)
            else:
                content(handle)
            handle.flush()
            os.fsync(handle.fileno())
        if mode is not None:
            os.chmod(temporary, mode)
    except BaseException:
        temporary.unlink(missing_ok=True)
        raise
    return temporary


_DEFERRED = (int(signal.SIGINT), int(signal.SIGTERM))
_raw_signal: Callable[[int, object], object] = _signal.signal
_SIG_DFL = int(signal.SIG_DFL)
_SIG_IGN = int(signal.SIG_IGN)


class uninterrupted:  # noqa: N801 - used like the function (and context manager) it was
    """Within the block Ctrl-C and SIGTERM wait: their handlers run when it ends.

    For a commit that writes to disk and then records the write in memory (a privacy ledger's
    spend): a KeyboardInterrupt raised between the two would leave the process believing in
    fewer records than the file holds, and an interrupted run would then report less spending
    than its ledger. Python runs signal handlers in the main thread only, so there the block
    swaps in handlers that note the signal, and the ones it replaced run (or the default
    action is taken) once it ends; in another thread no handler can interrupt it.

    A ledger spends once a round, so this is a class on ``_signal`` (the C module that
    :mod:`signal` wraps: the same calls without converting every handler to and from an enum,
    which was 3/4 of the block's cost), not a generator-based context manager. Masking the
    signals instead (``pthread_sigmask``) would not do: a signal the main thread blocks is
    delivered to another thread (torch's), whose C handler trips Python's handler in the main
    thread at once.
    """

    __slots__ = ("_pending", "_previous")

    def __init__(self) -> None:
        self._previous: list[object] | None = None
        self._pending: list[tuple[int, FrameType | None]] = []

    def _hold(self, signum: int, frame: FrameType | None) -> None:
        self._pending.append((signum, frame))

    def __enter__(self) -> None:
        if threading.current_thread() is threading.main_thread():
            hold = self._hold
            self._previous = [_raw_signal(s, hold) for s in _DEFERRED]

    def __exit__(self, *exc: object) -> None:
        previous = self._previous
        if previous is None:
            return
        self._previous = None
        # SIGTERM's handler back first, SIGINT's last: until SIGINT's is back, a signal that
        # comes is still held (a SIGTERM under fedsim.runtime.interrupted holds itself while
        # SIGINT is held), where SIGINT back first let a Ctrl-C's KeyboardInterrupt escape
        # with SIGTERM still held by this finished block, and every later SIGTERM lost.
        sigint_back = previous[0] if previous[0] is not None else _SIG_DFL
        try:
            _raw_signal(_DEFERRED[1], previous[1] if previous[1] is not None else _SIG_DFL)
        finally:
            _raw_signal(_DEFERRED[0], sigint_back)
        pending, self._pending = self._pending, []  # (a reused block replays nothing)
        for signum, frame in pending:
            handler = previous[_DEFERRED.index(signum)]
            if callable(handler):
                handler(signum, frame)
            elif handler != _SIG_IGN:  # the default action, now that it is back
                signal.raise_signal(signum)


def holds_for_a_block(handler: object) -> TypeGuard[Callable[[int, FrameType | None], None]]:
    """Whether ``handler`` is an :class:`uninterrupted` block's stand-in (the block holds
    SIGINT, then SIGTERM, on entry): a SIGTERM handler that finds SIGINT's held hands the
    SIGTERM to it, to run when the block ends, rather than passing it on as a SIGINT, which a
    block drops where SIGINT is ignored."""
    return callable(handler) and isinstance(getattr(handler, "__self__", None), uninterrupted)
