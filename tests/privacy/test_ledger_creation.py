"""A new ledger is created without an fsync; its first spend makes the creation durable (its
mark, the directory's entries: one directory fsync for every ledger created before it) before
its own records, so nothing acknowledged depends on an entry that is not on disk, and every
state a crash can leave before that first spend opens as a ledger with nothing spent."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from fedsim.errors import LedgerError
from fedsim.privacy.events import GaussianStep
from fedsim.privacy.ledger import Budget, PrivacyLedger
from fedsim.privacy.ledger_directory_lock import DirectoryLock
from fedsim.privacy.ledger_mark import mark_path

STEP = GaussianStep("poisson", 0.02, 1.1)
BUDGET = Budget(8.0, 1e-5)

pytestmark = pytest.mark.skipif(not Path("/proc/self/fd").is_dir(), reason="needs /proc")


class Fsyncs:
    """The files fsynced, in order, by name (a directory by its own name)."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.names: list[str] = []
        real = os.fsync

        def logged(fd: int) -> None:
            self.names.append(Path(os.readlink(f"/proc/self/fd/{fd}")).name)
            real(fd)

        monkeypatch.setattr(os, "fsync", logged)

    def take(self) -> list[str]:
        names, self.names = self.names, []
        return names


def _open(path: Path, directory: DirectoryLock | None = None,
          budget: Budget = BUDGET) -> PrivacyLedger:
    return PrivacyLedger.open(path, client_id=path.stem, sampling="poisson", budget=budget,
                              directory=directory)


@pytest.mark.parametrize("under_directory_lock", [False, True])
def test_the_first_spend_makes_the_creation_durable_before_its_records(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, under_directory_lock: bool) -> None:
    folder = tmp_path / "ledgers"
    folder.mkdir()
    lock = DirectoryLock(folder) if under_directory_lock else None
    fsyncs = Fsyncs(monkeypatch)
    a, b = _open(folder / "a.jsonl", lock), _open(folder / "b.jsonl", lock)
    assert fsyncs.take() == []  # creating costs no fsync
    a.spend(STEP, time=0.0, round=0)
    # the mark of 0 records, the entries (both ledgers'), the header with the record, the mark
    assert fsyncs.take() == ["a.jsonl.hwm", "ledgers", "a.jsonl", "a.jsonl.hwm"]
    b.spend(STEP, time=0.0, round=0)  # its entries were covered by a's directory fsync
    assert fsyncs.take() == ["b.jsonl.hwm", "b.jsonl", "b.jsonl.hwm"]
    a.spend(STEP, time=1.0, round=1)
    assert fsyncs.take() == ["a.jsonl", "a.jsonl.hwm"]
    c = _open(folder / "c.jsonl", lock)  # created after that directory fsync: needs its own
    c.spend(STEP, time=0.0, round=0)
    assert fsyncs.take() == ["c.jsonl.hwm", "ledgers", "c.jsonl", "c.jsonl.hwm"]
    for ledger in (a, b, c):
        ledger.close()
    if lock is not None:
        lock.close()
    with _open(folder / "a.jsonl") as reopened:
        assert len(reopened.records) == 2


