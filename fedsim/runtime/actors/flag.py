"""A light :class:`asyncio.Event` for state every client holds (issue 24 item 5).

``asyncio.Event`` keeps its waiters in a ``collections.deque``, 760 bytes even when empty; a
client actor holds three events (online, a model's arrival, a round's switch), 2.3 KB of a
message-only client's memory, with at most one waiter each. :class:`Flag` keeps the same
semantics (the same wake-up order, a set flag returns at once, clearing does not un-wake a
waiter already woken) with its waiters in a list created when the first one waits.
"""

from __future__ import annotations

import asyncio

__all__ = ["Flag"]


class Flag:
    """``asyncio.Event``'s ``is_set``/``set``/``clear``/``wait``, for few waiters."""

    __slots__ = ("_value", "_waiters")

    def __init__(self) -> None:
        self._value = False
        self._waiters: list[asyncio.Future[bool]] | None = None

    def __repr__(self) -> str:
        waiters = len(self._waiters) if self._waiters else 0
        return f"<Flag [{'set' if self._value else 'unset'}, waiters:{waiters}]>"

    def is_set(self) -> bool:
        return self._value

    def set(self) -> None:
        """Set the flag and wake every waiter, in the order they began waiting."""
        if not self._value:
            self._value = True
            for future in self._waiters or ():
                if not future.done():
                    future.set_result(True)

    def clear(self) -> None:
        self._value = False

    async def wait(self) -> bool:
        """Return once the flag is set (at once if it is)."""
        if self._value:
            return True
        future: asyncio.Future[bool] = asyncio.get_running_loop().create_future()
        waiters = self._waiters
        if waiters is None:
            waiters = self._waiters = []
        waiters.append(future)
        try:
            await future
            return True
        finally:
            waiters.remove(future)
            if not waiters and self._waiters is waiters:
                self._waiters = None
