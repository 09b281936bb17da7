"""Helper task lifetimes (fedsim.runtime.actors.tasks): helpers end with their block, and a
helper's failure is raised when the block ends normally, never swallowed."""

from __future__ import annotations

import asyncio

import pytest

from fedsim.runtime.actors.tasks import alongside, helper_tasks, unless_stopped


def test_helpers_are_cancelled_and_awaited_when_the_block_ends() -> None:
    ended: list[str] = []

    async def forever(name: str) -> None:
        try:
            await asyncio.Event().wait()
        finally:
            ended.append(name)

    async def main() -> list[bool]:
        async with helper_tasks([forever("given")]) as tasks:
            tasks.append(asyncio.create_task(forever("appended")))
            await asyncio.sleep(0)
        return [t.cancelled() for t in tasks]

    assert asyncio.run(main()) == [True, True]
    assert sorted(ended) == ["appended", "given"]


def test_a_failed_helper_is_raised_when_the_block_ends_normally() -> None:
    async def fails() -> None:
        raise ValueError("bug in a helper")

    async def main() -> None:
        async with helper_tasks([fails()]):
            await asyncio.sleep(0)
            await asyncio.sleep(0)

    with pytest.raises(ValueError, match="bug in a helper"):
        asyncio.run(main())


def test_the_block_s_own_error_wins_over_a_helper_s() -> None:
    async def fails() -> None:
        raise ValueError("helper")

    async def main() -> None:
        async with helper_tasks([fails()]):
            await asyncio.sleep(0)
            raise KeyError("block")

    with pytest.raises(KeyError, match="block"):
        asyncio.run(main())


def test_tasks_start_when_the_block_is_entered() -> None:
    started: list[str] = []

    async def helper() -> None:
        started.append("helper")

    async def main() -> list[str]:
        context = helper_tasks([helper()])
        await asyncio.sleep(0)
        started.append("before")
        async with context as tasks:
            await asyncio.gather(*tasks)
        return started

    assert asyncio.run(main()) == ["before", "helper"]


def test_alongside_and_unless_stopped() -> None:
    async def main() -> tuple[int, tuple[bool, int | None], tuple[bool, int | None]]:
        stop = asyncio.Event()

        async def value() -> int:
            await asyncio.sleep(0)
            return 7

        async def never() -> int:
            await asyncio.Event().wait()
            return 0

        first = await alongside(value(), [never()])
        done = await unless_stopped(value(), stop)
        asyncio.get_running_loop().call_soon(stop.set)
        stopped = await unless_stopped(never(), stop)
        return first, done, stopped

    assert asyncio.run(main()) == (7, (True, 7), (False, None))
