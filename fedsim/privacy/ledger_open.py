"""What opening a ledger finds in its file, and does about it.

:meth:`fedsim.privacy.ledger.PrivacyLedger.open` takes the ledger's lock and reads its file
and high-water mark (:mod:`fedsim.privacy.ledger_file`, :mod:`fedsim.privacy.ledger_mark`):

* a file without a complete line that is empty or a beginning of the header it would be
  created with (and a mark of 0 records or none), or a header alone without a mark, is a
  ledger whose run stopped before its first spend was acknowledged: it is (re)created, or
  resumed from its header. A first spend makes the header and the mark durable before its
  records, and records only add bytes, so anything else without a complete line (bytes a
  header cannot begin with, a file longer than a header: zeros over a ledger's records) is
  damage, and so is a mark file that holds bytes but no valid mark (an audit: a zero-filled
  ledger and mark were recreated at epsilon 0, and spent 68 rounds past the budget);
* a final line without its terminating newline is a write that was cut by a crash before the
  fsync returned, so it was never acknowledged and the update was never released: it is
  ignored and cut off the file (later lines append cleanly);
* every newline-terminated line must parse and continue the hash chain, and the file must
  reach the high-water mark; anything else (a damaged line, a bad header, a header that
  disagrees with the arguments, a cut or edited file) raises :class:`LedgerError`. A ledger is
  never reset (``fedsim ledger repair`` may only add spending). Complete lines are always
  counted, even if the process died before ``spend`` returned: counting a release that may
  not have happened is the safe direction.

A read-only view (reports, ``fedsim account --ledger``, ``fedsim ledger check``) checks the
same and changes nothing: a crash's unterminated final line is skipped, not cut off.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from fedsim.errors import LedgerError
from fedsim.privacy.events import GaussianStep
from fedsim.privacy.ledger_directory_lock import DirectoryLock
from fedsim.privacy.ledger_file import (
    LedgerRecord,
    MarkFile,
    Parsed,
    check_mark,
    cut_partial_line,
    line_hash,
    parse_header,
    read_ledger_bytes,
    read_verified,
    write_new,
)
from fedsim.privacy.ledger_mark import (
    NO_STEPS,
    FoundMark,
    Mark,
    StepCeiling,
    link_refused,
    mark_path,
    read_found_mark,
    refuse_a_mark_maybe_a_spend_old,
)

__all__ = ["Found", "drop_lock", "holds_records", "open_file", "read_ledger_steps", "read_view"]


@dataclass(frozen=True)
class Found:
    """A ledger's file as an open found it, verified (or created)."""

    records: list[LedgerRecord]
    last_hash: str  # the chain's hash of the last line (the header's for no records)
    resume_at: int  # the file's next round (:attr:`fedsim.privacy.ledger_file.Parsed.next_round`)
    ceiling: StepCeiling | None  # the mark's step ceiling, raised to the records
    mark: MarkFile | None = None  # the ledger's lock, held (None: a read-only view)


