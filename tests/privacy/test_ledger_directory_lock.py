"""Many ledgers in one process (issue 18): under a DirectoryLock a ledger keeps no file open
between spends, writes the same bytes, and the one-writer guarantee still holds both ways
(a run's directory against a single ledger's writer, in this process and in another)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from fedsim.errors import LedgerError
from fedsim.privacy.events import GaussianStep
from fedsim.privacy.ledger import Budget, PrivacyLedger
from fedsim.privacy.ledger_directory_lock import DirectoryLock

ROOT = Path(__file__).resolve().parents[2]
STEPS = [GaussianStep("poisson", 0.01, 1.0 + 0.05 * (r % 7)) for r in range(30)]


def _open(path: Path, directory: DirectoryLock | None = None) -> PrivacyLedger:
    return PrivacyLedger.open(path, client_id=path.stem, sampling="poisson",
                              budget=Budget(8.0, 1e-5), directory=directory)


def _spend_all(ledger: PrivacyLedger) -> float:
    for r, step in enumerate(STEPS):
        ledger.spend(step, time=0.5 * r, round=r)
    return ledger.epsilon()


def _open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


@pytest.mark.skipif(not Path("/proc/self/fd").is_dir(), reason="needs /proc/self/fd")
def test_ledgers_under_a_directory_lock_hold_no_descriptor_and_write_the_same_bytes(
        tmp_path: Path) -> None:
    held, lazy = tmp_path / "held", tmp_path / "lazy"
    held.mkdir()
    lazy.mkdir()
    expected = {}
    for k in range(3):
        with _open(held / f"c{k}.jsonl") as ledger:
            expected[k] = _spend_all(ledger)
    before = _open_fds()
    with DirectoryLock(lazy) as lock:
        ledgers = [_open(lazy / f"c{k}.jsonl", lock) for k in range(60)]
        assert _open_fds() - before == 1  # the directory's lock, for all 60
        eps = [_spend_all(ledger) for ledger in ledgers[:3]]
        assert _open_fds() - before == 1  # spends open and close their files
        for ledger in ledgers:
            ledger.close()
    assert _open_fds() == before
    assert eps == [expected[k] for k in range(3)]
    for k in range(3):
        for name in (f"c{k}.jsonl", f"c{k}.jsonl.hwm"):
            assert (lazy / name).read_bytes() == (held / name).read_bytes()
    with _open(lazy / "c1.jsonl") as reopened:  # resumes, verified against its mark
        assert len(reopened.records) == len(STEPS)
        assert reopened.epsilon() == expected[1]


def test_one_writer_holds_between_a_directory_lock_and_single_ledgers(tmp_path: Path) -> None:
    path = tmp_path / "c1.jsonl"
    single = _open(path)  # a writer of one ledger holds it
    lock = DirectoryLock(tmp_path)  # the directory lock itself does not see it ...
    with pytest.raises(LedgerError, match="open elsewhere"):
        _open(path, lock)  # ... but opening its ledger under the lock does
    single.close()
    ledger = _open(path, lock)
    with pytest.raises(LedgerError, match="open elsewhere"):
        _open(path, lock)  # a second handle in this process
    with pytest.raises(LedgerError, match="one writer"):
        _open(path)  # a single-ledger writer while the run holds the directory
    with pytest.raises(LedgerError, match="one writer"):
        _open(tmp_path / "c2.jsonl")  # any ledger of the directory
    assert not (tmp_path / "c2.jsonl").exists()
    with pytest.raises(LedgerError, match="open elsewhere"):
        DirectoryLock(tmp_path)  # a second run on the same directory
    ledger.spend(STEPS[0], time=0.0, round=0)
    lock.close()
    with pytest.raises(LedgerError, match="read-only or is closed"):
        ledger.spend(STEPS[1], time=1.0, round=1)  # its lock is gone: no more writes
    ledger.close()
    with _open(path) as again:  # free again once the run released the directory
        assert len(again.records) == 1


_CHILD = """
import sys
from fedsim.errors import LedgerError
from fedsim.privacy.ledger import Budget, PrivacyLedger
try:
    PrivacyLedger.open(sys.argv[1], client_id="c1", sampling="poisson", budget=Budget(8.0, 1e-5))
except LedgerError as exc:
    print("REFUSED", exc)
    sys.exit(3)
