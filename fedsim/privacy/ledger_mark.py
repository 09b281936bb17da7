"""The ledger's high-water mark: its format, and reading it without a lock.

A ledger's mark ``<ledger>.hwm`` (:mod:`fedsim.privacy.ledger_file`, which holds it open and
locked) counts the records acknowledged, the hash of the last one, and the most expensive step
the records hold (:class:`StepCeiling`). It is written in place, in two checksummed slots used
alternately (:func:`next_slot`: a torn write leaves the other slot intact).

* Format ``fedsim-hwm/2``: two 256-byte slots, each
  ``fedsim-hwm/2 COUNT HASH Q SIGMA STEPS SELECTIONS CRC32`` padded with spaces and ended by a
  newline.
* Format ``fedsim-hwm/1`` (a ledger made before the ceiling): two 128-byte slots,
  ``fedsim-hwm/1 COUNT HASH CRC32``; kept until a repair rewrites both slots in the new one.

The newest valid mark of either format is the one with the most records (:func:`newest_mark`);
a slot that holds bytes but no valid mark is *damaged*, and the mark beside it may be a spend
old (:func:`refuse_a_mark_maybe_a_spend_old`).
"""

from __future__ import annotations

import dataclasses
import functools
import math
import os
import zlib
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from fedsim.atomic import LINK_REFUSED, LinkRefused, open_no_link, read_regular
from fedsim.errors import LedgerError
from fedsim.privacy.events import GaussianStep, Sampling

if TYPE_CHECKING:
    from fedsim.privacy.ledger_file import LedgerRecord

_MARK_SLOT = 256
_MARK_MAGIC = "fedsim-hwm/2"
_OLD_MARK_SLOT = 128  # fedsim-hwm/1: no ceiling
_OLD_MARK_MAGIC = "fedsim-hwm/1"

MARK_FILE_BYTES = 2 * _MARK_SLOT
"""A mark file's bytes that can hold its newest mark (both slots of either format)."""



def link_refused(path: Path, what: str) -> LedgerError:
    """The error for a ledger's file (``what``: "ledger file", "high-water mark") that is a
    symbolic link: refused, never written through (:class:`~fedsim.atomic.LinkRefused`)."""
    return LedgerError(f"{path}: the {what} {LINK_REFUSED}")

def mark_path(path: Path) -> Path:
    return path.with_name(path.name + ".hwm")


@dataclass(frozen=True, slots=True)
class StepCeiling:
    """The most expensive step a ledger's records hold, kept in its high-water mark: the
    largest ``q`` and the smallest ``sigma`` of any Gaussian step (the training rounds', the
    releases' before round one - DP normalisation, DP-PCA - and a repair's substitutes'), the
    most steps one record holds, and whether any record was a tuned selection.

    A subsampled Gaussian's privacy loss grows with ``q`` and falls with ``sigma`` under both
    neighbouring relations fedsim accounts (Poisson: add/remove one record; fixed size:
    replace one; Mironov, Talwar and Zhang 2019, "Renyi Differential Privacy of the Sampled
    Gaussian Mechanism"; Zhu, Dong and Wang 2022, "Optimal Accounting of Differential Privacy
    via Characteristic Function"), and composing more steps never costs less, so
    :meth:`step` costs at least as much as any one record. A repair that lost records charges
    each at least that (:mod:`fedsim.privacy.ledger_repair`): a noise schedule that falls over
    the rounds, cut at its end, a lost release, a lost substitute or an emptied ledger is then
    charged the dearest step the ledger ever recorded, not only what the surviving records
    show."""

    q: float = 0.0
    sigma: float = math.inf
    steps: int = 0
    selections: bool = False
    text: str = dataclasses.field(init=False, repr=False, compare=False)
    """The mark's fields for it, written once (a spend's mark reuses them)."""

    def __post_init__(self) -> None:
        object.__setattr__(self, "text", f"{float.__repr__(float(self.q))} "
                                         f"{float.__repr__(float(self.sigma))} "
                                         f"{self.steps} {int(self.selections)}")

    def including(self, records: Iterable[LedgerRecord]) -> StepCeiling:
        """This ceiling raised to cover ``records`` (itself when they are under it: a spend's
        common case allocates nothing)."""
        q, sigma, steps, selections = self.q, self.sigma, self.steps, self.selections
        for record in records:
            step = record.step
            if isinstance(step, GaussianStep):
                q, sigma, steps = max(q, step.q), min(sigma, step.sigma), max(steps, step.count)
            else:
                selections = True
        if (q, sigma, steps, selections) == (self.q, self.sigma, self.steps, self.selections):
            return self
        return _shared_ceiling(q, sigma, steps, selections)

    def step(self, sampling: Sampling) -> GaussianStep | None:
        """The dearest step, ``steps`` times (None: no Gaussian step was recorded)."""
        if self.steps == 0:
            return None
        return GaussianStep(sampling, self.q, self.sigma, self.steps)

    def to_json(self) -> dict[str, Any]:
        return {"q": self.q, "sigma": self.sigma if math.isfinite(self.sigma) else None,
                "steps": self.steps, "selections": self.selections}


