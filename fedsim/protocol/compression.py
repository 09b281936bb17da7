"""Compressed updates on the wire: sparsification and stochastic quantisation of a released
update (the scenario's per-group ``compression:``, :mod:`fedsim.config.compression`).

Paper 000, footnote 1: "in practice, the client will only transmit a sparsification or lossy
compression of U-bar where small entries are discarded". Every function here takes the update
*after* its Gaussian noise, the mechanism's output, and nothing else of the client's: the kept
coordinates (top-k, threshold) and the quantisation grid (the vector's min and max) are
functions of the noisy vector alone, and the rounding randomness comes from
:func:`public_rng`, seeded by the client id and round only (public values, never the client's
data or its noise). So a compressed update is post-processing of the released one and costs
no privacy (docs/PRIVACY.md, "Compressed updates").

Payloads (little-endian, after the update's JSON header, :mod:`fedsim.protocol.codec`):

* :class:`Sparse` (``top_k``, ``threshold``): ``count`` indices as ``uint32``, strictly
  ascending, then ``count`` float32 values: 8 bytes per kept coordinate.
* :class:`Quantised` (``quantise``): one code per coordinate, 8 bits, or 4 bits two to a byte
  (the even coordinate in the low nibble; an odd length pads the last high nibble with 0);
  the coordinate is ``low + code * step`` (float64, then float32).

:func:`unpack` trusts nothing: every defect (a count beyond the model, indices out of range,
repeated or unsorted, a payload of the wrong size, a non-finite or negative scale, a non-zero
pad) is a :class:`~fedsim.errors.CodecError`; the codec then checks the decoded dense vector
like any other (finite, its norm), and the server judges that vector.
"""

from __future__ import annotations

import hashlib
import math
from dataclasses import dataclass
from typing import Literal

import numpy as np

from fedsim.config.compression import (
    Compression,
    QuantiseCompression,
    ThresholdCompression,
    TopKCompression,
)
from fedsim.errors import CodecError

__all__ = ["WIRE_FORM", "Quantised", "Sparse", "compress", "densify", "least_kept", "pack",
           "packings", "public_rng", "top_k_count", "unpack_quantised", "unpack_sparse",
           "wire_form_problem"]

_INDEX = np.dtype("<u4")
_VALUE = np.dtype("<f4")
_SEED_DOMAIN = b"fedsim/compression/v1\0"
Bits = Literal[4, 8]
WIRE_FORM = "compression"
"""The refusal kind of an update whose wire form is not one its client's group sends
(:func:`wire_form_problem`)."""


@dataclass(frozen=True, eq=False)
class Sparse:
    """The kept coordinates of a vector of ``length`` values (the rest are zero)."""

    length: int
    indices: np.ndarray  # uint32, strictly ascending
    values: np.ndarray  # float32


@dataclass(frozen=True, eq=False)
class Quantised:
    """Every coordinate as ``low + code * step``, ``code`` in ``[0, 2^bits - 1]``."""

    bits: Bits
    low: float
    step: float
    codes: np.ndarray  # uint8, one per coordinate


def public_rng(client_id: str, round_index: int) -> np.random.Generator:
    """The rounding randomness of ``client_id``'s round ``round_index``: a generator seeded by
    a hash of those two public values only. Anyone (the server too) can recompute it; that
    costs nothing, because it is independent of the client's data and of its noise (docs/PRIVACY.md)."""
    digest = hashlib.sha256(
        _SEED_DOMAIN + client_id.encode() + b"\0" + str(int(round_index)).encode()).digest()
    return np.random.Generator(np.random.PCG64(int.from_bytes(digest[:16], "little")))


def top_k(values: np.ndarray, fraction: float) -> Sparse:
    """The ``k = max(1, ceil(fraction * d))`` coordinates largest in magnitude (ties broken by
    ``argpartition``, a function of the vector alone)."""
    length = int(values.size)
    k = top_k_count(fraction, length)
    if k >= length:
        indices = np.arange(length, dtype=np.int64)
    else:
        indices = np.sort(np.argpartition(np.abs(values), length - k)[length - k:])
    return Sparse(length, indices.astype(np.uint32), values[indices].astype(np.float32))


def top_k_count(fraction: float, length: int) -> int:
    """How many coordinates :func:`top_k` keeps of ``length``: ``max(1, ceil(fraction *
    length))``, at most ``length``."""
    return min(length, max(1, math.ceil(fraction * length)))


def threshold(values: np.ndarray, limit: float) -> Sparse:
    """The coordinates with ``|value| >= limit``."""
    indices = np.flatnonzero(np.abs(values) >= limit)
    return Sparse(int(values.size), indices.astype(np.uint32), values[indices].astype(np.float32))


