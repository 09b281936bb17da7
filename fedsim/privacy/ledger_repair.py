"""Checking and repairing a damaged ledger file: a repair may only add spending.

:func:`repair_ledger` rewrites a ledger that :meth:`PrivacyLedger.open` refuses (cut, edited,
lines deleted or duplicated, damaged lines, no high-water mark, or the old unchained format)
into a valid chained ledger whose spending is at least what the damaged file held:

* every record that still parses is kept, in file order, duplicates included (a duplicate is
  more spending; dropping it could drop a real release). A non-finite or backward time is set
  to the time before it (times carry no spending);
* every record the high-water mark says was acknowledged but that cannot be verified gets a
  substitute: one record of ``lost_step`` per such record, marked ``"repair"``. With the
  mark's count ``M`` and a chain verified over the first ``V < M`` records, the records from
  ``max(V - 1, 0)`` on are unverified by it (an edit without rehashing breaks the chain right
  after the edited line, and the last line a cut left has no line after it to show an edit,
  so the last record verified is not trusted either) - except the ``T`` the mark vouches for
  from the end: the record whose hash is the mark's last hash and each one before it whose
  hash is the next one's ``prev`` (:func:`_vouched_tail`; a line deleted or damaged near the
  beginning of a long ledger no longer charges its whole history again). So
  ``max(M - max(V - 1, 0) - T, 0)`` substitutes; if the chain verifies past ``M`` but the
  hash at ``M`` is not the mark's, the chain was recomputed and all ``M`` are substituted.
  Unparseable lines beyond the mark also get one substitute each (a step a human names:
  :func:`_unreadable_past`);
* without a usable mark (lost, or a ``fedsim-ledger/1`` file) nobody knows how many records
  were lost: the caller must say (``assume_lost``; 0 is the user vouching for the file), and
  records after a chain break are substituted as above.

A substitute is written at round -1 (what it released is unknown, its round too); a client
resuming the repaired ledger numbers its rounds past one per substitute
(:attr:`~fedsim.privacy.ledger.PrivacyLedger.next_round`), so no round it may have released is
numbered again.

The substitute step is the mark's step ceiling (:class:`~fedsim.privacy.ledger_mark.StepCeiling`:
the most expensive step of every record it counts, the lost ones included: rounds, releases
before round one, an earlier repair's substitutes), raised to the readable records past the
mark, unless a caller names a dearer one (``lost_step``). Under a mark of the old format
(``fedsim-hwm/1``, no ceiling) or none, the ledger cannot know what a lost record released, so
a human must name a step at least as expensive (typically the client's smallest sigma and
largest q). A step may not be cheaper than the ceiling or than what the kept records show the
client released: a ``lost_step`` with a smaller q or a larger sigma than any kept record's is
refused (issue 25, finding 7c: ``--lost-step 0.000001 1000`` took eps 3.64 down to 3.39), the
releases before round one included (DP normalisation, DP-PCA: round -1, q = 1; only an earlier
repair's substitutes are no evidence), and each lost record is charged as many steps as the
largest record holds (a round of ``local_steps`` steps is one record).

A ledger holds those releases first. Without a ceiling, when what was lost may include them -
no record the chain verifies from the header is left, so a line at the beginning was deleted,
cut, edited or cannot be read - the lost step must have q = 1 unless the caller vouches that
the client made no release (``no_releases``): before, a damaged release line was charged as a
round (eps 2.02 -> 0.64 in session 49's review). A ceiling covers the releases themselves, so
under one nobody needs to vouch. Each lost record gets a substitute record of its own, charged
as many steps as the largest record (an earlier repair's substitutes included), so a
substitute lost in turn is charged again in full. With no kept record (an emptied ledger) the
ceiling or the named step stands alone, as it does when every record was rewritten: a file
with nothing verifiable holds no evidence of what was released but its mark's ceiling; without
one, the caller's step is their word. So is it, without a ceiling, for a schedule whose lost
records were more expensive than every kept one (a noise that falls over the rounds, cut at
the end).

Records past the mark's count were written by a spend that did not return (records, then the
mark, then the release), or counted by a newest mark slot damaged since: a readable one is kept
at its own step, an unreadable one needs a named step (the ceiling, the older slot's, need not
cover it). A mark whose other slot is damaged may be a spend old altogether: the caller says
how many records that spend may have written (``assume_lost``) and names their step.

A tuned selection's line is read with the reader's own length rule (``too_long``), so an
intact one is kept; a ledger that holds one, or may have (an unreadable line that is long,
names a selection, or, in an rdp ledger or under ``tuning/ledgers``, does not show itself a
step), is not repaired when records are lost. A record whose time goes back is damage (the
reader refuses it): its time is raised.

An emptied ledger, or one whose first line is damaged, has lost its header (client id,
sampling, accountant, budget, which the client's own open checks): the caller gives it
(``header``); the mark's count then says how many records to substitute (finding 7d: such a
ledger could not be repaired at all). The damaged file is kept beside the repaired one
(``<ledger>.damaged-<n>``).
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from fedsim.atomic import LINK_REFUSED, write_atomically
from fedsim.errors import ConfigError, LedgerError
from fedsim.json_input import parse_json
from fedsim.privacy.accountant import make_accountant_class
from fedsim.privacy.events import SAMPLING_SCHEMES, GaussianStep
from fedsim.privacy.ledger import Budget
from fedsim.privacy.ledger_file import (
    LEDGER_FORMAT,
    MAX_LINE_BYTES,
    OLD_FORMATS,
    REST_KEY,
    LedgerRecord,
    encode_record,
    header_of,
    line_hash,
    locked,
    parse_record,
    read_ledger_bytes,
    too_long,
)
from fedsim.privacy.ledger_mark import NO_STEPS, Mark, StepCeiling, mark_path

_HEADER_HINT = ("--header '{\"client_id\": ..., \"sampling\": ..., \"accountant\": ..., "
                "\"budget\": {\"epsilon\": ..., \"delta\": ...} or null}' (the client's "
                "values from its scenario)")


@dataclass(frozen=True, slots=True)
class RepairReport:
    """What a repair did (or, with ``dry_run``, would do)."""

    path: str
    kept: int  # readable records kept
    unreadable: int  # lines that could not be read
    substituted: int  # records of lost_step added for records that could not be verified
    backup: str | None
    damaged: bool  # False: the ledger verified as it was and nothing was changed
    charged: GaussianStep | None = None  # what each substitute is charged
    charged_from: str | None = None  # "mark": the mark's step ceiling; "named": --lost-step
    why: str = ""  # which records the chain and the mark vouch for, in words

    def to_json(self) -> dict[str, Any]:
        return {"path": self.path, "kept": self.kept, "unreadable": self.unreadable,
                "substituted": self.substituted, "backup": self.backup,
                "damaged": self.damaged,
                "charged": None if self.charged is None else self.charged.to_json(),
                "charged_from": self.charged_from, "why": self.why}


def _why(scan: _Scan, mark: Mark | None, lost: int, *, tail: int, past: int,
         assumed: int) -> str:
    """What the repair found, for the person who runs it (a count of substitutes alone, 272
    for 8 lines deleted, said nothing): ``tail`` records the mark vouches for from the end,
    ``past`` of the ``lost`` unreadable lines past the mark's count, ``assumed`` the records a
    damaged mark slot may have counted."""
    if not lost:
        return "every acknowledged record verifies" + (
            "; its lost header line is written from --header" if scan.header_lost else "")
    if mark is None or scan.header["format"] != LEDGER_FORMAT:
        return f"no usable high-water mark: {lost} record(s) assumed lost or past a break"
    if scan.verified < mark.count:
        head = max(scan.verified - 1, 0)
        found = (f"{mark.count} record(s) were acknowledged; the hash chain vouches for the "
                 f"first {head} and the mark's last hash for the last {tail} (the last record "
                 f"the chain verifies, with no verified record after it, is not trusted: an "
                 f"edit of it would not show)")
    elif scan.hashes[mark.count] != mark.last_hash:
        found = (f"the chain verifies past the {mark.count} acknowledged records but not to the "
                 f"mark's last hash (recomputed): none of them is trusted")
    else:
        found = f"the {mark.count} acknowledged records verify"
    extra = "".join([f"; {past} unreadable line(s) past the mark's count" if past else "",
                     f"; {assumed} record(s) a damaged mark slot may have counted" if assumed
                     else ""])
    return (f"{found}{extra}; {lost} are charged again as substitutes, every readable line "
            f"kept beside them (a repair never removes spending)")


@dataclass
class _Scan:
    header: dict[str, Any]
    header_line: bytes
    records: list[tuple[int, LedgerRecord | None]]  # (line number, record or unreadable)
    verified: int  # records in the longest prefix whose chain verifies (whole file for v1)
    hashes: list[str]  # chain hash after each verified record (hashes[0]: the header's)
    substitutes: set[int]  # indices (into records) of an earlier repair's substitutes
    lost_selection: bool  # an unreadable line that was a tuned selection's
    times_back: bool  # a readable record's time before the one before it
    selections_possible: bool  # the ledger may hold a tuned selection (rdp, or a tuning one)
    line_hashes: list[str]  # each record line's chain hash, readable or not
    prevs: list[str | None]  # each readable record's "prev" (None: unreadable)
    header_lost: bool  # the file's own header was unreadable (the given one stands for it)
    rest_at_end: int = 0  # records of the last readable one's spend that no line after it holds


def given_header(header: Any) -> dict[str, Any]:
    """The header a caller gives for a ledger that lost its own, checked and normalised."""
    if not isinstance(header, Mapping) or not {"client_id", "sampling", "accountant",
                                               "budget"} <= set(header):
        raise ConfigError(f"--header must be a JSON object with client_id, sampling, accountant "
                          f"and budget, got {header!r}")
    client_id, sampling, accountant = header["client_id"], header["sampling"], header["accountant"]
    if not isinstance(client_id, str) or not client_id:
        raise ConfigError(f"--header: client_id must be a non-empty string, got {client_id!r}")
    if sampling not in SAMPLING_SCHEMES:
        raise ConfigError(f"--header: sampling must be one of {SAMPLING_SCHEMES}, got {sampling!r}")
    if not isinstance(accountant, str):
        raise ConfigError(f"--header: accountant must be a name, got {accountant!r}")
    make_accountant_class(accountant)
    try:
        budget = Budget.from_json(header["budget"])
    except (ConfigError, LedgerError, TypeError, ValueError) as exc:
        raise ConfigError(f"--header: {exc}") from None
    return header_of(client_id, sampling, accountant, budget.to_json() if budget else None)


def _header_and_lines(path: Path, lines: list[bytes],
                      given: dict[str, Any] | None) -> tuple[dict[str, Any], list[bytes], bool]:
    """The header to repair under, the lines with a header first, and whether the file's own
    header was readable (else ``given`` stands for it and every line is a record)."""
    header: Any = None
    if lines:
        try:
            header = parse_json(lines[0].decode("utf-8"))
        except (UnicodeDecodeError, json.JSONDecodeError):
            header = None
    if isinstance(header, dict) and header.get("format") in (LEDGER_FORMAT, *OLD_FORMATS):
        if given is not None and {k: header.get(k) for k in given} != given:
            raise LedgerError(f"{path}: its header differs from --header; drop --header (the "
                              f"file's own header is readable)")
        return header, lines, True
    if given is None:
        what = "is empty" if not lines else "line 1 is not a ledger header"
        raise LedgerError(f"{path}: {what}: the client id, sampling, accountant and budget "
                          f"are lost with it; give them with {_HEADER_HINT}")
    return given, [json.dumps(given).encode(), *lines], False


def _scan(path: Path, data: bytes, given: dict[str, Any] | None) -> _Scan:
    complete = data.rfind(b"\n") + 1  # a crash-cut final line was never acknowledged
    header, lines, readable = _header_and_lines(path, data[:complete].split(b"\n")[:-1], given)
    chained = header["format"] == LEDGER_FORMAT
    records: list[tuple[int, LedgerRecord | None]] = []
    hashes = [line_hash(lines[0])]
    verified, intact = 0, True
    substitutes: set[int] = set()
    lost_selection, times_back, last_time = False, False, -math.inf
    rest_at_end = 0
    line_hashes: list[str] = []
    prevs: list[str | None] = []
    selections_possible = header.get("accountant") == "rdp" or path.parent.parts[-2:] == (
        "tuning", "ledgers")
    for number, line in enumerate(lines[1:], start=2 if readable else 1):
        record: LedgerRecord | None = None
        prev: str | None = None
        try:
            if too_long(line):
                raise ValueError("too long")
            obj = parse_json(line.decode("utf-8"), parse_constant=lambda _: math.nan)
            if isinstance(obj, dict) and "repair" in obj:
                substitutes.add(len(records))
            if not chained and isinstance(obj, dict):
                obj = {**obj, "prev": ""}
            if isinstance(obj, dict) and isinstance(obj.get("time"), float) \
                    and not math.isfinite(obj["time"]):
                obj = {**obj, "time": 0.0}  # times carry no spending; fixed below
                intact = False
            record, prev = parse_record(obj, str(header.get("sampling")))
            rest_at_end = obj.get(REST_KEY, 0)
        except (UnicodeDecodeError, ValueError, ConfigError):
            # An unreadable line may be one of the records the last readable one said follow
            # (an attacker's review: the line after a "rest" damaged let --assume-lost 0 by).
            record, rest_at_end = None, max(rest_at_end - 1, 0)
            substitutes.discard(len(records))
            # A step's line is ~150 bytes: a longer unreadable one, one naming a selection,
            # or, in an rdp ledger (the only kind that holds selections), one that does not
            # show itself a step may have been a tuned selection (no Gaussian substitute).
            lost_selection = (lost_selection or b'"selection' in line
                              or len(line) > MAX_LINE_BYTES
                              or (selections_possible and b'"step": {' not in line))
        if record is not None:
            times_back = times_back or record.time < last_time
            last_time = max(last_time, record.time)
        records.append((number, record))
        line_hashes.append(line_hash(line))
        prevs.append(prev if record is not None else None)
        if intact and record is not None and (not chained or prev == hashes[-1]):
            verified += 1
            hashes.append(line_hashes[-1])
        else:
            intact = False
    return _Scan(header, lines[0], records, verified, hashes, substitutes, lost_selection,
                 times_back, selections_possible, line_hashes, prevs, not readable, rest_at_end)


def _substitutes(scan: _Scan, mark: Mark | None, assume_lost: int | None,
                 path: Path, *, stale: bool, tail: int, past: int) -> int:
    """How many records are lost (``stale``: a slot of the mark is damaged, and the caller's
    ``assume_lost`` says how many records it may have counted beyond the valid one; ``tail``:
    :func:`_vouched_tail`; ``past``: :func:`_unreadable_past`)."""
    total = len(scan.records)
    unverified_from = _unverified_from(scan)
    if mark is not None and scan.header["format"] == LEDGER_FORMAT:
        if scan.verified >= mark.count and scan.hashes[mark.count] == mark.last_hash:
            lost = 0  # the acknowledged prefix is intact; anything after it is extra
        elif scan.verified >= mark.count:
            lost = mark.count  # a recomputed chain: no acknowledged record is verified
        else:
            # Fewer verified than acknowledged: the last the chain verifies has no successor
            # that vouches for it (an edit of the last line left by a cut is invisible to the
            # chain), so it is not trusted, the whole file verified or not; the records the
            # mark vouches for from the end are not lost.
            trusted = max(scan.verified - 1, 0)
            lost = max(mark.count - trusted - tail, 0)
        return lost + past + (_since_a_damaged_slot(path, assume_lost, scan.rest_at_end)
                              if stale else 0)
    if assume_lost is None:
        raise LedgerError(
            f"{path}: no usable high-water mark, so nobody knows how many records were lost; "
            f"say it with --assume-lost N (0 vouches that the file is complete)")
    after_break = total - unverified_from if scan.verified < total else 0
    return assume_lost + after_break


def _vouched_tail(scan: _Scan, mark: Mark) -> int:
    """How many records end the acknowledged ones as they were written, vouched for by the
    mark: the record whose hash is the mark's last hash, and before it every record whose hash
    is the ``prev`` of the one after it (SHA-256: a line changed, deleted or inserted there
    would break the links). Past a break in the chain from the header - a line deleted,
    edited or damaged in the middle - these records are intact, so only those between the
    break and them are lost (a cut or damage near the beginning no longer charges the whole
    history again). 0 when no record has the mark's last hash (a cut end) or the file has no
    chain."""
    if scan.header["format"] != LEDGER_FORMAT:
        return 0
    try:  # the acknowledged last record: its first line with that hash (more is extra)
        end = scan.line_hashes.index(mark.last_hash)
    except ValueError:
        return 0
    start = end
    while start > 0 and scan.prevs[start] is not None \
            and scan.prevs[start] == scan.line_hashes[start - 1]:
        start -= 1
    return end - start + 1


def _since_a_damaged_slot(path: Path, assume_lost: int | None, at_least: int = 0) -> int:
    """Records a damaged mark slot may have counted beyond the valid one: that slot may have
    held the newer mark, so the last spend's records may be lost without a trace (cut,
    deleted, edited) and its step need not be under the older mark's ceiling. The caller says
    how many (``assume_lost``), and names the step (an attacker's review: the newest slot
    damaged and lines deleted, a repair charged eps 3.21 for 3.55 released); a file whose last
    record says ``at_least`` more of its spend follow lost at least those."""
    if assume_lost is not None and assume_lost < at_least:
        raise LedgerError(
            f"{path}: its last record says {at_least} more record(s) of its spend follow, "
            f"and one slot of its high-water mark is damaged: --assume-lost must be at least "
            f"{at_least}, got {assume_lost}")
    if assume_lost is None:
        raise LedgerError(
            f"{path}: one slot of its high-water mark is damaged, so the mark read may be a "
            f"spend old and that spend's records lost without a trace; say how many records "
            f"it may have written with --assume-lost N (0 if you know none were lost) and "
            f"name a step at least as expensive with --lost-step Q SIGMA")
    return assume_lost


def _unreadable_past(scan: _Scan, mark: Mark | None) -> int:
    """Unreadable lines past the mark's count. Written by a spend whose mark was not - or the
    newest of the mark's two slots was damaged later, and the older one counts fewer records
    than were released: the ceiling, which covers what the mark counts, cannot price them."""
    if mark is None:
        return 0
    return sum(1 for _, r in scan.records[mark.count:] if r is None)


def _kept_steps(scan: _Scan, *, substitutes: bool) -> list[GaussianStep]:
    """The Gaussian steps of the readable records: the releases they show (``substitutes``
    False: every record but an earlier repair's substitutes, which are no evidence of a
    release; the releases before round one, DP normalisation and DP-PCA, round -1, q = 1,
    included), or those substitutes (True)."""
    return [r.step for k, (_, r) in enumerate(scan.records) if r is not None
            and (k in scan.substitutes) == substitutes and isinstance(r.step, GaussianStep)]


def _unverified_from(scan: _Scan) -> int:
    """The first record that cannot be trusted: an edit without rehashing breaks the chain
    right after the edited line, so the last record the chain verifies is not trusted either
    (unless the whole file verifies)."""
    total = len(scan.records)
    return scan.verified if scan.verified == total else max(scan.verified - 1, 0)


def _may_have_lost_a_release(scan: _Scan) -> bool:
    """Whether what was lost may include a release before round one (DP normalisation,
    DP-PCA: round -1, q = 1, a ledger's first records): no trusted record (one the chain
    verifies from the header) shows that the ledger's beginning is intact - a line deleted,
    cut, edited or unreadable there may have been one. A trusted release is in the floor."""
    # A release or a round the chain vouches for: the beginning is intact (an untrusted one,
    # perhaps the edited line itself, is no evidence that a release was not lost).
    return not any(r is not None and k not in scan.substitutes
                   for k, (_, r) in enumerate(scan.records[:_unverified_from(scan)]))


def _charged(lost: int, lost_step: GaussianStep, scan: _Scan, no_releases: bool,
             path: Path, ceiling: StepCeiling | None) -> GaussianStep:
    """The substitute for each of ``lost`` records: ``lost_step``, refused if it is cheaper
    than a kept record's step or the mark's step ceiling (smaller q or larger sigma; the
    releases before round one included), or, without a ceiling, when a lost line may have
    been such a release (:func:`_may_have_lost_a_release`), if its q is below 1 and the caller
    did not say the client made none (``no_releases``); taken as many times as the largest
    record holds steps (kept, an earlier repair's substitutes, or the ceiling's).

    A mark's ceiling covers every record it counts, the lost ones too - the rounds, the
    releases before round one and an earlier repair's substitutes - so it shows what the kept
    records cannot: a noise schedule that falls over the rounds, cut at its end, lowered its
    sigma; a lost release raised its q to 1; a lost substitute stood for what it was charged."""
    released = _kept_steps(scan, substitutes=False)
    q_floor = max((step.q for step in released), default=0.0)
    sigma_floor = min((step.sigma for step in released), default=math.inf)
    if ceiling is not None:
        q_floor, sigma_floor = max(q_floor, ceiling.q), min(sigma_floor, ceiling.sigma)
    releases_possible = ceiling is None  # (a ceiling covers the releases themselves)
    if (not no_releases and releases_possible and _may_have_lost_a_release(scan)
            and lost_step.q < 1.0):
        raise ConfigError(
            f"{path}: the ledger's first records cannot be verified, and a ledger holds its "
            f"releases before round one there (DP normalisation, DP-PCA: q = 1), none of them "
            f"readable: if the client's scenario had such a release, repair with --lost-step 1 "
            f"SIGMA (SIGMA at most the release's and the rounds' sigma); if it had none, say "
            f"so with --no-releases (a repair never lowers spending)")
    if lost_step.q < q_floor or lost_step.sigma > sigma_floor:
        raise ConfigError(
            f"{path}: --lost-step q={lost_step.q:g} sigma={lost_step.sigma:g} is cheaper than "
            f"what the kept records and the high-water mark show this client released; a lost "
            f"record is charged at least q >= {q_floor:g} and sigma <= {sigma_floor:g} (a "
            f"repair never lowers spending)")
    # An earlier repair's substitutes are records too: one of theirs lost is charged as much.
    per_record = max(ceiling.steps if ceiling is not None else 0,
                     *(step.count for step in
                       [lost_step, *released, *_kept_steps(scan, substitutes=True)]))
    return lost_step.times(per_record)


def _refuse_what_cannot_be_substituted(path: Path, scan: _Scan, kept: list[LedgerRecord],
                                       lost: int, lost_step: GaussianStep | None,
                                       ceiling: StepCeiling | None) -> None:
    """A repair that would need a substitute it cannot make: for a tuned selection (none is
    Gaussian), without a step (named, or the mark's ceiling), or with a step of the other
    sampling scheme."""
    # Whether a lost record may have been a selection: the mark's ceiling says; without one,
    # a ledger that may hold them may have lost one whole (a deleted line shows nothing).
    if lost and (scan.lost_selection or (ceiling.selections if ceiling is not None
                                         else scan.selections_possible)
                 or any(not isinstance(r.step, GaussianStep) for r in kept)):
        raise LedgerError(
            f"{path}: holds, or may have held, a tuned selection (a sweep's tuning ledger, or "
            f"an rdp ledger whose mark has the old format) and lost records; a lost selection "
            f"has no Gaussian substitute, so it is not repaired")
    if lost and lost_step is None:
        why = ("some are unreadable lines past the mark's count, or were counted by a damaged "
               "mark slot, which the step ceiling does not cover (a damaged newest slot leaves "
               "an older count)"
               if ceiling is not None else "no step ceiling prices them (the high-water mark "
               "has the old format, fedsim-hwm/1, or is lost)")
        raise LedgerError(
            f"{path}: {lost} acknowledged record(s) cannot be verified and {why}; name a "
            f"step at least as expensive as each of them with --lost-step Q SIGMA (the "
            f"client's largest q and smallest sigma) and repair again")
    if lost_step is not None and lost_step.sampling != scan.header.get("sampling"):
        raise ConfigError(f"--lost-step is {lost_step.sampling} but the ledger records "
                          f"{scan.header.get('sampling')} steps")


def repair_ledger(path: str | Path, *, lost_step: GaussianStep | None = None,
                  assume_lost: int | None = None, dry_run: bool = False,
                  header: Any = None, no_releases: bool = False) -> RepairReport:
    """Rewrite a damaged ledger so that it verifies, adding (never removing) spending (module
    docstring). Takes the ledger's lock. Raises :class:`LedgerError` when substitutes are
    needed but ``lost_step`` is missing or cheaper than a kept record (or, where a lost line
    may have been a release before round one, has q < 1 without ``no_releases``), or the
    header is lost and ``header`` (client_id, sampling, accountant, budget) is not given."""
    path = Path(path)
    given = None if header is None else given_header(header)
    if assume_lost is not None and (isinstance(assume_lost, bool) or assume_lost < 0):
        raise ConfigError(f"--assume-lost must be an integer >= 0, got {assume_lost!r}")
    _refuse_what_is_no_ledger_file(path)
    with locked(path) as mark_file:
        try:
            data = read_ledger_bytes(path)
        except FileNotFoundError:
            raise LedgerError(f"{path}: no such ledger") from None
        except OSError as exc:
            raise LedgerError(f"{path}: cannot be read ({exc.strerror})") from None
        scan = _scan(path, data, given)
        mark = mark_file.read()
        ceiling = None if mark is None else mark.ceiling
        stale = mark is not None and mark_file.other_damaged
        tail = 0 if mark is None else _vouched_tail(scan, mark)
        past_mark = _unreadable_past(scan, mark)
        lost = _substitutes(scan, mark, assume_lost, path, stale=stale, tail=tail,
                            past=past_mark)
        unreadable = sum(1 for _, r in scan.records if r is None)
        kept = [r for _, r in scan.records if r is not None]
        damaged = (lost > 0 or unreadable > 0 or scan.verified < len(scan.records) or stale
                   or scan.header["format"] != LEDGER_FORMAT or mark is None
                   or mark.count > len(scan.records) or len(data) != data.rfind(b"\n") + 1
                   or scan.times_back or scan.header_lost)
        named = lost_step is not None
        why = _why(scan, mark, lost, tail=tail, past=past_mark,
                   assumed=(assume_lost or 0) if stale else 0)
        if lost_step is None and ceiling is not None and not past_mark and not stale:
            # The mark's ceiling, raised to every readable record (those past the mark too):
            # no one's word.
            lost_step = ceiling.including(kept).step(
                str(scan.header.get("sampling")))  # type: ignore[arg-type]
        _refuse_what_cannot_be_substituted(path, scan, kept, lost, lost_step, ceiling)
        substitute = (_charged(lost, lost_step, scan, no_releases, path, ceiling)
                      if lost and lost_step else None)
        charged_from = None if substitute is None else "named" if named else "mark"
        if not damaged or dry_run:
            return RepairReport(str(path), len(kept), unreadable, lost, None, damaged,
                                substitute, charged_from, why)
        header = {**scan.header, "format": LEDGER_FORMAT}
        header_line = json.dumps(header).encode()
        out, last, clock = [header_line], line_hash(header_line), 0.0
        for record in kept:
            clock = max(clock, record.time)
            line = encode_record(LedgerRecord(clock, record.round, record.step), last)
            out.append(line)
            last = line_hash(line)
        # One substitute record a lost record: a later loss of one of them is then charged
        # as one record (one substitute for all, lost in turn, took its count with it).
        lost_records = [] if substitute is None else [LedgerRecord(clock, -1, substitute)] * lost
        for number, substituted in enumerate(lost_records):
            line = encode_record(substituted, last,
                                 repair=f"substitute {number + 1} of {lost} for records that "
                                        f"could not be verified")
            out.append(line)
            last = line_hash(line)
        backup = _backup_name(path)
        os.link(path, backup)  # the damaged file stays, under another name
        write_atomically(path, b"\n".join(out) + b"\n", durability="durable")
        count = len(out) - 1
        # The old count is gone from both slots; the ceiling is never lowered, and a mark of
        # the old format is rewritten in the new one.
        mark_file.write_both(Mark(count, last,
                                  (ceiling or NO_STEPS).including([*kept, *lost_records])))
        return RepairReport(str(path), len(kept), unreadable, lost, str(backup), True,
                            substitute, charged_from, why)


def _refuse_what_is_no_ledger_file(path: Path) -> None:
    """Before the lock (which would create a stray mark beside anything): a ledger that is no
    file, and a ledger or mark that is a symbolic link - a repair writes both, never through a
    link (an attacker's review: a mark linked to a file elsewhere, which `ledger check` called
    missing, had `repair --assume-lost 0` truncate that file and write a mark into it)."""
    for link in (path, mark_path(path)):
        if link.is_symlink():
            raise LedgerError(f"{link}: {LINK_REFUSED}")
    if not path.is_file():
        what = "not a file" if path.exists() else "no such ledger"
        raise LedgerError(f"{path}: {what}")


def _backup_name(path: Path) -> Path:
    n = 1
    while path.with_name(f"{path.name}.damaged-{n}").exists():
        n += 1
    return path.with_name(f"{path.name}.damaged-{n}")
