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


class RoundTimes:
    """A runtime's round schedule for a RoundBatcher (fedsim.training.batched.RoundSchedule):
    the test says each round's end (``ends``, by round) and client (``owners``), and
    ``reach(client)`` when a model can next reach that client; ``asked`` records the clients
    each horizon question named."""

    def __init__(self, reach: Any = None) -> None:
        self.ends: dict[int, float | None] = {}
        self.owners: dict[int, str | None] = {}
        self.reach = reach if reach is not None else (lambda owner: float("inf"))
        self.asked: list[list[str | None]] = []

    def set(self, round_: Any, ends_at: float | None, owner: str | None = None) -> None:
        self.ends[id(round_)], self.owners[id(round_)] = ends_at, owner

    def ends_at(self, round_: Any) -> float | None:
        return self.ends.get(id(round_))

    def horizon(self, rounds: Any) -> list[float]:
        owners = [self.owners.get(id(r)) for r in rounds]
        self.asked.append(owners)
        return [float(self.reach(owner)) for owner in owners]
