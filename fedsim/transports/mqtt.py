"""The Endpoint protocol over MQTT (aiomqtt 2.x, MQTT 3.1.1, QoS 1). The only aiomqtt importer.

Topics (:class:`~fedsim.transports.topics.Topics`) under ``fedsim/<run>/``: ``global``
(retained: a joining or reconnecting client gets the latest model at once), ``updates/<client>``,
``status/<client>``, and ``acks/<client>`` for the server's receipts.

Delivery is at-least-once end to end, not only to the broker: a client keeps every update in an
outbox until the *server* acknowledges it on ``acks/<client>``; it resends the outbox after every
reconnect and whatever stays unacknowledged for ``resend_after`` seconds (a broker restart loses
what it held; a PUBACK alone proves nothing about the server). The server endpoint does not
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
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
import random
import ssl
from collections.abc import Callable, Container, Coroutine
from dataclasses import dataclass, field, fields, replace
from types import TracebackType
from typing import Any, Self
from urllib.parse import unquote, urlsplit

import aiomqtt
import structlog
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from fedsim.errors import AccessDenied, CodecError, ConfigError, TransportError
from fedsim.protocol import codec
from fedsim.protocol.messages import ClientStatus, ClientUpdate, GlobalModel, Message
from fedsim.transports.inbox import Inbox
from fedsim.transports.security import Credentials
from fedsim.transports.topics import Topics

_log = structlog.get_logger("fedsim.transports.mqtt")

QOS = 1
DEFAULT_PORT = 1883
DEFAULT_TLS_PORT = 8883
# CONNACK codes meaning "these credentials are refused" (MQTT 3.1.1: 4, 5; MQTT 5: 134, 135).
_AUTH_REFUSED = {4, 5, 134, 135}


@dataclass(frozen=True)
class TlsSettings:
    """TLS for ``mqtts://``: CA bundle (system default if None), optional client certificate."""

    ca_certs: str | None = None
    certfile: str | None = None
    keyfile: str | None = None
    insecure: bool = False  # skip certificate and host name checks (testing only)

    def context(self) -> ssl.SSLContext:
        try:
            context = ssl.create_default_context(cafile=self.ca_certs)
            if self.certfile is not None:
                context.load_cert_chain(self.certfile, self.keyfile)
        except (OSError, ssl.SSLError) as exc:
            raise ConfigError(f"TLS settings unusable: {exc}") from None
        if self.insecure:
            context.check_hostname = False
            context.verify_mode = ssl.CERT_NONE
        return context


@dataclass(frozen=True)
class BrokerSettings:
    """Where the broker is and how to log in."""

    host: str
    port: int = DEFAULT_PORT
    username: str | None = None
    password: str | None = field(default=None, repr=False)
    tls: TlsSettings | None = None

    def with_credentials(self, credentials: Credentials) -> BrokerSettings:
        return replace(self, username=credentials.username, password=credentials.password)

    def describe(self) -> str:
        """The broker as a URL without the password (safe to log)."""
        scheme = "mqtts" if self.tls else "mqtt"
        user = f"{self.username}@" if self.username else ""
        return f"{scheme}://{user}{self.host}:{self.port}"


def parse_broker_url(url: str, *, tls: TlsSettings | None = None) -> BrokerSettings:
    """``mqtt://[user[:password]@]host[:port]`` or ``mqtts://...`` (TLS, default port 8883).

    User and password may be percent-encoded. ``tls`` refines the TLS settings of ``mqtts``.
    """
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError as exc:
        raise ConfigError(f"broker URL {url!r}: {exc}") from None
    if parts.scheme not in ("mqtt", "mqtts"):
        raise ConfigError(f"broker URL {url!r} must start with mqtt:// or mqtts://")
    if not parts.hostname:
        raise ConfigError(f"broker URL {url!r} names no host")
    if parts.path not in ("", "/") or parts.query or parts.fragment:
        raise ConfigError(f"broker URL {url!r} must not have a path, query or fragment")
    secure = parts.scheme == "mqtts"
    return BrokerSettings(
        host=parts.hostname,
        port=port if port is not None else (DEFAULT_TLS_PORT if secure else DEFAULT_PORT),
        username=unquote(parts.username) if parts.username is not None else None,
        password=unquote(parts.password) if parts.password is not None else None,
        tls=(tls or TlsSettings()) if secure else None,
    )