def quantise(values: np.ndarray, bits: Bits, rng: np.random.Generator) -> Quantised:
    """Unbiased stochastic rounding to ``2^bits`` levels evenly spaced over ``[min, max]``.

    With ``t = (x - low) / step`` a coordinate becomes level ``floor(t) + 1`` with probability
    ``t - floor(t)`` and ``floor(t)`` otherwise, so ``E[low + code * step] = x`` (in exact
    arithmetic; the decoded float32 rounds it once) and the error of each coordinate lies in
    ``(-step, step)`` with variance at most ``step^2 / 4``."""
    levels = (1 << bits) - 1
    x = np.asarray(values, dtype=np.float64)
    if x.size == 0:
        return Quantised(bits, 0.0, 0.0, np.zeros(0, dtype=np.uint8))
    low, high = float(x.min()), float(x.max())
    step = (high - low) / levels
    if not step > 0.0:
        return Quantised(bits, low, 0.0, np.zeros(x.size, dtype=np.uint8))
    scaled = np.clip((x - low) / step, 0.0, float(levels))
    floor = np.floor(scaled)
    codes = floor + (rng.random(x.size) < (scaled - floor))
    return Quantised(bits, low, step, np.minimum(codes, levels).astype(np.uint8))


def compress(values: np.ndarray, spec: Compression, *, client_id: str,
             round_index: int) -> Sparse | Quantised:
    """``values`` (a released update) compressed as ``spec`` says."""
    if isinstance(spec, TopKCompression):
        return top_k(values, spec.fraction)
    if isinstance(spec, ThresholdCompression):
        return threshold(values, spec.threshold)
    assert isinstance(spec, QuantiseCompression)
    return quantise(values, spec.bits, public_rng(client_id, round_index))


def packings(spec: Compression | None) -> frozenset[str | None]:
    """The wire forms (:attr:`fedsim.protocol.codec.Frame.packing`) an update compressed by
    ``spec`` (a group's ``compression:``) travels in: None (dense) without compression;
    ``"sparse"`` or dense for ``top_k`` and ``threshold`` (a sparse vector that would take
    more bytes travels dense, :func:`~fedsim.protocol.codec.encode`); ``"quantised"`` for
    ``quantise``. A receiver refuses any other (docs/SECURITY.md: a client of a group that
    does not compress could otherwise send 224 bytes that decode to a whole dense update)."""
    if spec is None:
        return _DENSE_ONLY
    if isinstance(spec, QuantiseCompression):
        return _QUANTISED_ONLY
    return _SPARSE_OR_DENSE


def least_kept(threshold: float, noise_std: float, length: int,
               failure_probability: float) -> int:
    """The fewest coordinates a ``threshold`` sparsification of an honest update of ``length``
    values keeps, except with probability ``failure_probability``, when every coordinate
    carries independent Gaussian noise of standard deviation at least ``noise_std`` on top of
    values that do not depend on it (the last DP-SGD step's noise on ``Ubar / m``).

    Whatever a coordinate's other part ``c``, ``P(|c + Z| >= t) >= P(|Z| >= t) = p`` (Anderson's
    inequality: a centred symmetric unimodal density puts the most mass in a centred
    interval), so the count kept dominates Binomial(``length``, ``p``) of mean ``mu``, whose
    lower Chernoff tail is ``P(X <= mu - a) <= exp(-a^2 / (2 mu))``: the floor is
    ``mu - sqrt(2 mu ln(1/failure_probability))``, never below 0. ``t`` is taken a float32
    rounding above the threshold (the client compares float32 values)."""
    if not (noise_std > 0 and math.isfinite(noise_std)) or length <= 0:
        return 0
    limit = threshold * (1.0 + 2.0 ** -20)
    p = math.erfc(limit / (noise_std * math.sqrt(2.0)))
    mu = length * p
    return max(0, math.floor(mu - math.sqrt(2.0 * mu * math.log(1.0 / failure_probability))))


