"""A DP round between its start and its result, and the two protocols that connect a client's
trainer (:mod:`fedsim.training.local`) with the batched pass (:mod:`fedsim.training.batched`).

A round is *begun* when its randomness is drawn (:class:`StepDraws`: batches and noise keys)
and *computed* when its result is taken: :class:`PendingRound` holds it in between. A pending
round is computed by its :class:`RoundTrainer` alone, or, if a :class:`RoundQueue` (the
:class:`~fedsim.training.batched.RoundBatcher`) holds it, together with the other rounds
pending there. Neither the trainer nor the batcher imports the other: each sees the other
through the protocol here.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import numpy as np
import torch
from torch import nn

from fedsim.privacy.events import GaussianStep, Sampling
from fedsim.training.gaussian import NoiseKey
from fedsim.training.persample import LossFn

__all__ = [
    "DoneRound",
    "PendingRound",
    "RoundQueue",
    "RoundResult",
    "RoundTrainer",
    "StepDraws",
]


@dataclass(frozen=True)
class RoundResult:
    """What one local round produced.

    ``update`` is the only privatised output; ``batch_sizes``, ``mean_loss`` and
    ``sample_grads`` describe private data and must stay on the client (metrics only).
    """

    update: np.ndarray
    """Flat float32 ``Ubar/m``: the server (and the client) *subtract* it times a step size."""
    steps: list[GaussianStep]
    """The privacy events consumed, equal to ``planned_steps(round_index)``."""
    batch_sizes: list[int]
    """Realised batch size of each DP step (Poisson sizes vary and may be 0)."""
    clip: float
    """Clipping norm used (in the last step when adaptive clipping moved it)."""
    sigma: float
    """Effective noise multiplier of the recorded steps."""
    mean_loss: float
    """Mean per-example training loss over the round's batches (nan if they were all empty)."""
    sample_grads: int
    """Number of per-example gradients computed."""
    zero_update: bool = False
    """``update`` is all zeros (training replaced by its cost): the client applying it keeps
    referring to the model it holds instead of copying it (``w - eta * 0 == w`` exactly)."""


class RoundTrainer(Protocol):
    """What a pending round and the batched pass need of the trainer that began the round
    (:class:`~fedsim.training.local.LocalTrainer`)."""

    model: nn.Module
    features: torch.Tensor
    labels: torch.Tensor
    batch_size: int
    sampling: Sampling
    local_steps: int
    per_example_steps: int
    loss_fn: LossFn

    def clip_for(self, round_index: int) -> float:
        """Clipping norm of round ``round_index``."""
        ...

    def rows_of(self, indices: torch.Tensor) -> torch.Tensor:
        """The rows of ``features``/``labels`` that a batch's record ``indices`` name."""
        ...

    def sum_sigma(self, sigma: float) -> float:
        """Noise multiplier of the clipped sum for a step of multiplier ``sigma``."""
        ...

    def update_adaptive_clip(
        self, within_clip: int, batch_size: int, clip: float, count_noise: NoiseKey
    ) -> None:
        """Move adaptive clipping's norm after a step."""
        ...

    def compute(self, pending: PendingRound) -> RoundResult:
        """The round computed on its own."""
        ...

    def round_result(
        self, pending: PendingRound, update: np.ndarray, batch_sizes: list[int], clip: float,
        loss_sum: float,
    ) -> RoundResult:
        """The result of ``pending`` once its update is computed."""
        ...


class RoundQueue(Protocol):
    """Where pending rounds wait to be computed together
    (:class:`~fedsim.training.batched.RoundBatcher`)."""

    def submit(self, pending: PendingRound) -> None: ...

    def discard(self, pending: PendingRound) -> None: ...

    def flush(self) -> None:
        """Compute every waiting round."""
        ...


@dataclass(frozen=True)
class StepDraws:
    """The randomness of one DP step, drawn when its round begins."""

    indices: torch.Tensor
    """The batch (record indices into the trainer's data)."""
    noise: NoiseKey
    """Key of the Gaussian noise added to the clipped sum."""
    count_noise: NoiseKey | None
    """Key of adaptive clipping's noise on the unclipped count (None without it)."""


class PendingRound:
    """A round whose randomness is drawn and whose compute may wait
    (:meth:`~fedsim.training.local.LocalTrainer.begin_round`).

    The virtual-time runtime lets a round's compute time pass before asking for its update,
    so the rounds of many clients that overlap in virtual time can be computed together
    (:class:`~fedsim.training.batched.RoundBatcher`); the values are those of the draws made
    at the start, whatever the grouping, up to floating-point summation order.
    """

    def __init__(
        self,
        trainer: RoundTrainer,
        params: np.ndarray,
        round_index: int,
        steps: list[GaussianStep],
        draws: list[StepDraws],
    ) -> None:
        self.trainer = trainer
        self.params = params
        self.round_index = round_index
        self.steps = steps
        self.draws = draws
        self.sample_grads = sum(len(d.indices) for d in draws)
        """Per-example gradients the round computes, known before it is computed."""
        self.batcher: RoundQueue | None = None
        self._outcome: RoundResult | Exception | None = None

    @property
    def done(self) -> bool:
        return self._outcome is not None

    def complete(self, outcome: RoundResult | Exception) -> None:
        """Record the round's result (or the error that stopped it); the params are released."""
        self._outcome = outcome
        self.params = None  # type: ignore[assignment]
        self.batcher = None

    def result(self) -> RoundResult:
        """The round's update, computing it (and the batch it waits in) if not done yet."""
        if self._outcome is None:
            if self.batcher is not None:
                self.batcher.flush()
            else:
                self.compute_alone()
        assert self._outcome is not None
        if isinstance(self._outcome, Exception):
            raise self._outcome
        return self._outcome

    def compute_alone(self) -> None:
        """Compute this round by itself (one model load, one engine pass a step)."""
        try:
            self.complete(self.trainer.compute(self))
        except Exception as exc:  # the error belongs to this round's client alone
            self.complete(exc)

    def cancel(self) -> None:
        """Forget the round without computing it (its client crashed while it ran)."""
        if self.batcher is not None:
            self.batcher.discard(self)
        self.batcher = None


class DoneRound:
    """A round whose result is known when it begins (nothing left to compute)."""

    def __init__(self, result: RoundResult) -> None:
        self._result = result
        self.sample_grads = result.sample_grads

    def result(self) -> RoundResult:
        return self._result

    def cancel(self) -> None:
        pass
