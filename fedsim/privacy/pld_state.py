"""The composed PLD as a state that grows by one step at a time (incremental composition).

A composed privacy-loss PMF is, in the Fourier domain, the product of its factors' spectra:
``prod_b F_b^{n_b}`` (one factor per distinct kind of step ``b``, ``n_b`` copies). Its log,
``sum_b n_b log F_b``, is a sum, so one more step is one more term: :class:`SpectrumSum`
keeps that sum and is extended in O(L) per step (L the FFT size), whatever the length of the
history. A ledger asks for eps by inverting the sum once (one inverse FFT), not by
re-composing its history.

Exactness, not just closeness. The sum is kept in *fixed point* on int64: the log modulus in
units of 2^-56 (saturating below ``-60``: a spectrum value below ``e^-60 ~ 1e-26`` changes no
atom by more than that; saturating is associative because only frequencies far from 0, where
every term is negative, reach the floor) and the phase in units of 2^-62 turns (int64
arithmetic wraps modulo 2^64 = 4 turns, so phases add exactly). Integer sums do not depend on
the order of their terms, so the state reached by composing a history step by step (with dry
runs in between, see :meth:`SpectrumSum.copy`) is *bit for bit* the state the one-shot
composition builds from the history's counts: the accountant's eps is a function of the
multiset of steps, however it was fed. (With floating-point sums the two paths would differ in
the last bits and neither would bound the other.) Each factor's DFT runs in extended precision
and is quantised to 2^-57, so the relative spectrum error after n copies is about n 1e-17.

Everything else a composition needs (the output window from Chernoff bounds, the lower end,
the mass at +infinity) is a small sum over the distinct kinds, recomputed from the counts in
sorted order at each answer. The FFT size is the power of two covering the window; when the
window outgrows it (the history's loss spreads like sqrt(T)), the sum is rebuilt at twice the
size from the counts (O(log T) times over a history).

Pessimism (every atom returned is an upper bound on the composed atom): mass below the window
can only wrap upwards; mass above it is bounded by ``tail_mass / 2`` (Chernoff) and charged to
+infinity. FFT rounding leaves noise of about the same size on every atom (the inverse DFT
spreads each frequency's error over all atoms alike); the true PMF is >= 0, so the deepest
negative value of the whole circular output measures that noise, and
:data:`NOISE_FACTOR` times it is added to every atom of the window. Clipping the noise to
zero instead (as before) erased the upper tail whenever the noise was biased downwards.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from scipy import fft

from fedsim.errors import AccountantOutOfRange

# Fixed-point units of the log-spectrum sum (see module docstring).
_RE_BITS = 56
_RE_SCALE = 2.0**_RE_BITS
_FLOOR_LOG = 60  # |F| below e^-60 ~ 1e-26 is read as e^-60 (two floors still fit in int64)
_RE_FLOOR = -_FLOOR_LOG * 2**_RE_BITS  # log modulus floor, in units
_FLOOR_SQUARED = np.exp(np.longdouble(-2 * _FLOOR_LOG - 2))
_PI = 4 * np.arctan(np.longdouble(1))  # pi in extended precision
_PHASE_BITS = 62
_PHASE_SCALE = 2.0**_PHASE_BITS
_PHASE_MASK = np.int64(2**_PHASE_BITS - 1)
# Chernoff parameters t (per grid unit) at which each factor's log-MGF bound is kept: the
# optimum for a window of variance V is near sqrt(2 log(2/tail)) / sqrt(V); this grid covers
# V from below 1 to 10^14 grid units^2 at a factor 2 between neighbours.
CHERNOFF_TS = 2.0 ** np.arange(-24.0, 3.0)
_MIN_SIZE = 256
# Largest FFT size (points): ~0.5 GB of working memory at most.
MAX_SIZE = 2**23
_CORE_STDS = 20.0
_TAIL_BLOCK = 64
# Allowance for FFT rounding per atom, in units of the deepest negative output value.
NOISE_FACTOR = 2.0


@dataclass(frozen=True, slots=True, eq=False)
class FactorSummary:
    """What a composition needs of one factor besides its spectrum (all in grid units).

    ``k_pos[i]`` / ``k_neg[i]`` bound ``log E e^{+-t_i J}`` of the normalised finite part (J
    the offset from ``lower``) at ``t_i = CHERNOFF_TS[i]`` from above.
    """

    lower: int
    last: int  # size - 1
    log_keep: float  # log(1 - infinity mass)
    k_pos: np.ndarray
    k_neg: np.ndarray


def summarise(probs: np.ndarray, lower: int, infinity_mass: float) -> FactorSummary:
    """The :class:`FactorSummary` of a PMF ``probs`` on ``lower + arange(size)``."""
    total = float(probs.sum())
    index = np.arange(probs.size, dtype=float)
    mean = float((probs * index).sum()) / total
    var = max(float((probs * index * index).sum()) / total - mean * mean, 0.0)
    std = math.sqrt(var)
    lo = max(0, int(mean - _CORE_STDS * std))
    hi = min(probs.size, int(mean + _CORE_STDS * std) + 1)
    masses = [probs[lo:hi]]
    left_ends = [index[lo:hi]]
    right_ends = [index[lo:hi]]
    for start, stop in ((0, lo), (hi, probs.size)):
        if stop <= start:
            continue
        block = np.pad(probs[start:stop], (0, -(stop - start) % _TAIL_BLOCK))
        masses.append(block.reshape(-1, _TAIL_BLOCK).sum(axis=1))
        starts = np.arange(start, stop, _TAIL_BLOCK, dtype=float)
        left_ends.append(starts)
        right_ends.append(np.minimum(starts + _TAIL_BLOCK - 1, stop - 1))
    mass = np.concatenate(masses)
    keep = mass > 0
    log_mass = np.log(mass[keep])
    log_total = math.log(total)

    def bound(ts: np.ndarray, ends: np.ndarray) -> np.ndarray:
        # Masses put at their block's worse end: an upper bound on the log-MGF.
        exponents = log_mass[None, :] + ts[:, None] * ends[keep][None, :]
        top = exponents.max(axis=1)
        return np.asarray(top + np.log(np.exp(exponents - top[:, None]).sum(axis=1)) - log_total, dtype=float)

    return FactorSummary(
        lower=int(lower), last=int(probs.size - 1),
        log_keep=math.log1p(-min(infinity_mass, 1.0 - 1e-300)),
        k_pos=bound(CHERNOFF_TS, np.concatenate(right_ends)),
        k_neg=bound(-CHERNOFF_TS, np.concatenate(left_ends)))


@dataclass(frozen=True, slots=True)
class Window:
    """Where the composed PMF lives: offsets ``[lo, hi]`` above the summed lower ends."""

    lower: int
    lo: int
    hi: int
    span: int
    infinity_mass: float

    @property
    def size(self) -> int:
        """The FFT size: the smallest power of two (>= 256) holding the window; a window
        wider than :data:`MAX_SIZE` raises :class:`PrivacyError` (bounded memory)."""
        size = max(_MIN_SIZE, 1 << (self.hi - self.lo).bit_length())
        if size > MAX_SIZE:
            raise AccountantOutOfRange(
                f"the composed privacy loss spans {self.hi - self.lo + 1:.3g} grid points, "
                f"more than the PLD accountant computes ({MAX_SIZE}); the history is far "
                f"beyond any meaningful budget (the rdp accountant answers any length)")
        return size

    @property
    def truncated(self) -> bool:
        return self.lo > 0 or self.hi < self.span


def window(factors: Sequence[tuple[FactorSummary, int]], tail_mass: float) -> Window:
    """The output window of composing ``count`` copies of each factor (Chernoff bounds
    ``P(S >= hi) <= exp(K(t) - t hi)`` and ``P(S <= lo) <= exp(K(-t) + t lo)``, each at most
    ``tail_mass / 2``). Sums run in the order given: callers pass sorted factors, so the
    window is a function of the multiset."""
    lower = sum(f.lower * n for f, n in factors)
    span = sum(f.last * n for f, n in factors)
    log_keep = math.fsum(n * f.log_keep for f, n in factors)
    k_pos = np.zeros_like(CHERNOFF_TS)
    k_neg = np.zeros_like(CHERNOFF_TS)
    for f, n in factors:
        k_pos += n * f.k_pos
        k_neg += n * f.k_neg
    log_tail = math.log(tail_mass / 2.0)
    hi = min(span, math.ceil(float(np.min((k_pos - log_tail) / CHERNOFF_TS))))
    lo = max(0, math.floor(float(np.max((log_tail - k_neg) / CHERNOFF_TS))))
    if hi < lo:  # cannot happen for proper inputs; fall back to the full support
        lo, hi = 0, span
    return Window(lower, lo, hi, span, -math.expm1(log_keep))


def fixed_point_spectrum(probs: np.ndarray, size: int) -> tuple[np.ndarray, np.ndarray]:
    """``(log|F|, arg F)`` of the length-``size`` DFT of ``probs`` in fixed point (module
    docstring): read-only int64 arrays of ``size // 2 + 1`` values.

    The DFT runs in extended precision (``np.longdouble``): composing n copies multiplies a
    factor's relative spectrum error by n, so a double-precision DFT (error ~1e-16) leaves
    FFT noise of ~n 1e-16 of the largest atom in the composed PMF, which at n = 10^5 hides
    the tail that sets eps at delta ~ 1e-12.
    """
    folded = probs.astype(np.longdouble)
    if folded.size > size:  # circular wrap of a factor longer than the window
        folded = np.pad(folded, (0, -folded.size % size)).reshape(-1, size).sum(axis=0)
    spectrum = fft.rfft(folded, size)
    real, imag = spectrum.real, spectrum.imag
    # |F| below e^-60 saturates at the floor (see SpectrumSum.add). No cap at |F| = 1: a
    # one-step PMF sums to 1 within rounding, and cutting that rounding at the zero frequency
    # would lower every composed atom by the same amount.
    work = real * real
    work += imag * imag
    np.maximum(work, _FLOOR_SQUARED, out=work)
    np.log(work, out=work)
    work *= 0.5 * _RE_SCALE
    re = np.rint(work, out=work).astype(np.int64)
    turns = np.arctan2(imag, real, out=work)
    turns *= _PHASE_SCALE / (2 * _PI)
    phase = np.rint(turns, out=turns).astype(np.int64)
    re.setflags(write=False)
    phase.setflags(write=False)
    return re, phase


class SpectrumSum:
    """``sum_b n_b log F_b`` at one FFT size, in fixed point (exact, order-free)."""

    __slots__ = ("size", "re", "phase")

    def __init__(self, size: int) -> None:
        self.size = size
        self.re = np.zeros(size // 2 + 1, dtype=np.int64)
        self.phase = np.zeros(size // 2 + 1, dtype=np.int64)

    def copy(self) -> SpectrumSum:
        twin = SpectrumSum.__new__(SpectrumSum)
        twin.size, twin.re, twin.phase = self.size, self.re.copy(), self.phase.copy()
        return twin

    def add(self, terms: tuple[np.ndarray, np.ndarray], count: int) -> None:
        """Compose ``count`` more copies of the factor whose :func:`fixed_point_spectrum` at
        this size is ``terms``."""
        re, phase = terms
        # count * re saturated at the floor, exactly: below ceil(floor / count) it saturates.
        threshold = -((-_RE_FLOOR) // count)
        term = np.where(re < threshold, np.int64(_RE_FLOOR),
                        np.maximum(re, threshold) * np.int64(count))
        np.maximum(self.re + term, np.int64(_RE_FLOOR), out=self.re)
        self.phase += phase * np.int64(count)  # wraps modulo 2^64 = 4 turns: exact

    def invert(self, where: Window) -> tuple[np.ndarray, float]:
        """The composed finite PMF on the window, each atom raised by the FFT noise bound
        (returned too): an atom-wise upper bound on the composed PMF (module docstring)."""
        turns = (self.phase & _PHASE_MASK).astype(float) / _PHASE_SCALE
        spectrum = np.exp(self.re.astype(float) / _RE_SCALE + 2j * math.pi * turns)
        circular = fft.irfft(spectrum, self.size)
        noise = NOISE_FACTOR * max(0.0, -float(circular.min()))
        ordered = np.roll(circular, -where.lo)
        probs = ordered[: where.hi - where.lo + 1] + noise
        return np.maximum(probs, 0.0, out=probs), noise
