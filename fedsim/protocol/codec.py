"""Byte encoding of the wire messages (:mod:`fedsim.protocol.messages`).

Layout of one encoded message (all integers little-endian)::

    offset  size  field
    0       4     magic  b"FSIM"
    4       2     protocol version (uint16), :data:`~fedsim.protocol.messages.PROTOCOL_VERSION`
    6       4     header length H (uint32)
    10      H     header: UTF-8 JSON, a model of :mod:`~fedsim.protocol.headers` (``kind``)
    10+H    4*n   tensor: n raw float32 values (``<f4``), only for updates and global models

A compressed update (:mod:`fedsim.protocol.compression`) carries ``compression`` in its header
(``{"kind": "sparse", "count": k}`` or ``{"kind": "quantised", "bits": b, "low": .., "step":
..}``) and that payload in place of the raw tensor; ``tensor`` still names the dense length,
and :func:`decode` returns the dense float32 vector it stands for, checked like any other. An
update without compression is byte for byte what it was before compression existed.

A ``finished`` message (:class:`~fedsim.protocol.messages.RunFinished`, the server's end of the
run) is a header alone, stamped with the incarnation and lineage like a global model.

The tensor travels as raw bytes (``numpy.ndarray.tobytes`` / ``numpy.frombuffer``): encoding a
100 KB update costs microseconds, and nothing on the wire is ever unpickled. :func:`decode`
trusts nothing: it checks the size limit before parsing, then magic, version, the header
against its schema (unknown keys are errors), the tensor's dtype and length, the model's
parameter count when given, and that every value is finite. Any failure is a
:class:`~fedsim.errors.CodecError` whose message says what was wrong (and whose ``kind`` names
the defect for rejection counts); no other exception escapes.

Bounds (:mod:`fedsim.protocol.headers`): counters (``round``, ``base_version``, ``version``)
are integers in ``[0, 2**53)``, so they are exact in every JSON reader and no peer can make
another hold a bignum (``round = 10**30`` is refused here, before any table sees it); strings
and the status ``extra`` map are length-bounded; a global model's server ``step_size`` is
finite, positive and at most :data:`MAX_STEP_SIZE`; the header is at most 64 KiB. Every header
carries the sender's run *incarnation* (``incarnation``, 32 hex digits at most, ``""`` for a
client that has not yet learnt it; :mod:`fedsim.transports.incarnation`) and a global model
also the incarnations it continues (``lineage``): :func:`encode` takes it, :func:`decode_frame`
returns it.
"""

from __future__ import annotations

import functools
import math
import struct
from collections.abc import Callable
from dataclasses import dataclass
from typing import Final

import numpy as np
from pydantic import (
    ValidationError,
)

from fedsim.errors import CodecError
from fedsim.protocol import compression
from fedsim.protocol.headers import (
    CLIENT_ID_PATTERN,
    HEADERS,
    MAX_COUNTER,
    MAX_LINEAGE,
    MAX_PARTIAL_GROUPS,
    AnyHeader,
    CloseHeader,
    FinishedHeader,
    GlobalHeader,
    PartialHeader,
    QuantisedSpec,
    SparseSpec,
    StatusHeader,
    TensorSpec,
    UpdateHeader,
    check_client_id,
)
from fedsim.protocol.messages import (
    PROTOCOL_VERSION,
    ClientStatus,
    ClientUpdate,
    GlobalModel,
    ManifestEntry,
    Message,
    Partial,
    RunFinished,
    WindowClose,
)
from fedsim.protocol.norms import known_norm, vector_norm

MAGIC = b"FSIM"
_PREFIX = struct.Struct("<4sHI")  # magic, version, header length
PREFIX_BYTES = _PREFIX.size
MAX_HEADER_BYTES = 64 * 1024
"""A header is a few hundred bytes; a status ``detail``/``extra`` must fit in 64 KiB."""
DEFAULT_MAX_BYTES = 64 * 1024 * 1024
"""Default size limit of one message (64 MiB: a 16M-parameter model). Use
:func:`max_message_bytes` to size the limit from the model instead."""
TENSOR_DTYPE: Final = "<f4"
_FLOAT32 = np.dtype(TENSOR_DTYPE)

