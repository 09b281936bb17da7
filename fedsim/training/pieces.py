"""A round kept in pieces, so that a switch recomputes only what it changes (deployed clients).

Under the interrupt rule ``switch`` (:mod:`fedsim.training.rounds`) a w-hat arriving at a
fraction ``f`` of a round's compute time moves the records due from ``f`` on to w-hat. A
simulated client computes the round once, at its end, when every split is known. A deployed
client must release at a public time (the release padding of docs/SECURITY.md), so it computes
the round when it begins; a split then had it computed again *whole* and released a slot
after the arrival (so that how long the recompute took stayed hidden): where models arrive
about once a slot, half the simulation's rounds.

A round kept in pieces holds, for every local step, the clipped sums of its records grouped
by when they are due: piece ``p`` of ``K`` holds the records whose phase in the step
(:func:`~fedsim.training.rounds.record_phase`) lies in ``[p/K, (p+1)/K)``. A split at a
piece's start ``b`` forgets that piece and every later one (those of later steps too) and
keeps the others: every record they hold is due before ``b`` and was computed at the ``w``
it is due at. Computing the round again then costs the records due from ``b`` on, not the
whole batch: van Dijk & Nguyen's "one gradient after the other" holds the earlier gradients
at the old ``w`` already summed. The deployed client takes a w-hat from the next piece's
start on (:class:`~fedsim.runtime.actors.client.ClientActor`, as a client that checks for a
new model between parts of its batch would), so the records it computes again are due in at
most the rest of the slot, and the release keeps its time unless that compute overruns
(counted, as every overrun is).

The update is the same function of the records, their phases, the segments' ``w`` and the
noise keys as the plain path's (:meth:`~fedsim.training.local.LocalTrainer.compute`), so the
round's sensitivity and privacy events are those of :func:`record_phase`'s argument; only the
order of the float sums differs (the noise is added to the pieces' sum, not the pieces into
the noise). The pieces' boundaries are public constants; which record lies in which piece is
as private as its phase, and stays on the client.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Protocol

import numpy as np
import torch

from fedsim.training.dpsgd import NoisyGradient
from fedsim.training.gaussian import NoiseKey
from fedsim.training.rounds import PendingRound, RoundResult, StepDraws, step_segments

__all__ = ["PIECES_PER_STEP", "PIECES_MAX_BYTES", "Piece", "RoundPieces", "compute_in_pieces",
           "pieces_per_step"]

PIECES_PER_STEP = 8
"""Pieces of a local step: a deployed client takes a w-hat from the next eighth of a step."""
PIECES_MAX_BYTES = 64 * 2**20
"""At most this much float32 held in pieces for one round (fewer pieces for large models;
one piece is none kept: :func:`pieces_per_step`)."""


def pieces_per_step(num_params: int, local_steps: int) -> int:
    """How many pieces a step of a round of ``local_steps`` steps of a ``num_params`` model is
    kept in: :data:`PIECES_PER_STEP`, or the largest power of two below it whose pieces hold
    at most :data:`PIECES_MAX_BYTES` (1: nothing kept, a split recomputes the whole round)."""
    fit = PIECES_MAX_BYTES // max(1, 4 * num_params * local_steps)
    per_step = PIECES_PER_STEP
    while per_step > 1 and per_step > fit:
        per_step //= 2
    return per_step


@dataclass(frozen=True)
class Piece:
    """The records of one piece of one step, computed at the ``w`` each is due at."""

    total: torch.Tensor | None
    """Their scaled clipped sum, without noise (None: the piece holds no record)."""
    within: int
    """How many had ``||g_i|| <= C`` (adaptive clipping's count; private)."""
    loss_sum: float
    nonfinite: int
    """How many contributed zero for a non-finite gradient norm (private)."""


class RoundPieces:
    """The computed pieces of one round: ``K`` a step, each kept until a split reaches it."""

    def __init__(self, per_step: int, local_steps: int) -> None:
        if per_step < 2:
            raise ValueError(f"a round kept in pieces needs at least 2 a step, got {per_step}")
        self.per_step = per_step
        self.local_steps = local_steps
        self._pieces: list[list[Piece | None]] = [[None] * per_step for _ in range(local_steps)]
        self.records_computed = 0
        """Records whose gradients were computed, over every compute of the round (tests and
        the note's measurements: a split recomputes only its pieces')."""

    @property
    def per_round(self) -> int:
        """Pieces of the whole round (``K`` a step)."""
        return self.per_step * self.local_steps

    def piece_of(self, phases: torch.Tensor) -> torch.Tensor:
        """Each record's piece within its step, from its phase in ``[0, 1)``."""
        return torch.clamp((phases * self.per_step).floor().to(torch.int64), 0, self.per_step - 1)

    def forget_from(self, fraction: float) -> None:
        """A split at ``fraction`` of the round: forget every piece holding a record due at or
        after it (its step's pieces from its own on, every later step's)."""
        position = max(0.0, fraction) * self.local_steps
        step = min(int(math.floor(position)), self.local_steps)
        first = int(math.floor((position - step) * self.per_step)) if step < self.local_steps \
            else 0
        for s in range(step, self.local_steps):
            for p in range(first if s == step else 0, self.per_step):
                self._pieces[s][p] = None

    def get(self, step: int, piece: int) -> Piece | None:
        return self._pieces[step][piece]

    def keep(self, step: int, piece: int, value: Piece) -> None:
        self._pieces[step][piece] = value


class PieceTrainer(Protocol):
    """What :func:`compute_in_pieces` needs of the trainer
    (:class:`~fedsim.training.local.LocalTrainer`)."""

    local_steps: int

    def clip_for(self, round_index: int) -> float: ...

    def lr_for(self, round_index: int) -> float: ...

    def sum_sigma(self, sigma: float) -> float: ...

    def record_phases(self, indices: torch.Tensor, round_index: int) -> torch.Tensor: ...

    def rows_of(self, indices: torch.Tensor) -> torch.Tensor: ...

    def update_adaptive_clip(
        self, within_clip: int, batch_size: int, clip: float, count_noise: NoiseKey
    ) -> None: ...

    def load_params(self, params: np.ndarray) -> None: ...

    def zero_gradient(self) -> torch.Tensor: ...

    def clipped_sum_into(self, indices: torch.Tensor, clip: float,
                         into: torch.Tensor) -> NoisyGradient: ...

    def step_noise(self, clip: float, sum_sigma: float, key: NoiseKey) -> torch.Tensor: ...

    def round_result(
        self, pending: PendingRound, update: np.ndarray, batch_sizes: list[int], clip: float,
        loss_sum: float, nonfinite: int = 0,
    ) -> RoundResult: ...


def compute_in_pieces(trainer: PieceTrainer, pending: PendingRound,
                      pieces: RoundPieces) -> RoundResult:
    """``pending``'s update, computing only the pieces a split forgot (all of them the first
    time) and keeping them: each record's clipped gradient at the ``w`` of the segment it is
    due in, minus the round's local progress before its step, one noise draw a step (its
    key's). The same values as the plain path up to float summation order."""
    round_index = pending.round_index
    sum_sigma = trainer.sum_sigma(pending.steps[0].sigma)
    accumulated: torch.Tensor | None = None
    batch_sizes: list[int] = []
    loss_sum, clip, nonfinite = 0.0, math.nan, 0
    for step, draws in enumerate(pending.draws):
        clip = trainer.clip_for(round_index)
        kept = _step_pieces(trainer, pieces, pending, step, draws, accumulated, clip)
        total = trainer.step_noise(clip, sum_sigma, draws.noise)
        for piece in kept:
            if piece.total is not None:
                total.add_(piece.total)
        size = len(draws.indices)
        if draws.count_noise is not None:
            trainer.update_adaptive_clip(sum(p.within for p in kept), size, clip,
                                         draws.count_noise)
        loss_sum += sum(p.loss_sum for p in kept)
        nonfinite += sum(p.nonfinite for p in kept)
        accumulated = total if accumulated is None else accumulated.add_(total)
        batch_sizes.append(size)
    assert accumulated is not None  # local_steps >= 1
    return trainer.round_result(pending, accumulated.to("cpu", torch.float32).numpy(),
                                batch_sizes, clip, loss_sum, nonfinite)


def _step_pieces(trainer: PieceTrainer, pieces: RoundPieces, pending: PendingRound, step: int,
                 draws: StepDraws, accumulated: torch.Tensor | None,
                 clip: float) -> list[Piece]:
    """Step ``step``'s pieces: the kept ones, and the others computed now (each record at the
    start point of the segment it is due in: the segment's ``w`` less the round's progress
    before the step, ``accumulated``) and kept."""
    missing = [p for p in range(pieces.per_step) if pieces.get(step, p) is None]
    if missing:
        lr = trainer.lr_for(pending.round_index)
        starts = [torch.from_numpy(np.asarray(s.params, dtype=np.float32).astype(np.float64))
                  for s in pending.segments]
        if accumulated is not None:
            starts = [b - lr * accumulated.to("cpu", torch.float64) for b in starts]
        phases = trainer.record_phases(draws.indices, pending.round_index)
        owner = pieces.piece_of(phases)
        count = draws.count_noise is not None
        for piece in missing:
            mine = owner == piece
            indices = draws.indices[mine]
            if len(indices) == 0:
                pieces.keep(step, piece, Piece(None, 0, 0.0, 0))
                continue
            groups = step_segments(pending.segments, step, trainer.local_steps, indices,
                                   phases[mine])
            value, dropped = _sum(trainer, groups, starts, clip, None, count)
            if dropped is not None and value.total is not None \
                    and not bool(torch.isfinite(value.total).all()):
                # 0 x inf: the piece again without those examples (the step's noise is apart),
                # as the plain path does the whole step again.
                again, _ = _sum(trainer, groups, starts, clip, dropped, count)
                value = Piece(again.total, again.within, again.loss_sum, value.nonfinite)
            pieces.records_computed += len(indices)
            pieces.keep(step, piece, value)
    kept = [pieces.get(step, p) for p in range(pieces.per_step)]
    assert all(p is not None for p in kept)
    return [p for p in kept if p is not None]


def _sum(trainer: PieceTrainer, groups: list[tuple[int, torch.Tensor]],
         starts: list[torch.Tensor], clip: float, exclude: torch.Tensor | None,
         count: bool) -> tuple[Piece, torch.Tensor | None]:
    """The clipped sum of ``groups`` ((segment index, records) pairs), each record at its
    segment's start point, leaving out the records whose rows are in ``exclude``; with the
    rows of the examples that contributed zero for a non-finite norm (None: none did).
    ``count``: count the examples within the clip (adaptive clipping; else 0)."""
    total = trainer.zero_gradient()
    within, loss_sum, nonfinite = 0, 0.0, 0
    dropped: list[torch.Tensor] = []
    for segment, indices in groups:
        if exclude is not None:
            indices = indices[~torch.isin(trainer.rows_of(indices), exclude)]
        trainer.load_params(starts[segment].to(torch.float32).numpy())
        part = trainer.clipped_sum_into(indices, clip, total)
        within += part.within_clip if count else 0
        loss_sum += part.loss_sum
        nonfinite += part.nonfinite
        if part.dropped is not None:
            dropped.append(part.dropped)
    return Piece(total, within, loss_sum, nonfinite), (torch.cat(dropped) if dropped else None)
