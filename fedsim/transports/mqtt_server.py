"""The server's MQTT endpoint: reads the clients' updates and statuses (or, behind
aggregation nodes, their partials), publishes the global model retained, and acknowledges
what its owner has durably recorded (:mod:`fedsim.transports.mqtt`).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import (
    Callable,
    Collection,
    Container,
    Coroutine,
    Iterable,
    Mapping,
    Sequence,
)
from typing import Any

import aiomqtt

from fedsim.config import limits
from fedsim.config.compression import Compression
from fedsim.errors import AccessDenied, TransportError
from fedsim.protocol import codec
from fedsim.protocol.messages import (
    ClientStatus,
    ClientUpdate,
    GlobalModel,
    Message,
    Partial,
    RunFinished,
    WindowClose,
)
from fedsim.transports.incarnation import ServerIncarnation
from fedsim.transports.mqtt_endpoint import GLOBAL_QOS, QOS, _MqttEndpoint
from fedsim.transports.mqtt_receipts import receipt_batches, receipt_payload
from fedsim.transports.mqtt_settings import (
    BrokerSettings,
    ReconnectPolicy,
)
from fedsim.transports.topics import aggregator_of

BEFORE_START = "before_start"
"""The refusal kind of an update that arrives before the run's first window (while the server
waits for its clients' "connected" statuses): computed on a model no server of this run
published, there is nothing to apply it to (:meth:`MqttServerEndpoint.refuse_before_start`)."""

MAX_UNRECORDED_PER_CLIENT = 4 * limits.MAX_UNACKNOWLEDGED
"""Rounds of one client the server endpoint remembers as received and not yet recorded (1024:
four times a client's outbox, :data:`~fedsim.config.limits.MAX_UNACKNOWLEDGED`): see
``MqttServerEndpoint._await_receipt``."""


class MqttServerEndpoint(_MqttEndpoint):
    """The server's endpoint: receives every client's updates/statuses, publishes global models.

    Use as ``async with MqttServerEndpoint(broker, run=...) as endpoint``. Received updates are
    acknowledged to their clients only through :meth:`acknowledge`, once the owner has recorded
    them durably; until then their clients keep them and resend them. A message on an
    aggregation node's topic may be up to ``max_partial_bytes`` (a partial carries several sums:
    :func:`~fedsim.protocol.codec.max_partial_bytes`; None: ``max_message_bytes``).
    """

    def __init__(
        self,
        broker: BrokerSettings | str,
        *,
        run: str,
        expected_params: int | None = None,
        max_message_bytes: int = codec.DEFAULT_MAX_BYTES,
        max_partial_bytes: int | None = None,
        reconnect: ReconnectPolicy = ReconnectPolicy(),
        max_concurrent_outgoing_calls: int = 20,
        keepalive: int = 30,
        seed: int | None = None,
        ack_interval: float = 0.2,
        lineage: Sequence[str] = (),
        aggregators: Sequence[str] = (),
        clients: Collection[str] | None = None,
        known_rounds: Callable[[str], int] | None = None,
        compressions: Mapping[str, Compression | None] | None = None,
        least_kept: Mapping[str, int] | None = None,
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
        self._max_partial_bytes = max_message_bytes if max_partial_bytes is None else max_partial_bytes
        """The largest message on an aggregator's topic (a partial holds several sums)."""
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
        it releases anything (:class:`~fedsim.transports.mqtt_client.MqttClientEndpoint`; None: not told)."""
        if compressions is not None:  # each client's group's: any other wire form is refused
            self.expect_compression(compressions, least_kept)

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
        # The end of the run at QoS 1: its publish returns once the broker holds it. At QoS 0
        # a server that ended at once (40 windows in 0.75 s, --time-scale 0.05) exited before
        # its event loop wrote it, and every client waited until the launcher's SIGTERM; the
        # clients still receive it at their subscription's QoS 0 (no broker queues it).
        qos = QOS if isinstance(message, RunFinished) else GLOBAL_QOS
        if await self._send(self.topics.global_model, payload, qos=qos, retain=True):
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
        frame = self._decode(topic, payload, sender=topic_client if kind == "updates" else None)
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

    def refuse_before_start(self, message: Message) -> None:
        """Count and log ``message``, received before the run's first window and dropped by
        the server (kind :data:`BEFORE_START`; logged as a rejection, so a flood of them is
        summarised, :class:`fedsim.logging.Throttle`), and forget its round from the table
        of rounds waiting for a receipt: nothing will record it (a client resends what it
        still holds), and ``server.json``'s ``unjudged_updates`` counts only what arrived
        after the last window."""
        self.stats.rejected += 1
        self.stats.refused(BEFORE_START)
        sender = getattr(message, "client_id", getattr(message, "aggregator_id", ""))
        self._log.warning("message rejected", client=sender, kind=BEFORE_START,
                          message=type(message).__name__,
                          reason="before the run started: computed on a model no server of "
                          "this run published")
        if isinstance(message, ClientUpdate):
            named = [(message.client_id, message.round)]
        elif isinstance(message, Partial):
            named = [(e.client_id, e.round) for e in message.entries] + list(message.settled)
        else:
            return
        for named_client, round_index in named:
            rounds = self._unrecorded.get(named_client)
            if rounds is not None:
                rounds.discard(round_index)
                if not rounds:
                    del self._unrecorded[named_client]

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
        frame = self._decode(topic, payload, self._max_partial_bytes)
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
                                receipt_payload(rounds, current, lineage, self._known(client_id)),
                                qos=0):
                self.stats.acks_sent += 1
            # An ack lost here only causes a resend, which the server de-duplicates.
        for aggregator, receipts in sorted(by_aggregator.items()):
            for payload in receipt_batches(receipts, current, lineage):
                if await self._send(self.topics.receipts(aggregator), payload, qos=0):
                    self.stats.acks_sent += 1
