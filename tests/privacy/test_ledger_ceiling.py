"""The high-water mark's step ceiling: the most expensive round a ledger recorded, kept beside
its count so that a repair that lost records charges each at least that.

Before it, a repair's floor was only what the surviving records showed: a ledger whose noise
fell over its rounds (a sigma schedule), cut at its end, lost exactly its dearest rounds, and a
``--lost-step`` priced like the rounds it kept was accepted, charging less than was released.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fedsim.cli import main
from fedsim.errors import ConfigError, LedgerError
from fedsim.privacy.accountant import make_accountant
from fedsim.privacy.events import GaussianStep
from fedsim.privacy.ledger import Budget, PrivacyLedger, read_ledger_steps
from fedsim.privacy.ledger_directory_lock import DirectoryLock
from fedsim.privacy.ledger_mark import StepCeiling, mark_path, read_mark
from fedsim.privacy.ledger_repair import repair_ledger
from fedsim.reporting.ledgers import read_ledger
from tests.privacy.old_marks import old_slot, rewrite_as_old_mark

BUDGET = Budget(50.0, 1e-5)
DELTA = 1e-5
# A noise schedule that falls over the rounds: the last rounds are the dearest.
SCHEDULE = [GaussianStep("poisson", 0.02, sigma) for sigma in
            [2.0] * 20 + [1.5] * 20 + [1.0] * 20 + [0.8] * 20]


def _open(path: Path, **kw: object) -> PrivacyLedger:
    return PrivacyLedger.open(path, client_id="c", sampling="poisson", budget=BUDGET, **kw)  # type: ignore[arg-type]


def _eps(path: Path) -> float:
    with _open(path, read_only=True) as ledger:
        return ledger.epsilon(DELTA)


def _scheduled(path: Path) -> float:
    """The schedule's rounds spent in a new ledger; the eps a fresh accountant gives them."""
    with _open(path) as ledger:
        for r, step in enumerate(SCHEDULE):
            ledger.spend(step, time=float(r), round=r)
    return make_accountant("pld", SCHEDULE).epsilon(DELTA)


def _cut(path: Path, keep_records: int) -> None:
    lines = path.read_bytes().splitlines(keepends=True)
    path.write_bytes(b"".join(lines[:1 + keep_records]))


def test_a_falling_schedule_cut_at_its_end_is_charged_its_dearest_round(tmp_path: Path) -> None:
    path = tmp_path / "c.jsonl"
    spent = _scheduled(path)
    _cut(path, 50)  # the 30 dearest rounds (sigma 1.0 and 0.8) are lost
    priced_like_the_kept = GaussianStep("poisson", 0.02, 1.0)  # the kept records' floor
    with pytest.raises(ConfigError, match=r"sigma <= 0.8"):
        repair_ledger(path, lost_step=priced_like_the_kept)
    report = repair_ledger(path)  # no one's word: the mark's ceiling
    # the 30 lost, and the last kept: no later line vouches for it (an edit of it after the
    # cut would be invisible to the chain)
    assert report.charged_from == "mark" and report.substituted == 31
    assert report.charged == GaussianStep("poisson", 0.02, 0.8)
    assert _eps(path) >= spent * (1 - 1e-9)


def test_the_same_cut_under_an_old_mark_took_the_kept_records_word(tmp_path: Path) -> None:
    """What the ceiling closes: with the old mark (no ceiling) the same cut is repaired at the
    kept records' price and charges less than was released."""
    path = tmp_path / "c.jsonl"
    _scheduled(path)
    rewrite_as_old_mark(path)
    _cut(path, 50)
    report = repair_ledger(path, lost_step=GaussianStep("poisson", 0.02, 1.0))
    assert report.charged_from == "named"  # (it charged less than was released)
    assert read_mark(path).ceiling is not None  # type: ignore[union-attr] # the repair's mark is new


