"""The server step size s_t, one value per time window (van Dijk & Nguyen: diminishing step sizes).

* :class:`ConstantStepSize`: s_t = s.
* :class:`PlateauStepSize`: multiply by ``factor`` (0.9) whenever held-out accuracy fails to
  improve on its best for ``patience`` evaluations - van Dijk & Nguyen's rule of thumb "if [test
  accuracy is] not increasing, then we decrease the step size by 10%", floored at ``minimum``
  (the footnote's "converges to a constant step size").
* :class:`InverseTimeStepSize`: s_t = s_0 / (1 + decay * t) ** power, a fixed decay law.

The server calls ``current`` for the window it is closing and ``observe(accuracy)`` after each
evaluation.
"""

from __future__ import annotations

import math
from typing import Protocol

from fedsim.config.schema import ConstantStep, InverseTimeStep, PlateauStep, StepSize

__all__ = [
    "ConstantStepSize",
    "InverseTimeStepSize",
    "PlateauStepSize",
    "StepSizeSchedule",
    "make_step_size",
]


class StepSizeSchedule(Protocol):
    def current(self, window: int) -> float: ...

    def observe(self, accuracy: float) -> None: ...


class ConstantStepSize:
    def __init__(self, value: float) -> None:
        self.value = value

    def current(self, window: int) -> float:
        return self.value

    def observe(self, accuracy: float) -> None:
        """A constant step ignores accuracy."""


class PlateauStepSize:
    def __init__(self, initial: float, factor: float = 0.9, patience: int = 1,
                 minimum: float = 0.0) -> None:
        self.value = initial
        self.factor = factor
        self.patience = patience
        self.minimum = minimum
        self.best = -math.inf
        self._since_best = 0

    def current(self, window: int) -> float:
        return self.value

    def observe(self, accuracy: float) -> None:
        if accuracy > self.best:
            self.best = accuracy
            self._since_best = 0
            return
        self._since_best += 1
        if self._since_best >= self.patience:
            self.value = max(self.minimum, self.value * self.factor)
            self._since_best = 0


class InverseTimeStepSize:
    def __init__(self, initial: float, decay: float, power: float = 1.0) -> None:
        self.initial = initial
        self.decay = decay
        self.power = power

    def current(self, window: int) -> float:
        return self.initial / (1.0 + self.decay * max(0, window - 1)) ** self.power

    def observe(self, accuracy: float) -> None:
        """A fixed law ignores accuracy."""


def make_step_size(config: StepSize) -> StepSizeSchedule:
    """The schedule a scenario's ``server.step_size`` describes."""
    if isinstance(config, ConstantStep):
        return ConstantStepSize(config.value)
    if isinstance(config, PlateauStep):
        return PlateauStepSize(config.initial, config.factor, config.patience, config.minimum)
    if isinstance(config, InverseTimeStep):
        return InverseTimeStepSize(config.initial, config.decay, config.power)
    raise TypeError(f"not a step-size configuration: {config!r}")
