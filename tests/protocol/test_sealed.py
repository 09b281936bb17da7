"""Sealed messages (issue 24): the in-process network's form of a message is checked as the
encoder checks it and opened as the decoder decodes its frame. Over random messages of every
kind, valid and invalid, ``seal(m).open(limits)`` returns what ``decode(encode(m), limits)``
returns (the same fields, bit for bit, the same norm) or raises the same :class:`CodecError`,
and ``seal(m).to_bytes()`` is ``encode(m)``."""

from __future__ import annotations

import dataclasses
import math
import struct
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
import torch

from fedsim.config.compression import QuantiseCompression, ThresholdCompression, TopKCompression
from fedsim.errors import CodecError
from fedsim.protocol import codec, norms
from fedsim.protocol.messages import (
    ClientStatus,
    ClientUpdate,
    GlobalModel,
    ManifestEntry,
    Message,
    Partial,
    RunFinished,
    WindowClose,
)

FLOATS = [0.0, -0.0, 1.0, 0.1, 1 / 3, 5e-324, 2.2250738585072014e-308, 1e300, -1e-300,
          123456.789, 1e16 + 2, math.pi * 1e-7]


def _float(rng: np.random.Generator, *, positive: bool = False, bad: bool = False) -> float:
    """A float that stresses the header's JSON round trip (and, with ``bad``, sometimes one
    the schema refuses)."""
    if bad and rng.random() < 0.15:
        return float(rng.choice([math.nan, math.inf, -math.inf, -1.0, 0.0]))
    value = float(rng.choice(FLOATS)) if rng.random() < 0.4 else float(
        rng.standard_normal() * 10.0 ** rng.integers(-30, 30))
    return abs(value) if positive else value


def _counter(rng: np.random.Generator, bad: bool) -> Any:
    if bad and rng.random() < 0.1:
        return rng.choice([-1, 2**53, 10**30, True])  # type: ignore[arg-type]
    return int(rng.choice([0, 1, 7, 2**53 - 1, int(rng.integers(0, 10**6))]))


def _client_id(rng: np.random.Generator, bad: bool) -> str:
    if bad and rng.random() < 0.1:
        return str(rng.choice(["", "a/b", "x+", "has space", "#", "a" * 65, "-lead"]))
    return str(rng.choice(["c-0", "phone.3", "Z_9", "a" * 64, f"client-{rng.integers(10**6)}"]))


def _vector(rng: np.random.Generator, length: int, bad: bool) -> Any:
    values = (rng.standard_normal(length) * 10.0 ** rng.integers(-20, 20)).astype(np.float32)
    if length and rng.random() < 0.2:
        values[rng.integers(length)] = np.finfo(np.float32).max
    if bad and rng.random() < 0.2:
        if length:
            values[rng.integers(length)] = rng.choice([np.nan, np.inf, -np.inf])
        else:
            return np.zeros(3, np.float64)
    if bad and rng.random() < 0.05:
        return values.astype(np.float64)  # wrong dtype
    if bad and rng.random() < 0.05:
        return values.reshape(1, -1)  # wrong rank
    if rng.random() < 0.1:
        return np.repeat(values, 2)[::2]  # a strided (non-contiguous) view of the same values
    return values


def _update(rng: np.random.Generator, length: int, bad: bool) -> ClientUpdate:
    compression = None
    if rng.random() < 0.3:
        compression = rng.choice([TopKCompression(kind="top_k", fraction=0.1),
                                  TopKCompression(kind="top_k", fraction=0.9),
                                  ThresholdCompression(kind="threshold", threshold=0.5),
                                  QuantiseCompression(kind="quantise", bits=8),
                                  QuantiseCompression(kind="quantise", bits=4)])
    return ClientUpdate(_client_id(rng, bad), _counter(rng, bad), _counter(rng, bad),
                        _vector(rng, length, bad), _float(rng, positive=True, bad=bad),
                        _float(rng, bad=bad), _counter(rng, bad), compression=compression)


def _global(rng: np.random.Generator, length: int, bad: bool) -> GlobalModel:
    invited = None if rng.random() < 0.5 else bytes(rng.integers(0, 256, rng.integers(0, 40),
                                                                 dtype=np.uint8))
    step = _float(rng, positive=True, bad=bad) if rng.random() < 0.5 else 1.0
    if bad and rng.random() < 0.1:
        step = 2e6  # above MAX_STEP_SIZE
    return GlobalModel(_counter(rng, bad), _vector(rng, length, bad), _float(rng, bad=bad),
                       _counter(rng, bad), invited, min(step, 1e6) if not bad else step)