# Ledgers at one ceiling share one object (about 220 bytes with its text) while it is among
# the last 4,096 made: clients of one posture and equal record counts share one; clients whose
# q differs (a fixed batch over their own record count) hold one each.
_shared_ceiling = functools.lru_cache(maxsize=4096)(StepCeiling)

NO_STEPS = StepCeiling()
"""The ceiling of a ledger with no records."""


@dataclass(frozen=True, slots=True)
class Mark:
    count: int
    last_hash: str
    ceiling: StepCeiling | None = None
    """None: a mark of the old format (``fedsim-hwm/1``), which has no room for it."""


def encode_mark(mark: Mark) -> bytes:
    ceiling = mark.ceiling
    if ceiling is None:
        body = f"{_OLD_MARK_MAGIC} {mark.count} {mark.last_hash}"
        slot = _OLD_MARK_SLOT
    else:
        body = f"{_MARK_MAGIC} {mark.count} {mark.last_hash} {ceiling.text}"
        slot = _MARK_SLOT
    text = f"{body} {zlib.crc32(body.encode()):08x}".encode()
    if len(text) >= slot:  # (a count of over 100 digits) would spill into the other slot
        raise LedgerError(f"a high-water mark of {len(text)} bytes does not fit its slot")
    return text.ljust(slot - 1) + b"\n"


def mark_offset(mark: Mark, slot: int) -> int:
    """Where ``mark`` goes: slot ``slot`` (0 or 1) of its format's two."""
    return slot * (_OLD_MARK_SLOT if mark.ceiling is None else _MARK_SLOT)


def next_slot(newest: int | None) -> int:
    """The slot the next mark goes to: the one not holding the newest, so a torn write leaves
    the newest intact however many records each write counts (slots were formerly chosen by
    the count's parity, and a writer of two records a spend wrote one slot only)."""
    return 0 if newest is None else 1 - newest


def decode_mark(slot: bytes) -> Mark | None:
    """The mark in one slot of either format, or None (torn, damaged, empty)."""
    try:
        fields = slot.decode("ascii").split()
        magic, crc = fields[0], fields[-1]
        body = " ".join(fields[:-1])
        if int(crc, 16) != zlib.crc32(body.encode()):
            return None
        if magic == _OLD_MARK_MAGIC and len(fields) == 4 and len(slot) == _OLD_MARK_SLOT:
            return Mark(int(fields[1]), fields[2])
        if magic != _MARK_MAGIC or len(fields) != 8 or len(slot) != _MARK_SLOT:
            return None
        q, sigma, steps, selections = (float(fields[3]), float(fields[4]), int(fields[5]),
                                       fields[6])
        if not (0.0 <= q <= 1.0 and sigma > 0.0 and steps >= 0 and selections in ("0", "1")):
            return None
        return Mark(int(fields[1]), fields[2], StepCeiling(q, sigma, steps, selections == "1"))
    except (UnicodeDecodeError, ValueError, IndexError):
        return None


@dataclass(frozen=True, slots=True)
class FoundMark:
    """The newest valid mark of a mark file, the slot it is in (0 or 1), and whether the other
    slot of its format holds bytes that are not a valid mark (torn or damaged): that slot may
    have held a newer mark, counting records written since, so this one may be a spend old."""

    mark: Mark
    slot: int
    other_damaged: bool


