"""Durable server checkpoints: a restarted server process resumes where it left off.

A checkpoint is one file, ``<state dir>/server.ckpt``: a numpy ``.npz`` archive (no pickle)
holding the flat float32 model as ``params`` and everything else of a
:class:`~fedsim.runtime.actors.server_snapshot.ServerSnapshot` (version and version ceiling, window
count, clock time, the client book - per client a watermark and a bitmap of at most 1024
rounds, its status, the published versions as runs, the kept invitations: ``O(clients)``, not
``O(updates)``, :mod:`fedsim.runtime.actors.client_book` - step-size and participation-generator
state, last evaluation) as a UTF-8 JSON document ``state``, plus the run's *identity* (scenario name, seed,
model size, ...), which must match on load so that a state directory is never resumed by a
different scenario.

Writes are atomic and durable (:func:`fedsim.atomic.write_atomically`, ``"durable"``): the
archive goes to a temporary file in the same directory, which is fsynced, renamed over the old
checkpoint, and the directory is fsynced so the rename itself survives a power loss (updates are
acknowledged once the checkpoint that records them is saved). A crash at any moment
leaves either the old or the new checkpoint, never a torn one. :meth:`ServerCheckpoint.save`
blocks; the deployed server calls it on a worker thread, off the event loop
(:mod:`fedsim.runtime.deployed.server_process`).

One state directory has one server: :class:`ServerStateLock` (an exclusive ``flock`` on
``<state dir>/server.lock``, held for the server's life) refuses a second. Two servers resumed
from one checkpoint fought over the broker, wedged every client on whichever incarnation it
heard last, and each overwrote the other's checkpoint, so a later restart published a version
older than one already broadcast (a stranger's test, session 50).

**Never an older checkpoint than the last one written** (an attacker's review, session 66).
Beside the checkpoint, ``<state dir>/server.hwm`` (:class:`HighWaterMark`, small JSON) records
the window count and version of the newest checkpoint written; it is replaced durably right
after each checkpoint, so a crash between the two leaves the mark behind the checkpoint, never
ahead. :meth:`ServerCheckpoint.load` refuses a checkpoint below its mark (a backup of
``server.ckpt`` restored, or a file swapped by someone with access to the directory), and a
missing checkpoint beside a mark. Resumed from such an older checkpoint, the server's client
book no longer held the rounds it had applied and acknowledged since (their clients had
forgotten them, but a copy replayed to it - by the broker, a recorded session, a client - whose
base version it had published before the checkpoint was applied a second time), and its
version went back below the versions its clients held: they ignored its models until it
caught up, and released rounds on versions it had never published (refused after their privacy
was spent). Mend it by restoring the newest checkpoint, or start a new run on a fresh state
directory. A checkpoint with no mark beside it (written by an earlier fedsim) is taken, logged,
and gets its mark at the next save. The mark is no defence against someone who can rewrite
both files (a whole state directory restored from a backup): docs/SECURITY.md.
"""

from __future__ import annotations

import hashlib
import io
import json
import math
import os
import re
import time
import zipfile
from dataclasses import replace
from pathlib import Path
from typing import Any, Literal

import numpy as np
from pydantic import BaseModel, ConfigDict, Field

from fedsim.atomic import (
    locked_or_closed,
    open_no_link,
    open_regular,
    write_atomically,
)
from fedsim.errors import ConfigError, FedsimError
from fedsim.json_input import parse_json, read_json_model
from fedsim.logging import get_logger
from fedsim.protocol.headers import MAX_COUNTER
from fedsim.runtime.actors.client_book import WINDOW, BookState
from fedsim.runtime.actors.server_snapshot import ServerSnapshot

__all__ = ["CHECKPOINT_FORMAT", "CheckpointError", "HighWaterMark", "ServerCheckpoint",
           "ServerStateLock"]

_log = get_logger("fedsim.runtime.deployed.checkpoint")

CHECKPOINT_FORMAT = 2
"""2: the client book replaces the de-duplication table, statuses, invitations and versions of
format 1 (a format-1 checkpoint is refused with a clear error)."""
FILE_NAME = "server.ckpt"
LOCK_NAME = "server.lock"
MARK_NAME = "server.hwm"
MAX_MARK_BYTES = 4096
"""A mark file longer than this is damage, refused before it is read."""
_INCARNATION = re.compile(r"[0-9a-f]{1,32}")
"""A run incarnation as a frame's header carries it (:data:`fedsim.protocol.headers.Incarnation`)."""


class CheckpointError(FedsimError):
    """A checkpoint file is unreadable, of another format, or of another run."""

    exit_code = 2


