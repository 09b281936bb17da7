"""The codec's one-pass finiteness check and norm (issue 24, item 2): a decoded update carries
the norm the server checks, computed in the same pass that decides it is finite, and decides
exactly what the separate checks decided; frames are byte for byte the documented layout."""

from __future__ import annotations

import math
import struct

import numpy as np
import pytest

from fedsim.errors import CodecError
from fedsim.protocol import codec
from fedsim.protocol.messages import PROTOCOL_VERSION, ClientUpdate, GlobalModel
from fedsim.runtime.actors.client_book import ClientBook
from fedsim.runtime.actors.integrity import update_norm

FLOAT32_MAX = float(np.finfo(np.float32).max)


def _reference_frame(header_json: bytes, values: np.ndarray) -> bytes:
    """The wire layout written out by hand: prefix, header, raw little-endian float32."""
    prefix = struct.pack("<4sHI", b"FSIM", PROTOCOL_VERSION, len(header_json))
    return prefix + header_json + np.asarray(values, dtype="<f4").tobytes()


def _vectors() -> list[np.ndarray]:
    rng = np.random.default_rng(24)
    return [
        np.zeros(0, np.float32),
        np.zeros(1, np.float32),
        np.array([-0.0, 0.0, 1e-45, -1e-45], np.float32),  # signed zeros, subnormals
        np.full(1000, FLOAT32_MAX, np.float32),  # finite, but its float32 sum of squares is inf
        np.array([FLOAT32_MAX, -FLOAT32_MAX, 1.0], np.float32),
        rng.standard_normal(101_770).astype(np.float32),
        (rng.standard_normal(5000) * 1e30).astype(np.float32),
    ]


@pytest.mark.parametrize("index", range(7))
def test_update_frames_are_the_documented_bytes(index: int) -> None:
    values = _vectors()[index]
    update = ClientUpdate("c-1", 3, 2, values, 16.0, 1.25, window=7)
    frame = codec.encode(update, incarnation="ab12")
    header_end = codec.PREFIX_BYTES + struct.unpack_from("<I", frame, 6)[0]
    assert frame == _reference_frame(frame[codec.PREFIX_BYTES:header_end], values)
    decoded = codec.decode(frame)
    assert isinstance(decoded, ClientUpdate)
    assert decoded.delta.tobytes() == values.tobytes()
    # The carried norm is the receiver's own computation of it, bit for bit, and finite.
    assert decoded.norm == update_norm(values)
    assert math.isfinite(decoded.norm)


def test_huge_finite_values_pass_where_a_float32_sum_would_overflow() -> None:
    values = np.full(1000, FLOAT32_MAX, np.float32)
    with np.errstate(over="ignore"):
        assert not math.isfinite(float(np.sum(values * values)))  # the float32 trap
    decoded = codec.decode(codec.encode(ClientUpdate("c", 0, 0, values, 1.0)))
    assert isinstance(decoded, ClientUpdate)
    assert decoded.norm == pytest.approx(FLOAT32_MAX * math.sqrt(1000), rel=1e-12)


@pytest.mark.parametrize("bad", [math.nan, math.inf, -math.inf])
@pytest.mark.parametrize("where", [0, 500, 101_769])
def test_non_finite_updates_are_refused_as_before(bad: float, where: int) -> None:
    values = np.random.default_rng(where).standard_normal(101_770).astype(np.float32)
    good = codec.encode(ClientUpdate("c", 0, 0, values, 1.0))
    offset = len(good) - 4 * values.size + 4 * where
    tampered = good[:offset] + struct.pack("<f", bad) + good[offset + 4:]
    with pytest.raises(CodecError) as refused:
        codec.decode(tampered)
    assert refused.value.kind == "non_finite"
    assert "1 non-finite value(s)" in str(refused.value)


def test_non_finite_global_models_are_refused() -> None:
    params = np.ones(10, np.float32)
    good = codec.encode(GlobalModel(1, params))
    tampered = good[:-4] + struct.pack("<f", math.nan)
    with pytest.raises(CodecError) as refused:
        codec.decode(tampered)
    assert refused.value.kind == "non_finite"


@pytest.mark.parametrize("scale", [0.5, 0.999999, 1.0, 1.000001, 2.0])
def test_the_server_decides_on_the_carried_norm_as_on_its_own(scale: float) -> None:
    """The client book's verdict with the decoder's norm and with the norm recomputed (an
    update built in process carries none) is the same, also at the bound itself."""
    from fedsim.runtime.actors.integrity import ClientLimits

    values = np.random.default_rng(1).standard_normal(2000).astype(np.float32)
    limits = ClientLimits(sampling="poisson", batch_size=16.0, num_samples=600, dim=2000,
                          clip=lambda _r: 1.0, sigma=lambda _r: 1.0, steps=1, max_rounds=None)
    bound = limits.norm_bound(0)
    values *= np.float32(scale * bound / update_norm(values))
    plain = ClientUpdate("c", 0, 0, values, 16.0)
    decoded = codec.decode(codec.encode(plain))
    assert isinstance(decoded, ClientUpdate) and plain.norm is None
    book = ClientBook({"c": limits}, 2000)
    assert book.judge(decoded) == book.judge(plain)
    if scale != 1.0:  # at the bound itself float32 rounding decides; both paths agree above
        assert (book.judge(plain).kind.value == "norm") == (scale > 1.0)
