"""The in-process network: endpoints joined by lossy links, driven by the event loop's timers.

Every message is checked by :mod:`fedsim.protocol.codec` when it is published and by the
receiver's codec limits when it is delivered, exactly as over MQTT. An actor's message travels
*sealed* (:func:`~fedsim.protocol.codec.seal`): checked as the encoder checks it and sized as
its frame, without writing or parsing the frame's bytes; delivery opens it with the receiver's
limits (:meth:`~fedsim.protocol.codec.Sealed.open`: the message, or the rejection, that decoding
its frame gives). Raw bytes (:meth:`SimulatedClientEndpoint.publish_bytes`) are decoded in
full. ``wire_bytes=True`` encodes every message to bytes instead: the same messages, events
and counts; only a received vector's address differs (a view into its frame, which some torch
kernels round by: docs/SCALE.md, "Sealed messages").

Deliveries are ``loop.call_later`` timers, so under the virtual-time loop of
:mod:`fedsim.runtime.simulated.kernel` they happen in virtual time, and a run is a
deterministic function of the ``rng`` passed in (every random draw comes from it, in a fixed
order per message).

The link model (what a link does to each message, and in which order it draws) is
:mod:`fedsim.transports.link_model`; the counters are :mod:`fedsim.transports.network_stats`.


Availability mirrors MQTT with a clean session: an offline client's publishes are lost,
messages arriving for it are lost, and what it had received but not yet taken is lost. The
latest global model is *retained*: a client endpoint that is created or comes back online is
sent it at once, over its downlink, as a broker sends a retained message on subscribe.

**Aggregation nodes** (``aggregators``, :mod:`fedsim.runtime.actors.aggregator`): with aggregator
ids given, every client update is delivered to one aggregator instead of the server (sticky: the
client's id hashed over the sorted aggregator ids, as a broker's shared subscription spreads
publishers), statuses still go to the server. Each aggregator has its own link pair under
``aggregator_link`` (the same rules as above): global models and window closes go down it,
partials and forwarded updates go up it to the server. Updates in a partial that is dropped or
lost count in :attr:`SimulatedNetwork.partial_updates_lost`.

The server endpoint applies the same rule as the MQTT server endpoint: a client's update or
status is delivered only if its ``client_id`` is the id of the endpoint that sent it.
Undecodable or misaddressed messages are logged and counted as ``rejected``; they never reach
the actor.
"""

from __future__ import annotations

import asyncio
import collections
import heapq
import math
from collections.abc import Callable, Coroutine, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from fedsim.clock import Clock
from fedsim.errors import CodecError, ConfigError, TransportError
from fedsim.logging import get_logger
from fedsim.protocol import codec
from fedsim.protocol.messages import (
    ClientStatus,
    ClientUpdate,
    GlobalModel,
    Message,
    Partial,
    WindowClose,
)
from fedsim.transports.inbox import Inbox
from fedsim.transports.link_model import Direction, LatencyDrawError, LinkModel, carry
from fedsim.transports.network_stats import DirectionStats, NetworkStats, TraceEntry
from fedsim.transports.topics import aggregator_of

Wire = bytes | codec.Sealed
"""What a link carries: an actor's sealed message or raw bytes; ``len()`` is its frame size."""

_log = get_logger("fedsim.transports.simulated")



@dataclass(slots=True)
class _Link:
    model: LinkModel
    direction: Direction
    client_id: str
    busy_until: float = 0.0
    last_in_order_arrival: float = 0.0
    # In-order messages awaiting delivery: (sequence number, payload), in send order; None
    # while none waits (every client has two links, and an empty deque is 760 bytes).
    in_order: collections.deque[tuple[int, Wire]] | None = None
    next_seq: int = 0


class SimulatedServerEndpoint:
    """The server's endpoint: receives every client's updates and statuses, broadcasts models."""

    def __init__(self, network: SimulatedNetwork) -> None:
        self._network = network
        self._inbox = Inbox("simulated server endpoint")

    async def publish(self, message: Message) -> None:
        if self._inbox.closed:
            raise TransportError("simulated server endpoint: publish after close")
        if isinstance(message, WindowClose):
            self._network._announce(self._network._wire(message))
            return
        if not isinstance(message, GlobalModel):
            raise TransportError(
                f"the server endpoint publishes GlobalModel only (and WindowClose to its "
                f"aggregators), not {type(message).__name__}"
            )
        self._network._broadcast(self._network._wire(message))

    async def receive(self) -> Message:
        return await self._inbox.get()

    async def close(self) -> None:
        self._inbox.close()


