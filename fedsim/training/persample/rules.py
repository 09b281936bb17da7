"""Per-layer fast paths: each example's squared gradient norm and the clipped sum of one layer.

From the layer's recorded inputs ``a`` and the gradients ``g`` of the loss with respect to its
outputs (see :mod:`fedsim.training.persample`), without the per-example gradient where the
layer's structure allows it:

* ``Linear`` on (B, d): ``||g_i a_i^T||^2 = ||g_i||^2 ||a_i||^2``; on sequences (B, T, d)
  the ghost norm ``sum_{t,s} (a_t.a_s)(g_t.g_s)`` when ``2 T^2 < d_in d_out``, else the
  per-example gradient;
* ``Conv2d`` (zero padding): per-example gradients, or the ghost norm over output positions
  where it is cheaper (:mod:`fedsim.training.persample.convolution`);
* ``Embedding``: ``sum_{t,s} [idx_t = idx_s] g_t.g_s``;
* ``GroupNorm``/``LayerNorm`` affine weights: per-example gradients (one value per channel);
  GroupNorm's from the mean and ``1/std`` its forward saved for backward (``x_hat`` is not
  formed again).

Each rule returns ``(squared norms (B,), weighted_sum)``; ``weighted_sum(c, outs)`` adds
``sum_i c_i g_i`` of each of the layer's direct parameters into ``outs`` (views shaped like
them). Any other layer with parameters goes through :mod:`fedsim.training.persample.fallback`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import cast

import torch
import torch.nn.functional as F
from torch import nn

from fedsim.training.persample.base import (
    Layer,
    WeightedSum,
    concat,
    per_example_rule,
    row_sq_norms,
    scratch,
)
from fedsim.training.persample.convolution import conv2d_rule

__all__ = ["RULES", "fast_path", "group_norm_statistics", "linear_rows_rule", "linear_sq_norms"]


def linear_sq_norms(
    a: torch.Tensor, g: torch.Tensor, has_weight: bool = True, has_bias: bool = True
) -> torch.Tensor:
    """Squared per-example gradient norms of a ``Linear`` layer on (B, d_in) -> (B, d_out),
    from its inputs ``a`` and output gradients ``g``: ``||g_i||^2 (||a_i||^2 + 1)`` with a bias."""
    sq = torch.linalg.vector_norm(g, dim=1).square_()
    if has_weight:
        a_sq = torch.linalg.vector_norm(a, dim=1).square_()
        sq = a_sq.add_(1.0).mul_(sq) if has_bias else a_sq.mul_(sq)
    return sq


def linear_rows_rule(
    a: torch.Tensor, g: torch.Tensor, has_weight: bool, has_bias: bool
) -> tuple[torch.Tensor, WeightedSum]:
    """The rule of a ``Linear`` layer called once on (B, d_in) -> (B, d_out), from its input
    ``a`` and output gradient ``g``: the norms of :func:`linear_sq_norms` and the weighted sum."""
    sq = linear_sq_norms(a, g, has_weight, has_bias)

    def weighted(c: torch.Tensor, outs: list[torch.Tensor]) -> None:
        # In place: no P-sized temporary, no copy. The product's orientation is plain SGD's
        # (autograd's ``g^T a`` for a Linear weight); ``(a^T (c g))^T`` measured 12% slower
        # on the MLP 784-256-10's step.
        if has_weight:
            outs[0].addmm_((g * c.unsqueeze(1)).t(), a)
        if has_bias:  # one fused op: no scaled copy of g to sum
            outs[-1].addmv_(g.t(), c)

    return sq, weighted


def _linear_rule(layer: Layer) -> tuple[torch.Tensor, WeightedSum]:
    module = layer.module
    assert isinstance(module, nn.Linear)
    has_weight = module.weight.requires_grad
    has_bias = module.bias is not None and module.bias.requires_grad
    first = layer.uses[0]
    if len(layer.uses) == 1 and first.inputs[0].dim() == 2:
        # The common case, one call on (B, d): no reshapes. Few tensor ops matter here: each
        # costs microseconds of dispatch, as much as the arithmetic of a small model's step.
        a, g = first.inputs[0], first.out_grad
        return linear_rows_rule(a, g, has_weight, has_bias)
    batch = first.output.shape[0]
    # Every use becomes positions along one sequence axis: (B, T, d).
    a = concat([u.inputs[0].reshape(batch, -1, module.in_features) for u in layer.uses], 1)
    g = concat([u.out_grad.reshape(batch, -1, module.out_features) for u in layer.uses], 1)
    steps = a.shape[1]
    if steps == 1:
        return linear_rows_rule(a[:, 0], g[:, 0], has_weight, has_bias)

    per_example: list[torch.Tensor] = []
    sq = torch.zeros(batch, dtype=g.dtype, device=g.device)
    if has_weight:
        if 2 * steps * steps < module.in_features * module.out_features:
            sq = sq + (torch.bmm(a, a.transpose(1, 2)) * torch.bmm(g, g.transpose(1, 2))).sum(
                (1, 2)
            )
        else:
            per_example.append(torch.einsum("bto,bti->boi", g, a))
            sq = sq + row_sq_norms(per_example[0])
    g_sum = g.sum(1)
    if has_bias:
        sq = sq + g_sum.pow(2).sum(1)

    def weighted_seq(c: torch.Tensor, outs: list[torch.Tensor]) -> None:
        if has_weight:
            if per_example:
                outs[0].add_(torch.tensordot(c, per_example[0], dims=1))
            else:
                outs[0].addmm_(
                    (g * c[:, None, None]).reshape(-1, module.out_features).t(),
                    a.reshape(-1, module.in_features),
                )
        if has_bias:
            outs[-1].add_(torch.tensordot(c, g_sum, dims=1))

    return sq, weighted_seq


def _embedding_rule(layer: Layer) -> tuple[torch.Tensor, WeightedSum]:
    module = layer.module
    assert isinstance(module, nn.Embedding)
    batch = layer.uses[0].output.shape[0]
    idx = concat([u.inputs[0].reshape(batch, -1) for u in layer.uses], 1)
    g = concat([u.out_grad.reshape(batch, -1, module.embedding_dim) for u in layer.uses], 1)
    if module.padding_idx is not None:  # the padding row receives no gradient
        g = g * (idx != module.padding_idx).unsqueeze(-1).to(g.dtype)
    same_row = (idx.unsqueeze(2) == idx.unsqueeze(1)).to(g.dtype)
    sq = (same_row * torch.bmm(g, g.transpose(1, 2))).sum((1, 2))

    def weighted(c: torch.Tensor, outs: list[torch.Tensor]) -> None:
        outs[0].index_add_(
            0, idx.reshape(-1), (g * c[:, None, None]).reshape(-1, module.embedding_dim)
        )

    return sq, weighted


def group_norm_statistics(
    module: nn.Module, output: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor] | None:
    """The mean and ``1/std`` per (example, group) that a ``GroupNorm``'s forward saved for its
    backward (read from ``output``'s autograd node before the backward pass frees them), or
    None when the node is not that op with this module's groups and eps."""
    node = output.grad_fn
    if not isinstance(module, nn.GroupNorm) or type(node).__name__ != "NativeGroupNormBackward0":
        return None
    try:
        if node._saved_group != module.num_groups or node._saved_eps != module.eps:  # type: ignore[union-attr]
            return None
        mean, rstd = node._saved_result1, node._saved_result2  # type: ignore[union-attr]
    except (AttributeError, RuntimeError):
        return None
    expected = (output.shape[0], module.num_groups)
    if mean.shape != expected or rstd.shape != expected:
        return None
    return mean.detach(), rstd.detach()


def _group_norm_weight_per_example(
    module: nn.GroupNorm,
    x: torch.Tensor,
    g: torch.Tensor,
    stats: tuple[torch.Tensor, torch.Tensor],
    store: dict[str, torch.Tensor] | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-example (weight, bias) gradients of a GroupNorm from the forward's statistics:
    ``sum_l g x_hat = rstd (sum_l g x - mean sum_l g)`` per channel, without forming
    ``x_hat`` (a pass over the activations less; for the first GroupNorm of the GroupNorm
    CNN, 16 MB written and read again per step). The product ``g x`` goes into a buffer kept
    in ``store`` (:func:`scratch`): ``linalg.vecdot`` wrote it to fresh memory, 4,096 page
    faults and 5 ms of system time a step on that layer."""
    batch, channels = x.shape[0], x.shape[1]
    mean, rstd = stats
    g3, x3 = g.reshape(batch, channels, -1), x.reshape(batch, channels, -1)
    bias_pe = g3.sum(-1)
    product = scratch(store, "product", tuple(g3.shape), g3)
    gx = torch.mul(g3, x3, out=product).sum(-1)  # (B, C): sum over positions of g * x
    per_group = (batch, module.num_groups, channels // module.num_groups)
    weight_pe = (gx.view(per_group) - mean.unsqueeze(2) * bias_pe.view(per_group)).mul_(
        rstd.unsqueeze(2)
    )
    return weight_pe.view(batch, channels), bias_pe


def _norm_affine_rule(layer: Layer) -> tuple[torch.Tensor, WeightedSum]:
    module = layer.module
    batch = layer.uses[0].output.shape[0]
    weight_pe: torch.Tensor | None = None
    bias_pe: torch.Tensor | None = None
    for use in layer.uses:
        x, g = use.inputs[0], use.out_grad
        if isinstance(module, nn.GroupNorm) and use.stats is not None:
            w, b = _group_norm_weight_per_example(module, x, g, use.stats, layer.workspace)
        else:
            if isinstance(module, nn.GroupNorm):
                x_hat = F.group_norm(x, module.num_groups, eps=module.eps)
                dims = tuple(range(2, x.dim()))  # sum over positions, keep channels
            else:
                assert isinstance(module, nn.LayerNorm)
                x_hat = F.layer_norm(x, module.normalized_shape, eps=module.eps)
                dims = tuple(range(1, x.dim() - len(module.normalized_shape)))
            w = (g * x_hat).sum(dims) if dims else g * x_hat
            b = g.sum(dims) if dims else g
        weight_pe = w if weight_pe is None else weight_pe + w
        bias_pe = b if bias_pe is None else bias_pe + b
    assert weight_pe is not None and bias_pe is not None
    per_example = []
    if module.weight is not None and module.weight.requires_grad:
        per_example.append(weight_pe.reshape(batch, *cast(torch.Tensor, module.weight).shape))
    if module.bias is not None and module.bias.requires_grad:
        per_example.append(bias_pe.reshape(batch, *cast(torch.Tensor, module.bias).shape))
    return per_example_rule(per_example)


RULES: dict[str, Callable[[Layer], tuple[torch.Tensor, WeightedSum]]] = {
    "linear": _linear_rule,
    "conv2d": conv2d_rule,
    "embedding": _embedding_rule,
    "norm": _norm_affine_rule,
}


def fast_path(module: nn.Module) -> str | None:
    """The fast rule of ``module`` (a key of :data:`RULES`), or None: the torch.func fallback.

    Exact types only: a subclass may change ``forward`` and so the gradient's structure.
    """
    kind = type(module)
    if kind is nn.Linear:
        return "linear"
    if kind is nn.Conv2d and module.padding_mode == "zeros" and not isinstance(module.padding, str):
        return "conv2d"
    if kind is nn.Embedding and module.max_norm is None and not module.scale_grad_by_freq:
        return "embedding"
    if kind in (nn.GroupNorm, nn.LayerNorm):
        return "norm"
    return None
