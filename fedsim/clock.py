"""Time for actors. Actors never read the wall clock or call ``asyncio.sleep`` themselves.

The bottom of the layering (beside :mod:`fedsim.errors`): actors, transports and runtimes all
take time from a :class:`Clock`.

* :class:`WallClock` - real time.
* :class:`ScaledClock` - scenario time on the wall clock (the MQTT deployment).
* Virtual time (simulation) is provided by :mod:`fedsim.runtime.simulated.kernel`, whose event loop
  advances a virtual clock to the next scheduled timer whenever no task can run, so a run is a
  deterministic function of its seed.
"""

from __future__ import annotations

import asyncio
import math
import time
from typing import Protocol, runtime_checkable

from fedsim.errors import ConfigError

__all__ = ["Clock", "ScaledClock", "WallClock"]


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


class ScaledClock:
    """Scenario time on the wall clock: ``time_scale`` wall seconds per scenario second.

    ``start`` is the scenario time at construction (a restarted server continues its timeline
    from its checkpoint; the time it was down is not counted).
    """

    def __init__(self, time_scale: float = 1.0, *, start: float = 0.0) -> None:
        if not (math.isfinite(time_scale) and time_scale > 0):
            raise ConfigError(f"--time-scale must be a positive number, got {time_scale!r}")
        self.time_scale = float(time_scale)
        self._start = float(start)
        self._wall = WallClock()

    def now(self) -> float:
        return self._start + self._wall.now() / self.time_scale

    async def sleep(self, seconds: float) -> None:
        await self._wall.sleep(seconds * self.time_scale)

    def catch_up(self, time: float) -> None:
        """Move forward to scenario time ``time`` if it is later than now (never back): a
        deployed client meets the live server's timeline at its first global model (a
        resumed client's clock restarted at its ledger's last record, ten seconds behind the
        server's in a stranger's resumed launch)."""
        now = self.now()
        if math.isfinite(time) and time > now:
            self._start += time - now
