"""The simulation kernel: an asyncio event loop that runs in deterministic virtual time.

:class:`VirtualTimeLoop` is a real :class:`asyncio.BaseEventLoop` (tasks, futures, queues,
``call_later``, ``asyncio.sleep`` and ``asyncio.wait_for`` all work unchanged) whose ``time()``
is a virtual clock. Where a normal loop would block in ``select(timeout)`` waiting for I/O, its
selector instead *jumps* the clock to the earliest scheduled timer: time passes only when no task
can run. Training compute therefore happens synchronously inside a task and is then charged with
``await clock.sleep(duration)`` from the scenario's speed model.

Determinism: callbacks run FIFO and timers in (when, sequence) order, equal times first-set
first-run; with no real I/O and no threads, the same sequence of operations (the same seed)
gives the same interleaving. The timer heap holds ``(when, sequence, timer)`` tuples, which
compare in C (a timer's own ``__lt__`` is Python: at 10^3 clients the heap compared timers
about 30 times a round), and the loop's iteration (:meth:`VirtualTimeLoop._run_once`) jumps
the clock itself instead of asking a selector for a timeout. Real I/O (sockets, pipes, subprocesses, executors) is refused: its completion
time would come from the outside world. The loop is single-threaded; ``call_soon_threadsafe``
from another thread is not supported.

If every task is waiting on something that no timer will ever cause, the loop raises
:class:`VirtualDeadlock` instead of hanging.

**Tested Python versions.** asyncio has no public hook for a loop's clock, so the kernel
subclasses :class:`asyncio.BaseEventLoop` and uses its internals: the timer heap
``_scheduled`` with its cancelled-timer count, the ready queue ``_ready``, ``_stopping``,
``_check_closed()`` and one iteration ``_run_once`` (overridden: the base class's, with the
heap's entries as tuples and no selector; it has kept its shape since 3.4), and a handle's
``_cancelled``, ``_scheduled`` and ``_run()``. They have been stable since 3.4, but nothing
promises them; so the kernel runs only on the CPython versions it was tested on
(:data:`TESTED_PYTHONS`; ``requires-python`` in pyproject.toml has the same bound), and
importing it elsewhere raises an ImportError that names them. (The alternative, a loop that
re-implements ``BaseEventLoop``'s scheduling on public API only, would copy a few hundred lines
of asyncio and their bugs.) To add a version: run ``tests/runtime/test_kernel_rng.py`` and the
simulation tests on it, then widen both bounds.
"""

from __future__ import annotations

import asyncio
import contextvars
import heapq
import math
import sys
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any, TypeVar

from fedsim.errors import FedsimError
from fedsim.runtime.interrupted import cancelled_by_signal, main_task

T = TypeVar("T")

__all__ = ["TESTED_PYTHONS", "VirtualClock", "VirtualDeadlock", "VirtualTimeLoop", "check_python",
           "run_virtual"]

TESTED_PYTHONS: tuple[tuple[int, int], ...] = ((3, 11), (3, 12), (3, 13))
"""The CPython versions whose asyncio internals the kernel was tested against."""


def check_python(version: tuple[int, ...] | None = None) -> None:
    """Raise ImportError unless ``version`` (default: this interpreter's) is one of
    :data:`TESTED_PYTHONS`."""
    version = tuple(sys.version_info[:2]) if version is None else version
    if tuple(version[:2]) not in TESTED_PYTHONS:
        tested = ", ".join(f"{major}.{minor}" for major, minor in TESTED_PYTHONS)
        found = ".".join(str(v) for v in version[:2])
        raise ImportError(
            f"fedsim's virtual-time kernel uses asyncio internals (BaseEventLoop._scheduled, "
            f"TimerHandle._when, _check_closed) and is tested on Python {tested}; this is "
            f"Python {found}. Use one of those versions (pyproject.toml's requires-python).")


check_python()


class VirtualDeadlock(FedsimError):
    """No task can run and no timer is scheduled: the simulation can never make progress."""


# asyncio.base_events' thresholds: the heap is rebuilt without its cancelled timers when more
# than 100 are scheduled and more than half of them are cancelled.
_MIN_SCHEDULED_TIMER_HANDLES = 100
_MIN_CANCELLED_TIMER_HANDLES_FRACTION = 0.5


