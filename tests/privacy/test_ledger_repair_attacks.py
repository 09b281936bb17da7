"""A repair never lowers what a ledger records, whatever was damaged (an attacker's review of
session 49): a lost release before round one (DP normalisation, DP-PCA: q = 1) is not charged
as a round, a tuned selection's long line is read by the repair as by the reader (not taken as
damage and replaced by one Gaussian step), and a record going back in time is repaired instead
of reported as intact."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from fedsim.cli import main
from fedsim.errors import ConfigError, LedgerError
from fedsim.privacy.events import GaussianStep, TunedSelection
from fedsim.privacy.ledger import Budget, PrivacyLedger
from fedsim.privacy.ledger_file import (
    MAX_LINE_BYTES,
    LedgerRecord,
    encode_record,
    line_hash,
    locked,
    parse_record,
)
from fedsim.privacy.ledger_mark import Mark
from fedsim.privacy.ledger_repair import repair_ledger
from tests.privacy.old_marks import rewrite_as_old_mark

ROUND = GaussianStep("poisson", 1 / 30, 1.3)
RELEASE = GaussianStep("poisson", 1.0, 2.0)  # DP normalisation's, before round one


def _ledger(path: Path, *, release: bool = True, rounds: int = 6) -> float:
    """A client's ledger: the release (round -1) when asked, then ``rounds`` rounds; its eps."""
    with PrivacyLedger.open(path, client_id="c", sampling="poisson", budget=None) as ledger:
        if release:
            ledger.spend(RELEASE, time=0.0, round=-1)
        for r in range(rounds):
            ledger.spend(ROUND, time=1.0 + r, round=r)
        return ledger.epsilon(1e-5)


def _eps(path: Path) -> float:
    with PrivacyLedger.open(path, client_id="c", sampling="poisson", budget=None,
                            read_only=True) as ledger:
        return ledger.epsilon(1e-5)


def _lines(path: Path) -> list[bytes]:
    return path.read_bytes().split(b"\n")[:-1]


@pytest.mark.parametrize("mark", ["ceiling", "old"])
@pytest.mark.parametrize("damage", ["unreadable", "deleted"])
def test_a_lost_release_is_not_charged_as_a_round(tmp_path: Path, damage: str,
                                                   mark: str) -> None:
    path = tmp_path / "c.jsonl"
    spent = _ledger(path)
    if mark == "old":
        rewrite_as_old_mark(path)
    lines = _lines(path)
    assert b'"round": -1' in lines[1]
    if damage == "unreadable":
        lines[1] = lines[1].replace(b'"q": 1.0', b'"q": 1.0,,')
    else:
        del lines[1]
    path.write_bytes(b"\n".join(lines) + b"\n")
    round_priced = ROUND  # what the rounds left show: q 1/30, sigma 1.3
    # Without a ceiling the lost beginning may have held a release: the caller is asked; the
    # ceiling covers the release itself (q 1, and the rounds' lower sigma).
    with pytest.raises(ConfigError, match="--no-releases" if mark == "old" else "q >= 1"):
        repair_ledger(path, lost_step=round_priced)
    # Before: accepted, eps 2.02 -> 0.64. Charged as a release (q = 1), it only adds.
    if mark == "old":
        repair_ledger(path, lost_step=GaussianStep("poisson", 1.0, 1.3))
    else:
        assert repair_ledger(path).charged == GaussianStep("poisson", 1.0, 1.3)
    assert _eps(path) >= spent


def test_a_readable_release_sets_the_floor_of_a_lost_round(tmp_path: Path) -> None:
    path = tmp_path / "c.jsonl"
    spent = _ledger(path)
    lines = _lines(path)
    lines[4] = lines[4][:-7] + b"garbage"  # a round's line, after the release
    path.write_bytes(b"\n".join(lines) + b"\n")
    with pytest.raises(ConfigError, match=r"q >= 1"):
        repair_ledger(path, lost_step=ROUND)
    repair_ledger(path, lost_step=GaussianStep("poisson", 1.0, 1.3))
    assert _eps(path) >= spent


@pytest.mark.parametrize("mark", ["ceiling", "old"])
def test_a_ledger_without_releases_is_repaired_when_vouched_for(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], mark: str
) -> None:
    path = tmp_path / "c.jsonl"
    spent = _ledger(path, release=False)
    if mark == "old":
        rewrite_as_old_mark(path)
    lines = _lines(path)
    lines[1] = lines[1][:-5] + b"xxxxx"  # the first round's line
    path.write_bytes(b"\n".join(lines) + b"\n")
    argv = ["ledger", "repair", str(path), "--lost-step", str(ROUND.q), str(ROUND.sigma)]
    if mark == "old":  # nothing shows whether a release came first: the user vouches
        assert main(argv) == 2 and "--no-releases" in capsys.readouterr().err
        argv.append("--no-releases")
    # (the mark's ceiling shows that nothing was recorded before round one)
    assert main(argv) == 0
    assert _eps(path) >= spent
    assert main(["ledger", "check", str(path)]) == 0


