"""A DP round between its start and its result, and the two protocols that connect a client's
trainer (:mod:`fedsim.training.local`) with the batched pass (:mod:`fedsim.training.batched`).

A round is *begun* with its randomness (:class:`StepDraws`: batches and noise keys; drawn at
once, or for a round waiting in a batcher when its pass first reads them, the same values) and
*computed* when its result is taken: :class:`PendingRound` holds it in between. A pending
round is computed by its :class:`RoundTrainer` alone, or, if a :class:`RoundQueue` (the
:class:`~fedsim.training.batched.RoundBatcher`) holds it, together with the other rounds
pending there. Neither the trainer nor the batcher imports the other: each sees the other
through the protocol here.

**Segments (the interrupt rule ``switch``).** Van Dijk & Nguyen (Alg. 1) computes the gradients of a
round one after the other, "each gradient is computed based on w which is the last received
global model from the server through the interrupt service routine", and the routine "will
replace the locally kept model w by a received global model w-hat. This may happen in the
middle of a round." A round whose client receives w-hat at a fraction ``f`` of its compute time
is therefore split (:meth:`PendingRound.switch`): the gradients due before ``f`` are computed
at the old ``w``, the rest at ``w-hat``. A round of ``L`` local steps gives step ``s`` the
``s``-th ``1/L`` of its time, and inside a step each record is due at its phase
(:func:`record_phase`), as if the client computed its batch in an order fixed by the records.
Which model a record's gradient uses depends on that record's phase alone, never on the rest of
the batch (with Poisson sampling its size is private; the paper: "the different gradient
computations a_h in U should be independent of one another"), nor on the record's place in the
client's data; the coupling argument that keeps the round's sensitivity is
:func:`record_phase`'s.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
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
    "KeptSums",
    "Segment",
    "PendingRound",
    "RoundQueue",
    "RoundResult",
    "RoundTrainer",
    "StepDraws",
    "phase_generator",
    "draw_phase_offsets",
    "record_phase",
    "step_segments",
]

_ROTATION = 0.41421356237309503  # sqrt 2 - 1: irrational, so every record is sometimes due early
_PHASE_STREAM = b"fedsim/record-phases"


def record_phase(offsets: torch.Tensor, round_index: int) -> torch.Tensor:
    """When, as a fraction of its step's compute time, each record is due in round
    ``round_index``: ``frac(u + (round + 1) (sqrt 2 - 1))`` (float64), ``u`` the record's own
    offset (``offsets``, one per record: :func:`draw_phase_offsets`). Nothing else enters: not the
    record's position in the client's data or in the batch, not the batch's (private, under
    Poisson sampling) realised size, not the other records.

    Why the sensitivity (C for Poisson batches and add/remove neighbours, 2C for fixed-size
    batches and replace-one neighbours) is that of the unsplit round. The offsets are i.i.d.
    uniform, drawn once per record from the client's private generator and never released, so
    the mechanism run on a data set ``D`` is the mixture, over offsets attached to its records,
    of the mechanism with those offsets fixed (drawing them in storage order gives the same joint
    law as attaching them to the records, as with Poisson's coins). Couple neighbours ``D`` and
    ``D' = D + {x}`` (add/remove) or ``D' = D - {x} + {x'}`` (replace) so that every record of
    both has the same offset and the same sampling coins in either run. Then in every round every
    such record is sampled alike, is due at the same phase, and so falls in the same segment; the
    split fraction ``f`` and the models ``w`` and ``w-hat`` of the segments are functions of the
    public schedule and of earlier releases (van Dijk & Nguyen, after Alg. 1: ``w-hat`` enters
    "through its dependency on the global model ... without weakening the DP guarantee", by
    post-processing; their section 4 adversary even knows "when and how the interrupt service
    routine overwrites the local model"). The round's clipped sums under ``D`` and ``D'``
    therefore differ by ``x``'s clipped gradient alone (norm <= C), or,
    replacing, by ``x``'s minus ``x'``'s (<= 2C): each round, given the past, is the Gaussian
    mechanism the accountant charges (a subsampled one under Poisson), for every fixed offsets,
    and their adaptive composition is the run's ``C_q(G_{1/sigma})^(x)T`` bound. Mixing over
    offsets drawn alike for ``D`` and ``D'`` keeps it: a test's errors are averages of the
    fixed-offset errors ``(alpha_u, beta_u)`` with ``beta_u >= f(alpha_u)``, and ``f`` is
    convex, so ``beta >= f(alpha)``. The argument needs the offsets secret: whoever knew them by
    position (a public seed) could not be given the coupling, since removing a record moves
    every later position; so in deployment they come from OS entropy
    (:func:`draw_phase_offsets`). A phase fixed by the record's *index* (the rule before this
    one) is exactly that: removing row 0 of a 1,000-record client moved 764 other records to
    the other model of a round split at 1/2, a sensitivity far above C.

    The rotation by the round keeps no record always early (always at the old ``w``): it is
    public and the same for every record.
    """
    values = offsets.to(torch.float64) + (round_index + 1) * _ROTATION
    return values - torch.floor(values)


def phase_generator(generator: torch.Generator) -> torch.Generator:
    """The stream of a client's phase offsets: a CPU generator seeded from a BLAKE2b digest of
    ``generator``'s seed. It is as private as the client's batches and noise (the simulator's
    ``client/<id>/train`` of the seed tree; in deployment a generator keyed from ``os.urandom``,
    :func:`~fedsim.training.dpsgd.secure_generator`), independent of their stream, and draws
    none of its numbers (runs with and without interrupts sample and noise alike)."""
    seed = generator.initial_seed() & (2**64 - 1)
    digest = hashlib.blake2b(_PHASE_STREAM + seed.to_bytes(8, "little"), digest_size=8).digest()
    stream = torch.Generator()
    stream.manual_seed(int.from_bytes(digest, "little"))
    return stream


def draw_phase_offsets(num_records: int, generator: torch.Generator) -> torch.Tensor:
    """One i.i.d. uniform offset per record (float64, in storage order) from the phase stream
    of the client's private ``generator`` (:func:`phase_generator`; see :func:`record_phase`)."""
    return torch.rand(num_records, generator=phase_generator(generator), dtype=torch.float64)


@dataclass(frozen=True, eq=False)
class Segment:
    """Part of a round computed at one ``w``: from ``start`` (a fraction of the round's compute
    time) to the next segment's start."""

    start: float
    params: np.ndarray


def step_segments(
    segments: list[Segment], step: int, local_steps: int, indices: torch.Tensor,
    phases: torch.Tensor,
) -> list[tuple[int, torch.Tensor]]:
    """The records ``indices`` of step ``step`` grouped by the segment they are due in, given
    their ``phases`` this round (:func:`record_phase`, aligned with ``indices``): ``(segment
    index, indices)`` for every segment with at least one record, in segment order."""
    if len(segments) == 1:
        return [(0, indices)]
    times = (step + phases) / local_steps
    starts = torch.tensor([seg.start for seg in segments], dtype=torch.float64)
    owner = torch.bucketize(times, starts, right=True) - 1  # the last segment started by then
    owner.clamp_(min=0)
    return [(k, indices[owner == k]) for k in range(len(segments)) if bool((owner == k).any())]


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
    nonfinite_examples: int = 0
    """Examples whose gradient norm was not finite and that contributed zero (private)."""
    zero_update: bool = False
    """``update`` is all zeros (training replaced by its cost): the client applying it keeps
    referring to the model it holds instead of copying it (``w - eta * 0 == w`` exactly)."""


class KeptSums(Protocol):
    """A round's clipped sums (:class:`~fedsim.training.kept_sums.RoundSums`), kept so that a
    switch has only the records it moves computed again."""

    @property
    def points_per_round(self) -> int:
        """Where in the round a deployed client lets a w-hat take effect: ``k / this``."""
        ...

    def forget_from(self, fraction: float) -> None:
        """A split at ``fraction``: the records due from it on are to be computed again."""
        ...


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

    def record_phases(self, indices: torch.Tensor, round_index: int) -> torch.Tensor:
        """The phases of records ``indices`` in round ``round_index`` (:func:`record_phase`)."""
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

    def sums_for(self, pending: PendingRound) -> KeptSums | None:
        """Empty sums to keep ``pending``'s computes in (None: too large to keep)."""
        ...

    def advance(self, pending: PendingRound, upto: float) -> RoundResult | None:
        """Sum ``pending``'s records due before ``upto`` into its kept sums; its result once
        ``upto`` reaches the round's end."""
        ...

    def adaptive_state(self) -> float | None:
        """Adaptive clipping's current norm (None without it), to undo a discarded compute."""
        ...

    def restore_adaptive_state(self, state: float | None) -> None:
        """Put adaptive clipping's norm back to ``state``."""
        ...

    def round_result(
        self, pending: PendingRound, update: np.ndarray, batch_sizes: list[int], clip: float,
        loss_sum: float, nonfinite: int = 0,
    ) -> RoundResult:
        """The result of ``pending`` once its update is computed."""
        ...


class RoundQueue(Protocol):
    """Where pending rounds wait to be computed together
    (:class:`~fedsim.training.batched.RoundBatcher`)."""

    def submit(self, pending: PendingRound) -> None: ...

    def discard(self, pending: PendingRound) -> None: ...

    def flush(self, due: PendingRound | None = None) -> None:
        """Compute every waiting round that can be computed now, and ``due``."""
        ...


@dataclass(frozen=True)
class StepDraws:
    """The randomness of one DP step, the values a draw when its round begins gives (made then,
    or at the round's batched pass: :attr:`PendingRound.draws`)."""

    indices: torch.Tensor
    """The batch (record indices into the trainer's data)."""
    noise: NoiseKey
    """Key of the Gaussian noise added to the clipped sum."""
    count_noise: NoiseKey | None
    """Key of adaptive clipping's noise on the unclipped count (None without it)."""


class PendingRound:
    """A begun round whose compute may wait
    (:meth:`~fedsim.training.local.LocalTrainer.begin_round`).

    The virtual-time runtime lets a round's compute time pass before asking for its update,
    so the rounds of many clients that overlap in virtual time can be computed together
    (:class:`~fedsim.training.batched.RoundBatcher`); the values are those of draws made at
    the round's start (:attr:`draws`), whatever the grouping, up to floating-point summation
    order.
    """

    def __init__(
        self,
        trainer: RoundTrainer,
        params: np.ndarray,
        round_index: int,
        steps: list[GaussianStep],
        draws: list[StepDraws] | Callable[[], list[StepDraws]],
    ) -> None:
        self.trainer = trainer
        self.params = params
        self.round_index = round_index
        self.steps = steps
        self._draws: list[StepDraws] | None = None if callable(draws) else draws
        self._draw: Callable[[], list[StepDraws]] | None = draws if callable(draws) else None
        self.segments = [Segment(0.0, params)]
        """Where the round's ``w`` changes (:meth:`switch`); one segment unless interrupted."""
        self.recomputed = 0
        """Times a computed result was discarded by a later :meth:`switch` (wasted work)."""
        self.batcher: RoundQueue | None = None
        self._queue: RoundQueue | None = None
        self.kept: KeptSums | None = None
        """Its computed sums, where kept (:meth:`keep_sums`)."""
        self.adaptive_before: float | None = trainer.adaptive_state()
        """Adaptive clipping's norm when the round began (None without it)."""
        self._outcome: RoundResult | Exception | None = None

    @property
    def draws(self) -> list[StepDraws]:
        """The round's randomness, per step. Given as a function (a round that waits in a
        batcher), it is drawn at the first read: the batcher reads the draws of a pass's
        rounds one after the other, where each client's drawing them as its round began ran
        the generator's code cold, between other rounds' model-sized vectors (57 + 22 us a
        round against a few warm: docs/SCALE.md, session 65). Nothing but its own rounds, one
        at a time, draws from a client's generator, and :meth:`cancel` draws what was not yet
        drawn, so every round gets the values it got when all were drawn at its start."""
        if self._draws is None:
            assert self._draw is not None
            self._draws, self._draw = self._draw(), None
        return self._draws

    @property
    def sample_grads(self) -> int:
        """Per-example gradients the round computes, known before it is computed (reading
        it makes the draws)."""
        return sum(d.indices.shape[0] for d in self.draws)

    @property
    def done(self) -> bool:
        return self._outcome is not None

    def complete(self, outcome: RoundResult | Exception) -> None:
        """Record the round's result (or the error that stopped it)."""
        self._outcome = outcome
        self.batcher = None

    def switch(self, fraction: float, params: np.ndarray) -> None:
        """The interrupt rule ``switch``: the gradients due from ``fraction`` of the round's
        compute time on are computed at ``params`` (the received ``w-hat``). A fraction >= 1
        changes nothing; a round already computed is computed again (its first result was
        taken too early: counted in :attr:`recomputed`)."""
        if not fraction < 1.0:
            return
        fraction = max(0.0, float(fraction))
        if self.kept is not None:
            self.kept.forget_from(fraction)
        while self.segments and self.segments[-1].start >= fraction:
            self.segments.pop()
        self.segments.append(Segment(fraction, params))
        self.params = self.segments[0].params
        if isinstance(self._outcome, RoundResult):  # an error stays the round's outcome
            self.recomputed += 1
            self._outcome = None
            self.trainer.restore_adaptive_state(self.adaptive_before)
            if self._queue is not None:
                self._queue.submit(self)

    def keep_sums(self) -> int:
        """Keep the round's clipped sums from now on, so that a :meth:`switch` has only the
        records it moves computed again (:mod:`fedsim.training.kept_sums`; a client that
        computes its round before its release time: deployed). Returns at how many equal
        points of the round a deployed client lets a w-hat take effect (0: nothing kept, a
        switch recomputes the whole round; a round waiting in a batcher is computed there)."""
        if self.kept is None and self.batcher is None and self._queue is None:
            self.kept = self.trainer.sums_for(self)
        return 0 if self.kept is None else self.kept.points_per_round

    def advance(self, upto: float) -> None:
        """Compute the records due before fraction ``upto`` of the round now, at the models
        of their segments so far, into the kept sums (:meth:`keep_sums` first): a deployed
        client computes its round part by part as its slot passes
        (:mod:`fedsim.training.kept_sums`). Without kept sums, nothing (the round is
        computed whole when its result is taken)."""
        if self.kept is not None and self._outcome is None:
            try:
                done = self.trainer.advance(self, upto)
            except Exception as exc:  # the error belongs to this round's client alone
                self.complete(exc)
                return
            if done is not None:  # the last part: the result, taken by result()
                self.complete(done)

    def result(self) -> RoundResult:
        """The round's update, computing it (and the batch it waits in) if not done yet."""
        if self._outcome is None:
            if self.batcher is not None:
                self.batcher.flush(self)
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
        """Forget the round (its client crashed while it ran): never charged, never released.
        A round computed before its end, in whole or in part (a deployed one always; a
        simulated one when a batched pass took it early), moved adaptive clipping's norm:
        that goes back, or a later round's clip would depend on a noisy count no one paid
        for, and a simulation's on how its rounds were grouped (two reviews). Simulated runs
        with adaptive clipping and crashes changed at 52c3e46; one not yet computed is
        dropped from its batcher. Its randomness is drawn if it was not yet (:attr:`draws`):
        the client's later rounds draw what they would have."""
        self.draws  # noqa: B018 - draws them
        if self.batcher is not None:
            self.batcher.discard(self)
        self.batcher = None
        self._queue = None
        self.trainer.restore_adaptive_state(self.adaptive_before)

    def queued(self, queue: RoundQueue) -> None:
        """Called by ``queue`` when the round joins it (which computes it whole: no kept sums)."""
        self.batcher = self._queue = queue
        self.kept = None


class DoneRound:
    """A round whose result is known when it begins (nothing left to compute)."""

    def __init__(self, result: RoundResult) -> None:
        self._result = result
        self.sample_grads = result.sample_grads

    def result(self) -> RoundResult:
        return self._result

    def switch(self, fraction: float, params: np.ndarray) -> None:
        """Nothing is left to compute: a received ``w-hat`` changes nothing."""

    def keep_sums(self) -> int:
        """One point: nothing to compute, and a model arriving mid-round changes nothing."""
        return 1

    def advance(self, upto: float) -> None:
        """Nothing is left to compute."""

    def cancel(self) -> None:
        pass
