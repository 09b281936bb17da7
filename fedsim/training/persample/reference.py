"""The independent reference the engine is tested against: one backward pass per example."""

from __future__ import annotations

import torch
from torch import nn

from fedsim.training.persample.clipping import LossFn, per_example_cross_entropy

__all__ = ["naive_per_example_gradients"]


def _or_zeros(grad: torch.Tensor | None, param: torch.Tensor) -> torch.Tensor:
    return torch.zeros_like(param) if grad is None else grad


def naive_per_example_gradients(
    model: nn.Module,
    features: torch.Tensor,
    targets: torch.Tensor,
    loss_fn: LossFn = per_example_cross_entropy,
) -> torch.Tensor:
    """Reference: per-example gradients (B, P) from one backward pass per example.

    Slow and memory-hungry by design; tests compare the fast engine against it.
    """
    params = list(model.parameters())
    trainable = [p for p in params if p.requires_grad]
    rows: list[torch.Tensor] = []
    for i in range(features.shape[0]):
        loss = loss_fn(model(features[i : i + 1]), targets[i : i + 1]).sum()
        grads = dict(
            zip(
                map(id, trainable),
                torch.autograd.grad(loss, trainable, allow_unused=True),
                strict=True,
            )
        )
        rows.append(torch.cat([_or_zeros(grads.get(id(p)), p).reshape(-1) for p in params]))
    return torch.stack(rows)
