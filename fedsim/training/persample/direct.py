"""Per-example weight gradients of a ``Conv2d`` by a compiled direct kernel (no patches).

For example ``b`` the weight gradient is ``G_b[o, c, ky, kx] = sum_(oy, ox) g_b[o, oy, ox]
x_b[c, oy sh + ky dh, ox sw + kx dw]`` over the zero-padded input ``x_b``: the weight
gradient of the convolution on that example alone (its per-example gradient under
add/remove-one neighbouring; the norms and clipping that use it are the rules'). torch has
no per-example form of its direct weight-gradient kernels; im2col (copying every kernel
window) then one product per example was the fastest torch route, and copying the windows
cost as much as the products. ``_conv_grad.c`` (beside this file) computes the sums directly
from the padded input in tiles of eight-wide fused multiply-adds; measured on this project's
CPU (AMD EPYC, AVX2, B=256, 1 thread, CPU ms a call, medians of 7, the same process): DP
MNIST CNN conv 1 2.0-2.2 against 6.2-6.5 by channels-last im2col + ``bmm``, conv 2 2.4
against 5.8-6.5; GroupNorm CNN conv 1 7.7 against 8.7-9.3 (positions-last route), conv 3 5.8
against 8.9-9.8 (grouped convolution), and conv 2 11.6-15.2 against 14.0-14.9 (within the
calls' scatter: no slower).

Used where the compiled kernel is vectorised (AVX2 and FMA: where it was measured), for
float32 CPU tensors of a ``groups == 1`` convolution whose output channels are a multiple of
eight. The kernel is built once per machine (:mod:`fedsim.training.native`) and checked
against an independent torch computation before use; without a compiler, elsewhere, or with
``FEDSIM_PURE_TORCH_CONV=1`` the torch routes of :mod:`.convolution` run (the same values up
to float32 summation order). Each example's sums run in one fixed order on one thread, so
the values do not depend on the number of threads.
"""

from __future__ import annotations

import ctypes
import functools
from pathlib import Path

import torch
import torch.nn.functional as F

from fedsim.logging import get_logger
from fedsim.training.native import load_library

__all__ = [
    "direct_applies",
    "direct_kernel_available",
    "direct_weight_per_example",
    "output_size",
    "reference_weight_per_example",
]

_log = get_logger("fedsim.training.persample.direct")
_SOURCE = Path(__file__).with_name("_conv_grad.c")
_LANES = 8  # output channels per vector: the kernel's tiles


class _Kernel:
    def __init__(self, library: ctypes.CDLL) -> None:
        self.vectorised = bool(library.fedsim_conv_grad_vectorised())
        self._run = library.fedsim_conv_grad_per_example
        self._run.argtypes = [ctypes.c_void_p] * 3 + [ctypes.c_int64] * 13 + [ctypes.c_int]
        self._run.restype = ctypes.c_int

    def run(self, padded: torch.Tensor, g: torch.Tensor, out: torch.Tensor,
            kernel_size: tuple[int, int], stride: tuple[int, int],
            dilation: tuple[int, int]) -> None:
        batch, channels, height, width = padded.shape
        _, channels_out, out_h, out_w = g.shape
        rc = self._run(padded.data_ptr(), g.data_ptr(), out.data_ptr(), batch, channels, height,
                       width, channels_out, out_h, out_w, *kernel_size, *stride, *dilation,
                       torch.get_num_threads())
        if rc != 0:
            raise MemoryError("the convolution kernel could not allocate its buffers")


def reference_weight_per_example(
    padded: torch.Tensor, g: torch.Tensor, kernel_size: tuple[int, int],
    stride: tuple[int, int], dilation: tuple[int, int],
) -> torch.Tensor:
    """The kernel's definition in torch (float64, ``F.unfold``): rows (B, C kh kw, O) of
    per-example weight gradients, kernel-major. For checks, not speed."""
    windows = F.unfold(padded.double(), kernel_size, dilation=dilation, stride=stride)
    return torch.bmm(windows, g.double().flatten(2).transpose(1, 2))


