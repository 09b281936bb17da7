"""An aggregation node's MQTT endpoint: receives the updates of the clients routed to it,
the global models and the window closes; publishes partials and forwarded updates, and
passes the server's receipts on to its clients (:mod:`fedsim.transports.mqtt`).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable, Coroutine, Mapping, Sequence
from typing import Any

import aiomqtt
from pydantic import ValidationError

from fedsim.config import limits
from fedsim.config.compression import Compression
from fedsim.errors import ConfigError, TransportError
from fedsim.protocol import codec
from fedsim.protocol.messages import (
    ClientUpdate,
    GlobalModel,
    Message,
    Partial,
    RunFinished,
    WindowClose,
)
from fedsim.transports.incarnation import ClientIncarnation
from fedsim.transports.mqtt_endpoint import GLOBAL_QOS, QOS, _MqttEndpoint
from fedsim.transports.mqtt_receipts import Receipts, receipt_payload
from fedsim.transports.mqtt_settings import (
    BrokerSettings,
    ReconnectPolicy,
)
from fedsim.transports.topics import aggregator_of

MAX_HELD_PER_CLIENT = limits.MAX_UNACKNOWLEDGED
"""Rounds of one client an aggregator holds while it does not yet know the run's incarnation
(a restart's queued backlog, or what arrives before the run's first window closes): an honest
client has at most :data:`~fedsim.config.limits.MAX_UNACKNOWLEDGED` (256) updates
unacknowledged, so its backlog never meets the bound. A repeat of a held round replaces it (a
resend); a further round is refused (kind ``rate``, as the pacer refuses a client with 256
updates waiting, :data:`fedsim.runtime.actors.admission.MAX_DEFERRED`), so a flooding client
loses only its own newest updates, which an honest one would resend. What is held is the
decoded dense vectors, so the aggregator holds at most ``MAX_HELD_PER_CLIENT * 4 *
parameters`` bytes per client routed to it, whatever the frames' wire sizes: before, one client's 20,000 top-k frames of 224 bytes held
480 MB of a 6,003-parameter model (issue: an attacker's review)."""


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
        compressions: Mapping[str, Compression | None] | None = None,
        least_kept: Mapping[str, int] | None = None,
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
        # (client, round) -> (incarnation, update), in arrival order; rounds held per client
        self._held: dict[tuple[str, int], tuple[str, ClientUpdate]] = {}
        self._held_rounds: dict[str, int] = {}
        if compressions is not None:
            self.expect_compression({c: spec for c, spec in compressions.items()
                                     if c in self.client_ids}, least_kept)
        self._receipts: list[Receipts] = []  # the server's, not yet passed on
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
        frame = self._decode(topic, payload, sender=sender[1])
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
            self._hold(topic, frame.incarnation, message)
            return
        self._deliver_update(topic, frame.incarnation, message)

    def _hold(self, topic: str, incarnation: str, update: ClientUpdate) -> None:
        """Keep ``update`` until the incarnation is known, within :data:`MAX_HELD_PER_CLIENT`
        rounds of its client (a repeat of a held round replaces it)."""
        key = (update.client_id, update.round)
        previous = self._held.get(key)
        if previous is None:
            rounds = self._held_rounds.get(update.client_id, 0)
            if rounds >= MAX_HELD_PER_CLIENT:
                self._reject(topic, f"{MAX_HELD_PER_CLIENT} rounds of its client are already "
                             "held until the run's incarnation is known", kind="rate")
                return
            self._held_rounds[update.client_id] = rounds + 1
        self._held[key] = (incarnation, update)

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
            held, self._held, self._held_rounds = self._held, {}, {}
            for incarnation, update in held.values():
                self._deliver_update(self.topics.updates(update.client_id), incarnation, update)

    def _deliver(self, message: Message) -> None:
        self.stats.received += 1
        self._inbox.put(message)

    def _take_receipts(self, topic: str, payload: object) -> None:
        """The server's receipts (the broker lets only the server write them): kept to pass on
        if they are the live incarnation's (a receipt from an earlier server would make a
        client forget an update its successor never recorded)."""
        try:
            receipts = Receipts.model_validate_json(payload)  # type: ignore[arg-type]
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
                payload = receipt_payload(rounds, batch.incarnation, batch.lineage)
                if await self._send(self.topics.relayed_acks(self.aggregator_id, client_id),
                                    payload, qos=0):
                    self.stats.acks_sent += 1