def open_file(path: Path, header: dict[str, Any], directory: DirectoryLock | None, *,
              fsync: bool) -> Found:
    """Take ``path``'s lock (under ``directory``: claimed there too) and find its records, or
    create it (module docstring); the lock is held in the answer, dropped on an error."""
    path.parent.mkdir(parents=True, exist_ok=True)
    if path.exists() and not path.is_file():
        raise LedgerError(f"{path}: not a file (a ledger is one file of JSON lines)")
    lock = _take_lock(path, directory)
    try:
        mark = lock.read()
        data = read_ledger_bytes(path) if path.exists() else b""
        if lock.unreadable:
            raise LedgerError(
                f"{path}: its high-water mark ({mark_path(path).name}) holds no valid mark, "
                f"so whether spends were cut from the ledger cannot be told; a ledger is never "
                f"reset: `fedsim ledger check` says what is left, `fedsim ledger repair` "
                f"adopts what can be adopted")
        if b"\n" not in data and (mark is None or mark.count == 0):
            _refuse_unless_a_cut_creation(path, data, header)
            # New, or created by a run that stopped before its first spend (not even a
            # complete header: nothing was acknowledged).
            return _create(path, header, lock)  # (a link in its place: replaced, not followed)
        if path.is_symlink():  # its records would be cut and appended through the link
            raise link_refused(path, "ledger file")
        if mark is None and data.count(b"\n") != 1:
            parse_header(path, data.split(b"\n", 1)[0])  # an old format says so first
            raise LedgerError(
                f"{path}: no high-water mark ({mark_path(path).name}), so a cut file "
                f"cannot be detected; `fedsim ledger repair {path} --assume-lost N` "
                f"adopts it")
        # Verified first, cut after: a final line without its newline is a crash's torn
        # write, dropped - but not before the rest verifies against the mark (a ledger
        # refused keeps every byte for its repair).
        parsed = _read(path, data[:data.rfind(b"\n") + 1], header, mark)
        records, last, resume_at = parsed.records, parsed.hashes[-1], parsed.next_round
        refuse_a_mark_maybe_a_spend_old(path, mark, lock.other_damaged, len(records),
                                        parsed.inside_a_spend)
        cut_partial_line(path, data)
        ceiling = _ceiling_of(mark, records)
        if mark is None or len(records) > mark.count:
            # A header alone and no mark (created by a run that stopped before its first
            # spend made the mark durable: nothing was acknowledged; the header is checked
            # like any other), or a crash between the two writes: move the mark up.
            _move_up(lock, Mark(len(records), last, ceiling), first=mark is None, fsync=fsync)
        return Found(records, last, resume_at, ceiling, lock)
    except BaseException:
        drop_lock(lock, path, directory)
        raise


def _header_line(header: dict[str, Any]) -> bytes:
    return json.dumps(header).encode()


def _refuse_unless_a_cut_creation(path: Path, data: bytes, header: dict[str, Any]) -> None:
    """Raise :class:`LedgerError` unless ``data`` (a file without a complete line) is what a
    creation cut before its first spend leaves: nothing, or a beginning of its header line."""
    if (_header_line(header) + b"\n").startswith(data):
        return
    raise LedgerError(
        f"{path}: {len(data)} bytes without a complete line, which are not the beginning of "
        f"the ledger's header: damage (a ledger cut before its first spend holds at most a "
        f"part of its header); a ledger is never reset: `fedsim ledger check` says what is "
        f"left, `fedsim ledger repair` adopts what can be adopted")


def _create(path: Path, header: dict[str, Any], lock: MarkFile) -> Found:
    """A new ledger: its mark of 0 records, then its header, written without an fsync (its
    first spend makes them durable before its own records:
    :meth:`~fedsim.privacy.ledger.PrivacyLedger._make_creation_durable`)."""
    line = _header_line(header)
    # Both slots: a mark file left by an earlier start (another format, or damaged) keeps
    # nothing that a later open could read as a damaged slot (a review: refused).
    lock.write_both(Mark(0, line_hash(line), NO_STEPS), sync=False)
    if os.path.lexists(path):  # (a dangling link too: replaced, never written through)
        path.unlink()
    write_new(path, line + b"\n", durable=False)
    return Found([], line_hash(line), 0, NO_STEPS, lock)


def read_view(path: Path, header: dict[str, Any]) -> Found:
    """A ledger's records for a read-only view: nothing locked or changed (module docstring)."""
    if not path.exists():
        raise LedgerError(f"{path}: no such ledger")
    found = read_found_mark(path)  # before the records: a writer moves it after them
    mark = None if found is None else found.mark
    parsed = _read(path, read_ledger_bytes(path), header, mark)
    _refuse_a_view_maybe_a_spend_old(path, found, parsed)
    return Found(parsed.records, parsed.hashes[-1], parsed.next_round,
                 _ceiling_of(mark, parsed.records))


