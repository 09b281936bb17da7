"""The wire codec: round trips, a corpus of bad payloads, and a fuzz of the decoder."""

from __future__ import annotations

import json
import struct

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fedsim.errors import CodecError
from fedsim.protocol import codec
from fedsim.protocol.codec import decode, encode
from fedsim.protocol.headers import MAX_STEP_SIZE
from fedsim.protocol.messages import (
    PROTOCOL_VERSION,
    ClientStatus,
    ClientUpdate,
    GlobalModel,
    RunFinished,
)

PARAMS = 26_010  # the DP MNIST CNN


def _update(n: int = PARAMS, *, seed: int = 0, client_id: str = "client-07") -> ClientUpdate:
    delta = np.random.default_rng(seed).standard_normal(n).astype(np.float32)
    return ClientUpdate(client_id, 12, 9, delta, 64.0, sent_at=3.25)


def _split(data: bytes) -> tuple[dict, bytes]:
    """Header JSON and tensor bytes of an encoded message (parsed independently of the codec)."""
    magic, version, header_len = struct.unpack_from("<4sHI", data)
    assert (magic, version) == (b"FSIM", PROTOCOL_VERSION)
    return json.loads(data[10 : 10 + header_len]), data[10 + header_len :]


def _assemble(
    header: dict, tensor: bytes = b"", *, magic=b"FSIM", version=PROTOCOL_VERSION
) -> bytes:
    raw = json.dumps(header).encode()
    return struct.pack("<4sHI", magic, version, len(raw)) + raw + tensor


def test_update_round_trip_is_bit_exact() -> None:
    update = _update()
    decoded = decode(encode(update), expected_params=PARAMS)
    assert isinstance(decoded, ClientUpdate)
    assert (decoded.client_id, decoded.round, decoded.base_version) == ("client-07", 12, 9)
    assert (decoded.batch_size, decoded.sent_at, decoded.window) == (64.0, 3.25, 0)
    assert decoded.delta.dtype == np.float32 and decoded.delta.shape == (PARAMS,)
    assert decoded.delta.tobytes() == update.delta.tobytes()
    assert not decoded.delta.flags.writeable  # a view of the payload: messages are immutable


def test_wire_layout_is_header_then_little_endian_float32() -> None:
    update = _update(5)
    header, tensor = _split(encode(update))
    assert header["kind"] == "update" and header["tensor"] == {"dtype": "<f4", "shape": [5]}
    assert np.array_equal(np.frombuffer(tensor, dtype="<f4"), update.delta)


def test_global_model_and_status_round_trip() -> None:
    params = np.linspace(-1, 1, 7, dtype=np.float32)
    model = decode(encode(GlobalModel(4, params, sent_at=1.5)))
    assert isinstance(model, GlobalModel) and model.version == 4 and model.sent_at == 1.5
    assert np.array_equal(model.params, params)
    assert (model.window, model.invited) == (0, None)
    invitation = decode(encode(GlobalModel(4, params, 1.5, window=9, invited=b"\x05\x80")))
    assert isinstance(invitation, GlobalModel)
    assert (invitation.window, invitation.invited) == (9, b"\x05\x80")
    assert model.step_size == 1.0  # the default: van Dijk & Nguyen's s_t before any decay
    for step in (0.03125, MAX_STEP_SIZE):
        stepped = decode(encode(GlobalModel(4, params, 1.5, window=9, step_size=step)))
        assert isinstance(stepped, GlobalModel) and stepped.step_size == step

    status = ClientStatus(
        "c1", "budget_exhausted", 40, float("inf"), 1e-5, detail="eps 8.1 > 8", extra={"mu": 0.7}
    )
    decoded = decode(encode(status))
    assert decoded == status  # epsilon = +inf survives (JSON constant), NaN never does


def test_the_end_of_the_run_is_a_header_with_its_incarnation_and_is_validated() -> None:
    data = encode(RunFinished(24, "stop.windows = 24 reached", 6.0), incarnation="ab12",
                  lineage=("0f",))
    header, tensor = _split(data)
    assert header == {"kind": "finished", "incarnation": "ab12", "lineage": ["0f"],
                      "version": 24, "reason": "stop.windows = 24 reached", "sent_at": 6.0}
    assert tensor == b""
    frame = codec.decode_frame(data)
    assert frame.message == RunFinished(24, "stop.windows = 24 reached", 6.0)
    assert (frame.incarnation, frame.lineage) == ("ab12", ("0f",))
    for bad in ({**header, "version": -1}, {**header, "reason": "x" * 4097},
                {**header, "incarnation": "not hex"}, {**header, "extra": 1},
                {**header, "version": "24"}):
        with pytest.raises(CodecError, match="invalid header"):
            decode(_assemble(bad))
    with pytest.raises(CodecError, match="trailing bytes"):
        decode(_assemble(header, b"\x00" * 4))
    with pytest.raises(CodecError):
        encode(RunFinished(-1, "negative version"))


