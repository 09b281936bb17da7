"""Compressed updates on the wire (fedsim.protocol.compression, the codec's compressed update
frames): round trips per kind, top-k keeps the largest, stochastic quantisation is unbiased
with its error within one grid step, plain frames unchanged, malformed frames refused, and a
hostile frame whose decoded norm exceeds the client's bound refused by the server's book."""

from __future__ import annotations

import json
import math
import struct

import numpy as np
import pytest

from fedsim.config.compression import (
    Compression,
    QuantiseCompression,
    ThresholdCompression,
    TopKCompression,
)
from fedsim.errors import CodecError
from fedsim.protocol import codec
from fedsim.protocol.compression import Quantised, compress, densify, public_rng, quantise
from fedsim.protocol.messages import PROTOCOL_VERSION, ClientUpdate
from fedsim.runtime.actors.client_book import ClientBook, Kind
from fedsim.runtime.actors.integrity import (
    ClientLimits,
    quantised_norm_bound,
    update_norm_bound,
)

TOP = TopKCompression(kind="top_k", fraction=0.1)
THRESHOLD = ThresholdCompression(kind="threshold", threshold=1.5)
Q8 = QuantiseCompression(kind="quantise", bits=8)
Q4 = QuantiseCompression(kind="quantise", bits=4)
KINDS = (TOP, THRESHOLD, Q8, Q4)


def _vector(n: int = 1001, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).normal(size=n).astype(np.float32)


def _update(delta: np.ndarray, spec: Compression | None, round_: int = 3) -> ClientUpdate:
    return ClientUpdate("c-1", round_, 2, delta, 16.0, 1.5, 0, compression=spec)


def _frame(header: dict[str, object], body: bytes) -> bytes:
    raw = json.dumps(header, separators=(",", ":")).encode()
    return struct.pack("<4sHI", b"FSIM", PROTOCOL_VERSION, len(raw)) + raw + body


def _header(n: int, compression: dict[str, object]) -> dict[str, object]:
    return {"kind": "update", "incarnation": "", "client_id": "c-1", "round": 0,
            "base_version": 0, "batch_size": 16.0, "sent_at": 0.0, "window": 0,
            "tensor": {"dtype": "<f4", "shape": [n]}, "compression": compression}


@pytest.mark.parametrize("spec", KINDS, ids=lambda s: f"{s.kind}{getattr(s, 'bits', '')}")
@pytest.mark.parametrize("n", [1, 2, 7, 1001])
def test_a_compressed_update_decodes_to_the_vector_its_payload_stands_for(
        spec: Compression, n: int) -> None:
    x = _vector(n)
    frame = codec.encode(_update(x, spec))
    decoded = codec.decode(frame, expected_params=n)
    assert isinstance(decoded, ClientUpdate) and decoded.compression is None
    expected = densify(compress(x, spec, client_id="c-1", round_index=3))
    np.testing.assert_array_equal(decoded.delta, expected)
    assert decoded.norm == pytest.approx(float(np.linalg.norm(expected.astype(np.float64))))
    assert not decoded.delta.flags.writeable
    assert codec.encode(_update(x, spec)) == frame  # deterministic: the seed is public


def test_compressed_frames_are_smaller_in_the_expected_proportion() -> None:
    x = _vector(10_000)
    dense = len(codec.encode(_update(x, None)))
    sizes = {s.kind + str(getattr(s, "bits", "")): len(codec.encode(_update(x, s)))
             for s in (TOP, Q8, Q4)}
    header = dense - 4 * x.size
    assert sizes["top_k"] - header == pytest.approx(8 * 1000, abs=80)  # index + value each
    assert sizes["quantise8"] - header == pytest.approx(10_000, abs=120)
    assert sizes["quantise4"] - header == pytest.approx(5_000, abs=120)
    # every compressed frame passes the server's size limit derived from the model
    assert max(sizes.values()) < codec.max_message_bytes(x.size)


def test_an_uncompressed_update_is_byte_for_byte_the_old_frame() -> None:
    x = np.array([1.0, -2.5, 0.0, 3.25], dtype=np.float32)
    frame = codec.encode(ClientUpdate("c-1", 3, 2, x, 16.0, 1.5, 7))
    header = (b'{"kind":"update","incarnation":"","client_id":"c-1","round":3,"base_version":2,'
              b'"batch_size":16.0,"sent_at":1.5,"window":7,"tensor":{"dtype":"<f4","shape":[4]}}')
    assert frame == (b"FSIM" + struct.pack("<HI", PROTOCOL_VERSION, len(header)) + header
                     + x.astype("<f4").tobytes())


def test_top_k_keeps_the_k_largest_magnitudes() -> None:
    x = _vector(997, seed=5)
    decoded = codec.decode(codec.encode(_update(x, TOP)))
    kept = np.flatnonzero(decoded.delta)
    assert kept.size == math.ceil(0.1 * 997)
    np.testing.assert_array_equal(decoded.delta[kept], x[kept])
    dropped = np.setdiff1d(np.arange(x.size), kept)
    assert np.abs(x[kept]).min() >= np.abs(x[dropped]).max()


