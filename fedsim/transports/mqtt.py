"""The Endpoint protocol over MQTT (aiomqtt 2.x, MQTT 3.1.1, QoS 1): the server's and the
clients' endpoints. Connection supervision is in :mod:`fedsim.transports.mqtt_endpoint`, the
settings in :mod:`fedsim.transports.mqtt_settings`; only these modules import aiomqtt.

Topics (:class:`~fedsim.transports.topics.Topics`) under ``fedsim/<run>/``: ``global``
(retained: a joining or reconnecting client gets the latest model at once), ``updates/<client>``,
``status/<client>``, and ``acks/<client>`` for the server's receipts.

Delivery is at-least-once end to end, not only to the broker: a client keeps every update in an
outbox until the *server* acknowledges it on ``acks/<client>``; it resends the outbox after every
reconnect and whatever stays unacknowledged for ``resend_after`` seconds, then at doubling
intervals (:data:`RESEND_BACKOFF_MAX`); a broker restart loses what it held, and a PUBACK
alone proves nothing about the server. The server endpoint does not
acknowledge on receipt: its owner calls :meth:`MqttServerEndpoint.acknowledge` with the
``(client_id, round)`` pairs it has durably recorded (the deployment's server does so right
after each checkpoint), so an update that dies with a crashed server is resent to its successor.
The server actor de-duplicates by ``(client_id, round)``, so resends are harmless. The server keeps a persistent
session (fixed client identifier, ``clean_session=False``) so the broker queues updates while it
reconnects, and re-publishes its latest global model after every reconnect (a restarted broker
without persistence has forgotten the retained one).

Connections are supervised: a lost connection is retried with capped exponential backoff and
jitter, subscriptions are renewed, and the endpoint's actor sees no error meanwhile (publishes
wait in the outbox, ``receive`` waits). Refused credentials are final: :class:`AccessDenied`.
Failure to connect at all within ``ReconnectPolicy.connect_timeout`` is a
:class:`TransportError` naming host, port and topic.

The server endpoint delivers a client's update or status only if the client id inside the
payload is the one in its topic (the broker's ACL ensures the topic is the sender's own); a
mismatch is logged as access denied and dropped, as are undecodable payloads.

Every message carries its sender's run incarnation (:mod:`fedsim.transports.incarnation`):
each server start draws a fresh one; messages of another incarnation (a retained model or a
queued update of an earlier run of the same name) are ignored, logged and counted on both
sides; a client learns the incarnation from the live server's welcome or receipts.

**Aggregation nodes** (:class:`MqttAggregatorEndpoint`; docs/DEPLOYMENT.md, "Aggregation
nodes"). With aggregators the server endpoint reads ``partials/+`` instead of ``updates/+``: an
aggregator's partials, and the updates it forwards unmixed (delivered only if their client is
routed to that aggregator, :func:`~fedsim.transports.topics.aggregator_of`); it publishes each
window's close on ``close`` at QoS 0, not retained (no broker queues a stale close for an
aggregator that is away). Receipts mean what they mean without aggregators: the ``(client,
round)`` a partial names (folded or settled) wait for :meth:`MqttServerEndpoint.acknowledge`
like direct updates, so an update is acknowledged only once the server has durably recorded it
(a partial refused or late, or one lost with a crashed server, leaves its updates
unacknowledged: their clients resend them, and the aggregator forwards a resend unmixed). Only
the delivery moves: the server sends each batch of receipts as a few messages on
``receipts/<aggregator>`` (:data:`RECEIPT_BATCH_BYTES` each) to the aggregator its clients are
routed to, which passes each client's on to ``acks/<aggregator>/<client>`` (the client
subscribes there too: :class:`MqttClientEndpoint`'s ``aggregator``), stamped with the server's
incarnation and lineage: the server publishes a few messages per batch instead of one per
client. Welcomes (receipts naming no round) still go straight from the server.

The end of the run (:class:`~fedsim.protocol.messages.RunFinished`) travels like a global
model: on the global topic (the broker lets only the server publish there), retained (it
replaces the last model, so a client that reconnects later learns it), stamped with the
incarnation and lineage (an earlier run's retained "finished" is another incarnation's, ignored).
The server sends the receipts already due before it.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import Callable, Collection, Container, Coroutine, Iterable, Sequence
from dataclasses import dataclass
from typing import Annotated, Any

import aiomqtt
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from fedsim.config import limits
from fedsim.errors import AccessDenied, CodecError, ConfigError, LedgerError, TransportError
from fedsim.logging import get_logger
from fedsim.protocol import codec
from fedsim.protocol.codec import MAX_LINEAGE, Incarnation
from fedsim.protocol.messages import (
    ClientStatus,
    ClientUpdate,
    GlobalModel,
    Message,
    Partial,
    RunFinished,
    WindowClose,
)
from fedsim.transports.incarnation import ClientIncarnation, ServerIncarnation
from fedsim.transports.mqtt_endpoint import QOS, _MqttEndpoint
from fedsim.transports.mqtt_settings import (
    DEFAULT_PORT,
    DEFAULT_TLS_PORT,
    BrokerSettings,
    MqttStats,
    ReconnectPolicy,
    TlsSettings,
    parse_broker_url,
)
from fedsim.transports.topics import aggregator_of

_log = get_logger("fedsim.transports.mqtt")
HELLO_EVERY = 0.5  # seconds between a client's requests for the run's incarnation
GLOBAL_QOS = 0
"""The global model (and the end of the run) is published at QoS 0, retained. A connected
client gets it over TCP; a client that (re)connects gets the retained one when it subscribes
(clients use clean sessions). At QoS 0 the broker queues nothing for a session that is away
(``queue_qos0_messages false``), so a client that leaves a persistent session subscribed to
``global`` cannot make the broker hold a copy of every model for it (issue 25, finding 10:
broker RSS 22.5 -> 517 MB in 40 s at QoS 1)."""


RECEIPT_BATCH_BYTES = 32 * 1024
"""The server's receipts to one aggregator go in messages of about this many bytes (far below
any broker packet limit fedsim sets, :func:`~fedsim.transports.security.packet_limit`)."""
MAX_UNRECORDED_PER_CLIENT = 4 * limits.MAX_UNACKNOWLEDGED
"""Rounds of one client the server endpoint remembers as received and not yet recorded (1024:
four times a client's outbox, :data:`~fedsim.config.limits.MAX_UNACKNOWLEDGED`): see
``MqttServerEndpoint._await_receipt``."""


def _receipt(rounds: Collection[int], incarnation: str | None, lineage: Sequence[str],
             known: int | None = None) -> bytes:
    """One client's receipt (``rounds``: what the server recorded; none: a welcome), with the
    rounds the server knows the client released (``known``; None: it keeps no count)."""
    receipt: dict[str, Any] = {"rounds": sorted(rounds), "incarnation": incarnation,
                               "lineage": list(lineage)}
    if known is not None:
        receipt["known"] = known
    return json.dumps(receipt).encode()


def _receipt_batches(receipts: dict[str, set[int]], incarnation: str | None,
                     lineage: Sequence[str]) -> list[bytes]:
    """The server's receipts for one aggregator's clients, as messages of at most about
    :data:`RECEIPT_BATCH_BYTES` (:class:`_Receipts`)."""
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


class _Ack(BaseModel):
    """A receipt (``rounds`` the server recorded) or, with no rounds, a welcome; both carry
    the server's incarnation and lineage (:mod:`fedsim.transports.incarnation`)."""

    model_config = ConfigDict(extra="forbid", strict=True)
    rounds: list[Annotated[int, Field(ge=0, le=codec.MAX_COUNTER)]] = Field(max_length=100_000)
    incarnation: Incarnation = ""
    lineage: list[Incarnation] = Field(default_factory=list, max_length=MAX_LINEAGE)
    known: int | None = Field(default=None, ge=0, le=codec.MAX_COUNTER + 1)
    """The rounds the server knows this client released (:class:`MqttServerEndpoint`'s
    ``known_rounds``): a client whose own count is lower has lost its ledger."""


class _Receipts(BaseModel):
    """The server's receipts for some of one aggregator's clients: ``receipts`` maps a client
    to the rounds recorded, each passed on as that client's :class:`_Ack`."""

    model_config = ConfigDict(extra="forbid", strict=True)
    receipts: dict[str, list[Annotated[int, Field(ge=0, le=codec.MAX_COUNTER)]]] = Field(
        max_length=100_000)
    incarnation: Incarnation
    lineage: list[Incarnation] = Field(default_factory=list, max_length=MAX_LINEAGE)


class MqttServerEndpoint(_MqttEndpoint):
    """The server's endpoint: receives every client's updates/statuses, publishes global models.

    Use as ``async with MqttServerEndpoint(broker, run=...) as endpoint``. Received updates are
    acknowledged to their clients only through :meth:`acknowledge`, once the owner has recorded
    them durably; until then their clients keep them and resend them.
    """

    def __init__(
        self,
        broker: BrokerSettings | str,
        *,
        run: str,
        expected_params: int | None = None,
        max_message_bytes: int = codec.DEFAULT_MAX_BYTES,
        reconnect: ReconnectPolicy = ReconnectPolicy(),
        max_concurrent_outgoing_calls: int = 20,
        keepalive: int = 30,
        seed: int | None = None,
        ack_interval: float = 0.2,
        lineage: Sequence[str] = (),
        aggregators: Sequence[str] = (),
        clients: Collection[str] | None = None,
        known_rounds: Callable[[str], int] | None = None,
    ) -> None:
        super().__init__(
            broker,
            run=run,
            identifier=f"fedsim-{run}-server",
            clean_session=False,
            expected_params=expected_params,
            max_message_bytes=max_message_bytes,
            reconnect=reconnect,
            max_concurrent_outgoing_calls=max_concurrent_outgoing_calls,
            keepalive=keepalive,
            seed=seed,
            role="server",
        )
        self._latest_global: bytes | None = None
        self.incarnation = ServerIncarnation.start(lineage)
        """This start's incarnation and the earlier ones it continues (from the checkpoint)."""
        self._welcome: set[str] = set()
        # Rounds delivered to the inbox but not yet durably recorded by the owner, per client.
        self._unrecorded: dict[str, set[int]] = {}
        self._pending_acks: dict[str, set[int]] = {}
        self._acks_due = asyncio.Event()
        self._ack_interval = ack_interval
        self.aggregators = tuple(sorted(aggregators))
        """The aggregation nodes' ids (empty: updates come straight from the clients)."""
        self._routes: dict[str, str] = {}  # client -> its aggregator (aggregator_of), as met
        self.clients = None if clients is None else frozenset(clients)
        """The run's client ids (None: any id the broker lets through). A message from, or a
        partial naming, any other id is refused (``unknown_client``): the tables above then
        hold the run's clients at most, whatever a compromised aggregator or a client let in
        by an open broker invents."""
        self._known_rounds = known_rounds
        """How many rounds the server knows a client released (its book's
        :meth:`~fedsim.runtime.actors.client_book.ClientBook.known_rounds`), told in that
        client's welcomes and receipts so that a client started on a lost ledger stops before
        it releases anything (:class:`MqttClientEndpoint`; None: not told)."""

    @property
    def unacknowledged(self) -> int:
        """How many received updates wait for :meth:`acknowledge`."""
        return sum(len(rounds) for rounds in self._unrecorded.values())

    def acknowledge(self, recorded: Container[tuple[str, int]]) -> int:
        """Acknowledge every received update whose ``(client_id, round)`` is in ``recorded``.

        Call it once those updates are durably recorded (applied and checkpointed, or judged
        duplicate or stale in a checkpointed de-duplication table): a receipt tells the client
        it may forget the update, so one sent earlier could be lost with a crashed server. The
        receipts go out batched (``ack_interval``); updates not in ``recorded`` stay unacknowledged
        and their clients resend them. Returns how many were acknowledged.
        """
        acknowledged = 0
        for client_id in list(self._unrecorded):
            rounds = self._unrecorded[client_id]
            done = {round_ for round_ in rounds if (client_id, round_) in recorded}
            if not done:
                continue
            rounds -= done
            if not rounds:
                del self._unrecorded[client_id]
            self._pending_acks.setdefault(client_id, set()).update(done)
            acknowledged += len(done)
        if acknowledged:
            self._acks_due.set()
        return acknowledged

    async def close(self) -> None:
        """Send the receipts already due (bounded wait), then disconnect; idempotent."""
        if self._pending_acks and self.connected and not self._closing:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._send_acks(), self._policy.connect_timeout)
        await super().close()

    async def publish(self, message: Message) -> None:
        """Publish a global model or the end of the run, retained; kept and re-published after
        a reconnect. The receipts already due leave before the end of the run. A window's close
        goes to the aggregators (QoS 0, not retained)."""
        self._check_open()
        if isinstance(message, WindowClose):
            payload = codec.encode(message, incarnation=self.incarnation.current)
            if await self._send(self.topics.close, payload, qos=GLOBAL_QOS):
                self.stats.published += 1
            return
        if not isinstance(message, GlobalModel | RunFinished):
            raise TransportError(
                f"the server endpoint publishes GlobalModel, RunFinished or WindowClose only, "
                f"not {type(message).__name__}"
            )
        if isinstance(message, RunFinished) and self._pending_acks:
            await self._send_acks()
        payload = codec.encode(
            message, incarnation=self.incarnation.current, lineage=self.incarnation.lineage
        )
        self._latest_global = payload
        if await self._send(self.topics.global_model, payload, qos=GLOBAL_QOS, retain=True):
            self.stats.published += 1

    async def _on_connected(self, client: aiomqtt.Client) -> None:
        if self.aggregators:
            await client.subscribe(self.topics.all_partials, qos=QOS)
        else:
            await client.subscribe(self.topics.all_updates, qos=QOS)
        await client.subscribe(self.topics.all_status, qos=QOS)
        await client.subscribe(self.topics.all_hello, qos=0)
        if self._latest_global is not None:
            await client.publish(
                self.topics.global_model, self._latest_global, qos=GLOBAL_QOS, retain=True
            )

    def _background_loops(self) -> dict[str, Callable[[], Coroutine[Any, Any, None]]]:
        return {"mqtt-server-acks": self._ack_loop}

    def _on_message(self, topic: str, payload: object) -> None:
        sender = self.topics.sender_of(topic)
        if sender is None:
            self._reject(topic, "not a client topic of this run")
            return
        kind, topic_client = sender
        if kind == "partials":
            self._from_aggregator(topic, topic_client, payload)
            return
        if self.clients is not None and topic_client not in self.clients:
            self._unknown(topic, topic_client)
            return
        if kind == "hello":  # "tell me the incarnation": answered with a welcome receipt
            self._welcome.add(topic_client)
            self._acks_due.set()
            return
        if kind == "updates" and self.aggregators:
            self._reject(topic, "an update straight from a client: they go to aggregators",
                         kind="wrong_topic")
            return
        self._from_client(topic, kind, topic_client, payload)

    def _first_unknown(self, client_ids: Iterable[str]) -> str | None:
        """The first of ``client_ids`` outside the run (None: all in it, or no list)."""
        if self.clients is None:
            return None
        return next((c for c in client_ids if c not in self.clients), None)

    def _unknown(self, topic: str, client_id: str) -> None:
        self.stats.denied += 1
        self.stats.refused("unknown_client")
        self._log.warning("access denied: not a client of this run", topic=topic,
                          client=client_id)

    def _from_client(self, topic: str, kind: str, topic_client: str, payload: object) -> None:
        frame = self._decode(topic, payload)
        if frame is None:
            return
        message = frame.message
        expected = ClientUpdate if kind == "updates" else ClientStatus
        if not isinstance(message, expected):
            self._reject(topic, f"{type(message).__name__} on a {kind} topic", kind="wrong_topic")
            return
        if message.client_id != topic_client:
            self.stats.denied += 1
            self.stats.refused("forged_client_id")
            self._log.warning(
                "access denied: forged client id",
                topic=topic,
                payload_client_id=message.client_id,
                error=str(
                    AccessDenied(f"{topic_client!r} sent a message as {message.client_id!r}")
                ),
            )
            return
        if not self.incarnation.accepts(frame.incarnation, status=kind == "status"):
            self._other_incarnation(topic, frame.incarnation, self.incarnation.current)
            return
        if frame.incarnation != self.incarnation.current:
            self._welcome.add(topic_client)  # tell it the incarnation it should follow
            self._acks_due.set()
        self.stats.received += 1
        self._inbox.put(message)
        if isinstance(message, ClientUpdate):
            self._await_receipt(topic_client, message.round)

    def _known(self, client_id: str) -> int | None:
        """What a welcome or receipt tells ``client_id`` of its rounds the server knows: its
        book's count, or past it the rounds received and not yet judged (a window's, waiting
        for its end: a client that lost its ledger within a window of its last release is
        stopped too). None: not told (no ``known_rounds``)."""
        if self._known_rounds is None:
            return None
        waiting = self._unrecorded.get(client_id)
        return max(self._known_rounds(client_id), max(waiting) + 1 if waiting else 0)

    def _await_receipt(self, client_id: str, round_index: int) -> None:
        """Note ``(client_id, round_index)`` as received and waiting to be recorded.

        A round the client book judges (applied, duplicate, stale, refused) is acknowledged
        and leaves the table; one it cannot judge yet, ``round_ahead`` (more than the book's
        window beyond the client's lowest open round), stays. An honest client keeps at most
        ``limits.MAX_UNACKNOWLEDGED`` (256) updates unacknowledged, all within the window; a client
        forging distinct far rounds would grow its table for the process's life. So past
        :data:`MAX_UNRECORDED_PER_CLIENT` a client's *highest* quarter is forgotten (counted,
        logged): the forged rounds are the high ones, and a forgotten round that was honest
        only misses its receipt (its client resends it, and the resend is noted again). One
        sort per quarter: a flood costs O(log n) a round."""
        rounds = self._unrecorded.setdefault(client_id, set())
        rounds.add(round_index)
        if len(rounds) > MAX_UNRECORDED_PER_CLIENT:
            kept = sorted(rounds)[:MAX_UNRECORDED_PER_CLIENT * 3 // 4]
            forgotten = len(rounds) - len(kept)
            self._unrecorded[client_id] = set(kept)
            self.stats.receipts_forgotten += forgotten
            self._log.warning("a client's table of unrecorded rounds is full: its highest are "
                              "forgotten", client=client_id, forgotten=forgotten,
                              highest_kept=kept[-1])

    def _from_aggregator(self, topic: str, aggregator: str, payload: object) -> None:
        """A partial of ``aggregator`` (its own id inside), or an update it forwards (of a
        client routed to it); the ``(client, round)`` they name wait for a receipt."""
        if aggregator not in self.aggregators:
            self._reject(topic, "not an aggregator of this run", kind="wrong_topic")
            return
        frame = self._decode(topic, payload)
        if frame is None:
            return
        message = frame.message
        if isinstance(message, Partial):
            sender = message.aggregator_id
            named = [(e.client_id, e.round) for e in message.entries] + list(message.settled)
            # Every client it names must be routed to it: otherwise one aggregator could settle
            # (and so have acknowledged and forgotten) the updates of another's clients.
            if any(aggregator_of(client_id, self.aggregators) != aggregator
                   for client_id, _ in named):
                sender = "another aggregator's clients"
        elif isinstance(message, ClientUpdate):
            sender = aggregator_of(message.client_id, self.aggregators)
            named = [(message.client_id, message.round)]
        else:
            self._reject(topic, f"{type(message).__name__} on a partials topic", kind="wrong_topic")
            return
        unknown = self._first_unknown(name for name, _ in named)
        if unknown is not None and sender == aggregator:
            self._unknown(topic, unknown)
            return
        if sender != aggregator:
            self.stats.denied += 1
            self.stats.refused("forged_aggregator")
            self._log.warning("access denied: not this aggregator's", topic=topic,
                              kind=type(message).__name__, claimed=sender)
            return
        if not self.incarnation.accepts(frame.incarnation, status=False):
            self._other_incarnation(topic, frame.incarnation, self.incarnation.current)
            return
        self.stats.received += 1
        self._inbox.put(message)
        for client_id, round_index in named:
            self._await_receipt(client_id, round_index)

    async def _ack_loop(self) -> None:
        """Send receipts, batched: at most one small QoS 0 message per client per ``ack_interval``.

        Batching keeps receipts cheap for the broker under load; a late receipt costs nothing
        (clients resend only after ``resend_after``, seconds rather than milliseconds).
        """
        while True:
            await self._acks_due.wait()
            await asyncio.sleep(self._ack_interval)
            await self._send_acks()

    async def _send_acks(self) -> None:
        self._acks_due.clear()
        pending, self._pending_acks = self._pending_acks, {}
        for client_id in self._welcome:
            pending.setdefault(client_id, set())
        self._welcome = set()
        current, lineage = self.incarnation.current, self.incarnation.lineage
        by_aggregator: dict[str, dict[str, set[int]]] = {}
        for client_id, rounds in pending.items():
            if rounds and self.aggregators:  # passed on by the client's aggregator
                route = self._routes.get(client_id)
                if route is None:
                    route = self._routes[client_id] = aggregator_of(client_id, self.aggregators)
                by_aggregator.setdefault(route, {})[client_id] = rounds
                continue
            if await self._send(self.topics.acks(client_id),
                                _receipt(rounds, current, lineage, self._known(client_id)),
                                qos=0):
                self.stats.acks_sent += 1
            # An ack lost here only causes a resend, which the server de-duplicates.
        for aggregator, receipts in sorted(by_aggregator.items()):
            for payload in _receipt_batches(receipts, current, lineage):
                if await self._send(self.topics.receipts(aggregator), payload, qos=0):
                    self.stats.acks_sent += 1


RESEND_BACKOFF_MAX = 8
"""An unacknowledged update is resent after ``resend_after`` seconds, then after twice that
since its last sending, and so on up to ``RESEND_BACKOFF_MAX`` times ``resend_after``: under an
overload receipts come late, and resending every outstanding update at a fixed period would
add load exactly when the server has none to spare (a redelivery storm). A reconnect resends
every one at once, as before."""


@dataclass
class _Pending:
    payload: bytes
    sent_at: float
    base_version: int
    resends: int = 0

    def due(self, now: float, after: float) -> bool:
        """Whether it waited long enough to be resent (:data:`RESEND_BACKOFF_MAX`)."""
        return self.sent_at <= now - after * min(2 ** self.resends, RESEND_BACKOFF_MAX)


class MqttClientEndpoint(_MqttEndpoint):
    """One client's endpoint: publishes its updates/statuses, receives global models.

    Updates stay in an outbox (at most ``max_unacknowledged``, oldest abandoned first) until the
    server acknowledges them; see the module docstring. ``flush`` waits for the outbox to empty.
    ``max_staleness`` (the scenario's server setting): an update is not resent once its base
    version is more than that behind the newest global model delivered (``stats.expired``).
    ``aggregator``: the aggregator its updates are routed to, which passes the server's receipts
    on (``acks/<aggregator>/<client>``; None: no aggregators).

    ``recorded_rounds``: the rounds this client's ledger records (its first round). A welcome or
    receipt of the server that says it knows more rounds of this client than the client has
    recorded or sent since is a ledger lost (a fresh or old state directory): the endpoint
    confirms nothing, delivers no model (so the client trains and releases nothing) and sets
    :attr:`refusal` (:meth:`refused`). None: no such check.
    """

    def __init__(
        self,
        broker: BrokerSettings | str,
        *,
        run: str,
        client_id: str,
        expected_params: int | None = None,
        max_message_bytes: int = codec.DEFAULT_MAX_BYTES,
        reconnect: ReconnectPolicy = ReconnectPolicy(),
        resend_after: float = 10.0,
        max_unacknowledged: int = limits.MAX_UNACKNOWLEDGED,
        max_staleness: int | None = None,
        max_concurrent_outgoing_calls: int = 20,
        keepalive: int = 30,
        seed: int | None = None,
        aggregator: str | None = None,
        recorded_rounds: int | None = None,
    ) -> None:
        try:
            codec.check_client_id(client_id)
        except CodecError as exc:
            raise ConfigError(str(exc)) from None
        if isinstance(max_unacknowledged, bool) or \
                not 1 <= max_unacknowledged <= limits.MAX_UNACKNOWLEDGED:
            # The server's round gap and receipt table are sized from this bound: a longer
            # outbox would have honest resends refused as round_ahead, their receipts forgotten.
            raise ConfigError(f"max_unacknowledged must be between 1 and "
                              f"{limits.MAX_UNACKNOWLEDGED}, got {max_unacknowledged}")
        super().__init__(
            broker,
            run=run,
            identifier=f"fedsim-{run}-client-{client_id}",
            clean_session=True,
            expected_params=expected_params,
            max_message_bytes=max_message_bytes,
            reconnect=reconnect,
            max_concurrent_outgoing_calls=max_concurrent_outgoing_calls,
            keepalive=keepalive,
            seed=seed,
            role=f"client {client_id}",
        )
        self.client_id = client_id
        self._ack_topics = {self.topics.acks(client_id)}
        if aggregator is not None:
            self._ack_topics.add(self.topics.relayed_acks(aggregator, client_id))
        self._resend_after = resend_after
        self._max_unacked = max_unacknowledged
        self._max_staleness = max_staleness
        self._newest_version = -1  # of the global models delivered
        self._outbox: dict[int, _Pending] = {}
        self._outbox_empty = asyncio.Event()
        self._outbox_empty.set()
        self._latest_status: bytes | None = None
        self._status_sent = True
        self.incarnation = ClientIncarnation()
        """The run incarnation this client follows (None until the live server confirms it)."""
        self._own_rounds = recorded_rounds  # recorded, or sent since (see the docstring)
        self._aggregated = aggregator is not None
        self.refusal: LedgerError | None = None
        """Why this client must not go on (the server knows rounds its ledger lost), or None."""
        self._refused = asyncio.Event()

    @property
    def unacknowledged(self) -> tuple[int, ...]:
        """Rounds of the updates the server has not yet acknowledged."""
        return tuple(self._outbox)

    async def publish(self, message: Message) -> None:
        """Send an update (kept until acknowledged) or a status (the latest is kept until sent).

        Returns once the broker has the message, or at once if the connection is down (it is
        sent after the reconnect).
        """
        self._check_open()
        loop = asyncio.get_running_loop()
        stamp = self.incarnation.current or ""
        if isinstance(message, ClientUpdate):
            if self._own_rounds is not None:
                self._own_rounds = max(self._own_rounds, message.round + 1)
            payload = codec.encode(message, incarnation=stamp)
            self._outbox.pop(message.round, None)
            self._outbox[message.round] = _Pending(payload, loop.time(), message.base_version)
            self._outbox_empty.clear()
            while len(self._outbox) > self._max_unacked:
                abandoned = next(iter(self._outbox))
                del self._outbox[abandoned]
                self.stats.abandoned += 1
                self._log.warning("outbox full: abandoning unacknowledged update", round=abandoned)
            if await self._send(self.topics.updates(self.client_id), payload):
                self.stats.published += 1
        elif isinstance(message, ClientStatus):
            payload = codec.encode(message, incarnation=stamp)
            self._latest_status = payload
            self._status_sent = await self._send(self.topics.status(self.client_id), payload)
            if self._status_sent:
                self.stats.published += 1
        else:
            raise TransportError(
                f"client endpoint {self.client_id!r} publishes ClientUpdate or ClientStatus only, "
                f"not {type(message).__name__}"
            )

    async def refused(self) -> LedgerError:
        """Wait until the server shows that this client's ledger lost rounds
        (:attr:`refusal`)."""
        await self._refused.wait()
        assert self.refusal is not None
        return self.refusal

    async def flush(self, timeout: float) -> bool:
        """Wait until every update is acknowledged; False if some are not within ``timeout``."""
        try:
            await asyncio.wait_for(self._outbox_empty.wait(), timeout)
        except TimeoutError:
            return False
        return True

    async def _on_connected(self, client: aiomqtt.Client) -> None:
        for topic in sorted(self._ack_topics):
            await client.subscribe(topic, qos=QOS)
        await client.subscribe(self.topics.global_model, qos=GLOBAL_QOS)
        self._spawn(self._resend_all, f"mqtt-client-{self.client_id}-resend")

    def _background_loops(self) -> dict[str, Callable[[], Coroutine[Any, Any, None]]]:
        return {
            f"mqtt-client-{self.client_id}-resend-timer": self._resend_timer,
            f"mqtt-client-{self.client_id}-hello": self._hello_loop,
        }

    async def _hello_loop(self) -> None:
        """Ask the server for the run's incarnation until it answers (see incarnation.py)."""
        while self.incarnation.current is None:
            await self._connected.wait()
            await self._send(self.topics.hello(self.client_id), b"", qos=0)
            await asyncio.sleep(HELLO_EVERY)

    async def _resend_all(self) -> None:
        await self._connected.wait()
        await self._resend(older_than=None)
        if not self._status_sent and self._latest_status is not None:
            self._status_sent = await self._send(
                self.topics.status(self.client_id), self._latest_status
            )

    async def _resend(self, *, older_than: float | None) -> None:
        loop = asyncio.get_running_loop()
        for round_, pending in list(self._outbox.items()):
            if older_than is not None and not pending.due(loop.time(), older_than):
                continue
            if self._outbox.get(round_) is not pending:
                continue  # acknowledged meanwhile
            if self._expired(round_, pending):
                continue
            pending.sent_at = loop.time()
            pending.resends += 1
            if await self._send(self.topics.updates(self.client_id), pending.payload):
                self.stats.resent += 1

    def _expired(self, round_: int, pending: _Pending) -> bool:
        """Forget an unacknowledged update the server can only refuse as stale: its base version
        is more than ``max_staleness`` behind the newest model this client has seen (the
        server's is newer still). Its privacy was spent; the server counts it as dropped in
        flight. Resending it would only take the place of a fresh one in an overload."""
        if self._max_staleness is None or \
                self._newest_version - pending.base_version <= self._max_staleness:
            return False
        del self._outbox[round_]
        self.stats.expired += 1
        if not self._outbox:
            self._outbox_empty.set()
        return True

    async def _resend_timer(self) -> None:
        while True:
            await asyncio.sleep(self._resend_after / 2)
            if self._connected.is_set():
                await self._resend(older_than=self._resend_after)

    def _on_message(self, topic: str, payload: object) -> None:
        if topic in self._ack_topics:
            self._on_ack(topic, payload)
            return
        if topic != self.topics.global_model:
            self._reject(topic, "unexpected topic")
            return
        frame = self._decode(topic, payload)
        if frame is None:
            return
        if not isinstance(frame.message, GlobalModel | RunFinished):
            self._reject(
                topic, f"{type(frame.message).__name__} on the global topic", kind="wrong_topic"
            )
            return
        current = self.incarnation.current
        admitted = self.incarnation.admit_global(frame)
        if admitted is not None:
            self._deliver(admitted.message)
        elif current is not None:
            self._other_incarnation(topic, frame.incarnation, current)

    def _deliver(self, message: Message) -> None:
        if self.refusal is not None:
            return  # a client on a lost ledger trains on nothing (recorded_rounds)
        self.stats.received += 1
        if isinstance(message, GlobalModel):
            self._newest_version = max(self._newest_version, message.version)
        self._inbox.put(message)

    def _on_ack(self, topic: str, payload: object) -> None:
        try:
            ack = _Ack.model_validate_json(payload)  # type: ignore[arg-type]
        except (ValidationError, TypeError) as exc:
            self._reject(topic, f"malformed acknowledgement: {exc}")
            return
        before = self.incarnation.current
        if topic != self.topics.acks(self.client_id) and ack.incarnation != before:
            # A relayed receipt (acks/<aggregator>/<client>) only acknowledges: an aggregator
            # must not move the client to another incarnation (the server's would be ignored).
            self._other_incarnation(topic, ack.incarnation, before)
            return
        if not self.incarnation.confirm(ack.incarnation, ack.lineage):
            self._other_incarnation(topic, ack.incarnation, before)
            return
        if self._ledger_lost(topic, ack):
            return  # and no model is delivered (_deliver)
        if self.incarnation.current != before:
            self._release_held_back(ack.incarnation)
        for round_ in ack.rounds:
            if self._outbox.pop(round_, None) is not None:
                self.stats.acked += 1
        if not self._outbox:
            self._outbox_empty.set()

    def _release_held_back(self, incarnation: str) -> None:
        self._log.info("run incarnation confirmed", incarnation=incarnation)
        released, ignored = self.incarnation.release_held_back()
        for other in ignored:  # e.g. the retained model of an earlier run of this name
            self._other_incarnation(self.topics.global_model, other.incarnation, incarnation)
        if released is not None:
            self._deliver(released.message)

    def _ledger_lost(self, topic: str, ack: _Ack) -> bool:
        """Whether this client is refused (the class docstring's ``recorded_rounds``): now, by
        this message of the server, or before."""
        if self.refusal is None and topic == self.topics.acks(self.client_id) \
                and ack.known is not None and self._own_rounds is not None \
                and ack.known > self._own_rounds:
            self._refuse(ack.known)
        return self.refusal is not None

    def _refuse(self, known: int) -> None:
        self.refusal = LedgerError(
            f"client {self.client_id}: the server has received {known} rounds from it, its "
            f"ledger records {self._own_rounds}: this is not the state directory the client "
            f"ran with (a fresh or older copy), and its spending would start over from what "
            f"that ledger records, so it stops. Restore the client's own state directory "
            f"(its ledger) and start it again; if the ledger was damaged, `fedsim ledger "
            f"repair` it (its substitutes count as rounds)"
            + (". If the directory is the client's own and intact, the server's record of it "
               "is wrong: a compromised aggregator can name rounds its clients never sent "
               "(docs/SECURITY.md)" if self._aggregated else ""))
        self._log.error("the server knows rounds this client's ledger does not: stopping",
                        client=self.client_id, server_knows=known, recorded=self._own_rounds)
        self._refused.set()


MAX_HELD_UPDATES = 100_000
"""Updates an aggregator keeps while it does not yet know the run's incarnation (a restart's
queued backlog); beyond it the oldest are dropped (their clients resend them)."""


class MqttAggregatorEndpoint(_MqttEndpoint):
    """One aggregation node's endpoint: receives the updates of the clients routed to it
    (:func:`~fedsim.transports.topics.aggregator_of`), the global models and the window
    closes; publishes partials and forwarded updates on ``partials/<aggregator id>``; passes
    the server's receipts for its clients (``receipts/<aggregator id>``) on to each client's
    ``acks/<aggregator id>/<client>`` (module docstring), only those of the live incarnation and of its own
    clients.

    A persistent session (fixed client identifier, ``clean_session=False``): while the
    aggregator is away (a restart), the broker queues its clients' updates (QoS 1), not the
    closes (QoS 0). The run's incarnation is learnt from the live server's window closes (or a
    global model continuing the one followed); until then global models and updates are held
    back, updates of another incarnation are ignored.
    """

    def __init__(
        self,
        broker: BrokerSettings | str,
        *,
        run: str,
        aggregator_id: str,
        aggregators: Sequence[str],
        client_ids: Sequence[str],
        expected_params: int | None = None,
        max_message_bytes: int = codec.DEFAULT_MAX_BYTES,
        reconnect: ReconnectPolicy = ReconnectPolicy(),
        max_concurrent_outgoing_calls: int = 20,
        keepalive: int = 30,
        seed: int | None = None,
    ) -> None:
        if aggregator_id not in aggregators:
            raise ConfigError(f"{aggregator_id!r} is not one of the aggregators {list(aggregators)}")
        super().__init__(
            broker,
            run=run,
            identifier=f"fedsim-{run}-{aggregator_id}",
            clean_session=False,
            expected_params=expected_params,
            max_message_bytes=max_message_bytes,
            reconnect=reconnect,
            max_concurrent_outgoing_calls=max_concurrent_outgoing_calls,
            keepalive=keepalive,
            seed=seed,
            role=aggregator_id,
        )
        self.aggregator_id = aggregator_id
        self.client_ids = frozenset(c for c in client_ids if aggregator_of(c, aggregators) == aggregator_id)
        """The clients whose updates this aggregator reads."""
        self.incarnation = ClientIncarnation()
        self._lineage: frozenset[str] = frozenset()
        self._held: list[tuple[str, ClientUpdate]] = []
        self._receipts: list[_Receipts] = []  # the server's, not yet passed on
        self._receipts_due = asyncio.Event()

    async def publish(self, message: Message) -> None:
        """Send a partial or a forwarded update to the server (QoS 1)."""
        self._check_open()
        if not isinstance(message, Partial | ClientUpdate):
            raise TransportError(f"aggregator endpoint {self.aggregator_id!r} publishes Partial or "
                                 f"ClientUpdate only, not {type(message).__name__}")
        payload = codec.encode(message, incarnation=self.incarnation.current or "")
        if await self._send(self.topics.partials(self.aggregator_id), payload):
            self.stats.published += 1

    async def _on_connected(self, client: aiomqtt.Client) -> None:
        topics = sorted(self.topics.updates(c) for c in self.client_ids)
        for start in range(0, len(topics), 1000):  # a few SUBSCRIBE packets, not thousands
            await client.subscribe([(t, QOS) for t in topics[start:start + 1000]])
        await client.subscribe(self.topics.global_model, qos=GLOBAL_QOS)
        await client.subscribe(self.topics.close, qos=GLOBAL_QOS)
        await client.subscribe(self.topics.receipts(self.aggregator_id), qos=0)

    def _background_loops(self) -> dict[str, Callable[[], Coroutine[Any, Any, None]]]:
        return {f"mqtt-{self.aggregator_id}-receipts": self._receipt_loop}

    def _on_message(self, topic: str, payload: object) -> None:
        if topic in (self.topics.close, self.topics.global_model):
            self._from_server(topic, payload)
            return
        if topic == self.topics.receipts(self.aggregator_id):
            self._take_receipts(topic, payload)
            return
        self._from_client(topic, payload)

    def _from_client(self, topic: str, payload: object) -> None:
        sender = self.topics.sender_of(topic)
        if sender is None or sender[0] != "updates" or sender[1] not in self.client_ids:
            self._reject(topic, "not the update topic of a client of this aggregator")
            return
        frame = self._decode(topic, payload)
        if frame is None:
            return
        message = frame.message
        if not isinstance(message, ClientUpdate):
            self._reject(topic, f"{type(message).__name__} on an updates topic", kind="wrong_topic")
            return
        if message.client_id != sender[1]:
            self.stats.denied += 1
            self.stats.refused("forged_client_id")
            self._log.warning("access denied: forged client id", topic=topic,
                              payload_client_id=message.client_id)
            return
        if self.incarnation.current is None:
            self._held.append((frame.incarnation, message))
            if len(self._held) > MAX_HELD_UPDATES:
                del self._held[0]
                self.stats.abandoned += 1
            return
        self._deliver_update(topic, frame.incarnation, message)

    def _deliver_update(self, topic: str, incarnation: str, update: ClientUpdate) -> None:
        if incarnation != self.incarnation.current and incarnation not in self._lineage:
            self._other_incarnation(topic, incarnation, self.incarnation.current)
            return
        self.stats.received += 1
        self._inbox.put(update)

    def _from_server(self, topic: str, payload: object) -> None:
        frame = self._decode(topic, payload)
        if frame is None:
            return
        message = frame.message
        before = self.incarnation.current
        if isinstance(message, WindowClose):
            # Closes are live (QoS 0, never retained or queued): the running server's.
            self.incarnation.current = frame.incarnation
            if before is None:
                released, _ = self.incarnation.release_held_back()
                if released is not None:
                    self._lineage = frozenset(released.lineage)
                    self._deliver(released.message)
            self._deliver(message)
        elif isinstance(message, GlobalModel | RunFinished):
            admitted = self.incarnation.admit_global(frame)
            if admitted is None:
                if before is not None:
                    self._other_incarnation(topic, frame.incarnation, before)
                return
            self._lineage = frozenset(frame.lineage)
            self._deliver(message)
        else:
            self._reject(topic, f"{type(message).__name__} from the server", kind="wrong_topic")
            return
        if before is None and self.incarnation.current is not None:
            held, self._held = self._held, []
            for incarnation, update in held:
                self._deliver_update(self.topics.updates(update.client_id), incarnation, update)

    def _deliver(self, message: Message) -> None:
        self.stats.received += 1
        self._inbox.put(message)

    def _take_receipts(self, topic: str, payload: object) -> None:
        """The server's receipts (the broker lets only the server write them): kept to pass on
        if they are the live incarnation's (a receipt from an earlier server would make a
        client forget an update its successor never recorded)."""
        try:
            receipts = _Receipts.model_validate_json(payload)  # type: ignore[arg-type]
        except (ValidationError, TypeError) as exc:
            self._reject(topic, f"malformed receipts: {exc}")
            return
        current = self.incarnation.current
        if receipts.incarnation != current:
            self._other_incarnation(topic, receipts.incarnation, current)
            return
        foreign = [c for c in receipts.receipts if c not in self.client_ids]
        if foreign:
            self._reject(topic, f"receipts for clients not routed here: {foreign[:3]}",
                         kind="wrong_topic")
            return
        self._receipts.append(receipts)
        self._receipts_due.set()

    async def close(self) -> None:
        """Pass on the receipts already here (bounded wait; those the server sent before the
        end of the run), then disconnect; idempotent."""
        if self._receipts and self.connected and not self._closing:
            self._receipts_due.set()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._pass_receipts(), self._policy.connect_timeout)
        await super().close()

    async def _receipt_loop(self) -> None:
        """Pass the server's receipts on, one message per client (QoS 0, as the server would:
        a lost one costs a resend, which the server de-duplicates)."""
        while True:
            await self._receipts_due.wait()
            await self._pass_receipts()

    async def _pass_receipts(self) -> None:
        self._receipts_due.clear()
        batches, self._receipts = self._receipts, []
        for batch in batches:
            for client_id, rounds in batch.receipts.items():
                payload = _receipt(rounds, batch.incarnation, batch.lineage)
                if await self._send(self.topics.relayed_acks(self.aggregator_id, client_id),
                                    payload, qos=0):
                    self.stats.acks_sent += 1


__all__ = [
    "DEFAULT_PORT",
    "DEFAULT_TLS_PORT",
    "BrokerSettings",
    "MqttAggregatorEndpoint",
    "MqttClientEndpoint",
    "MqttServerEndpoint",
    "MqttStats",
    "ReconnectPolicy",
    "TlsSettings",
    "parse_broker_url",
]