def test_a_long_tuned_selection_is_kept_and_a_ledger_holding_one_is_not_repaired(
    tmp_path: Path,
) -> None:
    candidates = tuple((GaussianStep("poisson", 0.01 + k / 1000, 1.0 + k / 10, 5 + k),
                        GaussianStep("poisson", 0.02, 2.0 + k / 10, 3))
                       for k in range(40))
    selection = TunedSelection("negative_binomial", (0.0, 0.2), candidates)
    path = tmp_path / "c.jsonl"
    with PrivacyLedger.open(path, client_id="c", sampling="poisson", budget=Budget(1e3, 1e-5),
                            accountant="rdp") as ledger:
        ledger.spend_selection(selection, time=0.0, round=-1)
        for r in range(3):
            ledger.spend(ROUND, time=1.0 + r, round=r)
    lines = _lines(path)
    assert len(lines[1]) > MAX_LINE_BYTES  # a selection's line may be longer than a step's
    # Intact: not damage (before: "unreadable 1, substituted 1", eps 6.61 -> 2.42).
    report = repair_ledger(path, lost_step=GaussianStep("poisson", 1.0, 0.5))
    assert not report.damaged and report.unreadable == 0
    lines[3] = lines[3][:-5] + b"xxxxx"
    path.write_bytes(b"\n".join(lines) + b"\n")
    with pytest.raises(LedgerError, match="tuned selection"):
        repair_ledger(path, lost_step=GaussianStep("poisson", 1.0, 0.5))
    lines = _lines(tmp_path / "c.jsonl")
    lines[1] = lines[1][:-5] + b"xxxxx"  # the selection itself unreadable
    path.write_bytes(b"\n".join(lines) + b"\n")
    with pytest.raises(LedgerError, match="tuned selection"):
        repair_ledger(path, lost_step=GaussianStep("poisson", 1.0, 0.5), no_releases=True)
    assert path.read_bytes() == b"\n".join(lines) + b"\n"  # refused: nothing rewritten


def test_a_record_going_back_in_time_is_repaired(tmp_path: Path) -> None:
    path = tmp_path / "c.jsonl"
    spent = _ledger(path, release=False)
    lines = _lines(path)
    # Rewrite the chain with the third record's time before the second's, rehashed, and the
    # mark to match: the chain verifies, the times do not (check refuses it).
    out, last = [lines[0]], line_hash(lines[0])
    for k, line in enumerate(lines[1:]):
        record, _ = parse_record(json.loads(line), "poisson")
        time = 0.5 if k == 2 else record.time
        out.append(encode_record(LedgerRecord(time, record.round, record.step), last))
        last = line_hash(out[-1])
    path.write_bytes(b"\n".join(out) + b"\n")
    with locked(path) as mark:
        mark.write_both(Mark(len(out) - 1, last))
    assert main(["ledger", "check", str(path)]) == 2
    report = repair_ledger(path)  # nothing lost: no step needed
    assert report.damaged and report.substituted == 0
    assert main(["ledger", "check", str(path)]) == 0
    assert _eps(path) == pytest.approx(spent, rel=1e-12)


def test_a_refused_open_keeps_every_byte_for_the_repair(tmp_path: Path) -> None:
    """An acknowledged last record without its newline is not a torn write: the writable open
    refuses the ledger (shorter than its mark) and, before, cut the record's bytes off first;
    now nothing is cut until what is kept verifies."""
    path = tmp_path / "c.jsonl"
    _ledger(path, release=False)
    damaged = path.read_bytes()[:-1]
    path.write_bytes(damaged)
    with pytest.raises(LedgerError, match="were acknowledged"):
        PrivacyLedger.open(path, client_id="c", sampling="poisson", budget=None)
    assert path.read_bytes() == damaged


@pytest.mark.parametrize("command", [["ledger", "check"], ["account", "--ledger"],
                                     ["ledger", "repair"]])
