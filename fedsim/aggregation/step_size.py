"""The server step size s_t, one value per time window (van Dijk & Nguyen: diminishing step sizes).

* :class:`ConstantStepSize`: s_t = s.
* :class:`PlateauStepSize`: multiply by ``factor`` (0.9) whenever held-out accuracy fails to
  improve on its best for ``patience`` evaluations - van Dijk & Nguyen's rule of thumb "if [test
  accuracy is] not increasing, then we decrease the step size by 10%", floored at ``minimum``
  (the footnote's "converges to a constant step size").
* :class:`InverseTimeStepSize`: s_t = s_0 / (1 + decay * t) ** power, a fixed decay law.

The server calls ``current`` for the window it is closing and ``observe(accuracy)`` after each
evaluation; a checkpoint stores what ``state_dict`` returns (the state that evolves, not the
configuration) and a restarted server hands it back to ``load_state_dict``.
"""

from __future__ import annotations

import math
from typing import Protocol

from fedsim.config.schema import ConstantStep, InverseTimeStep, PlateauStep, StepSize
from fedsim.errors import ConfigError

__all__ = [
    "ConstantStepSize",
    "InverseTimeStepSize",
    "PlateauStepSize",
    "StepSizeSchedule",
    "StepSizeState",
    "make_step_size",
]


StepSizeState = dict[str, float | int]


class StepSizeSchedule(Protocol):
    def current(self, window: int) -> float: ...

    def observe(self, accuracy: float) -> None: ...

    def state_dict(self) -> StepSizeState:
        """The schedule's evolving state (JSON numbers), for a checkpoint."""
        ...

    def load_state_dict(self, state: StepSizeState) -> None:
        """Continue from a :meth:`state_dict` of a schedule of the same configuration."""
        ...


class _Stateless:
    """A schedule whose value depends on the window alone: nothing to checkpoint."""

    def state_dict(self) -> StepSizeState:
        return {}

    def load_state_dict(self, state: StepSizeState) -> None:
        _check_keys(self, state, set())


def _check_keys(schedule: object, state: StepSizeState, keys: set[str]) -> None:
    if set(state) != keys:
        raise ConfigError(
            f"step-size state {sorted(state)} does not fit {type(schedule).__name__} (expected "
            f"{sorted(keys)}): was server.step_size changed between restarts?"
        )


class ConstantStepSize(_Stateless):
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

    def state_dict(self) -> StepSizeState:
        return {"value": self.value, "best": self.best, "since_best": self._since_best}

    def load_state_dict(self, state: StepSizeState) -> None:
        _check_keys(self, state, {"value", "best", "since_best"})
        self.value = float(state["value"])
        self.best = float(state["best"])
        self._since_best = int(state["since_best"])


class InverseTimeStepSize(_Stateless):
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
    raise ConfigError(f"not a step-size configuration: {config!r}")
