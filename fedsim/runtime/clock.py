"""Time for actors. Actors never read the wall clock or call ``asyncio.sleep`` themselves.

* :class:`WallClock` - real time (MQTT deployment).
* Virtual time (simulation) is provided by :mod:`fedsim.runtime.kernel`, whose event loop
  advances a virtual clock to the next scheduled timer whenever no task can run, so a run is a
  deterministic function of its seed.
"""

from __future__ import annotations

import asyncio
import time
from typing import Protocol, runtime_checkable


@runtime_checkable
class Clock(Protocol):
    """What actors know about time."""

    def now(self) -> float:
        """Seconds since the run started (virtual or wall)."""
        ...

    async def sleep(self, seconds: float) -> None:
        """Let ``seconds`` pass (e.g. the virtual cost of a training step)."""
        ...


class WallClock:
    """Real time, measured from construction with a monotonic clock."""

    def __init__(self) -> None:
        self._start = time.monotonic()

    def now(self) -> float:
        return time.monotonic() - self._start

    async def sleep(self, seconds: float) -> None:
        await asyncio.sleep(max(0.0, seconds))
