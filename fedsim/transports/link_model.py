"""What a simulated link does to a message: its latency, loss, duplication, reordering and
bandwidth (:class:`LinkModel`), the rule :class:`fedsim.transports.simulated.SimulatedNetwork`
applies to every message it carries.

Link model (one link per client and direction; a broadcast samples every client's downlink
independently). For a message of ``size`` bytes published at time ``t``:

1. *Transmission.* With a bandwidth, the link sends one message at a time: transmission starts
   at ``max(t, end of the previous transmission)`` and takes ``size / bandwidth_bytes_per_s``;
   without one it takes no time. Every message occupies the link, dropped ones included.
2. *Drop.* With probability ``drop`` the message is lost (one uniform draw).
3. *Latency.* ``latency(rng)`` seconds are added after transmission (negative draws count as 0).
4. *Order.* A link delivers in send order, like the TCP connection under MQTT: a message
   arrives at ``max(its own time, arrival of the previous in-order message)``, so random
   latency causes head-of-line blocking, not reordering. With probability ``reorder`` a
   message instead leaves that order and is held back by one more independent latency draw:
   it arrives at ``its own time + latency(rng)`` and blocks nobody, so messages sent after it
   overtake it whenever they arrive earlier (with zero latency nothing can overtake).
5. *Duplicate.* With probability ``duplicate`` a second copy (a retransmission) arrives one
   more independent latency draw after the first copy (it does not occupy the link again).

Random draws per message, in this order: drop; latency; reorder, then its extra latency; duplicate,
then its latency (a draw is skipped when its probability is 0 or an earlier outcome ends the
message).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal, Protocol

import numpy as np

from fedsim.config.network import Link
from fedsim.errors import ConfigError

Direction = Literal["uplink", "downlink", "aggregator_uplink", "aggregator_downlink"]
"""A link's direction: clients' to the server (or their aggregator), the server's to clients,
an aggregator's to the server and the server's to an aggregator."""
LatencySampler = Callable[[np.random.Generator], float]


def no_latency(rng: np.random.Generator) -> float:
    """Zero latency (draws nothing from ``rng``)."""
    return 0.0


def constant_latency(seconds: float) -> LatencySampler:
    """Every message takes ``seconds`` (draws nothing)."""
    if not (math.isfinite(seconds) and seconds >= 0):
        raise ConfigError(f"latency must be a finite number of seconds >= 0, got {seconds}")
    return lambda rng: seconds


def uniform_latency(low: float, high: float) -> LatencySampler:
    """Latency uniform on ``[low, high]`` seconds (one draw)."""
    if not (math.isfinite(low) and math.isfinite(high) and 0 <= low <= high):
        raise ConfigError(f"uniform latency needs 0 <= low <= high, got [{low}, {high}]")
    return lambda rng: float(rng.uniform(low, high))


def exponential_latency(mean: float, *, minimum: float = 0.0) -> LatencySampler:
    """``minimum`` plus an exponential delay of the given mean (one draw)."""
    if not (math.isfinite(mean) and mean >= 0 and math.isfinite(minimum) and minimum >= 0):
        raise ConfigError(
            f"exponential latency needs mean >= 0 and minimum >= 0, got {mean}, {minimum}"
        )
    if mean == 0:
        return lambda rng: minimum
    return lambda rng: minimum + float(rng.exponential(mean))


@dataclass(frozen=True)
class LinkModel:
    """One direction of one client's link; see the module docstring for the exact semantics."""

    latency: LatencySampler = no_latency
    drop: float = 0.0
    duplicate: float = 0.0
    reorder: float = 0.0
    bandwidth_bytes_per_s: float | None = None

    def __post_init__(self) -> None:
        for name in ("drop", "duplicate", "reorder"):
            value = getattr(self, name)
            if not (0.0 <= value <= 1.0):
                raise ConfigError(f"link {name} probability must be in [0, 1], got {value}")
        bandwidth = self.bandwidth_bytes_per_s
        if bandwidth is not None and not (math.isfinite(bandwidth) and bandwidth > 0):
            raise ConfigError(
                f"link bandwidth must be a positive number of bytes/s, got {bandwidth}"
            )


class LinkState(Protocol):
    """What a link remembers between its messages (step 1's and step 4's times)."""

    busy_until: float
    last_in_order_arrival: float


@dataclass(slots=True)
class LinkTimes:
    """A :class:`LinkState` of its own (the simulated network's links carry theirs)."""

    busy_until: float = 0.0
    last_in_order_arrival: float = 0.0


class LatencyDrawError(ValueError):
    """A latency sampler drew NaN or an infinity (the caller names the link)."""


def link_model(link: Link) -> LinkModel:
    """The model of a scenario's ``link`` (the one conversion both runtimes use)."""
    return LinkModel(latency=link.latency.sampler(), drop=link.drop, duplicate=link.duplicate,
                     reorder=link.reorder, bandwidth_bytes_per_s=link.bandwidth_bytes_per_s)


Passage = tuple[float, bool, float | None]
"""A carried message's fate: its arrival, whether it arrives in send order (not held back),
and its duplicate's arrival (None: no duplicate)."""


def carry(model: LinkModel, state: LinkState, now: float, size: int,
          rng: np.random.Generator) -> Passage | None:
    """The one rule of the module docstring for one message of ``size`` bytes sent at ``now``
    on a link whose times are ``state`` (updated): None if it is dropped, else its
    :data:`Passage`. Draws from ``rng`` in the documented order, so a link's messages meet
    the same fates in every runtime that gives them the same stream. A latency drawn NaN or
    infinite raises :class:`LatencyDrawError`."""
    sent_at = now
    bandwidth = model.bandwidth_bytes_per_s
    if bandwidth is not None:
        sent_at = max(now, state.busy_until) + size / bandwidth
        state.busy_until = sent_at
    if model.drop > 0 and rng.random() < model.drop:
        return None
    arrival = sent_at + _latency(model, rng)
    in_order = not (model.reorder > 0 and rng.random() < model.reorder)
    if in_order:
        arrival = max(arrival, state.last_in_order_arrival)
        state.last_in_order_arrival = arrival
    else:
        arrival += _latency(model, rng)
    duplicate = None
    if model.duplicate > 0 and rng.random() < model.duplicate:
        duplicate = arrival + _latency(model, rng)
    return arrival, in_order, duplicate


def _latency(model: LinkModel, rng: np.random.Generator) -> float:
    value = float(model.latency(rng))
    if math.isnan(value) or math.isinf(value):
        raise LatencyDrawError(f"latency drew {value}")
    return max(0.0, value)


__all__ = [
    "Direction",
    "LatencyDrawError",
    "LatencySampler",
    "LinkModel",
    "LinkState",
    "LinkTimes",
    "Passage",
    "carry",
    "link_model",
    "constant_latency",
    "exponential_latency",
    "no_latency",
    "uniform_latency",
]
