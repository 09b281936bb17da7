"""The process's memory allocator (glibc's ``malloc``): freed memory kept for the next step,
and given back to the operating system when much of it is free.

Why fedsim's processes change the allocator's thresholds. A training step allocates and
frees tens of MB of tensors (activations, their gradients, the per-example products), at the
same sizes every step. glibc serves them from its heap once its adaptive mmap threshold has
grown past their size, but gives the heap's free top back to the system whenever it exceeds
the adaptive trim threshold (twice the mmap threshold: at most 64 MB), and the next step's
first touch of each page faults it in again. Measured (``benchmarks/dp_step.py``'s models,
batch 256, one thread, CPU time per step, processes alternated): the GroupNorm CNN of
``scenarios/cifar10-groupnorm.yaml`` took 11,000-21,000 page faults and 24-44 ms of system
time a step (about a third of its CPU), plain SGD and DP-SGD alike; with the thresholds fixed
by :func:`keep_freed_memory` none, and the step took 15-30% less CPU. Every ``fedsim``
command calls it at start (:mod:`fedsim.cli`), and so do Ray's workers; it leaves glibc's
defaults alone where the user set glibc's own ``MALLOC_*`` variables or a ``glibc.malloc``
tunable, or ``FEDSIM_ALLOCATOR=system``. A library call
(``fedsim.simulate``) does not change a process-wide setting: call :func:`keep_freed_memory`
there, or set ``MALLOC_TRIM_THRESHOLD_`` and ``MALLOC_MMAP_THRESHOLD_`` before Python starts.

What the process holds instead: up to :data:`TRIM_THRESHOLD_BYTES` of free memory at the top
of each of its heaps (the main heap, and one per arena of the threads that allocated), and, as
before, whatever free chunks lie below a heap's top.
Simulations also call :func:`release_free_memory` at each window's end, which gives back the
free pages *inside* the heap as well once more than :data:`TRIM_FREE_BYTES` are free and more
than :data:`TRIM_LIVE_MULTIPLE` times the bytes in use (the resident size stays within about
three times the live heap). A
simulation of thousands of clients allocates and frees a parameter vector (hundreds of KB)
several times per round, with lifetimes that interleave (a client's model lives until its
next round, an update until its window closes), and a heap fragmented this way is not shrunk:
at 1,000 clients of hetero-100 the resident size stayed at 3.4 GB while 1 GB was live.
``malloc_trim(0)`` returns the free pages inside the heap (glibc >= 2.8), measured: 1.06 GB
resident at the end of the same run, CPU time unchanged within noise (benchmarks/scale.py).
Elsewhere than glibc every function here does nothing.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
from collections.abc import Mapping

from fedsim.errors import ConfigError

__all__ = ["ALLOCATOR_VARIABLE", "MMAP_THRESHOLD_BYTES", "allocator_choice", "TRIM_FREE_BYTES", "TRIM_LIVE_MULTIPLE",
           "TRIM_THRESHOLD_BYTES",
           "free_heap_bytes", "keep_freed_memory", "release_free_memory", "user_tuned"]

ALLOCATOR_VARIABLE = "FEDSIM_ALLOCATOR"
"""``keep`` (the default: :func:`keep_freed_memory` fixes the thresholds) or ``system``
(glibc's defaults are left as they are)."""

MMAP_THRESHOLD_BYTES = 32 * 2**20
"""Blocks from this size up get their own mapping, returned when freed: glibc's largest
threshold on 64-bit systems (``DEFAULT_MMAP_THRESHOLD_MAX``). Fixing it also stops its
adaptation, and with it the adaptive trim threshold."""

TRIM_FREE_BYTES = 256 * 2**20
"""Free heap bytes above which :func:`release_free_memory` trims. Below it the free pages are
kept: giving them back makes the next allocations of the same sizes fault them in again
(measured on hetero-100: trimming at every window cost about 15% of the run's CPU)."""

TRIM_LIVE_MULTIPLE = 2
""":func:`release_free_memory` trims only when the free heap is also more than this many times
the heap in use. A window's traffic is freed at its end and allocated again in the next: at
1,000 clients of hetero-100 about 800 MB free against 550 MB in use, every window. Trimmed
at 256 MB free, every window faulted its 400 KB vectors in again (12 virtual s, one run each
on 2 KVM cores, session 38: 2.6 M minor faults and 11.6 s of system time against 0.4 M and
3.5 s, the simulator at 579 against 661 sample gradients a CPU second, peak resident 1,797
against 1,830 MB; the end's 1,018 against 1,830). Past it the free heap is fragmentation to
give back, not the next window's working memory."""

TRIM_THRESHOLD_BYTES = TRIM_FREE_BYTES
"""The free top of the heap that ``free`` leaves in place (glibc's ``M_TRIM_THRESHOLD``):
the same bound as the windows' explicit trims."""

# mallopt's parameter numbers (glibc's malloc.h).
_M_TRIM_THRESHOLD = -1
_M_MMAP_THRESHOLD = -3



class _MallInfo2(ctypes.Structure):
    """glibc's ``struct mallinfo2`` (glibc >= 2.33): the allocator's byte counts."""

    _fields_ = [(name, ctypes.c_size_t) for name in (
        "arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks", "uordblks",
        "fordblks", "keepcost")]


def _libc() -> ctypes.CDLL | None:
    name = ctypes.util.find_library("c")
    if name is None:
        return None
    try:
        return ctypes.CDLL(name)
    except OSError:
        return None


_LIBC = _libc()
_TRIM = getattr(_LIBC, "malloc_trim", None)
if _TRIM is not None:
    _TRIM.argtypes = [ctypes.c_size_t]
    _TRIM.restype = ctypes.c_int
_INFO = getattr(_LIBC, "mallinfo2", None)
if _INFO is not None:
    _INFO.argtypes = []
    _INFO.restype = _MallInfo2
_MALLOPT = getattr(_LIBC, "mallopt", None)
if _MALLOPT is not None:
    _MALLOPT.argtypes = [ctypes.c_int, ctypes.c_int]
    _MALLOPT.restype = ctypes.c_int


def free_heap_bytes() -> int | None:
    """Bytes the allocator holds free in its heaps (glibc ``mallinfo2``); None where unknown."""
    if _INFO is None:
        return None
    return int(_INFO().fordblks)


def release_free_memory(
    threshold: int = TRIM_FREE_BYTES, live_multiple: float = TRIM_LIVE_MULTIPLE
) -> bool:
    """Return free heap pages to the OS (glibc ``malloc_trim``) when more than ``threshold``
    bytes are free and more than ``live_multiple`` times the bytes in use; True when it
    trimmed. Where the heap's bytes cannot be read (glibc < 2.33) it trims whenever called;
    where there is no ``malloc_trim`` it does nothing."""
    if _TRIM is None:
        return False
    if _INFO is not None:
        info = _INFO()
        if info.fordblks <= max(threshold, live_multiple * info.uordblks):
            return False
    _TRIM(0)
    return True


def allocator_choice(environ: Mapping[str, str] | None = None) -> str:
    """``FEDSIM_ALLOCATOR`` in ``environ`` (default: this process's): ``keep`` when unset;
    ConfigError for another value than ``keep`` or ``system``."""
    env = os.environ if environ is None else environ
    choice = env.get(ALLOCATOR_VARIABLE, "keep")
    if choice not in ("keep", "system"):
        raise ConfigError(f"{ALLOCATOR_VARIABLE} must be 'keep' or 'system', got {choice!r}")
    return choice


def user_tuned(environ: Mapping[str, str] | None = None) -> bool:
    """Whether ``environ`` (default: this process's) tunes glibc's allocator itself or asks
    for its defaults (:func:`allocator_choice` ``system``)."""
    env = os.environ if environ is None else environ
    choice = allocator_choice(env)
    # glibc reads its allocator's environment variables as MALLOC_*: any of them, or a
    # glibc.malloc tunable, means the user set the allocator, and it is theirs.
    return choice == "system" or any(name.startswith("MALLOC_") for name in env) or (
        "glibc.malloc" in env.get("GLIBC_TUNABLES", ""))


def keep_freed_memory(environ: Mapping[str, str] | None = None) -> bool:
    """Fix glibc's mmap threshold at :data:`MMAP_THRESHOLD_BYTES` and its trim threshold at
    :data:`TRIM_THRESHOLD_BYTES` for this process (see the module docstring); True when both
    were set. Nothing is changed where the user tuned the allocator or chose glibc's defaults
    (:func:`user_tuned`) or where there is no glibc ``mallopt``."""
    if user_tuned(environ) or _MALLOPT is None:
        return False
    # mallopt returns 1 on success, 0 for a value it refuses (a 32-bit glibc's largest mmap
    # threshold is smaller): then neither is changed, not half of the policy.
    if _MALLOPT(_M_MMAP_THRESHOLD, MMAP_THRESHOLD_BYTES) != 1:
        return False
    return bool(_MALLOPT(_M_TRIM_THRESHOLD, TRIM_THRESHOLD_BYTES) == 1)
