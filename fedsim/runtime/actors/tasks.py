"""Task lifetimes: helper tasks that live exactly as long as the work they accompany.

Every runtime starts helper tasks beside its main work (availability toggles, crash
schedules, status announcements, the server's receive loop) and must cancel them and wait for
them when the work ends, however it ends. :func:`helper_tasks` is that pattern, written once;
:func:`alongside` runs a coroutine with helpers; :func:`unless_stopped` lets a stop event
(SIGTERM) end work early.
"""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine, Iterable
from types import TracebackType
from typing import Any, TypeVar

__all__ = ["alongside", "helper_tasks", "unless_stopped"]

T = TypeVar("T")


class helper_tasks:  # noqa: N801 - used as a function: ``async with helper_tasks(...)``
    """Start ``helpers`` as tasks (tasks given are adopted as they are); on leaving the block,
    cancel every task in the yielded list (more may be appended inside the block) and wait
    for them all. If the block ended normally, the first task that had failed (other than by
    its cancellation) has its error raised: a bug in a helper is never swallowed.

    A slotted class, not a generator-based context manager: every simulated client holds one
    for its life, and the generator's frame and wrapper were 0.4 KB a client (issue 24 item 5).
    The same steps in the same order (nothing here awaits but the gather)."""

    __slots__ = ("_helpers", "_tasks")

    def __init__(self, helpers: Iterable[Coroutine[Any, Any, Any] | asyncio.Task[Any]] = ()) -> None:
        self._helpers: Iterable[Coroutine[Any, Any, Any] | asyncio.Task[Any]] | None = helpers
        self._tasks: list[asyncio.Task[Any]] = []

    async def __aenter__(self) -> list[asyncio.Task[Any]]:
        helpers, self._helpers = self._helpers, None  # (not kept for the block's life)
        assert helpers is not None, "helper_tasks is entered once"
        self._tasks = [h if isinstance(h, asyncio.Task) else asyncio.create_task(h)
                       for h in helpers]
        return self._tasks

    async def __aexit__(self, exc_type: type[BaseException] | None,
                        exc: BaseException | None, traceback: TracebackType | None) -> None:
        tasks = self._tasks
        for task in tasks:
            task.cancel()
        outcomes = await asyncio.gather(*tasks, return_exceptions=True)
        if exc_type is None:
            for outcome in outcomes:
                if isinstance(outcome, Exception):
                    raise outcome


async def alongside(
    main: Coroutine[Any, Any, T], helpers: Iterable[Coroutine[Any, Any, Any]]
) -> T:
    """Run ``main`` with ``helpers`` beside it; the helpers end when ``main`` does."""
    async with helper_tasks(helpers):
        return await main


async def unless_stopped(
    work: Coroutine[Any, Any, T], stop: asyncio.Event | None
) -> tuple[bool, T | None]:
    """``(True, result)`` once ``work`` is done, or ``(False, None)`` if ``stop`` is set first
    (``work`` is then cancelled). A failure of ``work`` is raised."""
    task = asyncio.ensure_future(work)
    if stop is None:
        return True, await task
    async with helper_tasks([stop.wait()]) as (stopper,):
        await asyncio.wait({task, stopper}, return_when=asyncio.FIRST_COMPLETED)
    if task.done():
        return True, task.result()
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)
    return False, None