def _status(rng: np.random.Generator, bad: bool) -> ClientStatus:
    detail = str(rng.choice(["", "done", "ünïcödé ✓", "\x00\x01\n\"\\", "x" * 4096]))
    extra = {f"k{i}\u2603": _float(rng, bad=bad) for i in range(int(rng.integers(0, 5)))}
    if bad and rng.random() < 0.1:
        # A header over 64 KiB: 256 keys of 128 control characters, escaped 6 bytes each.
        extra = {f"{i:03d}" + "\x01" * 125: 1.0 for i in range(256)}
    epsilon = float(rng.choice([0.0, 2.5, math.inf, _float(rng, positive=True)]))
    if bad and rng.random() < 0.1:
        epsilon = math.nan
    state = str(rng.choice(["training", "waiting", "budget_exhausted", "offline", "done",
                            "crashed"] + (["bogus"] if bad else [])))
    return ClientStatus(_client_id(rng, bad), state, _counter(rng, bad),  # type: ignore[arg-type]
                        epsilon, float(rng.choice([0.0, 1e-5, 1.0])), detail,
                        _float(rng, bad=bad), extra)


def _partial(rng: np.random.Generator, length: int, bad: bool) -> Partial:
    bases = sorted({int(b) for b in rng.integers(0, 50, rng.integers(0, 4))})
    entries = tuple(ManifestEntry(f"c-{i}", int(rng.integers(0, 100)), bases[i % len(bases)],
                                  int(rng.integers(0, 9)), abs(_float(rng)) % 1e15)
                    for i in range(len(bases) + int(rng.integers(0, 4)))) if bases else ()
    if bad and rng.random() < 0.2:
        bases = bases[::-1] if len(bases) > 1 else [*bases, 7, 7]
    if bad and entries and rng.random() < 0.2:
        entries = (*entries, entries[0])  # a (client, round) twice
    sums = _vector(rng, len(bases) * length, bad) if len(set(bases)) == len(bases) else \
        _vector(rng, length, bad)
    rejections = {"stale": int(rng.integers(0, 5))} if rng.random() < 0.5 else {}
    return Partial(_client_id(rng, bad), _counter(rng, bad), tuple(bases), entries, sums,
                   tuple((e.client_id, e.round) for e in entries[:1]), rejections,
                   _float(rng, bad=bad))


def _message(rng: np.random.Generator, bad: bool) -> Message:
    length = int(rng.choice([0, 1, 5, 64, 1000]))
    kind = int(rng.integers(6))
    if kind == 0:
        return _update(rng, length, bad)
    if kind == 1:
        return _global(rng, length, bad)
    if kind == 2:
        return _status(rng, bad)
    if kind == 3:
        return WindowClose(_counter(rng, bad), _counter(rng, bad), _float(rng, bad=bad))
    if kind == 4:
        return RunFinished(_counter(rng, bad), str(rng.choice(["", "budget", "é" * 4096])),
                           _float(rng, bad=bad))
    return _partial(rng, length, bad)


def _outcome(make: Callable[[], Message]) -> Message | tuple[str, str]:
    try:
        return make()
    except CodecError as exc:
        return (exc.kind, str(exc))


def _same(a: Any, b: Any, where: str = "message") -> None:
    """``a`` and ``b`` are the same value bit for bit, of the same types."""
    assert type(a) is type(b), f"{where}: {type(a).__name__} != {type(b).__name__}"
    if isinstance(a, np.ndarray):
        assert a.dtype == b.dtype and a.shape == b.shape and a.tobytes() == b.tobytes(), where
        assert not a.flags.writeable and not b.flags.writeable, f"{where} is writeable"
    elif isinstance(a, float):
        assert struct.pack("<d", a) == struct.pack("<d", b) or (math.isnan(a) and math.isnan(b)), \
            f"{where}: {a!r} != {b!r}"
    elif dataclasses.is_dataclass(a):
        for field in dataclasses.fields(a):
            _same(getattr(a, field.name), getattr(b, field.name), f"{where}.{field.name}")
    elif isinstance(a, tuple | list):
        assert len(a) == len(b), where
        for i, (x, y) in enumerate(zip(a, b, strict=True)):
            _same(x, y, f"{where}[{i}]")
    elif isinstance(a, dict):
        assert list(a) == list(b), where
        for key in a:
            _same(a[key], b[key], f"{where}[{key!r}]")
    else:
        assert a == b, f"{where}: {a!r} != {b!r}"


