"""Time for actors. Actors never read the wall clock or call ``asyncio.sleep`` themselves.

The bottom of the layering (beside :mod:`fedsim.errors`): actors, transports and runtimes all
take time from a :class:`Clock`.

* :class:`WallClock` - real time.
* :class:`ScaledClock` - scenario time on the wall clock (the MQTT deployment).
* Virtual time (simulation) is provided by :mod:`fedsim.runtime.simulated.kernel`, whose event loop
  advances a virtual clock to the next scheduled timer whenever no task can run, so a run is a
  deterministic function of its seed.

And how a time is written for people: :func:`seconds_text`, the one rule of every output.
"""

from __future__ import annotations

import asyncio
import math
import time
from typing import Protocol, runtime_checkable

from fedsim.errors import ConfigError

__all__ = ["Clock", "ScaledClock", "WallClock", "seconds_text"]


def seconds_text(seconds: float) -> str:
    """A time in seconds as every output writes it (the unit is the caller's): two decimals,
    whatever its size, so times side by side read alike (``85.28`` beside ``262.89``, where
    significant digits gave ``85.2838`` beside ``262.888``; a window end of 0.25 s exact).
    For the times a run measured: a scenario's own settings (``stop.virtual_seconds: 30``)
    are echoed as written."""
    return f"{seconds:.2f}"


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
