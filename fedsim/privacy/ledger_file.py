"""The ledger's file: a hash-chained JSON-lines log, a high-water mark beside it, and a lock.

File format ``fedsim-ledger/2`` (JSON lines, UTF-8):

* line 1, the header: ``{"format": "fedsim-ledger/2", "client_id", "sampling", "accountant",
  "budget": {"epsilon", "delta"} | null}``;
* one line per released step: ``{"time": t, "round": r, "step": {"sampling", "q", "sigma",
  "count"}, "prev": H}`` where ``H`` is the SHA-256 (hex) of the previous line's bytes (the
  header for the first record), so changing, deleting, inserting or reordering a line breaks
  the chain at the next one. A record written by :func:`repair_ledger` for records it could
  not recover also carries ``"repair": "..."``, and one of a spend that wrote ``k > 1``
  records carries ``"rest": n``, the records of that spend still to follow (``k - 1`` down to
  1; the spend's last record, like every record of a one-record spend, has none): a file
  whose last record has a ``rest`` ends inside a spend, which a mark whose newer slot is
  damaged must not be moved up over (:func:`~fedsim.privacy.ledger_mark.refuse_a_mark_maybe_a_spend_old`).

The *high-water mark* ``<ledger>.hwm`` holds the number of records and the hash of the last
line, and the most expensive step the records hold (a repair that lost records charges each at
least that, whatever a human names). Its format, in two checksummed slots written alternately,
is :mod:`fedsim.privacy.ledger_mark`'s; it is fsynced after the records it counts are on
disk. So on open: fewer records than the mark, or a different hash at the mark's count, is a
truncation or an edit and is refused (:class:`LedgerError`); more records than the mark is a
crash between the two writes (those records were fsynced; counting them is the safe
direction) and the mark is moved up. The mark also carries the exclusive lock: ``flock`` on its open file,
held for the ledger's lifetime, so a second writer, in this process or another, fails at
open. A lock belongs to an inode, not a name: replacing the mark (``mv``, ``cp`` to a new
file) would let a second writer lock the new file while the first keeps writing (issue 25,
finding 7a: 76 rounds written twice). So the holder checks that the name still leads to the
inode it locked, after taking the lock and before every write (:meth:`MarkFile.verify`), and
refuses to write once it does not: of two writers that a replaced mark let in, the one that
held the lock stops at its next spend. A ledger file without a mark is refused for writing
(records may have been cut off with it); read-only views verify its chain alone.

*Many ledgers in one process* (10^4-10^5 clients in one simulation) share one lock on their
directory and keep no file open between spends: :mod:`fedsim.privacy.ledger_directory_lock`.

Threat model: this detects accidents and careless edits (a cut file, a hand-edited value, a
deleted or duplicated line, a lost mark). It is not a signature: whoever can rewrite both
files and recompute the chain can forge a history.

Ledgers of the older format ``fedsim-ledger/1`` (no chain, no mark) cannot be checked; they
are refused with the command that adopts them (``fedsim ledger repair FILE --assume-lost 0``,
the user vouching that nothing was lost).
"""

from __future__ import annotations

import contextlib
import hashlib
import itertools
import json
import math
import os
import stat
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from fedsim.atomic import (
    LinkRefused,
    TooLarge,
    fsync_directory,
    locked_or_closed,
    open_no_link,
    read_regular,
    write_atomically,
)
from fedsim.config.limits import MAX_LEDGER_BYTES
from fedsim.errors import ConfigError, LedgerError, LedgerInUse
from fedsim.json_input import parse_json
from fedsim.privacy.events import (
    SAMPLING_SCHEMES,
    GaussianStep,
    PrivacyEvent,
    Sampling,
    TunedSelection,
)
from fedsim.privacy.ledger_directory_lock import check_directory_free, file_identity
from fedsim.privacy.ledger_mark import (
    MARK_FILE_BYTES,
    Mark,
    encode_mark,
    link_refused,
    mark_offset,
    mark_path,
    newest_mark,
    next_slot,
)

try:
    import fcntl
except ImportError:  # pragma: no cover - not POSIX
    fcntl = None  # type: ignore[assignment]

