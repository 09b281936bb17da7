"""``Conv2d`` (zero padding): each example's squared gradient norm and the clipped sum.

Per-example weight gradients, ``B x C_out x C_in k^2`` (small for convolutions), by one of
four routes (:func:`_conv2d_weight_per_example` says which and why): a compiled direct kernel
(:mod:`.direct`) where it runs; else the weight gradient of one convolution with the examples
as groups; channels-last im2col and one batched product (a
single input channel, or few output positions); positions-last im2col and one product per
example over the positions (small kernels over many positions). Unless the ghost norm over
output positions is four times cheaper (``4 L^2 (k + C_out) < L C_out k``): two Gram matrices per example
and one contraction for the clipped sum. The rule's contract is
:mod:`fedsim.training.persample.rules`'.
"""

from __future__ import annotations

from typing import Literal, cast

import torch
import torch.nn.functional as F
from torch import nn

from fedsim.training.persample.base import (
    Layer,
    WeightedSum,
    concat,
    row_sq_norms,
    scratch,
)
from fedsim.training.persample.direct import (
    direct_applies,
    direct_weight_per_example,
    output_size,
)

__all__ = ["conv2d_rule"]

# Values held per chunk of examples by the routes that work a few examples at a time (the
# grouped convolution's inputs, output gradients and weight gradients; the positions-last
# route's patches): 4 MB of float32, whatever the batch and image size. One call of the
# grouped convolution over a whole batch of 256 allocated its output and working memory afresh
# every step, beyond what glibc keeps, and faulted them in again (GroupNorm CNN at B=256, 1
# thread: 4,200-4,600 page faults and 11-13 ms CPU a layer against none and 3.4-4.7 ms in
# chunks of 64; same values).
_CHUNK_VALUES = 1 << 20