print("OPENED")
"""


@pytest.mark.slow
def test_another_process_cannot_write_a_ledger_of_a_locked_directory(tmp_path: Path) -> None:
    env = {"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"}
    path = tmp_path / "c1.jsonl"
    with DirectoryLock(tmp_path) as lock:
        _open(path, lock).spend(STEPS[0], time=0.0, round=0)  # not even held open
        child = subprocess.run([sys.executable, "-c", _CHILD, str(path)], capture_output=True,
                               text=True, env=env, timeout=120)
        assert child.returncode == 3 and "a run holds this directory" in child.stdout
    child = subprocess.run([sys.executable, "-c", _CHILD, str(path)], capture_output=True,
                           text=True, env=env, timeout=120)
    assert child.returncode == 0 and "OPENED" in child.stdout


def test_a_ledger_outside_the_directory_as_locked_is_refused(tmp_path: Path) -> None:
    """The lock is on the directory its path led to when it was taken: a path through a
    symlink re-pointed since (to a directory nobody locked) leads outside it."""
    locked, other = tmp_path / "locked", tmp_path / "other"
    locked.mkdir()
    other.mkdir()
    link = tmp_path / "ledgers"
    link.symlink_to(locked)
    with DirectoryLock(link) as lock:
        lock.claim(link / "a.jsonl")  # in the locked directory
        link.unlink()
        link.symlink_to(other)
        with pytest.raises(LedgerError, match="not in the locked directory"):
            lock.claim(link / "b.jsonl")
        lock.claim(locked / "c.jsonl")


def test_a_symlink_re_pointed_while_the_lock_is_taken_leads_no_claim_outside_it(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The lock resolves its path before it opens and locks it: a re-pointing between the
    two (an attacker's review's race) cannot make it accept claims in an unlocked directory."""
    from fedsim.privacy import ledger_directory_lock

    locked, other = tmp_path / "A", tmp_path / "B"
    locked.mkdir()
    other.mkdir()
    link = tmp_path / "ledgers"
    link.symlink_to(locked)
    real_fd = ledger_directory_lock._directory_fd

    def open_then_re_point(directory: Path) -> int:
        fd = real_fd(directory)
        link.unlink()
        link.symlink_to(other)
        return fd

    monkeypatch.setattr(ledger_directory_lock, "_directory_fd", open_then_re_point)
    with DirectoryLock(link) as lock:
        monkeypatch.setattr(ledger_directory_lock, "_directory_fd", real_fd)
        with pytest.raises(LedgerError, match="not in the locked directory"):
            lock.claim(link / "c.jsonl")
        lock.claim(locked / "c.jsonl")
        with DirectoryLock(other) as second:  # B was never locked: another writer may take it
            assert second.held
        with pytest.raises(LedgerError, match="open elsewhere"):
            DirectoryLock(locked)


def test_one_ledger_is_claimed_once_whatever_path_names_it(tmp_path: Path) -> None:
    """A claim knows a file by its directory's device and inode and its name (following a
    symlinked name): the same ledger through a symlinked directory, or through a symlink
    beside it, is the ledger already claimed; a released claim may be taken again."""
    locked = tmp_path / "locked"
    locked.mkdir()
    via = tmp_path / "via"
    via.symlink_to(locked)
    (locked / "alias.jsonl").symlink_to(locked / "a.jsonl")  # before a.jsonl exists
    with DirectoryLock(locked) as lock:
        lock.claim(locked / "a.jsonl")
        for same in (via / "a.jsonl", locked / "alias.jsonl", via / "alias.jsonl",
                     locked / "x" / ".." / "a.jsonl"):
            with pytest.raises(LedgerError, match="open elsewhere|not in the locked"):
                lock.claim(same)
        lock.claim(via / "b.jsonl")  # another ledger of the directory
        with pytest.raises(LedgerError, match="open elsewhere"):
            lock.claim(locked / "b.jsonl")
        lock.release(locked / "a.jsonl")
        lock.claim(locked / "alias.jsonl")  # a.jsonl through its alias, now free
        with pytest.raises(LedgerError, match="open elsewhere"):
            lock.claim(via / "a.jsonl")
        with pytest.raises(LedgerError, match="not in the locked"):
            lock.claim(tmp_path / "a.jsonl")
    with pytest.raises(LedgerError, match="released"):
        lock.claim(locked / "c.jsonl")


def test_a_symlinked_name_leading_out_of_the_directory_is_refused(tmp_path: Path) -> None:
    """A ledger name that is a symlink must lead to a file of the locked directory: one
    elsewhere (another directory, a subdirectory, a target whose directory does not exist
    yet) is not covered by this lock, so another process could write it under its own."""
    locked, other = tmp_path / "locked", tmp_path / "other"
    locked.mkdir()
    other.mkdir()
    (locked / "a.jsonl").symlink_to("later/x.jsonl")  # dangling: 'later' does not exist
    (locked / "b.jsonl").symlink_to(other / "b.jsonl")
    (locked / "c.jsonl").symlink_to("c-real.jsonl")  # in the directory: fine
    with DirectoryLock(locked) as lock:
        for name in ("a.jsonl", "b.jsonl"):
            with pytest.raises(LedgerError, match="outside the locked directory"):
                lock.claim(locked / name)
        (locked / "later").mkdir()
        with pytest.raises(LedgerError, match="outside the locked directory"):
            lock.claim(locked / "a.jsonl")
        lock.claim(locked / "c.jsonl")
        with pytest.raises(LedgerError, match="open elsewhere"):
            lock.claim(locked / "c-real.jsonl")


def test_a_ledger_created_through_a_symlinked_name_has_one_writer(tmp_path: Path) -> None:
    """Creating a ledger replaces a symlinked name by the file itself: the claim still holds
    the name, so a second handle of it is refused (one writer per ledger file)."""
    from fedsim.privacy.ledger import PrivacyLedger

    locked = tmp_path / "locked"
    locked.mkdir()
    (locked / "x.jsonl").write_bytes(b"")
    (locked / "a.jsonl").symlink_to("x.jsonl")
    with DirectoryLock(locked) as lock:
        options = dict(client_id="c", sampling="poisson", budget=None, accountant="rdp",
                       directory=lock)
        first = PrivacyLedger.open(locked / "a.jsonl", **options)
        assert not (locked / "a.jsonl").is_symlink()
        with pytest.raises(LedgerError, match="open elsewhere"):
            PrivacyLedger.open(locked / "a.jsonl", **options)
        first.close()
        PrivacyLedger.open(locked / "a.jsonl", **options).close()


def test_a_ledger_name_in_a_symlink_loop_is_a_clear_error(tmp_path: Path) -> None:
    (tmp_path / "a.jsonl").symlink_to("b.jsonl")
    (tmp_path / "b.jsonl").symlink_to("a.jsonl")
    with DirectoryLock(tmp_path) as lock:
        with pytest.raises(LedgerError, match="leads nowhere"):
            lock.claim(tmp_path / "a.jsonl")
        lock.claim(tmp_path / "c.jsonl")  # the lock goes on
