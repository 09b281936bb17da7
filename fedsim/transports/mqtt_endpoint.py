"""Connection supervision shared by fedsim's MQTT endpoints (:mod:`fedsim.transports.mqtt`).

A lost connection is retried with capped exponential backoff and jitter, subscriptions are
renewed, and the endpoint's actor sees no error meanwhile (publishes wait in the outbox,
``receive`` waits). Refused credentials are final: :class:`AccessDenied`. Failure to connect
at all within ``ReconnectPolicy.connect_timeout`` is a :class:`TransportError` naming host,
port and topic. Messages are handed to the endpoint inside aiomqtt's read callback
(:class:`_Dispatch`); undecodable ones are rejected, logged and counted by kind.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import random
from collections.abc import Callable, Coroutine, Mapping
from types import TracebackType
from typing import Any, Self

import aiomqtt

from fedsim.config.compression import Compression
from fedsim.errors import AccessDenied, CodecError, TransportError
from fedsim.logging import get_logger
from fedsim.protocol import codec
from fedsim.protocol.codec import Frame
from fedsim.protocol.compression import wire_form_problem
from fedsim.protocol.messages import Message
from fedsim.transports.inbox import Inbox
from fedsim.transports.mqtt_settings import (
    BrokerSettings,
    MqttStats,
    ReconnectPolicy,
    parse_broker_url,
)
from fedsim.transports.topics import Topics

_log = get_logger("fedsim.transports.mqtt")

QOS = 1
GLOBAL_QOS = 0
"""The global model (and the end of the run) is published at QoS 0, retained. A connected
client gets it over TCP; a client that (re)connects gets the retained one when it subscribes
(clients use clean sessions). At QoS 0 the broker queues nothing for a session that is away
(``queue_qos0_messages false``), so a client that leaves a persistent session subscribed to
``global`` cannot make the broker hold a copy of every model for it (issue 25, finding 10:
broker RSS 22.5 -> 517 MB in 40 s at QoS 1)."""
# CONNACK codes meaning "these credentials are refused" (MQTT 3.1.1: 4, 5; MQTT 5: 134, 135).
_AUTH_REFUSED = {4, 5, 134, 135}


class _Dispatch(asyncio.Queue[aiomqtt.Message]):
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
        # Per client named, the check of its group's wire forms (one object a group).
        self._wire_forms: dict[str, codec.WireFormCheck] = {}

    def expect_compression(self, compressions: Mapping[str, Compression | None],
                           least_kept: Mapping[str, int] | None = None) -> None:
        """Refuse (kind :data:`~fedsim.protocol.compression.WIRE_FORM`) an update of a client
        named here whose wire form is not one its group's ``compression`` sends (a client not
        named: not checked), from its header, before its payload is expanded
        (:meth:`_decode`'s ``sender``); ``least_kept``: per client, the fewest coordinates its
        honest ``threshold`` frames keep (:func:`~fedsim.protocol.compression.wire_form_problem`)."""
        least = least_kept or {}
        checks: dict[tuple[int, int], codec.WireFormCheck] = {}
        self._wire_forms = {
            client_id: checks.setdefault(
                (id(spec), least.get(client_id, 0)),
                functools.partial(wire_form_problem, spec, least=least.get(client_id, 0)))
            for client_id, spec in compressions.items()}

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

    def _decode(self, topic: str, payload: object, max_bytes: int | None = None, *,
                sender: str | None = None) -> Frame | None:
        """The frame of ``payload`` (at most ``max_bytes``, else this endpoint's message
        limit); None, counted and logged, when it is refused. ``sender``: the client whose
        update topic it came on; an update in a wire form its group does not send is refused
        (:meth:`expect_compression`)."""
        if not isinstance(payload, bytes | bytearray):
            self._reject(topic, f"payload of type {type(payload).__name__}")
            return None
        try:
            return codec.decode_frame(
                payload, expected_params=self._expected_params,
                max_bytes=self._max_bytes if max_bytes is None else max_bytes,
                wire_form=None if sender is None else self._wire_forms.get(sender))
        except CodecError as exc:
            self._reject(topic, str(exc), kind=exc.kind)
            return None

    def _reject(self, topic: str, reason: str, *, kind: str = "malformed") -> None:
        self.stats.rejected += 1
        self.stats.refused(kind)
        self._log.warning("message rejected", topic=topic, kind=kind, reason=reason)

    def _other_incarnation(self, topic: str, incarnation: str, current: str | None) -> None:
        self.stats.other_incarnation += 1
        self.stats.refused("other_incarnation")
        self._log.warning(
            "message of another run incarnation ignored",
            topic=topic,
            incarnation=incarnation or "(none)",
            current=current or "(not yet known)",
        )

    # Subclasses:
    def _background_loops(self) -> dict[str, Callable[[], Coroutine[Any, Any, None]]]:
        """Tasks that live as long as the endpoint (across reconnects)."""
        return {}

    async def _on_connected(self, client: aiomqtt.Client) -> None:
        raise TransportError("an MQTT endpoint must define what to do on connection")

    def _on_message(self, topic: str, payload: object) -> None:
        raise TransportError("an MQTT endpoint must define how to handle messages")