def test_threshold_keeps_exactly_the_entries_at_or_above_it() -> None:
    x = _vector(5000, seed=6)
    decoded = codec.decode(codec.encode(_update(x, THRESHOLD))).delta
    big = np.abs(x) >= 1.5
    np.testing.assert_array_equal(decoded[big], x[big])
    assert not decoded[~big].any()


def test_a_sparse_update_larger_than_the_dense_one_travels_dense() -> None:
    x = _vector(100)
    spec = TopKCompression(kind="top_k", fraction=0.6)
    frame = codec.encode(_update(x, spec))
    assert b'"compression"' not in frame and len(frame) == len(codec.encode(_update(x, None)))
    decoded = codec.decode(frame).delta
    assert np.count_nonzero(decoded) == 60


@pytest.mark.parametrize("bits", [8, 4])
def test_stochastic_quantisation_is_unbiased_with_its_error_within_one_step(bits: int) -> None:
    """The mean of 4000 quantisations (the public seeds of rounds 0..3999) against the input:
    each coordinate's error lies in (-step, step) with variance at most step^2/4, so the mean's
    error is within 5 standard errors (step / 2 / sqrt(4000)) except with negligible odds; the
    empirical variance obeys the same bound."""
    x = _vector(64, seed=7).astype(np.float64)
    trials = 4000
    runs = []
    for r in range(trials):
        q = quantise(x, bits, public_rng("c-1", r))
        decoded = densify(q).astype(np.float64)
        assert np.all(np.abs(decoded - x) <= q.step * (1 + 1e-6) + 1e-6)
        runs.append(decoded)
    step = (x.max() - x.min()) / ((1 << bits) - 1)
    values = np.array(runs)
    error = np.abs(values.mean(axis=0) - x)
    assert np.all(error <= 5 * (step / 2) / math.sqrt(trials) + 1e-6), error.max()
    assert np.all(values.var(axis=0) <= step * step / 4 * 1.15)
    assert values.var(axis=0).max() > 0.02 * step * step  # it does round randomly


def test_the_rounding_seed_depends_on_the_client_and_round_only() -> None:
    x = _vector(500)
    a = codec.encode(_update(x, Q4, round_=3))
    assert codec.encode(_update(x, Q4, round_=3)) == a
    assert codec.encode(_update(x, Q4, round_=4)) != a
    assert public_rng("c-1", 3).random() == public_rng("c-1", 3).random()
    assert public_rng("c-1", 3).random() != public_rng("c-2", 3).random()


def test_a_constant_vector_quantises_exactly() -> None:
    x = np.full(9, 0.25, dtype=np.float32)
    q = quantise(x, 4, public_rng("c", 0))
    assert q.step == 0.0 and not q.codes.any()
    np.testing.assert_array_equal(codec.decode(codec.encode(_update(x, Q4))).delta, x)


SPARSE_DEFECTS = [
    ("count beyond the model", 5, [0, 1, 2, 3, 4], 4),
    ("index out of range", 2, [1, 4], 4),
    ("unsorted", 2, [2, 1], 4),
    ("repeated", 2, [1, 1], 4),
]


@pytest.mark.parametrize(("what", "count", "indices", "n"), SPARSE_DEFECTS,
                         ids=[d[0] for d in SPARSE_DEFECTS])
def test_malformed_sparse_frames_are_refused(what: str, count: int, indices: list[int],
                                             n: int) -> None:
    body = (np.array(indices, "<u4").tobytes() + np.ones(len(indices), "<f4").tobytes())
    with pytest.raises(CodecError):
        codec.decode(_frame(_header(n, {"kind": "sparse", "count": count}), body))


@pytest.mark.parametrize("compression", [
    {"kind": "sparse", "count": 2},       # payload of 1 entry for a count of 2
    {"kind": "sparse", "count": -1},
    {"kind": "quantised", "bits": 8, "low": 0.0, "step": -1.0},
    {"kind": "quantised", "bits": 8, "low": 0.0, "step": "Infinity"},
    {"kind": "quantised", "bits": 3, "low": 0.0, "step": 1.0},
    {"kind": "quantised", "bits": 8, "low": 0.0},
    {"kind": "quantised", "bits": 8, "low": 0.0, "step": 1.0, "seed": 4},
    {"kind": "gzip"},
], ids=str)
def test_malformed_compression_headers_are_refused(compression: dict[str, object]) -> None:
    body = np.array([1], "<u4").tobytes() + np.ones(1, "<f4").tobytes()
    raw = json.dumps(_header(8, compression)).replace('"Infinity"', "Infinity").encode()
    frame = struct.pack("<4sHI", b"FSIM", PROTOCOL_VERSION, len(raw)) + raw + body
    with pytest.raises(CodecError):
        codec.decode(frame)


