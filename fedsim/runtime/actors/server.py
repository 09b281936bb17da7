"""The server actor (van Dijk & Nguyen, sec. 3): time windows, de-duplication, staleness, mixing,
diminishing step sizes, evaluation and broadcast.

At time 0 it broadcasts version 0. Then, for window k = 1, 2, ... it collects every message
that arrives in ``((k-1) W, k W]`` and at ``k W``:

1. paces each client to its public compute slot (:mod:`fedsim.runtime.actors.admission`), then
   classifies each update, in arrival order: **rejected** (logged with its reason, counted by
   kind in ``WindowReport.rejections``) if the sender is unknown, its vector has the wrong
   length, its round is beyond the client's round limit or implausibly far ahead of what the
   server knows of it (:data:`~fedsim.runtime.actors.integrity.MAX_ROUND_GAP`; such a round never
   enters the client book), its ``base_version`` is ahead of the server's or was never
   published, or its norm exceeds what clipping plus the client's noise can produce
   (:func:`~fedsim.runtime.actors.integrity.update_norm_bound`); **duplicate** (logged) if
   ``(client_id, round)`` was judged before (in any window: at-least-once delivery must never
   double-apply; the :class:`~fedsim.runtime.actors.client_book.ClientBook` gives every verdict
   here, typed); **stale** if ``version - base_version`` exceeds ``max_staleness``;
   **rejected** if the server invites (``participation < 1``) and never invited the client to
   the window the update names; otherwise **applied**;
2. mixes the applied updates (weights normalised over the window or over the whole population,
   ``normalize``; see the aggregation policies below) with the window's server step size, and
   checks the result (:func:`~fedsim.runtime.actors.integrity.check_model`: finite, bounded, no
   further than the accepted updates allow through the server optimizer, whichever it is)
   before it replaces the model; the version goes up
   by one if anything was applied;
3. evaluates on the held-out set every ``eval_every`` windows and lets the step-size
   schedule react (an unchanged model is not re-evaluated and does not count as "no
   improvement");
4. broadcasts the model every ``broadcast_every`` windows (also when unchanged, so a client that
   missed the last broadcast can still catch up).

A client's status is kept only if it agrees with what the server saw (:meth:`accept_status`):
a client cannot report fewer released rounds than the server received from it, more than its
round limit, or "done" without having reached its limit; an update that arrives after a
"finished" status contradicts it and removes it. What never arrived is derived from the
statuses and the round numbers (:meth:`missing_updates`).
**Client sampling by invitation** (``participation < 1``): the server draws each window's
participants from its own generator before the window opens and names them in the global model
message that opens it (a bitmap over the sorted client ids, :mod:`fedsim.runtime.actors.exposure`),
broadcasting every window; clients train only under an invitation that names them, so an
uninvited client neither computes nor spends, and every update of an invited round is applied
(subject to staleness) whenever it arrives: nothing is rejected after its client paid for it.

**Aggregation policies** (``server.aggregation``, :mod:`fedsim.aggregation.policies`): with
time windows (the default) the mix above happens at each window's end; with FedBuff (a buffer
of K) or FedAsync (every update) the server judges each update as it arrives, applies the
buffer when the policy says so and publishes the new model at once, and the window is only the
reporting period (metrics line, evaluation, stop checks, checkpoint). Every update passes the
same checks (1.) whichever the policy, before it is buffered or applied, and every new model
passes ``check_model`` before it replaces the old one and is published. Each applied update is
weighted by the staleness weighting ``S(version - base_version)``, and the direction goes
through the server optimizer (:mod:`fedsim.aggregation.optimizers`: SGD, momentum, Adam,
Yogi) at the window's step size. An update waiting in a buffer is not yet judged (not in the
client book), so a deployed server acknowledges it only once it is applied.

**Aggregation nodes** (``aggregators``): the server announces each window's close, waits for
their partials and checks them (:mod:`fedsim.runtime.actors.partials`); it mixes the accepted
groups with its direct updates (:meth:`ServerActor._apply_with_partials`).

**Overload** (:attr:`ServerActor.shed_on_arrival`, the deployed server; docs/DEPLOYMENT.md): under
time windows an update that arrives already stale (``version - base_version > max_staleness``)
is judged as it arrives, before pacing, instead of waiting for the window's end behind the
others: the verdict is the same (it could only be staler then), it takes no token of its
client's pace, and it enters the book at once, so the receipt after the next checkpoint frees
its client. It counts as stale and as ``WindowReport.shed``.

Everything here is post-processing of released updates: it costs the clients no privacy.
The actor sees only a :class:`~fedsim.clock.Clock` and an
:class:`~fedsim.transports.base.Endpoint`, so it runs unchanged over MQTT.
"""

