"""The server's held-out evaluation: of the model every ``eval_every`` windows, and of the model
the run ends with.

A version is evaluated once: a window that applied nothing reports the last evaluation again,
and only a changed model's accuracy reaches the step-size schedule (windows in which nothing
was applied must not shrink the step size). A version renewed unchanged (a restored server,
:meth:`~fedsim.runtime.actors.server.ServerActor.renew_version`) keeps its evaluation.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from fedsim.aggregation import StepSizeSchedule

__all__ = ["Evaluator", "FinalEvaluation", "HeldOutEvaluation"]

Evaluator = Callable[[np.ndarray], tuple[float, float]]
"""The held-out accuracy and loss of a parameter vector."""


@dataclass(frozen=True)
class FinalEvaluation:
    """The held-out accuracy and loss of the model the run ends with (``version``)."""

    version: int
    accuracy: float
    loss: float


class HeldOutEvaluation:
    """When the server's model is evaluated, and what it last read (``version``: the model
    version ``last`` is of; -1 before any)."""

    def __init__(self, evaluate: Evaluator | None, every: int) -> None:
        self.evaluate = evaluate
        self.every = every
        self.version = -1
        self.last: tuple[float, float] = (math.nan, math.nan)

    def _of(self, params: np.ndarray, version: int) -> bool:
        """Evaluate ``version`` unless it was; whether it was new."""
        assert self.evaluate is not None
        if version == self.version:
            return False
        self.last = self.evaluate(params)
        self.version = version
        return True

    def at_window(self, window: int, params: np.ndarray, version: int,
                  schedule: StepSizeSchedule) -> tuple[float, float] | None:
        """The accuracy and loss reported at ``window``'s close (None: none due, or no
        evaluator); a new version's accuracy is observed by ``schedule``."""
        if self.evaluate is None or window % self.every != 0:
            return None
        if self._of(params, version):
            schedule.observe(self.last[0])
        return self.last

    def final(self, params: np.ndarray, version: int) -> FinalEvaluation | None:
        """The model as the run leaves it (the last periodic evaluation may be of an older
        version); the schedule does not see it: no window follows. None without an
        evaluator."""
        if self.evaluate is None:
            return None
        self._of(params, version)
        accuracy, loss = self.last
        return FinalEvaluation(self.version, float(accuracy), float(loss))

    def renew(self, version: int, renewed: int) -> None:
        """The model of ``version`` is published again, unchanged, as ``renewed``."""
        if self.version == version:
            self.version = renewed