def test_wrong_length_against_the_model_is_rejected() -> None:
    data = encode(_update(100))
    assert decode(data, expected_params=100).delta.shape == (100,)
    with pytest.raises(CodecError, match="100 values, the model has 101"):
        decode(data, expected_params=101)


def test_size_limit_is_checked_before_parsing() -> None:
    data = encode(_update(1000))
    assert decode(data, max_bytes=len(data)).delta.shape == (1000,)
    with pytest.raises(CodecError, match="exceeds the limit"):
        decode(data, max_bytes=len(data) - 1)
    assert codec.max_message_bytes(1000) >= len(data)


@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
def test_non_finite_values_are_rejected_both_ways(bad: float) -> None:
    update = _update(50)
    header, tensor = _split(encode(update))
    values = np.frombuffer(tensor, dtype="<f4").copy()
    values[17] = bad
    with pytest.raises(CodecError, match="1 non-finite"):
        decode(_assemble(header, values.tobytes()))
    poisoned = ClientUpdate("c1", 0, 0, values, 1.0)
    with pytest.raises(CodecError, match="non-finite"):
        encode(poisoned)


def test_finite_values_whose_sum_overflows_are_accepted_and_a_bad_one_among_them_not() -> None:
    """Values at the float32 limit are finite and pass, although any sum of them overflows (a
    finite check by summation would need an exact fallback); one NaN or inf among them fails."""
    overflowing = np.full(64, np.finfo(np.float32).max, dtype=np.float32)  # float32 sum: +inf
    decoded = decode(encode(ClientUpdate("c1", 0, 0, overflowing, 1.0)))
    assert np.array_equal(decoded.delta, overflowing)
    header, _ = _split(encode(_update(64)))
    for bad in (np.nan, np.inf, -np.inf):
        values = overflowing.copy()
        values[33] = bad
        with pytest.raises(CodecError, match="1 non-finite"):
            decode(_assemble(header, values.tobytes()))


def _corpus() -> dict[str, bytes]:
    """Malformed, truncated, oversized, wrong-shape, wrong-type and wrong-version payloads."""
    good = encode(_update(8))
    header, tensor = _split(good)
    status_header, _ = _split(encode(ClientStatus("c1", "training", 1, 0.5, 1e-5)))

    def edited(**changes: object) -> bytes:
        return _assemble({**header, **changes}, tensor)

    corpus = {
        "empty": b"",
        "prefix only": good[:10],
        "truncated prefix": good[:7],
        "truncated header": good[:40],
        "truncated tensor": good[:-3],
        "trailing bytes": good + b"\0\0\0\0",
        "bad magic": b"PK\x03\x04" + good[4:],
        "version 0": _assemble(header, tensor, version=0),
        "version 2": _assemble(header, tensor, version=PROTOCOL_VERSION + 1),
        "huge header length": struct.pack("<4sHI", b"FSIM", PROTOCOL_VERSION, 2**32 - 1) + b"{}",
        "header not JSON": struct.pack("<4sHI", b"FSIM", PROTOCOL_VERSION, 5) + b"\xff\xfe{{{",
        "header not an object": _assemble([1, 2, 3]),  # type: ignore[arg-type]
        "unknown kind": edited(kind="gradient"),
        "unknown key": edited(extra_field=1),
        "missing key": _assemble({k: v for k, v in header.items() if k != "round"}, tensor),
        "float64 tensor": edited(tensor={"dtype": "<f8", "shape": [4]}),
        "big-endian tensor": edited(tensor={"dtype": ">f4", "shape": [8]}),
        "2-D tensor": edited(tensor={"dtype": "<f4", "shape": [2, 4]}),
        "shape/payload mismatch": edited(tensor={"dtype": "<f4", "shape": [9]}),
        "negative shape": edited(tensor={"dtype": "<f4", "shape": [-8]}),
        "negative round": edited(round=-1),
        "round as string": edited(round="12"),
        "round as float": edited(round=12.0),
        "zero batch size": edited(batch_size=0.0),
        "N on the wire": edited(num_samples=600),  # no field may carry N (issue 15)
        "negative window": edited(window=-1),
        "slash in client id": edited(client_id="a/b"),
        "wildcard client id": edited(client_id="#"),
        "empty client id": edited(client_id=""),
        "status with tensor bytes": _assemble(status_header, b"\0" * 4),
        "status with NaN epsilon": _assemble({**status_header, "epsilon": "NaN"}).replace(
            b'"NaN"', b"NaN"
        ),
        "status negative epsilon": _assemble({**status_header, "epsilon": -1.0}),
        "status delta > 1": _assemble({**status_header, "delta": 2.0}),
        "status unknown state": _assemble({**status_header, "state": "hacked"}),
        "global without tensor": _assemble({"kind": "global", "version": 1, "sent_at": 0.0}),
        "invitation not hex": _assemble({"kind": "global", "version": 1, "sent_at": 0.0,
                                         "invited": "zz", "tensor": {"dtype": "<f4",
                                                                     "shape": [0]}}),
        "invitation odd length": _assemble({"kind": "global", "version": 1, "sent_at": 0.0,
                                            "invited": "abc", "tensor": {"dtype": "<f4",
                                                                         "shape": [0]}}),
    }
    global_header = {"kind": "global", "version": 1, "sent_at": 0.0,
                     "tensor": {"dtype": "<f4", "shape": [0]}}
    for name, step in (("zero", 0.0), ("negative", -0.5), ("huge", MAX_STEP_SIZE * 2)):
        corpus[f"step size {name}"] = _assemble({**global_header, "step_size": step})
    corpus["step size NaN"] = _assemble({**global_header, "step_size": "NaN"}).replace(
        b'"NaN"', b"NaN")
    corpus["step size inf"] = _assemble({**global_header, "step_size": "Inf"}).replace(
        b'"Inf"', b"Infinity")
    return corpus


