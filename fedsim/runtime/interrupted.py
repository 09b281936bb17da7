"""An interrupted simulation still leaves a run directory that ``fedsim report`` reads.

Ctrl-C (SIGINT) stops the virtual-time loop through :class:`asyncio.Runner`'s own handler
(it cancels the run's main task, which cancels every actor); :func:`signals_interrupt`
makes SIGTERM do the same and remembers which signal came. :func:`write_interrupted_outputs`
then writes ``clients.csv``, ``summary.json`` and ``timing.json`` from what the run had done:
every window closed so far (``metrics.jsonl`` is written as they close) and every release in
the ledgers (each is on disk before its update was sent). The summary says
``"interrupted": {"signal": ..., "partial": true}`` and its stop reason names the signal.
"""

from __future__ import annotations

import signal
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, replace
from types import FrameType
from typing import Any

from fedsim.runtime.actors.stops import RunStop, RunStopKind
from fedsim.runtime.run_outputs import write_run_outputs

_received: list[str] = []


@contextmanager
def signals_interrupt() -> Iterator[None]:
    """Within the block SIGTERM interrupts a run as Ctrl-C does (main thread only)."""

    def on_sigterm(signum: int, frame: FrameType | None) -> None:
        _received.append("SIGTERM")
        handler = signal.getsignal(signal.SIGINT)
        if callable(handler):
            handler(signal.SIGINT, frame)  # asyncio.Runner's: cancels the main task
        else:
            raise KeyboardInterrupt

    del _received[:]
    previous = signal.signal(signal.SIGTERM, on_sigterm)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def interrupting_signal() -> str:
    """The signal that interrupted the run: SIGTERM if one came through
    :func:`signals_interrupt`, else SIGINT (Ctrl-C)."""
    return _received[-1] if _received else "SIGINT"


@dataclass(frozen=True)
class _Version:
    version: int


def interrupted_reason(name: str, windows: int, time: float, time_kind: str) -> str:
    """The stop reason of a run that ``name`` interrupted after ``windows`` windows."""
    return f"it was interrupted by {name} after window {windows} ({time_kind} time {time:.6g} s)"


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
