"""Gaussian noise for DP releases: one counter-based sampler, compiled for the CPU.

The sampler (one definition, two implementations that tests compare):

* every draw of ``n`` values is a fresh SplitMix64 stream (Steele, Lea & Flood, "Fast
  splittable pseudorandom number generators", OOPSLA 2014), made as the paper's ``split``
  makes one: a seed ``s`` and an odd gamma ``g = mixGamma(.)`` (Java's ``SplittableRandom``),
  both from 128 bits drawn from the injected ``torch.Generator`` (so a simulation replays
  exactly; :func:`~fedsim.training.dpsgd.secure_generator` seeds that generator from the
  operating system);
* pair ``i`` of the ``p = ceil(n / 2)`` pairs is the stream's output ``z_i = mix64(s + (i+1) g)``:
  ``u1 = ((z_i >> 40) + 1) / 2^24`` in ``(0, 1]`` and ``u2 = ((z_i >> 16) & 0xFFFFFF) / 2^24``
  in ``[0, 1)`` give, by Box & Muller (1958), ``std * sqrt(-2 ln u1) * (cos 2 pi u2,
  sin 2 pi u2)``; the cosines fill the first ``p`` values, the sines the rest (the last one is
  dropped when ``n`` is odd). Computed in float32.

Why not ``torch.normal_``: on the CPU it runs one Mersenne Twister stream serially (about 5 ns
a value); for the 203k-parameter MLP that was 0.3 of a plain SGD step, most of the DP step's
overhead (``benchmarks/dp_step.py``). Here every pair depends only on ``(s, g, i)``, so blocks
are filled in parallel on torch's threads and the log/sin/cos loop is vectorised (polynomials,
``_gaussian.c``): on one AVX2 core 2.7 ns a pair against ``torch.randn``'s 4.3 ns a value
(101,765 pairs: 280 us against 880 us for as many values), 0.05-0.1 of a plain MLP step; on an
AVX-512 core, whose GEMMs make a plain step shorter, the kernel's loops run 512 bits wide
(1.6-2.5 ns a pair against 2.4-3.5 at GCC's default of 256; ``torch.randn`` 3.9-4.6 ns a value).

The tail. With ``u1`` on a grid of ``2^-24`` alone, as in torch's CPU sampler, the radius
stops at ``sqrt(48 ln 2) ~ 5.77`` std: a release beyond it on the coordinate pair where the
record's clipped gradient sits has probability 0 without the record. The Gaussian the
accountants assume gives that region ``P(Z > 5.77) = 4.0e-9`` there, so the cap leaves about
``e^eps 4.0e-9`` of ``delta`` a participation uncounted (the region itself, seen with the
record, has probability ``P(Z > 5.77 - C / std)``: 5.9e-7 at a noise multiplier of 1.1). A pair
whose top 24 bits are zero (chance ``2^-24``) therefore refines ``u1`` with the 16 bits below
``u2`` (``b = z_i & 0xFFFF``) and the stream's output ``p + i`` (``c``, never used otherwise):
``u1 = (2^64 b + c + 1) / 2^104``, computed in float64. The radius reaches ``sqrt(208 ln 2) ~
12.01`` std and what the cap leaves uncounted falls to ``e^eps P(Z > 12.01) ~ e^eps 1.6e-33``.
Other pairs' values are the 24-bit sampler's, unchanged.

What this sampler does *not* give is Gaussian noise at float32's resolution. ``u1`` and ``u2``
have 24 bits, so a pair's radius lies on a lattice (``2^24 exp(-r^2 / 2 std^2)`` an integer)
whose spacing, 1.8e-6 std at ``r = 3 std`` and 4.4e-5 at ``4 std``, is wider than float32's
rounding of a release. An observer who knows every other record and the exact float32
computation can test which neighbour puts a pair's radius on the lattice: in a simulation at
noise multiplier 1.1 with the record's gradient on one coordinate it decided correctly for
8.7e-4 of such pairs and never wrongly, an event about 1,500 times likelier than the cap's,
and a gradient spread over many coordinates gives many pairs to test. This is Mironov's (CCS
2012) floating-point attack as Jin et al. carried it to Gaussian noise ("Are We There Yet?
Timing and Floating-Point Attacks on Differential Privacy Systems", IEEE S&P 2022), and torch's
``normal_`` (Opacus without ``secure_mode``) is open to it alike. A finer sampler (53-bit
uniforms for both draws and the transform in float64, or a sum of several draws as Opacus'
``secure_mode`` does after Holohan & Braghin, ESORICS 2021) closes this lattice but not the
next one: adding float32 noise to the gradients' sum is exact where they cancel, so the
release's low bits follow the sum's (Haney et al., "Precision-based attacks and interval
refining", arXiv 2207.13793, 2022). A release immune to both is computed on a fixed grid, the
sum rounded to it and discrete Gaussian noise added (Canonne, Kamath & Steinke, NeurIPS 2020),
with that mechanism's own accounting. Not built yet.

Each draw has its own gamma, not only its own seed: with one gamma for all, two draws whose
seeds fell within ``p`` steps of each other would repeat a whole shifted stream of noise
(chance ``draws^2 p / 2^64``, not negligible for long runs of large models); with two
gammas, outputs coincide only at isolated points (chance about ``p^2 / 2^64`` per pair of
draws). Neither this generator nor torch's is a CSPRNG.

The C kernel (``_gaussian.c``, beside this file) is compiled on first use with the system's C
compiler into the user cache (:mod:`fedsim.training.native`) and checked against the torch
implementation before use. Without a compiler (or with ``FEDSIM_PURE_TORCH_NOISE=1``) the torch
implementation runs instead: the same values up to a few float32 rounding steps of log/cos,
about 3x slower than ``torch.normal_`` on the CPU; it also serves generators on other devices.
"""