def test_a_dearer_named_step_is_used(tmp_path: Path) -> None:
    path = tmp_path / "c.jsonl"
    _scheduled(path)
    _cut(path, 79)
    report = repair_ledger(path, lost_step=GaussianStep("poisson", 0.05, 0.5))
    assert report.charged == GaussianStep("poisson", 0.05, 0.5)
    assert report.charged_from == "named"


def test_the_mark_of_a_repaired_ledger_keeps_the_ceiling(tmp_path: Path) -> None:
    """A substitute is charged the ceiling; a second repair that loses it charges it again."""
    path = tmp_path / "c.jsonl"
    spent = _scheduled(path)
    _cut(path, 50)
    repair_ledger(path)
    assert read_mark(path).ceiling == StepCeiling(0.02, 0.8, 1)  # type: ignore[union-attr]
    _cut(path, 40)  # ten kept rounds and all 31 substitutes lost (81 acknowledged)
    report = repair_ledger(path)
    assert report.substituted == 42 and report.charged == GaussianStep("poisson", 0.02, 0.8)
    assert _eps(path) >= spent * (1 - 1e-9)


def test_a_lost_substitute_is_charged_what_it_stood_for(tmp_path: Path) -> None:
    """An attacker's review of this change: the ceiling first left the substitutes (round -1)
    out, so a substitute written by a repair under an old mark, then lost, was charged the
    kept rounds' price (eps 1.106 against 1.858 released)."""
    path = tmp_path / "c.jsonl"
    spent = _scheduled(path)
    rewrite_as_old_mark(path)
    _cut(path, 50)
    repair_ledger(path, lost_step=GaussianStep("poisson", 0.02, 0.8))  # the honest word
    _cut(path, 50)  # the 30 substitutes, at the file's end, cut in turn
    report = repair_ledger(path)
    assert report.charged == GaussianStep("poisson", 0.02, 0.8)
    assert _eps(path) >= spent * (1 - 1e-9)


def test_a_lost_release_is_charged_by_the_ceiling_that_covers_it(tmp_path: Path) -> None:
    """A release before round one (DP normalisation: q = 1, its own sigma) is in the ceiling:
    its line lost, or a substitute for it lost in turn, is charged at least the release
    (the review's case: eps 0.194 against 4.95 released)."""
    path = tmp_path / "c.jsonl"
    release = GaussianStep("poisson", 1.0, 0.9)
    with _open(path) as ledger:
        ledger.spend(release, time=0.0, round=-1)
        for r in range(10):
            ledger.spend(SCHEDULE[r], time=1.0 + r, round=r)
        spent = ledger.epsilon(DELTA)
    lines = path.read_bytes().splitlines(keepends=True)
    path.write_bytes(lines[0] + b"".join(lines[2:]))  # the release's line deleted
    with pytest.raises(ConfigError, match="q >= 1"):  # a round's price is refused
        repair_ledger(path, lost_step=SCHEDULE[0])
    report = repair_ledger(path)  # nobody vouches for anything: the ceiling covers it
    assert report.charged == GaussianStep("poisson", 1.0, 0.9) and report.charged_from == "mark"
    assert _eps(path) >= spent * (1 - 1e-9)
    _cut(path, 9)  # the substitutes cut in turn
    repair_ledger(path)
    assert _eps(path) >= spent * (1 - 1e-9)


def test_a_kept_release_makes_the_default_a_release_price(tmp_path: Path) -> None:
    """A release kept, rounds cut: the default is the dearest of the ceiling and the kept
    records (q = 1 here, as a named step must be), never refused as cheaper than itself."""
    path = tmp_path / "c.jsonl"
    with _open(path) as ledger:
        ledger.spend(GaussianStep("poisson", 1.0, 3.0), time=0.0, round=-1)
        for r in range(10):
            ledger.spend(SCHEDULE[r], time=1.0 + r, round=r)
        spent = ledger.epsilon(DELTA)
    _cut(path, 8)
    report = repair_ledger(path)
    assert report.charged == GaussianStep("poisson", 1.0, 2.0)
    assert _eps(path) >= spent


