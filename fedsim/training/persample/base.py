"""What every per-layer rule works with: a layer's recorded calls (:class:`Use`,
:class:`Layer`), the weighted sum a rule returns (:data:`WeightedSum`), buffers kept between
batches (:func:`scratch`), and the rule of materialised per-example gradients
(:func:`per_example_rule`). The rules themselves: :mod:`fedsim.training.persample.rules`
(Linear, Embedding, the norms' affine weights) and
:mod:`fedsim.training.persample.convolution` (Conv2d).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

__all__ = ["Layer", "Use", "WeightedSum", "concat", "per_example_rule", "row_sq_norms", "scratch"]


WeightedSum = Callable[[torch.Tensor, list[torch.Tensor]], None]

@dataclass
class Use:
    """One call of a layer in the forward pass: its positional inputs and its output."""

    inputs: tuple[Any, ...]
    output: torch.Tensor
    grad: torch.Tensor | None = None
    stats: tuple[torch.Tensor, torch.Tensor] | None = None
    """GroupNorm only: its forward's mean and ``1/std`` per (example, group), when saved."""

    @property
    def out_grad(self) -> torch.Tensor:
        """The loss's gradient with respect to ``output`` (set by the backward pass)."""
        assert self.grad is not None, "the backward pass has not run"
        return self.grad


@dataclass
class Layer:
    """A module with a fast rule: its direct trainable parameters and this pass's calls."""

    module: nn.Module
    params: list[nn.Parameter]  # direct, trainable parameters, in module order
    kind: str
    uses: list[Use] = field(default_factory=list)
    workspace: dict[str, torch.Tensor] = field(default_factory=dict)
    """Buffers a rule keeps between batches (see :func:`scratch`)."""
    result: tuple[torch.Tensor, WeightedSum] | None = None
    """This pass's rule output (squared norms, weighted sum), once computed."""


def scratch(
    store: dict[str, torch.Tensor] | None, name: str, shape: tuple[int, ...], like: torch.Tensor
) -> torch.Tensor:
    """An uninitialised contiguous tensor of ``shape`` (like ``like``), from ``store`` when given.

    The buffer is kept between batches, as large as the largest batch seen (a physical batch
    at most), and a smaller batch takes its first rows. A tensor allocated afresh each step is
    often memory glibc has just given back to the system, and its first touch then faults
    every page in again: measured on the DP MNIST CNN's step, 2,000-7,000 page faults and
    3-13 ms of system time a step, more than the arithmetic that fills the tensor.
    """
    if store is None:
        return like.new_empty(shape)
    buffer = store.get(name)
    fits = (
        buffer is not None
        and buffer.shape[1:] == shape[1:]
        and buffer.dtype == like.dtype
        and buffer.device == like.device
    )
    if buffer is None or not fits or buffer.shape[0] < shape[0]:
        rows = max(shape[0], buffer.shape[0]) if buffer is not None and fits else shape[0]
        buffer = like.new_empty((rows, *shape[1:]))
        store[name] = buffer
    return buffer[: shape[0]]


def concat(parts: list[torch.Tensor], dim: int) -> torch.Tensor:
    """``parts`` joined along ``dim`` (the one part itself when there is one: no copy)."""
    return parts[0] if len(parts) == 1 else torch.cat(parts, dim)


def row_sq_norms(per_example: torch.Tensor) -> torch.Tensor:
    """Each example's squared norm of its row(s) (B, ...) -> (B,)."""
    # A fused reduction: no B x P temporary for the squares.
    return torch.linalg.vector_norm(per_example.flatten(1), dim=1).square()


def per_example_rule(per_example: list[torch.Tensor]) -> tuple[torch.Tensor, WeightedSum]:
    """Norms and weighted sum from materialised per-example gradients (B, *param.shape)."""
    sq = row_sq_norms(per_example[0])
    for p in per_example[1:]:
        sq = sq + row_sq_norms(p)

    def weighted(c: torch.Tensor, outs: list[torch.Tensor]) -> None:
        for out, p in zip(outs, per_example, strict=True):
            # One fused pass (p^T c added in place): no parameter-sized temporary.
            out.view(-1).addmv_(p.reshape(p.shape[0], -1).t(), c)

    return sq, weighted
