"""Many clients' DP-SGD rounds computed together: one pass for the rounds that overlap.

In a simulation every client trains its own copy of one model on its own small batches. For
small models a round computed alone is dominated by per-operation costs (dispatch of some
forty tensor operations, cold parameter vectors), not arithmetic. The virtual-time runtime
lets rounds wait: a client begins its round
(:meth:`~fedsim.training.local.LocalTrainer.begin_round`; the round's randomness is drawn when
the pass first reads it, the pass's rounds one after the other, with the values a draw at the
round's start gives), lets the round's compute time pass, and only then asks for the update;
by then the rounds other clients began meanwhile are pending too, and the first request
computes them all in one pass
(:class:`~fedsim.training.batched_pass.ChainPass`: the examples of all rounds laid end to end,
each round the same DP-SGD step as on its own, up to floating-point summation order).
On hetero-100 (about 20 rounds a pass) this costs about 0.6 of computing the rounds one by
one (``benchmarks/simulator.py``). Models other than a
chain of ``Linear`` layers and elementwise activations, rounds of several local steps or of
per-example local updates, and a pass of one round are computed alone, exactly as by
:meth:`~fedsim.training.local.LocalTrainer.run_round`.

**Interrupted rounds** (the interrupt rule ``switch``, :mod:`fedsim.training.rounds`): each
segment of a one-step round is a job of the pass like a round (its records, its own ``w``);
the round's noise rides on its first segment and the segments' sums are added. A round that a
``w-hat`` may still split (its end, :meth:`RoundSchedule.ends_at`, after the horizon of its client:
the earliest time a global model can still reach that client, which the runtime supplies from
the messages in flight to it and the server's next possible publish) is left pending until it
cannot; computing it earlier would be wasted when the split comes. A split that comes
after all (the horizon was not a true bound) has the round computed again - exact either way,
counted in ``timing.json``'s ``rounds_recomputed``. Under time windows the horizon is exact
(none recomputed); under on-arrival policies it ignores updates not yet sent (any round's end
can publish a model), a trade: on the async study's population about a third of the rounds
are computed twice, which costs less than computing every round alone.
"""

from __future__ import annotations

import functools
import heapq
import math
from collections.abc import Callable, Sequence
from typing import Protocol

import numpy as np
import torch
from torch import nn

from fedsim.errors import ModelError
from fedsim.training.batched_pass import ChainPass, PassJob, PassResult, released, round_ranges
from fedsim.training.persample.chain import (
    chain_applies,
    chain_modules,
    chain_state,
    flattens_input,
    linear_chain,
)
from fedsim.training.rounds import PendingRound, step_segments

__all__ = ["PassResult", "RoundBatcher", "RoundSchedule", "batchable_layers"]

class RoundSchedule(Protocol):
    """The runtime's record of when its pending rounds end and when a model can reach them
    (the batcher asks; it never stores the runtime's times on the rounds)."""

    def ends_at(self, round_: PendingRound) -> float | None:
        """When the round's compute time ends, if a ``w-hat`` may split it until then; None:
        it will not be split (it may be computed at any time)."""
        ...

    def horizon(self, rounds: Sequence[PendingRound]) -> Sequence[float]:
        """For each round, the earliest time a global model can still reach its client
        (``inf``: never)."""
        ...

# Rounds per pass, and per flush, at most (bounds the activations held at once, and the
# results computed before their rounds end).
_MAX_PASS = 128


def batchable_layers(model: nn.Module) -> list[nn.Module] | None:
    """The modules of ``model`` as a chain of ``Linear`` layers and elementwise activations on
    flattened inputs (:func:`~fedsim.training.persample.chain.linear_chain`) whose parameters
    are float32 (rounds read them from float32 vectors), or None when the model is anything
    else (it is then computed alone)."""
    chain = linear_chain(model)
    if chain is None or any(p.dtype != torch.float32 for p in model.parameters()):
        return None
    return chain


def _jobs(pending: PendingRound) -> list[PassJob]:
    """The round's jobs: one per segment with records (and the first always, for the noise)."""
    batch, segments = pending.draws[0].indices, pending.segments
    parts = [(0, batch)] if len(segments) == 1 else step_segments(
        segments, 0, 1, batch, pending.trainer.record_phases(batch, pending.round_index))
    if not parts:
        parts = [(0, batch)]
    return [PassJob(pending, segments[k].params, indices, n == 0)
            for n, (k, indices) in enumerate(parts)]