class ServerStateLock:
    """The exclusive lock of a server state directory, held until :meth:`close` (module
    docstring); creates the directory. Raises :class:`CheckpointError` if another process
    holds it."""

    def __init__(self, directory: str | Path) -> None:
        self.directory = Path(directory)
        if os.name != "posix":  # pragma: no cover
            raise CheckpointError("a server state directory's lock needs a POSIX system")
        try:
            self.directory.mkdir(parents=True, exist_ok=True)
            self._fd = open_no_link(self.directory / LOCK_NAME, os.O_RDWR | os.O_CREAT, 0o644)
        except OSError as exc:
            raise CheckpointError(f"{self.directory}: cannot lock the server state directory "
                                  f"({exc.strerror})") from None
        if not locked_or_closed(self._fd):
            self._fd = -1
            raise CheckpointError(
                f"{self.directory}: another server is running on this state directory (it "
                f"holds {LOCK_NAME}); a run has one server: stop that one first (two would "
                f"overwrite each other's checkpoint)")

    def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)  # releases the lock
            self._fd = -1

    def __enter__(self) -> ServerStateLock:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _state_document(snapshot: ServerSnapshot, identity: dict[str, Any]) -> dict[str, Any]:
    return {
        "format": CHECKPOINT_FORMAT,
        "identity": identity,
        "version": snapshot.version,
        "windows_closed": snapshot.windows_closed,
        "time": snapshot.time,
        "version_ceiling": snapshot.version_ceiling,
        "book": snapshot.book.document(),
        "step_size_state": snapshot.step_size_state,
        "rng_state": snapshot.rng_state,
        "last_accuracy": snapshot.last_accuracy,
        "evaluated_version": snapshot.evaluated_version,
        # JSON has no NaN; "not evaluated yet" is stored as null.
        "last_evaluation": [None if math.isnan(v) else v for v in snapshot.last_evaluation],
        "incarnations": list(snapshot.incarnations),
        "aggregator_marks": snapshot.aggregator_marks,
    }


def _snapshot_from(params: np.ndarray, state: dict[str, Any]) -> ServerSnapshot:
    accuracy, loss = (math.nan if v is None else float(v) for v in state["last_evaluation"])
    return ServerSnapshot(
        params=params,
        version=int(state["version"]),
        windows_closed=int(state["windows_closed"]),
        time=float(state["time"]),
        version_ceiling=(None if state.get("version_ceiling") is None
                         else int(state["version_ceiling"])),
        book=BookState.from_document(state["book"]),
        step_size_state=dict(state["step_size_state"]),
        rng_state=dict(state["rng_state"]),
        last_accuracy=state["last_accuracy"],
        evaluated_version=int(state["evaluated_version"]),
        last_evaluation=(accuracy, loss),
        incarnations=tuple(_incarnations(state.get("incarnations", []))),
        aggregator_marks=_marks(state.get("aggregator_marks", {})),
    )


def _incarnations(document: Any) -> list[str]:
    """The run incarnations a checkpoint names (ValueError: not what a server writes; each
    travels in every frame's lineage, so one no frame can carry broke every publish)."""
    if not isinstance(document, list):
        raise ValueError(f"incarnations: expected a list, got {type(document).__name__}")
    for incarnation in document:
        if not isinstance(incarnation, str) or not _INCARNATION.fullmatch(incarnation):
            raise ValueError(f"incarnations: {incarnation!r} is not a run incarnation")
    return document


def _counter(name: str, value: int, low: int = 0) -> None:
    if not low <= value <= MAX_COUNTER:
        raise ValueError(f"{name}: {value} is outside [{low}, {MAX_COUNTER}]")


def _check(snapshot: ServerSnapshot, clients: Any) -> None:
    """Raise ValueError unless ``snapshot`` holds what a server of the run's ``clients`` (the
    identity's list; None: not checked) writes. An attacker's review, session 64: a tampered
    checkpoint crashed the restore with a traceback, or was taken and broke the run later (a
    version or lineage no frame carries, a clock at NaN, a window count below zero)."""
    _counter("version", snapshot.version)
    _counter("windows_closed", snapshot.windows_closed)
    _counter("evaluated_version", snapshot.evaluated_version, -1)
    if snapshot.version_ceiling is not None:
        _counter("version_ceiling", snapshot.version_ceiling, snapshot.version)
    if not (math.isfinite(snapshot.time) and snapshot.time >= 0):
        raise ValueError(f"time: {snapshot.time} is not a finite time")
    if isinstance(clients, list):  # (an identity without them - a test's - checks none)
        book = snapshot.book
        # (a set: a list's membership made a restart of 10^5 clients quadratic)
        strangers = {*book.clients, *book.statuses, *snapshot.aggregator_marks} - set(clients)
        if strangers:
            raise ValueError(f"client {min(strangers)!r} is not one of the run's")
    _check_book(snapshot.book)
    generator = np.random.Generator(np.random.PCG64())
    generator.bit_generator.state = snapshot.rng_state  # (ValueError: another kind)


