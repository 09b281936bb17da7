"""The MQTT topic layout of one run, shared by the MQTT transport and the ACL generator.

``fedsim/<run>/global`` carries the latest global model (retained); ``updates/<client>`` and
``status/<client>`` carry one client's messages to the server; ``acks/<client>`` carries the
server's receipts for that client's updates (so the client can resend what was never received);
``hello/<client>`` carries a client's request to be told the run's incarnation (answered on
``acks/<client>``, :mod:`fedsim.transports.incarnation`).

With aggregation nodes (:mod:`fedsim.runtime.actors.aggregator`): ``close`` carries the server's
window closes to the aggregators, ``partials/<aggregator>`` one aggregator's partials and the
updates it forwards unmixed, ``receipts/<aggregator>`` the server's receipts for that
aggregator's clients, which the aggregator passes on to each client's
``acks/<aggregator>/<client>`` (under its own prefix: the broker's ACL grants it one line, not
one per client, which it would scan for every message). Each client's updates go to one fixed aggregator,
:func:`aggregator_of` (aggregator ``k`` subscribes to ``updates/<client>`` of exactly its clients,
and the broker's ACL lets it read no others).
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass

from fedsim.errors import CodecError, ConfigError
from fedsim.protocol.codec import check_client_id

PREFIX = "fedsim"


def aggregator_ids(count: int) -> tuple[str, ...]:
    """The ids of a deployment's ``count`` aggregators (they name MQTT topics and ACL users)."""
    return tuple(f"aggregator-{i}" for i in range(count))


def aggregator_of(client_id: str, aggregators: Sequence[str]) -> str:
    """The one aggregator that ``client_id``'s updates are routed to: its id's BLAKE2b hash over
    the sorted aggregator ids (the simulated network and the deployed ACL and subscriptions
    alike; docs/DEPLOYMENT.md, "Aggregation nodes", says why the route is fixed). Not CRC-32:
    it is linear, and ids that differ in their last bits (``c-000`` ... ``c-003``) all landed
    on one of two aggregators."""
    ids = sorted(aggregators)
    digest = hashlib.blake2b(client_id.encode(), digest_size=8).digest()
    return ids[int.from_bytes(digest, "big") % len(ids)]


@dataclass(frozen=True)
class Topics:
    """Topic names under ``fedsim/<run>/``; ``run`` follows the client id rules (no ``/``)."""

    run: str

    def __post_init__(self) -> None:
        try:
            check_client_id(self.run)
        except CodecError:
            raise ConfigError(
                f"run name {self.run!r} must be 1-64 letters, digits, '.', '_' or '-' "
                "(it names MQTT topics)"
            ) from None

    @property
    def root(self) -> str:
        return f"{PREFIX}/{self.run}"

    @property
    def global_model(self) -> str:
        return f"{self.root}/global"

    def updates(self, client_id: str) -> str:
        return f"{self.root}/updates/{client_id}"

    def status(self, client_id: str) -> str:
        return f"{self.root}/status/{client_id}"

    def acks(self, client_id: str) -> str:
        return f"{self.root}/acks/{client_id}"

    def relayed_acks(self, aggregator_id: str, client_id: str) -> str:
        """Where ``aggregator_id`` passes on the server's receipts for ``client_id``."""
        return f"{self.root}/acks/{aggregator_id}/{client_id}"

    def hello(self, client_id: str) -> str:
        return f"{self.root}/hello/{client_id}"

    @property
    def close(self) -> str:
        return f"{self.root}/close"

    def partials(self, aggregator_id: str) -> str:
        return f"{self.root}/partials/{aggregator_id}"

    def receipts(self, aggregator_id: str) -> str:
        return f"{self.root}/receipts/{aggregator_id}"

    @property
    def all_partials(self) -> str:
        return f"{self.root}/partials/+"

    @property
    def all_hello(self) -> str:
        return f"{self.root}/hello/+"

    @property
    def all_updates(self) -> str:
        return f"{self.root}/updates/+"

    @property
    def all_status(self) -> str:
        return f"{self.root}/status/+"

    def sender_of(self, topic: str) -> tuple[str, str] | None:
        """``("updates" | "status" | "hello" | "partials", sender id)`` for a client's (or an
        aggregator's) topic of this run, else None."""
        parts = topic.split("/")
        if len(parts) != 4 or parts[0] != PREFIX or parts[1] != self.run:
            return None
        if parts[2] not in ("updates", "status", "hello", "partials"):
            return None
        return parts[2], parts[3]
