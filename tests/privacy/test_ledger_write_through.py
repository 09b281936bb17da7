"""A simulated run's ledgers are written through, not fsynced, at every spend, and made durable
together by one file-system sync before the run's outputs (fedsim.privacy.ledger, "Durability
rule"); a deployed client's ledger fsyncs every spend before its update leaves.

What write-through keeps: a spend that returned is in the file when the process is killed
right after it (the records and the mark, in the kernel's cache), and the bytes are those an
fsynced ledger writes. What it gives up (a power failure mid-run) is not testable here."""

from __future__ import annotations

import ctypes
import errno
import json
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

import fedsim.atomic
from fedsim.atomic import FileSystemSync
from fedsim.config import LoadedScenario, parse_scenario
from fedsim.errors import LedgerError
from fedsim.privacy.events import GaussianStep
from fedsim.privacy.ledger import Budget, PrivacyLedger
from fedsim.privacy.ledger_directory_lock import DirectoryLock
from fedsim.privacy.ledger_mark import mark_path
from fedsim.runtime.assembly import open_ledger
from fedsim.runtime.population import build_population
from fedsim.runtime.simulated.simulation import run_scenario
from tests.privacy.test_ledger_creation import Fsyncs

STEP = GaussianStep("poisson", 0.02, 1.1)
BUDGET = Budget(8.0, 1e-5)
ROOT = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.skipif(not Path("/proc/self/fd").is_dir(), reason="needs /proc")


def _spend_rounds(path: Path, rounds: int, *, fsync: bool,
                  directory: DirectoryLock | None = None) -> None:
    with PrivacyLedger.open(path, client_id=path.stem, sampling="poisson", budget=BUDGET,
                            directory=directory, fsync=fsync) as ledger:
        for index in range(rounds):
            ledger.spend([STEP, STEP], time=float(index), round=index)


@pytest.mark.parametrize("under_directory_lock", [False, True])
def test_write_through_fsyncs_nothing_and_writes_the_fsynced_bytes(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, under_directory_lock: bool) -> None:
    synced, through = tmp_path / "synced" / "a.jsonl", tmp_path / "through" / "a.jsonl"
    for path in (synced, through):
        path.parent.mkdir()
    fsyncs = Fsyncs(monkeypatch)
    lock = DirectoryLock(synced.parent) if under_directory_lock else None
    _spend_rounds(synced, 3, fsync=True, directory=lock)
    assert fsyncs.take().count("a.jsonl") == 3  # one a spend
    if lock is not None:
        lock.close()
    lock = DirectoryLock(through.parent) if under_directory_lock else None
    _spend_rounds(through, 3, fsync=False, directory=lock)
    assert fsyncs.take() == []
    if lock is not None:
        lock.close()
    assert through.read_bytes() == synced.read_bytes()
    assert mark_path(through).read_bytes() == mark_path(synced).read_bytes()
    with PrivacyLedger.open(through, client_id="a", sampling="poisson", budget=BUDGET) as again:
        assert [r.round for r in again.records] == [0, 0, 1, 1, 2, 2]


