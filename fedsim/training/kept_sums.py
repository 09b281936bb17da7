"""A round's clipped sums kept, so that a deployed client computes its records in their phase
order as its slot passes, and a switch never has a record computed again.

Under the interrupt rule ``switch`` (:mod:`fedsim.training.rounds`) a w-hat arriving at a
fraction ``f`` of a round's compute time moves the records due from ``f`` on to w-hat. A
simulated client computes the round once, at its end, when every split is known. A deployed
client must release at a public time (the release padding of docs/SECURITY.md). It used to
compute the round when it began and, on a split, compute it again whole and release it a slot
after the arrival (so that how long the recompute took stayed hidden): where models arrive
about once a slot, half the simulation's rounds.

A round that keeps its sums holds, for every local step, the clipped sum (without noise) of
its records due before some fraction ``until`` of the round, each at the start point of the
segment it was due in when computed, and those segments. :func:`compute_with_kept_sums` with
``upto < 1`` (:meth:`~fedsim.training.rounds.PendingRound.advance`) adds the records due
before ``upto``: the deployed client (:class:`~fedsim.runtime.actors.round_timing.
RoundTiming`) calls it for each part of the round (eighths of a local step,
:data:`SPLIT_POINTS_PER_STEP`, or fewer), as the slot passes, at the models it holds then: van
Dijk & Nguyen's "one gradient after the other", a part of the batch at a time. A w-hat takes
effect from the first part starting after its arrival (as in a client that checks for a new
model between parts of its batch), so it never reaches a record already computed: nothing is
computed again, and the server's models cannot make a round's compute longer. The release
keeps the slot's end unless the parts fall behind and overrun it (counted, as every overrun
is). A done step's noisy sum is kept for the later parts' start points.

Where a split does reach computed records (a direct caller's :meth:`~fedsim.training.rounds.
PendingRound.switch` before a range it already computed), the step's sum has those records
taken out at the segments it summed them at (the same values, so what is left is the sum of
the records due before the split, up to float rounding) and added at the new ones; steps
after the split's are computed again whole (their start points moved). Anything non-finite (a
record whose gradient norm is not) has its step's computed range computed again at once, as
the plain path does the step.

The update is the same function of the records, their phases, the segments' ``w`` and the
noise keys as the plain path's (:meth:`~fedsim.training.local.LocalTrainer.compute`), so the
round's sensitivity and privacy events are those of :func:`record_phase`'s argument; only the
float rounding differs (sums of parts, the noise added last). Which records fall in which part
is as private as their phases, and stays on the client, as do the parts' compute times, which
only a counted overrun shows.

A split round that keeps no sums (a simulated client's, computed once at its end; a deployed
model above :data:`KEPT_MAX_BYTES`, whose split recomputes the round whole) is computed by the
same code with ``sums=None``: every step whole, its records summed onto its noise (the noise
first, as :func:`~fedsim.training.dpsgd.noisy_gradient` sums a step: the values such a round
has always had, bitwise), and nothing held beyond a step but the round's running sum.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

import numpy as np
import torch

from fedsim.training.dpsgd import NoisyGradient
from fedsim.training.gaussian import NoiseKey
from fedsim.training.rounds import PendingRound, RoundResult, Segment, StepDraws, step_segments

__all__ = ["KEPT_MAX_BYTES", "SPLIT_POINTS_PER_STEP", "RoundSums", "compute_with_kept_sums",
           "keeps_sums"]

SPLIT_POINTS_PER_STEP = 8
"""A deployed client computes a local step in at most eighths, as its slot passes, and takes a
w-hat from the first part starting after its arrival."""
KEPT_MAX_BYTES = 64 * 2**20
"""At most this much float32 kept for one round (one model-sized sum a local step); above it a
split recomputes the round whole (:func:`keeps_sums`)."""


def keeps_sums(num_params: int, local_steps: int) -> bool:
    """Whether a round of ``local_steps`` steps of a ``num_params`` model keeps its sums: three
    model-sized float32 vectors a step at most (its clipped sum, its noised sum once done, a
    later step's start point) within :data:`KEPT_MAX_BYTES`, about 5.5 M parameters times
    local steps. Not counted: the models that split the round, which its segments hold until
    it ends (as an unpaced round's do), at most one a part: a model a part arriving at a
    5.5 M-parameter client keeps about 190 MB of them alive at a round's end."""
    return 3 * 4 * num_params * local_steps <= KEPT_MAX_BYTES


@dataclass(frozen=True)
class _Part:
    """What one sum over some of a step's records gave besides the sum itself."""

    within: int
    """How many had ``||g_i|| <= C`` (counted for adaptive clipping only; else 0)."""
    loss_sum: float
    nonfinite: int
    dropped: torch.Tensor | None
    """The rows of those whose gradient norm was not finite (None: none)."""


@dataclass
class _StepSum:
    """A step's clipped sum of its records due before ``until``, each at the start point of
    its segment among ``segments`` (the round's when computed); in a round that keeps no sums,
    summed onto the step's noise (``noised`` the same vector, :func:`_noised_step`)."""

    total: torch.Tensor
    within: int
    loss_sum: float
    nonfinite: int
    until: float
    segments: tuple[Segment, ...]
    noised: torch.Tensor | None = None
    """The done step's noisy sum (its noise plus ``total``), kept for the later steps' parts."""


class RoundSums:
    """The kept sums of one round, one a local step, and the earliest split not yet applied."""

    def __init__(self, local_steps: int) -> None:
        self.local_steps = local_steps
        self._steps: list[_StepSum | None] = [None] * local_steps
        self.cut = math.inf
        """The earliest fraction of the round a split moved since the last compute."""
        self.starts: dict[tuple[int, Segment], np.ndarray] = {}
        """The float32 start points of the steps' segments, kept between a paced round's
        parts (they move only when a split reaches an earlier step: then forgotten)."""
        self.records_computed = 0
        """Records whose gradients were computed, over every compute of the round (tests and
        benchmarks: a split computes only the records due from it, twice)."""

    @property
    def points_per_round(self) -> int:
        """Where in the round a deployed client lets a w-hat take effect: ``k / this``."""
        return SPLIT_POINTS_PER_STEP * self.local_steps

    def forget_from(self, fraction: float) -> None:
        """A split at ``fraction``: the records due from it on are to be computed again."""
        self.cut = min(self.cut, max(0.0, fraction))


class SumTrainer(Protocol):
    """What :func:`compute_with_kept_sums` needs of the trainer
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

    def restore_adaptive_state(self, state: float | None) -> None: ...

    def load_params(self, params: np.ndarray) -> None: ...

    def zero_gradient(self) -> torch.Tensor: ...

    def clipped_sum_into(self, indices: torch.Tensor, clip: float,
                         into: torch.Tensor) -> NoisyGradient: ...

    def step_noise(self, clip: float, sum_sigma: float, key: NoiseKey) -> torch.Tensor: ...

    def round_result(
        self, pending: PendingRound, update: np.ndarray, batch_sizes: list[int], clip: float,
        loss_sum: float, nonfinite: int = 0,
    ) -> RoundResult: ...


def compute_with_kept_sums(trainer: SumTrainer, pending: PendingRound, sums: RoundSums | None,
                           upto: float = 1.0) -> RoundResult | None:
    """``pending``'s update from its kept sums (``upto >= 1``), or its records due before
    ``upto`` summed and kept (None), computing only the records not kept yet and those a
    split moved: each record's clipped gradient at the ``w`` of the segment it is due in,
    less the round's local progress before its step, one noise draw a step (its key's). The
    plain path's values up to float rounding. Adaptive clipping's norm is replayed from the
    round's start (:attr:`~fedsim.training.rounds.PendingRound.adaptive_before`) for the
    steps done, so that calls for the parts of a round leave it as one call does.

    ``sums`` None: a split round that keeps none, computed whole (``upto`` 1) from the
    adaptive norm the trainer holds, each step summed onto its noise and dropped once added
    to the round's sum (:func:`_noised_step`)."""
    round_index, local_steps = pending.round_index, trainer.local_steps
    if sums is None:
        assert upto >= 1.0, "a round that keeps no sums is computed whole"
    else:
        trainer.restore_adaptive_state(pending.adaptive_before)
        # Only the latest segment's start points stay (the records of earlier ones are
        # computed, as parts come in order; a direct caller's split recomputes what it
        # needs), and after a split only those of the steps it did not move (a step's start
        # point moves only with an earlier step's sum): at most a start point a later step.
        latest = pending.segments[-1]
        sums.starts = {key: start for key, start in sums.starts.items()
                       if key[1] is latest and key[0] / local_steps < sums.cut}
    sum_sigma = trainer.sum_sigma(pending.steps[0].sigma)
    accumulated: torch.Tensor | None = None
    batch_sizes: list[int] = []
    loss_sum, clip, nonfinite = 0.0, math.nan, 0
    for step, draws in enumerate(pending.draws):
        clip = trainer.clip_for(round_index)
        if sums is None:
            kept = _noised_step(trainer, pending, step, draws, accumulated, clip, sum_sigma)
        else:
            kept = _step_sum(trainer, sums, pending, step, draws, accumulated, clip,
                             min(upto, (step + 1) / local_steps))
            if kept.until < (step + 1) / local_steps:
                # The step is part done, the rest waits for its points; the later steps
                # start from its end, so nothing of them can be kept meanwhile. Every sum
                # kept now holds its records at the round's segments: the split is applied.
                sums._steps[step + 1:] = [None] * (local_steps - step - 1)
                sums.cut = math.inf
                return None
        if kept.noised is None:  # drawn once a done step, not again for each later part
            kept.noised = trainer.step_noise(clip, sum_sigma, draws.noise).add_(kept.total)
        total = kept.noised
        size = len(draws.indices)
        if draws.count_noise is not None:
            trainer.update_adaptive_clip(kept.within, size, clip, draws.count_noise)
        loss_sum += kept.loss_sum
        nonfinite += kept.nonfinite
        if accumulated is None:  # a kept step's noisy sum stays for the round's later parts
            accumulated = total if sums is None else total.clone()
        else:
            accumulated.add_(total)
        batch_sizes.append(size)
    if sums is not None:
        sums.cut = math.inf
    assert accumulated is not None  # local_steps >= 1
    return trainer.round_result(pending, accumulated.to("cpu", torch.float32).numpy(),
                                batch_sizes, clip, loss_sum, nonfinite)


class _Step:
    """One step's records and start points for this compute (``sums`` None: nothing kept)."""

    def __init__(self, trainer: SumTrainer, sums: RoundSums | None, pending: PendingRound,
                 step: int, draws: StepDraws, accumulated: torch.Tensor | None,
                 clip: float) -> None:
        self.trainer, self.sums, self.pending, self.step = trainer, sums, pending, step
        self.clip = clip
        self.indices = draws.indices
        self.phases = trainer.record_phases(draws.indices, pending.round_index)
        self.times = (step + self.phases) / trainer.local_steps  # as step_segments has them
        self.end = (step + 1) / trainer.local_steps
        self.count = draws.count_noise is not None
        self._accumulated = accumulated

    def bound(self, upto: float) -> float:
        """The mask's upper bound for the records due before ``upto``: every record of the
        step at its end (a phase just below 1 may round to the end itself)."""
        return math.inf if upto >= self.end else upto

    def start(self, segment: Segment) -> np.ndarray:
        """The float32 point ``segment``'s records of this step are computed at: its ``w``
        less the round's progress before the step (the plain path's arithmetic). Kept for the
        round's next parts (:attr:`RoundSums.starts`) until a split reaches the step; not
        kept without sums (computed again in the rare step summed again)."""
        if self._accumulated is None:  # the first step's: the segment's w itself
            return np.asarray(segment.params, dtype=np.float32)
        starts = None if self.sums is None else self.sums.starts
        key = (self.step, segment)  # the segment itself: its params stay alive while kept
        if starts is not None and key in starts:
            return starts[key]
        # w - lr * progress in float64, in place: two model-sized float64 vectors at most
        progress = self._accumulated.to("cpu", torch.float64, copy=True)
        base = torch.from_numpy(np.asarray(segment.params, dtype=np.float32)
                                .astype(np.float64))
        start = base.sub_(progress.mul_(self.trainer.lr_for(self.pending.round_index))) \
            .to(torch.float32).numpy()
        if starts is not None:
            starts[key] = start
        return start

    def add(self, into: torch.Tensor, segments: tuple[Segment, ...], low: float, high: float,
            exclude: torch.Tensor | None = None) -> _Part | None:
        """Add the clipped sum of this step's records due in ``[low, high)``, each at its
        segment among ``segments``, to ``into``, leaving out those whose rows are in
        ``exclude`` (None: no record is due there)."""
        mine = (self.times >= low) & (self.times < high)
        if not bool(mine.any()):
            return None
        indices, phases = self.indices[mine], self.phases[mine]
        within, loss_sum, nonfinite = 0, 0.0, 0
        dropped: list[torch.Tensor] = []
        for k, group in step_segments(list(segments), self.step, self.trainer.local_steps,
                                      indices, phases):
            if exclude is not None:
                group = group[~torch.isin(self.trainer.rows_of(group), exclude)]
            self.trainer.load_params(self.start(segments[k]))
            part = self.trainer.clipped_sum_into(group, self.clip, into)
            within += part.within_clip if self.count else 0
            loss_sum += part.loss_sum
            nonfinite += part.nonfinite
            if part.dropped is not None:
                dropped.append(part.dropped)
        if self.sums is not None:
            self.sums.records_computed += len(indices)
        return _Part(within, loss_sum, nonfinite, torch.cat(dropped) if dropped else None)

    def finite_sum(self, segments: tuple[Segment, ...], low: float, high: float,
                   fresh: Callable[[], torch.Tensor]) -> tuple[torch.Tensor, _Part | None]:
        """The clipped sum of this step's records due in ``[low, high)`` added onto a
        ``fresh()`` vector (zeros, or the step's noise from its key), as the plain path sums
        a step: a record with a non-finite norm contributes zero, and where that made the sum
        not finite (0 x inf), the sum again onto a new ``fresh()`` without it (its
        ``nonfinite`` counts those records either way)."""
        total = fresh()
        part = self.add(total, segments, low, high)
        if part is None or part.dropped is None or bool(torch.isfinite(total).all()):
            return total, part
        total = fresh()
        again = self.add(total, segments, low, high, exclude=part.dropped)
        assert again is not None
        return total, _Part(again.within, again.loss_sum, part.nonfinite, part.dropped)


def _noised_step(trainer: SumTrainer, pending: PendingRound, step: int, draws: StepDraws,
                 accumulated: torch.Tensor | None, clip: float, sum_sigma: float) -> _StepSum:
    """Step ``step`` of a round that keeps no sums, whole: its records at the round's
    segments summed onto the step's noise (``total`` and ``noised`` alike), the noise drawn
    again from its key where the step is summed again without a non-finite record."""
    here = _Step(trainer, None, pending, step, draws, accumulated, clip)
    value = _whole(here, tuple(pending.segments), 1.0,
                   lambda: trainer.step_noise(clip, sum_sigma, draws.noise))
    value.noised = value.total
    return value


def _step_sum(trainer: SumTrainer, sums: RoundSums, pending: PendingRound, step: int,
              draws: StepDraws, accumulated: torch.Tensor | None, clip: float,
              upto: float) -> _StepSum:
    """Step ``step``'s kept sum of its records due before ``upto`` (its end at most), brought
    up to the round's segments: kept as it is when it reaches ``upto`` and no split reached
    it; its records from a split on taken out and added again at the new segments when one
    did; extended by the records not summed yet; computed from its start when a split came
    before the step (or nothing is kept)."""
    local_steps = trainer.local_steps
    segments = tuple(pending.segments)
    kept = sums._steps[step]
    if kept is not None and sums.cut >= kept.until and kept.until >= upto:
        return kept
    here = _Step(trainer, sums, pending, step, draws, accumulated, clip)
    if kept is None or sums.cut <= step / local_steps:
        value = _whole(here, segments, upto)
    elif sums.cut < kept.until:
        value = _moved(here, kept, segments, sums.cut, upto)
    else:
        value = _extended(here, kept, segments, upto)
    sums._steps[step] = value
    return value


def _whole(here: _Step, segments: tuple[Segment, ...], upto: float,
           fresh: Callable[[], torch.Tensor] | None = None) -> _StepSum:
    """The sum of the step's records due before ``upto``, computed from none (onto zeros, or
    onto ``fresh()``)."""
    total, part = here.finite_sum(segments, -math.inf, here.bound(upto),
                                  fresh or here.trainer.zero_gradient)
    if part is None:
        return _StepSum(total, 0, 0.0, 0, upto, segments)
    return _StepSum(total, part.within, part.loss_sum, part.nonfinite, upto, segments)


def _moved(here: _Step, kept: _StepSum, segments: tuple[Segment, ...], cut: float,
           upto: float) -> _StepSum:
    """``kept`` less its records due in ``[cut, kept.until)`` at the segments it summed them
    at, plus the step's records due in ``[cut, upto)`` at the round's segments; computed from
    none if any of them has a non-finite gradient norm."""
    removed = here.trainer.zero_gradient()
    out = here.add(removed, kept.segments, cut, here.bound(kept.until))
    added = here.trainer.zero_gradient()
    back = here.add(added, segments, cut, here.bound(upto))
    if any(p is not None and p.nonfinite for p in (out, back)):
        return _whole(here, segments, upto)
    total = kept.total.sub_(removed).add_(added)
    within = kept.within - (out.within if out else 0) + (back.within if back else 0)
    loss = kept.loss_sum - (out.loss_sum if out else 0.0) + (back.loss_sum if back else 0.0)
    return _StepSum(total, within, loss, kept.nonfinite, upto, segments)


def _extended(here: _Step, kept: _StepSum, segments: tuple[Segment, ...],
              upto: float) -> _StepSum:
    """``kept`` plus the step's records due in ``[kept.until, upto)`` at the round's segments
    (those of the records it holds are unchanged: no split reached them). A new record with a
    non-finite gradient norm contributes zero; where that made the new records' sum not
    finite, their sum again without it (the plain path does the whole step again: the same
    sum, since the records kept contributed finite values; a paced round's parts never
    compute a part twice over, whatever its records)."""
    added, more = here.finite_sum(segments, kept.until, here.bound(upto),
                                  here.trainer.zero_gradient)
    if more is None:
        return _StepSum(kept.total, kept.within, kept.loss_sum, kept.nonfinite, upto, segments)
    return _StepSum(kept.total.add_(added), kept.within + more.within,
                    kept.loss_sum + more.loss_sum, kept.nonfinite + more.nonfinite, upto,
                    segments)