LEDGER_FORMAT = "fedsim-ledger/2"
OLD_FORMATS = ("fedsim-ledger/1",)
RECORD_KEYS = frozenset({"time", "round", "step", "prev"})
REST_KEY = "rest"
"""A record's count of its spend's records still to follow (module docstring)."""
SELECTION_KEYS = frozenset({"time", "round", "selection", "prev"})
"""A record of a tuned selection (:class:`TunedSelection`) has ``selection`` for ``step``."""
# A ledger line longer than this is damage, not a record (a record is ~150 bytes; a tuned
# selection lists its candidates' steps, up to a few per round).
MAX_LINE_BYTES = 4096
MAX_SELECTION_LINE_BYTES = 1 << 20


def too_long(line: bytes) -> bool:
    """Whether ``line`` is longer than a record may be: damage, not a record (the one rule of
    the reader and the repair; a tuned selection's line may be longer)."""
    return len(line) > (MAX_SELECTION_LINE_BYTES if b'"selection":' in line[:80]
                        else MAX_LINE_BYTES)


@dataclass(frozen=True, slots=True)
class LedgerRecord:
    """One released step (or tuned selection): when (virtual or wall time), in which round,
    and what."""

    time: float
    round: int
    step: PrivacyEvent

    def to_json(self) -> dict[str, Any]:
        key = "selection" if isinstance(self.step, TunedSelection) else "step"
        return {"time": self.time, "round": self.round, key: self.step.to_json()}


def line_hash(line: bytes) -> str:
    """The chain's hash of one line (without its newline)."""
    return hashlib.sha256(line).hexdigest()


def encode_record(record: LedgerRecord, prev: str, repair: str | None = None,
                  rest: int = 0) -> bytes:
    """The record's line: ``json.dumps`` of its fields and ``prev`` (without the newline);
    ``rest``: its spend's records still to follow (written when > 0, module docstring).

    A step's record (the one written every round) is formatted directly, to the same bytes:
    ``json.dumps`` writes a float as ``float.__repr__`` and an int as ``int.__repr__``, and
    the strings (a sampling scheme, a hex hash) need no escaping. Anything else (a tuned
    selection, a repair note, a spend's ``rest``, a value of another type) goes through
    ``json.dumps``.
    """
    step = record.step
    if (repair is None and not rest and type(step) is GaussianStep and type(record.time) is float
            and type(record.round) is int and type(step.count) is int
            and type(step.sampling) is str and step.sampling in _PLAIN_SAMPLINGS and _plain(prev)
            and math.isfinite(record.time)):
        return (f'{{"time": {float.__repr__(record.time)}, "round": {int.__repr__(record.round)}'
                f', "step": {{"sampling": "{step.sampling}", "q": {float.__repr__(step.q)}, '
                f'"sigma": {float.__repr__(step.sigma)}, "count": {int.__repr__(step.count)}}}, '
                f'"prev": "{prev}"}}').encode()
    obj: dict[str, Any] = {**record.to_json(), "prev": prev}
    if repair is not None:
        obj["repair"] = repair
    if rest:
        obj[REST_KEY] = int(rest)
    return json.dumps(obj, allow_nan=False).encode()


_PLAIN_SAMPLINGS = frozenset(SAMPLING_SCHEMES)


def _plain(text: str) -> bool:
    """``text`` is a str of ASCII letters and digits (a :func:`line_hash`), which JSON writes
    as they are."""
    return type(text) is str and text.isascii() and text.isalnum()


