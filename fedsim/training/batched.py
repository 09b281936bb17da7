"""Many clients' DP-SGD rounds computed together: one pass for the rounds that overlap.

In a simulation every client trains its own copy of one model on its own small batches. For
small models a round computed alone is dominated by per-operation costs (dispatch of some
forty tensor operations, cold parameter vectors), not arithmetic. The virtual-time runtime
lets rounds wait: a client draws its round's randomness when the round starts
(:meth:`~fedsim.training.local.LocalTrainer.begin_round`), lets the round's compute time pass,
and only then asks for the update; by then the rounds other clients began meanwhile are
pending too, and the first request computes them all in one pass. The examples of all rounds
are laid end to end: activations, losses, per-example norms and clipping factors are computed
once for all of them, and only the products with a round's own weights run per round (read
straight from its parameter vector, the weight gradients added straight into its update).
On hetero-100 (about 20 rounds a pass) this costs about 0.6 of computing the rounds one by
one (``benchmarks/simulator.py``).

Each round is the same DP-SGD step as :func:`~fedsim.training.dpsgd.noisy_gradient` on its own
(same batch, same noise stream, same clipping rule ``min(1, C / (||g_i|| + 1e-6))`` and
sensitivity): the per-example gradient norms of a ``Linear`` layer on (B, d) inputs are
``||g_i||^2 (||a_i||^2 + 1)`` (Goodfellow 2015; the engine of
:mod:`fedsim.training.persample`), here for every example of every round at once. Results
equal the single round's up to floating-point summation order (tested). Models other than a
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
import itertools
import math
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol, TypeGuard

import numpy as np
import torch
from torch import nn

from fedsim.errors import ModelError
from fedsim.training.dpsgd import noise_std
from fedsim.training.gaussian import fill_noise, reference_rows
from fedsim.training.persample import LossFn, clip_factors, linear_sq_norms
from fedsim.training.persample.chain import (
    chain_applies,
    chain_modules,
    chain_state,
    flattens_input,
    linear_chain,
)
from fedsim.training.rounds import PendingRound, step_segments

__all__ = ["PassResult", "RoundBatcher", "RoundSchedule", "batchable_layers"]

PassResult = tuple[list[torch.Tensor], list[int], list[int], list[float], list[bool],
                   list["np.ndarray | None"]]
"""What a batched pass returns (:meth:`RoundBatcher._pass`)."""


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

# Parameter-free modules that act on each value alone: they commute with batching over clients.
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


def _input_grad(g: torch.Tensor, w: torch.Tensor, a: torch.Tensor, out: torch.Tensor) -> None:
    """``out`` := the gradient at the input ``a`` of ``a @ w.t() (+ b)`` given ``g`` at its
    output, computed as autograd's backward of ``addmm`` computes it (``mm_mat1_backward``:
    its column-major case too), so the values are the same."""
    if a.stride(0) == 1 and a.stride(1) == a.shape[0]:
        out.copy_(torch.mm(w.t(), g.t()).t())
    else:
        torch.mm(g, w, out=out)


class _Job:
    """One segment of a pending round of one step (the whole round unless it was split),
    resolved to what the batched pass needs; only the round's first job carries its noise."""

    def __init__(self, pending: PendingRound, params: np.ndarray, indices: torch.Tensor,
                 first: bool) -> None:
        trainer = pending.trainer
        self.pending = pending
        self.params = params
        self.draws = pending.draws[0]
        self.indices = indices
        self.size = indices.shape[0]  # (Tensor.__len__ is a Python call)
        self.first = first
        self.clip = trainer.clip_for(pending.round_index)
        sum_sigma = trainer.sum_sigma(pending.steps[0].sigma)
        self.scale = 1.0 / trainer.batch_size
        self.std = noise_std(trainer.sampling, self.clip, sum_sigma, trainer.batch_size)


