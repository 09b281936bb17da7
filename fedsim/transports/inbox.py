"""The queue between a transport and its actor: delivered messages not yet taken by ``receive``.

A deque plus the futures of waiting receivers: lighter than :class:`asyncio.Queue` on the MQTT
server's ingest path, where every update passes through it. The deque exists only while
messages wait and the waiters' list only while a receiver waits: every simulated client has an
inbox, mostly empty, and an empty deque is 760 bytes (issue 24 item 5).
"""

from __future__ import annotations

import asyncio
import collections

from fedsim.errors import TransportError
from fedsim.protocol.messages import Message


class Inbox:
    """Unbounded FIFO of decoded messages; closing it wakes every waiting ``get`` with an error."""

    __slots__ = ("_error", "_items", "_owner", "_waiters")

    def __init__(self, owner: str) -> None:
        self._owner = owner
        self._items: collections.deque[Message] | None = None
        self._waiters: list[asyncio.Future[None]] | None = None  # in the order they came
        self._error: TransportError | None = None

    @property
    def closed(self) -> bool:
        return self._error is not None

    def __len__(self) -> int:
        return len(self._items) if self._items is not None else 0

    def put(self, message: Message) -> None:
        if self._error is None:
            if self._items is None:
                self._items = collections.deque()
            self._items.append(message)
            self._wake_one()

    def _wake_one(self) -> None:
        while self._waiters:
            waiter = self._waiters.pop(0)
            if not waiter.done():
                waiter.set_result(None)
                return

    def discard_all(self) -> int:
        """Drop everything not yet taken; returns how many messages were dropped."""
        discarded = len(self)
        self._items = None
        return discarded

    def close(self, error: TransportError | None = None) -> None:
        """Drop what is queued and refuse more; ``get`` raises ``error`` (default: closed)."""
        if self._error is None:
            self._items = None
            self._error = error or TransportError(f"{self._owner}: endpoint is closed")
            while self._waiters:
                waiter = self._waiters.pop(0)
                if not waiter.done():
                    waiter.set_result(None)

    async def get(self) -> Message:
        while not self._items:
            if self._error is not None:
                raise self._error
            waiter = asyncio.get_running_loop().create_future()
            if self._waiters is None:
                self._waiters = []
            self._waiters.append(waiter)
            try:
                await waiter
            except asyncio.CancelledError:
                # Woken and cancelled at once: pass the wake-up on so no message waits unseen.
                if waiter.done() and not waiter.cancelled() and self._items:
                    self._wake_one()
                raise
        message = self._items.popleft()
        if not self._items:
            self._items = None
        return message