def _damage_slot(path: Path, slot: int) -> None:
    data = bytearray(mark_path(path).read_bytes())
    data[slot * 256 + 20] ^= 0x01  # a damaged sector: that slot's checksum fails
    mark_path(path).write_bytes(bytes(data))


def test_an_unreadable_record_past_the_mark_needs_a_named_step(tmp_path: Path) -> None:
    """A record past the mark's count is a spend whose mark was not written (never released),
    or one whose newest mark slot was damaged later, the older slot counting fewer records
    than were released (the second review: charged the older ceiling, eps 0.921 against 5.684
    released). So the ceiling does not price an unreadable one: a human names it."""
    path = tmp_path / "c.jsonl"
    with _open(path) as ledger:
        for r in range(6):
            ledger.spend(GaussianStep("poisson", 0.05, 2.0, 10), time=float(r), round=r)
        mark = mark_path(path).read_bytes()  # both slots valid, counting 5 and 6
        ledger.spend(GaussianStep("poisson", 0.05, 0.6, 10), time=6.0, round=6)
        released = ledger.epsilon(DELTA)
    mark_path(path).write_bytes(mark)  # the 7th record past the mark
    lines = path.read_bytes().splitlines(keepends=True)
    path.write_bytes(b"".join(lines[:-1]) + lines[-1][:40] + b"#" + lines[-1][41:])
    with pytest.raises(LedgerError, match="past the mark's count"):
        repair_ledger(path)
    with pytest.raises(ConfigError, match="cheaper than"):
        repair_ledger(path, lost_step=GaussianStep("poisson", 0.05, 2.5))
    repair_ledger(path, lost_step=GaussianStep("poisson", 0.05, 0.6))
    assert _eps(path) >= released * (1 - 1e-9)


@pytest.mark.parametrize("damage", ["the last line unreadable", "lines deleted and the last "
                                    "spend's damaged", "the last line cut"])
def test_a_damaged_mark_slot_makes_nobody_trust_the_mark_it_leaves(tmp_path: Path,
                                                                   damage: str) -> None:
    """The newest slot damaged, the valid one a spend older: the last spend's records may be
    gone without a trace. Attackers' reviews: eps 0.921 for 5.684 released (its line
    unreadable), 3.207 for 3.551 (lines deleted before the anchor, the last spend's three
    damaged). The repair asks how many records that spend wrote and for a step; the client's
    own open refuses a file holding just the older count (its last line cut). Not caught: the
    last spend's line *edited* (cheaper) under a damaged slot reads as a torn mark write's
    records, kept as they are (docs/SECURITY.md)."""
    path = tmp_path / "c.jsonl"
    step = GaussianStep("poisson", 0.1, 0.9)
    with _open(path) as ledger:
        for r in range(7):
            ledger.spend(step, time=float(r), round=r)
        last = [GaussianStep("poisson", 0.1, 0.6)] + [step] * 2 if "deleted" in damage else [
            GaussianStep("poisson", 0.1, 0.6)]
        ledger.spend(last, time=7.0, round=7)
        released = ledger.epsilon(DELTA)
    _damage_slot(path, 0)  # the last spend's mark (the creation's in 0, then alternating)
    assert read_mark(path).count == 7  # type: ignore[union-attr]
    lines = path.read_bytes().splitlines(keepends=True)
    if damage == "the last line unreadable":
        lines[-1] = lines[-1][:40] + b"#" + lines[-1][41:]
    elif damage.startswith("lines deleted"):
        del lines[1:4]
        lines[-3:] = [line[:40] + b"#" + line[41:] for line in lines[-3:]]
    else:
        del lines[-1]
    path.write_bytes(b"".join(lines))
    if damage == "the last line cut":  # the file holds the older count: open refuses
        with pytest.raises(LedgerError, match="one slot of its high-water mark is damaged") \
                as refused:
            _open(path)
        # the refusal names the floor a human's step must reach (a stranger: Q and SIGMA, which?)
        assert "q 0.1 and sigma 0.9" in str(refused.value)
        assert main(["ledger", "check", str(path)]) == 2  # and so does check (it said ok)
        # So does every read-only view: an eps read from the file may be below what was
        # released (`fedsim account --ledger` read it, and the reports' open did).
        assert main(["account", "--ledger", str(path), "--json"]) == 2
        with pytest.raises(LedgerError, match="one slot of its high-water mark is damaged"):
            read_ledger_steps(path)
        with pytest.raises(LedgerError, match="one slot of its high-water mark is damaged"):
            read_ledger(path)
    with pytest.raises(LedgerError, match="--assume-lost N"):
        repair_ledger(path)
    with pytest.raises(LedgerError, match="--lost-step"):
        repair_ledger(path, assume_lost=len(last))
    repair_ledger(path, assume_lost=len(last), lost_step=GaussianStep("poisson", 0.1, 0.6))
    assert _eps(path) >= released * (1 - 1e-9)
    with _open(path) as reopened:  # valid again: both slots rewritten
        assert read_mark(path).count == len(reopened.records)  # type: ignore[union-attr]


