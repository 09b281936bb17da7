"""The aggregation nodes' messages on the wire: window closes and partials round-trip, and a
partial whose manifest does not match its sums, or is too large, is refused."""

from __future__ import annotations

import json
import struct

import numpy as np
import pytest

from fedsim.errors import CodecError
from fedsim.protocol import codec
from fedsim.protocol.messages import PROTOCOL_VERSION, ManifestEntry, Partial, WindowClose


def _partial(**changes: object) -> Partial:
    fields: dict[str, object] = dict(
        aggregator_id="aggregator-0", window=3, bases=(1, 2),
        entries=(ManifestEntry("a", 4, 1, 0, 120.0), ManifestEntry("b", 2, 2, 0, 80.0)),
        sums=np.arange(6, dtype=np.float32), settled=(("c", 1),),
        rejections={"norm": 2, "duplicate": 1}, sent_at=3.5)
    fields.update(changes)
    return Partial(**fields)  # type: ignore[arg-type]


def test_a_partial_and_a_close_round_trip() -> None:
    partial = _partial()
    back = codec.decode(codec.encode(partial, incarnation="ab"), expected_params=3)
    assert isinstance(back, Partial)
    assert (back.aggregator_id, back.window, back.bases, back.entries, back.settled,
            back.rejections) == (partial.aggregator_id, 3, (1, 2), partial.entries, (("c", 1),),
                                 {"norm": 2, "duplicate": 1})
    np.testing.assert_array_equal(back.group(1, 3), [3, 4, 5])
    empty = _partial(bases=(), entries=(), sums=np.zeros(0, np.float32))
    assert codec.decode(codec.encode(empty), expected_params=3).entries == ()  # type: ignore[union-attr]
    close = codec.decode(codec.encode(WindowClose(7, 6, 1.0)))
    assert close == WindowClose(7, 6, 1.0)


def _header(frame: bytes) -> dict:
    """A frame's JSON header (after the codec's length prefix)."""
    length = struct.unpack_from("<4sHI", frame)[2]
    return json.loads(frame[codec.PREFIX_BYTES:codec.PREFIX_BYTES + length])


def test_a_partials_count_of_deferred_updates_travels_in_its_own_field() -> None:
    """An aggregator's count of the updates its pacer holds deferred is a header field of its
    own (not one of its rejection kinds), written only when there are some: a partial without
    them is byte for byte the frame it was before the count existed."""
    waiting = _partial(waiting=256)
    back = codec.decode(codec.encode(waiting), expected_params=3)
    assert isinstance(back, Partial)
    assert (back.waiting, back.rejections) == (256, {"norm": 2, "duplicate": 1})
    assert _header(codec.encode(waiting))["waiting"] == 256
    none = codec.encode(_partial())
    assert "waiting" not in _header(none)
    assert codec.decode(none, expected_params=3).waiting == 0  # type: ignore[union-attr]
    sealed = codec.seal(waiting).open(expected_params=3)
    assert isinstance(sealed, Partial) and sealed.waiting == 256
    with pytest.raises(CodecError):
        codec.encode(_partial(waiting=-1))


@pytest.mark.parametrize(("changes", "message"), [
    ({"bases": (2, 1)}, "ascending"),
    ({"bases": (1, 3)}, "do not match"),
    ({"entries": (ManifestEntry("a", 4, 1, 0, 1.0), ManifestEntry("a", 4, 2, 0, 1.0))}, "twice"),
    ({"sums": np.arange(5, dtype=np.float32)}, "sums"),
    ({"sums": np.array([0, 1, 2, 3, 4, np.inf], np.float32)}, "non-finite"),
    ({"entries": (ManifestEntry("a/b", 4, 1, 0, 1.0), ManifestEntry("b", 2, 2, 0, 1.0))},
     "entries"),
    ({"entries": (ManifestEntry("a", 4, 1, 0, -1.0), ManifestEntry("b", 2, 2, 0, 1.0))},
     "entries"),
    ({"rejections": {"Not A Kind": 1}}, "rejections"),
])
def test_an_inconsistent_partial_is_refused_by_the_encoder(changes: dict, message: str) -> None:
    with pytest.raises(CodecError, match=message):
        codec.encode(_partial(**changes))


