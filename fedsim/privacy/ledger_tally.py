"""What a ledger keeps in memory of its records: bounded, however long the run.

A ledger is spent every round and a run may last for days. Its records are on disk (the
ledger's file, :mod:`fedsim.privacy.ledger_file`) and composed in its accountant (counts of
each kind of step); holding every record in memory as well grew a client by a record a round
(about 130 bytes: 0.6 GB over the 1.8 M updates of the 10^6-client message-only row). In
memory a ledger keeps only what its checks and reports read: how many records, the last one's
time, and which rounds were recorded, as ranges of consecutive rounds (a client numbers its
rounds 0, 1, 2, ...; a gap only where a crash or a repair skipped numbers, so the ranges are
as many as the gaps, not the rounds).
"""

from __future__ import annotations

from bisect import bisect_right
from collections.abc import Iterable, Iterator, Sequence, Set

from fedsim.privacy.ledger_file import LedgerRecord

__all__ = ["LedgerTally", "RoundSet"]


class RoundSet(Set[int]):
    """A set of integers held as sorted, disjoint half-open ranges ``[start, stop)``.

    Adding the next integer after the highest (a client's next round) or one already held
    is O(1); any other is a bisection. A read-only :class:`collections.abc.Set`: it compares
    equal to a ``set`` or ``frozenset`` of the same integers."""

    __slots__ = ("_size", "_starts", "_stops")

    def __init__(self, values: Iterable[int] = ()) -> None:
        self._starts: list[int] = []
        self._stops: list[int] = []
        self._size = 0
        for value in sorted(set(values)):  # in order: each add O(1) (a damaged file's rounds
            self.add(value)                # in reverse were a list insert each, O(n^2))

    def add(self, value: int) -> None:
        starts, stops = self._starts, self._stops
        if stops and starts[-1] <= value <= stops[-1]:  # the common case: held, or the next
            if value == stops[-1]:
                stops[-1] += 1
                self._size += 1
            return
        i = bisect_right(starts, value) - 1  # the last range starting at or before value
        if i >= 0 and value < stops[i]:
            return
        joins_left = i >= 0 and stops[i] == value
        joins_right = i + 1 < len(starts) and starts[i + 1] == value + 1
        if joins_left and joins_right:
            stops[i] = stops[i + 1]
            del starts[i + 1], stops[i + 1]
        elif joins_left:
            stops[i] = value + 1
        elif joins_right:
            starts[i + 1] = value
        else:
            starts.insert(i + 1, value)
            stops.insert(i + 1, value + 1)
        self._size += 1

    @property
    def highest(self) -> int | None:
        """The largest integer held (None: empty)."""
        return self._stops[-1] - 1 if self._stops else None

    @property
    def ranges(self) -> tuple[range, ...]:
        return tuple(range(a, b) for a, b in zip(self._starts, self._stops, strict=True))

    def copy(self) -> RoundSet:
        copied = RoundSet()
        copied._starts, copied._stops, copied._size = (
            list(self._starts), list(self._stops), self._size)
        return copied

    def __contains__(self, value: object) -> bool:
        if not isinstance(value, int):
            return False
        i = bisect_right(self._starts, value) - 1
        return i >= 0 and value < self._stops[i]

    def __iter__(self) -> Iterator[int]:
        for start, stop in zip(self._starts, self._stops, strict=True):
            yield from range(start, stop)

    def __len__(self) -> int:
        return self._size

    def __repr__(self) -> str:
        return f"RoundSet({', '.join(f'{r.start}..{r.stop - 1}' for r in self.ranges)})"


class LedgerTally:
    """A ledger's records as memory holds them: their count, the last one's time, the
    training rounds (round >= 0) and the other rounds recorded (a release before training,
    such as DP normalisation at round -1)."""

    __slots__ = ("count", "earlier", "last_time", "rounds")

    def __init__(self, records: Sequence[LedgerRecord] = ()) -> None:
        self.count = len(records)
        self.last_time = records[-1].time if records else 0.0
        self.rounds = RoundSet(r.round for r in records if r.round >= 0)
        self.earlier = RoundSet(r.round for r in records if r.round < 0)

    def add(self, records: Iterable[LedgerRecord]) -> None:
        for record in records:
            self.count += 1
            self.last_time = record.time
            (self.rounds if record.round >= 0 else self.earlier).add(record.round)

    def recorded(self, round: int) -> bool:  # noqa: A002 - the ledger's field is called round
        """Whether any record is of ``round``."""
        return round in (self.rounds if round >= 0 else self.earlier)