class SimulatedClientEndpoint:
    """One client's endpoint: publishes its updates and statuses, receives global models."""

    def __init__(self, network: SimulatedNetwork, client_id: str) -> None:
        self._network = network
        self.client_id = client_id
        self._inbox = Inbox(f"simulated client endpoint {client_id!r}")

    async def publish(self, message: Message) -> None:
        if self._inbox.closed:
            raise TransportError(
                f"simulated client endpoint {self.client_id!r}: publish after close"
            )
        if not isinstance(message, ClientUpdate | ClientStatus):
            raise TransportError(
                f"client endpoint {self.client_id!r} publishes ClientUpdate or ClientStatus only, "
                f"not {type(message).__name__}"
            )
        self._network._send_uplink(self, self._network._wire(message))

    def publish_bytes(self, data: bytes) -> None:
        """Put raw bytes on this client's uplink (fault injection: malformed or forged payloads)."""
        self._network._send_uplink(self, bytes(data))

    def receive(self) -> Coroutine[Any, Any, Message]:
        """The inbox's own wait, not one wrapped in another coroutine: a client's receive
        waits for the whole run, and a wrapper's frame was 0.2 KB a client (issue 24 item 5)."""
        return self._inbox.get()

    async def close(self) -> None:
        self._inbox.close()


class SimulatedAggregatorEndpoint:
    """One aggregator's endpoint: receives the updates routed to it, global models and window
    closes; publishes partials and forwarded updates to the server."""

    def __init__(self, network: SimulatedNetwork, aggregator_id: str) -> None:
        self._network = network
        self.aggregator_id = aggregator_id
        self._inbox = Inbox(f"simulated aggregator endpoint {aggregator_id!r}")

    async def publish(self, message: Message) -> None:
        if self._inbox.closed:
            raise TransportError(
                f"simulated aggregator endpoint {self.aggregator_id!r}: publish after close")
        if not isinstance(message, Partial | ClientUpdate):
            raise TransportError(
                f"aggregator endpoint {self.aggregator_id!r} publishes Partial or ClientUpdate "
                f"only, not {type(message).__name__}")
        link = self._network._link("aggregator_uplink", self.aggregator_id)
        data = self._network._wire(message)
        if self._network._aggregators.get(self.aggregator_id) is not self:
            self._network._lose(link, data)
            return
        self._network._transmit(link, data)

    async def receive(self) -> Message:
        return await self._inbox.get()

    async def close(self) -> None:
        self._inbox.close()