def _spend_ten_times(path: Path, kinds: list[GaussianStep]) -> float:
    """Ten spends of ``kinds`` each (one record a kind) into a new ledger; the eps released."""
    with _open(path) as ledger:
        for r in range(10):
            ledger.spend(kinds, time=float(r), round=r)
        return ledger.epsilon(DELTA)


def test_a_spend_cut_short_under_a_damaged_slot_is_refused_not_moved_up(tmp_path: Path) -> None:
    """The second double fault (an attacker's review, session 54): 10 spends of two kinds
    each, the newest mark slot damaged and the last line deleted, read as a torn mark write's
    whole spend: 19 records at eps 1.677 for 1.679 released, and the open moved the mark up.
    Each record of a spend of several now says how many of its spend follow, so a spend cut
    short shows: every view refuses it, and a repair takes at least the missing records."""
    path = tmp_path / "c.jsonl"
    kinds = [GaussianStep("poisson", 0.1, 1.2), GaussianStep("poisson", 0.1, 0.9)]
    released = _spend_ten_times(path, kinds)
    lines = path.read_bytes().splitlines(keepends=True)
    assert len(lines) == 21 and b'"rest": 1' in lines[-2] and b'"rest"' not in lines[-1]
    newest = 0  # the creation's mark in both slots, then spends alternate: the tenth's in 0
    _damage_slot(path, newest)
    assert read_mark(path).count == 18  # type: ignore[union-attr]
    path.write_bytes(b"".join(lines[:-1]))
    for view in (_open, lambda p: _open(p, read_only=True), read_ledger_steps, read_ledger):
        with pytest.raises(LedgerError, match="ends inside a spend"):
            view(path)
    assert main(["ledger", "check", str(path)]) == 2
    assert read_mark(path).count == 18  # type: ignore[union-attr] # not moved up
    with pytest.raises(LedgerError, match="--assume-lost must be at least 1"):
        repair_ledger(path, assume_lost=0, lost_step=kinds[1])
    repair_ledger(path, assume_lost=1, lost_step=kinds[1])
    assert _eps(path) >= released * (1 - 1e-9)


def test_an_unreadable_line_after_a_rest_still_counts_the_records_it_promised(
        tmp_path: Path) -> None:
    """An attacker's review of the above: spends of three kinds, the newest slot damaged, the
    last line deleted and the one before it (its "rest": 1) made unreadable; the floor read the
    unreadable line as no promise, and --assume-lost 0 was taken (eps 4.2705 for 4.3199)."""
    path = tmp_path / "c.jsonl"
    kinds = [GaussianStep("poisson", 0.1, s) for s in (1.2, 0.9, 0.7)]
    released = _spend_ten_times(path, kinds)
    _damage_slot(path, 0)
    lines = path.read_bytes().splitlines(keepends=True)[:-1]
    lines[-1] = lines[-1][:40] + b"#" + lines[-1][41:]
    path.write_bytes(b"".join(lines))
    with pytest.raises(LedgerError, match="--assume-lost must be at least 1"):
        repair_ledger(path, assume_lost=0, lost_step=kinds[2])
    repair_ledger(path, assume_lost=1, lost_step=kinds[2])
    assert _eps(path) >= released * (1 - 1e-9)


