"""What a wire message's header may say (:mod:`fedsim.protocol.codec` frames it): one strict
pydantic model per message kind (``kind`` discriminates; unknown keys are errors), with the
bounds every peer's header is held to - counters in ``[0, 2**53)``, bounded strings and maps,
a finite positive step size, client ids fit for MQTT topics - and the client-id check.
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    StringConstraints,
    TypeAdapter,
    ValidationError,
)

from fedsim.config import limits
from fedsim.errors import CodecError

MAX_INVITED_HEX = limits.MAX_INVITED_CLIENTS // 4
"""An invitation bitmap's hex digits (four clients a digit): 32 KiB."""

CLIENT_ID_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$"
"""Client ids appear in MQTT topics and ACLs, so they exclude ``/``, ``+``, ``#`` and spaces."""

ClientId = Annotated[str, StringConstraints(pattern=CLIENT_ID_PATTERN)]
MAX_COUNTER = 2**53 - 1
"""The largest round or version on the wire (exact in float64 and in every JSON reader)."""
MAX_LINEAGE = 64
"""At most this many earlier incarnations travel with a global model."""
MAX_STEP_SIZE = 1e6
"""The largest server step size a global model may carry (finite and > 0 as well): a larger
one would move a client's model by more than :data:`~fedsim.runtime.actors.integrity.MAX_PARAMETER`
per unit of update."""
MAX_PARTIAL_ENTRIES = 16384
"""At most this many updates folded (and as many settled) in one aggregator's partial."""
MAX_PARTIAL_GROUPS = 64
"""At most this many base versions (one sum each) in one partial."""
MAX_WEIGHT = 1e15
"""The largest mixing weight a manifest entry may carry (data set sizes, configured weights)."""
MAX_CLOSE_WATERMARKS = 512
"""At most this many clients' watermarks in one window close (the rest wait for the next; a
header stays within the codec's 64 KiB)."""
MAX_CLOSE_REFUSED = 256
"""At most this many refused groups named in one window close (as many aggregators, a few
groups each)."""
_NonNegativeInt = Annotated[int, Field(ge=0)]
_Counter = Annotated[int, Field(ge=0, le=MAX_COUNTER)]
Incarnation = Annotated[str, StringConstraints(pattern=r"^[0-9a-f]{0,32}$")]
_FiniteFloat = Annotated[float, Field(allow_inf_nan=False)]
# Epsilon may legitimately be +inf (e.g. sigma = 0); NaN fails the ``ge`` bound.
_Epsilon = Annotated[float, Field(ge=0.0)]


class _Header(BaseModel):
    model_config = ConfigDict(
        extra="forbid", strict=True, frozen=True, ser_json_inf_nan="constants"
    )


class TensorSpec(_Header):
    dtype: Literal["<f4"]
    shape: tuple[_NonNegativeInt]


class SparseSpec(_Header):
    kind: Literal["sparse"]
    count: _NonNegativeInt


class QuantisedSpec(_Header):
    kind: Literal["quantised"]
    bits: Literal[4, 8]
    low: _FiniteFloat
    step: Annotated[float, Field(ge=0.0, allow_inf_nan=False)]


class UpdateHeader(_Header):
    kind: Literal["update"]
    incarnation: Incarnation = ""
    client_id: ClientId
    round: _Counter
    base_version: _Counter
    batch_size: Annotated[float, Field(gt=0.0, allow_inf_nan=False)]
    sent_at: _FiniteFloat
    window: _Counter = 0
    tensor: TensorSpec
    compression: Annotated[SparseSpec | QuantisedSpec, Field(discriminator="kind")] | None = None


class GlobalHeader(_Header):
    kind: Literal["global"]
    incarnation: Incarnation = ""
    lineage: tuple[Incarnation, ...] = Field(default=(), max_length=MAX_LINEAGE)
    version: _Counter
    sent_at: _FiniteFloat
    window: _Counter = 0
    invited: Annotated[str, StringConstraints(pattern=r"^(?:[0-9a-f]{2})*$",
                                              max_length=MAX_INVITED_HEX)] | None = None
    step_size: Annotated[float, Field(gt=0.0, le=MAX_STEP_SIZE, allow_inf_nan=False)] = 1.0
    tensor: TensorSpec


class FinishedHeader(_Header):
    kind: Literal["finished"]
    incarnation: Incarnation = ""
    lineage: tuple[Incarnation, ...] = Field(default=(), max_length=MAX_LINEAGE)
    version: _Counter
    reason: Annotated[str, StringConstraints(max_length=4096)]
    sent_at: _FiniteFloat


class CloseHeader(_Header):
    kind: Literal["close"]
    incarnation: Incarnation = ""
    window: _Counter
    version: _Counter
    sent_at: _FiniteFloat
    watermarks: tuple[tuple[ClientId, _Counter], ...] = Field(default=(),
                                                             max_length=MAX_CLOSE_WATERMARKS)
    refused: tuple[tuple[ClientId, _Counter, _Counter], ...] = Field(
        default=(), max_length=MAX_CLOSE_REFUSED)


_Weight = Annotated[float, Field(ge=0.0, le=MAX_WEIGHT, allow_inf_nan=False)]
_Entry = tuple[ClientId, _Counter, _Counter, _Counter, _Weight]


class PartialHeader(_Header):
    kind: Literal["partial"]
    incarnation: Incarnation = ""
    aggregator_id: ClientId
    window: _Counter
    bases: tuple[_Counter, ...] = Field(max_length=MAX_PARTIAL_GROUPS)
    entries: tuple[_Entry, ...] = Field(max_length=MAX_PARTIAL_ENTRIES)
    settled: tuple[tuple[ClientId, _Counter], ...] = Field(max_length=MAX_PARTIAL_ENTRIES)
    rejections: Annotated[
        dict[Annotated[str, StringConstraints(pattern=r"^[a-z_]{1,32}$")], _Counter],
        Field(max_length=64),
    ]
    sent_at: _FiniteFloat
    tensor: TensorSpec
    # Updates its pacer holds deferred (written only when some are: a partial without them
    # is the frame it was before the count existed).
    waiting: _Counter = 0


class StatusHeader(_Header):
    kind: Literal["status"]
    incarnation: Incarnation = ""
    client_id: ClientId
    state: Literal["training", "waiting", "budget_exhausted", "offline", "done", "crashed"]
    rounds: _Counter
    epsilon: _Epsilon
    delta: Annotated[float, Field(ge=0.0, le=1.0)]
    detail: Annotated[str, StringConstraints(max_length=4096)]
    sent_at: _FiniteFloat
    extra: Annotated[
        dict[Annotated[str, StringConstraints(max_length=128)], _FiniteFloat],
        Field(max_length=256),
    ]
    # (a client's outbox never holds more: the count of a final status, ClientStatus)
    unacknowledged: Annotated[int, Field(ge=0, le=limits.MAX_UNACKNOWLEDGED)] | None = None


_CLIENT_ID = TypeAdapter(ClientId)
AnyHeader = UpdateHeader | GlobalHeader | StatusHeader | FinishedHeader | CloseHeader \
    | PartialHeader
HEADERS: TypeAdapter[AnyHeader] = TypeAdapter(
    Annotated[AnyHeader, Field(discriminator="kind")]
)


def check_client_id(client_id: str) -> str:
    """Return ``client_id`` if it can name MQTT topics and ACL entries, else raise CodecError."""
    try:
        return _CLIENT_ID.validate_python(client_id)
    except ValidationError:
        raise CodecError(
            f"client id {client_id!r} must match {CLIENT_ID_PATTERN} (it names MQTT topics)"
        ) from None