@dataclass(frozen=True)
class ReconnectPolicy:
    """Capped exponential backoff with jitter between connection attempts.

    Attempt ``k`` (0-based, reset by every successful connection) waits a uniform time in
    ``[d/2, d]`` with ``d = min(max_delay, initial_delay * multiplier**k)``. The first
    connection must succeed within ``connect_timeout`` seconds; later outages are waited out.
    """

    initial_delay: float = 0.1
    max_delay: float = 10.0
    multiplier: float = 2.0
    connect_timeout: float = 30.0

    def delay(self, attempt: int, rng: random.Random) -> float:
        capped = min(self.max_delay, self.initial_delay * self.multiplier ** min(attempt, 64))
        return rng.uniform(capped / 2, capped)


@dataclass
class MqttStats:
    """Counters of one MQTT endpoint."""

    connections: int = 0
    connection_losses: int = 0
    published: int = 0
    received: int = 0
    rejected: int = 0  # undecodable or of the wrong kind
    denied: int = 0  # client id in the payload differs from the topic's
    acks_sent: int = 0
    acked: int = 0
    resent: int = 0
    abandoned: int = 0  # updates dropped from a full outbox

    def as_dict(self) -> dict[str, int]:
        return {f.name: getattr(self, f.name) for f in fields(self)}


class _Dispatch(asyncio.Queue):
    """aiomqtt's incoming-message queue (its ``queue_type`` option) that hands each message
    straight to the endpoint instead of storing it.

    The endpoint thus handles a message inside aiomqtt's read callback, on the event loop,
    without the task and ``asyncio.wait`` that ``client.messages`` spends per message (a
    large share of the ingest cost for 100 KB updates).
    """

    def __init__(self, handler: Callable[[aiomqtt.Message], None], maxsize: int = 0) -> None:
        super().__init__(maxsize)
        self._handler = handler

    def put_nowait(self, item: aiomqtt.Message) -> None:
        self._handler(item)


class _Ack(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)
    rounds: list[int] = Field(max_length=100_000)