def test_a_whole_spend_of_several_past_a_damaged_slot_is_a_torn_mark_write(
        tmp_path: Path) -> None:
    """A spend of two kinds written whole, its mark write torn: the open keeps accepting its
    records and moves the mark up over them (the slots' purpose); one-record spends' lines,
    every round's, are written as before (no ``rest``)."""
    path = tmp_path / "c.jsonl"
    with _open(path) as ledger:
        ledger.spend(GaussianStep("poisson", 0.1, 1.0), time=0.0, round=0)
        ledger.spend([GaussianStep("poisson", 0.1, 1.2), GaussianStep("poisson", 0.2, 0.9)],
                     time=1.0, round=1)
        released = ledger.epsilon(DELTA)
    assert b'"rest"' not in path.read_bytes().splitlines()[1]
    _damage_slot(path, 0)  # the second spend's mark: the valid slot counts the first
    with _open(path) as reopened:
        assert len(reopened.records) == 3 and reopened.epsilon(DELTA) == released
    assert read_mark(path).count == 3  # type: ignore[union-attr]


def test_ledger_check_says_a_torn_mark_slot_it_accepts(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The newest slot torn, the spend's records past the older one: the open accepts it (a
    torn mark write's records were written first), and `ledger check` said a plain ok (a
    stranger); it now says the slot is damaged."""
    path = tmp_path / "c.jsonl"
    with _open(path) as ledger:
        for r in range(3):
            ledger.spend(SCHEDULE[r], time=float(r), round=r)
    data = bytearray(mark_path(path).read_bytes())
    newest = 1  # creation in both slots, then spends in 1, 0, 1: the third's mark is in 1
    data[newest * 256 + 20] ^= 0x01
    mark_path(path).write_bytes(bytes(data))
    assert main(["ledger", "check", str(path), "--json"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert result["damaged_mark_slot"] is True and result["records"] == 3
    assert result["marked"] == 2


def test_marks_alternate_slots_whatever_a_spend_counts(tmp_path: Path) -> None:
    """By the count's parity, spends of two records each wrote one slot only, the other kept
    the new ledger's mark of 0: a torn write of the newest then lost every count (the second
    review: the ledger was refused, and a repair charged 2.187 for 7.454 released). Now each
    write goes to the slot not holding the newest."""
    path = tmp_path / "c.jsonl"
    pair = [GaussianStep("poisson", 0.02, 1.0), GaussianStep("poisson", 0.05, 0.9)]
    for under_directory_lock in (False, True):
        directory = DirectoryLock(tmp_path) if under_directory_lock else None
        with _open(path, directory=directory) as ledger:
            for r in range(5):
                round_ = 5 * under_directory_lock + r
                ledger.spend(pair, time=float(round_), round=round_)
        if directory is not None:
            directory.close()
    data = bytearray(mark_path(path).read_bytes())
    slots = [read_mark_slot(bytes(data[k * 256:(k + 1) * 256])) for k in (0, 1)]
    assert sorted(slots) == [18, 20]  # the last two spends' marks, one in each slot
    newest = slots.index(20)
    data[newest * 256 + 20] ^= 0x01  # torn
    mark_path(path).write_bytes(bytes(data))
    with _open(path) as ledger:  # a crash between records and mark: the mark moves up
        assert len(ledger.records) == 20


def read_mark_slot(slot: bytes) -> int:
    return int(slot.split()[1])


def _independent_ceiling(records: list[tuple[GaussianStep, int]]) -> StepCeiling:
    steps = [step for step, _ in records]
    return StepCeiling(max((s.q for s in steps), default=0.0),
                       min((s.sigma for s in steps), default=math.inf),
                       max((s.count for s in steps), default=0))


@settings(max_examples=25, deadline=None)
@given(st.lists(st.tuples(st.floats(0.001, 1.0), st.floats(0.3, 20.0), st.integers(1, 5),
                          st.booleans()), min_size=0, max_size=12),
       st.booleans())
def test_the_ceiling_is_the_dearest_round_recorded(
    tmp_path_factory: pytest.TempPathFactory, spends: list[tuple[float, float, int, bool]],
    under_directory_lock: bool
) -> None:
    """The mark's ceiling against one computed from the spends themselves, after spending, after
    reopening (also under a directory lock, whose spends write the mark by name)."""
    directory_path = tmp_path_factory.mktemp("ceiling")
    path = directory_path / "c.jsonl"
    directory = DirectoryLock(directory_path) if under_directory_lock else None
    records: list[tuple[GaussianStep, int]] = []
    with PrivacyLedger.open(path, client_id="c", sampling="poisson", budget=None,
                            directory=directory) as ledger:
        for r, (q, sigma, count, before) in enumerate(spends):
            step = GaussianStep("poisson", q, sigma, count)
            round_ = -1 if before else r
            ledger.spend(step, time=float(r), round=round_)
            records.append((step, round_))
        assert ledger.step_ceiling == _independent_ceiling(records)
    if directory is not None:
        directory.close()
    assert read_mark(path).ceiling == _independent_ceiling(records)  # type: ignore[union-attr]
    with PrivacyLedger.open(path, client_id="c", sampling="poisson", budget=None) as reopened:
        assert reopened.step_ceiling == _independent_ceiling(records)


def test_an_old_mark_keeps_its_format_until_a_repair(tmp_path: Path) -> None:
    """A ledger made by a fedsim before the ceiling goes on in its own format (its 128-byte
    slots are never overwritten by a larger one, which a torn write could take both of)."""
    path = tmp_path / "c.jsonl"
    with _open(path) as ledger:
        for r in range(5):
            ledger.spend(SCHEDULE[r], time=float(r), round=r)
    rewrite_as_old_mark(path)
    with _open(path) as ledger:
        assert ledger.step_ceiling is None
        ledger.spend(SCHEDULE[5], time=5.0, round=5)
    with _open(path, read_only=True) as view:  # as the mark has it (none), not recomputed
        assert view.step_ceiling is None
    mark = read_mark(path)
    assert mark is not None and mark.count == 6 and mark.ceiling is None
    assert len(mark_path(path).read_bytes()) == 256
    assert main(["ledger", "check", str(path), "--json"]) == 0


def test_check_reports_the_ceiling(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "c.jsonl"
    _scheduled(path)
    assert main(["ledger", "check", str(path), "--json"]) == 0
    answer = json.loads(capsys.readouterr().out)
    assert answer["step_ceiling"] == {"q": 0.02, "sigma": 0.8, "steps": 1, "selections": False}


@pytest.mark.parametrize("slot", [0, 1])
def test_a_torn_slot_leaves_the_other(tmp_path: Path, slot: int) -> None:
    path = tmp_path / "c.jsonl"
    with _open(path) as ledger:
        for r in range(4):
            ledger.spend(SCHEDULE[r * 20], time=float(r), round=r)
    data = bytearray(mark_path(path).read_bytes())
    assert len(data) == 512
    data[slot * 256 + 40] ^= 0x01  # a flipped bit in one slot: its checksum fails
    mark_path(path).write_bytes(bytes(data))
    mark = read_mark(path)
    assert mark is not None and mark.count == (3 if slot == 0 else 4)
    # The older slot counts 3 records and their ceiling (sigma 1.0), the newer 4 (sigma 0.8).
    assert mark.ceiling == StepCeiling(0.02, 1.0 if slot == 0 else 0.8, 1)


@pytest.mark.parametrize("fields", ["1.5 1.0 1 0", "0.02 -1.0 1 0", "0.02 nan 1 0",
                                    "0.02 1.0 -1 0", "0.02 1.0 1 2", "0.02 1.0 1 01"])
def test_an_implausible_ceiling_is_no_mark(tmp_path: Path, fields: str) -> None:
    """A slot whose checksum holds but whose ceiling cannot be one is not read as a mark."""
    import zlib

    path = tmp_path / "c.jsonl"
    path.write_text("")
    body = f"fedsim-hwm/2 3 {'a' * 64} {fields}"
    slot = f"{body} {zlib.crc32(body.encode()):08x}".encode().ljust(255) + b"\n"
    mark_path(path).write_bytes(slot * 2)
    assert read_mark(path) is None
    mark_path(path).write_bytes(slot + old_slot(2, "b" * 64).ljust(256, b" "))
    assert read_mark(path) is None  # an old slot is read only where the old format puts it


@pytest.mark.parametrize("first_ceiling", [True, False])
def test_writing_both_slots_leaves_no_slot_of_the_other_format(tmp_path: Path,
                                                               first_ceiling: bool) -> None:
    """A mark rewritten whole (a repair) in one format leaves nothing of the other to be read:
    a stale slot of the larger format at the same count would otherwise win."""
    from fedsim.privacy.ledger_file import MarkFile
    from fedsim.privacy.ledger_mark import Mark

    path = tmp_path / "c.jsonl"
    path.write_text("")
    before = StepCeiling(0.02, 1.0, 1) if first_ceiling else None
    after = None if first_ceiling else StepCeiling(0.02, 1.0, 1)
    mark = MarkFile(mark_path(path), create=True)
    try:
        mark.write_both(Mark(7, "a" * 64, before))
        mark.write_both(Mark(7, "b" * 64, after))
        assert mark.read() == Mark(7, "b" * 64, after)
    finally:
        mark.close()
    assert len(mark_path(path).read_bytes()) == (256 if after is None else 512)


def test_records_the_mark_vouches_for_from_the_end_are_not_charged_again(
    tmp_path: Path
) -> None:
    """A stranger's review: 8 lines deleted near the beginning of a 272-record ledger were
    charged as 272 substitutes beside the 264 kept (eps 3.51 for 2.50 released, past its
    budget); one sigma edited on line 5 as 180. The records after a break whose chain links
    back from the mark's last hash are intact: only those between are lost."""
    path = tmp_path / "c.jsonl"
    spent = _scheduled(path)
    lines = path.read_bytes().splitlines(keepends=True)
    path.write_bytes(lines[0] + b"".join(lines[9:]))  # records 1-8 deleted
    report = repair_ledger(path)
    assert (report.kept, report.substituted) == (72, 8)
    # each lost record charged the ceiling (sigma 0.8, theirs 2.0): a little above, not twice
    assert spent * (1 - 1e-9) <= _eps(path) <= spent * 1.1

    path = tmp_path / "d.jsonl"
    spent = _scheduled(path)
    lines = path.read_bytes().splitlines(keepends=True)
    record = json.loads(lines[5])
    record["step"]["sigma"] = 100.0  # an edit, not rehashed
    lines[5] = json.dumps(record).encode() + b"\n"
    path.write_bytes(b"".join(lines))
    report = repair_ledger(path)
    # records 1-4 trusted; 5, the edited one (the last the chain from the header verifies),
    # not; 6-80 vouched for from the end: one substitute, beside the edited record kept
    assert (report.kept, report.substituted) == (80, 1)
    assert _eps(path) >= spent * (1 - 1e-9)