class SimulatedNetwork:
    """In-process network between one server and any number of clients, under a :class:`Clock`.

    ``uplink`` (client -> server) and ``downlink`` (server -> client) are one :class:`LinkModel`
    for every client or a mapping from client id to its own. ``max_message_bytes`` and
    ``expected_params`` are the receiving side's codec limits. ``wire_bytes`` encodes every
    message to its frame at publish and decodes it at delivery (as over MQTT) instead of
    carrying it sealed (the same messages, at the cost of the copies).
    """

    def __init__(
        self,
        clock: Clock,
        *,
        rng: np.random.Generator,
        uplink: LinkModel | Mapping[str, LinkModel],
        downlink: LinkModel | Mapping[str, LinkModel],
        max_message_bytes: int = codec.DEFAULT_MAX_BYTES,
        expected_params: int | None = None,
        record_trace: bool = False,
        aggregators: tuple[str, ...] = (),
        aggregator_link: LinkModel | None = None,
        wire_bytes: bool = False,
    ) -> None:
        self._clock = clock
        self.wire_bytes = wire_bytes
        self._rng = rng
        self._link_models: dict[Direction, LinkModel | Mapping[str, LinkModel]] = {
            "uplink": uplink,
            "downlink": downlink,
        }
        self._max_bytes = max_message_bytes
        self._expected_params = expected_params
        self._stats: dict[Direction, DirectionStats] = {
            "uplink": DirectionStats(),
            "downlink": DirectionStats(),
            "aggregator_uplink": DirectionStats(),
            "aggregator_downlink": DirectionStats(),
        }
        self.aggregator_ids = tuple(sorted(aggregators))
        self._aggregator_link = aggregator_link or LinkModel()
        self._aggregators: dict[str, SimulatedAggregatorEndpoint] = {}
        self.partial_updates_lost = 0
        """Updates in partials (or forwarded alone) that an aggregator link dropped or lost."""
        self._server: SimulatedServerEndpoint | None = None
        self._clients: dict[str, SimulatedClientEndpoint] = {}
        self._links: dict[tuple[Direction, str], _Link] = {}
        self._offline: set[str] = set()
        self._retained: Wire | None = None
        self._last_decoded: tuple[Wire, Message] | None = None
        self._trace: list[TraceEntry] | None = [] if record_trace else None
        self.track_arrivals = False
        """Keep the delivery times for :meth:`next_arrival` (off: it reports nothing)."""
        # Scheduled delivery times per direction and per client's downlink (heaps; past
        # entries are dropped lazily).
        self._arrivals: dict[Direction, list[float]] = {
            "uplink": [], "downlink": [], "aggregator_uplink": [], "aggregator_downlink": []}
        self._arrivals_to: dict[str, list[float]] = {}

    # ----------------------------------------------------------------------------- endpoints

    def server_endpoint(self) -> SimulatedServerEndpoint:
        """The server's endpoint; a second call replaces (and closes) the first, like a restart."""
        if self._server is not None:
            self._server._inbox.close()
        self._server = SimulatedServerEndpoint(self)
        return self._server

    def client_endpoint(self, client_id: str) -> SimulatedClientEndpoint:
        """A client's endpoint; the retained global model (if any) is sent to it at once.

        A second call for the same id replaces (and closes) the first, as an MQTT broker does
        when a client id connects twice.
        """
        try:
            codec.check_client_id(client_id)
        except CodecError as exc:
            raise ConfigError(str(exc)) from None
        for direction in ("uplink", "downlink"):
            self._link(direction, client_id)  # fail now if a per-client mapping lacks this id
        previous = self._clients.get(client_id)
        if previous is not None:
            previous._inbox.close()
        endpoint = SimulatedClientEndpoint(self, client_id)
        self._clients[client_id] = endpoint
        if self._retained is not None and client_id not in self._offline:
            self._transmit(self._link("downlink", client_id), self._retained)
        return endpoint

    def aggregator_endpoint(self, aggregator_id: str) -> SimulatedAggregatorEndpoint:
        """An aggregator's endpoint (one of ``aggregators``); the retained global model is sent
        to it at once. A second call replaces (and closes) the first, like a restart."""
        if aggregator_id not in self.aggregator_ids:
            raise ConfigError(f"{aggregator_id!r} is not one of the network's aggregators "
                              f"{list(self.aggregator_ids)}")
        previous = self._aggregators.get(aggregator_id)
        if previous is not None:
            previous._inbox.close()
        endpoint = self._aggregators[aggregator_id] = SimulatedAggregatorEndpoint(
            self, aggregator_id)
        if self._retained is not None:
            self._transmit(self._link("aggregator_downlink", aggregator_id), self._retained)
        return endpoint

    def aggregator_of(self, client_id: str) -> str:
        """The aggregator that ``client_id``'s updates are routed to."""
        return aggregator_of(client_id, self.aggregator_ids)

    @property
    def aggregator_stats(self) -> dict[str, dict[str, int]]:
        """The aggregator links' counters, per direction."""
        return {"uplink": self._stats["aggregator_uplink"].as_dict(),
                "downlink": self._stats["aggregator_downlink"].as_dict()}

    def set_online(self, client_id: str, online: bool) -> None:
        """Take a client off the network or bring it back (it then receives the retained model)."""
        was_online = client_id not in self._offline
        if online == was_online:
            return
        endpoint = self._clients.get(client_id)
        if not online:
            self._offline.add(client_id)
            if endpoint is not None:
                discarded = endpoint._inbox.discard_all()
                self._stats["downlink"].delivered -= discarded
                self._stats["downlink"].lost += discarded
            return
        self._offline.discard(client_id)
        if endpoint is not None and not endpoint._inbox.closed and self._retained is not None:
            self._transmit(self._link("downlink", client_id), self._retained)

    def next_arrival(self, direction: Direction) -> float:
        """The earliest scheduled delivery in ``direction`` not yet past (``inf``: none): a
        lower bound on when a message sent so far can still arrive (needs
        :attr:`track_arrivals`)."""
        return self._earliest(self._arrivals[direction])

    def next_arrival_to(self, client_id: str) -> float:
        """The earliest scheduled delivery to ``client_id`` not yet past (``inf``: none): a lower
        bound on when a message sent to it so far can still arrive (needs
        :attr:`track_arrivals`)."""
        heap = self._arrivals_to.get(client_id)
        return math.inf if heap is None else self._earliest(heap)

    def _earliest(self, heap: list[float]) -> float:
        now = self._clock.now()
        while heap and heap[0] < now:
            heapq.heappop(heap)
        return heap[0] if heap else math.inf

    @property
    def stats(self) -> NetworkStats:
        """A snapshot of the per-direction counters."""
        return NetworkStats(
            uplink=DirectionStats(**self._stats["uplink"].as_dict()),
            downlink=DirectionStats(**self._stats["downlink"].as_dict()),
        )

    @property
    def trace(self) -> tuple[TraceEntry, ...]:
        """Every network event so far, in the order it happened (empty unless recording)."""
        return tuple(self._trace or ())

    # ----------------------------------------------------------------------------- sending

    def _link(self, direction: Direction, client_id: str) -> _Link:
        key = (direction, client_id)
        link = self._links.get(key)
        if link is None and direction in ("aggregator_uplink", "aggregator_downlink"):
            link = self._links[key] = _Link(model=self._aggregator_link, direction=direction,
                                            client_id=client_id)
        if link is None:
            models = self._link_models[direction]
            if isinstance(models, LinkModel):
                model = models
            elif client_id in models:
                model = models[client_id]
            else:
                raise ConfigError(f"no {direction} link model for client {client_id!r}")
            link = self._links[key] = _Link(model=model, direction=direction, client_id=client_id)
        return link

    def _record(self, link: _Link, event: str, nbytes: int) -> None:
        if self._trace is not None:
            self._trace.append(
                TraceEntry(self._clock.now(), link.direction, link.client_id, event, nbytes)  # type: ignore[arg-type]
            )

    def _wire(self, message: Message) -> Wire:
        """``message`` as it travels: sealed, or its frame with ``wire_bytes``."""
        return codec.encode(message) if self.wire_bytes else codec.seal(message)

    def _open(self, data: Wire, expected_params: int | None) -> Message:
        """What the receiver's codec makes of ``data`` (raises :class:`CodecError`)."""
        if isinstance(data, codec.Sealed):
            return data.open(expected_params=expected_params, max_bytes=self._max_bytes)
        return codec.decode(data, expected_params=expected_params, max_bytes=self._max_bytes)

    def _send_uplink(self, sender: SimulatedClientEndpoint, data: Wire) -> None:
        link = self._link("uplink", sender.client_id)
        if sender.client_id in self._offline or self._clients.get(sender.client_id) is not sender:
            stats = self._stats["uplink"]
            stats.count_sent(data)
            stats.lost += 1
            self._record(link, "lost", len(data))
            return
        self._transmit(link, data)

    def _lose(self, link: _Link, data: Wire) -> None:
        stats = self._stats[link.direction]
        stats.count_sent(data)
        stats.lost += 1
        self._record(link, "lost", len(data))
        self._count_partial(link, data)

    def _count_partial(self, link: _Link, data: Wire) -> None:
        if link.direction != "aggregator_uplink":
            return
        try:
            message = self._open(data, None)
        except CodecError:
            return
        self.partial_updates_lost += len(message.entries) if isinstance(message, Partial) else 1

    def _announce(self, data: Wire) -> None:
        for aggregator_id in self.aggregator_ids:
            self._transmit(self._link("aggregator_downlink", aggregator_id), data)

    def _broadcast(self, data: Wire) -> None:
        self._announce(data)
        self._retained = data
        for client_id in self._clients:
            link = self._link("downlink", client_id)
            if client_id in self._offline or self._clients[client_id]._inbox.closed:
                stats = self._stats["downlink"]
                stats.count_sent(data)
                stats.lost += 1
                self._record(link, "lost", len(data))
            else:
                self._transmit(link, data)

    def _transmit(self, link: _Link, data: Wire) -> None:
        """Sample the link for one message (:func:`~fedsim.transports.link_model.carry`) and
        schedule its deliveries."""
        stats = self._stats[link.direction]
        stats.count_sent(data)
        self._record(link, "send", len(data))
        now = self._clock.now()
        try:
            passage = carry(link.model, link, now, len(data), self._rng)
        except LatencyDrawError as exc:
            raise ConfigError(f"{link.direction} latency of {link.client_id!r}: {exc}") from None
        if passage is None:
            stats.dropped += 1
            self._record(link, "drop", len(data))
            self._count_partial(link, data)
            return
        arrival, in_order, duplicate = passage
        if in_order:
            seq = link.next_seq
            link.next_seq += 1
            if link.in_order is None:
                link.in_order = collections.deque()
            link.in_order.append((seq, data))
            self._schedule(arrival - now, self._deliver_in_order, link, seq)
        else:
            self._schedule(arrival - now, self._deliver, link, data)
        stats.in_flight += 1
        if duplicate is not None:
            stats.duplicated += 1
            stats.in_flight += 1
            self._record(link, "duplicate", len(data))
            self._schedule(duplicate - now, self._deliver, link, data)

    def _schedule(self, delay: float, callback: Callable[..., None], link: _Link,
                  *args: object) -> None:
        delay = max(0.0, delay)
        if self.track_arrivals:
            # Past entries go before each push, so a heap holds what is in flight, however
            # rarely it is asked (a finished client's is never asked).
            arrival = self._clock.now() + delay
            heaps = [self._arrivals[link.direction]]
            if link.direction == "downlink":
                heaps.append(self._arrivals_to.setdefault(link.client_id, []))
            for heap in heaps:
                self._earliest(heap)
                heapq.heappush(heap, arrival)
        asyncio.get_running_loop().call_later(delay, callback, link, *args)

    # ----------------------------------------------------------------------------- delivery

    def _deliver_in_order(self, link: _Link, seq: int) -> None:
        # Arrival times along the in-order queue never decrease, so everything up to ``seq``
        # has arrived by now; delivering it here keeps send order even when timers tie.
        waiting = link.in_order
        while waiting and waiting[0][0] <= seq:
            _, data = waiting.popleft()
            self._deliver(link, data)
        if not waiting and link.in_order is waiting:
            link.in_order = None

    def _deliver(self, link: _Link, data: Wire) -> None:
        stats = self._stats[link.direction]
        stats.in_flight -= 1
        receiver = self._receiver(link)
        if receiver is None:
            stats.lost += 1
            self._record(link, "lost", len(data))
            self._count_partial(link, data)
            return
        cached = self._last_decoded
        if cached is not None and cached[0] is data:
            # A broadcast hands the same object to every link: decode it once. Its arrays are
            # read-only, so receivers cannot change what the others get.
            message = cached[1]
        else:
            try:
                message = self._open(data, self._expected_params)
            except CodecError as exc:
                self._reject(link, data, f"undecodable message: {exc}")
                return
            self._last_decoded = (data, message)
        refusal = _refusal(link, message)
        if refusal:
            self._reject(link, data, refusal)
            return
        if link.direction == "uplink" and isinstance(message, ClientUpdate) and self.aggregator_ids:
            aggregator = self._aggregators.get(self.aggregator_of(link.client_id))
            receiver = aggregator._inbox if aggregator is not None else None
            if receiver is None or receiver.closed:  # the aggregator is down: lost with it
                stats.lost += 1
                self._record(link, "lost", len(data))
                return
        stats.delivered += 1
        self._record(link, "deliver", len(data))
        receiver.put(message)

    def _receiver(self, link: _Link) -> Inbox | None:
        if link.direction in ("uplink", "aggregator_uplink"):
            inbox = self._server._inbox if self._server is not None else None
        elif link.direction == "aggregator_downlink":
            aggregator = self._aggregators.get(link.client_id)
            inbox = aggregator._inbox if aggregator is not None else None
        else:
            endpoint = self._clients.get(link.client_id)
            if endpoint is None or link.client_id in self._offline:
                return None
            inbox = endpoint._inbox
        return None if inbox is None or inbox.closed else inbox

    def _reject(self, link: _Link, data: Wire, reason: str) -> None:
        self._stats[link.direction].rejected += 1
        self._record(link, "reject", len(data))
        _log.warning(
            "message rejected",
            direction=link.direction,
            client_id=link.client_id,
            nbytes=len(data),
            reason=reason,
        )


def _refusal(link: _Link, message: Message) -> str:
    """Why ``message`` may not travel over ``link`` (who may send what to whom), or ''."""
    if link.direction == "aggregator_uplink":
        if not isinstance(message, Partial | ClientUpdate) or (
                isinstance(message, Partial) and message.aggregator_id != link.client_id):
            return ("the server accepts an aggregator's own partials and forwarded updates, "
                    f"got {type(message).__name__}")
    elif link.direction == "aggregator_downlink":
        if not isinstance(message, GlobalModel | WindowClose):
            return f"aggregators accept GlobalModel and WindowClose only, got {type(message).__name__}"
    elif link.direction == "downlink":
        if not isinstance(message, GlobalModel):
            return f"clients accept GlobalModel only, got {type(message).__name__}"
    elif not isinstance(message, ClientUpdate | ClientStatus):
        return f"the server accepts updates and statuses, got {type(message).__name__}"
    elif message.client_id != link.client_id:
        return (f"client id {message.client_id!r} in the payload does not match sender "
                f"{link.client_id!r}")
    return ""


__all__ = [
    "SimulatedAggregatorEndpoint",
    "SimulatedClientEndpoint",
    "SimulatedNetwork",
    "SimulatedServerEndpoint",
]