class MarkFile:
    """The high-water mark file, opened and exclusively locked (``flock``) until closed."""

    def __init__(self, path: Path, *, create: bool, directory_held: bool = False) -> None:
        """``directory_held``: this process holds the directory's
        :class:`~fedsim.privacy.ledger_directory_lock.DirectoryLock`
        (else a directory locked by anyone refuses the ledger)."""
        self.path = path
        if fcntl is None:  # pragma: no cover
            raise LedgerError("ledger locking needs a POSIX system (fcntl)")
        flags = os.O_RDWR | (os.O_CREAT if create else 0)
        try:
            self._fd = open_no_link(path, flags, 0o644)  # (a link: a victim file elsewhere)
        except FileNotFoundError:
            raise LedgerError(f"{path}: no high-water mark") from None
        except LinkRefused:
            raise link_refused(path, "high-water mark") from None
        except OSError as exc:  # a directory in its place, unreadable: damage, said as such
            raise LedgerError(f"{path}: the high-water mark cannot be opened "
                              f"({exc.strerror})") from None
        if not stat.S_ISREG(os.fstat(self._fd).st_mode):  # a FIFO, a device: no mark
            os.close(self._fd)
            self._fd = -1
            raise LedgerError(f"{path}: the high-water mark is not a regular file (a FIFO or "
                              f"a device where a mark should be)")
        if not locked_or_closed(self._fd):
            raise LedgerInUse(
                f"{path.with_suffix('')}: the ledger is open elsewhere (another process or "
                f"handle holds its lock); one ledger has one writer")
        self._identity = file_identity(os.fstat(self._fd))
        self.slot: int | None = None  # the slot of the newest mark read or written
        self.other_damaged = False  # the other slot, when read, held a damaged mark
        self.unreadable = False  # when read: the file held bytes, but no valid mark
        try:
            self.verify()  # replaced between the open and the lock: this lock guards nothing
            if not directory_held:
                check_directory_free(path.parent)
        except BaseException:
            self.close()
            raise

    def verify(self) -> None:
        """Raise :class:`LedgerError` unless the mark's name still leads to the file this
        object locked (a replaced or removed mark no longer excludes a second writer)."""
        try:
            current: tuple[int, int] | None = file_identity(os.stat(self.path))
        except FileNotFoundError:
            current = None
        if current != self._identity:
            raise LedgerError(
                f"{self.path.with_suffix('')}: its high-water mark {self.path.name} was "
                f"replaced or removed while this writer held its lock, so a second writer may "
                f"have opened the ledger; nothing more is written here (stop every writer of "
                f"this ledger, then `fedsim ledger check` it)")

    def read(self) -> Mark | None:
        """The newest valid mark (None: none); the next :meth:`write` goes to the other slot."""
        raw = os.pread(self._fd, MARK_FILE_BYTES, 0)
        found = newest_mark(raw)
        self.unreadable = found is None and bool(raw)
        self.slot = None if found is None else found.slot
        self.other_damaged = found is not None and found.other_damaged
        return None if found is None else found.mark

    def write(self, mark: Mark, *, sync: bool = True, verified: bool = False) -> None:
        """Write ``mark`` into the slot that does not hold the newest (:func:`next_slot`);
        fsynced unless ``sync=False`` (a new ledger's first mark, made durable by its first
        spend: :meth:`sync`). ``verified``: the caller ran :meth:`verify` before this write's
        records (a spend verifies once, before its records; a mark replaced after that check
        stops the writer at its next spend)."""
        if not verified:
            self.verify()
        slot = next_slot(self.slot)
        os.pwrite(self._fd, encode_mark(mark), mark_offset(mark, slot))
        self.slot, self.other_damaged = slot, False  # (the damaged slot is the one written)
        if sync:
            os.fsync(self._fd)

    def sync(self) -> None:
        os.fsync(self._fd)

    def write_both(self, mark: Mark, *, sync: bool = True) -> None:
        """Write ``mark`` into both slots, in its format, and nothing else (a repair's mark; a
        new ledger's first, over whatever an earlier mark file held): fsynced unless
        ``sync=False``."""
        self.verify()
        both = encode_mark(mark) * 2
        os.pwrite(self._fd, both, 0)
        os.ftruncate(self._fd, len(both))  # no slot of the other format is left to be read
        self.slot, self.other_damaged = 0, False  # (as read() finds it)
        if sync:
            os.fsync(self._fd)

    def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)  # releases the lock
            self._fd = -1


# -- reading -------------------------------------------------------------------------------------
def read_ledger_bytes(path: Path) -> bytes:
    """The bytes of the ledger file ``path``, for every reader of a whole ledger (a view, a
    check, a repair, an open): a regular file (a FIFO would block: EINVAL, an
    :class:`OSError`) of at most :data:`~fedsim.config.limits.MAX_LEDGER_BYTES`, refused from
    its size before anything is read (:class:`LedgerError`)."""
    try:
        return read_regular(path, refuse_over=MAX_LEDGER_BYTES)
    except TooLarge as exc:
        raise LedgerError(f"{path}: {exc.size:,} bytes, larger than any ledger "
                          f"({MAX_LEDGER_BYTES:,} bytes hold {MAX_LEDGER_BYTES // 512:,} "
                          f"records of 512 bytes, past the most rounds a scenario may run); "
                          f"not read") from None


