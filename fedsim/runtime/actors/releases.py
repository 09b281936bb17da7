"""What a client released: one record a released round (:class:`RoundRecord`) and their sums,
bounded however long the client runs (:class:`Releases`).

Kept by the client actor as it releases, summed over a client's incarnations by the runtimes,
and listed in full only where a caller asks (a deployed client's exit report, a simulation's
``keep_history``): a record a round is state that grows with the run's length.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

__all__ = ["Releases", "RoundRecord"]


@dataclass(frozen=True, slots=True)  # one a released round, kept for the run (no dict)
class RoundRecord:
    """One released round, for the runtime's bookkeeping (never sent anywhere)."""

    round: int
    time: float
    base_version: int
    sample_grads: int
    clip: float
    sigma: float
    window: int = 0  # the invitation it was begun under (0: the server invites everyone)


@dataclass(slots=True)
class Releases:
    """What a client's released rounds add up to, bounded however long it runs: how many,
    their per-example gradients, the last one. Every record is kept only where a caller lists
    them (``kept``: a deployed client's report); a simulated run's 10^3 clients kept one a
    round for nothing but these sums."""

    count: int = 0
    sample_grads: int = 0
    last: RoundRecord | None = None
    kept: list[RoundRecord] | None = None
    first: RoundRecord | None = None
    """The first released round (its sigma and clip: ``clients.csv``'s ``sigma_first``,
    ``clip_first``; ``sigma``/``clip`` are the last's)."""
    varied: bool = False
    """Whether the released rounds' sigma or clip ever changed (``clients.csv``'s
    ``schedule``: a scheduled client's last sigma alone does not give its eps)."""

    def add(self, record: RoundRecord) -> None:
        self.count += 1
        self.sample_grads += record.sample_grads
        self.varied = self.varied or (self.last is not None and _differ(self.last, record))
        if self.first is None:
            self.first = record
        self.last = record
        if self.kept is not None:
            self.kept.append(record)

    def then(self, later: Releases) -> Releases:
        """These releases followed by ``later``'s (a client's incarnations, in order); the
        sums only."""
        joined = self.last is not None and later.first is not None \
            and _differ(self.last, later.first)
        return Releases(self.count + later.count, self.sample_grads + later.sample_grads,
                        later.last if later.last is not None else self.last,
                        first=self.first if self.first is not None else later.first,
                        varied=self.varied or later.varied or joined)

    @classmethod
    def of(cls, records: Iterable[RoundRecord]) -> Releases:
        """The sums of ``records`` (released in this order)."""
        releases = cls()
        for record in records:
            releases.add(record)
        return releases


def _differ(one: RoundRecord, other: RoundRecord) -> bool:
    """Whether two released rounds had another sigma or clip."""
    return one.sigma != other.sigma or one.clip != other.clip