@settings(max_examples=40, deadline=None)
@given(st.data())
def test_no_damage_in_the_middle_charges_less_than_was_released(
    tmp_path_factory: pytest.TempPathFactory, data: st.DataObject
) -> None:
    """Deleted, edited, damaged, duplicated or inserted lines anywhere: the repaired ledger's
    eps is never below what was released (a fresh accountant on the steps spent)."""
    path = tmp_path_factory.mktemp("middle") / "c.jsonl"
    sigmas = data.draw(st.lists(st.sampled_from([0.7, 1.0, 1.6, 2.5]), min_size=3,
                                max_size=25))
    counts = data.draw(st.lists(st.integers(1, 3), min_size=len(sigmas), max_size=len(sigmas)))
    steps = [GaussianStep("poisson", 0.03, s, c) for s, c in zip(sigmas, counts, strict=True)]
    with PrivacyLedger.open(path, client_id="c", sampling="poisson", budget=None) as ledger:
        for r, step in enumerate(steps):
            ledger.spend(step, time=float(r), round=r)
    released = make_accountant("pld", steps).epsilon(DELTA)
    lines = path.read_bytes().splitlines(keepends=True)
    for _ in range(data.draw(st.integers(1, 3))):
        k = data.draw(st.integers(1, len(lines) - 1))
        kind = data.draw(st.sampled_from(["delete", "edit", "damage", "duplicate", "insert"]))
        if kind == "delete" and len(lines) > 2:
            del lines[k]
        elif kind == "edit":
            try:
                record = json.loads(lines[k])
                record["step"]["sigma"] = 50.0
                lines[k] = json.dumps(record).encode() + b"\n"
            except (ValueError, KeyError, TypeError):
                pass
        elif kind == "damage":
            lines[k] = lines[k][:10] + b"#" + lines[k][11:]
        elif kind == "duplicate":
            lines.insert(k, lines[k])
        elif kind == "insert":
            lines.insert(k, b'{"junk": 1}\n')
    path.write_bytes(b"".join(lines))
    try:
        repair_ledger(path)
    except LedgerError as exc:  # a damaged line past the mark's count wants a named step
        assert "past the mark's count" in str(exc)
        return
    with PrivacyLedger.open(path, client_id="c", sampling="poisson", budget=None,
                            read_only=True) as repaired:
        # Two upper bounds of PLD's pessimistic grid: a history with one more, nearly free,
        # step (an edited sigma 50 kept) can read lower than the history without it - by up
        # to 3.5e-4 relative over every history of three steps of one sigma (0.7-2.5, counts
        # 1-3) with one to three such steps added (1.1e-4 in CI: sigma 1.6, counts 2, 1, 2,
        # plus sigma 50 count 2): the grid's slack, not spending. A lost step of at most 25
        # costs far more than 1e-3.
        assert repaired.epsilon(DELTA) >= released * (1 - 1e-3)


