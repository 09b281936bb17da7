"""Per-layer fast paths: each example's squared gradient norm and the clipped sum of one layer.

From the layer's recorded inputs ``a`` and the gradients ``g`` of the loss with respect to its
outputs (see :mod:`fedsim.training.persample`), without the per-example gradient where the
layer's structure allows it:

* ``Linear`` on (B, d): ``||g_i a_i^T||^2 = ||g_i||^2 ||a_i||^2``; on sequences (B, T, d)
  the ghost norm ``sum_{t,s} (a_t.a_s)(g_t.g_s)`` when ``2 T^2 < d_in d_out``, else the
  per-example gradient;
* ``Conv2d`` (zero padding): per-example gradients, ``B x C_out x C_in k^2`` (small for
  convolutions), as the weight gradient of one convolution with the examples as groups (or, for
  a single input channel or few output positions, channels-last im2col and one batched matrix
  product), unless the ghost norm over
  output positions is cheaper (``L^2 (k + C_out) < L C_out k``);
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
from dataclasses import dataclass, field
from typing import Any, cast

import torch
import torch.nn.functional as F
from torch import nn

__all__ = [
    "RULES",
    "Layer",
    "Use",
    "WeightedSum",
    "fast_path",
    "group_norm_statistics",
    "linear_sq_norms",
    "per_example_rule",
]


WeightedSum = Callable[[torch.Tensor, list[torch.Tensor]], None]

# Values (inputs, output gradients and weight gradients of the examples) per call of the grouped
# convolution that gives per-example Conv2d gradients: 4 MB of float32. One call over a whole
# batch of 256 allocated its output and working memory afresh every step, beyond what glibc
# keeps, and faulted them in again (GroupNorm CNN at B=256, 1 thread: 4,200-4,600 page faults
# and 11-13 ms CPU a layer against none and 3.4-4.7 ms in chunks of 64; same values).
_GROUPED_CHUNK_VALUES = 1 << 20


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


def _cat(parts: list[torch.Tensor], dim: int) -> torch.Tensor:
    return parts[0] if len(parts) == 1 else torch.cat(parts, dim)


def _row_sq_norms(per_example: torch.Tensor) -> torch.Tensor:
    # A fused reduction: no B x P temporary for the squares.
    return torch.linalg.vector_norm(per_example.flatten(1), dim=1).square()


def per_example_rule(per_example: list[torch.Tensor]) -> tuple[torch.Tensor, WeightedSum]:
    """Norms and weighted sum from materialised per-example gradients (B, *param.shape)."""
    sq = _row_sq_norms(per_example[0])
    for p in per_example[1:]:
        sq = sq + _row_sq_norms(p)

    def weighted(c: torch.Tensor, outs: list[torch.Tensor]) -> None:
        for out, p in zip(outs, per_example, strict=True):
            # One fused pass (p^T c added in place): no parameter-sized temporary.
            out.view(-1).addmv_(p.reshape(p.shape[0], -1).t(), c)

    return sq, weighted


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


def _linear_single_step(
    a: torch.Tensor, g: torch.Tensor, has_weight: bool, has_bias: bool
) -> tuple[torch.Tensor, WeightedSum]:
    """``Linear`` on (B, d_in) -> (B, d_out): the norms of :func:`linear_sq_norms`."""
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
        return _linear_single_step(a, g, has_weight, has_bias)
    batch = first.output.shape[0]
    # Every use becomes positions along one sequence axis: (B, T, d).
    a = _cat([u.inputs[0].reshape(batch, -1, module.in_features) for u in layer.uses], 1)
    g = _cat([u.out_grad.reshape(batch, -1, module.out_features) for u in layer.uses], 1)
    steps = a.shape[1]
    if steps == 1:
        return _linear_single_step(a[:, 0], g[:, 0], has_weight, has_bias)

    per_example: list[torch.Tensor] = []
    sq = torch.zeros(batch, dtype=g.dtype, device=g.device)
    if has_weight:
        if 2 * steps * steps < module.in_features * module.out_features:
            sq = sq + (torch.bmm(a, a.transpose(1, 2)) * torch.bmm(g, g.transpose(1, 2))).sum(
                (1, 2)
            )
        else:
            per_example.append(torch.einsum("bto,bti->boi", g, a))
            sq = sq + _row_sq_norms(per_example[0])
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


def _patches(module: nn.Conv2d, x: torch.Tensor) -> torch.Tensor:
    """im2col as (B, L, G, C_in/G * kh * kw): one strided copy, positions-major (the ghost
    norm's; the per-example path uses :func:`_patches_channels_last`).

    The channel-major patch order matches the weight layout (C_out, C_in/G, kh, kw). This is
    about twice as fast on CPU as ``F.unfold`` and leaves the patches ready for ``bmm``.
    """
    ph, pw = cast(tuple[int, int], module.padding)  # a string padding takes the fallback
    if ph or pw:
        x = F.pad(x, (pw, pw, ph, ph))
    batch, channels, height, width = x.shape
    kh, kw = module.kernel_size
    sh, sw = module.stride
    dh, dw = module.dilation
    oh = (height - dh * (kh - 1) - 1) // sh + 1
    ow = (width - dw * (kw - 1) - 1) // sw + 1
    st = x.stride()
    view = x.as_strided(
        (batch, oh, ow, channels, kh, kw),
        (st[0], st[2] * sh, st[3] * sw, st[1], st[2] * dh, st[3] * dw),
    )
    out = x.new_empty((batch, oh * ow, module.groups, channels // module.groups * kh * kw))
    out.view(batch, oh, ow, channels, kh, kw).copy_(view)
    return out


def _patches_channels_last(
    module: nn.Conv2d, x: torch.Tensor, store: dict[str, torch.Tensor] | None = None
) -> torch.Tensor:
    """im2col of a ``groups == 1`` convolution as (B, L, kh * kw * C_in), in *channels-last*
    patch order (kh, kw, C_in), into :func:`scratch` buffers of ``store`` when given.

    The input is first copied channels-last into a kept buffer with the zero padding around
    it; the patches are then a strided copy whose contiguous runs are ``kw * C_in`` values
    instead of ``kw`` (:func:`_patches`, weight order). Measured on CPU (B=256, 1 thread,
    second conv of the DP MNIST CNN, 16 x 13 x 13 -> 25 positions x 256): 0.7 ms against
    2.6-2.8 ms. With one input channel both orders are the weight's.
    """
    ph, pw = cast(tuple[int, int], module.padding)  # a string padding takes the fallback
    batch, channels, height, width = x.shape
    padded = scratch(store, "padded", (batch, height + 2 * ph, width + 2 * pw, channels), x)
    if ph:  # the border only; the interior is overwritten below
        padded[:, :ph].zero_()
        padded[:, ph + height :].zero_()
    if pw:
        padded[:, :, :pw].zero_()
        padded[:, :, pw + width :].zero_()
    padded[:, ph : ph + height, pw : pw + width].copy_(x.permute(0, 2, 3, 1))
    kh, kw = module.kernel_size
    sh, sw = module.stride
    dh, dw = module.dilation
    oh = (height + 2 * ph - dh * (kh - 1) - 1) // sh + 1
    ow = (width + 2 * pw - dw * (kw - 1) - 1) // sw + 1
    st = padded.stride()
    view = padded.as_strided(
        (batch, oh, ow, kh, kw, channels),
        (st[0], st[1] * sh, st[2] * sw, st[1] * dh, st[2] * dw, st[3]),
    )
    out = scratch(store, "patches", (batch, oh * ow, kh * kw * channels), x)
    out.view(batch, oh, ow, kh, kw, channels).copy_(view)
    return out


def _conv2d_weight_per_example(
    module: nn.Conv2d,
    x: torch.Tensor,
    g: torch.Tensor,
    store: dict[str, torch.Tensor] | None = None,
) -> tuple[torch.Tensor, bool]:
    """Per-example weight gradients of one call on ``x`` with output gradient ``g``, as
    contiguous rows (B, weight.numel()), and whether their order is channels-last,
    (C_out, kh, kw, C_in), rather than the weight's (C_out, C_in, kh, kw).

    Two ways. The grouped convolution (weight order): the batch is folded into the channels,
    ``(1, B C_in, H, W)``, and the weight gradient of a convolution with ``B * groups`` groups
    is exactly every example's own (the trick of torch.func's batching rule for
    convolutions). Channels-last im2col (:func:`_patches_channels_last`) and one batched
    product, both into buffers kept in ``store`` (:func:`scratch`), where the patches are
    cheap: one input channel (they are the kernel windows themselves) or no more output
    positions than output channels (the patches are then no larger than the gradients).
    Measured on CPU (B=256, 1 thread, CPU time, medians of interleaved runs): the grouped
    convolution is 1.6-9x faster on the 3x3 padded layers of the GroupNorm CNN, whose patches
    are 8-64 times the gradients; on both layers of the DP MNIST CNN im2col into kept buffers
    costs less, mostly because the grouped convolution's output is fresh memory every step
    (page faults: user + system time per step 36 ms against 38-41 ms, plain SGD 25 ms).
    The grouped convolution runs on chunks of examples (:data:`_GROUPED_CHUNK_VALUES`) into a
    kept buffer: the same values, without fresh memory each step.
    """
    batch = x.shape[0]
    weight = module.weight.detach()
    positions = g.shape[2] * g.shape[3]
    if module.groups == 1 and (module.in_channels == 1 or positions <= module.out_channels):
        patches = _patches_channels_last(module, x, store)  # (B, L, kh kw C_in)
        per_example = scratch(store, "per_example", (batch, module.out_channels, patches.shape[2]), x)
        torch.bmm(g.reshape(batch, module.out_channels, -1), patches, out=per_example)
        return per_example.view(batch, -1), module.in_channels > 1
    rows = scratch(store, "grouped", (batch, weight.numel()), x)
    per_example_values = x[0].numel() + g[0].numel() + weight.numel()
    chunk = max(1, _GROUPED_CHUNK_VALUES // per_example_values)
    for start in range(0, batch, chunk):
        xs, gs = x[start : start + chunk], g[start : start + chunk]
        examples = xs.shape[0]
        _, grad_weight, _ = torch.ops.aten.convolution_backward(
            gs.reshape(1, -1, *gs.shape[2:]),
            xs.reshape(1, -1, *xs.shape[2:]),
            # Only its shape matters for the weight gradient: not a copy of the weight (for
            # the MNIST CNN's second layer that copy was 8 MB a step).
            weight.new_empty((examples * weight.shape[0], *weight.shape[1:])),
            None,
            list(module.stride),
            list(module.padding),
            list(module.dilation),
            False,
            [0, 0],
            module.groups * examples,
            [False, True, False],
        )
        rows[start : start + examples].copy_(grad_weight.view(examples, -1))
    return rows, False


def _weight_order(module: nn.Conv2d, rows: torch.Tensor) -> torch.Tensor:
    """Channels-last rows (..., C_out kh kw C_in) as the weight's (..., C_out, C_in, kh, kw)."""
    kh, kw = module.kernel_size
    shape = (*rows.shape[:-1], module.out_channels, kh, kw, module.in_channels)
    return rows.reshape(shape).movedim(-1, -3)