@pytest.mark.parametrize("name", sorted(_corpus()))
def test_corpus_of_bad_payloads_is_rejected_with_a_reason(name: str) -> None:
    with pytest.raises(CodecError) as info:
        decode(_corpus()[name], expected_params=8, max_bytes=10_000)
    assert str(info.value)  # a reason, not an empty message


def test_wrong_shape_message_names_the_counts() -> None:
    with pytest.raises(CodecError, match="payload is 32 bytes, header declares 9"):
        decode(_corpus()["shape/payload mismatch"])


@pytest.mark.parametrize(
    "message",
    [
        ClientUpdate("c1", 0, 0, np.zeros(3, dtype=np.float64), 1.0),
        ClientUpdate("c1", 0, 0, np.zeros((2, 2), dtype=np.float32), 1.0),
        ClientUpdate("bad id", 0, 0, np.zeros(3, dtype=np.float32), 1.0),
        ClientUpdate("c1", -1, 0, np.zeros(3, dtype=np.float32), 1.0),
        GlobalModel(0, [0.0, 1.0]),  # type: ignore[arg-type]
        GlobalModel(0, np.zeros(2, dtype=np.float32), step_size=float("nan")),
        "not a message",
    ],
)
def test_encode_refuses_what_decode_would_reject(message: object) -> None:
    with pytest.raises(CodecError):
        encode(message)  # type: ignore[arg-type]


def test_check_client_id() -> None:
    assert codec.check_client_id("group-1.client_07") == "group-1.client_07"
    for bad in ("", "a/b", "a+b", "a b", "x" * 65, "-leading"):
        with pytest.raises(CodecError, match="MQTT topics"):
            codec.check_client_id(bad)


@settings(max_examples=400, deadline=None)
@given(st.binary(max_size=300))
def test_fuzz_arbitrary_bytes_only_ever_raise_codec_error(data: bytes) -> None:
    try:
        decode(data, expected_params=8, max_bytes=10_000)
    except CodecError:
        pass


_VALID = [
    encode(_update(8)),
    encode(GlobalModel(3, np.ones(8, np.float32))),
    encode(ClientStatus("c9", "waiting", 2, 1.25, 1e-6, detail="x", extra={"a": 2.0})),
]


@settings(max_examples=400, deadline=None)
@given(
    st.sampled_from(_VALID),
    st.lists(st.tuples(st.integers(0, 400), st.integers(0, 255)), max_size=6),
    st.integers(0, 400),
)
def test_fuzz_mutated_valid_messages_decode_or_raise_codec_error(
    data: bytes, flips: list[tuple[int, int]], cut: int
) -> None:
    mutated = bytearray(data)
    for position, value in flips:
        if position < len(mutated):
            mutated[position] = value
    mutated = mutated[: len(mutated) - cut] if cut < len(mutated) else mutated
    try:
        message = decode(bytes(mutated), expected_params=8, max_bytes=10_000)
    except CodecError:
        return
    # Whatever survives validation is a well-formed message with finite float32 values.
    if isinstance(message, ClientUpdate | GlobalModel):
        values = message.delta if isinstance(message, ClientUpdate) else message.params
        assert values.dtype == np.float32 and values.shape == (8,)
        assert np.isfinite(values).all()
