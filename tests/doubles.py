"""Test doubles shared by the actor tests (import as ``from tests.doubles import ...``)."""

from __future__ import annotations

import asyncio
from typing import Any

from fedsim.clock import Clock


class FreeLedger:
    """A ledger that pays for every round and records nothing: for tests of an actor's timing
    and messages, where the accounting is tested elsewhere."""

    def can_spend(self, steps: Any) -> bool:
        return True

    def spend(self, steps: Any, *, time: float, round: int) -> None:
        pass

    def plan(self, future_rounds: Any) -> int:
        return len(future_rounds)


class RecordingEndpoint:
    """A server's endpoint: messages are put into ``inbox`` by the test, and every published
    message is kept with its clock time in ``published``."""

    def __init__(self, clock: Clock) -> None:
        self.clock = clock
        self.inbox: asyncio.Queue[Any] = asyncio.Queue()
        self.published: list[tuple[float, Any]] = []

    async def publish(self, message: Any) -> None:
        self.published.append((self.clock.now(), message))

    async def receive(self) -> Any:
        return await self.inbox.get()

    async def close(self) -> None:
        pass
