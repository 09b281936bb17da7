"""The queue between a transport and its actor: delivered messages not yet taken by ``receive``."""

from __future__ import annotations

import asyncio

from fedsim.errors import TransportError
from fedsim.protocol.messages import Message

_CLOSED = object()


class Inbox:
    """Unbounded FIFO of decoded messages; closing it wakes every waiting ``get`` with an error."""

    def __init__(self, owner: str) -> None:
        self._owner = owner
        self._queue: asyncio.Queue[object] = asyncio.Queue()
        self._error: TransportError | None = None

    @property
    def closed(self) -> bool:
        return self._error is not None

    def put(self, message: Message) -> None:
        if self._error is None:
            self._queue.put_nowait(message)

    def discard_all(self) -> int:
        """Drop everything not yet taken; returns how many messages were dropped."""
        discarded = 0
        while not self._queue.empty():
            if self._queue.get_nowait() is _CLOSED:
                self._queue.put_nowait(_CLOSED)
                break
            discarded += 1
        return discarded

    def close(self, error: TransportError | None = None) -> None:
        """Drop what is queued and refuse more; ``get`` raises ``error`` (default: closed)."""
        if self._error is None:
            self.discard_all()
            self._error = error or TransportError(f"{self._owner}: endpoint is closed")
            self._queue.put_nowait(_CLOSED)

    async def get(self) -> Message:
        if self._error is not None and self._queue.empty():
            raise self._error
        item = await self._queue.get()
        if item is _CLOSED:
            self._queue.put_nowait(_CLOSED)  # wake the next waiter too
            raise self._error or TransportError(f"{self._owner}: endpoint is closed")
        return item  # type: ignore[return-value]