def _read(path: Path, data: bytes, expected: dict[str, Any], mark: Mark | None) -> Parsed:
    """A ledger's bytes, verified (chain, mark, header)."""
    if not data:
        raise LedgerError(f"{path}: empty, but its high-water mark counts "
                          f"{mark.count if mark else 0} records (the file was cut)")
    parsed = read_verified(path, data)
    for field in ("client_id", "sampling", "accountant", "budget"):
        if parsed.header.get(field) != expected[field]:
            raise LedgerError(f"{path}: header {field}={parsed.header.get(field)!r} but the "
                              f"ledger was opened with {expected[field]!r} (a ledger is never "
                              f"reset)")
    check_mark(path, parsed, mark)
    return parsed


def _ceiling_of(mark: Mark | None, records: list[LedgerRecord]) -> StepCeiling | None:
    """The step ceiling a ledger opened with ``mark`` and ``records`` carries: the mark's,
    raised to the records (a ceiling is only ever raised; None: an old mark keeps its
    format)."""
    held = NO_STEPS if mark is None else mark.ceiling
    return None if held is None else held.including(records)


def _refuse_a_view_maybe_a_spend_old(path: Path, found: FoundMark | None,
                                     parsed: Parsed) -> None:
    """A read-only view (reports, ``fedsim account --ledger``, ``fedsim ledger check``)
    refuses what the client's own open refuses (:func:`refuse_a_mark_maybe_a_spend_old`): a
    file holding just the count of a mark whose other slot is damaged may have lost the last
    spend's records, and an eps read from it may be below what was released. A writer's torn
    mark write cannot look like that to a reader: it writes the records before the mark."""
    if found is not None:
        refuse_a_mark_maybe_a_spend_old(path, found.mark, found.other_damaged,
                                        len(parsed.records), parsed.inside_a_spend)


def _move_up(lock: MarkFile, mark: Mark, *, first: bool, fsync: bool) -> None:
    """Write ``mark`` over one the file's records outgrew, or as its ``first`` (into both slots,
    unsynced: whatever the mark file held is then no slot a later open reads as damaged)."""
    if first:
        lock.write_both(mark, sync=False)
    else:
        lock.write(mark, sync=fsync)


def _take_lock(path: Path, directory: DirectoryLock | None) -> MarkFile:
    """The ledger's lock for opening it (under ``directory``: also claimed there)."""
    if directory is None:
        return MarkFile(mark_path(path), create=True)
    directory.claim(path)
    try:
        return MarkFile(mark_path(path), create=True, directory_held=True)
    except BaseException:
        directory.release(path)
        raise


def drop_lock(lock: MarkFile, path: Path, directory: DirectoryLock | None) -> None:
    lock.close()
    if directory is not None:
        directory.release(path)


def holds_records(path: Path) -> bool:
    """Whether the ledger file at ``path`` holds anything past its header line: a record, or
    a piece of one (a spend cut short is still a spend attempted); a file that cannot be read
    is taken to hold some. For a caller about to remove a run that failed at its start: a
    ledger that recorded anything is never removed with it."""
    try:
        with path.open("rb") as handle:
            first = handle.readline()
            return not first.endswith(b"\n") or bool(handle.read(1))
    except OSError:
        return True


def read_ledger_steps(path: str | Path) -> Iterable[GaussianStep]:
    """The steps recorded in a ledger file (verified: chain and, if present, the mark),
    without opening it for writing."""
    path = Path(path)
    found = read_found_mark(path)  # before the records: a writer moves it after them
    parsed = read_verified(path, read_ledger_bytes(path))
    check_mark(path, parsed, None if found is None else found.mark)
    _refuse_a_view_maybe_a_spend_old(path, found, parsed)
    steps = [record.step for record in parsed.records]
    if not all(isinstance(step, GaussianStep) for step in steps):
        raise LedgerError(f"{path}: holds a tuned selection (a sweep's tuning ledger): its eps "
                          f"is the ledger's own (rdp accountant), not a composition of steps; "
                          f"`fedsim ledger check {path}` prints it")
    return [step for step in steps if isinstance(step, GaussianStep)]