def _conv2d_per_example_rule(
    layer: Layer, module: nn.Conv2d, bias_pe: torch.Tensor | None
) -> tuple[torch.Tensor, WeightedSum]:
    """``Conv2d`` from materialised per-example weight gradients (and the bias's, summed over
    positions: ``bias_pe``)."""
    batch = layer.uses[0].output.shape[0]
    rows, channels_last = _conv2d_weight_per_example(
        module,
        layer.uses[0].inputs[0],
        layer.uses[0].out_grad,
        layer.workspace if len(layer.uses) == 1 else None,  # one use: nothing overwritten
    )
    if len(layer.uses) > 1:  # a shared module: sum its uses per example, weight order
        if channels_last:
            rows = _weight_order(module, rows).reshape(batch, -1)
        for use in layer.uses[1:]:
            more, more_cl = _conv2d_weight_per_example(module, use.inputs[0], use.out_grad)
            rows = rows + (_weight_order(module, more).reshape(batch, -1) if more_cl else more)
        channels_last = False
    sq = _row_sq_norms(rows)
    if bias_pe is not None:
        sq = sq + _row_sq_norms(bias_pe)

    def weighted(c: torch.Tensor, outs: list[torch.Tensor]) -> None:
        if channels_last:  # sum in the rows' order (one pass), then add in weight order
            outs[0].add_(_weight_order(module, torch.mv(rows.t(), c)))
        else:
            outs[0].view(-1).addmv_(rows.t(), c)
        if bias_pe is not None:
            outs[-1].addmv_(bias_pe.t(), c)

    return sq, weighted


