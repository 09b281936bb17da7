"""Many clients' DP-SGD rounds computed together: one batched pass for rounds that overlap.

In a simulation every client trains its own copy of one model on its own small batches. For
small models a round is dominated by per-operation costs (dispatch, cold parameter vectors,
fresh buffers), not arithmetic, so computing the pending rounds of many clients as one batched
pass (``bmm`` over clients, the client as the leading dimension) does the same work for a
fraction of the cost. The virtual-time runtime makes this possible without changing what is
computed: a client draws its round's randomness when the round starts
(:meth:`~fedsim.training.local.LocalTrainer.begin_round`), lets the round's compute time pass,
and only then asks for the update; by then the rounds other clients started meanwhile are
pending too, and the first request computes them all.

Each round is the same DP-SGD step as :func:`~fedsim.training.dpsgd.noisy_gradient` on its own
(same batch, same noise stream, same clipping rule ``min(1, C / (||g_i|| + 1e-6))`` and
sensitivity): the per-example gradient norms of a ``Linear`` layer on (B, d) inputs are
``||g_i||^2 (||a_i||^2 + 1)`` (Goodfellow 2015; the engine of
:mod:`fedsim.training.persample`), here for every client at once. Results equal the single
round's up to floating-point summation order (tested). Rounds are grouped by batch size
(padding rows carry zero loss and so zero gradient); models other than a plain MLP
(``Linear`` layers and elementwise activations), rounds of several local steps or of
per-example local updates are computed one by one, exactly as alone.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import TYPE_CHECKING

import numpy as np
import torch
from torch import nn

from fedsim.errors import ModelError
from fedsim.training.dpsgd import sensitivity
from fedsim.training.gaussian import fill_gaussian
from fedsim.training.models import MLP, LogisticRegression
from fedsim.training.persample import CLIP_EPSILON

if TYPE_CHECKING:
    from fedsim.training.local import PendingRound

__all__ = ["RoundBatcher", "batchable_layers"]

# Parameter-free modules that act on each value alone: they commute with batching over clients.
_ELEMENTWISE = (nn.ReLU, nn.Tanh, nn.Sigmoid, nn.GELU, nn.ELU, nn.LeakyReLU, nn.SiLU,
                nn.Softplus, nn.Identity)
# A bucket's rows are padded to its largest batch: a new bucket starts when the next batch is
# this much larger than the bucket's smallest (padding costs arithmetic, a bucket dispatch).
_BUCKET_GROWTH = 1.25
_BUCKET_SLACK = 4
_MAX_BUCKET = 64


def batchable_layers(model: nn.Module) -> list[nn.Module] | None:
    """The modules of ``model`` as a chain of ``Linear`` layers and elementwise activations on
    flattened inputs, or None when the model is anything else (it is then computed alone)."""
    if isinstance(model, MLP):
        chain = list(model.net)
    elif isinstance(model, LogisticRegression):
        chain = [model.linear]
    elif type(model) is nn.Sequential:
        chain = list(model)
        if chain and isinstance(chain[0], nn.Flatten) and (chain[0].start_dim, chain[0].end_dim) == (1, -1):
            chain = chain[1:]
    else:
        return None
    linear = [m for m in chain if type(m) is nn.Linear]
    if not linear or any(type(m) is not nn.Linear and not isinstance(m, _ELEMENTWISE) for m in chain):
        return None
    params = list(model.parameters())
    chain_params = [p for m in linear for p in m.parameters()]
    if [id(p) for p in params] != [id(p) for p in chain_params]:
        return None  # parameters outside the chain or in another order
    if any(not p.requires_grad or p.dtype != torch.float32 or p.device.type != "cpu" for p in params):
        return None
    return chain


class _Job:
    """One pending round of one step, resolved to what the batched pass needs."""

    def __init__(self, pending: PendingRound) -> None:
        trainer = pending.trainer
        self.pending = pending
        self.draws = pending.draws[0]
        self.size = len(self.draws.indices)
        self.clip = trainer.clip_for(pending.round_index)
        sum_sigma = trainer.sum_sigma(pending.steps[0].sigma)
        self.scale = 1.0 / trainer.batch_size
        self.std = sensitivity(trainer.sampling, self.clip) * sum_sigma * self.scale


class RoundBatcher:
    """Pending rounds of clients that share ``model``; :meth:`flush` computes them all.

    A round joins with :meth:`submit` (done by ``LocalTrainer.begin_round``), leaves when its
    client crashes (:meth:`discard`), and is computed at the first ``result()`` of any pending
    round. The grouping depends only on which rounds are pending, so a deterministic runtime
    stays deterministic.
    """

    def __init__(self, model: nn.Module) -> None:
        self.model = model
        self.chain = batchable_layers(model)
        self.num_params = sum(p.numel() for p in model.parameters())
        self._pending: dict[int, PendingRound] = {}
        self._buffers: dict[str, torch.Tensor] = {}
        self.rounds_batched = 0
        """Rounds computed in a batched pass so far (the others were computed alone)."""
        self.batches = 0
        """Batched passes so far."""

    def submit(self, pending: PendingRound) -> None:
        pending.batcher = self
        self._pending[id(pending)] = pending

    def discard(self, pending: PendingRound) -> None:
        self._pending.pop(id(pending), None)

    @property
    def pending(self) -> int:
        """Rounds waiting to be computed."""
        return len(self._pending)

    def _batchable(self, pending: PendingRound) -> bool:
        trainer = pending.trainer
        return (
            self.chain is not None
            and trainer.model is self.model
            and trainer.local_steps == 1
            and trainer.per_example_steps == 1
            and trainer.features.device.type == "cpu"
        )

    def flush(self) -> None:
        """Compute every pending round (each round's ``result()`` then returns at once)."""
        pending, self._pending = list(self._pending.values()), {}
        jobs: list[_Job] = []
        for round_ in pending:
            if self._batchable(round_):
                jobs.append(_Job(round_))
            else:
                round_.compute_alone()
        jobs.sort(key=lambda job: job.size)  # stable: equal sizes keep their submission order
        bucket: list[_Job] = []
        for job in jobs:
            if bucket and (len(bucket) >= _MAX_BUCKET
                           or job.size > _BUCKET_GROWTH * bucket[0].size + _BUCKET_SLACK):
                self._compute_bucket(bucket)
                bucket = []
            bucket.append(job)
        if bucket:
            self._compute_bucket(bucket)

    def _scratch(self, name: str, shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
        """A buffer of the batcher, reused by every pass: fresh memory costs a page fault per
        4 KB, as much as the arithmetic of a small model's round. Zeros when first made, later
        whatever the last pass left (always finite values and valid labels)."""
        size = math.prod(shape)
        buffer = self._buffers.get(name)
        if buffer is None or buffer.numel() < size or buffer.dtype != dtype:
            buffer = torch.zeros(size, dtype=dtype)
            self._buffers[name] = buffer
        return buffer[:size].view(shape)

    def _stack_params(self, jobs: list[_Job]) -> tuple[torch.Tensor, list[_Job]]:
        """The jobs' parameter vectors as rows, without the jobs whose vector is unusable."""
        weights = self._scratch("weights", (len(jobs), self.num_params), torch.float32)
        rows = weights.numpy()
        kept: list[_Job] = []
        for job in jobs:
            params = np.asarray(job.pending.params)
            if params.shape != (self.num_params,):
                job.pending.complete(ModelError(
                    f"parameter vector has shape {params.shape}, the model needs "
                    f"({self.num_params},)"))
                continue
            np.copyto(rows[len(kept)], params, casting="same_kind")
            kept.append(job)
        weights = weights[: len(kept)]
        # One sum per row finds non-finite rows (a huge finite row may overflow to inf: then
        # the exact check decides).
        suspicious = (~torch.isfinite(weights.sum(1))).nonzero().flatten().tolist()
        bad = {k for k in suspicious if not bool(torch.isfinite(weights[k]).all())}
        if not bad:
            return weights, kept
        for k in bad:
            kept[k].pending.complete(ModelError("parameter vector contains non-finite values"))
        keep = [k for k in range(len(kept)) if k not in bad]
        return weights[keep], [kept[k] for k in keep]

    def _compute_bucket(self, jobs: list[_Job]) -> None:
        if len(jobs) == 1:  # nothing to share: the single-round engine, exactly as alone
            jobs[0].pending.compute_alone()
            return
        weights, jobs = self._stack_params(jobs)
        if not jobs:
            return
        try:
            updates, within, losses = self._pass(weights, jobs)
        except Exception as exc:  # a model or loss error: every round of the pass reports it
            for job in jobs:
                job.pending.complete(exc)
            return
        self.batches += 1
        self.rounds_batched += len(jobs)
        for k, job in enumerate(jobs):
            trainer, draws = job.pending.trainer, job.draws
            if draws.count_noise is not None:
                trainer.update_adaptive_clip(within[k], job.size, job.clip, draws.count_noise)
            job.pending.complete(trainer.round_result(
                job.pending, updates[k][: self.num_params].numpy(), [job.size], job.clip,
                losses[k]))

    def _pass(
        self, weights: torch.Tensor, jobs: Sequence[_Job]
    ) -> tuple[list[torch.Tensor], list[int], list[float]]:
        """One forward and backward pass for all ``jobs``: noisy clipped sums (a vector each),
        counts of unclipped examples, loss sums."""
        assert self.chain is not None
        count = len(jobs)
        width = max(1, max(job.size for job in jobs))
        first = jobs[0].pending.trainer
        features_per_row = math.prod(first.features.shape[1:])
        x = self._scratch("x", (count, width, features_per_row), torch.float32)
        y = self._scratch("y", (count, width), first.labels.dtype)
        for k, job in enumerate(jobs):
            if job.size:
                trainer, indices = job.pending.trainer, job.draws.indices
                features = trainer.features.reshape(len(trainer.features), -1)
                if features.dtype == torch.float32:
                    torch.index_select(features, 0, indices, out=x[k, : job.size])
                else:
                    x[k, : job.size] = features.index_select(0, indices)
                torch.index_select(trainer.labels, 0, indices, out=y[k, : job.size])
        sizes = torch.tensor([job.size for job in jobs])
        mask = (torch.arange(width).unsqueeze(0) < sizes.unsqueeze(1)).to(torch.float32)
        # The noise first (as noisy_gradient does), then each layer's clipped sum is added in.
        # One allocation per round, as a round computed alone makes: the allocator recycles
        # these warm, where one large block for all rounds would be fresh pages each pass.
        updates = [torch.empty(self.num_params + self.num_params % 2) for _ in jobs]
        for update, job in zip(updates, jobs, strict=True):
            fill_gaussian(update, job.draws.noise, job.std)

        layers: list[tuple[nn.Linear, torch.Tensor, torch.Tensor | None, int]] = []
        offset = 0
        for module in self.chain:
            if type(module) is nn.Linear:
                size = module.weight.numel()
                w = weights[:, offset : offset + size].view(count, module.out_features,
                                                          module.in_features)
                b = weights[:, offset + size : offset + size + module.out_features] \
                    if module.bias is not None else None
                layers.append((module, w, b, offset))
                offset += size + (module.out_features if module.bias is not None else 0)
        inputs: list[torch.Tensor] = []
        outputs: list[torch.Tensor] = []
        with torch.enable_grad():
            h = x
            linear = iter(layers)
            for module in self.chain:
                if type(module) is not nn.Linear:
                    h = module(h)
                    continue
                _, w, b, _ = next(linear)
                inputs.append(h.detach())
                h = torch.bmm(h, w.transpose(1, 2)) if b is None else \
                    torch.baddbmm(b.unsqueeze(1), h, w.transpose(1, 2))
                if not outputs:
                    h.requires_grad_()  # the graph starts at the first layer's output
                outputs.append(h)
            losses = first.loss_fn(h.reshape(count * width, -1), y.reshape(-1))
            if losses.shape != (count * width,):
                raise ModelError(f"loss_fn must return per-example losses of shape "
                                 f"({count * width},), got {tuple(losses.shape)}")
            losses = losses.view(count, width) * mask
            grads = torch.autograd.grad(losses.sum(), outputs)
        sq: torch.Tensor | None = None
        for (_, _, b, _), a, g in zip(layers, inputs, grads, strict=True):
            layer_sq = torch.linalg.vector_norm(g, dim=2).square_()
            a_sq = torch.linalg.vector_norm(a, dim=2).square_()
            layer_sq = (a_sq.add_(1.0) if b is not None else a_sq).mul_(layer_sq)
            sq = layer_sq if sq is None else sq.add_(layer_sq)
        assert sq is not None
        norms = sq.clamp_min_(0).sqrt_()
        clips = torch.tensor([job.clip for job in jobs], dtype=torch.float32).unsqueeze(1)
        factors = (clips / (norms + CLIP_EPSILON)).clamp_(max=1.0)
        within = ((norms <= clips) & (mask > 0)).sum(1).tolist()
        factors.mul_(torch.tensor([job.scale for job in jobs], dtype=torch.float32).unsqueeze(1))
        for (module, _, b, offset), a, g in zip(layers, inputs, grads, strict=True):
            weighted = g * factors.unsqueeze(2)
            size = module.weight.numel()
            shape = (count, module.out_features, module.in_features)
            weight_sums = torch.bmm(weighted.transpose(1, 2), a,
                                    out=self._scratch(f"grad{offset}", shape, torch.float32))
            bias_sums = weighted.sum(1) if b is not None else None
            for k, update in enumerate(updates):
                update[offset : offset + size].view(shape[1:]).add_(weight_sums[k])
                if bias_sums is not None:
                    update[offset + size : offset + size + module.out_features].add_(bias_sums[k])
        return updates, within, losses.detach().sum(1).tolist()