MAX_PARTIAL_HEADER_BYTES = 4 * 1024 * 1024
"""A partial's header (its manifest) may exceed :data:`MAX_HEADER_BYTES`, up to this."""
_PARTIAL_PREFIX = b'{"kind":"partial"'


def max_message_bytes(num_params: int, *, header_allowance: int = MAX_HEADER_BYTES) -> int:
    """The largest legitimate message for a model with ``num_params`` parameters."""
    return PREFIX_BYTES + header_allowance + _FLOAT32.itemsize * num_params


def max_partial_bytes(num_params: int, groups: int = MAX_PARTIAL_GROUPS) -> int:
    """The largest legitimate partial with ``groups`` sums (one per base version) of a model with
    ``num_params`` parameters: its manifest header may take :data:`MAX_PARTIAL_HEADER_BYTES`."""
    return PREFIX_BYTES + MAX_PARTIAL_HEADER_BYTES + _FLOAT32.itemsize * num_params * groups


def partial_groups(num_params: int, limit: int) -> int:
    """How many sums of a ``num_params`` model one partial may carry and stay within ``limit``
    bytes with a whole manifest (at most :data:`MAX_PARTIAL_GROUPS`; 0: not even one)."""
    room = limit - max_partial_bytes(num_params, 0)
    if room < 0:
        return 0
    per_group = _FLOAT32.itemsize * num_params
    return MAX_PARTIAL_GROUPS if per_group == 0 else min(MAX_PARTIAL_GROUPS, room // per_group)


def _tensor_spec(values: np.ndarray, field: str) -> TensorSpec:
    if not isinstance(values, np.ndarray) or values.dtype != np.float32 or values.ndim != 1:
        got = (
            f"{values.dtype} array of shape {values.shape}"
            if isinstance(values, np.ndarray)
            else type(values).__name__
        )
        raise CodecError(f"{field} must be a 1-D float32 numpy array, got {got}", kind="shape")
    return _spec_of_length(int(values.shape[0]))


@functools.lru_cache(maxsize=64)
def _spec_of_length(length: int) -> TensorSpec:
    """The (frozen) spec of a float32 vector of ``length`` values: every message of a run
    carries one of a model's few sizes, validated once each."""
    return TensorSpec(dtype=TENSOR_DTYPE, shape=(length,))


def _non_finite(values: np.ndarray, field: str) -> CodecError:
    bad = int(values.size - np.count_nonzero(np.isfinite(values)))
    return CodecError(f"{field} contains {bad} non-finite value(s) (NaN or inf)", kind="non_finite")


def _check_finite(values: np.ndarray, field: str) -> None:
    # isfinite + all is memory-bound (as fast as one read of a cold vector) and twice as fast
    # as a float32 sum on a warm one (measured for 100k values).
    known = known_norm(values)
    if known is not None and math.isfinite(known):
        return  # its sender measured it and gave it up unchanged
    if not np.isfinite(values).all():
        raise _non_finite(values, field)


def _finite_norm(values: np.ndarray, field: str) -> float:
    """:func:`vector_norm`, which is finite exactly when every value is (one pass for both);
    the norm the sender measured as it gave the array up, when it did (:func:`known_norm`)."""
    norm = known_norm(values)
    if norm is None:
        norm = vector_norm(values)
    if not math.isfinite(norm):
        raise _non_finite(values, field)
    return norm


def _compressed(
    message: ClientUpdate,
) -> tuple[SparseSpec | QuantisedSpec | None, np.ndarray | bytes]:
    """The update's payload under its ``compression`` (a sparse vector that would take more
    bytes than the dense one travels dense, its dropped coordinates zero)."""
    if message.compression is None:
        return None, message.delta
    payload = compression.compress(message.delta, message.compression,
                                   client_id=message.client_id, round_index=message.round)
    if isinstance(payload, compression.Sparse):
        if 2 * payload.indices.size >= payload.length:
            return None, compression.densify(payload)
        return SparseSpec(kind="sparse", count=int(payload.indices.size)), compression.pack(payload)
    return (QuantisedSpec(kind="quantised", bits=payload.bits, low=payload.low, step=payload.step),
            compression.pack(payload))


def _header_for(
    message: Message, incarnation: str, lineage: tuple[str, ...], *, measure: bool = False
) -> tuple[AnyHeader, np.ndarray | bytes | None, float | None]:
    """The validated header and body of ``message``; with ``measure``, an uncompressed
    update's finiteness check is its norm (one pass, :func:`vector_norm`), returned third."""
    header: AnyHeader
    if isinstance(message, ClientUpdate):
        spec = _tensor_spec(message.delta, "ClientUpdate.delta")
        norm = None
        if measure and message.compression is None:
            norm = _finite_norm(message.delta, "ClientUpdate.delta")
        else:
            _check_finite(message.delta, "ClientUpdate.delta")
        packed, body = _compressed(message)
        header = UpdateHeader(
            kind="update",
            incarnation=incarnation,
            client_id=message.client_id,
            round=message.round,
            base_version=message.base_version,
            batch_size=float(message.batch_size),
            sent_at=float(message.sent_at),
            window=message.window,
            tensor=spec,
            compression=packed,
        )
        return header, body, norm
    if isinstance(message, GlobalModel):
        header = GlobalHeader(
            kind="global",
            incarnation=incarnation,
            lineage=lineage[-MAX_LINEAGE:],
            version=message.version,
            sent_at=float(message.sent_at),
            window=message.window,
            invited=None if message.invited is None else bytes(message.invited).hex(),
            step_size=float(message.step_size),
            tensor=_tensor_spec(message.params, "GlobalModel.params"),
        )
        _check_finite(message.params, "GlobalModel.params")
        return header, message.params, None
    if isinstance(message, ClientStatus):
        header = StatusHeader(
            kind="status",
            incarnation=incarnation,
            client_id=message.client_id,
            state=message.state,
            rounds=message.rounds,
            epsilon=float(message.epsilon),
            delta=float(message.delta),
            detail=message.detail,
            sent_at=float(message.sent_at),
            extra={key: float(value) for key, value in message.extra.items()},
            unacknowledged=message.unacknowledged,
        )
        return header, None, None
    if isinstance(message, WindowClose):
        header = CloseHeader(kind="close", incarnation=incarnation, window=message.window,
                             version=message.version, sent_at=float(message.sent_at),
                             watermarks=tuple(message.watermarks), refused=tuple(message.refused))
        return header, None, None
    if isinstance(message, Partial):
        header = PartialHeader(
            kind="partial",
            incarnation=incarnation,
            aggregator_id=message.aggregator_id,
            window=message.window,
            bases=tuple(message.bases),
            entries=tuple((e.client_id, e.round, e.base_version, e.window, float(e.weight))
                          for e in message.entries),
            settled=tuple(message.settled),
            rejections=dict(message.rejections),
            sent_at=float(message.sent_at),
            tensor=_tensor_spec(message.sums, "Partial.sums"),
            waiting=message.waiting,
        )
        _check_partial(header, int(message.sums.size), None)
        _check_finite(message.sums, "Partial.sums")
        return header, message.sums, None
    if isinstance(message, RunFinished):
        header = FinishedHeader(
            kind="finished",
            incarnation=incarnation,
            lineage=lineage[-MAX_LINEAGE:],
            version=message.version,
            reason=message.reason,
            sent_at=float(message.sent_at),
        )
        return header, None, None
    raise CodecError(f"cannot encode {type(message).__name__}: not a fedsim message")


def encode(message: Message, *, incarnation: str = "", lineage: tuple[str, ...] = ()) -> bytes:
    """Encode a message, stamped with the sender's run ``incarnation`` (a global model also
    with its ``lineage``); raises :class:`CodecError` if it would not pass :func:`decode`."""
    return _seal(message, incarnation, tuple(lineage), measure=False).to_bytes()


def seal(message: Message, *, incarnation: str = "", lineage: tuple[str, ...] = ()) -> Sealed:
    """``message`` checked exactly as :func:`encode` checks it, without writing its bytes:
    the in-process network's form of a message (:mod:`fedsim.transports.simulated`).

    The tensor travels as the message's own array, made read-only here (a copy only when it
    is not contiguous): the sender gives it up at publish, as it gives up the bytes of an
    encoded frame. An uncompressed update's norm is computed here, once, and is its
    finiteness check. :meth:`Sealed.open` applies the receiver's limits."""
    return _seal(message, incarnation, tuple(lineage), measure=True)


def _seal(message: Message, incarnation: str, lineage: tuple[str, ...], *,
          measure: bool) -> Sealed:
    try:
        header, tensor, norm = _header_for(message, incarnation, lineage, measure=measure)
    except ValidationError as exc:
        raise CodecError(f"cannot encode {type(message).__name__}: {_describe(exc)}") from None
    # An uncompressed update's header is what it was before compression existed, a close
    # without watermarks or refused groups what it was before them, a status that is not a
    # final one what it was before final statuses, a partial with no deferred updates what it
    # was before their count (sizes and older servers unchanged).
    exclude: set[str] | None = None
    if isinstance(header, UpdateHeader) and header.compression is None:
        exclude = {"compression"}
    elif isinstance(header, StatusHeader) and header.unacknowledged is None:
        exclude = {"unacknowledged"}
    elif isinstance(header, CloseHeader):
        exclude = {name for name in ("watermarks", "refused") if not getattr(header, name)}
    elif isinstance(header, PartialHeader) and not header.waiting:
        exclude = {"waiting"}
    header_json = header.model_dump_json(exclude=exclude or None).encode()
    size = PREFIX_BYTES + len(header_json)
    if isinstance(tensor, np.ndarray):
        size += _FLOAT32.itemsize * tensor.size
        if measure:
            tensor = _given_up(tensor)
    elif tensor is not None:
        size += len(tensor)
    return Sealed(header, header_json, tensor, norm, size)


def _given_up(tensor: np.ndarray) -> np.ndarray:
    """The array a sealed message carries, whose values nobody can change through numpy: the
    sender's own array made read-only when it owns its memory (the sender gives it up at
    publish, as it gives up an encoded frame's bytes; fedsim's senders never make a sent
    array writeable again), else a read-only copy - a view of another buffer or a torch
    tensor's memory could still be written through that buffer or tensor - unless it is
    already a read-only view of an immutable frame. Receivers get views of it
    (:meth:`Sealed.open`), which numpy refuses to make writeable."""
    if tensor.base is not None and not _immutable(tensor):
        tensor = np.array(tensor, order="C")
    elif not tensor.flags.c_contiguous:
        tensor = np.ascontiguousarray(tensor)
    tensor.flags.writeable = False
    return tensor


def read_only_root(array: np.ndarray) -> object | None:
    """What ``array``'s memory belongs to - the last array of its chain of views (one that
    owns its memory) or the non-array object under it (``bytes``, a torch tensor) - if every
    array along the chain is read-only; None if one of them is writeable."""
    root: object = array
    while isinstance(root, np.ndarray):
        if root.flags.writeable:
            return None
        if root.base is None:
            return root
        root = root.base
    return root


def _immutable(array: np.ndarray) -> bool:
    """Read-only all the way down a chain of views to an immutable ``bytes`` object."""
    return isinstance(read_only_root(array), bytes)


@dataclass(frozen=True, eq=False, slots=True)
class Sealed:
    """A message checked as :func:`encode` checks it, carried without its bytes: its
    validated header (and that header's JSON), its body (the tensor, or a compressed
    update's packed payload) and an uncompressed update's norm. ``len()`` is the size of its
    frame, :meth:`to_bytes` the frame itself (``encode``'s bytes), :meth:`open` what
    :func:`decode` of those bytes returns or raises."""

    header: AnyHeader
    header_json: bytes
    body: np.ndarray | bytes | None
    norm: float | None
    nbytes: int

    def __len__(self) -> int:
        return self.nbytes

    def to_bytes(self) -> bytes:
        """The encoded frame (:func:`encode`)."""
        prefix = _PREFIX.pack(MAGIC, PROTOCOL_VERSION, len(self.header_json))
        tensor = self.body
        if tensor is None:
            return prefix + self.header_json
        if isinstance(tensor, bytes):
            return b"".join((prefix, self.header_json, tensor))
        # ``astype(..., copy=False)`` is free on little-endian hosts and byte-swaps elsewhere;
        # the join copies the values once, straight from the array's buffer.
        values = np.ascontiguousarray(tensor.astype(_FLOAT32, copy=False))
        return b"".join((prefix, self.header_json, memoryview(values).cast("B")))  # type: ignore[arg-type]  # ndarray is a buffer

    def open(self, *, expected_params: int | None = None,
             max_bytes: int = DEFAULT_MAX_BYTES) -> Message:
        """The message a receiver with these limits decodes from :meth:`to_bytes` (the same
        fields, the same norm, the same :class:`CodecError`), from the checked parts: the
        rules that no encoded frame can break (magic, version, schema, payload length,
        finiteness) were settled when it was sealed."""
        _check_size(self.nbytes, max_bytes)
        _check_header_length(len(self.header_json), self.header_json)
        body = self.body.view() if isinstance(self.body, np.ndarray) else self.body
        return _frame(self.header, body, 0, expected_params, self.norm).message


def _describe(exc: ValidationError) -> str:
    parts = []
    for error in exc.errors(include_url=False):
        location = ".".join(str(part) for part in error["loc"]) or "header"
        parts.append(f"{location}: {error['msg']}")
    return "; ".join(parts)


@dataclass(frozen=True, eq=False)
class Frame:
    """A decoded message with the run incarnation it was stamped with (and, for a global
    model, the earlier incarnations its server continues)."""

    message: Message
    incarnation: str
    lineage: tuple[str, ...] = ()
    packing: str | None = None
    """How an update's tensor travelled: ``"sparse"``, ``"quantised"`` (its header's
    ``compression``) or None (the dense float32 vector; every other message)."""


def decode(
    data: bytes | bytearray | memoryview,
    *,
    expected_params: int | None = None,
    max_bytes: int = DEFAULT_MAX_BYTES,
) -> Message:
    """Decode and validate one message; every defect raises :class:`CodecError`.

    ``expected_params`` is the model's parameter count: an update or global model of another
    length is rejected. Returned vectors are read-only float32 views of ``data`` (no copy):
    copy one before changing it. :func:`decode_frame` also returns the incarnation.
    """
    return decode_frame(data, expected_params=expected_params, max_bytes=max_bytes).message


WireFormCheck = Callable[[str | None, int | None, int], str | None]
"""Why an update's wire form - its packing (None: dense), its sparse count (None: not sparse)
and its dense length - is not one its receiver takes, or None
(:func:`~fedsim.protocol.compression.wire_form_problem` of the sender's group)."""


def decode_frame(
    data: bytes | bytearray | memoryview,
    *,
    expected_params: int | None = None,
    max_bytes: int = DEFAULT_MAX_BYTES,
    wire_form: WireFormCheck | None = None,
) -> Frame:
    """:func:`decode`, keeping the header's ``incarnation`` and ``lineage``. ``wire_form``:
    an update whose header it finds fault with is refused (kind
    :data:`~fedsim.protocol.compression.WIRE_FORM`) before its payload is expanded or read."""
    size = len(data)
    _check_size(size, max_bytes)  # before anything is copied or read
    if not isinstance(data, bytes):
        data = bytes(data)
    if size < PREFIX_BYTES:
        raise CodecError(
            f"truncated message: {size} bytes, the fixed prefix alone is {PREFIX_BYTES}"
        )
    magic, version, header_len = _PREFIX.unpack_from(data)
    if magic != MAGIC:
        raise CodecError(f"bad magic {magic!r}: not a fedsim message")
    if version != PROTOCOL_VERSION:
        raise CodecError(
            f"unsupported protocol version {version} (this build speaks {PROTOCOL_VERSION})"
        )
    _check_header_length(header_len, data[PREFIX_BYTES:PREFIX_BYTES + len(_PARTIAL_PREFIX)])
    body_start = PREFIX_BYTES + header_len
    if body_start > size:
        raise CodecError(
            f"truncated message: header says {header_len} bytes, only {size - PREFIX_BYTES} follow"
        )
    try:
        header = HEADERS.validate_json(data[PREFIX_BYTES:body_start])
    except ValidationError as exc:
        raise CodecError(f"invalid header: {_describe(exc)}") from None
    return _frame(header, data, body_start, expected_params, None, wire_form)


def _check_size(size: int, max_bytes: int) -> None:
    if size > max_bytes:
        raise CodecError(
            f"message of {size} bytes exceeds the limit of {max_bytes} bytes", kind="oversized"
        )


def _check_header_length(header_len: int, head: bytes) -> None:
    """A header is at most :data:`MAX_HEADER_BYTES`, a partial's (``head``: its first bytes)
    at most :data:`MAX_PARTIAL_HEADER_BYTES`."""
    if header_len > MAX_HEADER_BYTES and not (
            header_len <= MAX_PARTIAL_HEADER_BYTES
            and head[:len(_PARTIAL_PREFIX)] == _PARTIAL_PREFIX):
        raise CodecError(
            f"header of {header_len} bytes exceeds {MAX_HEADER_BYTES} bytes", kind="oversized"
        )


def _frame(  # noqa: C901, PLR0911, PLR0912 - one check per rule of the wire format, in its order
    header: AnyHeader,
    body: bytes | np.ndarray | None,
    offset: int,
    expected_params: int | None,
    norm: float | None,
    wire_form: WireFormCheck | None = None,
) -> Frame:
    """The message of a valid ``header`` and its body, checked against the receiver's
    ``expected_params`` and ``wire_form`` (:func:`decode_frame`): :func:`decode_frame` passes
    the frame's bytes with the body at ``offset``; :meth:`Sealed.open` passes the sealed body
    (a tensor that :func:`seal` found finite, of the length its header declares, with an
    update's ``norm``; or a compressed update's payload)."""
    if body is None:
        body_bytes = 0
    elif isinstance(body, np.ndarray):
        body_bytes = body.nbytes
    else:
        body_bytes = len(body) - offset
    if isinstance(header, StatusHeader):
        if body_bytes:
            raise CodecError(f"status message carries {body_bytes} unexpected trailing bytes")
        status = ClientStatus(
            client_id=header.client_id,
            state=header.state,
            rounds=header.rounds,
            epsilon=header.epsilon,
            delta=header.delta,
            detail=header.detail,
            sent_at=header.sent_at,
            extra=dict(header.extra),
            unacknowledged=header.unacknowledged,
        )
        return Frame(status, header.incarnation)
    if isinstance(header, FinishedHeader):
        if body_bytes:
            raise CodecError(f"finished message carries {body_bytes} unexpected trailing bytes")
        finished = RunFinished(version=header.version, reason=header.reason,
                               sent_at=header.sent_at)
        return Frame(finished, header.incarnation, header.lineage)
    if isinstance(header, CloseHeader):
        if body_bytes:
            raise CodecError(f"close message carries {body_bytes} unexpected trailing bytes")
        return Frame(WindowClose(header.window, header.version, header.sent_at,
                                 tuple(header.watermarks), tuple(header.refused)),
                     header.incarnation)

    (length,) = header.tensor.shape
    if isinstance(header, PartialHeader):
        _check_partial(header, length, expected_params)
    elif expected_params is not None and length != expected_params:
        raise CodecError(
            f"{header.kind} tensor has {length} values, the model has {expected_params} parameters",
            kind="shape",
        )
    assert body is not None  # a header with a tensor comes with a body
    packed = header.compression if isinstance(header, UpdateHeader) else None
    if wire_form is not None and isinstance(header, UpdateHeader):
        # From the header alone: a sparse frame of 240 bytes stands for the whole vector.
        problem = wire_form(None if packed is None else packed.kind,
                            packed.count if isinstance(packed, SparseSpec) else None, length)
        if problem is not None:
            raise CodecError(problem, kind=compression.WIRE_FORM)
    sealed = isinstance(body, np.ndarray)
    if isinstance(body, np.ndarray):  # (not ``sealed``: the type checker narrows on this)
        values = body
    elif packed is not None:
        values = _decompressed(packed, body[offset:], length)
    else:
        if body_bytes != length * _FLOAT32.itemsize:
            raise CodecError(
                f"tensor payload is {body_bytes} bytes, header declares {length} float32 values "
                f"({length * _FLOAT32.itemsize} bytes)"
            )
        # Zero-copy: a read-only view of the payload (messages are immutable; the actors copy
        # what they keep). Converted only on a big-endian host, where it must be byte-swapped.
        values = np.frombuffer(body, dtype=_FLOAT32, offset=offset)
        if values.dtype != np.float32:
            values = values.astype(np.float32)
    if isinstance(header, UpdateHeader):
        if norm is None:
            # One pass: the norm the server checks is finite exactly when every value is.
            norm = _finite_norm(values, "update tensor")
        update = ClientUpdate(
            client_id=header.client_id,
            round=header.round,
            base_version=header.base_version,
            delta=values,
            batch_size=header.batch_size,
            sent_at=header.sent_at,
            window=header.window,
            norm=norm,
        )
        return Frame(update, header.incarnation, packing=None if packed is None else packed.kind)
    if not sealed:
        _check_finite(values, "global tensor" if isinstance(header, GlobalHeader)
                      else "partial tensor")
    if isinstance(header, PartialHeader):
        partial = Partial(
            aggregator_id=header.aggregator_id, window=header.window, bases=header.bases,
            entries=tuple(ManifestEntry(*entry) for entry in header.entries), sums=values,
            settled=header.settled, rejections=dict(header.rejections),
            sent_at=header.sent_at, waiting=header.waiting)
        return Frame(partial, header.incarnation)
    invited = None if header.invited is None else bytes.fromhex(header.invited)
    model = GlobalModel(version=header.version, params=values, sent_at=header.sent_at,
                        window=header.window, invited=invited, step_size=header.step_size)
    return Frame(model, header.incarnation, header.lineage)


def _decompressed(packed: SparseSpec | QuantisedSpec, body: bytes, length: int) -> np.ndarray:
    """The dense vector of a compressed update's payload (its checks:
    :mod:`fedsim.protocol.compression`); read-only like an uncompressed one."""
    if isinstance(packed, SparseSpec):
        values = compression.unpack_sparse(body, packed.count, length)
    else:
        values = compression.unpack_quantised(body, packed.bits, packed.low, packed.step, length)
    values.flags.writeable = False
    return values


def _check_partial(header: PartialHeader, length: int, expected_params: int | None) -> None:
    """A partial's manifest is consistent: base versions strictly ascending, every entry's
    base version among them and every base version with an entry, no ``(client, round)``
    twice, and one sum of the model's length per base version."""
    bases = header.bases
    if any(a >= b for a, b in zip(bases, bases[1:], strict=False)):
        raise CodecError("partial base versions must be strictly ascending")
    used = {entry[2] for entry in header.entries}
    if used != set(bases):
        raise CodecError("partial base versions do not match its entries' base versions")
    keys = {(entry[0], entry[1]) for entry in header.entries}
    if len(keys) != len(header.entries):
        raise CodecError("partial names a (client, round) twice")
    groups = len(bases)
    if groups == 0:
        if length:
            raise CodecError(f"an empty partial carries {length} values")
        return
    if length % groups or (expected_params is not None and length != groups * expected_params):
        model = "" if expected_params is None else f" of {expected_params} parameters"
        raise CodecError(f"partial tensor has {length} values, not {groups} sums{model}",
                         kind="shape")


__all__ = [
    "CLIENT_ID_PATTERN",
    "DEFAULT_MAX_BYTES",
    "MAGIC",
    "MAX_COUNTER",
    "Frame",
    "MAX_HEADER_BYTES",
    "PREFIX_BYTES",
    "Sealed",
    "check_client_id",
    "decode",
    "decode_frame",
    "encode",
    "max_message_bytes",
    "max_partial_bytes",
    "partial_groups",
    "seal",
]