@pytest.mark.parametrize("under_directory_lock", [False, True])
def test_a_spend_that_returned_survives_the_process_being_killed(
        tmp_path: Path, under_directory_lock: bool) -> None:
    """The process spends four rounds written through and is killed (SIGKILL: no exit
    handler, no close) right after the fourth returned: all four are in the ledger, whether
    it kept the file open or opened it for each spend (under a directory lock)."""
    path = tmp_path / "ledgers" / "c.jsonl"
    path.parent.mkdir()
    script = (
        "import os, signal, sys\n"
        "from pathlib import Path\n"
        "from fedsim.privacy.events import GaussianStep\n"
        "from fedsim.privacy.ledger import Budget, PrivacyLedger\n"
        "from fedsim.privacy.ledger_directory_lock import DirectoryLock\n"
        "path = Path(sys.argv[1])\n"
        "lock = DirectoryLock(path.parent) if sys.argv[2] == '1' else None\n"
        "ledger = PrivacyLedger.open(path, client_id='c', sampling='poisson',\n"
        "                            budget=Budget(8.0, 1e-5), fsync=False, directory=lock)\n"
        "for r in range(4):\n"
        "    ledger.spend([GaussianStep('poisson', 0.02, 1.1)], time=float(r), round=r)\n"
        "os.kill(os.getpid(), signal.SIGKILL)\n")
    done = subprocess.run([sys.executable, "-c", script, str(path),
                           "1" if under_directory_lock else "0"], cwd=ROOT,
                          capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == -signal.SIGKILL, done.stderr
    with PrivacyLedger.open(path, client_id="c", sampling="poisson", budget=BUDGET) as ledger:
        assert [r.round for r in ledger.records] == [0, 1, 2, 3]


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="syncfs(2) is Linux's")
def test_the_file_system_sync_flushes_and_says_what_went_wrong(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    assert FileSystemSync.AVAILABLE  # found in this libc (not silently left out)
    sync = FileSystemSync(tmp_path)
    (tmp_path / "f").write_bytes(b"x")
    sync.sync()  # a real syncfs(2)
    with pytest.raises(FileNotFoundError):
        FileSystemSync(tmp_path / "missing")

    def failing(fd: int) -> int:  # a write-back that failed, as the kernel reports it
        ctypes.set_errno(errno.EIO)
        return -1

    monkeypatch.setattr(fedsim.atomic, "_syncfs", failing)
    with pytest.raises(OSError, match="syncfs: Input/output error") as raised:
        sync.sync()
    assert raised.value.errno == errno.EIO
    sync.close()
    with pytest.raises(ValueError, match="closed"):
        sync.sync()


def _scenario() -> dict[str, Any]:
    return {
        "name": "write-through", "seed": 5, "stop": {"virtual_seconds": 3.0},
        "dataset": {"name": "synthetic", "num_samples": 400, "num_test_samples": 60,
                    "num_features": 4, "num_classes": 2},
        "model": {"name": "logreg"},
        "clients": {"groups": [{"name": "p", "count": 4, "data_share": 1.0, "batch_size": 10,
                                "clip": 1.0, "noise": 1.0, "speed": 0.05}]},
        "server": {"window": 0.5},
    }


def _ledger_rounds(out: Path) -> int:
    spent = 0
    for path in sorted((out / "ledgers").glob("*.jsonl")):
        with PrivacyLedger.open(path, client_id=path.stem, sampling="poisson", budget=None,
                                read_only=True) as ledger:
            spent += sum(1 for r in ledger.records if r.round >= 0)
    return spent


class _Syncs:
    """Every file-system sync, and whether the run's summary existed when it came."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, out: Path) -> None:
        self.seen: list[tuple[Path, bool]] = []
        real = FileSystemSync.sync

        def noted(sync: FileSystemSync) -> None:
            self.seen.append((sync.directory, (out / "summary.json").exists()))
            real(sync)

        monkeypatch.setattr(FileSystemSync, "sync", noted)


@pytest.mark.skipif(not FileSystemSync.AVAILABLE, reason="syncfs(2) is Linux's")
def test_a_simulated_run_syncs_its_ledgers_once_before_its_outputs(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    out = tmp_path / "run"
    syncs = _Syncs(monkeypatch, out)
    fsyncs = Fsyncs(monkeypatch)
    result = run_scenario(LoadedScenario(parse_scenario(_scenario()), None), out)
    ledger_fsyncs = [n for n in fsyncs.take() if n.endswith((".jsonl", ".hwm"))
                     or n == "ledgers"]
    assert ledger_fsyncs == []
    assert syncs.seen == [(out / "ledgers", False)]  # once, before summary.json was written
    rounds = sum(row["rounds"] for row in result.client_rows)
    assert rounds > 10
    assert _ledger_rounds(out) == rounds


@pytest.mark.skipif(not FileSystemSync.AVAILABLE, reason="syncfs(2) is Linux's")
def test_an_interrupted_run_syncs_before_its_partial_outputs(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    out = tmp_path / "run"
    syncs = _Syncs(monkeypatch, out)

    def interrupt(window: dict[str, Any]) -> None:
        if window["window"] == 3:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        run_scenario(LoadedScenario(parse_scenario(_scenario()), None), out,
                     on_window=interrupt)
    assert syncs.seen == [(out / "ledgers", False)]
    summary = json.loads((out / "summary.json").read_text(encoding="utf-8"))
    assert summary["interrupted"]["partial"] is True
    assert _ledger_rounds(out) > 0


@pytest.mark.skipif(not FileSystemSync.AVAILABLE, reason="syncfs(2) is Linux's")
def test_a_failed_sync_stops_the_run_before_its_summary(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def failing(fd: int) -> int:
        ctypes.set_errno(errno.EIO)
        return -1

    monkeypatch.setattr(fedsim.atomic, "_syncfs", failing)
    out = tmp_path / "run"
    with pytest.raises(LedgerError, match="could not be made durable.*Input/output error"):
        run_scenario(LoadedScenario(parse_scenario(_scenario()), None), out)
    assert not (out / "summary.json").exists()


def test_without_syncfs_every_spend_is_fsynced(tmp_path: Path,
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    """Off Linux (no syncfs(2); sync(2) may return before its writes are done)."""
    monkeypatch.setattr(FileSystemSync, "AVAILABLE", False)
    fsyncs = Fsyncs(monkeypatch)
    result = run_scenario(LoadedScenario(parse_scenario(_scenario()), None), tmp_path / "run")
    rounds = sum(row["rounds"] for row in result.client_rows)
    assert sum(n.endswith(".jsonl") for n in fsyncs.take()) == rounds


def test_a_deployed_clients_ledger_fsyncs_every_spend(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """``open_ledger``'s default, which the deployed client process uses."""
    plan = build_population(LoadedScenario(parse_scenario(_scenario()), None)).plans[0]
    fsyncs = Fsyncs(monkeypatch)
    with open_ledger(plan, tmp_path / "ledgers" / "c.jsonl") as ledger:
        ledger.spend([STEP], time=0.0, round=0)
        fsyncs.take()  # the first spend also makes the new ledger's creation durable
        ledger.spend([STEP], time=1.0, round=1)
    assert fsyncs.take() == ["c.jsonl", "c.jsonl.hwm"]