def test_the_decoder_refuses_a_partial_of_another_model_and_a_forged_one() -> None:
    data = codec.encode(_partial())
    with pytest.raises(CodecError, match="not 2 sums of 4 parameters"):
        codec.decode(data, expected_params=4)
    # A forged header (no encoder checks): its entries name a base version without a sum.
    header = json.loads(data[10:10 + struct.unpack_from("<I", data, 6)[0]])
    header["entries"][1][2] = 9
    forged = json.dumps(header, separators=(",", ":")).encode()
    frame = struct.pack("<4sHI", b"FSIM", PROTOCOL_VERSION, len(forged)) + forged \
        + np.arange(6, dtype=np.float32).tobytes()
    with pytest.raises(CodecError, match="do not match"):
        codec.decode(frame, expected_params=3)


def test_only_a_partial_header_may_exceed_the_ordinary_header_limit() -> None:
    many = tuple(ManifestEntry(f"c{i}", 0, 0, 0, 1.0) for i in range(4000))
    big = codec.encode(_partial(bases=(0,), entries=many, sums=np.zeros(3, np.float32)))
    header_bytes = struct.unpack_from("<I", big, 6)[0]
    assert header_bytes > codec.MAX_HEADER_BYTES
    assert len(codec.decode(big, expected_params=3).entries) == 4000  # type: ignore[union-attr]
    # The same length claimed by a status header is refused before it is parsed.
    status = b'{"kind":"status"' + b" " * (header_bytes - 16)
    frame = struct.pack("<4sHI", b"FSIM", PROTOCOL_VERSION, len(status)) + status
    with pytest.raises(CodecError, match="exceeds"):
        codec.decode(frame)


def test_the_largest_partial_fits_max_partial_bytes() -> None:
    """Every field of a partial at its bound (64 sums, 16,384 entries and as many settled
    rounds with 64-character ids, the largest counters and weights, 64 rejection kinds): the
    frame fits :func:`codec.max_partial_bytes`, which a server's partials topic allows."""
    from fedsim.protocol.headers import (
        MAX_COUNTER,
        MAX_PARTIAL_ENTRIES,
        MAX_PARTIAL_GROUPS,
        MAX_WEIGHT,
    )

    size = 3
    bases = tuple(range(MAX_COUNTER - MAX_PARTIAL_GROUPS + 1, MAX_COUNTER + 1))
    weight = float(np.nextafter(MAX_WEIGHT, 0.0))  # 17 significant digits
    entries = tuple(ManifestEntry(f"{'a' * 58}{i:06d}", MAX_COUNTER, bases[i % len(bases)],
                                  MAX_COUNTER, weight) for i in range(MAX_PARTIAL_ENTRIES))
    settled = tuple((f"{'b' * 58}{i:06d}", MAX_COUNTER) for i in range(MAX_PARTIAL_ENTRIES))
    kinds = {f"{'x' * 30}{chr(97 + i // 26)}{chr(97 + i % 26)}": MAX_COUNTER for i in range(64)}
    largest = Partial("z" * 64, MAX_COUNTER, bases,
                      tuple(sorted(entries, key=lambda e: e.base_version)),
                      np.zeros(size * len(bases), np.float32), settled=settled,
                      rejections=kinds, sent_at=-1.2345678901234567e-300)
    frame = codec.encode(largest)
    assert len(frame) <= codec.max_partial_bytes(size)
    assert len(frame) > codec.max_message_bytes(size)  # (the bug: the partials topic was this)
    back = codec.decode(frame, expected_params=size, max_bytes=codec.max_partial_bytes(size))
    assert isinstance(back, Partial) and back.bases == bases


@pytest.mark.parametrize("size", [1, 33, 20_000, 4_000_000])
def test_partial_groups_counts_the_sums_that_fit_a_limit(size: int) -> None:
    per_sum = 4 * size
    for groups in (1, 2, 7, 64):
        limit = codec.max_partial_bytes(size, groups)
        assert codec.partial_groups(size, limit) == groups
        assert codec.partial_groups(size, limit - 1) == groups - 1
        assert codec.partial_groups(size, limit + per_sum - 1) == groups
    assert codec.partial_groups(size, codec.max_partial_bytes(size, 200)) == 64  # the codec's cap
    assert codec.partial_groups(size, codec.max_message_bytes(size)) == 0  # no room for a manifest
    assert codec.partial_groups(size, 10) == 0
