"""The scenario's client links, emulated in front of a deployed client's endpoint.

A deployed run's broker is a real network, which a scenario's simulated ``network`` (latency,
drop, duplicate, reorder, bandwidth) is not. :class:`EmulatedLinks` stands between a client's
actor and its endpoint and gives every update the actor sends, and every global model the
endpoint delivers, the fate the simulated network gives it: the one rule of
:func:`~fedsim.transports.link_model.carry` (each link's messages in send order unless held
back, a dropped one never sent, a duplicate a second copy), its times in scenario seconds on
the client's clock.

What a drop means is the simulated network's: the message is gone. An update dropped here never
reaches the endpoint, so it never enters the outbox of the MQTT delivery (which would resend it
until the server's receipt) - the client spent its privacy for nothing, as in a simulation. The
endpoint is told of its round (:meth:`~fedsim.transports.mqtt.MqttClientEndpoint.note_released`),
so a server that learns of the client's rounds from a status is not taken for one that knows
rounds the client never released. An update the link carries is given to the endpoint's
:meth:`~fedsim.transports.mqtt.MqttClientEndpoint.release` at once, which keeps it on the
client's disk (:mod:`fedsim.transports.durable_outbox`) before the link holds it: a process
killed meanwhile resends it from its restart, as the network would have delivered it (and what
a stopped link held, ``lost_at_close``, is sent by the client's next process, if one comes).
The rest is the deployment's own traffic, not the
scenario's: the client's statuses are never dropped or delayed by a draw (a deployed server
learns from them that a client has stopped, where a simulation knows its actors' states: a
dropped final status would keep a run whose budgets are all spent waiting for its stop time),
but each follows every update sent before it (told that the client stopped, a deployed server
would otherwise end the run with the client's last updates still on the link); the "connected"
announcements before the first model, receipts and the end of the run go around the links.

The link draws come from the client's own stream of the run's seed tree: network fates, like
the simulated network's, are public (they do not depend on a record), and an observer of the
wire sees each release at its slot's end plus the link's latency draw.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Protocol

import numpy as np

from fedsim.clock import Clock
from fedsim.errors import ConfigError, TransportError
from fedsim.logging import get_logger
from fedsim.protocol import codec
from fedsim.protocol.messages import ClientUpdate, GlobalModel, Message
from fedsim.transports.inbox import Inbox
from fedsim.transports.link_model import LatencyDrawError, LinkModel, LinkTimes, Passage, carry

__all__ = ["ClientSide", "EmulatedLinks", "LinkCounts"]

_log = get_logger("fedsim.transports.emulated")


class ClientSide(Protocol):
    """What :class:`EmulatedLinks` needs of the endpoint behind it."""

    async def publish(self, message: Message) -> None: ...

    async def receive(self) -> Message: ...

    async def close(self) -> None: ...

    def note_released(self, round_index: int) -> None: ...

    async def release(self, message: ClientUpdate) -> None: ...


@dataclass
class LinkCounts:
    """What one emulated link did: messages given to it, dropped, duplicated, held back out
    of order, and still in flight when the endpoint closed (lost with it)."""

    sent: int = 0
    dropped: int = 0
    duplicated: int = 0
    reordered: int = 0
    lost_at_close: int = 0

    def as_dict(self) -> dict[str, int]:
        return {"sent": self.sent, "dropped": self.dropped, "duplicated": self.duplicated,
                "reordered": self.reordered, "lost_at_close": self.lost_at_close}


@dataclass
class _Lane:
    """One direction: its model, its times, its counts, and what waits for its arrival."""

    model: LinkModel
    name: str
    rng: np.random.Generator
    times: LinkTimes = field(default_factory=LinkTimes)
    counts: LinkCounts = field(default_factory=LinkCounts)
    in_order: collections.deque[tuple[float, Message]] = field(default_factory=collections.deque)
    runner: asyncio.Task[None] | None = None
    held: set[asyncio.Task[None]] = field(default_factory=set)

    @property
    def waiting(self) -> int:
        return len(self.in_order) + len(self.held)


class EmulatedLinks:
    """A client's endpoint behind its scenario links (module docstring): ``uplink`` for the
    updates the actor publishes, ``downlink`` for the global models the
    endpoint ``inner`` delivers. ``clock`` gives the scenario time the links' latencies are
    in; ``uplink_rng`` and ``downlink_rng`` are the client's own streams for each link's draws
    (one a direction: a stream shared by both would be drawn in the wall clock's order of
    sends and deliveries, so one seed would give different fates from run to run)."""

    def __init__(self, inner: ClientSide, *, uplink: LinkModel, downlink: LinkModel,
                 clock: Clock, uplink_rng: np.random.Generator,
                 downlink_rng: np.random.Generator, client_id: str) -> None:
        self.inner = inner
        self.clock = clock
        self.client_id = client_id
        self._up = _Lane(uplink, "uplink", uplink_rng)
        self._down = _Lane(downlink, "downlink", downlink_rng)
        self._inbox = Inbox(f"client {client_id} (emulated links)")
        self._pump: asyncio.Task[None] | None = None
        self._closed = False
        self.failure: BaseException | None = None
        """The first error of a delayed send or of the downlink (then the actor's next call
        raises it, and :meth:`broken` returns)."""
        self._broken = asyncio.Event()

    # ------------------------------------------------------------------ the Endpoint protocol

    async def publish(self, message: Message) -> None:
        """Give ``message`` to the uplink: sent to the endpoint at once, later, twice or never,
        as the link's draw says. Returns at once unless it is sent at once."""
        self._check()
        if not isinstance(message, ClientUpdate):
            # A status is the deployment's own traffic: a deployed server learns from it that
            # a client stopped (a simulation knows its actors' states), and a run whose every
            # client has spent its budget ends on it; dropped, the run would wait for its stop
            # time instead. It follows every update sent before it (the simulation's server
            # waits for the updates in flight; a deployed one, told the client stopped, would
            # end the run with them still on the link: an attacker's review).
            await self.drain()
            await self.inner.publish(message)
            return
        passage = self._carry(self._up, message)
        if passage is None:  # dropped: never sent, so never kept on disk either
            self.inner.note_released(message.round)
            return
        await self.inner.release(message)  # on the client's disk before the link holds it
        await self._follow(self._up, message, passage, self.inner.publish)

    async def receive(self) -> Message:
        """The next message the downlink delivers (global models after their link's fate;
        anything else as the endpoint gave it)."""
        if self._pump is None and not self._closed:
            self._pump = asyncio.get_running_loop().create_task(self._pump_forever())
        return await self._inbox.get()

    async def close(self) -> None:
        """:meth:`stop`, and close the endpoint."""
        await self.stop()
        await self.inner.close()

    async def stop(self) -> None:
        """Stop both links (what is still in flight is lost, counted); the endpoint stays open
        (its outbox still waits for the server's receipts: the process closes it)."""
        if self._closed:
            return
        self._closed = True
        tasks: list[asyncio.Task[None]] = []
        for lane in (self._up, self._down):
            lane.counts.lost_at_close += lane.waiting
            lane.in_order.clear()
            tasks += [t for t in (lane.runner, *lane.held) if t is not None]
        if self._pump is not None:
            tasks.append(self._pump)
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        self._inbox.close()

    # ------------------------------------------------------------------------ what it adds

    async def drain(self, timeout: float | None = None) -> bool:
        """Wait up to ``timeout`` wall seconds (None: as long as it takes, each message's
        latency being finite) for the uplink to hand the endpoint everything it holds (a
        client stopping on its own lets its last updates arrive); whether it did."""
        loop = asyncio.get_running_loop()
        deadline = None if timeout is None else loop.time() + timeout
        while self._up.waiting and not self._closed:
            tasks = {t for t in (self._up.runner, *self._up.held)
                     if t is not None and not t.done()}
            left = None if deadline is None else deadline - loop.time()
            if (left is not None and left <= 0) or not tasks:
                break
            await asyncio.wait(tasks, timeout=left, return_when=asyncio.FIRST_COMPLETED)
        return not self._up.waiting

    async def broken(self) -> BaseException:
        """Wait until the links fail (a delayed send or the downlink raised): the process
        then ends, where the actor, waiting for a model, would wait for ever."""
        await self._broken.wait()
        assert self.failure is not None
        return self.failure

    def _fail(self, exc: BaseException) -> None:
        if self.failure is None:
            self.failure = exc
        self._broken.set()

    def counts(self) -> dict[str, dict[str, int]]:
        """Each link's :class:`LinkCounts`, for the client's report."""
        return {"uplink": self._up.counts.as_dict(), "downlink": self._down.counts.as_dict()}

    # ---------------------------------------------------------------------------- internals

    def _check(self) -> None:
        if self.failure is not None:
            raise TransportError(f"client {self.client_id}: a delayed send failed: "
                                 f"{self.failure}") from self.failure
        if self._closed:
            raise TransportError(f"client {self.client_id}: endpoint is closed")

    def _carry(self, lane: _Lane, message: Message) -> Passage | None:
        lane.counts.sent += 1
        model = lane.model
        size = len(codec.seal(message)) if model.bandwidth_bytes_per_s is not None else 0
        try:
            passage = carry(model, lane.times, self.clock.now(), size, lane.rng)
        except LatencyDrawError as exc:
            raise ConfigError(f"{lane.name} latency of {self.client_id!r}: {exc}") from None
        if passage is None:
            lane.counts.dropped += 1
            return None
        if not passage[1]:
            lane.counts.reordered += 1
        if passage[2] is not None:
            lane.counts.duplicated += 1
        return passage

    async def _hand_on(self, lane: _Lane, message: Message,
                       act: Callable[[Message], Awaitable[None]]) -> None:
        """``message`` through ``lane``: dropped, or handed to ``act`` at its arrival (within
        this call when that is now and no in-order message waits before it: a link without
        latency is a plain endpoint), and again at its duplicate's."""
        passage = self._carry(lane, message)
        if passage is not None:
            await self._follow(lane, message, passage, act)

    async def _follow(self, lane: _Lane, message: Message, passage: Passage,
                      act: Callable[[Message], Awaitable[None]]) -> None:
        """``message`` handed to ``act`` as its ``passage`` on ``lane`` says."""
        arrival, in_order, duplicate = passage
        if in_order and not lane.in_order and arrival <= self.clock.now():
            await act(message)
        else:
            self._later(lane, arrival, in_order, message, act)
        if duplicate is not None:
            self._later(lane, duplicate, False, message, act)

    def _later(self, lane: _Lane, when: float, in_order: bool, message: Message,
               act: Callable[[Message], Awaitable[None]]) -> None:
        """Hand ``message`` to ``act`` at scenario time ``when``: an in-order one after every
        in-order one before it, another on its own."""
        loop = asyncio.get_running_loop()
        if in_order:
            lane.in_order.append((when, message))
            if lane.runner is None or lane.runner.done():
                lane.runner = loop.create_task(self._run_in_order(lane, act))
            return
        task = loop.create_task(self._at(when, message, act))
        lane.held.add(task)
        task.add_done_callback(lane.held.discard)

    async def _run_in_order(self, lane: _Lane, act: Callable[[Message], Awaitable[None]]) -> None:
        while lane.in_order:
            when, message = lane.in_order[0]
            await self._until(when)
            lane.in_order.popleft()
            await self._act(act, message)

    async def _at(self, when: float, message: Message,
                  act: Callable[[Message], Awaitable[None]]) -> None:
        await self._until(when)
        await self._act(act, message)

    async def _until(self, when: float) -> None:
        wait = when - self.clock.now()
        if wait > 0:
            await self.clock.sleep(wait)

    async def _act(self, act: Callable[[Message], Awaitable[None]], message: Message) -> None:
        try:
            await act(message)
        except Exception as exc:  # noqa: BLE001 - kept for the actor's next call, logged
            self._fail(exc)
            _log.warning("a delayed message could not be handed on", client=self.client_id,
                         message=type(message).__name__, error=str(exc))

    async def _deliver(self, message: Message) -> None:
        self._inbox.put(message)

    async def _pump_forever(self) -> None:
        """Take what the endpoint delivers and pass it through the downlink."""
        while True:
            try:
                message = await self.inner.receive()
            except TransportError as exc:
                self._inbox.close(exc)
                return
            try:
                await self._pass_down(message)
            except Exception as exc:  # noqa: BLE001 - the actor's receive must not wait forever
                _log.warning("the emulated downlink failed", client=self.client_id,
                             error=str(exc))
                self._fail(exc)
                self._inbox.close(TransportError(
                    f"client {self.client_id}: the emulated downlink failed: {exc}"))
                return

    async def _pass_down(self, message: Message) -> None:
        if not isinstance(message, GlobalModel):
            self._inbox.put(message)
            return
        await self._hand_on(self._down, message, self._deliver)
