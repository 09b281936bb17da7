"""The server actor (van Dijk & Nguyen, sec. 3): time windows, de-duplication, staleness, mixing,
diminishing step sizes, evaluation and broadcast.

At time 0 it broadcasts version 0. Then, for window k = 1, 2, ... it collects every message
that arrives in ``((k-1) W, k W]`` and at ``k W``:

1. classifies each update, in arrival order: **rejected** (logged with its reason, counted by
   kind in ``WindowReport.rejections``) if the sender is unknown, its vector has the wrong
   length, its round is beyond the client's round limit or implausibly far ahead of what the
   server knows of it (:data:`~fedsim.runtime.integrity.MAX_ROUND_GAP`; such a round never
   enters the de-duplication table), its ``base_version`` is ahead of the server's, or its
   norm exceeds what clipping plus the client's noise can produce
   (:func:`~fedsim.runtime.integrity.update_norm_bound`); **duplicate** (logged) if
   ``(client_id, round)`` was seen before (in any window: at-least-once delivery must never
   double-apply); **stale** if ``version - base_version`` exceeds ``max_staleness``;
   **rejected** if the server invites (``participation < 1``) and never invited the client to
   the window the update names; otherwise **applied**;
2. mixes the applied updates (:func:`fedsim.aggregation.mix`) with the window's server step
   size, weights normalised over the window or over the whole population (``normalize``),
   and checks the result (:func:`~fedsim.runtime.integrity.check_model`: finite, bounded, no
   further than the accepted updates allow) before it replaces the model; the version goes up
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
message that opens it (a bitmap over the sorted client ids, :mod:`fedsim.runtime.exposure`),
broadcasting every window; clients train only under an invitation that names them, so an
uninvited client neither computes nor spends, and every update of an invited round is applied
(subject to staleness) whenever it arrives: nothing is rejected after its client paid for it.

Everything here is post-processing of released updates: it costs the clients no privacy.
The actor sees only a :class:`~fedsim.clock.Clock` and an
:class:`~fedsim.transports.base.Endpoint`, so it runs unchanged over MQTT.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Literal

import numpy as np
import structlog

from fedsim.aggregation import (
    AcceptedUpdate,
    MixingStrategy,
    StepSizeSchedule,
    mix,
    population_weight,
)
from fedsim.clock import Clock
from fedsim.config.schema import Stop
from fedsim.errors import ConfigError
from fedsim.protocol.messages import ClientStatus, ClientUpdate, GlobalModel
from fedsim.runtime.exposure import invitation_bits
from fedsim.runtime.integrity import (
    MAX_ROUND_GAP,
    ClientLimits,
    Rejections,
    bad_model,
    check_model,
    update_norm,
)
from fedsim.runtime.tasks import helper_tasks
from fedsim.transports.base import Endpoint

__all__ = ["ClientInfo", "ServerActor", "ServerSnapshot", "WindowReport"]

_log = structlog.get_logger("fedsim.runtime.server")


@dataclass(frozen=True)
class ClientInfo:
    """What the server knows about a client in advance (from the scenario)."""

    num_samples: int  # the declared (public) size, never a size the client sent
    step_size: float  # the client's agreed local step size eta_i
    weight: float = 1.0
    limits: ClientLimits | None = None  # its DP posture, to bound its updates (integrity)


@dataclass
class WindowReport:
    """What happened in one window (one line of ``metrics.jsonl``, before the runtime adds
    network and ledger columns)."""

    window: int
    time: float
    version: int
    received: int = 0
    applied: int = 0
    stale: int = 0
    duplicate: int = 0
    rejected: int = 0
    step_size: float = 0.0
    accuracy: float | None = None
    loss: float | None = None
    rejections: dict[str, int] = field(default_factory=dict)
    """Rejected updates and statuses by kind (``rejected`` counts the updates among them)."""
    applied_updates: list[tuple[str, int, int]] = field(default_factory=list)
    """(client_id, round, base_version) of each applied update; the version before applying
    was ``version - 1``."""
    end: float | None = None
    """The window's scheduled end on the server's timeline (``time`` is when it was closed:
    the same up to float rounding under virtual time, a little later on the wall clock)."""

    def metrics_line(self, *, rejected: int, dropped_in_flight: int, active_clients: int,
                     min_remaining_epsilon: float | None,
                     refused: Mapping[str, int] | None = None) -> dict[str, object]:
        """This window's ``metrics.jsonl`` object (the run-directory contract's keys, in order).

        The simulator and the deployed server both write it; they supply the columns only the
        runtime knows: rejections (including what the transport refused, by kind in
        ``refused``), messages lost in flight, clients still active and the lowest remaining
        budget. ``rejections`` counts every rejected message by kind."""
        kinds = dict(self.rejections)
        for kind, count in (refused or {}).items():
            if count:
                kinds[kind] = kinds.get(kind, 0) + count
        return {
            "window": self.window,
            "time": self.time,
            "version": self.version,
            "accuracy": self.accuracy,
            "loss": self.loss,
            "received": self.received,
            "applied": self.applied,
            "stale": self.stale,
            "duplicate": self.duplicate,
            "rejected": rejected,
            "dropped_in_flight": dropped_in_flight,
            "step_size": self.step_size,
            "active_clients": active_clients,
            "min_remaining_epsilon": min_remaining_epsilon,
            "rejections": dict(sorted(kinds.items())),
        }

    def stop_reason(self, stop: Stop, *, active_clients: int, in_flight: int = 0,
                    seconds: str = "virtual") -> str:
        """Why the run ends after this window under the scenario's ``stop`` conditions, in
        their order (windows, duration, target accuracy, all budgets spent); '' to go on.

        Shared by the simulator and the deployed server; ``seconds`` names their clock and
        ``in_flight`` counts updates the network still carries (0 where delivery is
        at-least-once end to end)."""
        if stop.windows is not None and self.window >= stop.windows:
            return f"it reached {stop.windows} windows"
        if stop.virtual_seconds is not None:
            reason = duration_stop(stop.virtual_seconds, self.window,
                                   self.time if self.end is None else self.end, seconds)
            if reason:
                return reason
        if (stop.target_accuracy is not None and self.accuracy is not None
                and self.accuracy >= stop.target_accuracy):
            return f"it reached the target accuracy {stop.target_accuracy:g}"
        if stop.all_budgets_spent and active_clients == 0 and self.received == 0 \
                and in_flight == 0:
            return "no client can train any more and every update has arrived"
        return ""


# Window ends are sums and products of floats: 300 windows of 0.1 s end at 29.99999999999996 s
# under virtual time. Ends this close to the limit count as reaching it.
DURATION_RELATIVE_TOLERANCE = 1e-9


def duration_stop(limit: float, window: int, end: float, seconds: str = "virtual") -> str:
    """The stop reason of a ``virtual_seconds`` limit after window ``window`` ending at ``end``
    ('' while ``end`` is before the limit): the run ends with the first window whose end is at
    or after the limit, and the reason says where that end was when it is not the limit."""
    tolerance = DURATION_RELATIVE_TOLERANCE * max(1.0, abs(limit))
    if end < limit - tolerance:
        return ""
    if end <= limit + tolerance:
        return f"it reached its limit of {limit:g} {seconds} seconds"
    return (f"window {window} ended at {end:.6g} {seconds} seconds, the first window end at or "
            f"after its limit of {limit:g} s")


Evaluator = Callable[[np.ndarray], tuple[float, float]]


@dataclass(frozen=True, eq=False)
class ServerSnapshot:
    """Everything a restarted server needs to continue where :meth:`ServerActor.snapshot` was
    taken: the model and its version, the de-duplication table, the window count and clock
    time, the step-size schedule's and participation generator's state, the last evaluation and
    the clients' last statuses. Updates waiting in the current window are not part of it."""

    params: np.ndarray
    version: int
    windows_closed: int
    time: float
    seen: frozenset[tuple[str, int]]
    step_size_state: dict[str, float | int]
    rng_state: dict[str, object]
    last_accuracy: float | None
    evaluated_version: int
    last_evaluation: tuple[float, float]
    statuses: dict[str, ClientStatus]
    incarnations: tuple[str, ...] = ()
    invitations: dict[int, frozenset[str]] = field(default_factory=dict)