class RoundBatcher:
    """Pending rounds of clients that share ``model``; :meth:`flush` computes them all (the
    :class:`~fedsim.training.rounds.RoundQueue` of their trainers).

    A round joins with :meth:`submit` (done by ``LocalTrainer.begin_round``), leaves when its
    client crashes (:meth:`discard`), and is computed at the first ``result()`` of any pending
    round. Which rounds share a pass depends only on which are pending, so a deterministic
    runtime stays deterministic.
    """

    def __init__(self, model: nn.Module, schedule: RoundSchedule | None = None, *,
                 measure: Callable[[np.ndarray], float] | None = None) -> None:
        self.model = model
        self.measure = measure
        """Called with each whole round's released update (an array owning its memory) right
        after the pass made it, while it is in cache: the runtime gives it
        :func:`fedsim.protocol.norms.measured_for_sender`, whose norm the client's own check
        of the same array later takes (one read of a cold 400 KB vector less a round). The
        pass never writes an update after measuring it."""
        self.schedule = schedule
        """The runtime's record of its rounds' ends and horizons (None: no round is ever
        split, each may be computed at any time)."""
        self.chain = batchable_layers(model)
        self._modules = chain_modules(model, self.chain) if self.chain is not None else []
        """Every module a call of the model runs through (a hook on one: computed alone)."""
        self._state = chain_state(self._modules)
        """The chain as recognised (a model changed since: computed alone)."""
        self._flattens = flattens_input(model)
        """Whether the model flattens its inputs (if not, a chain only for (B, d) features)."""
        self.num_params = sum(p.numel() for p in model.parameters())
        self.device = next(model.parameters()).device
        """Where every tensor of a pass is made (the model's device)."""
        self._chain_pass = (None if self.chain is None
                            else ChainPass(model, self.chain, measure=measure))
        self._pending: dict[int, PendingRound] = {}
        self.rounds_batched = 0
        """Rounds computed in a batched pass so far (the others were computed alone)."""
        self.batches = 0
        """Batched passes so far."""
        self.recomputed = 0
        """Computed rounds a later ``w-hat`` split (their first compute was wasted)."""

    def submit(self, pending: PendingRound) -> None:
        if pending.recomputed:
            self.recomputed += 1
        pending.queued(self)
        self._pending[id(pending)] = pending

    def discard(self, pending: PendingRound) -> None:
        self._pending.pop(id(pending), None)

    @property
    def pending(self) -> int:
        """Rounds waiting to be computed."""
        return len(self._pending)

    def _batchable(self, pending: PendingRound, applies: Callable[[int], bool]) -> bool:
        """Whether ``pending`` may join a batched pass (``applies``: :func:`chain_applies`
        for a features' dimension, as of this flush)."""
        trainer = pending.trainer
        return (
            self.chain is not None
            and trainer.model is self.model
            and applies(trainer.features.dim())
            and trainer.local_steps == 1
            and trainer.per_example_steps == 1
            and trainer.features.device == self.device
        )

    def _held(self, due: PendingRound | None) -> tuple[set[int], dict[int, float]]:
        """The pending rounds a ``w-hat`` may still split (they stay pending), and the ends of
        the splittable ones (by ``id``), as the runtime's schedule says."""
        schedule = self.schedule
        if schedule is None:
            return set(), {}
        ends: dict[int, float] = {}
        for key, r in self._pending.items():
            if r is not due and (end := schedule.ends_at(r)) is not None:
                ends[key] = end
        splittable = [self._pending[key] for key in ends]
        if not splittable:
            return set(), ends
        bounds = schedule.horizon(splittable)
        return {id(r) for r, bound in zip(splittable, bounds, strict=True)
                if ends[id(r)] > bound}, ends

    def flush(self, due: PendingRound | None = None) -> None:
        """Compute every pending round that no ``w-hat`` can split any more, and ``due`` (each
        computed round's ``result()`` then returns at once)."""
        held, ends = self._held(due)
        pending = [r for key, r in self._pending.items() if key not in held]
        if len(pending) > _MAX_PASS:
            # One pass a flush, of the rounds that end soonest (those without an end first, in
            # the order they began): a result computed early waits in memory until its round
            # ends, and computing every eligible round of 10^4 clients at once held 2 GB more.
            # (heapq.nsmallest is sorted(...)[:n], without sorting the 10^4 others)
            soonest = heapq.nsmallest(_MAX_PASS, range(len(pending)), key=lambda k: (
                pending[k] is not due, ends.get(id(pending[k]), -math.inf), k))
            pending = [pending[k] for k in sorted(soonest)]
        for round_ in pending:
            del self._pending[id(round_)]
            # The pass's draws one after the other (PendingRound.draws: warm, not one a round)
            round_.draws  # noqa: B018 - draws them
        jobs: list[PassJob] = []
        # The chain's rule, once a flush for each features' dimension, not once a round (its
        # state comparison was 2.5% of a 1,000-client run's CPU under cProfile), and again
        # after a round computed alone (its user code, a loss function, may change the model).
        applies = functools.cache(functools.partial(
            chain_applies, self._modules, self._state, self._flattens))
        for round_ in pending:
            if self._batchable(round_, applies):
                jobs.extend(_jobs(round_))
            else:
                round_.compute_alone()
                applies.cache_clear()
        # A round's segments stay in one pass (their sums are added after it).
        start = 0
        while start < len(jobs):
            stop = min(start + _MAX_PASS, len(jobs))
            while stop < len(jobs) and jobs[stop].pending is jobs[stop - 1].pending:
                stop += 1
            self._compute(jobs[start:stop])
            start = stop

    def _compute(self, jobs: list[PassJob]) -> None:
        if len(jobs) == 1 or all(job.pending is jobs[0].pending for job in jobs):
            # nothing to share: the single-round engine, exactly as alone
            jobs[0].pending.compute_alone()
            return
        usable = []
        for job in jobs:
            shape = np.shape(job.params)
            if shape == (self.num_params,):
                usable.append(job)
            elif not job.pending.done:
                job.pending.complete(ModelError(
                    f"parameter vector has shape {shape}, the model needs ({self.num_params},)"))
        usable = [job for job in usable if not job.pending.done]
        if not usable:
            return
        try:
            updates, within, nonfinite, losses, finite, owners = self._pass(usable)
        except Exception as exc:  # a model or loss error: every round of the pass reports it
            for job in usable:
                job.pending.complete(exc)
            return
        self.batches += 1
        # Segments of one round are adjacent: their sums are added into the first's update.
        for k, end in round_ranges(usable):
            self._finish(usable[k:end], updates[k:end], within[k:end], nonfinite[k:end],
                         losses[k:end], finite[k:end], owners[k])

    def _pass(self, jobs: Sequence[PassJob]) -> PassResult:
        """One batched pass over ``jobs`` (:meth:`ChainPass.run`; a subclass may run it
        elsewhere: :class:`fedsim.runtime.simulated.ray_executor.RayRoundBatcher`)."""
        assert self._chain_pass is not None  # a batchable round needs the chain
        return self._chain_pass.run(jobs)

    def _finish(self, jobs: list[PassJob], updates: list[torch.Tensor], within: list[int],
                nonfinite: list[int], losses: list[float], finite: list[bool],
                owner: np.ndarray | None) -> None:
        """Complete one round from the jobs of its segments (``owner``: the numpy array
        whose memory the first segment's update is, if it has one)."""
        pending = jobs[0].pending
        if not all(finite):
            pending.complete(ModelError("parameter vector contains non-finite values"))
            return
        update = updates[0]
        for other in updates[1:]:
            update.add_(other)
        if any(nonfinite) and not bool(torch.isfinite(update).all()):
            # An example with a non-finite norm got factor 0, but its activations themselves
            # were not finite (0 * inf is nan): the single-round engine recomputes the round
            # without it, from the same draws.
            pending.compute_alone()
            return
        self.rounds_batched += 1
        trainer, draws = pending.trainer, jobs[0].draws
        size = draws.indices.shape[0]
        if draws.count_noise is not None:
            trainer.update_adaptive_clip(sum(within), size, jobs[0].clip, draws.count_noise)
        pending.complete(trainer.round_result(
            pending, released(update, owner, self.num_params), [size], jobs[0].clip,
            sum(losses), sum(nonfinite)))