@dataclass(frozen=True, slots=True)
class Parsed:
    """A ledger file read and verified: header, records and the chain's hash after each line
    (``hashes[0]`` is the header's)."""

    header: dict[str, Any]
    records: list[LedgerRecord]
    hashes: list[str]
    complete_bytes: int  # bytes up to the last newline (a crash-cut final line is after it)
    next_round: int = 0
    """After every round recorded, and one further for each substitute a repair wrote for a
    lost record (marked ``"repair"``, at round -1) after them:
    :attr:`fedsim.privacy.ledger.PrivacyLedger.next_round`."""
    inside_a_spend: bool = False
    """The last record says more of its spend follow (its ``rest``): the file ends inside a
    spend (a crash while the records were written, or records cut since)."""


def header_of(client_id: str, sampling: Sampling, accountant: str,
              budget: Mapping[str, float] | None) -> dict[str, Any]:
    return {"format": LEDGER_FORMAT, "client_id": client_id, "sampling": sampling,
            "accountant": accountant, "budget": None if budget is None else dict(budget)}


def _lines(path: Path, data: bytes) -> Iterator[tuple[int, bytes]]:
    start = 0
    number = 1
    while start < len(data):
        end = data.find(b"\n", start)
        if end < 0:
            return
        yield number, data[start:end]
        start, number = end + 1, number + 1


def parse_header(path: Path, line: bytes) -> dict[str, Any]:
    try:
        header = parse_json(line.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError):
        raise LedgerError(f"{path}: line 1: not a ledger header (not JSON)") from None
    if not isinstance(header, dict) or not isinstance(header.get("format"), str):
        raise LedgerError(f"{path}: line 1: not a ledger header")
    if header["format"] in OLD_FORMATS:
        raise LedgerError(
            f"{path}: a {header['format']} ledger has no hash chain, so a cut or edit cannot "
            f"be detected; if you vouch for it, adopt it with "
            f"`fedsim ledger repair {path} --assume-lost 0`")
    if header["format"] != LEDGER_FORMAT:
        raise LedgerError(f"{path}: line 1: not a {LEDGER_FORMAT} header")
    return header


def _parse_event(obj: dict[str, Any]) -> PrivacyEvent:
    """A record's event: its ``selection`` or its ``step``."""
    if "selection" in obj:
        if not isinstance(obj["selection"], dict):
            raise ValueError("selection must be an object")
        return TunedSelection.from_json(obj["selection"])
    step_obj = obj["step"]
    if not isinstance(step_obj, dict):
        raise ValueError("step must be an object")
    for field in ("q", "sigma"):  # JSON true is not a number here
        if isinstance(step_obj.get(field), bool):
            raise ValueError(f"step {field} must be a number, got {step_obj[field]!r}")
    return GaussianStep.from_json(step_obj)


def parse_record(obj: Any, sampling: str, *, repair_ok: bool = True) -> tuple[LedgerRecord, str]:
    """One record line's (record, prev hash); ValueError/ConfigError names what is wrong."""
    required = SELECTION_KEYS if isinstance(obj, dict) and "selection" in obj else RECORD_KEYS
    keys = required | {REST_KEY} | ({"repair"} if repair_ok else set())
    if not isinstance(obj, dict) or not required <= set(obj) or not set(obj) <= keys:
        raise ValueError(f"expected keys {sorted(RECORD_KEYS)}")
    rest = obj.get(REST_KEY, 1)
    if isinstance(rest, bool) or not isinstance(rest, int) or rest < 1:
        raise ValueError(f"rest must be an integer >= 1 where written, got {rest!r}")
    step = _parse_event(obj)
    if step.sampling not in (sampling, None):
        raise ValueError(f"a {step.sampling} step in a {sampling} ledger")
    time, round_, prev = obj["time"], obj["round"], obj["prev"]
    if isinstance(time, bool) or not isinstance(time, int | float) or not math.isfinite(time):
        raise ValueError(f"time must be a finite number, got {time!r}")
    if isinstance(round_, bool) or not isinstance(round_, int):
        raise ValueError(f"round must be an integer, got {round_!r}")
    if not isinstance(prev, str):
        raise ValueError("prev must be a hash")
    return LedgerRecord(float(time), round_, step), prev


