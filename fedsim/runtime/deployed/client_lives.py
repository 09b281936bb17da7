"""A deployed client's incarnations in its process: its actor, and under its group's
``availability.crashes`` the crashes and rejoins a simulation plays out
(:func:`fedsim.runtime.incarnations.crashes_and_rejoins`, the one rule), emulated on the
process's own clock.

A crash cancels the current actor (a round begun but not charged is lost; its model is lost);
a rejoin reopens the ledger from its file and starts a new actor whose rounds continue after
the last committed one, as a restarted process would, while the process keeps its broker
connection: what was already sent stays on the network, as in a simulation. A crash for good
ends the client: it tells the server so with a ``crashed`` status (the deployment's own
traffic: a simulation knows its actors' states, and a run that ends once every budget is
spent must not wait for a client that never comes back), and it stays crashed in a resumed
launch.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable

import numpy as np

from fedsim.clock import Clock
from fedsim.errors import TransportError
from fedsim.privacy.ledger import PrivacyLedger
from fedsim.protocol.messages import GlobalModel, Message, RunFinished
from fedsim.runtime.actors.client import ClientActor, Trainer
from fedsim.runtime.actors.releases import Releases, RoundRecord
from fedsim.runtime.actors.stops import ClientStopKind
from fedsim.runtime.incarnations import ClientRecord, crashes_and_rejoins
from fedsim.runtime.population import ClientPlan
from fedsim.runtime.run_record import StoppedClient
from fedsim.transports.base import Endpoint
from fedsim.transports.incarnation import ClientIncarnation

__all__ = ["CRASHED_FOR_GOOD", "DOWN_AT_THE_END", "ClientLives", "ServerTimeline", "crash_stop"]

CRASHED_FOR_GOOD = "crashed and did not rejoin"
"""The stop reason of a client whose emulated crash was for good (the simulation's words)."""

DOWN_AT_THE_END = "down (crashed, due to rejoin) when the server finished the run"
"""What a client's report says when the run ended during one of its down times."""

ActorFactory = Callable[[PrivacyLedger, Releases, Endpoint], ClientActor]
"""Makes an incarnation's actor on the client's (reopened) ledger and the given endpoint,
adding its releases to the given record of every incarnation's."""

FIRST_MODEL_POLL = 0.01
"""Wall seconds between looks for the first global model, which starts the crash clock."""


class ServerTimeline:
    """The run's timeline (the server's clock) as a client process knows it: its own clock
    minus its lead over the server's, measured at every global model and end of the run that
    arrives (their send times are the server's), the least lead seen (the fastest delivery:
    an estimate never later than the server's own time).

    A client's clock cannot follow the server's back: it starts where its ledger ends, whose
    times only grow, and a resumed server's clock goes on from its checkpoint's window, before
    the times its clients reached in the earlier part (a stranger's resumed launch: clients'
    stop times 4.5 s past the run's end); a fresh launch's clients start their clocks before
    the server its first window. A client's stop time is said on this timeline, the run's
    (:meth:`time_of`); its ledger keeps its own clock's.

    The least lead is measured per server start (``incarnation``: the run incarnation the
    client follows, :class:`~fedsim.transports.incarnation.ClientIncarnation`): a server
    restarted while its clients go on resumes its clock from its checkpoint's window, behind
    the clock it had, so a lead measured before the restart is too small by the time lost,
    and the least of both said every later stop that much past the server's time (an owner's
    review, session 66: a restart that set the clock back 7 s had stops said 7 s late). A new
    incarnation starts the measurement afresh. A message counts for the start it is stamped
    with (:meth:`ClientIncarnation.of`), not the one the client follows when it is taken up:
    one of the earlier start, delivered after the client followed the new one (queued, or held
    on an emulated downlink), was measured as the new start's, its clock's lead too small. Such
    a message is left out once the new start is measured or followed."""

    def __init__(self, clock: Clock, latest: float,
                 incarnation: ClientIncarnation | None = None) -> None:
        self._clock = clock
        self._latest = latest  # (a send time past any run's end is not the server's clock)
        self._incarnation = incarnation
        self._measured_under: str | None = None  # the server start the lead was measured on
        self.lead: float | None = None
        """How far the client's clock is ahead of the server's (None: no message seen yet)."""

    def observe(self, message: GlobalModel | RunFinished) -> None:
        """A message the server sent at ``message.sent_at`` (its clock) arrives now."""
        if not 0.0 <= message.sent_at <= self._latest:
            return
        lead = self._clock.now() - message.sent_at
        if self._incarnation is not None:
            following = self._incarnation.current
            stamped = self._incarnation.of(message)
            start = following if stamped is None else stamped
            if start != self._measured_under:  # another server start: its own clock
                if start != following:
                    return  # an earlier start's, taken up late: not the measured one's
                self._measured_under, self.lead = start, None
        self.lead = lead if self.lead is None else min(self.lead, lead)

    def time_of(self, own: float) -> float:
        """A time ``own`` of the client's clock on the server's timeline (as it is, where no
        message of the server has arrived yet)."""
        return own if self.lead is None else own - self.lead


class _ActorsEndpoint:
    """The incarnations' endpoint: the process's, and a global model that arrived while the
    client was down, delivered first to the next incarnation (a restarted process gets the
    broker's retained model at once, as a simulated rejoin gets the network's)."""

    def __init__(self, inner: Endpoint, align: Callable[[float], None] | None,
                 timeline: ServerTimeline | None = None) -> None:
        self.inner = inner
        self.held: GlobalModel | None = None
        self._align = align  # called with the first global model's send time, then dropped
        self.timeline = timeline

    async def publish(self, message: Message) -> None:
        await self.inner.publish(message)

    async def receive(self) -> Message:
        message: Message
        if self.held is not None:
            message, self.held = self.held, None
        else:
            message = await self.inner.receive()
        if self._align is not None and isinstance(message, GlobalModel):
            self._align(message.sent_at)
            self._align = None
        self.observe(message)
        return message

    def observe(self, message: Message) -> None:
        """Measure the client's lead over the server's clock by a message of the server's."""
        if self.timeline is not None and isinstance(message, GlobalModel | RunFinished):
            self.timeline.observe(message)

    async def close(self) -> None:
        await self.inner.close()


class ClientLives:
    """The client's incarnations (module docstring). ``make_actor`` builds each one's actor;
    ``reopen`` opens the ledger afresh for a rejoin; ``crash_rng`` draws the up and down
    times (None: the group never crashes)."""

    def __init__(self, plan: ClientPlan, trainer: Trainer, ledger: PrivacyLedger, *,
                 clock: Clock, endpoint: Endpoint, make_actor: ActorFactory,
                 reopen: Callable[[], PrivacyLedger],
                 crash_rng: np.random.Generator | None,
                 align: Callable[[float], None] | None = None,
                 timeline: ServerTimeline | None = None) -> None:
        self.record = ClientRecord(plan, trainer, ledger)
        self.clock = clock
        self.timeline = timeline
        """The server's timeline as this process knows it (None: its own clock's)."""
        self._endpoint = _ActorsEndpoint(endpoint, align, timeline)
        self._down: asyncio.Task[None] | None = None
        self._finished: RunFinished | None = None
        self._make_actor = make_actor
        self._reopen = reopen
        self._crash_rng = crash_rng if plan.group.availability.crashes is not None else None
        self.stopped: list[StoppedClient] = []
        """The crash for good, when there was one (the simulation's entry)."""
        self.kept: list[RoundRecord] = []
        """Every round its incarnations released, in order (for its report)."""
        self._earlier_counts = {"timing_overruns": 0, "split_delays": 0, "late_models": 0}
        self._done: asyncio.Future[None] | None = None
        self.actor = self._make_actor(ledger, Releases(kept=self.kept), self._endpoint)
        """The latest incarnation's actor (the one up, or the last to crash)."""
        self.record.actor = self.actor

    # ---------------------------------------------------------------------------- running

    async def run(self) -> None:
        """Until an incarnation stops on its own (budget, rounds, the run's end) or the client
        crashes for good; an incarnation's error is raised."""
        loop = asyncio.get_running_loop()
        self._done = loop.create_future()
        self._launch(self.record)
        crashes: asyncio.Task[None] | None = None
        if self._crash_rng is not None:
            crashes = loop.create_task(self._crashes(self._crash_rng))
            crashes.add_done_callback(self._crash_helper_ended)
        try:
            await self._done
        finally:
            for task in (crashes, self.record.task, self._down):
                if task is not None and not task.done():
                    task.cancel()
                    with contextlib.suppress(asyncio.CancelledError):
                        await task

    @property
    def finished(self) -> RunFinished | None:
        """The server's end of the run, as an incarnation or the process while the client
        was down saw it (None: not seen)."""
        return self._finished if self._finished is not None else self.actor.finished

    @property
    def down(self) -> bool:
        """Crashed and not (yet) rejoined."""
        return self.record.actor is None

    @property
    def crashed_for_good(self) -> bool:
        return self.record.crashed_for_good

    @property
    def crashes(self) -> int:
        return self.record.crashes

    def set_online(self, online: bool) -> None:
        """On/off periods reach whichever incarnation is up (and the next one)."""
        self.record.online = online
        if self.record.actor is not None:
            self.record.actor.set_online(online)

    def server_time(self, own: float | None) -> float | None:
        """A time of this process's clock on the run's timeline (:class:`ServerTimeline`)."""
        return own if own is None or self.timeline is None else self.timeline.time_of(own)

    def server_now(self) -> float:
        """Now, on the run's timeline (:class:`ServerTimeline`)."""
        now = self.clock.now()
        return now if self.timeline is None else self.timeline.time_of(now)

    def count(self, name: str) -> int:
        """One of the actor's counters (``timing_overruns``, ``split_delays``,
        ``late_models``) over every incarnation."""
        return self._earlier_counts[name] + int(getattr(self.actor, name))

    # ---------------------------------------------------------------------------- internals

    async def _crashes(self, rng: np.random.Generator) -> None:
        """The crash rule, its clock started by the first global model: a simulated client's
        up-time counts from the run's start, and a deployed one connects before the server's
        first window (by seconds where many clients start: an attacker's review saw crashes
        come 3-4 scenario seconds early)."""
        while self.actor.held_version < 0:
            await asyncio.sleep(FIRST_MODEL_POLL)
        await crashes_and_rejoins(self.record, self.clock, rng, rejoin=self._rejoin,
                                  stopped=self.stopped)

    async def _while_down(self) -> None:
        """Read what arrives while the client is down: the newest global model is kept for
        the next incarnation; the end of the run ends the client (a down client's process
        lingered until its rejoin time: an attacker's review)."""
        while True:
            try:
                message = await self._endpoint.inner.receive()
            except TransportError:
                return
            self._endpoint.observe(message)
            if isinstance(message, RunFinished):
                self._finished = message
                if self._done is not None and not self._done.done():
                    self._done.set_result(None)
                return
            held = self._endpoint.held
            if isinstance(message, GlobalModel) and (held is None or
                                                     message.version > held.version):
                self._endpoint.held = message

    def _launch(self, record: ClientRecord) -> None:
        assert record.actor is not None
        task = asyncio.get_running_loop().create_task(
            record.actor.run(), name=f"client-{record.plan.client_id}")
        record.task = task
        task.add_done_callback(self._incarnation_ended)

    def _rejoin(self, record: ClientRecord) -> None:
        if self._down is not None:
            self._down.cancel()  # (a receive cancelled gives up no message: Inbox.get)
            self._down = None
        record.ledger.close()
        record.ledger = self._reopen()
        for name in self._earlier_counts:  # the crashed incarnation's counters, banked
            self._earlier_counts[name] += int(getattr(self.actor, name))
        self.actor = self._make_actor(record.ledger, Releases(kept=self.kept), self._endpoint)
        self.actor.set_online(record.online)
        record.actor = self.actor
        self._launch(record)

    def _incarnation_ended(self, task: asyncio.Task[None]) -> None:
        done = self._done
        if done is None or done.done() or task is not self.record.task:
            return
        if task.cancelled():  # a crash (crashes_and_rejoins goes on) or the end of run()
            if self._down is None:
                self._down = asyncio.get_running_loop().create_task(self._while_down())
            return
        error = task.exception()
        if error is not None:
            done.set_exception(error)
        else:
            done.set_result(None)

    def _crash_helper_ended(self, task: asyncio.Task[None]) -> None:
        done = self._done
        if done is None or done.done() or task.cancelled():
            return
        error = task.exception()
        if error is not None:
            done.set_exception(error)
        elif self.record.crashed_for_good:
            done.set_result(None)


def crash_stop(lives: ClientLives) -> tuple[str, ClientStopKind, float | None]:
    """A client crashed for good: its state, stop kind and the time of the crash (on the
    server's timeline, :class:`ServerTimeline`)."""
    at = lives.stopped[-1]["time"] if lives.stopped else None
    return "crashed", ClientStopKind.CRASHED, lives.server_time(at)