from __future__ import annotations

import ctypes
import functools
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import torch

from fedsim.training.native import load_function

__all__ = [
    "NoiseKey",
    "fill_gaussian",
    "fill_noise",
    "gaussian_noise",
    "mix64",
    "mix_gamma",
    "native_kernel_available",
    "reference_pairs",
    "reference_rows",
    "tail_key",
    "unmix64",
]


_MASK64 = (1 << 64) - 1
_MIX1 = 0xBF58476D1CE4E5B9
_MIX2 = 0x94D049BB133111EB
_SOURCE = Path(__file__).with_name("_gaussian.c")
# Devices whose draws compute every pair's tail radius instead of finding the rare tail pairs
# (a host sync): accelerators with float64.
_SYNC_FREE_TAIL = ("cuda", "xpu")


def _signed(value: int) -> int:
    """A 64-bit pattern as the int64 torch stores it."""
    value &= _MASK64
    return value - (1 << 64) if value >= 1 << 63 else value


def _shift_right(z: torch.Tensor, bits: int) -> torch.Tensor:
    """Logical right shift of int64 bit patterns (torch's >> is arithmetic)."""
    return (z >> bits) & ((1 << (64 - bits)) - 1)


def _mix64(z: torch.Tensor) -> torch.Tensor:
    # int64 products wrap modulo 2^64, which is the unsigned arithmetic SplitMix64 specifies.
    z = (z ^ _shift_right(z, 30)) * _signed(_MIX1)
    z = (z ^ _shift_right(z, 27)) * _signed(_MIX2)
    return z ^ _shift_right(z, 31)


def mix64(value: int) -> int:
    """SplitMix64's finaliser on one 64-bit integer (the scalar form of the stream's mixing;
    Steele, Lea and Flood 2014)."""
    z = ((value ^ (value >> 30)) * _MIX1) & _MASK64
    z = ((z ^ (z >> 27)) * _MIX2) & _MASK64
    return z ^ (z >> 31)


