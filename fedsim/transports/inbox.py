"""The queue between a transport and its actor: delivered messages not yet taken by ``receive``.

A deque plus the futures of waiting receivers: lighter than :class:`asyncio.Queue` on the MQTT
server's ingest path, where every update passes through it.
"""

from __future__ import annotations

import asyncio
import collections

from fedsim.errors import TransportError
from fedsim.protocol.messages import Message


class Inbox:
    """Unbounded FIFO of decoded messages; closing it wakes every waiting ``get`` with an error."""

    def __init__(self, owner: str) -> None:
        self._owner = owner
        self._items: collections.deque[Message] = collections.deque()
        self._waiters: collections.deque[asyncio.Future[None]] = collections.deque()
        self._error: TransportError | None = None

    @property
    def closed(self) -> bool:
        return self._error is not None

    def __len__(self) -> int:
        return len(self._items)

    def put(self, message: Message) -> None:
        if self._error is None:
            self._items.append(message)
            self._wake_one()

    def _wake_one(self) -> None:
        while self._waiters:
            waiter = self._waiters.popleft()
            if not waiter.done():
                waiter.set_result(None)
                return

    def discard_all(self) -> int:
        """Drop everything not yet taken; returns how many messages were dropped."""
        discarded = len(self._items)
        self._items.clear()
        return discarded

    def close(self, error: TransportError | None = None) -> None:
        """Drop what is queued and refuse more; ``get`` raises ``error`` (default: closed)."""
        if self._error is None:
            self._items.clear()
            self._error = error or TransportError(f"{self._owner}: endpoint is closed")
            while self._waiters:
                waiter = self._waiters.popleft()
                if not waiter.done():
                    waiter.set_result(None)

    async def get(self) -> Message:
        while not self._items:
            if self._error is not None:
                raise self._error
            waiter = asyncio.get_running_loop().create_future()
            self._waiters.append(waiter)
            try:
                await waiter
            except asyncio.CancelledError:
                # Woken and cancelled at once: pass the wake-up on so no message waits unseen.
                if waiter.done() and not waiter.cancelled() and self._items:
                    self._wake_one()
                raise
        return self._items.popleft()