def test_a_ledger_never_spent_writes_nothing_durably(tmp_path: Path,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    fsyncs = Fsyncs(monkeypatch)
    with _open(tmp_path / "a.jsonl"):
        pass
    assert fsyncs.take() == []
    with _open(tmp_path / "a.jsonl") as reopened:  # resumed from what it wrote
        assert reopened.records == ()
        reopened.spend(STEP, time=0.0, round=0)
    assert fsyncs.take() == ["a.jsonl.hwm", tmp_path.name, "a.jsonl", "a.jsonl.hwm"]


def _created(path: Path) -> tuple[bytes, bytes]:
    """The header and mark a lazily created ledger leaves (no spend)."""
    with _open(path):
        pass
    return path.read_bytes(), mark_path(path).read_bytes()


@pytest.mark.parametrize("state", [
    "nothing", "mark only", "mark and a cut header", "a cut header alone", "a header alone",
    "a header and an empty mark", "a header and its mark"])
def test_every_state_before_the_first_spend_opens_with_nothing_spent(
        tmp_path: Path, state: str) -> None:
    """The states a power failure can leave of a ledger whose first spend never returned:
    written files not (or partly) on disk, in any combination the deferred fsyncs allow."""
    path = tmp_path / "a.jsonl"
    header, mark = _created(path)
    path.unlink()
    mark_path(path).unlink()
    if state != "nothing" and "header" in state:
        path.write_bytes(header[:20] if "cut" in state else header)
    if "mark" in state:
        mark_path(path).write_bytes(b"" if "empty" in state else mark)
    with _open(path) as ledger:
        assert ledger.records == ()
        ledger.spend(STEP, time=0.0, round=0)
    with _open(path) as ledger:
        assert len(ledger.records) == 1
        assert ledger.epsilon() == pytest.approx(_fresh_epsilon(tmp_path), rel=0, abs=0)


def _fresh_epsilon(tmp_path: Path) -> float:
    with _open(tmp_path / "fresh" / "f.jsonl") as fresh:
        fresh.spend(STEP, time=0.0, round=0)
        return fresh.epsilon()


def test_a_header_alone_is_still_checked_against_the_posture(tmp_path: Path) -> None:
    path = tmp_path / "a.jsonl"
    _created(path)
    mark_path(path).unlink()
    with pytest.raises(LedgerError, match="budget"):
        _open(path, budget=Budget(2.0, 1e-5))  # a ledger is never reset


def test_a_lost_mark_with_records_is_still_refused(tmp_path: Path) -> None:
    path = tmp_path / "a.jsonl"
    with _open(path) as ledger:
        ledger.spend(STEP, time=0.0, round=0)
    mark_path(path).unlink()
    with pytest.raises(LedgerError, match="no high-water mark"):
        _open(path)


def _spent(path: Path, rounds: int = 5) -> None:
    with _open(path) as ledger:
        for round_ in range(rounds):
            ledger.spend(STEP, time=float(round_), round=round_)


def _zero(path: Path) -> None:
    path.write_bytes(b"\0" * path.stat().st_size)


@pytest.mark.parametrize("damage", [
    "ledger and mark zero-filled", "ledger zero-filled, mark lost", "cut to its header, mark "
    "zero-filled", "cut to 3 bytes, mark zero-filled", "ledger zero-filled, mark intact",
    "another file's bytes, mark lost"])
def test_damage_that_wipes_every_line_is_refused_not_read_as_a_new_ledger(
        tmp_path: Path, damage: str) -> None:
    """An audit: a ledger of 50 spends whose file and mark were both zero-filled was opened as
    new (it has no complete line, and an unreadable mark read as none), and granted 68 rounds
    more at epsilon 0 (true epsilon 3.76 against a budget of 3). A creation cut before its
    first spend leaves at most a beginning of its header and a valid or empty mark (the test
    above); anything else is refused, and every byte is kept for a repair."""
    path = tmp_path / "a.jsonl"
    _spent(path)
    header = path.read_bytes().split(b"\n", 1)[0] + b"\n"
    if damage.startswith("ledger") and "zero-filled" in damage.split(",")[0]:
        _zero(path)
    elif damage.startswith("cut to its header"):
        path.write_bytes(header)
    elif damage.startswith("cut to 3 bytes"):
        path.write_bytes(header[:3])
    else:
        path.write_bytes(b"not a ledger at all")
    if "mark zero-filled" in damage or damage == "ledger and mark zero-filled":
        _zero(mark_path(path))
    elif "mark lost" in damage:
        mark_path(path).unlink()
    before = path.read_bytes(), mark_path(path).read_bytes() if mark_path(path).exists() else b""
    refusal = {  # what each is refused as (the mark count's check, before this audit, too)
        "ledger and mark zero-filled": "holds no valid mark",
        "ledger zero-filled, mark lost": "not the beginning of the ledger's header",
        "cut to its header, mark zero-filled": "holds no valid mark",
        "cut to 3 bytes, mark zero-filled": "holds no valid mark",
        "ledger zero-filled, mark intact": "high-water mark counts",
        "another file's bytes, mark lost": "not the beginning of the ledger's header",
    }[damage]
    with pytest.raises(LedgerError, match=refusal):
        _open(path)
    after = path.read_bytes(), mark_path(path).read_bytes() if mark_path(path).exists() else b""
    assert after == before
