"""An interrupted simulation still leaves a run directory that ``fedsim report`` reads.

Ctrl-C (SIGINT) stops the virtual-time loop through :class:`asyncio.Runner`'s own handler
(it cancels the run's main task, which cancels every actor); :func:`signals_interrupt`
makes SIGTERM do the same and remembers which signal came. Where SIGINT is ignored (a job
started with ``&`` by a shell without job control, or under ``nohup``, inherits that, and
:class:`asyncio.Runner` then installs no handler) SIGTERM still cancels the main task that
the loop registered with :func:`main_task`, instead of raising a KeyboardInterrupt at whatever
line is running. :func:`write_interrupted_outputs`
then writes ``clients.csv``, ``summary.json`` and ``timing.json`` from what the run had done:
every window closed so far (``metrics.jsonl`` is written as they close) and every release in
the ledgers (each written to them before its update was sent, and synced to the disk before
these files: :meth:`~fedsim.runtime.simulated.run_ledgers.RunLedgers.make_durable`). The
summary says
``"interrupted": {"signal": ..., "partial": true}`` and its stop reason names the signal.
"""

from __future__ import annotations

import asyncio
import signal
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, replace
from types import FrameType
from typing import Any

from fedsim.atomic import holds_for_a_block
from fedsim.clock import seconds_text
from fedsim.runtime.actors.stops import RunStop, RunStopKind
from fedsim.runtime.run_outputs import write_run_outputs

_received: list[str] = []
_main_tasks: list[asyncio.Task[Any]] = []
_cancelled: list[asyncio.Task[Any]] = []


@contextmanager
def main_task(task: asyncio.Task[Any] | None) -> Iterator[None]:
    """Within the block a SIGTERM under :func:`signals_interrupt` cancels ``task`` (a run's
    main task) when no :class:`asyncio.Runner` handler is there to do it; the loop's runner
    then turns the cancellation into a KeyboardInterrupt (:func:`cancelled_by_signal`)."""
    if task is None:
        yield
        return
    _main_tasks.append(task)
    try:
        yield
    finally:
        _main_tasks.remove(task)


def cancel_main_task() -> bool:
    """Cancel the innermost live :func:`main_task`, once: the run then stops as interrupted
    (its outputs written). False when there is none to cancel, or one was cancelled already."""
    live = [task for task in _main_tasks if not task.done()]
    if live and not _cancelled:
        _cancelled.append(live[-1])
        live[-1].cancel()
        return True
    return False


def note_signal(name: str) -> None:
    """Record that ``name`` interrupts the run (what :func:`interrupting_signal` answers and
    an interrupted run's summary says), for a handler of the caller's own."""
    _received.append(name)


@contextmanager
def signals_ignored() -> Iterator[None]:
    """Within the block (main thread) SIGINT and SIGTERM are ignored: a command that was
    interrupted once finishes its stop (a sweep's workers joined, its table written) however
    often it is signalled again; a second signal that raised inside a pool's shutdown left it
    waiting for ever (a review)."""
    previous = {s: signal.signal(s, signal.SIG_IGN) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for number, handler in previous.items():
            signal.signal(number, handler)


def cancelled_by_signal(task: asyncio.Task[Any] | None = None) -> bool:
    """Whether a signal cancelled ``task`` (any registered main task if None) through
    :func:`main_task`: its CancelledError is an interrupt, not a bug."""
    return bool(_cancelled) if task is None else task in _cancelled


@contextmanager
def signals_interrupt() -> Iterator[None]:
    """Within the block SIGTERM interrupts a run as Ctrl-C does (main thread only).

    A SIGTERM is handed to :class:`asyncio.Runner`'s Ctrl-C handler where there is one, else it
    cancels the innermost :func:`main_task`; a second one (or one with neither) raises
    KeyboardInterrupt at once, as a second Ctrl-C does."""

    def on_sigterm(signum: int, frame: FrameType | None) -> None:
        handler = signal.getsignal(signal.SIGINT)
        if holds_for_a_block(handler):
            # A held block is being entered (SIGINT held, SIGTERM not yet): hold this one as
            # a SIGTERM, so it comes back here when the block ends.
            handler(signal.SIGTERM, frame)
            return
        _received.append("SIGTERM")
        if callable(handler) and handler is not signal.default_int_handler:
            handler(signal.SIGINT, frame)  # asyncio.Runner's: cancels the main task
            return
        if not cancel_main_task():
            raise KeyboardInterrupt

    del _received[:], _cancelled[:]
    previous = signal.signal(signal.SIGTERM, on_sigterm)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


SIGNAL_EXIT = {"SIGINT": 130, "SIGTERM": 143}
"""A command's exit status after the signal that interrupted it (128 + its number)."""


def interrupting_signal() -> str:
    """The signal that interrupted the run: SIGTERM if one came through
    :func:`signals_interrupt`, else SIGINT (Ctrl-C)."""
    return _received[-1] if _received else "SIGINT"


@dataclass(frozen=True)
class _Version:
    version: int


def interrupted_reason(name: str, windows: int, time: float, time_kind: str) -> str:
    """The stop reason of a run that ``name`` interrupted after ``windows`` windows."""
    return f"it was interrupted by {name} after window {windows} ({time_kind} time {seconds_text(time)} s)"


def write_interrupted_outputs(sim: Any, wall_seconds: float) -> dict[str, Any]:
    """Write the outputs of a run interrupted by a signal and return the summary (``sim``: the
    in-process simulation, whose ``record`` gives :func:`write_run_outputs` what it writes)."""
    name = interrupting_signal()
    sim._note_stops()
    at = sim.metrics[-1]["time"] if sim.metrics else 0.0
    sim.stop_reason = RunStop(RunStopKind.SIGNAL,
                              interrupted_reason(name, len(sim.metrics), at, "virtual"))
    version = int(sim.metrics[-1]["version"]) if sim.metrics else 0
    record = sim.record(_Version(version), wall_seconds)
    return write_run_outputs(replace(record, interrupted=name))
