"""One batched pass: the DP-SGD sums of many rounds over one chain of ``Linear`` layers,
computed together (:class:`ChainPass`, run by :class:`fedsim.training.batched.RoundBatcher`,
which decides which pending rounds share a pass).

The examples of all rounds are laid end to end: activations, losses, per-example norms and
clipping factors are computed once for all of them, and only the products with a round's own
weights run per round (read straight from its parameter vector, the weight gradients added
straight into its update).

Each round is the same DP-SGD step as :func:`~fedsim.training.dpsgd.noisy_gradient` on its own
(same batch, same noise stream, same clipping rule ``min(1, C / (||g_i|| + 1e-6))`` and
sensitivity): the per-example gradient norms of a ``Linear`` layer on (B, d) inputs are
``||g_i||^2 (||a_i||^2 + 1)`` (Goodfellow 2015; the engine of
:mod:`fedsim.training.persample`), here for every example of every round at once. Results
equal the single round's up to floating-point summation order (tested).
"""

from __future__ import annotations

import itertools
import math
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TypeGuard

import numpy as np
import torch
from torch import nn

from fedsim.errors import ModelError
from fedsim.training.dpsgd import noise_std
from fedsim.training.gaussian import fill_noise, reference_rows
from fedsim.training.persample import LossFn, clip_factors, linear_sq_norms
from fedsim.training.rounds import PendingRound

__all__ = ["ChainPass", "PassJob", "PassResult", "released", "round_ranges"]

PassResult = tuple[list[torch.Tensor], list[int], list[int], list[float], list[bool],
                   list["np.ndarray | None"]]
"""What a batched pass returns (:meth:`ChainPass.run`)."""


def _input_grad(g: torch.Tensor, w: torch.Tensor, a: torch.Tensor, out: torch.Tensor) -> None:
    """``out`` := the gradient at the input ``a`` of ``a @ w.t() (+ b)`` given ``g`` at its
    output, computed as autograd's backward of ``addmm`` computes it (``mm_mat1_backward``:
    its column-major case too), so the values are the same."""
    if a.stride(0) == 1 and a.stride(1) == a.shape[0]:
        out.copy_(torch.mm(w.t(), g.t()).t())
    else:
        torch.mm(g, w, out=out)


class PassJob:
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


class ChainPass:
    """The arithmetic of a batched pass over ``chain`` (the ``Linear`` chain of ``model``,
    :func:`~fedsim.training.batched.batchable_layers`): :meth:`run` computes the jobs given
    to it, whichever rounds they are, with buffers reused from pass to pass."""

    def __init__(self, model: nn.Module, chain: list[nn.Module], *,
                 measure: Callable[[np.ndarray], float] | None = None) -> None:
        self.chain = chain
        self.measure = measure
        """See :attr:`fedsim.training.batched.RoundBatcher.measure`."""
        self.num_params = sum(p.numel() for p in model.parameters())
        self._linears = [m for m in chain if type(m) is nn.Linear]
        """The chain's Linear layers, in order."""
        self._pieces = [p.numel() for m in self._linears for p in m.parameters()]
        """The sizes of the Linear layers' weights and biases in a parameter vector, in order."""
        self.device = next(model.parameters()).device
        """Where every tensor of a pass is made (the model's device)."""
        self._buffers: dict[str, torch.Tensor] = {}

    def _scratch(self, name: str, shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
        """A buffer of the batcher, reused by every pass (fresh memory costs a page fault per
        4 KB, which small models feel); contents are whatever the last pass left."""
        size = math.prod(shape)
        buffer = self._buffers.get(name)
        if buffer is None or buffer.numel() < size or buffer.dtype != dtype:
            buffer = torch.empty(size, dtype=dtype, device=self.device)
            self._buffers[name] = buffer
        return buffer[:size].view(shape)

    def run(self, jobs: Sequence[PassJob]) -> PassResult:
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

    def _gather(self, jobs: Sequence[PassJob]) -> _Batch:
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
        whole = {k for k, end in round_ranges(batch.jobs) if end == k + 1}
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

    def _noise_block(self, jobs: Sequence[PassJob], size: int) -> torch.Tensor:
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
"""Noise pairs drawn together at most (:meth:`ChainPass._noise_block`): about 4 M pairs,
whose intermediates take some hundreds of MB on the device, whatever the model's size."""


def _noise_in_block(device: torch.device) -> bool:
    """Whether a pass on ``device`` draws its rounds' noise as rows of one block (torch's
    sampler, a few whole-block kernel launches) rather than each into its own update (on the
    CPU: the compiled sampler, a round's update filled while in cache)."""
    return device.type != "cpu"


def round_ranges(jobs: Sequence[PassJob]) -> list[tuple[int, int]]:
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


def released(update: torch.Tensor, owner: np.ndarray | None, size: int) -> np.ndarray:
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

    jobs: Sequence[PassJob]
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