def _check_book(book: BookState) -> None:
    """:func:`_check`'s part for the client book: counters in range, bitmaps of at most
    ``WINDOW`` rounds, invitations and published versions as a book writes them."""
    for client_id, (low, bits, highest, judged, base) in book.clients.items():
        for name, value, least in (("watermark", low, 0), ("newest round", highest, -1),
                                   ("judged", judged, 0), ("adopted", base, 0)):
            _counter(f"book[{client_id!r}] {name}", value, least)
        if int(bits, 16) >> WINDOW:  # (ValueError: not hex)
            raise ValueError(f"book[{client_id!r}]: a bitmap longer than {WINDOW} rounds")
    for bits in book.invitations.values():
        bytes.fromhex(bits)
    for first, last in book.published:
        _counter("published version", first)
        _counter("published version", last, first)


def _marks(document: Any) -> dict[str, int]:
    """The aggregation nodes' names from a checkpoint (ValueError: not what one writes)."""
    if not isinstance(document, dict):
        raise ValueError(f"aggregator_marks: expected an object, got {type(document).__name__}")
    marks = {}
    for client_id, mark in document.items():
        if isinstance(mark, bool) or not isinstance(mark, int) or not 0 <= mark <= MAX_COUNTER:
            raise ValueError(f"aggregator_marks[{client_id!r}]: {mark!r} is not a round")
        marks[str(client_id)] = mark
    return marks


class HighWaterMark(BaseModel):
    """What ``server.hwm`` holds (module docstring): the newest checkpoint's window count and
    version, and a digest of the run's identity (the checkpoint's)."""

    model_config = ConfigDict(frozen=True, extra="forbid", strict=True)

    format: Literal["fedsim-server-hwm/1"] = "fedsim-server-hwm/1"
    identity_sha256: str = Field(pattern=r"^[0-9a-f]{64}$")
    windows_closed: int = Field(ge=0, le=MAX_COUNTER)
    version: int = Field(ge=0, le=MAX_COUNTER)
    finished: str | None = Field(default=None, max_length=1000)
    """Set once the run ended (its stop reason, :meth:`ServerCheckpoint.mark_finished`): the
    checkpoint is then its last, and no server goes on from it."""

    def below(self, snapshot: ServerSnapshot) -> bool:
        """Whether ``snapshot`` is older than the checkpoint this mark records (window counts
        and versions only ever grow in one run, a restart's renewal included)."""
        return (snapshot.windows_closed < self.windows_closed
                or snapshot.version < self.version)


def _identity_digest(identity: dict[str, Any]) -> str:
    return hashlib.sha256(json.dumps(identity, sort_keys=True).encode()).hexdigest()