class _MqttEndpoint:
    """Connection supervision shared by the server and client endpoints."""

    def __init__(
        self,
        broker: BrokerSettings | str,
        *,
        run: str,
        identifier: str,
        clean_session: bool,
        expected_params: int | None,
        max_message_bytes: int,
        reconnect: ReconnectPolicy,
        max_concurrent_outgoing_calls: int,
        keepalive: int,
        seed: int | None,
        role: str,
    ) -> None:
        self.broker = parse_broker_url(broker) if isinstance(broker, str) else broker
        # Built once, so unusable TLS files are a ConfigError here rather than at each attempt.
        self._tls_context = self.broker.tls.context() if self.broker.tls is not None else None
        self.topics = Topics(run)
        self.stats = MqttStats()
        self._identifier = identifier
        self._clean_session = clean_session
        self._expected_params = expected_params
        self._max_bytes = max_message_bytes
        self._policy = reconnect
        self._max_outgoing = max_concurrent_outgoing_calls
        self._keepalive = keepalive
        self._jitter = random.Random(seed)
        self._role = role
        self._inbox = Inbox(f"MQTT {role} endpoint")
        self._client: aiomqtt.Client | None = None
        self._connected = asyncio.Event()
        self._connection_over = asyncio.Event()  # set when the current connection ends
        self._started: asyncio.Future[None] | None = None
        self._supervisor: asyncio.Task[None] | None = None
        self._closing = False
        self._background: set[asyncio.Task[None]] = set()
        self._log = _log.bind(role=role, broker=self.broker.describe(), run=run)

    # ---------------------------------------------------------------- lifetime

    async def __aenter__(self) -> Self:
        await self.start()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.close()

    async def start(self) -> None:
        """Connect (retrying within ``connect_timeout``); raises if that fails."""
        if self._supervisor is not None:
            raise TransportError(f"MQTT {self._role} endpoint already started")
        loop = asyncio.get_running_loop()
        self._started = loop.create_future()
        self._supervisor = loop.create_task(self._supervise(), name=f"mqtt-{self._role}")
        for name, factory in self._background_loops().items():
            self._spawn(factory, name)
        try:
            await asyncio.shield(self._started)
        except BaseException:
            await self.close()
            raise

    async def close(self) -> None:
        """Disconnect cleanly and stop; idempotent. Waiting ``receive`` calls get TransportError."""
        self._closing = True
        self._inbox.close()
        tasks = [t for t in (self._supervisor, *self._background) if t is not None]
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task

    @property
    def connected(self) -> bool:
        return self._connected.is_set()

    async def receive(self) -> Message:
        return await self._inbox.get()

    # ---------------------------------------------------------------- supervision

    def _new_client(self) -> aiomqtt.Client:
        tls = self.broker.tls
        return aiomqtt.Client(
            self.broker.host,
            self.broker.port,
            username=self.broker.username,
            password=self.broker.password,
            identifier=self._identifier,
            clean_session=self._clean_session,
            keepalive=self._keepalive,
            max_concurrent_outgoing_calls=self._max_outgoing,
            tls_context=self._tls_context,
            tls_insecure=tls.insecure if tls is not None else None,
            queue_type=functools.partial(_Dispatch, self._dispatch),  # type: ignore[arg-type]
        )

    def _dispatch(self, message: aiomqtt.Message) -> None:
        # Runs inside paho's read callback: nothing may escape into it.
        try:
            self._on_message(str(message.topic), message.payload)
        except Exception as exc:  # noqa: BLE001 - logged; the connection must survive it
            self._reject(str(message.topic), f"handler failed: {exc!r}")

    async def _supervise(self) -> None:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self._policy.connect_timeout
        attempt = 0
        while not self._closing:
            try:
                client = self._new_client()
                self._connection_over = asyncio.Event()
                async with client:
                    self._client = client
                    attempt = 0
                    self.stats.connections += 1
                    await self._on_connected(client)
                    self._connected.set()
                    if self._started is not None and not self._started.done():
                        self._started.set_result(None)
                    self._log.info("connected", connections=self.stats.connections)
                    # Messages are dispatched as they arrive (_Dispatch); this only waits for
                    # the connection to end, which raises MqttError.
                    async for message in client.messages:
                        self._on_message(str(message.topic), message.payload)
            except aiomqtt.MqttCodeError as exc:
                if getattr(exc.rc, "value", exc.rc) in _AUTH_REFUSED and not self.connected:
                    self._fail(
                        AccessDenied(
                            f"MQTT broker {self.broker.host}:{self.broker.port} refused user "
                            f"{self.broker.username!r}: {exc}"
                        )
                    )
                    return
                self._lost(exc)
            except aiomqtt.MqttError as exc:
                self._lost(exc)
            except Exception as exc:  # noqa: BLE001 - a bug must not leave a silent, dead endpoint
                self._fail(TransportError(f"MQTT {self._role} endpoint stopped: {exc!r}"))
                return
            finally:
                self._client = None
                self._connection_over.set()
            if self._started is not None and not self._started.done() and loop.time() > deadline:
                self._fail(
                    TransportError(
                        f"cannot connect to MQTT broker {self.broker.host}:{self.broker.port} "
                        f"within {self._policy.connect_timeout} s"
                    )
                )
                return
            await asyncio.sleep(self._policy.delay(attempt, self._jitter))
            attempt += 1

    def _lost(self, exc: Exception) -> None:
        if self._connected.is_set():
            self.stats.connection_losses += 1
            self._log.warning("connection lost; reconnecting", error=str(exc))
        else:
            self._log.info("connection attempt failed", error=str(exc))
        self._connected.clear()

    def _fail(self, error: TransportError) -> None:
        self._log.error("endpoint failed", error=str(error))
        self._connected.clear()
        self._inbox.close(error)
        if self._started is not None and not self._started.done():
            self._started.set_exception(error)

    async def _send(
        self, topic: str, payload: bytes, *, qos: int = QOS, retain: bool = False
    ) -> bool:
        """Publish if connected; False (nothing raised) if the connection is down or drops.

        aiomqtt would wait its full timeout for a PUBACK that a dropped connection never brings,
        so the publish races the end of the connection.
        """
        client = self._client
        if client is None or not self._connected.is_set():
            return False
        publish = asyncio.ensure_future(client.publish(topic, payload, qos=qos, retain=retain))
        connection_over = asyncio.ensure_future(self._connection_over.wait())
        try:
            await asyncio.wait((publish, connection_over), return_when=asyncio.FIRST_COMPLETED)
        finally:
            connection_over.cancel()
            if not publish.done():
                publish.cancel()  # the connection ended first (or we were cancelled)
        if not publish.done() or publish.cancelled():
            return False
        exc = publish.exception()
        if exc is None:
            return True
        if isinstance(exc, aiomqtt.MqttError):
            self._log.warning(
                "publish failed; will retry after reconnect", topic=topic, error=str(exc)
            )
            return False
        raise exc

    def _spawn(self, factory: Callable[[], Coroutine[Any, Any, None]], name: str) -> None:
        task = asyncio.get_running_loop().create_task(factory(), name=name)
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    def _check_open(self) -> None:
        if self._closing or self._inbox.closed:
            raise TransportError(f"MQTT {self._role} endpoint is closed")

    def _decode(self, topic: str, payload: object) -> Message | None:
        if not isinstance(payload, bytes | bytearray):
            self._reject(topic, f"payload of type {type(payload).__name__}")
            return None
        try:
            return codec.decode(
                payload, expected_params=self._expected_params, max_bytes=self._max_bytes
            )
        except CodecError as exc:
            self._reject(topic, str(exc))
            return None

    def _reject(self, topic: str, reason: str) -> None:
        self.stats.rejected += 1
        self._log.warning("message rejected", topic=topic, reason=reason)

    # Subclasses:
    def _background_loops(self) -> dict[str, Callable[[], Coroutine[Any, Any, None]]]:
        """Tasks that live as long as the endpoint (across reconnects)."""
        return {}

    async def _on_connected(self, client: aiomqtt.Client) -> None:
        raise TransportError("an MQTT endpoint must define what to do on connection")

    def _on_message(self, topic: str, payload: object) -> None:
        raise TransportError("an MQTT endpoint must define how to handle messages")


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
        # Rounds delivered to the inbox but not yet durably recorded by the owner, per client.
        self._unrecorded: dict[str, set[int]] = {}
        self._pending_acks: dict[str, set[int]] = {}
        self._acks_due = asyncio.Event()
        self._ack_interval = ack_interval

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
        """Publish a global model, retained; kept and re-published after a reconnect."""
        self._check_open()
        if not isinstance(message, GlobalModel):
            raise TransportError(
                f"the server endpoint publishes GlobalModel only, not {type(message).__name__}"
            )
        payload = codec.encode(message)
        self._latest_global = payload
        if await self._send(self.topics.global_model, payload, retain=True):
            self.stats.published += 1

    async def _on_connected(self, client: aiomqtt.Client) -> None:
        await client.subscribe(self.topics.all_updates, qos=QOS)
        await client.subscribe(self.topics.all_status, qos=QOS)
        if self._latest_global is not None:
            await client.publish(
                self.topics.global_model, self._latest_global, qos=QOS, retain=True
            )

    def _background_loops(self) -> dict[str, Callable[[], Coroutine[Any, Any, None]]]:
        return {"mqtt-server-acks": self._ack_loop}

    def _on_message(self, topic: str, payload: object) -> None:
        sender = self.topics.sender_of(topic)
        if sender is None:
            self._reject(topic, "not a client topic of this run")
            return
        kind, topic_client = sender
        message = self._decode(topic, payload)
        if message is None:
            return
        expected = ClientUpdate if kind == "updates" else ClientStatus
        if not isinstance(message, expected):
            self._reject(topic, f"{type(message).__name__} on a {kind} topic")
            return
        if message.client_id != topic_client:
            self.stats.denied += 1
            self._log.warning(
                "access denied: forged client id",
                topic=topic,
                payload_client_id=message.client_id,
                error=str(
                    AccessDenied(f"{topic_client!r} sent a message as {message.client_id!r}")
                ),
            )
            return
        self.stats.received += 1
        self._inbox.put(message)
        if isinstance(message, ClientUpdate):
            self._unrecorded.setdefault(topic_client, set()).add(message.round)

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
        for client_id, rounds in pending.items():
            payload = json.dumps({"rounds": sorted(rounds)}).encode()
            if await self._send(self.topics.acks(client_id), payload, qos=0):
                self.stats.acks_sent += 1
            # An ack lost here only causes a resend, which the server de-duplicates.