def _reject_constant(name: str) -> float:
    raise ValueError(f"{name} is not a number")


def read_verified(path: Path, data: bytes) -> Parsed:
    """Parse and verify the complete lines of ``data`` (the bytes of ``path``): header, every
    record, the chain, and non-decreasing finite times. Raises :class:`LedgerError` at the
    first damaged line. The high-water mark is checked by the caller."""
    complete = complete_lines(path, data)
    lines = _lines(path, data[:complete])
    first = next(lines, None)
    if first is None:
        raise LedgerError(f"{path}: no header line")
    header = parse_header(path, first[1])
    hashes = [line_hash(first[1])]
    records: list[LedgerRecord] = []
    last_time = -math.inf
    next_round = 0
    rest = 0
    for number, line in lines:
        try:
            if too_long(line):
                raise ValueError(f"a line of {len(line)} bytes")
            obj = parse_json(line.decode("utf-8"), parse_constant=_reject_constant)
            record, prev = parse_record(obj, str(header.get("sampling")))
            if prev != hashes[-1]:
                raise ValueError("its hash chain is broken (this or the line before it was "
                                 "changed, or lines were removed or reordered)")
            if record.time < last_time:
                raise ValueError(f"time {record.time} goes back before {last_time}")
            next_round = next_round + 1 if "repair" in obj else max(next_round,
                                                                      record.round + 1)
            rest = obj.get(REST_KEY, 0)
        except UnicodeDecodeError:
            raise LedgerError(f"{path}: line {number}: damaged record (not UTF-8)") from None
        except (ValueError, ConfigError) as exc:
            raise LedgerError(f"{path}: line {number}: damaged record ({exc})") from None
        last_time = record.time
        records.append(record)
        hashes.append(line_hash(line))
    return Parsed(header, records, hashes, complete, next_round, rest > 0)


def check_mark(path: Path, parsed: Parsed, mark: Mark | None) -> None:
    """Refuse a ledger shorter than its mark or different at the mark's count."""
    if mark is None:
        return
    count = len(parsed.records)
    if count < mark.count:
        raise LedgerError(
            f"{path}: holds {count} records but {mark.count} were acknowledged (the file "
            f"was cut or lines were removed, or its mark file is another ledger's); `fedsim "
            f"ledger repair` adds the lost spending")
    if parsed.hashes[mark.count] != mark.last_hash:
        raise LedgerError(
            f"{path}: record {mark.count} is not the one acknowledged (the file was edited, "
            f"or its mark file is another ledger's); `fedsim ledger repair` adds the spending "
            f"it cannot verify")


# -- writing -------------------------------------------------------------------------------------
def write_new(path: Path, payload: bytes, *, durable: bool = True) -> None:
    """Create ``path`` with ``payload``, durably (file and directory entry) unless
    ``durable=False`` (a new ledger's header: its first spend makes it durable)."""
    fd = _open_ledger_for_writing(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_APPEND)
    try:
        _write_all(fd, payload)
        if durable:
            os.fsync(fd)
    finally:
        os.close(fd)
    if durable:
        fsync_directory(path.parent)