def test_quantised_payloads_of_the_wrong_size_or_pad_are_refused() -> None:
    q8 = {"kind": "quantised", "bits": 8, "low": 0.0, "step": 1.0}
    q4 = {"kind": "quantised", "bits": 4, "low": 0.0, "step": 1.0}
    with pytest.raises(CodecError):
        codec.decode(_frame(_header(5, q8), bytes(4)))
    with pytest.raises(CodecError):
        codec.decode(_frame(_header(5, q4), bytes(4)))  # 5 nibbles take 3 bytes
    with pytest.raises(CodecError, match="pad"):
        codec.decode(_frame(_header(5, q4), bytes([0, 0, 0x10])))
    assert codec.decode(_frame(_header(5, q4), bytes([0x21, 0, 0x03]))).delta.tolist() == \
        [1.0, 2.0, 0.0, 0.0, 3.0]


def test_a_quantised_frame_that_decodes_beyond_float32_is_refused() -> None:
    header = _header(4, {"kind": "quantised", "bits": 8, "low": 1e38, "step": 1e38})
    with pytest.raises(CodecError) as caught:
        codec.decode(_frame(header, bytes([0, 1, 255, 3])))
    assert caught.value.kind == "non_finite"


@pytest.mark.parametrize("spec", KINDS, ids=lambda s: f"{s.kind}{getattr(s, 'bits', '')}")
def test_fuzzed_compressed_frames_raise_codec_errors_or_decode_finite(spec: Compression) -> None:
    rng = np.random.default_rng(11)
    frame = bytearray(codec.encode(_update(_vector(300), spec)))
    for _ in range(300):
        mutated = bytearray(frame)
        for _ in range(int(rng.integers(1, 4))):
            mutated[int(rng.integers(0, len(mutated)))] = int(rng.integers(0, 256))
        if rng.random() < 0.2:
            mutated = mutated[: int(rng.integers(0, len(mutated)))]
        try:
            message = codec.decode(bytes(mutated), expected_params=300)
        except CodecError:
            continue
        assert isinstance(message, ClientUpdate)
        assert message.delta.size == 300 and np.isfinite(message.delta).all()
        assert message.norm is not None and math.isfinite(message.norm)


def _limits(bits: int | None = None) -> ClientLimits:
    return ClientLimits(sampling="poisson", batch_size=16.0, num_samples=600, dim=1000,
                        clip=lambda r: 1.0, sigma=lambda r: 1.0, quantise_bits=bits)


@pytest.mark.parametrize("compression", [
    {"kind": "sparse", "count": 1},
    {"kind": "quantised", "bits": 8, "low": 0.5, "step": 0.0},
])
def test_the_book_refuses_a_hostile_compressed_update_beyond_the_norm_bound(
        compression: dict[str, object]) -> None:
    """A small frame can decode to a large vector: the book judges the decoded one."""
    n = 1000
    if compression["kind"] == "sparse":
        body = np.array([17], "<u4").tobytes() + np.array([1e6], "<f4").tobytes()
    else:
        body = bytes(n)  # every coordinate 0.5: norm 15.8
    update = codec.decode(_frame(_header(n, compression), body), expected_params=n)
    assert isinstance(update, ClientUpdate)
    book = ClientBook({"c-1": _limits()}, n)
    verdict = book.judge(update)
    assert verdict.kind is Kind.NORM, verdict
    assert update.norm is not None and update.norm > _limits().norm_bound(0)


@pytest.mark.parametrize("bits", [8, 4])
@pytest.mark.parametrize("sampling", ["poisson", "fixed"])
def test_honest_quantised_updates_stay_within_the_quantised_bound(bits: int, sampling: str) -> None:
    """Updates built as the bound assumes (clipped sum + Gaussian noise, / m), quantised:
    within :func:`quantised_norm_bound`, which is above the plain bound; the 4-bit ones
    would exceed the plain bound once its slack is spent (the reason it exists)."""
    dim, m, clip, sigma = 20_000, 64.0, 1.0, 1.5
    kw = {"sampling": sampling, "clip": clip, "sigma": sigma, "batch_size": m,
          "num_samples": 6000, "dim": dim}
    plain = update_norm_bound(**kw)  # type: ignore[arg-type]
    bound = quantised_norm_bound(bits=bits, **kw)  # type: ignore[arg-type]
    assert bound > plain
    rng = np.random.default_rng(3)
    scale = clip if sampling == "poisson" else 2 * clip
    worst = 0.0
    for r in range(20):
        signal = rng.normal(size=dim)
        signal *= clip * m / np.linalg.norm(signal)  # the largest clipped sum of m gradients
        x = (signal + rng.normal(scale=scale * sigma, size=dim)) / m
        q = densify(quantise(x.astype(np.float32), bits, public_rng("c", r)))
        worst = max(worst, float(np.linalg.norm(q.astype(np.float64))))
    assert worst <= bound
    if bits == 4:
        noise_only = scale * sigma * math.sqrt(dim) / m
        assert worst > noise_only * 1.03  # 4 bits add a few % to the norm


def test_a_quantised_payload_dataclass_densifies_on_its_grid() -> None:
    q = Quantised(4, -1.0, 0.5, np.array([0, 1, 15], dtype=np.uint8))
    np.testing.assert_array_equal(densify(q), np.array([-1.0, -0.5, 6.5], dtype=np.float32))