def _jobs(pending: PendingRound) -> list[_Job]:
    """The round's jobs: one per segment with records (and the first always, for the noise)."""
    batch, segments = pending.draws[0].indices, pending.segments
    parts = [(0, batch)] if len(segments) == 1 else step_segments(
        segments, 0, 1, batch, pending.trainer.record_phases(batch, pending.round_index))
    if not parts:
        parts = [(0, batch)]
    return [_Job(pending, segments[k].params, indices, n == 0)
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
        self._linears = [m for m in self.chain if type(m) is nn.Linear] \
            if self.chain is not None else []
        """The chain's Linear layers, in order."""
        self._pieces = [p.numel() for m in self._linears for p in m.parameters()]
        """The sizes of the Linear layers' weights and biases in a parameter vector, in order."""
        self.device = next(model.parameters()).device
        """Where every tensor of a pass is made (the model's device)."""
        self._pending: dict[int, PendingRound] = {}
        self._buffers: dict[str, torch.Tensor] = {}
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
        jobs: list[_Job] = []
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

    def _scratch(self, name: str, shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
        """A buffer of the batcher, reused by every pass (fresh memory costs a page fault per
        4 KB, which small models feel); contents are whatever the last pass left."""
        size = math.prod(shape)
        buffer = self._buffers.get(name)
        if buffer is None or buffer.numel() < size or buffer.dtype != dtype:
            buffer = torch.empty(size, dtype=dtype, device=self.device)
            self._buffers[name] = buffer
        return buffer[:size].view(shape)

    def _compute(self, jobs: list[_Job]) -> None:
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
        for k, end in _round_ranges(usable):
            self._finish(usable[k:end], updates[k:end], within[k:end], nonfinite[k:end],
                         losses[k:end], finite[k:end], owners[k])

    def _finish(self, jobs: list[_Job], updates: list[torch.Tensor], within: list[int],
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
            pending, _released(update, owner, self.num_params), [size], jobs[0].clip,
            sum(losses), sum(nonfinite)))

    def _pass(self, jobs: Sequence[_Job]) -> PassResult:
        """One pass for all ``jobs`` over their examples laid end to end: noisy clipped sums
        (a vector each), counts of unclipped examples and of examples with a non-finite
        gradient norm (factor 0), loss sums, whether the parameters were finite, and for each
        update the numpy array that owns its memory (on the CPU; None elsewhere).

        Everything per example (activations, loss, norms, clipping factors) runs once over all
        examples; only the products with a round's own weights run per round, straight from its
        parameter vector (no copy) and, for the weight gradients, straight into its update.
        The phases, in Opacus' terms: gather, noise, forward (and backward to the layer
        outputs), per-example norms and clip factors, scatter of the clipped sums.
        """
        batch = self._gather(jobs)
        forward = self._forward(batch)
        factors, counts, nonfinite = self._clip_factors(batch, forward)
        updates, owners = self._scatter(batch, forward, factors)
        loss_sums = torch.zeros(len(jobs), device=self.device).index_add_(0, batch.owner, forward.losses).tolist()
        finite = [bool(s) or bool(torch.isfinite(p).all()) for s, p in zip(
            torch.isfinite(torch.stack(forward.param_sums)).tolist(), batch.params, strict=True)]
        return updates, counts, nonfinite, loss_sums, finite, owners

    def _gather(self, jobs: Sequence[_Job]) -> _Batch:
        """Every round's examples laid end to end (x, y), its parameter vector as a tensor
        and, per Linear layer, its (weight, bias) as views of that vector.

        Rounds whose trainers share one data set (the simulator stores it once and each
        client holds its row indices) are gathered by one ``index_select`` of all their rows."""
        first = jobs[0].pending.trainer
        sizes = [job.size for job in jobs]
        total = sum(sizes)
        bounds = list(itertools.accumulate(sizes, initial=0))
        features_per_row = math.prod(first.features.shape[1:])
        x = self._scratch("x", (total, features_per_row), torch.float32)
        y = self._scratch("y", (total,), first.labels.dtype)
        # Clients that hold the same received model share its vector (docs/SCALE.md): one
        # tensor and one set of layer views for each vector of the pass.
        shared: dict[int, tuple[torch.Tensor, list[tuple[torch.Tensor, torch.Tensor | None]]]] = {}
        assert self.chain is not None
        layers = self._linears
        with warnings.catch_warnings():
            # Received models are read-only buffers; nothing here writes to them.
            warnings.filterwarnings("ignore", message="The given NumPy array is not writable")
            for job in jobs:
                if id(job.params) not in shared:
                    vector = torch.from_numpy(np.asarray(job.params, dtype=np.float32)).to(
                        self.device)
                    pieces = iter(vector.split_with_sizes(self._pieces))
                    shared[id(job.params)] = (vector, [
                        (next(pieces).view(m.out_features, m.in_features),
                         next(pieces) if m.bias is not None else None) for m in layers])
        params = [shared[id(job.params)][0] for job in jobs]
        weights = [shared[id(job.params)][1] for job in jobs]
        features, labels = first.features, first.labels
        if total and all(job.pending.trainer.features is features
                         and job.pending.trainer.labels is labels for job in jobs):
            self._select(features, labels, torch.cat(
                [job.pending.trainer.rows_of(job.indices) for job in jobs if job.size]), x, y)
        else:
            for job, start, stop in zip(jobs, bounds, bounds[1:], strict=False):
                if job.size:
                    trainer = job.pending.trainer
                    self._select(trainer.features, trainer.labels, trainer.rows_of(job.indices),
                                 x[start:stop], y[start:stop])
        owner = torch.repeat_interleave(torch.arange(len(jobs), device=self.device),
                                        torch.tensor(sizes, device=self.device))
        return _Batch(jobs, total, sizes, x, y, params, layers, weights, owner, first.loss_fn)

    def _select(self, features: torch.Tensor, labels: torch.Tensor, rows: torch.Tensor,
                x: torch.Tensor, y: torch.Tensor) -> None:
        """``x``/``y`` := the ``rows`` of ``features`` (flattened) and ``labels``."""
        rows = rows.to(self.device)
        flat = features.reshape(len(features), -1)
        if flat.dtype == torch.float32:
            torch.index_select(flat, 0, rows, out=x)
        else:
            x.copy_(flat.index_select(0, rows))
        torch.index_select(labels, 0, rows, out=y)

    def _forward(self, batch: _Batch) -> _Forward:
        """Activations through the chain (each round's products with its own weights), the
        per-example losses, and their gradients with respect to every Linear layer's output.

        Only the loss and the elementwise activations run under autograd (over all examples
        at once); the products of a Linear layer and their gradients with respect to its input
        are taken per round into preallocated buffers, with the operations autograd would
        run (:func:`_input_grad`): the values are those of a graph through every round's
        products, without building one (some 3 nodes a round).

        A sum of each parameter vector is taken right after its first product has read it
        (while it is in cache): non-finite only if a parameter is (or, rarely, if a huge
        finite vector overflows: then the exact check decides)."""
        assert self.chain is not None
        total = batch.total
        # The rounds of one parameter vector one after the other: it is read from memory once
        # (the products of different rounds are independent; their order changes no value).
        groups: dict[int, list[int]] = {}
        for k, vector in enumerate(batch.params):
            groups.setdefault(id(vector), []).append(k)
        order = [k for ks in groups.values() for k in ks]
        vector_sums: dict[int, torch.Tensor] = {}
        inputs: list[torch.Tensor] = []
        leaves: list[torch.Tensor] = []  # each Linear layer's output, where its graph starts
        tails: list[torch.Tensor] = []  # the same after the activations that follow it
        with torch.enable_grad():
            h = batch.x
            for module in self.chain:
                if type(module) is not nn.Linear:
                    h = module(h)
                    continue
                index = len(inputs)
                if index:
                    tails.append(h)
                a = h.detach()
                inputs.append(a)
                z = self._products(batch, index, a, order, vector_sums)
                h = z.detach().requires_grad_()
                leaves.append(h)
            tails.append(h)
            sums = [vector_sums[id(vector)] for vector in batch.params]
            losses = batch.loss_fn(h, batch.y) if total else h.new_zeros(0)
            if losses.shape != (total,):
                raise ModelError(f"loss_fn must return per-example losses of shape ({total},), "
                                 f"got {tuple(losses.shape)}")
            if not total:
                return _Forward(inputs, [torch.zeros_like(o) for o in leaves], losses.detach(),
                                sums)
            grads = self._backward(batch, losses, inputs, leaves, tails)
        return _Forward(inputs, grads, losses.detach(), sums)

    def _products(self, batch: _Batch, index: int, a: torch.Tensor, order: list[int],
                  vector_sums: dict[int, torch.Tensor]) -> torch.Tensor:
        """Linear layer ``index``'s outputs for input ``a``: each round's rows times its own
        weights, in ``order``; for the first layer, each parameter vector's sum (into
        ``vector_sums``, by ``id``) right after its first product read it."""
        module = batch.layers[index]
        z = self._scratch(f"z{index}", (batch.total, module.out_features), torch.float32)
        rows_in, rows_out = batch.rows(a), batch.rows(z)
        for k in order:
            w, b = batch.weights[k][index]
            if batch.sizes[k]:
                if b is None:
                    torch.mm(rows_in[k], w.t(), out=rows_out[k])
                else:
                    torch.addmm(b, rows_in[k], w.t(), out=rows_out[k])
            if not index and id(batch.params[k]) not in vector_sums:
                vector_sums[id(batch.params[k])] = batch.params[k].sum()
        return z

    def _backward(self, batch: _Batch, losses: torch.Tensor, inputs: list[torch.Tensor],
                  leaves: list[torch.Tensor], tails: list[torch.Tensor]) -> list[torch.Tensor]:
        """The loss sum's gradient with respect to each Linear layer's output (``leaves``;
        ``tails``: the same after the activations that follow it)."""
        grads = [torch.autograd.grad(losses.sum(), leaves[-1])[0]]
        for index in range(len(leaves) - 1, 0, -1):
            # The gradient at layer ``index``'s input, round by round; every row belongs to
            # one round, and a graph through the rounds' slices would add the zeros of the
            # others (x + 0: only -0 changes, to +0).
            g = grads[0]
            into = self._scratch(f"g{index}", (batch.total, batch.layers[index].in_features),
                                 torch.float32)
            for k, (g_k, a_k, into_k) in enumerate(zip(
                    batch.rows(g), batch.rows(inputs[index]), batch.rows(into), strict=True)):
                if batch.sizes[k]:
                    _input_grad(g_k, batch.weights[k][index][0], a_k, into_k)
            into.add_(0.0)
            below, tail = leaves[index - 1], tails[index - 1]
            grads.insert(0, into if tail is below else torch.autograd.grad(tail, below, into)[0])
        return grads

    def _clip_factors(
        self, batch: _Batch, forward: _Forward
    ) -> tuple[torch.Tensor, list[int], list[int]]:
        """Per-example clipping factors (times the round's 1/m) from the per-example gradient
        norms over all layers, and each round's counts of unclipped examples and of examples
        whose norm is not finite (factor 0, :func:`clip_factors`), in one host sync."""
        sq: torch.Tensor | None = None
        for module, a, g in zip(batch.layers, forward.inputs, forward.grads, strict=True):
            layer_sq = linear_sq_norms(a, g, has_bias=module.bias is not None)
            sq = layer_sq if sq is None else sq.add_(layer_sq)
        assert sq is not None
        norms = sq.clamp_min_(0).sqrt_()
        owner, jobs = batch.owner, batch.jobs
        clips = torch.tensor([job.clip for job in jobs], dtype=torch.float32,
                             device=self.device)[owner]
        factors = clip_factors(norms, clips)
        counts = torch.zeros(2, len(jobs), device=self.device)
        counts[0].index_add_(0, owner, (norms <= clips).to(torch.float32))
        counts[1].index_add_(0, owner, torch.isfinite(norms).logical_not_().to(torch.float32))
        factors.mul_(torch.tensor([job.scale for job in jobs], dtype=torch.float32,
                                  device=self.device)[owner])
        within, nonfinite = counts.tolist()
        return factors, [int(c) for c in within], [int(c) for c in nonfinite]

    def _scatter(
        self, batch: _Batch, forward: _Forward, factors: torch.Tensor
    ) -> tuple[list[torch.Tensor], list[np.ndarray | None]]:
        """Each round's update: its noise first (as ``noisy_gradient`` does), then each layer's
        clipped sum added straight in (the update's slice for a weight is a view shaped like
        the weight). A round's update is filled and summed into while it is in cache, one
        round after the other: filling every round's noise before the pass read each update
        from memory twice.

        On the CPU an update's memory is a numpy array's (returned beside it): the released
        vector is then an array that owns its memory, which the client hands to the network
        as it is (:func:`fedsim.protocol.codec.seal` copies a view of a tensor's memory,
        which the tensor could still change: 400 KB a round at 10^5 parameters)."""
        weighted = [g * factors.unsqueeze(1) for g in forward.grads]
        bias_sums = [torch.zeros(len(batch.jobs), module.out_features, device=self.device)
                     .index_add_(0, batch.owner, cg).unbind() if module.bias is not None
                     else None for module, cg in zip(batch.layers, weighted, strict=True)]
        # Each round's (cg)^T and a, as views: what cg[start:stop].t() and a[start:stop] give
        # (the same strides and offsets), one call a layer instead of three a round.
        products = [(batch.rows(cg.t(), 1), batch.rows(a))
                    for cg, a in zip(weighted, forward.inputs, strict=True)]
        updates: list[torch.Tensor] = []
        owners: list[np.ndarray | None] = []
        # A round of one job here is whole after the pass (a split round's later segments
        # are added to its first by _finish): measured as it is made, while in cache.
        whole = {k for k, end in _round_ranges(batch.jobs) if end == k + 1}
        size = self.num_params + self.num_params % 2  # the noise comes in pairs
        # Off the CPU every update is a row of one block, its noise drawn for all rounds at
        # once: one series of kernel launches a pass instead of one a round.
        block = self._noise_block(batch.jobs, size) if _noise_in_block(self.device) else None
        for k, job in enumerate(batch.jobs):
            owner: np.ndarray | None = None
            if block is not None:
                update = block[k]
            else:
                owner = np.empty(size, dtype=np.float32)
                update = torch.from_numpy(owner)
                if job.first:
                    fill_noise(update, job.draws.noise, job.std)
                else:
                    update.zero_()
            owners.append(owner)
            # (split_with_sizes: Tensor.split's C call without its Python wrapper, every round)
            pieces = iter(update[: self.num_params].split_with_sizes(self._pieces))
            for module, (cg_t, a), sums in zip(batch.layers, products, bias_sums, strict=True):
                weight = next(pieces)
                if batch.sizes[k]:
                    weight.view(module.out_features, module.in_features).addmm_(cg_t[k], a[k])
                if sums is not None:
                    next(pieces).add_(sums[k])
            updates.append(update)
            if (self.measure is not None and job.first and k in whole
                    and _releases_owner(owner, self.num_params)):
                self.measure(owner)  # written no more
        return updates, owners

    def _noise_block(self, jobs: Sequence[_Job], size: int) -> torch.Tensor:
        """A ``(len(jobs), size)`` block on the pass's device: each round's noise in the row
        of its first job (the values :func:`~fedsim.training.gaussian.fill_noise` gives for
        its key), zeros in the rows of a split round's later segments.

        Every row starts on a 512-byte boundary, as a tensor of its own would on CUDA: a BLAS
        product's rounding can depend on its output's alignment, and a round's update must not
        depend on its row in the pass. The draws go in groups of at most
        :data:`_BLOCK_DRAW_PAIRS` pairs, each written straight into its rows: the sampler's
        whole-block intermediates (int64 and float64) are several times the block's size."""
        stride = -(-size // _ROW_ALIGNMENT) * _ROW_ALIGNMENT
        block = torch.empty(len(jobs), stride, device=self.device)[:, :size]
        firsts = [k for k, job in enumerate(jobs) if job.first]
        if len(firsts) < len(jobs):
            block.zero_()
        group = max(1, _BLOCK_DRAW_PAIRS // max(1, size // 2))
        for start in range(0, len(firsts), group):
            rows = firsts[start:start + group]
            noise = reference_rows([jobs[k].draws.noise for k in rows],
                                   [jobs[k].std for k in rows], size // 2, self.device)
            if rows[-1] - rows[0] + 1 == len(rows):  # (rows are increasing) a slice
                block[rows[0]:rows[-1] + 1] = noise
            else:
                block[torch.tensor(rows, device=self.device)] = noise
        return block


_ROW_ALIGNMENT = 128
"""float32 values in 512 bytes: the alignment of a noise block's rows (CUDA's caching
allocator starts every tensor on such a boundary)."""

_BLOCK_DRAW_PAIRS = 1 << 22
"""Noise pairs drawn together at most (:meth:`RoundBatcher._noise_block`): about 4 M pairs,
whose intermediates take some hundreds of MB on the device, whatever the model's size."""


def _noise_in_block(device: torch.device) -> bool:
    """Whether a pass on ``device`` draws its rounds' noise as rows of one block (torch's
    sampler, a few whole-block kernel launches) rather than each into its own update (on the
    CPU: the compiled sampler, a round's update filled while in cache)."""
    return device.type != "cpu"


def _round_ranges(jobs: Sequence[_Job]) -> list[tuple[int, int]]:
    """Each round's jobs in ``jobs`` as ``(start, end)`` indices: a round's segments are
    adjacent, its first job (the one with the noise) at ``start``."""
    ranges = []
    start = 0
    while start < len(jobs):
        end = start + 1
        while end < len(jobs) and jobs[end].pending is jobs[start].pending:
            end += 1
        ranges.append((start, end))
        start = end
    return ranges


def _releases_owner(owner: np.ndarray | None, size: int) -> TypeGuard[np.ndarray]:
    """Whether a round's update is released as ``owner``, the array owning its memory: when
    it holds exactly the ``size`` values (not padded to whole noise pairs)."""
    return owner is not None and owner.size == size


def _released(update: torch.Tensor, owner: np.ndarray | None, size: int) -> np.ndarray:
    """A round's update as its client releases it: the first ``size`` values (``update`` is
    padded to whole noise pairs), as ``owner`` when :func:`_releases_owner`; else a copy into
    an array that owns its memory: no tensor of the pass can change it, the network takes it
    uncopied, and the sender's check and the codec's measure it once
    (:mod:`fedsim.protocol.norms`)."""
    if _releases_owner(owner, size):
        return owner
    released = np.empty(size, dtype=np.float32)
    torch.from_numpy(released).copy_(update[:size])
    return released


@dataclass(frozen=True, eq=False)
class _Batch:
    """The gathered inputs of one pass (see :meth:`RoundBatcher._gather`)."""

    jobs: Sequence[_Job]
    total: int
    sizes: list[int]
    """Each round's number of rows of ``x``/``y``, laid end to end."""
    x: torch.Tensor
    y: torch.Tensor
    params: list[torch.Tensor]
    layers: list[nn.Linear]
    weights: list[list[tuple[torch.Tensor, torch.Tensor | None]]]
    """Per round, per Linear layer: (weight, bias) views of the round's parameter vector."""
    owner: torch.Tensor
    """The round of each row."""
    loss_fn: LossFn

    @property
    def spans(self) -> list[tuple[int, int]]:
        """Each round's rows of ``x``/``y`` as ``(start, stop)``."""
        bounds = list(itertools.accumulate(self.sizes, initial=0))
        return list(zip(bounds, bounds[1:], strict=False))

    def rows(self, tensor: torch.Tensor, dim: int = 0) -> tuple[torch.Tensor, ...]:
        """Each round's rows of ``tensor`` (laid out like ``x`` along ``dim``): the views
        ``tensor[start:stop]`` would give, in one call instead of one call a round."""
        return tensor.split_with_sizes(self.sizes, dim)


@dataclass(frozen=True, eq=False)
class _Forward:
    """What the forward and backward pass leave for the norms and the scatter."""

    inputs: list[torch.Tensor]
    """Each Linear layer's input activations."""
    grads: list[torch.Tensor]
    """The loss sum's gradient with respect to each Linear layer's output."""
    losses: torch.Tensor
    param_sums: list[torch.Tensor]