def _load() -> _Kernel | None:
    library = load_library(_SOURCE, what="per-example convolution", opt_out="FEDSIM_PURE_TORCH_CONV")
    if library is None:
        return None
    kernel = _Kernel(library)
    if not kernel.vectorised:  # measured only with AVX2 + FMA: the torch routes elsewhere
        return None
    # A miscompiled kernel must never give wrong gradients: check it against the definition
    # on a case that takes every tile family with a short last tile (14 weights a channel), a
    # stride and a dilation: 120 output channels are blocks of 4, 4, 4, 2 and 1 of 8 channels,
    # or (AVX-512) 4, 2 and 1 of 16 and a last block of 8.
    generator = torch.Generator().manual_seed(0)
    padded = torch.randn(3, 2, 9, 17, generator=generator)
    size, stride, dilation = (1, 7), (2, 1), (1, 2)
    out_h, out_w = output_size(padded.shape[2:], size, stride, dilation)
    g = torch.randn(3, 120, out_h, out_w, generator=generator)
    out = torch.empty(3, 2 * 7 * 120)
    kernel.run(padded, g, out, size, stride, dilation)
    expected = reference_weight_per_example(padded, g, size, stride, dilation).reshape(3, -1)
    if not torch.allclose(out.double(), expected, rtol=1e-4, atol=1e-4):
        _log.warning("the compiled per-example convolution kernel disagrees with its "
                     "definition; using the torch routes")
        return None
    return kernel


@functools.cache
def _native() -> _Kernel | None:
    """This process's kernel, built or loaded once (None: use the torch routes)."""
    return _load()


def direct_kernel_available() -> bool:
    """Whether per-example convolution gradients may use the compiled kernel."""
    return _native() is not None


def output_size(
    padded: tuple[int, ...] | torch.Size, size: tuple[int, int], stride: tuple[int, int],
    dilation: tuple[int, int],
) -> tuple[int, int]:
    """A convolution's output height and width over an input of ``padded`` (height, width),
    its padding already included."""
    return (
        (padded[0] - dilation[0] * (size[0] - 1) - 1) // stride[0] + 1,
        (padded[1] - dilation[1] * (size[1] - 1) - 1) // stride[1] + 1,
    )


def direct_applies(x: torch.Tensor, g: torch.Tensor, groups: int, channels_out: int) -> bool:
    """Whether :func:`direct_weight_per_example` takes this call (else a torch route)."""
    return (
        groups == 1
        and channels_out % _LANES == 0
        and x.dtype == g.dtype == torch.float32
        and x.device.type == g.device.type == "cpu"
        and _native() is not None
    )


def direct_weight_per_example(
    padded: torch.Tensor, g: torch.Tensor, out: torch.Tensor, kernel_size: tuple[int, int],
    stride: tuple[int, int], dilation: tuple[int, int],
) -> None:
    """Write the per-example weight gradients of a ``groups == 1`` convolution into ``out``
    (B, C_in kh kw C_out: kernel-major rows), from the zero-padded input ``padded`` (B, C_in,
    Hp, Wp) and the output gradient ``g`` (B, C_out, OH, OW).

    The shapes are checked here, as the C kernel reads by them: a mismatch is a ValueError,
    never a read outside the tensors. Call only where :func:`direct_applies`.
    """
    kernel = _native()
    if kernel is None:
        raise RuntimeError("the per-example convolution kernel is not available here")
    tensors = (padded, g, out)
    if padded.dim() != 4 or g.dim() != 4 or out.dim() != 2 or any(
        t.dtype != torch.float32 or t.device.type != "cpu" or not t.is_contiguous()
        for t in tensors
    ):
        raise ValueError("padded, g and out must be contiguous float32 CPU tensors of 4, 4 "
                         "and 2 dimensions")
    geometry = (kernel_size, stride, dilation)
    if any(len(pair) != 2 or any(type(v) is not int or v < 1 for v in pair) for pair in geometry):
        # Exactly two positive ints each: the C function takes them by position, and ctypes
        # would pass a third along, shifting every argument after it.
        raise ValueError(
            f"kernel size, stride and dilation must be pairs of positive ints, got {geometry}")
    batch, channels, height, width = padded.shape
    channels_out = g.shape[1]
    expected_out = (batch, channels * kernel_size[0] * kernel_size[1] * channels_out)
    if (g.shape[0] != batch or channels_out % _LANES
            or tuple(g.shape[2:]) != output_size((height, width), kernel_size, stride, dilation)
            or min(g.shape[2:]) < 1 or tuple(out.shape) != expected_out):
        raise ValueError(
            f"inconsistent shapes: padded input {tuple(padded.shape)}, output gradient "
            f"{tuple(g.shape)}, rows {tuple(out.shape)} for kernel {kernel_size}, stride "
            f"{stride}, dilation {dilation}")
    kernel.run(padded, g, out, kernel_size, stride, dilation)