class VirtualTimeLoop(asyncio.BaseEventLoop):
    """An event loop whose ``time()`` is virtual and advances only when nothing is runnable."""

    _timer_cancelled_count: int  # BaseEventLoop's

    def __init__(self, start: float = 0.0) -> None:
        super().__init__()
        self._virtual_now = float(start)
        self._timer_sequence = 0
        # (when, sequence, timer) entries: ordered by the tuples' own (C) comparison; the
        # sequence is unique, so a timer itself is never compared.
        self._scheduled: list[tuple[float, int, asyncio.TimerHandle]] = []
        # Timers due before now + resolution are run; the clock lands exactly on a timer's
        # `when`, so any positive value works; 1 ns matches the monotonic clock's (and past
        # about 10^7 s, where now + 1 ns rounds to now, the next float up is used: _run_once).
        self._clock_resolution = 1e-9

    def time(self) -> float:
        return self._virtual_now

    def call_later(self, delay: float, callback: Callable[..., object], *args: Any,
                   context: contextvars.Context | None = None) -> asyncio.TimerHandle:
        if delay is None:
            raise TypeError("delay must not be None")
        return self.call_at(self._virtual_now + delay, callback, *args, context=context)

    def call_at(self, when: float, callback: Callable[..., object], *args: Any,
                context: contextvars.Context | None = None) -> asyncio.TimerHandle:
        if when is None:
            raise TypeError("when cannot be None")
        self._check_closed()
        self._timer_sequence += 1
        timer = asyncio.TimerHandle(when, callback, args, self, context)
        heapq.heappush(self._scheduled, (when, self._timer_sequence, timer))
        timer._scheduled = True
        return timer

    def _run_once(self) -> None:
        """One iteration: drop cancelled timers, jump the clock to the earliest timer when
        nothing is ready, move the due timers to the ready queue and run what was ready
        (``asyncio.BaseEventLoop._run_once`` with the selector's wait replaced by the jump)."""
        scheduled = self._drop_cancelled()
        ready = self._ready
        if not ready and not self._stopping:
            if not scheduled or scheduled[0][0] == math.inf:  # (a sleep(inf): never due)
                raise VirtualDeadlock(
                    f"virtual time {self._virtual_now:.6g}: every task is waiting and no timer "
                    "is scheduled, so nothing can ever happen"
                )
            # Jump exactly to the earliest timer (no float drift from now + (when - now)).
            self._virtual_now = max(self._virtual_now, scheduled[0][0])
        # Past about 10^7 s (2^23-2^24) now + 1 ns rounds to now: the next float up still
        # takes the timers due now (a run of 10^9 virtual s hung).
        end_time = max(self._virtual_now + self._clock_resolution,
                       math.nextafter(self._virtual_now, math.inf))
        while scheduled and scheduled[0][0] < end_time:
            timer = heapq.heappop(scheduled)[2]
            timer._scheduled = False
            ready.append(timer)
        # Run what is ready now, not what these callbacks make ready (the next iteration's).
        debug = self._debug
        for _ in range(len(ready)):
            handle = ready.popleft()
            if handle._cancelled:
                continue
            if debug:
                # (No slow-callback warning: virtual time does not pass inside a callback.)
                self._current_handle = handle
                try:
                    handle._run()
                finally:
                    self._current_handle = None
            else:
                handle._run()

    def _drop_cancelled(self) -> list[tuple[float, int, asyncio.TimerHandle]]:
        """Pop the cancelled timers at the heap's head, or rebuild the heap without any when
        more than half of over 100 are cancelled (as BaseEventLoop does); the heap."""
        scheduled = self._scheduled
        count = len(scheduled)
        if (count > _MIN_SCHEDULED_TIMER_HANDLES
                and self._timer_cancelled_count / count > _MIN_CANCELLED_TIMER_HANDLES_FRACTION):
            kept = []
            for entry in scheduled:
                if entry[2]._cancelled:
                    entry[2]._scheduled = False
                else:
                    kept.append(entry)
            heapq.heapify(kept)
            self._scheduled = scheduled = kept
            self._timer_cancelled_count = 0
        else:
            while scheduled and scheduled[0][2]._cancelled:
                self._timer_cancelled_count -= 1
                heapq.heappop(scheduled)[2]._scheduled = False
        return scheduled

    # -- hooks BaseEventLoop expects from a concrete loop -----------------------------------
    def _process_events(self, event_list: list[Any]) -> None:
        """No I/O events exist under virtual time."""

    def _write_to_self(self) -> None:
        """Nothing to wake: the loop never blocks."""

    def run_in_executor(self, executor: Any, func: Callable[..., T], *args: Any) -> asyncio.Future[T]:
        raise RuntimeError(
            "the virtual-time loop runs no threads; compute synchronously and charge the time "
            "with `await clock.sleep(duration)`"
        )


class VirtualClock:
    """The :class:`~fedsim.clock.Clock` of a :class:`VirtualTimeLoop`.

    ``now()`` is virtual seconds since the clock was made; ``sleep`` schedules a timer, so it
    costs no wall time.
    """

    def __init__(self, loop: VirtualTimeLoop) -> None:
        self._loop = loop
        self._origin = loop.time()

    def now(self) -> float:
        return self._loop._virtual_now - self._origin  # time(), read directly: ~12 a round

    async def sleep(self, seconds: float) -> None:
        if asyncio.get_running_loop() is not self._loop:
            raise RuntimeError("a VirtualClock can only be used inside its own loop")
        await asyncio.sleep(max(0.0, float(seconds)))


def run_virtual(main: Callable[[VirtualClock], Coroutine[Any, Any, T] | Awaitable[T]], *,
                start: float = 0.0) -> T:
    """Run ``main(clock)`` to completion on a fresh :class:`VirtualTimeLoop`.

    Tasks still pending when ``main`` returns are cancelled (as :func:`asyncio.run` does).
    """
    loop = VirtualTimeLoop(start)
    with asyncio.Runner(loop_factory=lambda: loop) as runner:
        clock = VirtualClock(loop)
        ran: list[asyncio.Task[Any]] = []
        try:
            return runner.run(_as_coroutine(main(clock), ran))
        except asyncio.CancelledError:
            # A SIGTERM where no Ctrl-C handler was (fedsim.runtime.interrupted.main_task).
            if ran and cancelled_by_signal(ran[0]):
                raise KeyboardInterrupt from None
            raise


async def _as_coroutine(awaitable: Awaitable[T], ran: list[asyncio.Task[Any]]) -> T:
    task = asyncio.current_task()
    assert task is not None
    ran.append(task)
    with main_task(task):
        return await awaitable