def _conv2d_rule(layer: Layer) -> tuple[torch.Tensor, WeightedSum]:
    module = layer.module
    assert isinstance(module, nn.Conv2d)
    batch = layer.uses[0].output.shape[0]
    groups = module.groups
    cout = module.out_channels // groups
    g = _cat([u.out_grad.reshape(batch, groups, cout, -1) for u in layer.uses], -1)  # (B, G, O, L)
    positions = g.shape[-1]
    kh, kw = module.kernel_size
    k = module.in_channels // groups * kh * kw
    has_weight = module.weight.requires_grad
    has_bias = module.bias is not None and module.bias.requires_grad
    bias_pe = g.sum(-1).reshape(batch, -1) if has_bias else None
    # Ghost norms need two L x L Gram matrices plus a second contraction for the clipped sum.
    # Measured on CPU (B=256, second conv of the DP MNIST CNN, L=25, K=256, O=32, ghost FLOPs
    # 12% lower): per-example gradients by im2col 7.7 ms, ghost 11.7 ms; so ghost only when 4x
    # cheaper (the grouped-convolution per-example path is faster still).
    ghost = 4 * positions * positions * (k + cout) < positions * cout * k
    if has_weight and not ghost:
        return _conv2d_per_example_rule(layer, module, bias_pe)

    a = _cat([_patches(module, u.inputs[0]) for u in layer.uses], 1)  # (B, L, G, K)
    sq = torch.zeros(batch, dtype=g.dtype, device=g.device)
    if has_weight:
        gram_a = torch.einsum("blgk,bmgk->bglm", a, a)
        gram_g = torch.einsum("bgol,bgom->bglm", g, g)
        sq = sq + (gram_a * gram_g).sum((1, 2, 3))
    if bias_pe is not None:
        sq = sq + bias_pe.pow(2).sum(1)

    def weighted(c: torch.Tensor, outs: list[torch.Tensor]) -> None:
        if has_weight:
            outs[0].add_(
                torch.einsum("bgol,blgk->gok", g * c[:, None, None, None], a).reshape(
                    module.weight.shape
                )
            )
        if bias_pe is not None:
            outs[-1].add_(torch.tensordot(c, bias_pe, dims=1))

    return sq, weighted


def _embedding_rule(layer: Layer) -> tuple[torch.Tensor, WeightedSum]:
    module = layer.module
    assert isinstance(module, nn.Embedding)
    batch = layer.uses[0].output.shape[0]
    idx = _cat([u.inputs[0].reshape(batch, -1) for u in layer.uses], 1)
    g = _cat([u.out_grad.reshape(batch, -1, module.embedding_dim) for u in layer.uses], 1)
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
    "conv2d": _conv2d_rule,
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
