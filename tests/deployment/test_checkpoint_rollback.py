"""A server resumed from an older checkpoint than its last (an attacker's review, session 66):
a backup of ``server.ckpt`` restored, or the file swapped, is refused against the state
directory's durable high-water mark (``server.hwm``), with an error that says what to do."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from fedsim.runtime.deployed.checkpoint import (
    MARK_NAME,
    CheckpointError,
    HighWaterMark,
    ServerCheckpoint,
)
from tests.deployment.test_checkpoint import IDENTITY, _busy_server


def _two_checkpoints(tmp_path: Path) -> tuple[ServerCheckpoint, Path]:
    """A state directory whose newest checkpoint (window 14, version 11) applied client
    ``a``'s round 2 after an older one (window 12, version 9), kept as a backup."""
    state = tmp_path / "state"
    checkpoint = ServerCheckpoint(state, IDENTITY)
    server = _busy_server()
    checkpoint.save(server.snapshot())
    backup = tmp_path / "server.ckpt.backup"
    shutil.copy2(checkpoint.path, backup)
    server.book.record("a", 2)  # applied and acknowledged after the backup
    server.version, server.windows_closed = 11, 14
    checkpoint.save(server.snapshot())
    return checkpoint, backup


def test_a_restored_older_checkpoint_is_refused(tmp_path: Path) -> None:
    checkpoint, backup = _two_checkpoints(tmp_path)
    newest = ServerCheckpoint(checkpoint.directory, IDENTITY).load()
    assert newest is not None
    assert (newest.windows_closed, newest.version) == (14, 11)
    shutil.copy2(backup, checkpoint.path)  # the operator restores last night's backup
    # Taken, its book would have judged a's round 2 anew: a replayed copy applied twice.
    with pytest.raises(CheckpointError, match=r"older than the newest .*window 14, version 11"):
        ServerCheckpoint(checkpoint.directory, IDENTITY).load()


def test_a_deleted_checkpoint_beside_its_mark_is_refused_not_a_fresh_start(
        tmp_path: Path) -> None:
    checkpoint, _ = _two_checkpoints(tmp_path)
    checkpoint.path.unlink()
    with pytest.raises(CheckpointError, match="is missing, but .* window 14"):
        ServerCheckpoint(checkpoint.directory, IDENTITY).load()


@pytest.mark.parametrize("damage", [
    b"", b"{", b"[]", b'{"format": "fedsim-server-hwm/1"}', b"x" * 5000,
    b'{"format": "fedsim-server-hwm/1", "identity_sha256": "' + b"0" * 64
    + b'", "windows_closed": -1, "version": 0}',
], ids=["empty", "torn", "list", "partial", "oversized", "negative"])
def test_a_damaged_mark_is_a_clear_error(tmp_path: Path, damage: bytes) -> None:
    checkpoint, _ = _two_checkpoints(tmp_path)
    (checkpoint.directory / MARK_NAME).write_bytes(damage)
    with pytest.raises(CheckpointError, match="high-water mark .* is damaged"):
        ServerCheckpoint(checkpoint.directory, IDENTITY).load()


def test_a_mark_of_another_run_and_a_linked_mark_are_refused(tmp_path: Path) -> None:
    checkpoint, _ = _two_checkpoints(tmp_path)
    with pytest.raises(CheckpointError, match="another run"):
        ServerCheckpoint(checkpoint.directory, {**IDENTITY, "seed": 2}).load()
    mark = checkpoint.directory / MARK_NAME
    elsewhere = tmp_path / "elsewhere.hwm"
    os.replace(mark, elsewhere)
    mark.symlink_to(elsewhere)
    with pytest.raises(CheckpointError, match="damaged"):
        ServerCheckpoint(checkpoint.directory, IDENTITY).load()


def test_a_checkpoint_without_a_mark_is_taken_and_gets_one(tmp_path: Path) -> None:
    checkpoint, _ = _two_checkpoints(tmp_path)
    (checkpoint.directory / MARK_NAME).unlink()  # as an earlier fedsim left it
    snapshot = ServerCheckpoint(checkpoint.directory, IDENTITY).load()
    assert snapshot is not None and snapshot.windows_closed == 14
    checkpoint.save(snapshot)
    mark = HighWaterMark.model_validate_json((checkpoint.directory / MARK_NAME).read_bytes())
    assert (mark.windows_closed, mark.version) == (14, 11)


def test_a_crash_between_the_checkpoint_and_its_mark_still_resumes(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    checkpoint, _ = _two_checkpoints(tmp_path)
    server = _busy_server()
    server.version, server.windows_closed = 12, 15
    real = os.replace

    def crash_on_the_mark(source: object, target: object) -> None:
        if Path(str(target)).name == MARK_NAME:
            raise OSError("power lost before the mark's rename")
        real(source, target)  # type: ignore[arg-type]

    monkeypatch.setattr(os, "replace", crash_on_the_mark)
    with pytest.raises(OSError):
        checkpoint.save(server.snapshot())
    monkeypatch.undo()
    restored = ServerCheckpoint(checkpoint.directory, IDENTITY).load()
    assert restored is not None
    assert (restored.windows_closed, restored.version) == (15, 12)  # the mark lags: fine
