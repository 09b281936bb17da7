"""A client's a-priori agreed round step-size sequence eta_i(r) (van Dijk & Nguyen, sec. 3: "the server
knows an a-priori agreed (with the client) round step size sequence"), like the clip and noise
schedules of :mod:`fedsim.privacy.schedules`: a pure function of the round index.

* ``constant``: ``eta(r) = eta_0`` (``local_lr``);
* ``inverse_time``: ``eta(r) = eta_0 / (1 + decay r)^power``;
* ``exponential``: ``eta(r) = max(minimum, eta_0 factor^r)``.

The client applies ``eta(r)`` to its own released update (and between the local steps of a
round); the server applies the same ``eta(r)`` to that update (it knows the round index from
the message). Step sizes are public and multiply a released value: no privacy cost.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

from fedsim.errors import ConfigError

__all__ = ["StepSequence"]


@dataclass(frozen=True)
class StepSequence:
    """``eta(r)`` from ``initial`` (the group's ``local_lr``)."""

    initial: float
    kind: Literal["constant", "inverse_time", "exponential"] = "constant"
    decay: float = 0.0
    power: float = 1.0
    factor: float = 1.0
    minimum: float = 0.0

    def __post_init__(self) -> None:
        if not (math.isfinite(self.initial) and self.initial > 0):
            raise ConfigError(f"step size must be > 0, got {self.initial!r}")
        if self.kind not in ("constant", "inverse_time", "exponential"):
            raise ConfigError(f"unknown step sequence {self.kind!r}")
        if not (self.decay >= 0 and self.power > 0 and 0 < self.factor <= 1 and self.minimum >= 0):
            raise ConfigError(f"invalid step sequence {self!r}")

    def __call__(self, round_index: int) -> float:
        r = max(0, int(round_index))
        if self.kind == "inverse_time":
            return self.initial / (1.0 + self.decay * r) ** self.power
        if self.kind == "exponential":
            return max(self.minimum, self.initial * self.factor ** r)
        return self.initial