@dataclass
class _Pending:
    payload: bytes
    sent_at: float


class MqttClientEndpoint(_MqttEndpoint):
    """One client's endpoint: publishes its updates/statuses, receives global models.

    Updates stay in an outbox (at most ``max_unacknowledged``, oldest abandoned first) until the
    server acknowledges them; see the module docstring. ``flush`` waits for the outbox to empty.
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
        max_unacknowledged: int = 256,
        max_concurrent_outgoing_calls: int = 20,
        keepalive: int = 30,
        seed: int | None = None,
    ) -> None:
        try:
            codec.check_client_id(client_id)
        except CodecError as exc:
            raise ConfigError(str(exc)) from None
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
        self._resend_after = resend_after
        self._max_unacked = max_unacknowledged
        self._outbox: dict[int, _Pending] = {}
        self._outbox_empty = asyncio.Event()
        self._outbox_empty.set()
        self._latest_status: bytes | None = None
        self._status_sent = True

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
        if isinstance(message, ClientUpdate):
            payload = codec.encode(message)
            self._outbox.pop(message.round, None)
            self._outbox[message.round] = _Pending(payload, loop.time())
            self._outbox_empty.clear()
            while len(self._outbox) > self._max_unacked:
                abandoned = next(iter(self._outbox))
                del self._outbox[abandoned]
                self.stats.abandoned += 1
                self._log.warning("outbox full: abandoning unacknowledged update", round=abandoned)
            if await self._send(self.topics.updates(self.client_id), payload):
                self.stats.published += 1
        elif isinstance(message, ClientStatus):
            payload = codec.encode(message)
            self._latest_status = payload
            self._status_sent = await self._send(self.topics.status(self.client_id), payload)
            if self._status_sent:
                self.stats.published += 1
        else:
            raise TransportError(
                f"client endpoint {self.client_id!r} publishes ClientUpdate or ClientStatus only, "
                f"not {type(message).__name__}"
            )

    async def flush(self, timeout: float) -> bool:
        """Wait until every update is acknowledged; False if some are not within ``timeout``."""
        try:
            await asyncio.wait_for(self._outbox_empty.wait(), timeout)
        except TimeoutError:
            return False
        return True

    async def _on_connected(self, client: aiomqtt.Client) -> None:
        await client.subscribe(self.topics.acks(self.client_id), qos=QOS)
        await client.subscribe(self.topics.global_model, qos=QOS)
        self._spawn(self._resend_all, f"mqtt-client-{self.client_id}-resend")

    def _background_loops(self) -> dict[str, Callable[[], Coroutine[Any, Any, None]]]:
        return {f"mqtt-client-{self.client_id}-resend-timer": self._resend_timer}

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
            if older_than is not None and pending.sent_at > loop.time() - older_than:
                continue
            if self._outbox.get(round_) is not pending:
                continue  # acknowledged meanwhile
            pending.sent_at = loop.time()
            if await self._send(self.topics.updates(self.client_id), pending.payload):
                self.stats.resent += 1

    async def _resend_timer(self) -> None:
        while True:
            await asyncio.sleep(self._resend_after / 2)
            if self._connected.is_set():
                await self._resend(older_than=self._resend_after)

    def _on_message(self, topic: str, payload: object) -> None:
        if topic == self.topics.acks(self.client_id):
            self._on_ack(topic, payload)
            return
        if topic != self.topics.global_model:
            self._reject(topic, "unexpected topic")
            return
        message = self._decode(topic, payload)
        if message is None:
            return
        if not isinstance(message, GlobalModel):
            self._reject(topic, f"{type(message).__name__} on the global topic")
            return
        self.stats.received += 1
        self._inbox.put(message)

    def _on_ack(self, topic: str, payload: object) -> None:
        try:
            ack = _Ack.model_validate_json(payload)  # type: ignore[arg-type]
        except (ValidationError, TypeError) as exc:
            self._reject(topic, f"malformed acknowledgement: {exc}")
            return
        for round_ in ack.rounds:
            if self._outbox.pop(round_, None) is not None:
                self.stats.acked += 1
        if not self._outbox:
            self._outbox_empty.set()


__all__ = [
    "BrokerSettings",
    "MqttClientEndpoint",
    "MqttServerEndpoint",
    "MqttStats",
    "ReconnectPolicy",
    "TlsSettings",
    "parse_broker_url",
]
