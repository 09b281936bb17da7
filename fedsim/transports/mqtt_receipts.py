"""The server's receipts over MQTT: what a receipt (or a welcome) says, as sent to a client
on ``acks/<client>`` and, batched, to an aggregator on ``receipts/<aggregator>``
(:mod:`fedsim.transports.mqtt`'s docstring: delivery is at-least-once end to end, and a
receipt is what ends a client's resending). Both are parsed with strict pydantic models:
they come from the network.
"""

from __future__ import annotations

import json
from collections.abc import Collection, Sequence
from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field

from fedsim.protocol import codec
from fedsim.protocol.headers import MAX_LINEAGE, Incarnation

RECEIPT_BATCH_BYTES = 32 * 1024
"""The server's receipts to one aggregator go in messages of about this many bytes (far below
any broker packet limit fedsim sets, :func:`~fedsim.transports.security.packet_limit`)."""


def receipt_payload(rounds: Collection[int], incarnation: str | None, lineage: Sequence[str],
             known: int | None = None) -> bytes:
    """One client's receipt (``rounds``: what the server recorded; none: a welcome), with the
    rounds the server knows the client released (``known``; None: it keeps no count)."""
    receipt: dict[str, Any] = {"rounds": sorted(rounds), "incarnation": incarnation,
                               "lineage": list(lineage)}
    if known is not None:
        receipt["known"] = known
    return json.dumps(receipt).encode()


def receipt_batches(receipts: dict[str, set[int]], incarnation: str | None,
                     lineage: Sequence[str]) -> list[bytes]:
    """The server's receipts for one aggregator's clients, as messages of at most about
    :data:`RECEIPT_BATCH_BYTES` (:class:`Receipts`)."""
    head = json.dumps({"incarnation": incarnation, "lineage": list(lineage)})[:-1]
    batches: list[bytes] = []
    parts: list[str] = []
    size = 0
    for client_id, rounds in sorted(receipts.items()):
        part = f"{json.dumps(client_id)}:{json.dumps(sorted(rounds))}"
        if parts and size + len(part) > RECEIPT_BATCH_BYTES:
            batches.append(f'{head},"receipts":{{{",".join(parts)}}}}}'.encode())
            parts, size = [], 0
        parts.append(part)
        size += len(part) + 1
    if parts:
        batches.append(f'{head},"receipts":{{{",".join(parts)}}}}}'.encode())
    return batches


class Ack(BaseModel):
    """A receipt (``rounds`` the server recorded) or, with no rounds, a welcome; both carry
    the server's incarnation and lineage (:mod:`fedsim.transports.incarnation`)."""

    model_config = ConfigDict(extra="forbid", strict=True)
    rounds: list[Annotated[int, Field(ge=0, le=codec.MAX_COUNTER)]] = Field(max_length=100_000)
    incarnation: Incarnation = ""
    lineage: list[Incarnation] = Field(default_factory=list, max_length=MAX_LINEAGE)
    known: int | None = Field(default=None, ge=0, le=codec.MAX_COUNTER + 1)
    """The rounds the server knows this client released (:class:`~fedsim.transports.mqtt_server.MqttServerEndpoint`'s
    ``known_rounds``): a client whose own count is lower has lost its ledger."""


class Receipts(BaseModel):
    """The server's receipts for some of one aggregator's clients: ``receipts`` maps a client
    to the rounds recorded, each passed on as that client's :class:`Ack`."""

    model_config = ConfigDict(extra="forbid", strict=True)
    receipts: dict[str, list[Annotated[int, Field(ge=0, le=codec.MAX_COUNTER)]]] = Field(
        max_length=100_000)
    incarnation: Incarnation
    lineage: list[Incarnation] = Field(default_factory=list, max_length=MAX_LINEAGE)
