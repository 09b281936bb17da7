"""The integrity norm of an update: its L2 norm, accumulated in float64, which is also its
finiteness check (one pass for both).

A float32 sum of squares of finite values near 3.4e38 would overflow, while in float64 the sum
of n finite squares is at most n * 1.2e77, finite for any vector that fits in memory: so the
norm is finite if and only if every value is. Every update a client seals and a server decodes
is measured here once (:mod:`fedsim.protocol.codec`), and the server's admission compares the
norm with the client's bound (:mod:`fedsim.runtime.actors.integrity`).

A float32 vector goes through a compiled kernel (``_sum_squares.c``, built by
:mod:`fedsim.training.native`): one pass that widens the floats in registers, where numpy first
converts the vector into a float64 buffer and then sums it (two passes; about 0.1 ms for 10^5
values). The kernel adds in a fixed order of its own, so its norm can differ from numpy's in
the last bits (the same on every run of one machine); it is checked against numpy on finite,
NaN and infinite probes before use, and numpy's path remains for other dtypes, when there is
no compiler, or with ``FEDSIM_PURE_NUMPY_NORM=1``.

A sender that checks its update before giving it up (a client does, before it charges the
round to its ledger) measures it with :func:`given_up_norm`: the array is made read-only and
its norm is remembered, so that the codec's check of the same unchanged array when it is sent
(:func:`known_norm`) takes the remembered norm instead of reading the vector again. Only an
array that owns its memory is remembered (a view could change through its base), only while
it stays read-only, only by the thread that measured it, and only while it lives (its entry
goes with it: what is remembered is bounded by the given-up arrays alive, not by a run's
length). The code that makes an update may measure it for its sender at once, while the
vector is in cache (:func:`measured_for_sender`: the batched pass,
:class:`fedsim.training.batched.RoundBatcher`'s ``measure``): the sender's own check of the
same read-only array then takes that norm, once; any other give-up reads the array.
"""

from __future__ import annotations

import ctypes
import functools
import math
import threading
import weakref
from collections.abc import Callable
from pathlib import Path

import numpy as np

from fedsim.training.native import load_function, misaligned

__all__ = ["given_up_norm", "known_norm", "measured_for_sender", "numpy_vector_norm", "scratch",
           "vector_norm"]

_SOURCE = Path(__file__).with_name("_sum_squares.c")


def vector_norm(values: np.ndarray) -> float:
    """The L2 norm of ``values`` accumulated in float64; finite exactly when every value is
    (see the module docstring)."""
    values = np.asarray(values)
    if values.dtype == np.float32:
        kernel = _kernel()
        if kernel is not None:
            # Any layout is summed as its C-order copy: one vector's norm does not depend on
            # how it is laid out (a strided update and the frame it is sent as agree).
            flat = np.ascontiguousarray(values).reshape(-1)
            return math.sqrt(kernel(flat.ctypes.data, flat.size))
    return numpy_vector_norm(values)


class _Remembered(threading.local):
    """The arrays this thread measured and still alive: ``id`` -> (a weak reference to the
    array, its norm, whether its maker handed the measurement on to its sender's give-up:
    :func:`measured_for_sender`)."""

    def __init__(self) -> None:
        self.norms: dict[int, tuple[weakref.ref[np.ndarray], float, bool]] = {}


_remembered = _Remembered()


def measured_for_sender(values: np.ndarray) -> float:
    """:func:`given_up_norm` by the code that makes ``values`` for a sender, at once (while
    the vector is in cache): the sender's own :func:`given_up_norm` of the same array, still
    read-only, then takes this norm instead of reading it again - once. The maker must not
    write the array after this call (the batched pass: :class:`~fedsim.training.batched.
    RoundBatcher`'s ``measure``)."""
    return _measure(values, handed_on=True)


def given_up_norm(values: np.ndarray) -> float:
    """:func:`vector_norm` of an array its sender gives up: made read-only first (numpy then
    refuses writes through it), and remembered for :func:`known_norm` when it owns its
    memory. The sender must not make it writeable again, nor write its memory through
    anything made from it before (a torch tensor or numpy view): fedsim's senders never do
    (a batched round's update outlives its pass's tensors, which stop writing it before it is
    measured: tested). The array is read here unless its maker measured it for this give-up
    (:func:`measured_for_sender`), which is taken once: given up again, it is read again."""
    was_writeable = values.flags.writeable
    values.flags.writeable = False
    if values.base is None and not was_writeable:
        known = _remembered.norms.get(id(values))
        if known is not None and known[2] and known[0]() is values:
            _remembered.norms[id(values)] = (known[0], known[1], False)  # taken
            return known[1]
    return _measure(values, handed_on=False)


