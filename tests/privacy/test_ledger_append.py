"""The spend's append path (issue 24): the same bytes as the format's definition, one check of
the mark a spend, and every state a failed or cut write leaves reopens with exactly what the
file holds (a torn line cut off, complete lines counted)."""

from __future__ import annotations

import errno
import hashlib
import json
import os
import zlib
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fedsim.errors import LedgerError
from fedsim.privacy import ledger_file
from fedsim.privacy.events import GaussianStep
from fedsim.privacy.ledger import Budget, PrivacyLedger, read_ledger_steps
from fedsim.privacy.ledger_directory_lock import DirectoryLock
from fedsim.privacy.ledger_file import LedgerRecord, encode_record
from fedsim.privacy.ledger_mark import mark_path
from fedsim.privacy.ledger_repair import repair_ledger

BUDGET = Budget(50.0, 1e-5)
# (steps, time, round): one step, a step of count 3, a round of two kinds (two records), a
# q and sigma whose shortest repr has 16-17 digits
SPENDS = [(GaussianStep("poisson", 0.02, 1.1), 0.25, 0),
          (GaussianStep("poisson", 0.02, 1.1, 3), 1.5, 1),
          ([GaussianStep("poisson", 0.01, 2.0), GaussianStep("poisson", 0.03, 0.9, 2)], 1.5, 2),
          (GaussianStep("poisson", 1 / 3, 1.7 + 1e-12), 7.0, 3)]


def _sha(line: bytes) -> str:
    return hashlib.sha256(line).hexdigest()


def expected_files(client_id: str) -> tuple[bytes, bytes]:
    """The ledger and mark bytes of :data:`SPENDS`, from the format's definition (json.dumps
    of each line, a spend's records still to follow in each but its last, SHA-256 chain, two checksummed 256-byte slots that also carry the largest q,
    the smallest sigma and the most steps of any record, and whether a selection was
    recorded), not from ledger_file."""
    header = json.dumps({"format": "fedsim-ledger/2", "client_id": client_id,
                         "sampling": "poisson", "accountant": "pld",
                         "budget": {"epsilon": 50.0, "delta": 1e-5}}).encode()
    lines, prev = [header], _sha(header)
    # The new ledger's mark of 0 records in slot 0, then each spend's in the other slot.
    slots = [b"", b""]
    q, sigma, most = 0.0, float("inf"), 0
    for write, (steps, time, round_) in enumerate(SPENDS, start=1):
        kinds = steps if isinstance(steps, list) else [steps]
        for index, step in enumerate(kinds):
            q, sigma, most = max(q, step.q), min(sigma, step.sigma), max(most, step.count)
            # a spend of several records: each but its last says how many follow ("rest")
            rest = {"rest": len(kinds) - 1 - index} if index < len(kinds) - 1 else {}
            line = json.dumps({"time": time, "round": round_,
                               "step": {"sampling": step.sampling, "q": step.q,
                                        "sigma": step.sigma, "count": step.count},
                               "prev": prev, **rest}).encode()
            lines.append(line)
            prev = _sha(line)
        count = len(lines) - 1
        body = f"fedsim-hwm/2 {count} {prev} {q!r} {sigma!r} {most} 0"
        slots[write % 2] = f"{body} {zlib.crc32(body.encode()):08x}".encode().ljust(255) + b"\n"
    return b"".join(line + b"\n" for line in lines), slots[0] + slots[1]


def spend_all(ledger: PrivacyLedger, spends: list = SPENDS) -> None:  # type: ignore[type-arg]
    for steps, time, round_ in spends:
        ledger.spend(steps, time=time, round=round_)


@pytest.mark.parametrize("under_directory_lock", [False, True])
def test_the_files_are_the_formats_bytes(tmp_path: Path, under_directory_lock: bool) -> None:
    path = tmp_path / "c.jsonl"
    directory = DirectoryLock(tmp_path) if under_directory_lock else None
    with PrivacyLedger.open(path, client_id="c", sampling="poisson", budget=BUDGET,
                            directory=directory) as ledger:
        spend_all(ledger)
    if directory is not None:
        directory.close()
    assert (path.read_bytes(), mark_path(path).read_bytes()) == expected_files("c")


finite = st.floats(allow_nan=False, allow_infinity=False)


@settings(max_examples=300, deadline=None)
@given(time=finite, round_=st.integers(min_value=-2**70, max_value=2**70),
       sampling=st.sampled_from(["poisson", "fixed"]),
       q=st.floats(min_value=5e-324, max_value=1.0), sigma=finite.filter(lambda s: s > 0),
       count=st.integers(min_value=1, max_value=2**70), prev=st.binary(max_size=8))