class ServerActor:
    """Collects client updates per time window and publishes global models."""

    def __init__(
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
    ) -> None:
        if window <= 0:
            raise ConfigError(f"window must be > 0, got {window}")
        self.clock = clock
        self.endpoint = endpoint
        self.params = np.asarray(initial_params, dtype=np.float32).copy()
        self.version = 0
        self.clients = dict(clients)
        self.window = float(window)
        self.strategy = strategy
        self.step_size = step_size
        self.evaluate = evaluate
        self.eval_every = eval_every
        self.broadcast_every = broadcast_every
        self.max_staleness = max_staleness
        self.participation = participation
        self.rng = rng if rng is not None else np.random.default_rng(0)
        # "population": weights relative to every client's weight (a fixed weighing vector);
        # "window": a convex mix of what arrived in the window.
        self.total_weight = None if normalize == "window" else population_weight(
            strategy, [(cid, info.num_samples, info.weight) for cid, info in sorted(self.clients.items())])
        self.seen: set[tuple[str, int]] = set()
        # Per client: rounds in the de-duplication table and the highest of them.
        self._seen_count: dict[str, int] = {}
        self._highest_round: dict[str, int] = {}
        self.statuses: dict[str, ClientStatus] = {}
        self._status_rejections = Rejections()
        self.incarnations: tuple[str, ...] = ()
        """The run incarnations this server continues (its transport's, kept in snapshots)."""
        self.windows_closed = 0
        self.last_accuracy: float | None = None
        self._inbox: list[ClientUpdate] = []
        # window -> the clients invited to it (participation < 1), for the updates' check
        self.invitations: dict[int, frozenset[str]] = {}
        self._evaluated_version = -1
        self._last_evaluation: tuple[float, float] = (float("nan"), float("nan"))

    # -- receiving ------------------------------------------------------------------------
    async def _receive_forever(self) -> None:
        while True:
            message = await self.endpoint.receive()
            if isinstance(message, ClientUpdate):
                self._inbox.append(message)
            elif isinstance(message, ClientStatus):
                self.accept_status(message)
            else:
                _log.warning("server ignored a message", kind=type(message).__name__)

    # -- one window -----------------------------------------------------------------------
    def _invite(self, window: int) -> bytes | None:
        """Draw ``window``'s participants (None: everyone is invited) and remember them."""
        if self.participation >= 1.0:
            return None
        ids = sorted(self.clients)
        count = max(1, round(self.participation * len(ids)))
        chosen = frozenset(ids[i] for i in self.rng.choice(len(ids), size=count, replace=False))
        # A restarted server draws the open window again: both draws' invitees may train.
        self.invitations[window] = self.invitations.get(window, frozenset()) | chosen
        return invitation_bits(ids, chosen)

    def close_window(self) -> WindowReport:  # noqa: C901, PLR0915 - classify, mix, check, apply, in order
        """Classify, mix and apply what arrived since the last window; evaluate if due."""
        self.windows_closed += 1
        window = self.windows_closed
        arrived, self._inbox = self._inbox, []
        report = WindowReport(
            window=window, time=self.clock.now(), version=self.version, received=len(arrived)
        )
        rejections = Rejections()
        accepted: list[AcceptedUpdate] = []
        bounds: list[float | None] = []
        for update in arrived:
            info = self.clients.get(update.client_id)
            verdict = self._judge(update, info)
            if verdict == "duplicate":
                report.duplicate += 1
                _log.info("replayed update ignored", client=update.client_id,
                          round=update.round, base_version=update.base_version)
                continue
            if verdict:
                kind, reason = verdict.split(":", 1)
                rejections.add(kind)
                report.rejected += 1
                _log.warning("update rejected", client=update.client_id, round=update.round,
                             base_version=update.base_version, kind=kind, reason=reason)
                continue
            assert info is not None
            self._record_seen(update.client_id, update.round)
            self._contradicted_status(update)
            if (
                self.max_staleness is not None
                and self.version - update.base_version > self.max_staleness
            ):
                report.stale += 1
            elif (self.participation < 1.0
                  and update.client_id not in self.invitations.get(update.window, ())):
                _log.warning("update of a round the client was not invited to",
                             client=update.client_id, round=update.round, window=update.window)
                report.rejected += 1
                rejections.add("not_invited")
            else:
                accepted.append(
                    AcceptedUpdate(
                        update.client_id,
                        update.round,
                        update.delta,
                        info.num_samples,
                        info.step_size,
                        info.weight,
                    )
                )
                bounds.append(info.limits.norm_bound(update.round) if info.limits else None)
                report.applied_updates.append((update.client_id, update.round, update.base_version))
        report.applied = len(accepted)
        report.step_size = self.step_size.current(window)
        if accepted:
            with np.errstate(over="ignore"):  # an overflowing mix is refused just below
                mixed = mix(self.params, accepted, self.strategy, report.step_size,
                            total_weight=self.total_weight)
            problem = check_model(mixed, self.params, self._allowed_move(
                accepted, bounds, report.step_size))
            if problem:
                _log.error("mixed model refused; the window's updates are not applied",
                           window=window, reason=problem, updates=len(accepted))
                rejections.add("bad_mix", len(accepted))
                report.rejected += len(accepted)
                report.applied = 0
                report.applied_updates.clear()
            else:
                self.params = mixed
                self.version += 1
        for kind, count in self._status_rejections.counts.items():
            rejections.add(kind, count)
        self._status_rejections = Rejections()
        report.rejections = rejections.as_dict()
        report.version = self.version
        if self.evaluate is not None and window % self.eval_every == 0:
            if self.version != self._evaluated_version:
                self._last_evaluation = self.evaluate(self.params)
                self._evaluated_version = self.version
                # Only a changed model says anything about improvement: windows in which
                # nothing was applied must not shrink the step size.
                self.step_size.observe(self._last_evaluation[0])
            report.accuracy, report.loss = self._last_evaluation
            self.last_accuracy = report.accuracy
        return report

    def _judge(self, update: ClientUpdate, info: ClientInfo | None) -> str:  # noqa: PLR0911 - one return per rule
        """'' if the update may be classified further, 'duplicate', or 'kind:reason'."""
        if info is None:
            return "unknown_client:not a client of this scenario"
        if update.delta.shape != self.params.shape:
            return f"shape:{update.delta.size} values, the model has {self.params.size}"
        limits = info.limits
        if limits is not None and limits.max_rounds is not None and update.round >= limits.max_rounds:
            return f"round_ahead:round {update.round} beyond the client's {limits.max_rounds} rounds"
        known = max(self._highest_round.get(update.client_id, -1) + 1,
                    self._released(update.client_id))
        if update.round > known + MAX_ROUND_GAP:
            return (f"round_ahead:round {update.round} is more than {MAX_ROUND_GAP} ahead of "
                    f"the {known} rounds known")
        if (update.client_id, update.round) in self.seen:
            return "duplicate"
        if update.base_version > self.version:
            return f"future_version:base version {update.base_version} > server version {self.version}"
        norm = update_norm(update.delta)
        if not np.isfinite(norm):
            return "non_finite:the update is not finite"
        if limits is not None:
            bound = limits.norm_bound(update.round)
            if norm > bound:
                return f"norm:norm {norm:.4g} exceeds the bound {bound:.4g} for this client"
        return ""

    def _allowed_move(self, accepted: list[AcceptedUpdate], bounds: list[float | None],
                      step: float) -> float | None:
        """How far the mix of ``accepted`` may move the model: ``|s_t| sum_i lambda_i eta_i
        bound_i`` (None when a client's bound is unknown)."""
        known = [b for b in bounds if b is not None]
        if len(known) < len(bounds):
            return None
        raw = np.asarray(self.strategy.weights(accepted), dtype=np.float64)
        total = float(raw.sum()) if self.total_weight is None else float(self.total_weight)
        return abs(step) * sum(float(w) / total * abs(u.step_size) * b
                               for w, u, b in zip(raw, accepted, known, strict=True))

    def _record_seen(self, client_id: str, round_index: int) -> None:
        self.seen.add((client_id, round_index))
        self._seen_count[client_id] = self._seen_count.get(client_id, 0) + 1
        self._highest_round[client_id] = max(self._highest_round.get(client_id, -1), round_index)

    def _released(self, client_id: str) -> int:
        status = self.statuses.get(client_id)
        return status.rounds if status is not None else 0

    def _contradicted_status(self, update: ClientUpdate) -> None:
        status = self.statuses.get(update.client_id)
        if status is not None and status.state in ("done", "budget_exhausted") \
                and update.round >= status.rounds:
            del self.statuses[update.client_id]
            self._status_rejections.add("status_inconsistent")
            _log.warning("status rejected", client=update.client_id, kind="status_inconsistent",
                         reason=f"round {update.round} arrived after a {status.state!r} status "
                                f"claiming {status.rounds} rounds")

    def accept_status(self, status: ClientStatus) -> bool:
        """Keep ``status`` if it agrees with what the server saw; else log and count it."""
        info = self.clients.get(status.client_id)
        reason = ""
        kind = "status_inconsistent"
        seen = self._seen_count.get(status.client_id, 0)
        limits = info.limits if info is not None else None
        if info is None:
            kind, reason = "unknown_client", "not a client of this scenario"
        elif status.rounds < seen:
            reason = f"claims {status.rounds} rounds released, the server received {seen}"
        elif limits is not None and limits.max_rounds is not None and status.rounds > limits.max_rounds:
            reason = f"claims {status.rounds} rounds, its limit is {limits.max_rounds}"
        elif status.state == "done" and limits is not None and (
                limits.max_rounds is None or status.rounds != limits.max_rounds):
            reason = f"'done' after {status.rounds} rounds, its limit is {limits.max_rounds}"
        if reason:
            self._status_rejections.add(kind)
            _log.warning("status rejected", client=status.client_id, state=status.state,
                         rounds=status.rounds, kind=kind, reason=reason)
            return False
        self.statuses[status.client_id] = status
        return True

    def missing_updates(self) -> int:
        """Updates the clients released (by their statuses and round numbers) that never
        reached this server's de-duplication table (lost, or still in flight)."""
        missing = 0
        for client_id in self.clients:
            released = max(self._highest_round.get(client_id, -1) + 1, self._released(client_id))
            missing += max(0, released - self._seen_count.get(client_id, 0))
        return missing

    async def broadcast(self) -> None:
        """Publish the model; it opens the next window and carries that window's invitation."""
        window = self.windows_closed + 1
        invited = self._invite(window)
        await self.endpoint.publish(GlobalModel(self.version, self.params.copy(), self.clock.now(),
                                                window, invited))

    # -- checkpoints ----------------------------------------------------------------------
    def snapshot(self) -> ServerSnapshot:
        """The server's state between windows (see :class:`ServerSnapshot`)."""
        return ServerSnapshot(
            params=self.params.copy(),
            version=self.version,
            windows_closed=self.windows_closed,
            time=self.clock.now(),
            seen=frozenset(self.seen),
            step_size_state=self.step_size.state_dict(),
            rng_state=dict(self.rng.bit_generator.state),
            last_accuracy=self.last_accuracy,
            evaluated_version=self._evaluated_version,
            last_evaluation=self._last_evaluation,
            statuses=dict(self.statuses),
            incarnations=self.incarnations,
            invitations=dict(self.invitations),
        )

    def restore(self, snapshot: ServerSnapshot) -> None:
        """Continue from ``snapshot`` (call before :meth:`run`): the version never goes back and
        an update applied before the snapshot is never applied again."""
        if snapshot.params.shape != self.params.shape:
            raise ConfigError(
                f"snapshot has {snapshot.params.size} parameters, the model {self.params.size}"
            )
        problem = bad_model(np.asarray(snapshot.params), self.params.size)
        if problem:
            raise ConfigError(f"snapshot's model is unusable: {problem}")
        self.params = np.asarray(snapshot.params, dtype=np.float32).copy()
        self.version = snapshot.version
        self.windows_closed = snapshot.windows_closed
        self.seen = set()
        self._seen_count, self._highest_round = {}, {}
        for client_id, round_index in sorted(snapshot.seen):
            self._record_seen(client_id, round_index)
        self.incarnations = tuple(snapshot.incarnations)
        self.step_size.load_state_dict(snapshot.step_size_state)
        self.rng.bit_generator.state = snapshot.rng_state
        self.last_accuracy = snapshot.last_accuracy
        self._evaluated_version = snapshot.evaluated_version
        self._last_evaluation = snapshot.last_evaluation
        self.statuses = dict(snapshot.statuses)
        self.invitations = dict(snapshot.invitations)

    def renew_version(self) -> None:
        """Give the current model a new version (after a restart from a snapshot).

        Clients that sent an update on the restored version wait for a newer model; if those
        updates died with the crashed server's open window, nothing newer would ever come. The
        re-published model is unchanged, so its evaluation (and the step-size schedule) is
        carried over rather than counted again."""
        self.version += 1
        if self._evaluated_version == self.version - 1:
            self._evaluated_version = self.version

    # -- the actor ------------------------------------------------------------------------
    async def run(self, on_window: Callable[[WindowReport], bool]) -> None:
        """Serve until ``on_window(report)`` returns True (checked after every window)."""
        receiver = asyncio.create_task(self._receive_forever(), name="server-receive")
        async with helper_tasks([receiver]):
            await self.broadcast()
            # Window k ends at start + k W; a restored server continues its count.
            start = self.clock.now() - self.windows_closed * self.window
            while True:
                # Sleep to the absolute window end so that rounding never accumulates.
                await self.clock.sleep(
                    start + (self.windows_closed + 1) * self.window - self.clock.now()
                )
                report = self.close_window()
                report.end = start + self.windows_closed * self.window
                # Under invitations every window opens with its own (the model rides along).
                if report.window % self.broadcast_every == 0 or self.participation < 1.0:
                    await self.broadcast()
                if on_window(report):
                    return
