"""A client's MQTT endpoint: publishes its updates and statuses, keeps every update in an
outbox until the server's receipt, resends with backoff, and receives the global models
(:mod:`fedsim.transports.mqtt`).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Collection, Coroutine
from dataclasses import dataclass
from typing import Any

import aiomqtt
from pydantic import ValidationError

from fedsim.config import limits
from fedsim.errors import CodecError, ConfigError, LedgerError, TransportError
from fedsim.protocol import codec
from fedsim.protocol.messages import (
    ClientStatus,
    ClientUpdate,
    GlobalModel,
    Message,
    RunFinished,
)
from fedsim.transports.durable_outbox import DurableOutbox
from fedsim.transports.incarnation import ClientIncarnation
from fedsim.transports.mqtt_endpoint import GLOBAL_QOS, QOS, _MqttEndpoint
from fedsim.transports.mqtt_receipts import Ack
from fedsim.transports.mqtt_settings import (
    BrokerSettings,
    ReconnectPolicy,
)

HELLO_EVERY = 0.5  # seconds between a client's requests for the run's incarnation


RESEND_BACKOFF_MAX = 8
"""An unacknowledged update is resent after ``resend_after`` seconds, then after twice that
since its last sending, and so on up to ``RESEND_BACKOFF_MAX`` times ``resend_after``: under an
overload receipts come late, and resending every outstanding update at a fixed period would
add load exactly when the server has none to spare (a redelivery storm). A reconnect resends
every one at once, as before."""


@dataclass(frozen=True)
class FollowedRuns:
    """The run incarnations a client followed, for its endpoint (its ``followed``)."""

    incarnations: frozenset[str] = frozenset()
    """Those its earlier processes followed (kept in its state directory)."""
    remember: Callable[[str], None] | None = None
    """Called with each one this client comes to follow (the live server's welcome or
    receipt, a model continuing it) before any model of it is delivered: the client process
    keeps it on disk, evidence for a later process even where this one is killed before its
    exit report."""


@dataclass
class _Pending:
    payload: bytes
    sent_at: float
    base_version: int
    resends: int = 0
    stamp: str | None = None  # a restored update's run incarnation (None: this process's)

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

    ``outbox``: where the outbox is also kept on disk, each update written durably as it is
    released, before any emulated link delays it (:meth:`release`) and before it is sent
    (:mod:`fedsim.transports.durable_outbox`); :meth:`resume_outbox` puts a previous process's
    unacknowledged updates back in it, sent once the live server's incarnation is known (a
    receipt relayed by an aggregator is only taken for that incarnation) and dropped if they
    belong to another run. None: in memory only.

    ``followed``: the run incarnations earlier processes of this client followed, and what
    keeps those this one comes to follow (:class:`FollowedRuns`). The broker's retained end of
    a run, before any welcome, is that run's end when it names one of them (its incarnation or
    lineage): no server will welcome the client again, so the endpoint delivers nothing and
    sets :attr:`ended_before` (:meth:`ended`). Any other retained end may be an earlier run's,
    and waits for the live server as before.
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
        outbox: DurableOutbox | None = None,
        followed: FollowedRuns = FollowedRuns(),
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
        self._followed = followed.incarnations
        self._remember = followed.remember
        self.ended_before: RunFinished | None = None
        """The end of the run this client followed, retained on the broker (``followed``)."""
        self._ended = asyncio.Event()
        self._store = outbox
        self._released: dict[int, bytes] = {}  # kept on disk, on an emulated link still
        self._writes: set[asyncio.Task[None]] = set()  # durable copies being written (close waits)

    @property
    def unacknowledged(self) -> tuple[int, ...]:
        """Rounds of the updates the server has not yet acknowledged."""
        return tuple(self._outbox)

    def note_released(self, round_index: int) -> None:
        """The client released round ``round_index`` (sent now, or given to an emulated link
        that may send it later or drop it, :mod:`fedsim.transports.emulated`): a server that
        knows of it (from a status) knows no round this client lacks."""
        if self._own_rounds is not None:
            self._own_rounds = max(self._own_rounds, round_index + 1)

    async def publish(self, message: Message) -> None:
        """Send an update (kept until acknowledged) or a status (the latest is kept until sent).

        Returns once the broker has the message, or at once if the connection is down (it is
        sent after the reconnect).
        """
        self._check_open()
        loop = asyncio.get_running_loop()
        stamp = self.incarnation.current or ""
        if isinstance(message, ClientUpdate):
            self.note_released(message.round)
            payload = self._released.pop(message.round, None)
            try:
                if payload is None:  # not released through release(): kept now
                    payload = codec.encode(message, incarnation=stamp)
                    if message.round not in self._outbox:  # (a link's duplicate is on disk)
                        await self._keep_charged(message.round, payload)
            finally:
                # Charged: in the outbox even when a stopping process cancels this publish
                # mid-write, so its exit's flush sends it or its report lists it (a resumed
                # launch's round was charged, never sent, and counted nowhere).
                if payload is not None:
                    self._queue(message.round, _Pending(payload, loop.time(),
                                                        message.base_version))
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

    async def release(self, message: ClientUpdate) -> None:
        """The client released ``message`` (its ledger charged it) to an emulated link
        (:mod:`fedsim.transports.emulated`) that may hand it on later, twice or never: it is
        kept on disk now, and :meth:`publish` sends these bytes when the link hands it on (a
        link that drops an update does not release it). A plain :meth:`publish` of an update
        does both at once."""
        self._check_open()
        self.note_released(message.round)
        payload = codec.encode(message, incarnation=self.incarnation.current or "")
        try:
            await self._keep_charged(message.round, payload)
        finally:  # charged: held for its link even when this call is cancelled (publish)
            self._released[message.round] = payload

    def resume_outbox(self, recorded: Collection[int]) -> int:
        """Queue the updates a previous process of this client kept in its durable outbox and
        saw no receipt for (those of rounds in ``recorded``, its ledger's; the newest
        ``max_unacknowledged`` of them), to be sent once the live server's incarnation is
        known; returns how many (``stats.restored``; files refused: ``stats.outbox_rejected``).
        Call before any update of this process is published."""
        if self._store is None:
            return 0
        restored = self._store.restore(client_id=self.client_id, recorded=recorded,
                                       expected_params=self._expected_params,
                                       max_bytes=self._max_bytes, newest=self._max_unacked)
        self.stats.outbox_rejected += restored.rejected
        self.stats.abandoned += restored.abandoned
        now = asyncio.get_running_loop().time()
        for update in restored.updates:
            self._queue(update.round, _Pending(update.payload, now, update.base_version,
                                               stamp=update.incarnation))
        self.stats.restored += len(restored.updates)
        if restored.updates:
            rounds = [update.round for update in restored.updates]
            self._log.info("resending updates a previous process did not see acknowledged",
                           count=len(rounds), first=rounds[0], last=rounds[-1],
                           abandoned=restored.abandoned)
        return len(restored.updates)

    def forget_on_disk(self) -> int:
        """Remove the unacknowledged updates' files, the outbox itself unchanged (for the
        report): the run has ended, no receipt will come and no later process may send them
        (in a simulation what is in flight at the end is lost). Returns how many."""
        if self._store is None:
            return 0
        rounds = {*self._outbox, *self._released}
        for round_index in rounds:
            self._store.forget(round_index)
        return len(rounds)

    async def _keep_charged(self, round_index: int, payload: bytes) -> None:
        """Keep a charged update on disk (:meth:`_keep_durably`). The write runs in a task of
        its own that a cancelled caller (a stopping process) does not stop, and
        :meth:`close` waits for: cancelled while queued for its thread, it was never made,
        and a resumed process had nothing to resend."""
        write = asyncio.ensure_future(self._keep_durably(round_index, payload))
        self._writes.add(write)
        write.add_done_callback(self._writes.discard)
        await asyncio.shield(write)

    async def close(self) -> None:
        """:meth:`_MqttEndpoint.close`, once every durable copy being written is on disk."""
        if self._writes:
            await asyncio.gather(*self._writes, return_exceptions=True)
        await super().close()

    async def _keep_durably(self, round_index: int, payload: bytes) -> None:
        if self._store is None:
            return
        try:  # (a thread: its fsyncs do not hold the client's receipts and models back)
            await asyncio.to_thread(self._store.keep, round_index, payload)
        except OSError as exc:
            # Charged already: sent all the same, only a kill before its receipt loses it.
            self.stats.outbox_write_errors += 1
            self._log.error("could not keep an update in the durable outbox (sent all the same)",
                            round=round_index, error=str(exc))

    def _queue(self, round_index: int, pending: _Pending) -> None:
        self._outbox.pop(round_index, None)
        self._outbox[round_index] = pending
        self._outbox_empty.clear()
        while len(self._outbox) > self._max_unacked:
            abandoned = next(iter(self._outbox))
            self._drop(abandoned)
            self.stats.abandoned += 1
            self._log.warning("outbox full: abandoning unacknowledged update", round=abandoned)

    def _drop(self, round_index: int) -> bool:
        """Take round ``round_index`` out of the outbox, on disk too; whether it was there."""
        if self._outbox.pop(round_index, None) is None:
            return False
        if self._store is not None:
            self._store.forget(round_index)
        if not self._outbox:
            self._outbox_empty.set()
        return True

    async def refused(self) -> LedgerError:
        """Wait until the server shows that this client's ledger lost rounds
        (:attr:`refusal`)."""
        await self._refused.wait()
        assert self.refusal is not None
        return self.refusal

    async def ended(self) -> RunFinished:
        """Wait until the broker's retained end names the run this client followed
        (:attr:`ended_before`, the class docstring's ``followed``)."""
        await self._ended.wait()
        assert self.ended_before is not None
        return self.ended_before

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
            if pending.stamp is not None and self.incarnation.current is None:
                # A previous process's update: sent once the live server is known (a
                # receipt relayed by an aggregator is taken for its incarnation only).
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
        self._drop(round_)
        self.stats.expired += 1
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
        if current is None and isinstance(frame.message, RunFinished):
            self._run_ended(frame.incarnation, frame.lineage)
            if not self._followed & {frame.incarnation, *frame.lineage}:
                # Not evidence (a new run's client may start before its server): said, as
                # the wait it leaves may last until the client is stopped.
                self._log.warning(
                    "the broker holds the end of a run this client did not follow (perhaps "
                    "an earlier run's): waiting for a live server's welcome",
                    incarnation=frame.incarnation, version=frame.message.version)
            elif self.refusal is None:
                self.ended_before = frame.message
                self._ended.set()
                return  # its run is over: nothing is held back for a welcome
        admitted = self.incarnation.admit_global(frame)
        self._now_following(current)
        if admitted is not None:
            self._deliver(self.incarnation.delivered(admitted))
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
            ack = Ack.model_validate_json(payload)  # type: ignore[arg-type]
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
            self._now_following(before)
            self._release_held_back(ack.incarnation)
            if before is None:
                self._welcomed(ack.incarnation, ack.lineage)
        for round_ in ack.rounds:
            if self._drop(round_):
                self.stats.acked += 1
        if not self._outbox:
            self._outbox_empty.set()

    def _now_following(self, before: str | None) -> None:
        """Hand the run incarnation followed, if it is no longer ``before``, to ``remember``
        (the class docstring) before any model of it is delivered."""
        current = self.incarnation.current
        if current is not None and current != before and self._remember is not None:
            self._remember(current)

    def _run_ended(self, incarnation: str, lineage: Collection[str]) -> None:
        """The broker's retained end of a run, before any welcome: the restored updates of
        that run (stamped with its incarnation or one it continued) can never be received,
        so they are forgotten (``stats.other_run``; a review: a client restarted after its
        server finished kept them on disk, unacknowledged though applied). The end itself
        waits for the live server's confirmation, as before (it may be an earlier run's),
        unless it names a run this client followed (the class docstring's ``followed``)."""
        ended = {incarnation, *lineage}
        self._forget_restored(lambda stamp: stamp in ended, "a run that has ended",
                              self._log.info)

    def _welcomed(self, incarnation: str, lineage: Collection[str]) -> None:
        """The live server is known (its first welcome or receipt): forget the restored
        updates stamped with an incarnation it does not continue (a state directory reused by
        another run of the same name: it ignores them, so they would wait for ever,
        ``stats.other_run``) and send the others, held until now."""
        accepted = {incarnation, *lineage}
        self._forget_restored(lambda stamp: stamp not in accepted, "another run",
                              self._log.warning)
        if any(pending.stamp is not None for pending in self._outbox.values()):
            self._spawn(self._resend_all, f"mqtt-client-{self.client_id}-restored")

    def _forget_restored(self, of_it: Callable[[str], bool], run: str,
                         log: Callable[..., Any]) -> None:
        """Forget the restored updates whose stamp ``of_it`` names as ``run``'s
        (``stats.other_run``): no server will receive them."""
        for round_, pending in list(self._outbox.items()):
            if pending.stamp is not None and of_it(pending.stamp):
                self._drop(round_)
                self.stats.other_run += 1
                log(f"an update a previous process kept belongs to {run}: forgotten",
                    round=round_, incarnation=pending.stamp)

    def _release_held_back(self, incarnation: str) -> None:
        self._log.info("run incarnation confirmed", incarnation=incarnation)
        released, ignored = self.incarnation.release_held_back()
        for other in ignored:  # e.g. the retained model of an earlier run of this name
            self._other_incarnation(self.topics.global_model, other.incarnation, incarnation)
        if released is not None:
            self._deliver(self.incarnation.delivered(released))

    def _ledger_lost(self, topic: str, ack: Ack) -> bool:
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
