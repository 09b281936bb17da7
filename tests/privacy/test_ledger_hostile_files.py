"""A ledger directory someone else prepared (an attacker's review, session 62): a symbolic link
where a ledger or its high-water mark should be is refused, never written through; a ledger
file larger than any ledger (a sparse file: 4 KB on disk) is refused from its size before it
is read; a FIFO where a ledger or a mark should be is refused, not waited on or sought in."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from fedsim.atomic import LINK_REFUSED
from fedsim.cli import main
from fedsim.config.limits import MAX_LEDGER_BYTES
from fedsim.errors import LedgerError
from fedsim.privacy.events import GaussianStep
from fedsim.privacy.ledger import PrivacyLedger
from fedsim.privacy.ledger_file import copy_ledger, open_append, read_ledger_bytes
from fedsim.privacy.ledger_mark import mark_path
from fedsim.privacy.ledger_repair import repair_ledger

STEP = GaussianStep("poisson", 0.05, 1.2)
PRECIOUS = b"IMPORTANT VICTIM CONTENT\n" * 100


def _ledger(path: Path, rounds: int = 3) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with PrivacyLedger.open(path, client_id="c", sampling="poisson", budget=None) as ledger:
        for r in range(rounds):
            ledger.spend(STEP, time=float(r), round=r)


def _victim(tmp_path: Path) -> Path:
    victim = tmp_path / "elsewhere" / "victim.txt"
    victim.parent.mkdir(exist_ok=True)
    victim.write_bytes(PRECIOUS)
    return victim


def _mark_linked_to_victim(tmp_path: Path) -> tuple[Path, Path]:
    """A handed-over ledger whose mark is a link to a file elsewhere (repair_symlink.sh)."""
    path = tmp_path / "ledgers" / "c.jsonl"
    _ledger(path)
    victim = _victim(tmp_path)
    mark_path(path).unlink()
    mark_path(path).symlink_to(victim)
    return path, victim


def test_check_says_a_linked_mark_is_a_link_and_repair_refuses_it(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path, victim = _mark_linked_to_victim(tmp_path)
    assert main(["ledger", "check", str(path)]) == 2
    said = capsys.readouterr().err
    assert LINK_REFUSED in said and "missing" not in said and "--assume-lost" not in said
    assert main(["ledger", "repair", str(path), "--assume-lost", "0"]) == 2
    assert LINK_REFUSED in capsys.readouterr().err
    with pytest.raises(LedgerError, match="symbolic link"):
        repair_ledger(path, assume_lost=0)
    assert victim.read_bytes() == PRECIOUS
    assert mark_path(path).is_symlink()


def test_a_repair_refuses_a_ledger_that_is_a_link(tmp_path: Path) -> None:
    real = tmp_path / "elsewhere" / "c.jsonl"
    _ledger(real)
    before = real.read_bytes()
    path = tmp_path / "ledgers" / "c.jsonl"
    path.parent.mkdir()
    path.symlink_to(real)
    with pytest.raises(LedgerError, match="symbolic link"):
        repair_ledger(path, assume_lost=0)
    assert real.read_bytes() == before


@pytest.mark.parametrize("dangling", [False, True])
def test_a_writer_refuses_a_linked_mark(tmp_path: Path, dangling: bool) -> None:
    """The client's own open: a link as its mark (to a file, or to none yet: not created
    through either)."""
    path = tmp_path / "ledgers" / "c.jsonl"
    _ledger(path)
    victim = _victim(tmp_path)
    mark_path(path).unlink()
    if dangling:
        victim.unlink()
    mark_path(path).symlink_to(victim)
    with pytest.raises(LedgerError, match="symbolic link"):
        PrivacyLedger.open(path, client_id="c", sampling="poisson", budget=None)
    assert victim.read_bytes() == PRECIOUS if not dangling else not victim.exists()


def test_a_writer_refuses_a_ledger_file_that_is_a_link(tmp_path: Path) -> None:
    """A link to a ledger elsewhere, beside a copy of its mark: it verifies, and its spends
    would be appended through the link. (A link where a new ledger is created is replaced by
    the file: tests/privacy/test_ledger_directory_lock.py.)"""
    victim = tmp_path / "elsewhere" / "c.jsonl"
    _ledger(victim)
    before = victim.read_bytes() + b'{"torn'  # a crash's torn line, which an open cuts
    victim.write_bytes(before)
    path = tmp_path / "ledgers" / "c.jsonl"
    path.parent.mkdir()
    path.symlink_to(victim)
    mark_path(path).write_bytes(mark_path(victim).read_bytes())
    with pytest.raises(LedgerError, match="symbolic link"):
        PrivacyLedger.open(path, client_id="c", sampling="poisson", budget=None)
    assert victim.read_bytes() == before
    with pytest.raises(LedgerError, match="symbolic link"):
        os.close(open_append(path))  # (a spend's descriptor under a directory lock)
    assert victim.read_bytes() == before


def test_a_copy_replaces_links_in_the_target_and_writes_through_none(tmp_path: Path) -> None:
    """A resumed launch's collect copies each state ledger into the run directory
    (resume_symlinks.sh planted the copy's mark as a link)."""
    source = tmp_path / "state" / "c.jsonl"
    _ledger(source)
    target = tmp_path / "run" / "ledgers" / "c.jsonl"
    target.parent.mkdir(parents=True)
    victims = [_victim(tmp_path), tmp_path / "elsewhere" / "other.txt"]
    victims[1].write_bytes(PRECIOUS)
    target.symlink_to(victims[0])
    mark_path(target).symlink_to(victims[1])
    copy_ledger(source, target)
    assert all(v.read_bytes() == PRECIOUS for v in victims)
    for copy, original in ((target, source), (mark_path(target), mark_path(source))):
        assert not copy.is_symlink() and copy.read_bytes() == original.read_bytes()


def _giant(tmp_path: Path) -> Path:
    """A ledger with a valid header and mark, grown (sparse) past the cap."""
    path = tmp_path / "ledgers" / "c.jsonl"
    _ledger(path, rounds=0)
    with path.open("r+b") as handle:
        handle.truncate(MAX_LEDGER_BYTES + 1)
    return path


def test_every_reader_refuses_a_ledger_larger_than_any_before_reading_it(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = _giant(tmp_path)
    with pytest.raises(LedgerError, match="larger than any ledger"):
        read_ledger_bytes(path)
    with pytest.raises(LedgerError, match="larger than any ledger"):
        PrivacyLedger.open(path, client_id="c", sampling="poisson", budget=None,
                           read_only=True)
    with pytest.raises(LedgerError, match="larger than any ledger"):
        PrivacyLedger.open(path, client_id="c", sampling="poisson", budget=None)
    with pytest.raises(LedgerError, match="larger than any ledger"):
        repair_ledger(path, assume_lost=0)
    assert main(["ledger", "check", str(path)]) == 2
    assert "larger than any ledger" in capsys.readouterr().err
    assert main(["account", "--ledger", str(path)]) == 2
    assert "larger than" in capsys.readouterr().err
    assert path.stat().st_size == MAX_LEDGER_BYTES + 1  # nothing cut or rewritten


def test_a_ledger_at_the_cap_is_read_and_one_byte_more_is_not(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from fedsim.privacy import ledger_file

    monkeypatch.setattr(ledger_file, "MAX_LEDGER_BYTES", 10)  # (the boundary, not 512 MiB)
    path = tmp_path / "c.jsonl"
    path.write_bytes(b"x" * 10)
    assert read_ledger_bytes(path) == b"x" * 10
    path.write_bytes(b"x" * 11)
    with pytest.raises(LedgerError, match="larger than any ledger"):
        read_ledger_bytes(path)


def test_a_new_ledger_replaces_a_dangling_link_at_its_name(tmp_path: Path) -> None:
    """A dangling link where a new ledger is to be created: replaced by the ledger (it raised
    FileExistsError and left a stray mark), and its target never created."""
    path = tmp_path / "ledgers" / "c.jsonl"
    path.parent.mkdir()
    victim = tmp_path / "victim"
    path.symlink_to(victim)
    _ledger(path)
    assert not path.is_symlink() and path.is_file() and not victim.exists()


def test_fifos_are_refused_not_waited_on(tmp_path: Path,
                                         capsys: pytest.CaptureFixture[str]) -> None:
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    assert main(["account", "--ledger", str(fifo)]) == 2  # hung before
    assert "not a regular file" in capsys.readouterr().err
    path = tmp_path / "ledgers" / "c.jsonl"
    _ledger(path)
    mark_path(path).unlink()
    os.mkfifo(mark_path(path))
    assert main(["ledger", "repair", str(path), "--assume-lost", "0"]) == 2  # ESPIPE before
    assert "not a regular file" in capsys.readouterr().err
    with pytest.raises(LedgerError, match="not a regular file"):
        PrivacyLedger.open(path, client_id="c", sampling="poisson", budget=None)
