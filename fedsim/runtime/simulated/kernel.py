"""The simulation kernel: an asyncio event loop that runs in deterministic virtual time.

:class:`VirtualTimeLoop` is a real :class:`asyncio.BaseEventLoop` (tasks, futures, queues,
``call_later``, ``asyncio.sleep`` and ``asyncio.wait_for`` all work unchanged) whose ``time()``
is a virtual clock. Where a normal loop would block in ``select(timeout)`` waiting for I/O, its
selector instead *jumps* the clock to the earliest scheduled timer: time passes only when no task
can run. Training compute therefore happens synchronously inside a task and is then charged with
``await clock.sleep(duration)`` from the scenario's speed model.

Determinism: callbacks run FIFO and timers in (when, sequence) order, equal times first-set
first-run;
with no real I/O and no threads, the same sequence of operations (the same seed) gives the same
interleaving. Real I/O (sockets, pipes, subprocesses, executors) is refused: its completion
time would come from the outside world. The loop is single-threaded; ``call_soon_threadsafe``
from another thread is not supported.

If every task is waiting on something that no timer will ever cause, the loop raises
:class:`VirtualDeadlock` instead of hanging.

**Tested Python versions.** asyncio has no public hook for a loop's clock, so the kernel
subclasses :class:`asyncio.BaseEventLoop` and uses three of its internals: the timer heap
``_scheduled``, a timer's ``_when`` and ``_check_closed()``. They have been stable since 3.4,
but nothing promises them; so the kernel runs only on the CPython versions it was tested on
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
import selectors
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


class _VirtualSelector(selectors.BaseSelector):
    """A selector with nothing to select: ``select(timeout)`` advances virtual time instead."""

    def __init__(self, loop: VirtualTimeLoop) -> None:
        self._loop = loop

    def register(self, fileobj: Any, events: int, data: Any = None) -> selectors.SelectorKey:
        raise RuntimeError("the virtual-time loop does no real I/O")

    def unregister(self, fileobj: Any) -> selectors.SelectorKey:
        raise KeyError(fileobj)

    def select(self, timeout: float | None = None) -> list[tuple[selectors.SelectorKey, int]]:
        self._loop._advance(timeout)
        return []

    def get_map(self) -> dict[Any, selectors.SelectorKey]:
        return {}

    def close(self) -> None:
        """Nothing to release."""


class _SequencedTimer(asyncio.TimerHandle):
    """A timer ordered by (when, sequence): equal times fire in the order they were set."""

    __slots__ = ("_sequence",)

    def __init__(self, sequence: int, *args: Any) -> None:
        super().__init__(*args)
        self._sequence = sequence

    def __lt__(self, other: object) -> bool:
        # (when, sequence) < (other's), without building two tuples: the timer heap compares
        # timers about 30 times a round (docs/SCALE.md).
        if isinstance(other, _SequencedTimer):
            when, other_when = self._when, other._when
            return when < other_when or (when == other_when and self._sequence < other._sequence)
        return NotImplemented

    def __hash__(self) -> int:
        return hash((self._when, self._sequence))


class VirtualTimeLoop(asyncio.BaseEventLoop):
    """An event loop whose ``time()`` is virtual and advances only when nothing is runnable."""

    def __init__(self, start: float = 0.0) -> None:
        super().__init__()
        self._virtual_now = float(start)
        self._timer_sequence = 0
        self._selector = _VirtualSelector(self)
        # Timers due before now + resolution are run; _advance lands exactly on a timer's
        # `when`, so any positive value works; 1 ns matches the monotonic clock's.
        self._clock_resolution = 1e-9

    def time(self) -> float:
        return self._virtual_now

    def call_at(self, when: float, callback: Callable[..., object], *args: Any,
                context: contextvars.Context | None = None) -> asyncio.TimerHandle:
        if when is None:
            raise TypeError("when cannot be None")
        self._check_closed()
        self._timer_sequence += 1
        timer = _SequencedTimer(self._timer_sequence, when, callback, args, self, context)
        heapq.heappush(self._scheduled, timer)
        timer._scheduled = True
        return timer

    def _advance(self, timeout: float | None) -> None:
        if timeout == 0:
            return
        if self._scheduled:
            # Jump exactly to the earliest timer (no float drift from now + (when - now)).
            self._virtual_now = max(self._virtual_now, self._scheduled[0]._when)
            return
        if timeout is None:
            raise VirtualDeadlock(
                f"virtual time {self._virtual_now:.6g}: every task is waiting and no timer is "
                "scheduled, so nothing can ever happen"
            )
        self._virtual_now += timeout

    # -- hooks BaseEventLoop expects from a concrete loop -----------------------------------
    def _process_events(self, event_list: list[Any]) -> None:
        """No I/O events exist under virtual time."""

    def _write_to_self(self) -> None:
        """Nothing to wake: select never blocks."""

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
        return self._loop.time() - self._origin

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
