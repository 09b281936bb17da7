"""fedsim.atomic.uninterrupted: Ctrl-C and SIGTERM wait for the end of the block, then the
handlers it replaced run, or their default action is taken (a privacy ledger's spend commits
on disk and in memory inside one such block: tests/privacy/test_ledger_interrupt.py)."""

from __future__ import annotations

import os
import signal
import threading
from types import FrameType

import pytest

from fedsim.atomic import uninterrupted


def test_a_signal_in_the_block_runs_its_handler_after_the_block() -> None:
    seen: list[tuple[str, int]] = []

    def handler(signum: int, _frame: FrameType | None) -> None:
        seen.append(("handler", signum))

    before = signal.signal(signal.SIGTERM, handler)
    try:
        with uninterrupted():
            os.kill(os.getpid(), signal.SIGTERM)
            os.kill(os.getpid(), signal.SIGINT)
            seen.append(("block", 0))
            # Python runs handlers between bytecodes: give them every chance to run here.
            for _ in range(1000):
                pass
            seen.append(("block end", 0))
        assert seen == [("block", 0), ("block end", 0)]
    except KeyboardInterrupt:  # SIGINT's handler (Python's default) raised after the block
        assert seen == [("block", 0), ("block end", 0), ("handler", int(signal.SIGTERM))]
    else:
        pytest.fail("the deferred SIGINT was never delivered")
    finally:
        signal.signal(signal.SIGTERM, before)


def test_the_handlers_are_put_back_as_they_were() -> None:
    def mine(_signum: int, _frame: FrameType | None) -> None:
        raise AssertionError("not delivered here")

    before = (signal.getsignal(signal.SIGINT), signal.signal(signal.SIGTERM, mine))
    try:
        with uninterrupted():
            assert signal.getsignal(signal.SIGINT) is not before[0]
            assert signal.getsignal(signal.SIGTERM) is not mine
        assert signal.getsignal(signal.SIGINT) is before[0]
        assert signal.getsignal(signal.SIGTERM) is mine
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        with uninterrupted():
            os.kill(os.getpid(), signal.SIGTERM)  # ignored before: ignored after
        assert signal.getsignal(signal.SIGTERM) == signal.SIG_IGN
    finally:
        signal.signal(signal.SIGTERM, before[1])


def test_a_block_that_raises_still_puts_the_handlers_back_and_delivers() -> None:
    before = signal.getsignal(signal.SIGINT)
    with pytest.raises(KeyboardInterrupt):
        with uninterrupted():
            os.kill(os.getpid(), signal.SIGINT)
            raise ValueError("the write failed")
    assert signal.getsignal(signal.SIGINT) is before


def test_outside_the_main_thread_nothing_is_swapped() -> None:
    seen: list[object] = []

    def worker() -> None:
        with uninterrupted():
            seen.append(signal.getsignal(signal.SIGINT))

    before = signal.getsignal(signal.SIGINT)
    thread = threading.Thread(target=worker)
    thread.start()
    thread.join()
    assert seen == [before]
