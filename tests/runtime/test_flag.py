"""The client actor's light events and queues (issue 24 item 5) behave as the asyncio and
deque versions they replace: the same wake-ups in the same order, measured side by side."""

from __future__ import annotations

import asyncio
import sys

import pytest

from fedsim.errors import TransportError
from fedsim.protocol.messages import ClientStatus, Message
from fedsim.runtime.actors.flag import Flag
from fedsim.transports.inbox import Inbox


async def _script(event: asyncio.Event | Flag) -> list[str]:
    """Waiters, sets and clears interleaved; returns who woke, in order."""
    log: list[str] = []

    async def waiter(name: str) -> None:
        await event.wait()
        log.append(f"{name}:{event.is_set()}")

    tasks = [asyncio.create_task(waiter(f"w{i}")) for i in range(3)]
    await asyncio.sleep(0)
    event.set()
    event.clear()  # cleared before the woken ones run: they still return
    tasks.append(asyncio.create_task(waiter("late")))  # waits again after the clear
    await asyncio.sleep(0)
    await asyncio.sleep(0)
    log.append(f"set:{event.is_set()}")
    event.set()
    event.set()  # a second set changes nothing
    await asyncio.sleep(0)
    await asyncio.sleep(0)
    assert await event.wait() is True  # a set flag returns at once
    cancelled = asyncio.create_task(waiter("cancelled"))
    event.clear()
    await asyncio.sleep(0)
    cancelled.cancel()
    await asyncio.sleep(0)
    event.set()
    await asyncio.gather(*tasks)
    log.append(f"cancelled:{cancelled.cancelled()}")
    return log


async def test_flag_wakes_as_asyncio_event_does() -> None:
    expected = await _script(asyncio.Event())
    assert await _script(Flag()) == expected
    assert expected[:3] == ["w0:False", "w1:False", "w2:False"]


async def test_flag_holds_no_waiter_list_when_none_waits() -> None:
    flag = Flag()
    assert sys.getsizeof(flag) < sys.getsizeof(asyncio.Event())
    waiter = asyncio.create_task(flag.wait())
    await asyncio.sleep(0)
    assert "waiters:1" in repr(flag)
    flag.set()
    await waiter
    assert flag._waiters is None


def _status(i: int) -> ClientStatus:
    return ClientStatus("c", "training", i, 0.0, 1e-5, "", 0.0)


def _rounds(message: Message) -> int:
    assert isinstance(message, ClientStatus)
    return message.rounds


async def test_inbox_keeps_fifo_order_and_frees_its_queue() -> None:
    inbox = Inbox("test")
    assert len(inbox) == 0
    getters = [asyncio.create_task(inbox.get()) for _ in range(2)]
    await asyncio.sleep(0)
    for i in range(4):
        inbox.put(_status(i))
    got = [_rounds(await g) for g in getters]
    assert got == [0, 1]
    assert len(inbox) == 2
    assert [_rounds(await inbox.get()) for _ in range(2)] == [2, 3]
    assert inbox._items is None  # no empty deque held between messages
    inbox.put(_status(5))
    assert inbox.discard_all() == 1 and len(inbox) == 0
    pending = asyncio.create_task(inbox.get())
    await asyncio.sleep(0)
    inbox.close()
    with pytest.raises(TransportError):
        await pending
    inbox.put(_status(6))  # refused after close
    assert len(inbox) == 0
