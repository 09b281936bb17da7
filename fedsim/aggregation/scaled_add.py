"""The server's ``d += s u``: a float32 update scaled into its float64 window direction
(:class:`fedsim.aggregation.mixing.RunningDirection`), in one pass.

numpy does it in three passes over the whole vector (widen into a float64 scratch, multiply,
add): 0.21 ms of a 1.5 ms round in a 10^3-client simulation (docs/SCALE.md, "Round cost").
The compiled kernel (``_scaled_add.c``, built by :mod:`fedsim.training.native`) makes one pass
with the same arithmetic: each product rounded, then each sum, in float64, so its results are
numpy's to the bit; the loader checks that on probes before use. It reads an update at any
alignment (a decoded one is a view into its frame); numpy's path remains for other dtypes and
layouts, when there is no compiler, or with ``FEDSIM_PURE_NUMPY_ADD=1``.
(A client's local step ``w - eta u`` was tried the same way and kept in numpy: its cost is
writing the new vector, 77 against 84 us for 10^5 values.)
"""

from __future__ import annotations

import ctypes
import functools
from collections.abc import Callable
from pathlib import Path

import numpy as np

from fedsim.training.native import load_function, misaligned

__all__ = ["add_scaled"]

_SOURCE = Path(__file__).with_name("_scaled_add.c")


def add_scaled(total: np.ndarray, update: np.ndarray, scale: float,
               scratch: np.ndarray | None = None) -> None:
    """``total += float64(update) * scale`` in place (``total`` float64, ``update`` float32 of
    its size); numpy's path widens ``update`` into ``scratch`` (float64, the size of
    ``total``; a fresh array if None) first."""
    kernel = _kernel()
    if (kernel is not None and total.dtype == np.float64 and total.flags.c_contiguous
            and total.flags.aligned and total.flags.writeable and update.dtype == np.float32
            and update.flags.c_contiguous and update.size == total.size
            and not np.may_share_memory(total, update)):
        # (an update may be unaligned: a decoded one is a view into its frame)
        kernel(total.ctypes.data, update.ctypes.data, float(scale), total.size)
        return
    widened = np.empty(total.shape, dtype=np.float64) if scratch is None else scratch
    np.copyto(widened, update.reshape(total.shape))
    widened *= scale
    total += widened


@functools.cache
def _kernel() -> Callable[[int, int, float, int], None] | None:
    """The compiled ``d += s u`` of this process (built or loaded once), or None."""
    # Without -ffast-math: under it clang fuses the multiply and the add (one rounding, not
    # numpy's two) whatever the source asks, and the probes would refuse the kernel.
    kernel: Callable[[int, int, float, int], None] | None = load_function(
        _SOURCE, "fedsim_add_scaled_f64",
        argtypes=[ctypes.c_void_p, ctypes.c_void_p, ctypes.c_double, ctypes.c_int64],
        restype=None, agrees=_agrees, what="window mix", opt_out="FEDSIM_PURE_NUMPY_ADD",
        fast_math=False)
    return kernel


def _agrees(kernel: Callable[[int, int, float, int], None]) -> bool:
    """Whether the kernel gives numpy's result to the bit on vectors of every length around
    the vector widths, with scales whose products round (and NaN and inf, which must
    propagate)."""
    rng = np.random.default_rng(0)
    for size in (0, 1, 7, 8, 9, 15, 16, 17, 33, 1037):
        update = (rng.standard_normal(size) * 10.0 ** rng.uniform(-20, 20)).astype(np.float32)
        if size > 2:
            update[1], update[2] = np.nan, np.inf
        for scale in (0.1, -1.0 / 3.0, 7e-5):
            start = rng.standard_normal(size)
            total, unaligned_total, expected = start.copy(), start.copy(), start.copy()
            widened = update.astype(np.float64)
            with np.errstate(invalid="ignore", over="ignore"):  # the NaN and inf probes
                widened *= scale
                expected += widened
            kernel(total.ctypes.data, update.ctypes.data, scale, size)
            shifted = misaligned(update)
            kernel(unaligned_total.ctypes.data, shifted.ctypes.data, scale, size)
            if total.tobytes() != expected.tobytes() or (
                    unaligned_total.tobytes() != expected.tobytes()):
                return False
    return True