def test_a_step_record_is_json_dumps_bytes(time: float, round_: int, sampling: str, q: float,
                                           sigma: float, count: int, prev: bytes) -> None:
    step = GaussianStep(sampling, q, sigma, count)  # type: ignore[arg-type]
    digest = _sha(prev)
    for record in (LedgerRecord(time, round_, step), LedgerRecord(round_, round_, step)):
        obj = {"time": record.time, "round": round_,
               "step": {"sampling": sampling, "q": step.q, "sigma": step.sigma, "count": count},
               "prev": digest}
        assert encode_record(record, digest) == json.dumps(obj).encode()
    # a prev that JSON escapes, and a repair note, go through json.dumps
    record = LedgerRecord(time, round_, step)
    for prev_text, repair in (('a"b\\', None), ("é", None), (digest, "lost 2")):
        obj = {**record.to_json(), "prev": prev_text}
        if repair is not None:
            obj["repair"] = repair
        assert encode_record(record, prev_text, repair) == json.dumps(obj).encode()


def test_a_spend_checks_the_mark_once_before_its_records(tmp_path: Path,
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    """One stat of the mark a spend (it was two), made before the records are written."""
    calls: list[str] = []
    real_stat, real_write = os.stat, os.write

    def stat(path: object, *args: object, **kwargs: object) -> os.stat_result:
        calls.append(f"stat {Path(str(path)).name}")
        return real_stat(path, *args, **kwargs)  # type: ignore[arg-type]

    def write(fd: int, data: bytes) -> int:
        calls.append("write")
        return real_write(fd, data)

    with PrivacyLedger.open(tmp_path / "c.jsonl", client_id="c", sampling="poisson",
                            budget=BUDGET) as ledger:
        ledger.spend(GaussianStep("poisson", 0.02, 1.1), time=0.0, round=0)
        monkeypatch.setattr(os, "stat", stat)
        monkeypatch.setattr(os, "write", write)
        ledger.spend(GaussianStep("poisson", 0.02, 1.1), time=1.0, round=1)
        monkeypatch.undo()
    assert calls == ["stat c.jsonl.hwm", "write"]


def test_a_short_write_is_continued(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    real = os.write

    def short(fd: int, data: bytes) -> int:
        return real(fd, bytes(data[: max(1, len(data) // 3)]))

    path = tmp_path / "c.jsonl"
    with PrivacyLedger.open(path, client_id="c", sampling="poisson", budget=BUDGET) as ledger:
        monkeypatch.setattr(os, "write", short)
        spend_all(ledger)
        monkeypatch.undo()
    assert (path.read_bytes(), mark_path(path).read_bytes()) == expected_files("c")


def _reference(tmp_path: Path, spends: int) -> bytes:
    """The ledger bytes of the first ``spends`` of :data:`SPENDS`, written without a fault."""
    path = tmp_path / "reference" / "c.jsonl"
    with PrivacyLedger.open(path, client_id="c", sampling="poisson", budget=BUDGET) as ledger:
        spend_all(ledger, SPENDS[:spends])
    return path.read_bytes()


@pytest.mark.parametrize("under_directory_lock", [False, True])
@pytest.mark.parametrize("fault", ["torn-write", "records-fsync", "mark-write"])
def test_a_failed_write_stops_the_handle_and_reopens_as_the_file_holds(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, fault: str,
        under_directory_lock: bool) -> None:
    """A write or fsync that fails midway (a full disk, an I/O error) raises from the spend,
    which released nothing. The handle then writes nothing more (its next record would chain
    from a line the file may not hold), and opening the ledger again reads what the file
    holds: a torn line (never acknowledged) cut off, complete lines counted (the safe
    direction: a release that may not have happened), either way a ledger that continues."""
    path = tmp_path / "run" / "c.jsonl"
    path.parent.mkdir()
    directory = DirectoryLock(path.parent) if under_directory_lock else None
    real_write, real_fsync, real_pwrite = os.write, os.fsync, os.pwrite

    def torn(fd: int, data: bytes) -> int:  # inside the first of the spend's two lines
        real_write(fd, bytes(data[: bytes(data).index(b"\n") // 2]))
        raise OSError(errno.ENOSPC, "No space left on device")

    def fsync_fails(fd: int) -> None:
        raise OSError(errno.EIO, "Input/output error")

    def pwrite_fails(fd: int, data: bytes, offset: int) -> int:
        raise OSError(errno.EIO, "Input/output error")

    ledger = PrivacyLedger.open(path, client_id="c", sampling="poisson", budget=BUDGET,
                                directory=directory)
    spend_all(ledger, SPENDS[:2])
    if fault == "torn-write":
        monkeypatch.setattr(os, "write", torn)
    elif fault == "records-fsync":
        def write_then_fail(fd: int, data: bytes) -> int:
            written = real_write(fd, data)
            monkeypatch.setattr(os, "fsync", fsync_fails)
            return written
        monkeypatch.setattr(os, "write", write_then_fail)
    else:
        monkeypatch.setattr(os, "pwrite", pwrite_fails)
    with pytest.raises(OSError):
        spend_all(ledger, SPENDS[2:3])
    monkeypatch.setattr(os, "write", real_write)
    monkeypatch.setattr(os, "fsync", real_fsync)
    monkeypatch.setattr(os, "pwrite", real_pwrite)
    assert len(ledger.records) == 2  # memory holds the acknowledged spends only
    with pytest.raises(LedgerError, match="a write failed .*open the ledger again"):
        spend_all(ledger, SPENDS[3:])
    ledger.close()
    kept = 2 if fault == "torn-write" else 3  # spends whose records are complete on disk
    with PrivacyLedger.open(path, client_id="c", sampling="poisson", budget=BUDGET,
                            directory=directory) as reopened:
        assert len(reopened.records) == len(list(read_ledger_steps(path))) == [2, 4][kept - 2]
        assert path.read_bytes() == _reference(tmp_path, kept)
        spend_all(reopened, SPENDS[kept:])
    if directory is not None:
        directory.close()
    assert (path.read_bytes(), mark_path(path).read_bytes()) == expected_files("c")


def test_a_crash_mid_write_leaves_a_torn_tail_that_reopening_cuts(tmp_path: Path) -> None:
    """A process killed inside the records' write (before its fsync returned: nothing was
    acknowledged or released) leaves a prefix of the line; the next open cuts it and the
    ledger continues to the same bytes as one that never crashed."""
    path = tmp_path / "c.jsonl"
    with PrivacyLedger.open(path, client_id="c", sampling="poisson", budget=BUDGET) as ledger:
        spend_all(ledger, SPENDS[:2])
        line = encode_record(LedgerRecord(1.5, 2, GaussianStep("poisson", 0.01, 2.0)),
                             ledger_file.line_hash(path.read_bytes().splitlines()[-1]))
    for cut in (1, len(line) // 2, len(line)):  # without its newline, however much of it
        with path.open("ab") as handle:
            handle.write(line[:cut])
        with PrivacyLedger.open(path, client_id="c", sampling="poisson",
                                budget=BUDGET) as reopened:
            assert len(reopened.records) == 2
        assert path.read_bytes() == _reference(tmp_path / str(cut), 2)
    with PrivacyLedger.open(path, client_id="c", sampling="poisson", budget=BUDGET) as ledger:
        spend_all(ledger, SPENDS[2:])
    assert (path.read_bytes(), mark_path(path).read_bytes()) == expected_files("c")


@pytest.mark.parametrize("read_only", [False, True])
def test_an_unterminated_tail_longer_than_a_record_is_damage_refused_with_every_byte_kept(
        tmp_path: Path, read_only: bool) -> None:
    """A spend writes whole lines at once, so a crash leaves at most one record's line without
    its newline. A longer unterminated tail (here one byte past the longest line a record may
    have) is not a crash's: the writer's open and a read-only view refuse it (before, the
    writer cut it off and a view skipped it, silently), and the file keeps every byte for the
    repair, which drops it."""
    path = tmp_path / "c.jsonl"
    with PrivacyLedger.open(path, client_id="c", sampling="poisson", budget=BUDGET) as ledger:
        spend_all(ledger, SPENDS[:2])
    garbage = b"x" * (ledger_file.MAX_LINE_BYTES + 1)
    with path.open("ab") as handle:
        handle.write(garbage)
    before = path.read_bytes()
    with pytest.raises(LedgerError, match=f"last {len(garbage)} bytes have no line end"):
        PrivacyLedger.open(path, client_id="c", sampling="poisson", budget=BUDGET,
                           read_only=read_only)
    with pytest.raises(LedgerError, match="no line end"):
        read_ledger_steps(path)
    assert path.read_bytes() == before  # nothing cut
    # One byte shorter is a record's length: a crash's torn line, skipped or cut as before.
    path.write_bytes(before[:-1])
    with PrivacyLedger.open(path, client_id="c", sampling="poisson", budget=BUDGET,
                            read_only=read_only) as reopened:
        assert len(reopened.records) == 2
    assert path.read_bytes() == (before[:-1] if read_only else before[:-len(garbage)])
    path.write_bytes(before)
    report = repair_ledger(path)
    assert (report.damaged, report.kept, report.substituted) == (True, 2, 0)
    assert Path(str(report.backup)).read_bytes() == before
    with PrivacyLedger.open(path, client_id="c", sampling="poisson", budget=BUDGET) as repaired:
        assert len(repaired.records) == 2