def test_a_refused_ledger_with_a_damaged_slot_is_repaired_with_assume_lost_0(
    tmp_path: Path
) -> None:
    """The refusal's own way out: the older slot damaged (nothing lost), `--assume-lost 0`
    vouches for it and the repair rewrites both slots (a review: it printed "damaged: False"
    and wrote nothing, so the ledger stayed refused)."""
    path = tmp_path / "c.jsonl"
    with _open(path) as ledger:
        for r in range(3):
            ledger.spend(SCHEDULE[r], time=float(r), round=r)
        spent = ledger.epsilon(DELTA)
    _damage_slot(path, 0)  # the older of the two (the third spend's mark is in slot 1)
    with pytest.raises(LedgerError, match="one slot of its high-water mark is damaged"):
        _open(path)
    assert main(["ledger", "repair", str(path), "--assume-lost", "0"]) == 0
    with _open(path) as ledger:
        assert len(ledger.records) == 3 and ledger.epsilon(DELTA) == pytest.approx(spent)
    assert len(mark_path(path).read_bytes()) == 512


def test_a_new_ledger_over_an_old_mark_file_leaves_no_damaged_slot(tmp_path: Path) -> None:
    """An earlier fedsim that stopped between a new ledger's mark and its header left an old
    mark of 0 records and no ledger: the new ledger's mark went to the new format's second
    slot, the old slots read as a damaged first one, and a reopen before any spend was
    refused (a review). A new ledger's mark fills both slots."""
    path = tmp_path / "c.jsonl"
    mark_path(path).write_bytes(old_slot(0, "c" * 64) * 2)
    with _open(path):
        pass
    with _open(path) as ledger:
        assert len(ledger.records) == 0 and ledger.step_ceiling is not None
    assert len(mark_path(path).read_bytes()) == 512
