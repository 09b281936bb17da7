"""The round a client computes now, on its clock: where a w-hat splits it, and, on a wall clock,
when its compute runs and when it is released (:class:`~fedsim.runtime.actors.client.ClientActor`).

Under virtual time a round's compute time passes and its result is taken at the end, when
every split is known; nothing here runs but :meth:`RoundTiming.split`. On a wall clock
(``pad_release``: deployed) the round is released at its public slot's end
(:func:`~fedsim.runtime.actors.exposure.release_time`), so the release time does not depend
on the realised batch unless the compute overruns the slot (counted):

* under ``interrupt: switch``, a round that keeps its clipped sums is computed *paced*
  (:mod:`fedsim.training.kept_sums`) in ``P`` parts, part ``k`` holding the records due in
  ``[k/P, (k+1)/P)`` of the round (eighths of a local step, fewer where the slot gives a part
  less than :data:`~fedsim.runtime.actors.exposure.MIN_PART_WALL_SECONDS`), each computed at
  its start ``k/P * (1 - PACE_MARGIN)`` of the slot at the models held then: the schedule
  runs a quarter ahead of the records' due times, so that the last part has a third of the
  slot, and a part behind its start has slack to catch up. A w-hat takes effect from the
  first part that starts after its arrival, so it never reaches a record already computed:
  nothing is computed again, and the server's models cannot lengthen the compute. A round of
  one part is computed at once when it begins, and a w-hat arriving in it is the next
  round's;
* otherwise the round is computed at once when it begins. Under ``switch`` a w-hat then has
  it computed again whole, and the release moves to the first point of the schedule a whole
  slot after the arrival (a public time: however long the realised batch's recompute takes
  within that slot, nothing else shows it).

The compute runs in a worker thread when deployed: a blocked event loop would delay the
connection's own packets (PUBACKs, pings, resends) to the compute's end, revealing the
realised batch. A split arriving while the thread reads the round is applied when it returns.
"""

from __future__ import annotations

import asyncio
import functools
import math
from collections.abc import Callable
from typing import TYPE_CHECKING, Protocol, TypeVar

import numpy as np

from fedsim.clock import Clock
from fedsim.runtime.actors.exposure import release_time
from fedsim.runtime.actors.flag import Flag

if TYPE_CHECKING:  # the actors never import torch themselves
    from fedsim.training.rounds import RoundResult

__all__ = ["PACE_MARGIN", "BegunRound", "RoundTiming"]

PACE_MARGIN = 0.25
"""How far ahead of its records' due times a paced round's schedule runs: part ``k`` of ``P``
starts at ``k/P * (1 - PACE_MARGIN)`` of the slot."""

_T = TypeVar("_T")


class BegunRound(Protocol):
    """A begun round as the actor holds it (:class:`fedsim.training.rounds.PendingRound`, or
    :class:`~fedsim.training.rounds.DoneRound` when nothing is left to compute)."""

    @property
    def sample_grads(self) -> int: ...

    def result(self) -> RoundResult: ...

    def switch(self, fraction: float, params: np.ndarray) -> None: ...

    def keep_sums(self) -> int: ...

    def advance(self, upto: float) -> None: ...

    def cancel(self) -> None: ...