from __future__ import annotations

import asyncio
import copy
import sys
from collections.abc import Awaitable, Callable, Collection, Mapping
from collections.abc import Set as AbstractSet
from dataclasses import dataclass, field
from typing import Literal

import numpy as np

from fedsim.aggregation import (
    AcceptedUpdate,
    MixingStrategy,
    StepSizeSchedule,
    mixing,
    population_weight,
)
from fedsim.aggregation.mixing import client_weights
from fedsim.aggregation.optimizers import ServerOptimizer, Sgd
from fedsim.aggregation.policies import AggregationPolicy, TimeWindows
from fedsim.clock import Clock
from fedsim.errors import ConfigError
from fedsim.logging import get_logger
from fedsim.protocol.headers import MAX_COUNTER
from fedsim.protocol.messages import (
    ClientStatus,
    ClientUpdate,
    GlobalModel,
    Message,
    Partial,
)
from fedsim.runtime.actors.admission import Pacer
from fedsim.runtime.actors.client_book import ClientBook, Kind
from fedsim.runtime.actors.integrity import (
    ClientLimits,
    Rejections,
    check_model,
)
from fedsim.runtime.actors.partials import FORWARDED_KINDS, PartialGroup, PartialIntake
from fedsim.runtime.actors.server_evaluation import Evaluator, FinalEvaluation, HeldOutEvaluation
from fedsim.runtime.actors.server_mix import mix_updates, mix_with_partials
from fedsim.runtime.actors.server_snapshot import ServerSnapshot, check_snapshot
from fedsim.runtime.actors.tasks import helper_tasks
from fedsim.runtime.actors.window_report import WindowReport, duration_stop
from fedsim.transports.base import Endpoint

__all__ = ["ClientInfo", "ServerActor", "WindowReport",
           "duration_stop"]

_log = get_logger("fedsim.runtime.actors.server")

@dataclass(frozen=True)
class ClientInfo:
    """What the server knows about a client in advance (from the scenario)."""

    num_samples: int  # the declared (public) size, never a size the client sent
    step_size: float  # the client's agreed local step size eta_i
    weight: float = 1.0
    limits: ClientLimits | None = None  # its DP posture, to bound its updates (integrity)
    sequence: Callable[[int], float] | None = field(default=None, kw_only=True)
    """eta_i(r), agreed a priori (None: the constant ``step_size``)."""
    slot: float | None = field(default=None, kw_only=True)
    """A lower bound of its public compute time per round (None: not paced; admission.py)."""

    def step_at(self, round_index: int) -> float:
        """eta_i of the client's round ``round_index``."""
        return self.step_size if self.sequence is None else float(self.sequence(round_index))