def sync_file(path: Path) -> None:
    """fsync the file at ``path`` (through a descriptor opened for it alone)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


_entries = itertools.count()
_directories_synced: dict[str, int] = {}


def entry_created() -> int:
    """A number for a directory entry just created (see :func:`sync_entries`)."""
    return next(_entries)


def sync_entries(directory: Path, created: int) -> None:
    """Make the directory entry numbered ``created`` (:func:`entry_created`) durable: fsync
    ``directory`` unless it was fsynced after that entry was created. One fsync covers every
    entry created before it: the first spends of a simulation's ledgers, created together,
    cost one directory fsync between them, not one each."""
    key = str(directory)
    if _directories_synced.get(key, -1) > created:
        return
    covered = next(_entries)  # every entry numbered below this one exists now
    fsync_directory(directory)
    _directories_synced[key] = max(covered, _directories_synced.get(key, -1))


def open_append(path: Path) -> int:
    """A descriptor that appends to the existing file at ``path`` (``O_APPEND``; a symbolic
    link is refused, :class:`LedgerError`)."""
    return _open_ledger_for_writing(path, os.O_WRONLY | os.O_APPEND)


def _open_ledger_for_writing(path: Path, flags: int) -> int:
    """``open_no_link(path, flags, 0o644)``: a ledger file that is a symbolic link (planted to
    have its records appended to a file elsewhere) is a :class:`LedgerError` naming it."""
    try:
        return open_no_link(path, flags, 0o644)
    except LinkRefused:
        raise link_refused(path, "ledger file") from None


def append_durably(fd: int, payload: bytes, *, fsync: bool = True) -> None:
    """Append ``payload`` to the file open at ``fd`` (:func:`open_append`), then fsync it
    (unless ``fsync=False``: written through to the operating system, a simulated run's
    ledger, made durable with its others by :class:`fedsim.atomic.FileSystemSync`).

    ``os.write`` straight to the descriptor, no buffer in between: a short write continues
    where it stopped, and an error leaves at most a prefix of ``payload`` at the file's end
    (an unterminated line, never acknowledged: :func:`cut_partial_line`), with nothing kept
    in memory that a later write or close could still flush.
    """
    _write_all(fd, payload)
    if fsync:
        os.fsync(fd)


def _write_all(fd: int, payload: bytes) -> None:
    """``os.write`` until all of ``payload`` is written (a short write continues where it
    stopped; the common single write makes no memoryview)."""
    written = os.write(fd, payload)
    if written != len(payload):
        rest = memoryview(payload)[written:]
        while rest:
            rest = rest[os.write(fd, rest):]


def complete_lines(path: Path, data: bytes) -> int:
    """Where ``data`` (the bytes of the ledger ``path``)'s complete lines end: what follows
    is an unterminated final line, a write cut by a crash (never acknowledged). A spend writes
    whole lines in one ``write``, so a cut leaves at most one record's line unterminated:
    an unterminated part longer than a record may be is damage, refused with every byte
    kept for ``fedsim ledger repair``, not skipped or cut off as a crash's."""
    complete = data.rfind(b"\n") + 1
    if too_long(data[complete:complete + MAX_SELECTION_LINE_BYTES + 1]):  # a bounded copy
        raise LedgerError(
            f"{path}: its last {len(data) - complete} bytes have no line end and are longer "
            f"than any record, so they are not a write cut by a crash but damage; "
            f"`fedsim ledger repair {path}` drops them")
    return complete


def cut_partial_line(path: Path, data: bytes) -> bytes:
    """Drop an unterminated final line (a write cut by a crash, never acknowledged;
    :func:`complete_lines`)."""
    complete = complete_lines(path, data)
    if complete < len(data):
        fd = _open_ledger_for_writing(path, os.O_WRONLY)
        try:
            os.ftruncate(fd, complete)
            os.fsync(fd)
        finally:
            os.close(fd)
    return data[:complete]


def copy_ledger(source: Path, target: Path) -> None:
    """Copy a ledger and its high-water mark (a copy without its mark is verified by its chain
    alone). Each copy is written to a new file beside its target and renamed over it
    (:func:`~fedsim.atomic.write_atomically`): a target that is a symbolic link is replaced,
    never written through (an attacker's review: a resumed launch's collect copied a mark
    through a link planted in the run directory onto a file elsewhere); the ledger read is
    bounded (:func:`read_ledger_bytes`)."""
    write_atomically(target, read_ledger_bytes(source), durability="file")
    source_mark = mark_path(source)
    if source_mark.exists():
        write_atomically(mark_path(target), read_regular(source_mark, MARK_FILE_BYTES),
                         durability="file")


@contextlib.contextmanager
def locked(path: Path) -> Iterator[MarkFile]:
    """The ledger's mark file, locked, for commands that rewrite a ledger (repair)."""
    mark = MarkFile(mark_path(path), create=True)
    try:
        yield mark
    finally:
        mark.close()
