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


@pytest.mark.parametrize("sigint", [signal.SIG_IGN, signal.default_int_handler],
                         ids=["nohup", "terminal"])
def test_a_sigterm_while_a_held_block_is_entered_still_ends_the_run(
        sigint: object, monkeypatch: pytest.MonkeyPatch) -> None:
    """``uninterrupted`` holds SIGINT, then SIGTERM: a SIGTERM between the two swaps finds
    SIGINT held. It must be held as a SIGTERM (and handled when the block ends), not forwarded
    as a held SIGINT, which the end of the block drops where SIGINT is ignored (CI lost a
    ``nohup`` run's SIGTERM that way once in many runs)."""
    from fedsim import atomic

    swap = atomic._raw_signal
    fired: list[bool] = []

    def swap_then_signal(signum: int, handler: object) -> object:
        replaced = swap(signum, handler)
        # Between the SIGINT swap and the SIGTERM swap of the block's entry, once.
        if signum == signal.SIGINT and callable(handler) and not fired:
            fired.append(True)
            signal.raise_signal(signal.SIGTERM)  # its Python handler runs before this returns
        return replaced

    held: list[str] = []

    async def main(clock: VirtualClock) -> None:
        await clock.sleep(1.0)
        monkeypatch.setattr(atomic, "_raw_signal", swap_then_signal)
        with atomic.uninterrupted():
            held.append("inside the block")
        monkeypatch.setattr(atomic, "_raw_signal", swap)
        await clock.sleep(10**5)  # the SIGTERM, handled at the block's end, cancels this
        held.append("slept through")

    previous = signal.signal(signal.SIGINT, sigint)
    try:
        with signals_interrupt(), pytest.raises(KeyboardInterrupt):
            run_virtual(main)
    finally:
        signal.signal(signal.SIGINT, previous)
    assert fired and held == ["inside the block"]
    assert interrupting_signal() == "SIGTERM"


@pytest.mark.parametrize("gap", [0, 1, 2, 3], ids=["enter-before", "enter-between",
                                                    "exit-between", "exit-after"])
@pytest.mark.parametrize("sigint", [signal.SIG_IGN, signal.default_int_handler],
                         ids=["nohup", "terminal"])
def test_a_sigterm_and_a_sigint_at_any_swap_of_a_held_block_lose_nothing(
        gap: int, sigint: object, monkeypatch: pytest.MonkeyPatch) -> None:
    """A held block swaps SIGINT's and SIGTERM's handlers in and out (four swaps); a SIGINT
    comes right after swap ``gap`` and a SIGTERM inside the block. No signal is lost, no
    KeyboardInterrupt escapes the block's end with a handler still held (the Ctrl-C between
    the exit's two swaps once left SIGTERM held by the finished block, and every later
    SIGTERM was lost), and afterwards both handlers are what they were."""
    from fedsim import atomic

    swap = atomic._raw_signal
    swaps: list[int] = []

    def swap_then_sigint(signum: int, handler: object) -> object:
        replaced = swap(signum, handler)
        swaps.append(signum)
        if len(swaps) - 1 == gap:
            signal.raise_signal(signal.SIGINT)
        return replaced

    previous = signal.signal(signal.SIGINT, sigint)
    try:
        with signals_interrupt():
            on_sigterm = signal.getsignal(signal.SIGTERM)
            interrupted = False
            try:
                monkeypatch.setattr(atomic, "_raw_signal", swap_then_sigint)
                with atomic.uninterrupted():
                    signal.raise_signal(signal.SIGTERM)  # held until the block ends
            except KeyboardInterrupt:
                interrupted = True
            finally:
                monkeypatch.setattr(atomic, "_raw_signal", swap)
            assert len(swaps) == 4
            # Both signals came and neither is ignored under signals_interrupt: the run stops,
            # whichever of them the block let through first.
            assert interrupted
            assert signal.getsignal(signal.SIGTERM) is on_sigterm
            assert signal.getsignal(signal.SIGINT) is sigint
            if sigint is signal.SIG_IGN:  # the SIGINT is ignored: the SIGTERM stopped the run
                assert interrupting_signal() == "SIGTERM"
            with pytest.raises(KeyboardInterrupt):  # and a later SIGTERM still interrupts
                signal.raise_signal(signal.SIGTERM)
    finally:
        signal.signal(signal.SIGINT, previous)