RowOrder = Literal["weight", "channels_last", "kernel_major"]
"""The order of a convolution's per-example weight-gradient rows: the weight's own
(C_out, C_in, kh, kw), channels-last (C_out, kh, kw, C_in), or kernel-major
(C_in, kh, kw, C_out)."""


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
    oh, ow = output_size((height, width), (kh, kw), (sh, sw), (dh, dw))
    st = x.stride()
    view = x.as_strided(
        (batch, oh, ow, channels, kh, kw),
        (st[0], st[2] * sh, st[3] * sw, st[1], st[2] * dh, st[3] * dw),
    )
    out = x.new_empty((batch, oh * ow, module.groups, channels // module.groups * kh * kw))
    out.view(batch, oh, ow, channels, kh, kw).copy_(view)
    return out


def _padded(
    module: nn.Conv2d, x: torch.Tensor, store: dict[str, torch.Tensor] | None, *,
    channels_last: bool,
) -> torch.Tensor:
    """``x`` with the convolution's zero padding around it, in a kept :func:`scratch` buffer:
    (B, Hp, Wp, C) when ``channels_last``, else (B, C, Hp, Wp); ``x`` itself when it is
    already that (contiguous NCHW, no padding). Only the buffer's border is zeroed; its
    interior is overwritten."""
    ph, pw = cast(tuple[int, int], module.padding)  # a string padding takes the fallback
    if not (channels_last or ph or pw) and x.is_contiguous():
        return x
    batch, channels, height, width = x.shape
    if channels_last:
        rows, cols, name = 1, 2, "padded"
        shape = (batch, height + 2 * ph, width + 2 * pw, channels)
    else:
        rows, cols, name = 2, 3, "padded_nchw"
        shape = (batch, channels, height + 2 * ph, width + 2 * pw)
    padded = scratch(store, name, shape, x)
    for dim, pad, size in ((rows, ph, height), (cols, pw, width)):
        if pad:
            padded.narrow(dim, 0, pad).zero_()
            padded.narrow(dim, pad + size, pad).zero_()
    interior = padded.narrow(rows, ph, height).narrow(cols, pw, width)
    interior.copy_(x.permute(0, 2, 3, 1) if channels_last else x)
    return padded


def _windows(
    module: nn.Conv2d, x: torch.Tensor, store: dict[str, torch.Tensor] | None, *,
    channels_last: bool,
) -> torch.Tensor:
    """Every output position's kernel window over ``x`` with the convolution's zero padding,
    as a strided view of :func:`_padded`: (B, OH, OW, kh, kw, C) over an NHWC copy when
    ``channels_last``, else (B, C, kh, kw, OH, OW) over NCHW."""
    padded = _padded(module, x, store, channels_last=channels_last)
    kh, kw = module.kernel_size
    sh, sw = module.stride
    dh, dw = module.dilation
    if channels_last:
        batch, height, width, channels = padded.shape
    else:
        batch, channels, height, width = padded.shape
    oh, ow = output_size((height, width), (kh, kw), (sh, sw), (dh, dw))
    st = padded.stride()
    if channels_last:
        return padded.as_strided(
            (batch, oh, ow, kh, kw, channels),
            (st[0], st[1] * sh, st[2] * sw, st[1] * dh, st[2] * dw, st[3]))
    return padded.as_strided(
        (batch, channels, kh, kw, oh, ow),
        (st[0], st[1], st[2] * dh, st[3] * dw, st[2] * sh, st[3] * sw))


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
    windows = _windows(module, x, store, channels_last=True)
    batch, oh, ow, kh, kw, channels = windows.shape
    out = scratch(store, "patches", (batch, oh * ow, kh * kw * channels), x)
    out.view(windows.shape).copy_(windows)
    return out


def _patches_positions_last(
    module: nn.Conv2d, x: torch.Tensor, store: dict[str, torch.Tensor] | None = None
) -> torch.Tensor:
    """im2col of a ``groups == 1`` convolution as (B, C_in * kh * kw, L): the weight's patch
    order, positions last (``F.unfold``'s layout), into :func:`scratch` buffers of ``store``.

    The input is copied into a kept zero-bordered buffer (NCHW), then the patches are one
    strided copy whose contiguous runs are output rows (stride 1): for the GroupNorm CNN's
    first convolution (3 input channels, 3 x 3, 32 x 32 positions) 1.0 ms against 6.2 ms for
    the channels-last copy (runs of ``kw * C_in`` = 9 values), B=256, 1 thread.
    """
    windows = _windows(module, x, store, channels_last=False)
    batch, channels, kh, kw, oh, ow = windows.shape
    out = scratch(store, "patches_t", (batch, channels * kh * kw, oh * ow), x)
    out.view(windows.shape).copy_(windows)
    return out


def _conv2d_weight_per_example(
    module: nn.Conv2d,
    x: torch.Tensor,
    g: torch.Tensor,
    store: dict[str, torch.Tensor] | None = None,
) -> tuple[torch.Tensor, RowOrder]:
    """Per-example weight gradients of one call on ``x`` with output gradient ``g``, as
    contiguous rows (B, weight.numel()), and their :data:`RowOrder`.

    The compiled direct kernel (:mod:`.direct`) wherever it applies (float32 on a CPU with
    AVX2 and FMA, ``groups == 1``, output channels a multiple of 8): on the two CNNs'
    convolutions it measured faster than the torch routes below, or within their scatter
    (the GroupNorm CNN's second; figures in its module docstring); those serve everything
    else. Three torch routes. The grouped convolution (weight order): the batch is folded into the channels,
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
    Positions-last im2col (:func:`_patches_positions_last`) and one product per example over
    the positions, into kept buffers a few examples at a time (:data:`_CHUNK_VALUES`),
    where the kernel is small: at most twice as many
    weights per output channel as output channels (kernel-major rows): the patches are then
    at most twice the output gradients and are copied in runs of whole output rows
    (GroupNorm CNN conv 1, 3 x 3 x 3 weights a channel, 16 channels: 1.0 + 5.8 ms against
    14.3 ms grouped; on its conv 2 and 3, 144 and 288 weights a channel for 32 channels, the
    grouped convolution stays ahead: 4.4 and 3.4 ms against 14.0 and 8.5).
    The grouped convolution runs on chunks of examples (:data:`_CHUNK_VALUES`) into a
    kept buffer: the same values, without fresh memory each step.
    """
    batch = x.shape[0]
    weight = module.weight.detach()
    positions = g.shape[2] * g.shape[3]
    kernel = weight[0].numel()  # C_in * kh * kw
    if direct_applies(x, g, module.groups, module.out_channels):
        per_example = scratch(store, "direct", (batch, kernel * module.out_channels), x)
        direct_weight_per_example(
            _padded(module, x, store, channels_last=False), g.contiguous(), per_example,
            cast(tuple[int, int], module.kernel_size), cast(tuple[int, int], module.stride),
            cast(tuple[int, int], module.dilation))
        return per_example, "kernel_major"
    if module.groups == 1 and (module.in_channels == 1 or positions <= module.out_channels):
        patches = _patches_channels_last(module, x, store)  # (B, L, kh kw C_in)
        per_example = scratch(store, "per_example", (batch, module.out_channels, patches.shape[2]), x)
        torch.bmm(g.reshape(batch, module.out_channels, -1), patches, out=per_example)
        return per_example.view(batch, -1), "channels_last" if module.in_channels > 1 else "weight"
    if module.groups == 1 and kernel <= 2 * module.out_channels:
        # Small kernels over many positions: patches in long runs, at most twice the output
        # gradients' size, and one product per example whose inner dimension is the positions
        # (GroupNorm CNN conv 1, B=256, 1 thread: 1.0 + 5.8 ms against 14.3 grouped).
        # A few examples at a time: the kept patches stay a few MB whatever the batch and the
        # image (the same values; chunks of 16-37 examples measured as fast as the whole batch
        # or faster, as they stay in cache).
        per_example = scratch(store, "per_example_t", (batch, kernel, module.out_channels), x)
        chunk = max(1, _CHUNK_VALUES // (kernel * positions))
        for start in range(0, batch, chunk):
            xs, gs = x[start : start + chunk], g[start : start + chunk]
            patches_t = _patches_positions_last(module, xs, store)  # (chunk, K, L)
            torch.bmm(patches_t, gs.reshape(xs.shape[0], module.out_channels, -1).transpose(1, 2),
                      out=per_example[start : start + xs.shape[0]])
        return per_example.view(batch, -1), "kernel_major"
    rows = scratch(store, "grouped", (batch, weight.numel()), x)
    per_example_values = x[0].numel() + g[0].numel() + weight.numel()
    chunk = max(1, _CHUNK_VALUES // per_example_values)
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
    return rows, "weight"


def _weight_order(module: nn.Conv2d, rows: torch.Tensor, order: RowOrder) -> torch.Tensor:
    """Rows (..., weight.numel()) in ``order`` as the weight's (..., C_out, C_in, kh, kw)."""
    kh, kw = module.kernel_size
    lead = rows.shape[:-1]
    if order == "channels_last":
        return rows.reshape(*lead, module.out_channels, kh, kw, module.in_channels).movedim(-1, -3)
    if order == "kernel_major":
        return rows.reshape(*lead, module.in_channels, kh, kw, module.out_channels).movedim(-1, -4)
    return rows.reshape(*lead, module.out_channels, module.in_channels, kh, kw)


def _conv2d_per_example_rule(
    layer: Layer, module: nn.Conv2d, bias_pe: torch.Tensor | None
) -> tuple[torch.Tensor, WeightedSum]:
    """``Conv2d`` from materialised per-example weight gradients (and the bias's, summed over
    positions: ``bias_pe``)."""
    batch = layer.uses[0].output.shape[0]
    rows, order = _conv2d_weight_per_example(
        module,
        layer.uses[0].inputs[0],
        layer.uses[0].out_grad,
        layer.workspace if len(layer.uses) == 1 else None,  # one use: nothing overwritten
    )
    if len(layer.uses) > 1:  # a shared module: sum its uses per example, weight order
        rows = _weight_order(module, rows, order).reshape(batch, -1)
        for use in layer.uses[1:]:
            more, more_order = _conv2d_weight_per_example(module, use.inputs[0], use.out_grad)
            rows = rows + _weight_order(module, more, more_order).reshape(batch, -1)
        order = "weight"
    sq = row_sq_norms(rows)
    if bias_pe is not None:
        sq = sq + row_sq_norms(bias_pe)

    def weighted(c: torch.Tensor, outs: list[torch.Tensor]) -> None:
        if order != "weight":  # sum in the rows' order (one pass), then add in weight order
            outs[0].add_(_weight_order(module, torch.mv(rows.t(), c), order))
        else:
            outs[0].view(-1).addmv_(rows.t(), c)
        if bias_pe is not None:
            outs[-1].addmv_(bias_pe.t(), c)

    return sq, weighted


def conv2d_rule(layer: Layer) -> tuple[torch.Tensor, WeightedSum]:
    module = layer.module
    assert isinstance(module, nn.Conv2d)
    batch = layer.uses[0].output.shape[0]
    groups = module.groups
    cout = module.out_channels // groups
    g = concat([u.out_grad.reshape(batch, groups, cout, -1) for u in layer.uses], -1)  # (B, G, O, L)
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

    a = concat([_patches(module, u.inputs[0]) for u in layer.uses], 1)  # (B, L, G, K)
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