def wire_form_problem(spec: Compression | None, packing: str | None, count: int | None,
                      length: int, least: int = 0) -> str | None:
    """Why an update's wire form - its header's ``packing`` (None: dense) and, sparse, its
    ``count`` of kept coordinates, of a ``length``-value model - is not one a client of a group
    compressing by ``spec`` sends, or None. Judged from the header alone, before the payload is
    expanded: a sparse frame of a few hundred bytes stands for the whole dense vector, and
    expanding it (allocating, zeroing and measuring ``4 length`` bytes) only to refuse it cost
    the receiver thousands of times what the sender sent (an attacker's review). A ``top_k``
    client's sparse frames keep exactly :func:`top_k_count` coordinates (fewer would make a
    small frame stand for the same dense vector); a ``threshold`` client's at least ``least``
    (:func:`least_kept` of its noise: an attacker's review, session 66, had a 238-byte frame
    keeping no coordinate stand for a whole update, costing its receiver a dense vector's
    CPU at 1/1700 of a dense frame's bytes)."""
    allowed = packings(spec)
    if packing not in allowed:
        sent = " or ".join(sorted(p or "dense" for p in allowed))
        return f"an update travelled {packing or 'dense'}; its group's compression sends {sent}"
    if isinstance(spec, TopKCompression) and packing == "sparse":
        k = top_k_count(spec.fraction, length)
        if count != k:
            return (f"a sparse update keeps {count} coordinates; its group's top_k keeps {k} "
                    f"of {length}")
    if (isinstance(spec, ThresholdCompression) and packing == "sparse" and count is not None
            and count < least):
        return (f"a sparse update keeps {count} coordinates; its group's threshold keeps at "
                f"least {least} of {length} from its noise alone")
    return None


# (one object each, which every client of every group shares: a receiver holds one a client)
_DENSE_ONLY: frozenset[str | None] = frozenset({None})
_QUANTISED_ONLY: frozenset[str | None] = frozenset({"quantised"})
_SPARSE_OR_DENSE: frozenset[str | None] = frozenset({None, "sparse"})


def densify(payload: Sparse | Quantised) -> np.ndarray:
    """The float32 vector a payload stands for (what the receiver decodes)."""
    if isinstance(payload, Sparse):
        dense = np.zeros(payload.length, dtype=np.float32)
        dense[payload.indices] = payload.values
        return dense
    decoded = payload.low + payload.codes.astype(np.float64) * payload.step
    with np.errstate(over="ignore"):  # beyond float32: inf, which the codec then refuses
        return decoded.astype(np.float32)


def pack(payload: Sparse | Quantised) -> bytes:
    """The payload's bytes (module docstring)."""
    if isinstance(payload, Sparse):
        return (payload.indices.astype(_INDEX).tobytes()
                + payload.values.astype(_VALUE).tobytes())
    codes = payload.codes
    if payload.bits == 8:
        return codes.tobytes()
    padded = np.zeros(2 * ((codes.size + 1) // 2), dtype=np.uint8)
    padded[:codes.size] = codes
    return (padded[0::2] | (padded[1::2] << 4)).astype(np.uint8).tobytes()


def unpack_sparse(body: bytes, count: int, length: int) -> np.ndarray:
    """The dense vector of a sparse payload of ``count`` coordinates out of ``length``."""
    if count > length:
        raise CodecError(f"sparse update keeps {count} coordinates of a {length}-value model",
                         kind="shape")
    if len(body) != count * (_INDEX.itemsize + _VALUE.itemsize):
        raise CodecError(f"sparse payload is {len(body)} bytes, header declares {count} "
                         f"coordinates ({8 * count} bytes)")
    indices = np.frombuffer(body, dtype=_INDEX, count=count)
    if count and int(indices[-1]) >= length:
        raise CodecError(f"sparse index {int(indices[-1])} is beyond the model's {length} values",
                         kind="shape")
    if count > 1 and not bool(np.all(indices[1:] > indices[:-1])):
        raise CodecError("sparse indices must be strictly ascending (sorted, no repeats)")
    dense = np.zeros(length, dtype=np.float32)
    dense[indices] = np.frombuffer(body, dtype=_VALUE, count=count, offset=4 * count)
    return dense


def unpack_quantised(body: bytes, bits: Bits, low: float, step: float, length: int) -> np.ndarray:
    """The dense vector of a quantised payload (``low``/``step`` already checked finite)."""
    expected = length if bits == 8 else (length + 1) // 2
    if len(body) != expected:
        raise CodecError(f"quantised payload is {len(body)} bytes, {length} {bits}-bit codes "
                         f"take {expected}")
    raw = np.frombuffer(body, dtype=np.uint8)
    if bits == 8:
        codes = raw
    else:
        codes = np.empty(2 * raw.size, dtype=np.uint8)
        codes[0::2] = raw & 0x0F
        codes[1::2] = raw >> 4
        if length % 2 and codes[-1]:
            raise CodecError("quantised payload's pad nibble is not zero")
        codes = codes[:length]
    return densify(Quantised(bits, low, step, codes))