class ServerCheckpoint:
    """The checkpoint file of one server state directory.

    ``identity`` describes the run (JSON-serialisable); :meth:`load` refuses a checkpoint whose
    identity differs.
    """

    def __init__(self, directory: str | Path, identity: dict[str, Any]) -> None:
        self.directory = Path(directory)
        self.path = self.directory / FILE_NAME
        self.mark_path = self.directory / MARK_NAME
        self.identity = json.loads(json.dumps(identity))  # as it will read back
        self._identity_sha256 = _identity_digest(self.identity)  # (every client's id: once)
        self.saves = 0
        self._newest: HighWaterMark | None = None  # the mark of the newest checkpoint saved
        self.seconds: list[float] = []  # each save's duration, for the run's summary (bounded)

    def save(self, snapshot: ServerSnapshot) -> None:
        """Write ``snapshot`` atomically and durably (see the module docstring); blocks."""
        started = time.perf_counter()
        self.directory.mkdir(parents=True, exist_ok=True)
        state = json.dumps(_state_document(snapshot, self.identity), allow_nan=True).encode()
        buffer = io.BytesIO()
        arrays: dict[str, np.ndarray] = {
            "params": np.asarray(snapshot.params, dtype=np.float32),
            "state": np.frombuffer(state, dtype=np.uint8),
            # The server optimizer's moments (momentum, adam, yogi), one array each.
            **{f"optimizer_{k}": v for k, v in snapshot.optimizer_state.items()},
        }
        np.savez(buffer, **arrays)  # type: ignore[arg-type]  # numpy's stub types allow_pickle
        write_atomically(self.path, buffer.getbuffer(), durability="durable")
        # After the checkpoint, durably: a crash between the two leaves the mark behind.
        mark = HighWaterMark(identity_sha256=self._identity_sha256,
                             windows_closed=snapshot.windows_closed, version=snapshot.version)
        write_atomically(self.mark_path, mark.model_dump_json(), durability="durable")
        self._newest = mark
        self.saves += 1
        self.seconds = [*self.seconds[-99:], time.perf_counter() - started]

    def mark_finished(self, reason: str) -> None:
        """Record durably in the mark that the run ended, for ``reason``, with the newest
        checkpoint written (call once it is durable): :meth:`load` then refuses to go on from
        it. A stranger's ``fedsim server`` restarted on a finished run's state closed a window
        13 after the run's 12, rewrote ``server.json`` and announced the end again."""
        newest = self._newest or self._mark()
        if newest is None:
            return  # no checkpoint: nothing a restart could go on from
        mark = newest.model_copy(update={"finished": reason[:1000] or "finished"})
        write_atomically(self.mark_path, mark.model_dump_json(), durability="durable")

    def load(self) -> ServerSnapshot | None:
        """The saved snapshot, or None if there is no checkpoint yet. Raises
        :class:`CheckpointError` for a checkpoint older than the directory's high-water mark,
        or missing beside one (module docstring), and for a run that ended
        (:meth:`mark_finished`): nothing to resume."""
        mark = self._mark()
        if not self.path.exists():
            if mark is not None:
                raise CheckpointError(
                    f"{self.path} is missing, but {self.mark_path} records a checkpoint of "
                    f"window {mark.windows_closed} (version {mark.version}): restore the "
                    "newest checkpoint, or start a new run on a fresh --state directory")
            return None
        snapshot = self._snapshot()
        if mark is None:
            _log.warning("checkpoint without a high-water mark (written by an earlier fedsim): "
                         "taken, its mark is written at the next save", path=str(self.path))
        elif mark.below(snapshot):
            raise CheckpointError(
                f"checkpoint {self.path} (window {snapshot.windows_closed}, version "
                f"{snapshot.version}) is older than the newest this state directory wrote "
                f"(window {mark.windows_closed}, version {mark.version}, {self.mark_path}): "
                "a rolled-back server would apply again updates it already applied and "
                "publish versions below those its clients hold; restore the newest "
                "checkpoint, or start a new run on a fresh --state directory")
        if mark is not None and mark.finished is not None:
            raise CheckpointError(
                f"{self.directory}: its run ended at window {mark.windows_closed} "
                f"({mark.finished}); nothing to resume: start a new run on a fresh --state "
                "directory")
        return snapshot

    def _mark(self) -> HighWaterMark | None:
        """The directory's high-water mark, None if it has none (CheckpointError: damaged,
        or of another run)."""
        try:
            mark = read_json_model(self.mark_path, HighWaterMark, most=MAX_MARK_BYTES,
                                   shape="a fedsim server's high-water mark")
        except ConfigError as exc:
            raise CheckpointError(f"high-water mark {exc}; restore the state directory's "
                                  "own") from None
        if mark is None:
            return None
        if mark.identity_sha256 != self._identity_sha256:
            raise CheckpointError(f"high-water mark {self.mark_path} belongs to another run; "
                                  "use a fresh --state directory")
        return mark

    def _snapshot(self) -> ServerSnapshot:
        """The checkpoint file's snapshot, checked (:func:`_check`)."""
        try:
            # (a regular file: a FIFO in its place hung a resume)
            with open_regular(self.path) as handle, \
                    np.load(handle, allow_pickle=False) as archive:
                params = archive["params"].astype(np.float32, copy=True)
                state = parse_json(archive["state"].tobytes().decode())
                moments = {k.removeprefix("optimizer_"): archive[k].copy()
                           for k in archive.files if k.startswith("optimizer_")}
        except (OSError, ValueError, KeyError, zipfile.BadZipFile, UnicodeDecodeError) as exc:
            raise CheckpointError(f"checkpoint {self.path} is unreadable: {exc}") from None
        if not isinstance(state, dict) or state.get("format") != CHECKPOINT_FORMAT:
            raise CheckpointError(
                f"checkpoint {self.path} is not a format-{CHECKPOINT_FORMAT} "
                "fedsim server checkpoint"
            )
        if state.get("identity") != self.identity:
            raise CheckpointError(
                f"checkpoint {self.path} belongs to another run ({state.get('identity')}), not "
                f"{self.identity}; use a fresh --state directory"
            )
        try:
            snapshot = replace(_snapshot_from(params, state), optimizer_state=moments)
            _check(snapshot, self.identity.get("clients"))
            return snapshot
        except (AttributeError, IndexError, KeyError, TypeError, ValueError) as exc:
            raise CheckpointError(f"checkpoint {self.path} is malformed: {exc!r}") from None
