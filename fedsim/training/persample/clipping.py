"""The clipping rule and the loss contract shared by every per-sample path (one place each)."""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F

LossFn = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]
"""``loss_fn(outputs, targets) -> per-example losses`` of shape (B,)."""

# Opacus and TF Privacy use the same stabiliser; c_i * ||g_i|| < C holds strictly in exact
# arithmetic. In float32 the computed contribution can land a few ulps above C (relative 1e-7,
# measured; the engine refuses float16/bfloat16 parameters, where it reached 1%).
CLIP_EPSILON = 1e-6


def per_example_cross_entropy(outputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(outputs, targets, reduction="none")


def clip_factors(
    norms: torch.Tensor, clip: float | torch.Tensor, scale: float = 1.0
) -> torch.Tensor:
    """The clipping rule: ``min(1, C / (||g_i|| + CLIP_EPSILON))`` per example, times ``scale > 0``
    (a new tensor).

    An example whose gradient norm is not finite (a finite but huge feature overflows its
    squared norm; ``0 * inf`` gives nan) gets factor 0: it contributes nothing to the sum. That
    is still a function of that one example, so the sensitivity is unchanged, and the round is
    released and charged as any other (a withheld round would tell whether it was sampled).
    Four in-place passes over B values (``1 / (n + eps)``, times ``C scale``, at most
    ``scale``, nan to 0): each tensor op costs microseconds of dispatch, as much as a small
    model's arithmetic."""
    factors = (norms + CLIP_EPSILON).reciprocal_()
    if scale == 1.0:
        factors.mul_(clip)
    else:
        factors.mul_(clip * scale)
    return factors.clamp_(max=scale).nan_to_num_(nan=0.0)


def clip_rows(rows: torch.Tensor, clip: float) -> torch.Tensor:
    """Clip each row of ``rows`` to norm ``clip`` with the engine's factors (for references)."""
    norms = rows.norm(dim=1)
    return rows * clip_factors(norms, clip)[:, None]
