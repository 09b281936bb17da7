"""A window's mix folded in as its updates arrive, for windows too large to hold.

:func:`~fedsim.aggregation.mixing.mix` keeps every accepted update of a window until the
window closes (the weights ``lambda_i = w_i / total`` need the window's total). At 10^4 clients
that train several rounds a window, that is 30,000 updates of 400 KB at once. For strategies
whose weight of an update depends on that update alone (data size, configured, uniform) the
mix is linear, so it can be accumulated instead: ``D = sum_i w_i eta_i u_i`` and ``W = sum_i
w_i`` in float64 as updates are accepted, and at the close

    w <- w - s_t * D / total,     total = W (window) or the population's weight,

the same model as the buffered mix up to floating-point rounding (float64 throughout, rounded
to float32 once: the two differ by a few float64 ulps before that rounding, tested). The server
switches a window to this form only once more than a threshold of its updates are waiting, so
small runs keep the buffered arithmetic bit for bit.
"""

from __future__ import annotations

import math

import numpy as np

from fedsim.aggregation.mixing import (
    AcceptedUpdate,
    ConfiguredWeights,
    DataSizeWeights,
    MixingStrategy,
    UniformWeights,
)
from fedsim.errors import ConfigError

__all__ = ["RunningMix", "streams"]

_PER_UPDATE = (DataSizeWeights, ConfiguredWeights, UniformWeights)


def streams(strategy: MixingStrategy) -> bool:
    """Whether ``strategy``'s weight of an update depends on that update alone (so its mix can
    be accumulated update by update)."""
    return type(strategy) in _PER_UPDATE


class RunningMix:
    """``D = sum_i w_i eta_i u_i`` and ``W = sum_i w_i`` of the updates added so far."""

    def __init__(self, strategy: MixingStrategy, size: int) -> None:
        if not streams(strategy):
            raise ConfigError(f"mixing strategy {strategy.name!r} cannot be accumulated")
        self.strategy = strategy
        self.direction = np.zeros(size, dtype=np.float64)
        self._scaled = np.empty(size, dtype=np.float64)
        self.weight = 0.0
        self.count = 0

    def add(self, update: AcceptedUpdate) -> None:
        raw = float(np.asarray(self.strategy.weights([update]), dtype=np.float64)[0])
        if not (math.isfinite(raw) and raw >= 0):
            raise ConfigError(f"mixing strategy {self.strategy.name!r} gave invalid weight {raw!r}")
        np.multiply(update.update, raw * update.step_size, out=self._scaled, dtype=np.float64)
        self.direction += self._scaled
        self.weight += raw
        self.count += 1

    def apply(self, params: np.ndarray, server_step: float, *,
              total_weight: float | None = None) -> np.ndarray:
        """The new global model ``params - server_step * D / total`` (float32)."""
        if self.count == 0:
            return params.copy()
        total = self.weight if total_weight is None else float(total_weight)
        if not (math.isfinite(total) and total > 0):
            raise ConfigError(f"mixing total weight must be > 0, got {total!r}")
        direction = self.direction * (-server_step / total)
        direction += params
        return direction.astype(np.float32)