def _check(message: Message, rng: np.random.Generator) -> str:
    """Compare both paths on ``message`` under random receiver limits; the outcome's name."""
    stamp = {"incarnation": str(rng.choice(["", "ab12", "f" * 32])),
             "lineage": tuple(str(rng.choice(["", "0a", "e" * 32])) for _ in
                              range(int(rng.choice([0, 1, 70]))))}
    encoded = _outcome(lambda: codec.encode(message, **stamp))  # type: ignore[arg-type, return-value]
    sealed = _outcome(lambda: codec.seal(message, **stamp))  # type: ignore[arg-type, return-value]
    if isinstance(encoded, tuple):  # refused at the sender: the same refusal
        assert sealed == encoded
        return f"send:{encoded[0]}"
    assert isinstance(sealed, codec.Sealed) and isinstance(encoded, bytes)
    assert sealed.to_bytes() == encoded and len(sealed) == len(encoded)
    size = len(encoded)
    limits: list[dict[str, Any]] = [{}, {"max_bytes": size}, {"max_bytes": size - 1}]
    tensor = next((getattr(message, name) for name in ("delta", "params", "sums")
                   if isinstance(getattr(message, name, None), np.ndarray)), None)
    if tensor is not None:
        limits += [{"expected_params": tensor.size}, {"expected_params": tensor.size + 1}]
        if isinstance(message, Partial) and message.bases:
            limits.append({"expected_params": tensor.size // len(message.bases)})
    choice = limits[int(rng.integers(len(limits)))]
    decoded = _outcome(lambda: codec.decode(encoded, **choice))
    opened = _outcome(lambda: sealed.open(**choice))
    _same(opened, decoded)
    return f"open:{decoded[0]}" if isinstance(decoded, tuple) else type(decoded).__name__


@pytest.mark.parametrize("bad", [False, True], ids=["valid", "invalid"])
def test_sealed_and_opened_is_decoded_from_the_encoded_frame(bad: bool) -> None:
    rng = np.random.default_rng(2024 + bad)
    outcomes: dict[str, int] = {}
    for _ in range(600):
        name = _check(_message(rng, bad), rng)
        outcomes[name] = outcomes.get(name, 0) + 1
    kinds = {"ClientUpdate", "GlobalModel", "ClientStatus", "WindowClose", "RunFinished",
             "Partial"}
    assert kinds <= set(outcomes), outcomes  # every kind opened
    refusals = {name for name in outcomes if ":" in name}
    assert {"open:oversized", "open:shape"} <= refusals, outcomes  # the receiver's own limits
    if bad:
        assert {"send:non_finite", "send:shape", "send:malformed"} <= refusals, \
            outcomes


def test_an_oversized_header_is_refused_by_the_receiver_in_both_paths() -> None:
    extra = {f"{i:03d}" + "\x01" * 125: 1.0 for i in range(256)}
    status = ClientStatus("c-1", "done", 3, 1.0, 1e-5, "", 0.0, extra)
    with pytest.raises(CodecError) as decoded:
        codec.decode(codec.encode(status))
    with pytest.raises(CodecError) as opened:
        codec.seal(status).open()
    assert opened.value.kind == decoded.value.kind == "oversized"
    assert str(opened.value) == str(decoded.value)


def test_the_senders_array_is_given_up_at_sealing_and_the_norm_is_the_decoders() -> None:
    values = np.random.default_rng(1).standard_normal(101_770).astype(np.float32)
    sealed = codec.seal(ClientUpdate("c-1", 0, 0, values, 8.0, 1.0))
    with pytest.raises(ValueError, match="read-only"):
        values[0] = 1.0  # the sender cannot change what is in flight
    opened = sealed.open(expected_params=values.size)
    decoded = codec.decode(sealed.to_bytes(), expected_params=values.size)
    assert isinstance(opened, ClientUpdate) and isinstance(decoded, ClientUpdate)
    assert opened.delta.base is values  # a view of the sender's own array, not a copy
    with pytest.raises(ValueError):
        opened.delta.flags.writeable = True  # a receiver cannot make it writeable
    assert opened.norm == decoded.norm == norms.vector_norm(values)
    # A view of a writeable buffer or a torch tensor's memory travels as a copy: writing
    # through the buffer or the tensor after publish changes nothing in flight.
    buffer = np.ones(6, dtype=np.float32)
    in_view = codec.seal(ClientUpdate("c-1", 0, 0, buffer[:3], 8.0, 1.0))
    tensor = torch.ones(3)
    in_tensor = codec.seal(ClientUpdate("c-1", 0, 0, tensor.numpy(), 8.0, 1.0))
    buffer[:] = np.inf
    tensor.fill_(float("nan"))
    for sealed_copy in (in_view, in_tensor):
        message = sealed_copy.open()
        assert isinstance(message, ClientUpdate)
        assert message.delta.tolist() == [1.0, 1.0, 1.0] and message.norm == math.sqrt(3.0)
    # A strided view is copied into a contiguous one; the sender's array is left alone.
    base = np.arange(10, dtype=np.float32)
    strided = codec.seal(ClientUpdate("c-1", 0, 0, base[::2], 8.0, 1.0)).open()
    assert isinstance(strided, ClientUpdate) and strided.delta.flags.c_contiguous
    assert base.flags.writeable and strided.delta.tobytes() == base[::2].tobytes()