def test_a_directory_in_a_ledgers_place_is_refused_with_a_message(
    tmp_path: Path, command: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    """An attacker's review: a .hwm (or a ledger) that is a directory raised IsADirectoryError
    from every reader, and a repair of a ledger that is not there left a stray mark."""
    path = tmp_path / "c.jsonl"
    _ledger(path, release=False)
    mark = path.with_name(path.name + ".hwm")
    mark.unlink()
    mark.mkdir()
    assert main([*command, str(path)]) == 2  # (a refused repair, as damage found by check
    err = capsys.readouterr().err  # or account: exit 2, since session 56's review)
    assert "high-water mark cannot be" in err and "Traceback" not in err
    with pytest.raises(LedgerError, match="high-water mark cannot be opened"):
        PrivacyLedger.open(path, client_id="c", sampling="poisson", budget=None)
    folder = tmp_path / "d.jsonl"
    folder.mkdir()
    assert main(["ledger", "repair", str(folder), "--assume-lost", "0"]) == 2
    assert "not a file" in capsys.readouterr().err
    with pytest.raises(LedgerError, match="not a file"):
        PrivacyLedger.open(folder, client_id="c", sampling="poisson", budget=None)
    assert main(["ledger", "repair", str(tmp_path / "none.jsonl"), "--assume-lost", "0"]) == 2
    assert not (tmp_path / "none.jsonl.hwm").exists()


def test_a_lost_substitute_of_an_earlier_repair_is_charged_as_much(tmp_path: Path) -> None:
    """A review of the change: one substitute record carried every lost record's steps, so
    losing that line later charged one step (eps 0.594 -> 0.394). Now one substitute a lost
    record, and a lost one is charged as many steps as the largest kept record."""
    path = tmp_path / "c.jsonl"
    spent = _ledger(path, release=False, rounds=10)
    lines = _lines(path)
    path.write_bytes(b"\n".join(lines[:2]) + b"\n")  # cut after the first round
    repair_ledger(path, lost_step=ROUND)
    assert _eps(path) >= spent
    repaired = path.read_bytes()
    assert repaired.count(b'"repair"') == 10  # the 9 lost, and the round kept (unvouched)
    path.write_bytes(repaired[:-20])  # the last substitute cut mid-line
    repair_ledger(path, lost_step=ROUND)
    assert _eps(path) >= spent


@pytest.mark.parametrize("mark", ["ceiling", "old"])
def test_an_edited_release_is_no_evidence_that_none_was_lost(tmp_path: Path,
                                                             mark: str) -> None:
    """A review of the change: the release's q edited 1.0 -> 0.1 (not rehashed) still counted
    as a readable release, so --lost-step 0.1 1.3 passed (eps 2.02 -> 1.54)."""
    path = tmp_path / "c.jsonl"
    spent = _ledger(path)
    if mark == "old":
        rewrite_as_old_mark(path)
    lines = _lines(path)
    lines[1] = lines[1].replace(b'"q": 1.0', b'"q": 0.1')
    path.write_bytes(b"\n".join(lines) + b"\n")
    with pytest.raises(ConfigError, match="--no-releases" if mark == "old" else "q >= 1"):
        repair_ledger(path, lost_step=GaussianStep("poisson", 0.1, 1.3))
    repair_ledger(path, lost_step=GaussianStep("poisson", 1.0, 1.3))
    assert _eps(path) >= spent


@pytest.mark.parametrize("damage", ["misspelt", "truncated"])
def test_a_damaged_selection_line_is_not_replaced_by_a_step(tmp_path: Path, damage: str) -> None:
    """A review of the change: a selection line whose word "selection" was damaged, or cut
    to 30 bytes, was not recognised and got a Gaussian substitute (eps 16.66 -> 5.21)."""
    candidates = tuple((GaussianStep("poisson", 0.05, 0.7, 300 + k),) for k in range(60))
    path = tmp_path / "c.jsonl"
    with PrivacyLedger.open(path, client_id="c", sampling="poisson", budget=Budget(1e3, 1e-5),
                            accountant="rdp") as ledger:
        ledger.spend_selection(TunedSelection("negative_binomial", (0.0, 0.2), candidates),
                               time=0.0, round=-1)
        ledger.spend(ROUND, time=1.0, round=0)
    lines = _lines(path)
    lines[1] = (lines[1].replace(b'"selection"', b'"selectiom"') if damage == "misspelt"
                else lines[1][:30])
    path.write_bytes(b"\n".join(lines) + b"\n")
    with pytest.raises(LedgerError, match="tuned selection"):
        repair_ledger(path, lost_step=GaussianStep("poisson", 1.0, 0.5), no_releases=True)


@pytest.mark.parametrize("mark", ["ceiling", "old"])
def test_a_deleted_selection_line_is_not_replaced_by_a_step(tmp_path: Path, mark: str) -> None:
    """The second review of the step ceiling: under an old mark a tuning ledger's selection
    line, deleted whole (nothing left to read), got a Gaussian substitute (rdp eps 3.172
    against 3.874). A ledger that may hold selections and lost records is not repaired unless
    its mark's ceiling says none was recorded."""
    candidates = tuple((GaussianStep("poisson", 0.05, 1.0, 50),) for _ in range(3))
    path = tmp_path / "c.jsonl"
    with PrivacyLedger.open(path, client_id="c", sampling="poisson", budget=Budget(1e3, 1e-5),
                            accountant="rdp") as ledger:
        ledger.spend(ROUND, time=0.0, round=0)
        ledger.spend_selection(TunedSelection("negative_binomial", (0.0, 0.2), candidates),
                               time=1.0, round=1)
        ledger.spend(ROUND, time=2.0, round=2)
    if mark == "old":
        rewrite_as_old_mark(path)
    lines = _lines(path)
    del lines[2]  # the selection's line
    path.write_bytes(b"\n".join(lines) + b"\n")
    with pytest.raises(LedgerError, match="tuned selection"):
        repair_ledger(path, lost_step=GaussianStep("poisson", 1.0, 1.0), no_releases=True)