def newest_mark(data: bytes) -> FoundMark | None:
    """The newest valid mark in a mark file's first bytes: slots of either format (a ledger of
    the old format keeps it until a repair rewrites both slots in the new one). Of equal
    counts, one with a ceiling, then slot 0."""
    candidates = [(decode_mark(data[k * size:(k + 1) * size]), k, size)
                  for size in (_MARK_SLOT, _OLD_MARK_SLOT) for k in (0, 1)]
    valid = [(mark, k, size) for mark, k, size in candidates if mark is not None]
    if not valid:
        return None
    mark, slot, size = max(valid, key=lambda m: (m[0].count, m[0].ceiling is not None, -m[1]))
    other = data[(1 - slot) * size:(2 - slot) * size]  # empty: never written (a new ledger's)
    return FoundMark(mark, slot, bool(other) and decode_mark(other) is None)


def write_mark_at(path: Path, mark: Mark, slot: int, *, sync: bool = True) -> None:
    """:meth:`MarkFile.write` into ``slot`` (:func:`next_slot` of the one holding the newest)
    through a descriptor opened for this write alone (a ledger under a :class:`~fedsim.privacy.ledger_directory_lock.DirectoryLock`,
    whose lock covers it)."""
    try:
        fd = open_no_link(path, os.O_RDWR)
    except LinkRefused:
        raise link_refused(path, "high-water mark") from None
    try:
        os.pwrite(fd, encode_mark(mark), mark_offset(mark, slot))
        if sync:
            os.fsync(fd)
    finally:
        os.close(fd)


def read_found_mark(path: Path) -> FoundMark | None:
    """The high-water mark of the ledger at ``path`` and its slots' state, without locking
    it (read-only views)."""
    try:
        data = read_regular(mark_path(path), MARK_FILE_BYTES, no_link=True)
    except FileNotFoundError:
        return None
    except LinkRefused:  # (said as what it is: not "missing", which a repair would write)
        raise LedgerError(f"{link_refused(mark_path(path), 'high-water mark')}; a ledger's "
                          f"mark is a file of its own (replace the link by the mark it should "
                          f"be, or remove it and repair)") from None
    except OSError as exc:  # a directory in its place, unreadable: damage, said as such
        raise LedgerError(f"{mark_path(path)}: the high-water mark cannot be read "
                          f"({exc.strerror})") from None
    return newest_mark(data)


def read_mark(path: Path) -> Mark | None:
    """The high-water mark of the ledger at ``path`` without locking it (read-only views)."""
    found = read_found_mark(path)
    return None if found is None else found.mark


def refuse_a_mark_maybe_a_spend_old(path: Path, mark: Mark | None, other_damaged: bool,
                                    records: int, inside_a_spend: bool = False) -> None:
    """The one rule for opening (and checking) a ledger whose mark's other slot is damaged:
    that slot may have held the newer mark, so the valid one may be a spend old. A torn mark
    write (the slots' purpose) leaves its spend's records past the older mark, whole, which an
    open moves the mark up to; a file holding *just* the valid slot's count, or ending inside
    a spend (``inside_a_spend``: its last record says more follow), may have lost records the
    damaged one counted, and is refused. (A repair asks in every case: the file it mends is
    damaged already, ``ledger_repair``.)"""
    if mark is not None and other_damaged and records > mark.count and inside_a_spend:
        raise LedgerError(
            f"{path}: one slot of its high-water mark is damaged and the file ends inside a "
            f"spend (its last record says more of that spend's records follow), so records "
            f"were cut; `fedsim ledger repair {path} --assume-lost N --lost-step Q SIGMA` "
            f"adds them (N: at least the records that last record says follow)")
    if mark is not None and other_damaged and records == mark.count:
        floor = mark.ceiling
        dearest = (f"; Q and SIGMA at least as dear as the valid slot's step ceiling, q "
                   f"{floor.q:.6g} and sigma {floor.sigma:.6g} (the damaged slot may have held "
                   f"a dearer one, which only you can name)"
                   if floor is not None and floor.steps else "")
        raise LedgerError(
            f"{path}: one slot of its high-water mark is damaged and the file holds just the "
            f"{mark.count} records the other counts, so records counted by the damaged one "
            f"may have been cut; `fedsim ledger repair {path} --assume-lost N --lost-step Q "
            f"SIGMA` adds them (N: the records the client's last spend wrote, 0 if you know "
            f"none were lost{dearest})")
