"""Append handles of many ledger files, at most a bounded number open at once.

A simulation of 10^5 clients keeps 10^5 ledgers, more than a process may hold open files
(``ulimit -n``, often 1024-20000). :class:`AppendHandles` opens a ledger's file on its first
write and keeps the most recently written ``limit`` of them open, closing the least recently
used one when another is needed. Durability is unchanged: every write is flushed and fsynced
through whichever handle it went (see :mod:`fedsim.privacy.ledger`); a closed handle is
reopened in append mode, so writes always land at the end of the file.
"""

from __future__ import annotations

import os
from collections import OrderedDict
from pathlib import Path
from typing import BinaryIO

__all__ = ["AppendHandles", "LEDGER_HANDLES"]


class AppendHandles:
    """At most ``limit`` open append handles, keyed by their owner (least recently used closed)."""

    def __init__(self, limit: int) -> None:
        if limit < 1:
            raise ValueError(f"limit must be >= 1, got {limit}")
        self.limit = limit
        self._open: OrderedDict[int, BinaryIO] = OrderedDict()
        self.opened = 0
        """Files opened so far (a reopen after an eviction counts again)."""

    def write_durably(self, owner: int, path: Path, payload: bytes) -> None:
        """Append ``payload`` to ``path`` (one write), flush and fsync before returning."""
        handle = self._open.get(owner)
        if handle is None:
            while len(self._open) >= self.limit:
                _, oldest = self._open.popitem(last=False)
                oldest.close()
            handle = self._open[owner] = open(path, "ab")  # noqa: SIM115 - kept open, closed by release
            self.opened += 1
        else:
            self._open.move_to_end(owner)
        handle.write(payload)
        handle.flush()
        os.fsync(handle.fileno())

    def release(self, owner: int) -> None:
        """Close ``owner``'s handle if it is open."""
        handle = self._open.pop(owner, None)
        if handle is not None:
            handle.close()

    @property
    def open_count(self) -> int:
        return len(self._open)


LEDGER_HANDLES = AppendHandles(int(os.environ.get("FEDSIM_LEDGER_HANDLES", "512")))
"""The process's ledger file handles (``FEDSIM_LEDGER_HANDLES`` open at most, default 512)."""