class RoundTiming:
    """One round in progress: its begun round, start time and compute time (``slot``), and
    what splits and a padded release did to it."""

    __slots__ = ("_computing", "_deferred", "_switched", "computed", "moved", "overran",
                 "pending", "points", "released", "slot", "split_at", "start")

    def __init__(self, pending: BegunRound, start: float, slot: float) -> None:
        self.pending, self.start, self.slot = pending, start, slot
        self.split_at: float | None = None
        """When a w-hat last split the round (public: its arrival)."""
        self.points = 0
        """A paced round's points: a w-hat takes effect from the first ``k / points`` after
        its arrival (0: from the arrival itself)."""
        self.moved = False
        """A split moved the padded release a whole slot on."""
        self.overran = False
        """The padded release came after the slot's end."""
        self.computed = math.nan
        """When the padded round's compute ended (for an overrun's log line)."""
        self.released = math.nan
        """When the padded round was released."""
        self._switched: Flag | None = None
        self._computing = False
        self._deferred: list[tuple[float, np.ndarray]] = []

    @property
    def end(self) -> float:
        """When the round's compute time ends."""
        return self.start + self.slot

    def split(self, now: float, params: np.ndarray) -> bool:
        """The interrupt rule ``switch``: the records due from now on (a paced round: from
        its first point after now) are computed at ``params``. False when nothing of the round
        is left after that point (the model is the next round's)."""
        fraction = (now - self.start) / self.slot if self.slot > 0 else 1.0
        if self.points:  # from the first part starting after now, by the very times the
            # parts wait for (_part_start), so that float rounding never reaches a part begun
            first = 0
            while first < self.points and self._part_start(first) <= now:
                first += 1
            fraction = first / self.points
        if fraction >= 1.0:
            return False
        self.split_at = now
        if self._computing:  # a worker thread reads the round: split it when that returns
            self._deferred.append((fraction, params))
        else:
            self.pending.switch(fraction, params)
        if self._switched is not None:
            self._switched.set()
        return True

    async def padded(self, clock: Clock, *, switch: bool, in_thread: bool,
                     min_part_seconds: float = 0.0) -> RoundResult:
        """The round's result, released at the public schedule ``start + k * slot`` (see the
        module docstring); :attr:`moved` and :attr:`overran` say what happened to it.
        ``min_part_seconds``: the least clock time a part of a paced round is given."""
        kept = self.pending.keep_sums() if switch else 0
        if kept and min_part_seconds > 0:  # public: the slot and a constant
            room = self.slot * (1.0 - PACE_MARGIN) / min_part_seconds
            kept = max(1, min(kept, math.floor(room) if math.isfinite(room) else kept))
        self.points = kept
        if self.points:
            return await self._paced(clock, in_thread)
        self._switched = Flag()
        target = self.end  # the release time when nothing overruns
        while True:
            self._switched.clear()
            result = await self._in_worker(in_thread, self.pending.result)
            if self._deferred:  # split while it was computed: that result is stale
                self._apply_deferred()
                continue
            now = clock.now()
            if self.split_at is not None:
                target = max(target, release_time(self.start, self.slot,
                                                  self.split_at + self.slot))
                self.moved = True
            release = release_time(self.start, self.slot, max(now, target))
            if await self._sleep_unless_switched(clock, release - now):
                break
        self._released(now, release, target)
        return result

    async def _paced(self, clock: Clock, in_thread: bool) -> RoundResult:
        """The round computed part by part as its slot passes (:mod:`fedsim.training.
        kept_sums`), each part at its point for the records due before the next."""
        for point in range(self.points):
            while (wait := self._part_start(point) - clock.now()) > 0:  # never a hair early
                await clock.sleep(wait)
            upto = (point + 1) / self.points
            await self._in_worker(in_thread, functools.partial(self.pending.advance, upto))
            self._apply_deferred()  # each from a point not computed yet
        result = await self._in_worker(in_thread, self.pending.result)  # noise and sums
        self._apply_deferred()  # from the round's end: nothing of it
        now = clock.now()
        release = release_time(self.start, self.slot, max(now, self.end))
        await clock.sleep(release - now)
        self._released(now, release, self.end)
        return result

    def _released(self, computed: float, release: float, target: float) -> None:
        """Record a padded release at ``release`` of a compute ended at ``computed``."""
        self.computed, self.released = computed, release
        self.overran = release > target or self.slot <= 0

    def _part_start(self, part: int) -> float:
        """When part ``part`` of a paced round starts (a public time)."""
        return self.start + self.slot * (1.0 - PACE_MARGIN) * part / self.points

    def _apply_deferred(self) -> None:
        """The splits that arrived while a worker thread read the round, in their order."""
        for fraction, params in self._deferred:
            self.pending.switch(fraction, params)
        self._deferred.clear()

    async def _in_worker(self, in_thread: bool, work: Callable[[], _T]) -> _T:
        """``work()``, in a worker thread when deployed (see the module docstring)."""
        if not in_thread:
            return work()
        self._computing = True
        computing = asyncio.ensure_future(asyncio.to_thread(work))
        try:
            return await asyncio.shield(computing)
        except asyncio.CancelledError:
            # A thread cannot be stopped: the actor ends (a crash, a signal) only once its
            # compute has, so no later incarnation shares the trainer (its buffers, its
            # generator) with a thread still at work on them.
            await asyncio.wait({computing})
            if computing.done() and not computing.cancelled():
                computing.exception()  # retrieved: no "Future exception" warning for it
            raise
        finally:
            self._computing = False

    async def _sleep_unless_switched(self, clock: Clock, seconds: float) -> bool:
        """Sleep ``seconds``; False (at once) if a w-hat splits the round meanwhile."""
        assert self._switched is not None
        if self._switched.is_set():
            return False
        sleeper = asyncio.ensure_future(clock.sleep(max(0.0, seconds)))
        switch = asyncio.ensure_future(self._switched.wait())
        try:
            await asyncio.wait({sleeper, switch}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            sleeper.cancel()
            switch.cancel()
        return not self._switched.is_set()