class ServerActor:
    """Collects client updates per time window and publishes global models."""

    def __init__(  # noqa: PLR0913 - the scenario's server settings, one keyword each
        self,
        *,
        clock: Clock,
        endpoint: Endpoint,
        initial_params: np.ndarray,
        clients: Mapping[str, ClientInfo],
        window: float,
        strategy: MixingStrategy,
        step_size: StepSizeSchedule,
        evaluate: Evaluator | None = None,
        eval_every: int = 1,
        broadcast_every: int = 1,
        max_staleness: int | None = None,
        participation: float = 1.0,
        rng: np.random.Generator | None = None,
        normalize: Literal["window", "population"] = "window",
        policy: AggregationPolicy | None = None,
        optimizer: ServerOptimizer | None = None,
        aggregators: Collection[str] = (),
        aggregator_wait: float = 0.0,
    ) -> None:
        if window <= 0:
            raise ConfigError(f"window must be > 0, got {window}")
        self.clock = clock
        self.endpoint = endpoint
        self.params = np.asarray(initial_params, dtype=np.float32).copy()
        self.clients = dict(clients)
        self._ids = sorted(self.clients)  # the invitation's draw order, sorted once, not a window
        self.book = ClientBook({c: info.limits for c, info in self.clients.items()},
                               self.params.size, max_staleness=max_staleness,
                               invites=participation < 1.0)
        """What the server judged of each client, statuses, published versions, invitations."""
        self.window = float(window)
        self.strategy = strategy
        self.policy: AggregationPolicy = policy if policy is not None else TimeWindows()
        self.optimizer: ServerOptimizer = optimizer if optimizer is not None else Sgd()
        self.step_size = step_size
        self.evaluation = HeldOutEvaluation(evaluate, eval_every)
        self.broadcast_every = broadcast_every
        self.max_staleness = max_staleness
        self.participation = participation
        self.rng = rng if rng is not None else np.random.default_rng(0)
        # "population": weights relative to every client's weight (a fixed weighing vector);
        # "window": a convex mix of what arrived in the window.
        self.total_weight = None if normalize == "window" else population_weight(
            strategy, [(cid, info.num_samples, info.weight) for cid, info in sorted(self.clients.items())])
        self._rejections = Rejections()
        """The open window's rejected updates and statuses by kind."""
        self.incarnations: tuple[str, ...] = ()
        """The run incarnations this server continues (its transport's, kept in snapshots)."""
        self.before_publish: Callable[[int, float], Awaitable[bool]] | None = None
        """The runtime's step before a model of ``version`` leaves at ``time`` (the deployed
        server: a durable checkpoint covering it); False: publish nothing (the run is over)."""
        self.windows_closed = 0
        self.last_accuracy: float | None = None
        self._inbox: list[ClientUpdate] = []
        self._origin = 0.0  # when window 0 opened (run() sets it)
        # On-arrival policies: the open window's running report and the buffer of updates
        # accepted but not yet applied (not in the book until applied).
        self._open: WindowReport | None = None
        self._buffer: list[tuple[AcceptedUpdate, float | None]] = []
        self.ended = False  # the last window has closed: updates are no longer judged
        self.shed_on_arrival = False
        """Time windows: judge an update that arrives already stale at once (the deployed
        server; module docstring, "Overload")."""
        self.updates_after_end = 0
        self._invited_bits: bytes | None = None
        self._renew_above = 0  # (restore: the snapshot's version ceiling)
        self.pacer = Pacer({c: info.slot for c, info in self.clients.items()}, clock.now())
        self.stream_above = mixing.STREAM_ABOVE  # time windows: then fold in (StreamedWindow)
        self._stream: mixing.StreamedWindow | None = None
        self.weights = client_weights(self.strategy, [
            (c, info.num_samples, info.weight) for c, info in sorted(self.clients.items())])
        self.partials = PartialIntake(aggregators, aggregator_wait, book=self.book,
                                      weights=self.weights, entry_bound=self._entry_bound,
                                      size=self.params.size, window=self.window,
                                      slot=max((float(s) for s in self.pacer.slots.values()
                                                if s is not None), default=0.0))
        """The aggregation nodes' partials (none: updates come straight)."""
        if self.partials.aggregators:
            # Only forwarded updates reach the inbox: partials join the mix at the close.
            self.stream_above = sys.maxsize

    def _entry_bound(self, client_id: str, round_index: int, weight: float) -> float | None:
        """``w_i |eta_i(r)| bound_i(r)`` of a client's round in a partial (None: a client
        whose posture the server does not know)."""
        info = self.clients[client_id]
        if info.limits is None:
            return None
        return weight * abs(info.step_at(round_index)) * info.limits.norm_bound(round_index)

    @property
    def aggregators(self) -> frozenset[str]:
        """The aggregation nodes' ids (empty: updates come straight)."""
        return self.partials.aggregators

    def _take_partial(self, partial: Partial) -> None:
        self.partials.take(partial, closing=self.windows_closed + 1, ended=self.ended,
                           rejections=self._rejections)

    @property
    def version(self) -> int:
        """The model's version (the book judges base versions against it)."""
        return self.book.version

    @version.setter
    def version(self, version: int) -> None:
        self.book.version = version

    @property
    def statuses(self) -> dict[str, ClientStatus]:
        """The clients' kept statuses (a copy; :meth:`accept_status`)."""
        return self.book.statuses

    # -- receiving ------------------------------------------------------------------------
    async def _receive_forever(self) -> None:
        while True:
            await self.take(await self.endpoint.receive())

    async def take(self, message: Message) -> None:
        """Judge, keep or count one received message (after the run's end too: a deployed
        server takes its clients' final statuses so)."""
        if isinstance(message, ClientUpdate):
            if self.ended:
                self.updates_after_end += 1  # never judged: the last window has closed
            elif self.policy.on_arrival:
                await self._arrived(message)
            elif self._stale_on_arrival(message):
                self._shed(message)
            else:
                self.pacer.note(message, self.clock.now())  # paced by its arrival time
                self._inbox.append(message)
                if len(self._inbox) > self.stream_above:
                    self._fold_inbox(tuple(self.pacer.take_released()))
        elif isinstance(message, ClientStatus):
            self.accept_status(message)
        elif isinstance(message, Partial):
            self._take_partial(message)
        else:
            _log.warning("server ignored a message", kind=type(message).__name__)

    def _stale_on_arrival(self, update: ClientUpdate) -> bool:
        """Under :attr:`shed_on_arrival`, whether ``update`` is already stale as it arrives:
        it can only be staler when its window closes."""
        return (self.shed_on_arrival and self.max_staleness is not None
                and self.version - update.base_version > self.max_staleness)

    def _shed(self, update: ClientUpdate) -> None:
        """Judge now an update that arrived stale (module docstring, "Overload"): no pacing,
        no place in the window's inbox; it enters the book (its receipt frees the client)."""
        report = self._open = self._open or WindowReport(self.windows_closed + 1,
                                                         self.clock.now(), self.version)
        report.received += 1
        stale = report.stale
        # Never accepted (stale already); an earlier check of the judge may refuse it instead.
        self._admit(update, report)
        report.shed += report.stale - stale

    # -- one window -----------------------------------------------------------------------
    def _invite(self, window: int) -> bytes | None:
        """Draw ``window``'s participants (None: everyone is invited) and remember them."""
        if self.participation >= 1.0:
            return None
        ids = self._ids
        count = max(1, round(self.participation * len(ids)))
        chosen = frozenset(ids[i] for i in self.rng.choice(len(ids), size=count, replace=False))
        # A restarted server draws the open window again: both draws' invitees may train.
        self._invited_bits = self.book.invite(window, chosen)
        return self._invited_bits

    def _admit(self, update: ClientUpdate, report: WindowReport,
               buffered: AbstractSet[tuple[str, int]] = frozenset()
               ) -> tuple[AcceptedUpdate, float | None] | None:
        """Check and classify one update, whichever the policy (the book's verdict, counted in
        ``report``): the update to apply with its norm bound, or None. A classified update
        enters the book at once, an accepted one only when its mix is applied or refused
        (``buffered``: accepted, waiting)."""
        verdict = self.book.judge(update, buffered)
        if verdict.dropped_status:
            self._rejections.add(Kind.STATUS_INCONSISTENT)
            _log.warning("status rejected", client=update.client_id,
                         kind=Kind.STATUS_INCONSISTENT, reason=verdict.dropped_status)
        if verdict.kind is Kind.DUPLICATE:
            report.duplicate += 1
            # At-least-once delivery duplicates, a replay looks the same: counted in the
            # window's report (metrics.jsonl, and its one "window events" line), each at debug.
            _log.debug(
                "duplicate update ignored (a network duplicate or a replay)",
                client=update.client_id, round=update.round, base_version=update.base_version)
            return None
        if verdict.kind is Kind.STALE:
            report.stale += 1
            return None
        if verdict.kind is Kind.NOT_INVITED:
            _log.warning("update of a round the client was not invited to",
                         client=update.client_id, round=update.round, window=update.window)
            report.rejected += 1
            self._rejections.add(Kind.NOT_INVITED)
            return None
        if verdict.kind is not Kind.ACCEPTED:
            self._rejections.add(verdict.kind)
            report.rejected += 1
            _log.warning("update rejected", client=update.client_id, round=update.round,
                         base_version=update.base_version, kind=verdict.kind,
                         reason=verdict.reason)
            if verdict.kind in FORWARDED_KINDS:  # (behind an aggregator, which counted it judged)
                self.partials.hold_back(update.client_id, MAX_COUNTER)
            return None
        report.accepted += 1
        info = self.clients[update.client_id]
        accepted = AcceptedUpdate(update.client_id, update.round, update.delta, info.num_samples,
                                  info.step_at(update.round), info.weight, update.base_version,
                                  update.norm)
        return accepted, info.limits.norm_bound(update.round) if info.limits else None

    def _apply(self, accepted: list[tuple[AcceptedUpdate, float | None]], report: WindowReport,
               step: float) -> bool:
        """One server step with ``accepted`` (time windows: normalised as configured; a buffer:
        over itself: :func:`~fedsim.runtime.actors.server_mix.mix_updates`), through the server
        optimizer; the new model replaces the old only if it passes :func:`check_model` (else
        the updates count as ``bad_mix`` rejections and the optimizer's state is left as it
        was)."""
        total = None if self.policy.on_arrival else self.total_weight
        mix = mix_updates(self.strategy, self.policy, total, self.version, accepted)
        return self._step_model(mix.entries, mix.direction, mix.bound, report, step)

    def _step_model(self, entries: list[tuple[str, int, int]], direction: np.ndarray,
                    bound: float | None, report: WindowReport, step: float) -> bool:
        """The optimizer's step for ``entries``, kept only if it passes :func:`check_model`."""
        for client_id, round_index, _ in entries:
            self.book.record(client_id, round_index)
        before = copy.deepcopy(self.optimizer)
        with np.errstate(over="ignore", invalid="ignore"):  # refused just below
            new = self.optimizer.step(self.params, direction, step)
        allowed = None if bound is None else before.move_bound(self.params.size, bound, step)
        problem = check_model(new, self.params, allowed)
        if problem:
            self.optimizer = before
            _log.error("mixed model refused; its updates are not applied", window=report.window,
                       reason=problem, updates=len(entries))
            self._rejections.add(Kind.BAD_MIX, len(entries))
            report.rejected += len(entries)
            return False
        self.params = new
        report.applied_updates.extend(entries)
        report.applied_to.extend([self.version] * len(entries))
        report.applied += len(entries)
        self.version += 1
        return True

    def _fold_inbox(self, due: tuple[ClientUpdate, ...] = ()) -> None:
        """A large time window: check the waiting updates now (paced, after ``due``: deferred
        ones whose token accrued) and fold in the accepted ones."""
        stream = self._stream = self._stream or mixing.StreamedWindow(
            self.params.shape, self.strategy, self.total_weight, self.policy, self.version)
        report = self._open = self._open or WindowReport(self.windows_closed + 1,
                                                         self.clock.now(), self.version)
        arrived, self._inbox = self._inbox, []
        report.received += len(arrived)
        paced = [*due, *self.pacer.judged_now(arrived, self.clock.now())]
        stream.fold(paced, lambda update: self._admit(update, report, stream.keys))

    async def _arrived(self, update: ClientUpdate) -> None:
        """An on-arrival policy's update: check and classify it now, apply the buffer when the
        policy says so and publish the new model at once (if it passed :func:`check_model`)."""
        report = await self._release_waiting()
        report.received += 1
        if self.pacer.offer(update, self.clock.now()) == "pass":
            await self._buffer_one(update, report)

    async def _release_waiting(self) -> WindowReport:
        """Judge the updates whose client has a token again (:class:`Pacer`); the open report."""
        if self._open is None:
            self._open = WindowReport(self.windows_closed + 1, self.clock.now(), self.version)
        while (due := self.pacer.next_due(self.clock.now())) is not None:
            await self._buffer_one(due, self._open)
        return self._open

    async def _buffer_one(self, update: ClientUpdate, report: WindowReport) -> None:
        admitted = self._admit(update, report,
                               frozenset((a.client_id, a.round) for a, _ in self._buffer))
        if admitted is None:
            return
        self._buffer.append(admitted)
        if self.policy.ready(len(self._buffer)):
            batch, self._buffer = self._buffer, []
            if self._apply(batch, report, self.step_size.current(self.windows_closed + 1)):
                await self.publish_model(invite=False)

    def _apply_with_partials(
            self, accepted: list[tuple[AcceptedUpdate, float | None]],
            groups: list[PartialGroup], report: WindowReport, step: float) -> bool:
        """A time window's step with direct updates and aggregators' groups
        (:func:`~fedsim.runtime.actors.server_mix.mix_with_partials`)."""
        mix = mix_with_partials(self.strategy, self.policy, self.total_weight, self.version,
                                self.params.size, accepted, groups)
        return self._step_model(mix.entries, mix.direction, mix.bound, report, step)

    def close_window(self) -> WindowReport:
        """Check, classify, mix and apply what arrived since the last window (on-arrival
        policies: report what was applied in it); evaluate if due."""
        self.windows_closed += 1
        window = self.windows_closed
        now = self.clock.now()
        due = [] if self.policy.on_arrival else self.pacer.due(now)  # deferred, token accrued
        if self._stream is not None:  # the rest of a large window: folded in like the start
            self._fold_inbox(tuple(due))
            due = []
        stream, self._stream = self._stream, None
        arrived, self._inbox = self._inbox, []
        report = self._open or WindowReport(window=window, time=self.clock.now(),
                                            version=self.version)
        self._open = None
        report.window, report.time = window, self.clock.now()
        report.received += len(arrived)
        accepted: list[tuple[AcceptedUpdate, float | None]] = []
        keys: set[tuple[str, int]] = set()
        paced = due + self.pacer.judged_now(arrived, now)
        if refused := self.pacer.take_refused():  # beyond the waiting limit: "rate"
            self._rejections.add(Kind.RATE, refused)
            report.rejected += refused
        # Partials first: a copy of an update in a late partial, forwarded unmixed meanwhile
        # (its client resent it), is then the duplicate, not the partial's whole group.
        groups = self.partials.judge(report, keys, self._rejections,
                                     on_arrival=self.policy.on_arrival)
        for update in paced:
            admitted = self._admit(update, report, keys)
            if admitted is not None:
                accepted.append(admitted)
                keys.add((update.client_id, update.round))
        report.step_size = self.step_size.current(window)
        if groups:
            # A server behind aggregation nodes never streams (__init__): a stream's
            # accepted updates would not be in this mix.
            assert stream is None, "a streamed window on a server with aggregation nodes"
            self._apply_with_partials(accepted, groups, report, report.step_size)
        elif accepted:
            self._apply(accepted, report, report.step_size)
        elif stream is not None and stream.accepted:
            direction, bound = stream.finish()
            self._step_model(stream.accepted, direction, bound, report, report.step_size)
        report.rejections, self._rejections = self._rejections.as_dict(), Rejections()
        report.version = self.version
        report.waiting = self._waiting_to_apply(report)
        evaluated = self.evaluation.at_window(window, self.params, self.version, self.step_size)
        if evaluated is not None:
            report.accuracy, report.loss = evaluated
            self.last_accuracy = report.accuracy
        report.log_events()
        return report

    def _waiting_to_apply(self, report: WindowReport) -> int:
        """Updates that could still be applied and wait for their clients' tokens: those the
        pacer holds (:meth:`Pacer.waiting_to_apply`) and those the aggregation nodes say they
        hold, bounded (:meth:`PartialIntake.deferred_at_aggregators`). The stop on spent
        budgets waits for them (an attacker's review: one deferred past its window was
        lost)."""
        own = self.pacer.waiting_to_apply(self.book)
        report.waiting_at_aggregators = self.partials.deferred_at_aggregators(
            window=report.window, own=own, accepted=report.accepted)
        return own + report.waiting_at_aggregators

    def evaluate_final(self) -> FinalEvaluation | None:
        """The model as the run leaves it, evaluated (:meth:`HeldOutEvaluation.final`)."""
        return self.evaluation.final(self.params, self.version)

    def accept_status(self, status: ClientStatus) -> bool:
        """Keep ``status`` if it agrees with what the server saw (:meth:`ClientBook.judge_status`,
        which may adopt a first far claim); else log and count it."""
        adopted = self.book.adoptions
        verdict = self.book.judge_status(status, run_ended=self.ended)
        if self.book.adoptions > adopted:  # its rounds below the count: judged, unseen by them
            self.partials.hold_back(status.client_id, self.book.watermark(status.client_id))
        if verdict.kind is not Kind.ACCEPTED:
            self._rejections.add(verdict.kind)
            _log.warning("status rejected", client=status.client_id, state=status.state,
                         rounds=status.rounds, kind=verdict.kind, reason=verdict.reason)
            return False
        return True

    def missing_updates(self) -> int:
        """Updates the clients released (by their statuses and round numbers) that never
        reached this server's book (lost, or still in flight; after any adopted rounds)."""
        return self.book.missing()

    async def broadcast(self) -> None:
        """Publish the model; it opens the next window and carries that window's invitation."""
        await self.publish_model(invite=True)

    async def publish_model(self, *, invite: bool) -> None:
        """Publish the model for the open window; ``invite``: draw the window's invitation
        (False: repeat the open window's, for a model published mid-window)."""
        window = self.windows_closed + 1
        invited = self._invite(window) if invite else self._invited_bits
        self.book.publish(self.version)
        if self.before_publish is not None and not await self.before_publish(
                self.version, self.clock.now()):
            return
        await self.endpoint.publish(GlobalModel(self.version, self.params.copy(), self.clock.now(),
                                                window, invited, self.step_size.current(window)))

    # -- checkpoints ----------------------------------------------------------------------
    def snapshot(self) -> ServerSnapshot:
        """The server's state between windows (see :class:`~fedsim.runtime.actors.server_snapshot.ServerSnapshot`)."""
        return ServerSnapshot(
            params=self.params.copy(),
            version=self.version,
            windows_closed=self.windows_closed,
            time=self.clock.now(),
            book=self.book.state(publishing=self.version),  # (may be broadcast next)
            step_size_state=self.step_size.state_dict(),
            rng_state=dict(self.rng.bit_generator.state),
            last_accuracy=self.last_accuracy,
            evaluated_version=self.evaluation.version,
            last_evaluation=self.evaluation.last,
            incarnations=self.incarnations,
            optimizer_state=self.optimizer.state(),
            aggregator_marks=self.partials.notes.marks(),
        )

    def restore(self, snapshot: ServerSnapshot) -> None:
        """Continue from ``snapshot`` (call before :meth:`run`): the version never goes back and
        an update applied before the snapshot is never applied again."""
        check_snapshot(snapshot, self.params.size)
        self.params = np.asarray(snapshot.params, dtype=np.float32).copy()
        self.version = snapshot.version
        self.windows_closed = snapshot.windows_closed
        self.book.load(snapshot.book)
        self.incarnations = tuple(snapshot.incarnations)
        self.step_size.load_state_dict(snapshot.step_size_state)
        self.rng.bit_generator.state = snapshot.rng_state
        self.last_accuracy = snapshot.last_accuracy
        self.evaluation.version = snapshot.evaluated_version
        self.evaluation.last = snapshot.last_evaluation
        self.optimizer.load_state(snapshot.optimizer_state)
        for client_id, mark in snapshot.aggregator_marks.items():  # (the scenario's clients)
            self.partials.hold_back(client_id, mark)
        self._renew_above = snapshot.version if snapshot.version_ceiling is None \
            else max(snapshot.version, snapshot.version_ceiling)

    def renew_version(self) -> None:
        """Give the current model a new version (after a restart from a snapshot).

        Clients that sent an update on the restored version wait for a newer model; if those
        updates died with the crashed server's open window, nothing newer would ever come. The
        re-published model is unchanged, so its evaluation (and the step-size schedule) is
        carried over rather than counted again. Above the snapshot's ``version_ceiling``: a
        deployed server under an on-arrival policy publishes models between checkpoints, and a
        client ignores any version not newer than the one it holds."""
        renewed = max(self.version, self._renew_above) + 1
        self.evaluation.renew(self.version, renewed)
        self.version = renewed

    def earliest_publish(self, next_update_arrival: float) -> float:
        """When the server can next publish a global model, given the earliest time an update
        in flight can arrive (the batcher's horizon, see :mod:`fedsim.training.batched`): the
        end of the open window, a true lower bound; on-arrival policies: also the next
        arrival, which ignores updates not yet sent (a round split later is recomputed)."""
        window_end = self._origin + (self.windows_closed + 1) * self.window
        # On arrival, any update can publish a model (FedAsync; FedBuff's K-th).
        return min(window_end, next_update_arrival) if self.policy.on_arrival else window_end

    # -- the actor ------------------------------------------------------------------------
    async def run(self, on_window: Callable[[WindowReport], bool]) -> None:
        """Serve until ``on_window(report)`` returns True (checked after every window, before
        the broadcast that opens the next one)."""
        # The pacer starts before anything can be received: a restarted server's clients
        # resend while it broadcasts, and a restart after that dropped what it had deferred
        # (a stranger: 12 paid-for updates never judged).
        self.pacer.restart(self.clock.now(), full=self.windows_closed > 0)
        receiver = asyncio.create_task(self._receive_forever(), name="server-receive")
        async with helper_tasks([receiver]):
            await self.broadcast()
            # Window k ends at start + k W; a restored server continues its count.
            start = self._origin = self.clock.now() - self.windows_closed * self.window
            while True:
                # Sleep to the absolute window end so that rounding never accumulates.
                await self.clock.sleep(
                    start + (self.windows_closed + 1) * self.window - self.clock.now()
                )
                if self.aggregators:
                    await self.partials.gather(self.clock, self.endpoint,
                                               self.windows_closed + 1, self.version)
                if self.policy.on_arrival:
                    await self._release_waiting()
                report = self.close_window()
                report.end = start + self.windows_closed * self.window
                finished = on_window(report)  # first: a deployed endpoint then ends the run
                # No update is applied after the last window, while the end is announced.
                self.ended = finished
                # Under invitations every window opens with its own (the model rides along).
                if report.window % self.broadcast_every == 0 or self.participation < 1.0:
                    await self.broadcast()
                if finished:
                    return