def unmix64(value: int) -> int:
    """The inverse of :func:`mix64` (both steps are bijections of 64-bit integers): the state
    whose stream output is ``value``. The kernel's probe uses it to make a key whose draw
    reaches the tail."""

    def unshift(z: int, bits: int) -> int:
        x = z
        for _ in range(64 // bits + 1):
            x = z ^ (x >> bits)
        return x

    z = unshift(value & _MASK64, 31)
    z = unshift(z * pow(_MIX2, -1, 1 << 64) & _MASK64, 27)
    return unshift(z * pow(_MIX1, -1, 1 << 64) & _MASK64, 30)


def tail_key(pairs: int, index: int, output: int, extra: int | None = None) -> NoiseKey:
    """A key whose draw of ``pairs`` pairs has stream output ``output`` at pair ``index`` and,
    if given, output ``extra`` at ``pairs + index`` (the tail's refining bits): a draw that
    takes the tail path on purpose (the kernel's probe, tests). Raises ValueError when no odd
    gamma gives ``extra``."""
    if not 0 <= index < pairs:
        raise ValueError(f"index must be in [0, {pairs}), got {index}")
    first = unmix64(output)
    if extra is None:
        gamma = mix_gamma(first)
    else:
        # s + (index + 1) g = first and s + (pairs + index + 1) g = second, so
        # pairs g = second - first (mod 2^64); with pairs = 2^k m (m odd), an odd g exists
        # exactly when the difference is 2^k times an odd number.
        difference = (unmix64(extra) - first) & _MASK64
        k = (pairs & -pairs).bit_length() - 1
        if difference & ((1 << (k + 1)) - 1) != 1 << k:
            raise ValueError("no odd gamma gives that extra output for this many pairs")
        gamma = ((difference >> k) * pow(pairs >> k, -1, 1 << 64)) & _MASK64
    return NoiseKey((first - (index + 1) * gamma) & _MASK64, gamma)


def mix_gamma(value: int) -> int:
    """SplittableRandom's ``mixGamma``: an odd gamma with at least 24 bit transitions."""
    z = ((value ^ (value >> 33)) * 0xFF51AFD7ED558CCD) & _MASK64
    z = ((z ^ (z >> 33)) * 0xC4CEB9FE1A85EC53) & _MASK64
    z = (z ^ (z >> 33)) | 1
    return z ^ 0xAAAAAAAAAAAAAAAA if bin(z ^ (z >> 1)).count("1") < 24 else z


def _tail_radius(
    z: torch.Tensor, counter: torch.Tensor, seed: torch.Tensor, gamma: torch.Tensor,
    std: torch.Tensor,
) -> torch.Tensor:
    """The radius of the tail pairs (``z >> 40 == 0``) whose stream outputs are ``z``:
    ``u1 = (2^64 b + c + 1) / 2^104`` with ``b = z & 0xFFFF`` and ``c`` the stream's output at
    ``counter`` (pair ``i``'s ``p + i``), computed in float64 (``seed`` and ``gamma`` as signed
    int64, ``std`` as float64, each broadcast against ``z``)."""
    c = _mix64(counter * gamma + seed).to(torch.float64)
    c = torch.where(c < 0, c + 2.0**64, c)  # the unsigned value of the bit pattern
    u1 = (z & 0xFFFF).to(torch.float64) * 2.0**-40 + (c + 1.0) * 2.0**-104
    return (torch.sqrt(-2.0 * torch.log(u1)) * std).to(torch.float32)


def reference_rows(
    keys: Sequence[NoiseKey], stds: Sequence[float], pairs: int,
    device: torch.device | str = "cpu",
) -> torch.Tensor:
    """The sampler in torch operations for several draws at once: row ``r`` of the
    ``(len(keys), 2 * pairs)`` float32 result holds the ``2 * pairs`` values of stream
    ``keys[r]`` scaled by ``stds[r]``. One series of whole-block operations, whatever the
    number of draws: on an accelerator, where each operation is a kernel launch, a batched
    pass draws all its rounds' noise in one series instead of one a round.

    Elementwise the same computation as one draw alone (:func:`reference_pairs` is its one
    row), so a row is that draw's values to the bit (tested on the CPU and on CUDA)."""
    device = torch.device(device)

    def column(values: Sequence[int] | Sequence[float], dtype: torch.dtype) -> torch.Tensor:
        return torch.tensor(values, dtype=dtype, device=device).reshape(-1, 1)

    seeds = column([_signed(key.seed) for key in keys], torch.int64)
    gammas = column([_signed(key.gamma) for key in keys], torch.int64)
    counter = torch.arange(1, pairs + 1, dtype=torch.int64, device=device)
    z = _mix64(counter * gammas + seeds)
    high = _shift_right(z, 40)
    u1 = (high + 1).to(torch.float32) * 2.0**-24
    u2 = ((z >> 16) & 0xFFFFFF).to(torch.float32) * 2.0**-24
    radius = torch.sqrt(-2.0 * torch.log(u1)) * column(stds, torch.float32)
    tail = high == 0
    if device.type in _SYNC_FREE_TAIL:
        # No host sync a draw (which finding the rare tail pairs would cost): every pair's
        # tail radius in float64, kept where the pair is in the tail.
        radius = torch.where(tail, _tail_radius(z, counter + pairs, seeds, gammas,
                                                column(stds, torch.float64)), radius)
    else:
        rows, index = torch.nonzero(tail, as_tuple=True)
        if rows.numel():
            # Rare (2^-24 a pair), so on the CPU: float64 is not on every device (MPS).
            cpu_rows = rows.cpu()
            radius[rows, index] = _tail_radius(
                z[rows, index].cpu(), index.cpu() + 1 + pairs, seeds.cpu()[cpu_rows, 0],
                gammas.cpu()[cpu_rows, 0],
                torch.tensor(stds, dtype=torch.float64)[cpu_rows]).to(device)
    angle = u2 * (2 * math.pi)
    return torch.cat([radius * torch.cos(angle), radius * torch.cos(angle - math.pi / 2)], dim=1)


def reference_pairs(
    pairs: int, seed: int, gamma: int, std: float, device: torch.device | str = "cpu"
) -> torch.Tensor:
    """The sampler in torch operations: ``2 * pairs`` float32 values of stream ``(seed, gamma)``."""
    return reference_rows([NoiseKey(seed, gamma)], [std], pairs, device)[0]


class _Kernel:
    """The compiled sampler (``fedsim_gaussian_pairs``, loaded through ctypes)."""

    def __init__(self, fill: Callable[[int, int, int, int, float, int], None]) -> None:
        self._fill = fill

    def pairs(self, pairs: int, seed: int, gamma: int, std: float) -> torch.Tensor:
        out = torch.empty(2 * pairs, dtype=torch.float32)
        self.fill(out, seed, gamma, std)
        return out

    def fill(self, out: torch.Tensor, seed: int, gamma: int, std: float) -> None:
        """Write ``out.numel() / 2`` pairs into the contiguous float32 CPU tensor ``out``."""
        if out.numel():
            self._fill(out.data_ptr(), out.numel() // 2, seed, gamma, std,
                       torch.get_num_threads())


def _load_kernel() -> _Kernel | None:
    fill = load_function(
        _SOURCE, "fedsim_gaussian_pairs",
        argtypes=[ctypes.c_void_p, ctypes.c_int64, ctypes.c_uint64, ctypes.c_uint64,
                  ctypes.c_float, ctypes.c_int],
        restype=None, agrees=lambda function: _agrees(_Kernel(function)),
        what="Gaussian noise", opt_out="FEDSIM_PURE_TORCH_NOISE")
    return None if fill is None else _Kernel(fill)


def _agrees(kernel: _Kernel) -> bool:
    """A miscompiled kernel must never add wrong noise: whether it gives the definition's
    values, on a random key and on one whose pair 3000 of 4099 takes the tail path (which
    random keys almost never do)."""
    tail = tail_key(4099, 3000, 0x3A5C_71E9)
    probes = [(0x0123456789ABCDEF, mix_gamma(0xFEDCBA9876543210), 1.0),
              (tail.seed, tail.gamma, 1.0)]
    return all(torch.allclose(kernel.pairs(4099, *probe), reference_pairs(4099, *probe),
                              rtol=1e-5, atol=1e-5) for probe in probes)


@functools.cache
def _native() -> _Kernel | None:
    """The kernel of this process, built or loaded once (None: use the torch implementation)."""
    return _load_kernel()


def native_kernel_available() -> bool:
    """Whether CPU draws use the compiled kernel (built on first call if needed)."""
    return _native() is not None


@dataclass(frozen=True)
class NoiseKey:
    """The stream of one draw: seed ``s`` and odd gamma ``g`` (see the module docstring).

    Drawing the key consumes the generator; the values follow from the key alone, so a caller
    may draw the key now (keeping the generator's order of use) and fill the values later.
    """

    seed: int
    gamma: int

    @classmethod
    def draw(cls, generator: torch.Generator) -> NoiseKey:
        """A key from four 32-bit draws of ``generator``."""
        words = torch.randint(0, 1 << 32, (4,), generator=generator, dtype=torch.int64,
                              device=generator.device).tolist()
        return cls((words[0] << 32) | words[1], mix_gamma((words[2] << 32) | words[3]))


def gaussian_noise(
    size: int, std: float, source: torch.Generator | NoiseKey, like: torch.Tensor
) -> torch.Tensor:
    """``size`` values of ``N(0, std^2)`` keyed by ``source``, returned like ``like``.

    A generator ``source`` is consumed by four 32-bit draws (:meth:`NoiseKey.draw`), whatever
    ``size``; a key gives the same values as the generator it was drawn from.
    Values are computed in float32 (the dtype updates are stored in) and scaled by the kernel
    itself (no extra pass); ``like``'s dtype and device are applied afterwards.
    """
    if size < 0:
        raise ValueError(f"size must be >= 0, got {size}")
    if isinstance(source, NoiseKey):
        key, device = source, like.device
    else:
        key, device = NoiseKey.draw(source), source.device
    pairs = (size + 1) // 2
    if device.type == "cpu":
        values = torch.empty(2 * pairs, dtype=torch.float32)
        fill_gaussian(values, key, std)
    else:
        values = reference_pairs(pairs, key.seed, key.gamma, std, device)
    if size != values.numel():
        values = values[:size]
    if values.device != like.device or values.dtype != like.dtype:
        values = values.to(device=like.device, dtype=like.dtype)
    return values


def fill_gaussian(out: torch.Tensor, key: NoiseKey, std: float) -> None:
    """Fill the float32 CPU vector ``out`` with the values :func:`gaussian_noise` gives for
    ``key`` and ``std``, in place (no allocation: the caller's buffer may be reused memory).

    ``out`` must hold an even number of values (the sampler makes pairs): a caller that needs
    an odd count allocates one spare value and uses a narrower view.
    """
    if out.dim() != 1 or out.numel() % 2 or out.dtype != torch.float32 \
            or out.device.type != "cpu" or not out.is_contiguous():
        raise ValueError("out must be a contiguous float32 CPU vector of an even length")
    kernel = _native()
    if kernel is not None:
        kernel.fill(out, key.seed, key.gamma, std)
    else:
        out.copy_(reference_pairs(out.numel() // 2, key.seed, key.gamma, std))


def fill_noise(out: torch.Tensor, key: NoiseKey, std: float) -> None:
    """:func:`fill_gaussian` for a float32 vector on any device: the compiled kernel on the
    CPU, the torch implementation (the same sampler) on the vector's own device elsewhere."""
    if out.device.type == "cpu":
        fill_gaussian(out, key, std)
    else:
        out.copy_(reference_pairs(out.numel() // 2, key.seed, key.gamma, std, out.device))