def _measure(values: np.ndarray, *, handed_on: bool) -> float:
    """Make ``values`` read-only, measure it, and remember the norm when it owns its memory
    (an entry that goes with the array: what is remembered is bounded by the live arrays)."""
    values.flags.writeable = False
    norm = vector_norm(values)
    if values.base is not None:
        return norm
    held = _remembered.norms
    key = id(values)

    def forget(ref: weakref.ref[np.ndarray], key: int = key,
               held: dict[int, tuple[weakref.ref[np.ndarray], float, bool]] = held) -> None:
        entry = held.get(key)
        if entry is not None and entry[0] is ref:  # (not a later array's at a reused id)
            del held[key]

    entry = held.get(key)
    ref = entry[0] if entry is not None and entry[0]() is values else weakref.ref(values, forget)
    held[key] = (ref, norm, handed_on)
    return norm


def known_norm(values: np.ndarray) -> float | None:
    """The norm last measured of this very array in this thread (:func:`given_up_norm`,
    :func:`measured_for_sender`), if nothing could have changed it since (it owns its memory
    and is still read-only); else None."""
    if values.flags.writeable:
        return None
    known = _remembered.norms.get(id(values))
    if known is None or known[0]() is not values:
        return None
    return known[1]


def numpy_vector_norm(values: np.ndarray) -> float:
    """:func:`vector_norm` in numpy: the values converted to float64 (in this thread's reused
    buffer), then one ``einsum`` over them."""
    as64 = _as_float64(values)
    # einsum, not np.dot: a BLAS dot wakes the BLAS thread pool for every update, measured
    # 2.2 ms of CPU (5.7 ms wall) per 10^5-parameter update on a busy 2-core machine against
    # 0.24 ms (benchmarks/scale.py; docs/SCALE.md).
    return math.sqrt(float(np.einsum("i,i->", as64, as64)))


@functools.cache
def _kernel() -> Callable[[int, int], float] | None:
    """The compiled sum of squares of this process (built or loaded once), or None."""
    kernel: Callable[[int, int], float] | None = load_function(
        _SOURCE, "fedsim_sum_squares", argtypes=[ctypes.c_void_p, ctypes.c_int64],
        restype=ctypes.c_double, agrees=_agrees, what="update norm",
        opt_out="FEDSIM_PURE_NUMPY_NORM")
    return kernel


def _agrees(function: Callable[[int, int], float]) -> bool:
    """Whether a loaded kernel gives numpy's norm (to float64 rounding) on finite vectors of
    every length around its lanes, and a non-finite norm for NaN and inf anywhere in them."""
    rng = np.random.default_rng(0)
    for size in (0, 1, 15, 16, 17, 33, 1037):
        probe = (rng.standard_normal(size) * 10.0 ** rng.uniform(-20, 20)).astype(np.float32)
        expected = numpy_vector_norm(probe)
        # (and at an odd byte offset, as a decoded update's view into its frame may lie)
        shifted = misaligned(probe)
        for vector in (probe, shifted):
            if not math.isclose(math.sqrt(function(vector.ctypes.data, size)), expected,
                                rel_tol=1e-12, abs_tol=0.0):
                return False
        for bad in (np.nan, np.inf, -np.inf):
            for at in {0, size // 2, size - 1} if size else set():
                spoiled = probe.copy()
                spoiled[at] = bad
                if math.isfinite(function(spoiled.ctypes.data, size)):
                    return False
    huge = np.full(1000, np.finfo(np.float32).max, dtype=np.float32)  # finite: its norm too
    return math.isclose(math.sqrt(function(huge.ctypes.data, huge.size)),
                        numpy_vector_norm(huge), rel_tol=1e-12)


class _Scratch(threading.local):
    """This thread's reused buffers, one per dtype, each grown to the largest size asked."""

    def __init__(self) -> None:
        self.buffers: dict[np.dtype, np.ndarray] = {}


_scratch = _Scratch()


def scratch(size: int, dtype: type[np.floating] | np.dtype) -> np.ndarray:
    """A flat array of ``size`` values of ``dtype`` in this thread's reused buffer (its
    contents whatever was left there), valid until this thread's next call for that dtype: a
    fresh 0.4-0.8 MB vector per round is memory the allocator hands out cold."""
    kind = np.dtype(dtype)
    buffer = _scratch.buffers.get(kind)
    if buffer is None or buffer.size < size:
        buffer = _scratch.buffers[kind] = np.empty(size, dtype=kind)
    return buffer[:size]


def _as_float64(values: np.ndarray) -> np.ndarray:
    """``values`` as a flat contiguous float64 array: the same values in the same order as
    ``np.asarray(values, dtype=np.float64).ravel()`` (so every sum over it is bit for bit
    the same), but a float32 vector is converted into this thread's reused buffer, not a
    fresh array: a fresh 0.8 MB per received update is memory the allocator hands out anew
    (measured in a 1,000-client run: the norm's 0.126 ms a round became 0.087, docs/SCALE.md).
    Valid until this thread's next call."""
    values = np.asarray(values)
    if values.dtype == np.float64 or values.dtype.kind != "f":
        return np.asarray(values, dtype=np.float64).ravel()
    size = values.size
    out = scratch(size, np.float64)
    np.copyto(out.reshape(values.shape), values)
    return out
