"""SIGTERM ends a run through a cancellation every task sees, whatever SIGINT's disposition."""

from __future__ import annotations

import asyncio
import os
import signal

import pytest

from fedsim.runtime.interrupted import interrupting_signal, signals_interrupt
from fedsim.runtime.simulated.kernel import VirtualClock, run_virtual


def test_sigterm_cancels_the_main_task_where_sigint_is_ignored() -> None:
    """Under ``nohup`` (or ``&`` without job control) SIGINT is ignored, so asyncio.Runner
    installs no Ctrl-C handler; SIGTERM must still end the run through a cancellation that
    every task sees (their ``finally`` blocks run), not a KeyboardInterrupt raised mid-line."""
    cleaned: list[str] = []

    async def main(clock: VirtualClock) -> None:
        async def worker() -> None:
            try:
                await clock.sleep(10**9)
            finally:
                cleaned.append("worker")

        task = asyncio.create_task(worker())
        try:
            await clock.sleep(1.0)
            os.kill(os.getpid(), signal.SIGTERM)
            await clock.sleep(10**9)  # never reached: the signal cancelled this task
        except BaseException as exc:
            cleaned.append(type(exc).__name__)
            raise
        finally:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
            cleaned.append("main")

    previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        with signals_interrupt(), pytest.raises(KeyboardInterrupt):
            run_virtual(main)
    finally:
        signal.signal(signal.SIGINT, previous)
    assert cleaned == ["CancelledError", "worker", "main"]
    assert interrupting_signal() == "SIGTERM"
