"""What the in-process network counts: each direction's messages by outcome
(:class:`DirectionStats`, :class:`NetworkStats`) and, when asked, each event
(:class:`TraceEntry`)."""

from __future__ import annotations

from collections.abc import Sized
from dataclasses import dataclass, fields
from typing import Literal

from fedsim.transports.link_model import Direction


@dataclass
class DirectionStats:
    """Message counters of one direction, summed over all links.

    ``sent + duplicated == delivered + dropped + rejected + lost + in_flight`` at all times.
    ``lost`` counts messages published by an offline client or arriving at an offline or
    closed endpoint (including undelivered ones discarded when a client goes offline).
    """

    sent: int = 0
    delivered: int = 0
    dropped: int = 0
    duplicated: int = 0
    rejected: int = 0
    lost: int = 0
    in_flight: int = 0
    bytes_sent: int = 0
    """Encoded bytes of every message sent (each once, as the sender puts it on the link)."""

    def count_sent(self, data: Sized) -> None:
        self.sent += 1
        self.bytes_sent += len(data)

    def as_dict(self) -> dict[str, int]:
        return {f.name: getattr(self, f.name) for f in fields(self)}


@dataclass(frozen=True)
class NetworkStats:
    """A snapshot of both directions' counters."""

    uplink: DirectionStats
    downlink: DirectionStats

    def as_dict(self) -> dict[str, dict[str, int]]:
        return {"uplink": self.uplink.as_dict(), "downlink": self.downlink.as_dict()}


@dataclass(frozen=True)
class TraceEntry:
    """One network event, recorded when the network is built with ``record_trace=True``."""

    time: float
    direction: Direction
    client_id: str
    event: Literal["send", "drop", "deliver", "reject", "lost", "duplicate"]
    nbytes: int


__all__ = ["DirectionStats", "NetworkStats", "TraceEntry"]
