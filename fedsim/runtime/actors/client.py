"""The client actor (van Dijk & Nguyen, Alg. 1): local DP-SGD rounds, interrupt-style model overwrite,
staleness wait, and a durable privacy ledger that is charged before every release.

A client holds a local model ``w`` and the last global model it accepted (``held_version``).

* **Receiving** (a concurrent task, the paper's "interrupt service routine"): a
  :class:`GlobalModel` newer than ``held_version`` overwrites ``w`` *at once*, also in the
  middle of a round; an older or equal version is ignored.
* **A round** ``r``:

  0. when the server invites (``server.participation < 1``), wait until the latest
     invitation names this client: an uninvited client neither trains nor spends;
  1. if the staleness policy says the held model is too old (``max_versions_behind`` local
     rounds applied since the last global) or too far (``max_distance`` between ``w`` and the
     held global), wait for a newer global model;
  2. ask the ledger whether the round's planned privacy events fit the budget (a dry run);
     if not, stop for good with state ``budget_exhausted`` and say so in a status message
     (with a round limit the actor registers all its remaining rounds with the ledger's
     ``plan`` once at start, so these checks are exact and cheap);
  3. snapshot ``w``, begin the round on it (its batches and noise are drawn now), let its
     compute time pass: ``await clock.sleep(seconds_per_sample * expected_sample_gradients)``
     (public values: the realised Poisson batch size is private, see
     :mod:`fedsim.runtime.actors.exposure`), and take its update (computed by then, or now: under
     virtual time the rounds of clients that overlap are computed together, see
     :mod:`fedsim.training.batched`); on a wall clock the real compute runs inside that time
     and the release waits for the public schedule;
  4. commit the events to the ledger (durable, fsynced) and only then publish the update
     ``(client, r, base_version, Ubar/m)`` - the ledger is charged even if the network then
     drops the message; with the group's ``compression`` the codec sends a sparsified or
     quantised ``Ubar/m`` (post-processing of the noisy update, :mod:`fedsim.protocol.compression`),
     while the local step below uses the full update, which the client holds anyway;
  5. apply the update locally: ``w <- w - eta * Ubar/m`` with ``eta = eta_i(r) s_t / s_0``
     when following the server step (:meth:`ClientActor.local_step`); not made when the
     round brings the client to its ``max_versions_behind``, since a newer global model
     overwrites ``w`` before anything reads it (:meth:`ClientActor._step_locally`).

**A global model arriving mid-round** (``interrupt``, per client group). Van Dijk & Nguyen's interrupt
service routine "will replace the locally kept model w by a received global model w-hat. This
may happen in the middle of a round", and "each gradient is computed based on w which is the
last received global model from the server through the interrupt service routine": earlier
updates "can participate in the current computation of a round update U through its dependency
on the global model w-hat (through the gradients in U)".

* ``switch`` (the default, the paper's rule): the gradients of the round not yet computed when
  w-hat arrives are computed at w-hat. The round's batch and noise are those it began with and
  stay; the arrival's fraction of the round's compute time splits the round
  (:meth:`~fedsim.training.rounds.PendingRound.switch`; which gradient is due when is a fixed
  function of the record, never of the rest of the batch, see :mod:`fedsim.training.rounds`).
  Deterministic under virtual time: the split points are the arrival times.
* ``snapshot``: every gradient of the round is computed at the ``w`` the round began on.

Either way the overwrite replaces ``w`` at once, the finished update is applied on top of the
*new* global model and sent tagged with the version the round began on, so the server's
staleness policy judges it; the round is never restarted (that would starve a client slower
than the broadcast rate). **Privacy is the same under both rules**: w-hat is post-processing of
released updates, and each a_h still depends on one example (at w or w-hat), so U's sensitivity
(C or 2C) and the round's privacy events are unchanged. On a wall clock
(``pad_release``) a ``switch`` round is computed paced, a part (an eighth of a local step, or
more) at a time as its slot passes, and a w-hat splits it from the next part, which no part
computed yet holds
(:mod:`~fedsim.runtime.actors.round_timing`), so its result is ready by its public release
time and nothing of it is computed twice.

**The end of the run.** A :class:`RunFinished` from the server stops the client at once: a round
begun but not yet charged is cancelled (nothing charged, nothing released), no further round
starts, and the final status says the server finished. A round already charged is released
first (charging and releasing are one step that is never interrupted).

The actor sees a :class:`~fedsim.clock.Clock` and an
:class:`~fedsim.transports.base.Endpoint` only; it is cancelled (crash) or paused (offline)
from outside. After a crash a new actor resumes from the ledger file: round numbers continue
after the last committed round, so ``(client, round)`` stays unique for de-duplication.
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal, Protocol

import numpy as np

from fedsim.clock import Clock
from fedsim.config.compression import Compression
from fedsim.errors import BudgetExhausted, ConfigError, TransportError
from fedsim.logging import client_event_level, get_logger
from fedsim.privacy.events import GaussianStep
from fedsim.protocol.messages import (
    ClientState,
    ClientStatus,
    ClientUpdate,
    GlobalModel,
    RunFinished,
)
from fedsim.protocol.norms import given_up_norm, scratch
from fedsim.runtime.actors.exposure import ClientExposure, is_invited
from fedsim.runtime.actors.flag import Flag
from fedsim.runtime.actors.integrity import bad_model
from fedsim.runtime.actors.releases import Releases, RoundRecord
from fedsim.runtime.actors.round_timing import BegunRound, RoundTiming
from fedsim.runtime.actors.stops import ClientStopKind, budget_stop_reason
from fedsim.runtime.actors.tasks import helper_tasks
from fedsim.training.local_step import apply_local_step
from fedsim.transports.base import Endpoint

if TYPE_CHECKING:  # the actor never imports torch itself
    from fedsim.training.rounds import RoundResult

__all__ = ["ClientActor", "Ledger", "StalenessPolicy", "Trainer"]

_log = get_logger("fedsim.runtime.actors.client")


class Trainer(Protocol):
    """What a client needs from :class:`fedsim.training.LocalTrainer`."""

    def planned_steps(self, round_index: int) -> list[GaussianStep]: ...

    def begin_round(self, params: np.ndarray, round_index: int) -> BegunRound: ...


class Ledger(Protocol):
    """What a client needs from :class:`fedsim.privacy.ledger.PrivacyLedger`."""

    def can_spend(self, steps: Sequence[GaussianStep]) -> bool: ...

    def spend(self, steps: Sequence[GaussianStep], *, time: float, round: int) -> object: ...

    def plan(self, future_rounds: Sequence[Sequence[GaussianStep]]) -> int: ...


@dataclass(frozen=True)
class StalenessPolicy:
    """When to wait for a fresh global model before a round (None disables a rule)."""

    max_versions_behind: int | None = None
    max_distance: float | None = None


def _difference(w: np.ndarray, w0: np.ndarray) -> np.ndarray:
    """``w - w0`` (float32 vectors of one size) in this thread's reused buffer, valid until
    its next call: a fresh 400 KB difference before every round of a distance-limited client
    was memory the allocator handed out cold (1.7% of a 10^4-client run)."""
    if w.dtype != np.float32 or w0.dtype != np.float32 or w.shape != w0.shape or w.ndim != 1:
        return w - w0
    return np.subtract(w, w0, out=scratch(w.size, np.float32))


class ClientActor:
    """One client: see the module docstring for the round and the overwrite semantics."""

    # A client's state in slots, not a dict (issue 24 item 5: 10^6 clients in one process).
    __slots__ = (
        "_arrival", "_interrupted", "_interruptible", "_release_moved", "_round", "_task",
        "batch_size", "client_id", "clock", "compression",
        "endpoint", "expected_sample_grads", "exposure", "finished", "first_server_step",
        "follow_server_step", "held_global", "held_version", "ignored_globals", "interrupt",
        "invitation_window", "invited", "ledger", "local_lr", "max_rounds", "next_round",
        "online", "randomness", "releases", "rounds_since_global", "seconds_per_sample",
        "server_step", "skipped_invitations", "staleness", "state", "status_epsilon",
        "step_sequence", "stop_kind", "stop_reason", "stopped_at", "switched_rounds",
        "late_models", "split_delays", "timing_overruns", "trainer", "w",
    )

    def __init__(  # noqa: PLR0913, PLR0915 - keyword-only, one per client setting; its counters
        self,
        client_id: str,
        *,
        clock: Clock,
        endpoint: Endpoint,
        trainer: Trainer,
        ledger: Ledger,
        local_lr: float | Callable[[int], float],
        batch_size: float,
        seconds_per_sample: Callable[[], float],
        staleness: StalenessPolicy = StalenessPolicy(),
        max_rounds: int | None = None,
        first_round: int = 0,
        status_epsilon: Callable[[], tuple[float, float]] | None = None,
        expected_sample_grads: float | None = None,
        exposure: ClientExposure = ClientExposure(),
        interrupt: Literal["switch", "snapshot"] = "switch",
        first_server_step: float | None = 1.0,
        compression: Compression | None = None,
        releases: Releases | None = None,
    ) -> None:
        self.client_id = client_id
        self.clock = clock
        self.endpoint = endpoint
        self.trainer = trainer
        self.ledger = ledger
        # eta_i(r): a constant or the sequence agreed with the server, times s_t / s_0 (the
        # server step size the latest global model carried over s_0 = first_server_step, the
        # schedule's first value) when following it (first_server_step None: not following).
        self.step_sequence = local_lr if callable(local_lr) else None
        self.local_lr = float(local_lr(0)) if callable(local_lr) else float(local_lr)
        self.follow_server_step = first_server_step is not None
        first = 1.0 if first_server_step is None else first_server_step
        if not (math.isfinite(first) and first > 0):
            raise ConfigError(f"first_server_step must be finite and > 0, got {first!r}")
        self.first_server_step = self.server_step = float(first)
        self.batch_size = float(batch_size)
        # Public: the expected per-example gradients of a round (local_steps * m).
        self.expected_sample_grads = (
            float(batch_size) if expected_sample_grads is None else float(expected_sample_grads)
        )
        self.exposure = exposure
        self.interrupt = interrupt
        self.compression = compression
        self.switched_rounds = 0  # rounds a w-hat split (interrupt = switch)
        self._round: RoundTiming | None = None  # the round in progress, for a switch
        self._release_moved = False  # a split moved the last padded release a slot on
        self.randomness = exposure.randomness
        self.timing_overruns = 0
        self.split_delays = 0  # padded releases a w-hat moved to a later slot (deployed)
        self.late_models = 0  # w-hats that came mid-round after a paced round's last part began
        self.invitation_window = 0  # the latest invitation seen (window it opens)
        self.invited = exposure.invitation_index is None
        self.skipped_invitations = 0
        self.seconds_per_sample = seconds_per_sample
        self.staleness = staleness
        self.max_rounds = max_rounds
        self.next_round = first_round
        self.status_epsilon = status_epsilon
        self.state: ClientState = "waiting"
        self.stop_reason = ""
        self.stop_kind: ClientStopKind | None = None
        self.stopped_at: float | None = None
        self.w: np.ndarray | None = None
        self.held_global: np.ndarray | None = None
        self.held_version = -1
        self.rounds_since_global = 0
        self.ignored_globals = 0
        # The released rounds' sums (bounded); a Releases with ``kept`` lists them too.
        self.releases = Releases() if releases is None else releases
        self.online = Flag()
        self.online.set()
        self._arrival = Flag()
        self.finished: RunFinished | None = None  # the server's end of the run, once received
        self._task: asyncio.Task[object] | None = None
        self._interruptible = False  # False from charging a round until it is released
        self._interrupted = False

    def set_online(self, online: bool) -> None:
        """Pause (False) or resume (True) training: a paused client starts no new round."""
        if online:
            self.online.set()
        else:
            self.online.clear()

    # -- the interrupt service routine ------------------------------------------------------
    def accept_invitation(self, message: GlobalModel) -> None:
        """Take the latest window's invitation (a global model opening a later window)."""
        index = self.exposure.invitation_index
        if index is None or message.window <= self.invitation_window:
            return
        self.invitation_window = message.window
        self.invited = is_invited(message.invited, index)
        if not self.invited:
            self.skipped_invitations += 1
        arrived, self._arrival = self._arrival, Flag()
        arrived.set()

    def accept_global(self, message: GlobalModel) -> bool:
        """Overwrite ``w`` with a newer global model at once; ignore older or equal versions,
        and skip (and log) one that is not finite or not bounded (:func:`bad_model`)."""
        self.accept_invitation(message)
        if message.version <= self.held_version:
            self.ignored_globals += 1
            return False
        problem = bad_model(message.params, None if self.w is None else self.w.size)
        if problem:
            self.ignored_globals += 1
            _log.warning("bad global model skipped", client=self.client_id,
                         version=message.version, reason=problem)
            return False
        self.held_version = message.version
        if self.follow_server_step:
            self.server_step = float(message.step_size)
        # No copies: a received model is never modified (the first local step after it makes
        # a new array), so the local model shares the received, read-only buffer until it moves.
        self.held_global = np.asarray(message.params, dtype=np.float32)
        self.w = self.held_global
        self.rounds_since_global = 0
        if self._round is not None and self.interrupt == "switch":
            self._switch(self._round)
        arrived, self._arrival = self._arrival, Flag()
        arrived.set()
        return True

    def accept_finished(self, message: RunFinished) -> None:
        """The server finished the run: cancel the round in progress unless it is already
        charged (it is then released first), and start no other (see the module docstring)."""
        if self.finished is not None:
            return
        self.finished = message
        if self._interruptible and self._task is not None:
            self._interrupted = True
            self._task.cancel()

    def local_step(self, round_index: int) -> float:
        """The step of round ``round_index``'s local update: ``eta_i(r)``, times ``s_t / s_0``
        when following the server (``first_server_step`` given, not None).

        ``s_t`` is the server step size the latest global model carried and ``s_0`` the server
        schedule's value for the first window (``first_server_step``, known to every client from
        the public scenario). Van Dijk & Nguyen's server "broadcasts the new step sizes": a
        client starts at exactly its agreed ``eta_i(r)`` and follows the server's reductions
        (a plateau reduction by 0.9 gives ``0.9 eta_i(r)``); the server's own scale ``s_0``
        (e.g. a plateau starting at 2.0) is the server's, and is not applied to local steps."""
        eta = self.local_lr if self.step_sequence is None else float(self.step_sequence(round_index))
        if not self.follow_server_step:
            return eta
        return eta * (self.server_step / self.first_server_step)

    @property
    def split_deadline(self) -> float | None:
        """When the round in compute ends, if a global model arriving before then splits it
        (``interrupt = switch``); None otherwise. The runtime's own record of the round: the
        virtual-time runtime asks it which pending rounds its batcher must keep."""
        if self._round is None or self.interrupt != "switch":
            return None
        return self._round.end

    def _switch(self, timing: RoundTiming) -> None:
        """The interrupt rule ``switch``: the rest of the round in progress at the new w."""
        assert self.w is not None
        now = self.clock.now()
        if timing.split(now, self.w):
            self.switched_rounds += 1
        elif timing.points and now < timing.end:
            # Deployed and paced: the round's parts are all begun, so this w-hat is the next
            # round's, where a simulated client would have split the round at it.
            self.late_models += 1

    async def _receive_forever(self) -> None:
        while True:
            try:
                message = await self.endpoint.receive()
            except TransportError:
                return  # endpoint closed
            if isinstance(message, GlobalModel):
                self.accept_global(message)
            elif isinstance(message, RunFinished):
                self.accept_finished(message)

    async def _wait_for_newer(self, version: int) -> None:
        while self.held_version <= version:
            await self._arrival.wait()

    async def _wait_for_invitation(self) -> None:
        window = self.invitation_window
        while self.invitation_window <= window:
            await self._arrival.wait()

    # -- staleness ----------------------------------------------------------------------------
    def _rounds_behind(self) -> bool:
        """The staleness rule's count: ``max_versions_behind`` local rounds since the last
        global model. While it holds, the client trains no more until a newer global model
        has overwritten ``w`` (:meth:`too_stale` asks it first)."""
        behind = self.staleness.max_versions_behind
        return behind is not None and self.rounds_since_global >= behind

    def too_stale(self) -> str | None:
        """Why the held model is too stale to train on, or None."""
        policy = self.staleness
        if self._rounds_behind():
            return f"{self.rounds_since_global} local rounds since the last global model"
        if (policy.max_distance is not None and self.w is not None
                and self.held_global is not None and self.w is not self.held_global):
            # (w is the held global itself until a local round moves it: distance 0.)
            # einsum, not BLAS (np.linalg.norm): BLAS threads spin on a shared machine and made
            # this check cost more than a training round. Its vectorised float32 dot is twice
            # as fast as a float64 sum of squares and accurate to ~1e-7 here.
            moved = _difference(self.w, self.held_global)
            distance = math.sqrt(max(float(np.einsum("i,i->", moved, moved)), 0.0))
            if distance > policy.max_distance:
                return f"distance {distance:.4g} from the last global model"
        return None

    # -- the actor ----------------------------------------------------------------------------
    async def _stop(self, state: ClientState, kind: ClientStopKind, reason: str) -> None:
        self._interruptible = False
        self.state = state
        self.stop_kind = kind
        self.stop_reason = reason
        self.stopped_at = self.clock.now()
        _log.log(client_event_level(), "client stopped", client=self.client_id, state=state,
                 reason=reason, time=self.stopped_at)
        epsilon, delta = self.status_epsilon() if self.status_epsilon else (math.nan, math.nan)
        try:
            # Rounds are numbered from 0 across restarts: next_round is every round released.
            await self.endpoint.publish(ClientStatus(
                self.client_id, state, self.next_round, epsilon, delta, reason, self.clock.now()))
        except TransportError:
            pass  # the status is informative only

    async def run(self) -> None:
        """Train until the budget, the round limit or cancellation (a crash) stops the client."""
        self._task = task = asyncio.current_task()
        self._interruptible = True
        receiver = asyncio.create_task(self._receive_forever(), name=f"{self.client_id}-receive")
        async with helper_tasks([receiver]):
            try:
                await self._rounds()
            except asyncio.CancelledError:
                # Only the end of the run is caught here; a crash (another cancel) goes on.
                if not self._interrupted or task is None or task.uncancel() > 0:
                    raise
                await self._stop("done", ClientStopKind.SERVER_FINISHED, self._finished_reason())

    def _finished_reason(self) -> str:
        assert self.finished is not None
        return (f"the server finished the run at version {self.finished.version} "
                f"({self.finished.reason})")

    def _end_before_round(self) -> tuple[ClientStopKind, str] | None:
        """Why the client is done before its next round (the server finished the run, or the
        round limit is reached), or None."""
        if self.finished is not None:
            return ClientStopKind.SERVER_FINISHED, self._finished_reason()
        if self.max_rounds is not None and self.next_round >= self.max_rounds:
            return ClientStopKind.DONE, f"finished its {self.max_rounds} rounds"
        return None

    async def _rounds(self) -> None:  # noqa: C901, PLR0915 - one branch per way a round can end
        self.state = "waiting"
        if self.max_rounds is not None and self.next_round < self.max_rounds:
            # The rounds left to this client, known up front: the ledger then answers its
            # per-round budget checks by counting instead of re-running the accountant (exact;
            # see PrivacyLedger.plan), which matters when sigma_t changes every round.
            self.ledger.plan([self.trainer.planned_steps(r)
                              for r in range(self.next_round, self.max_rounds)])
        await self._wait_for_newer(-1)
        while True:
            self._interruptible = True
            if (end := self._end_before_round()) is not None:
                await self._stop("done", *end)
                return
            if not self.online.is_set():
                self.state = "offline"
                await self.online.wait()
            if not self.invited:  # not a participant of this window: neither train nor spend
                self.state = "waiting"
                await self._wait_for_invitation()
                continue
            if self.too_stale():
                self.state = "waiting"
                await self._wait_for_newer(self.held_version)
                continue
            round_index = self.next_round
            planned = self.trainer.planned_steps(round_index)
            if not self.ledger.can_spend(planned):
                await self._stop("budget_exhausted", ClientStopKind.BUDGET,
                                 budget_stop_reason(round_index))
                return
            self.state = "training"
            assert self.w is not None
            # The round's snapshot: self.w is rebound, or changed in place only by a local
            # step after the round that read it is over, and the trainer only reads it (a
            # received global model is a read-only view of the message).
            base = self.w
            base_version, window = self.held_version, self.invitation_window
            pending = self.trainer.begin_round(base, round_index)
            # The round's compute time passes; a global model may arrive meanwhile and
            # overwrite self.w (the round continues on its snapshot, see docstring).
            try:
                result = await self._compute(pending, round_index)
            except asyncio.CancelledError:
                pending.cancel()  # crashed mid-round: nothing was released
                raise
            # (A zero update, training replaced by its cost, is finite: no pass over it.) The
            # update is given up here: the codec takes this norm as its own finiteness check.
            if not result.zero_update and not math.isfinite(given_up_norm(result.update)):
                # Nothing is charged for a round that is not released.
                _log.warning("round produced a non-finite update; not released",
                             client=self.client_id, round=round_index)
                self.state = "waiting"
                del result, pending, base  # nor its kept sums while it waits (up to 64 MB)
                await self._wait_for_newer(self.held_version)
                continue
            self._interruptible = False  # from the charge to the release, in one step
            try:
                self.ledger.spend(result.steps, time=self.clock.now(), round=round_index)
            except BudgetExhausted as exc:
                await self._stop("budget_exhausted", ClientStopKind.BUDGET,
                                 budget_stop_reason(round_index, str(exc)))
                return
            self.next_round = round_index + 1
            self.releases.add(RoundRecord(round_index, self.clock.now(), base_version,
                                             result.sample_grads, result.clip, result.sigma,
                                             window))
            await self.endpoint.publish(ClientUpdate(
                self.client_id, round_index, base_version, result.update, self.batch_size,
                self.clock.now(), window, compression=self.compression))
            if self._release_moved:
                self.split_delays += 1  # a padded release a split moved a slot on (RoundTiming)
            self._step_locally(result, round_index)
            # The round's vectors (its update, its snapshot) are not kept while the client
            # waits for its next round: at 10^4 clients each kept one costs 4 GB.
            del result, pending, base

    def _step_locally(self, result: RoundResult, round_index: int) -> None:
        """``w <- w - eta * u``: into a new array when ``w`` is a received model (shared with
        the message, never written), in place when it is the client's own (an earlier local
        step's: the round that read it is over, and only this actor holds it; the same values,
        ``(-eta u) + w`` rounded once, without a fresh vector a round). A zero update leaves
        ``w`` the array it is (``w - eta * 0 == w`` exactly), still shared with the global.

        A step no one would read is not made: when this round brings the client to its
        staleness rule's count of local rounds (:meth:`_rounds_behind`), it trains no more
        until a newer global model has overwritten ``w``, and nothing reads ``w``'s values
        before (the distance rule is not asked then; a received model is checked against
        ``w``'s size only). In hetero-100 scaled to 1,000 clients, 30% of the rounds; each step
        streams three model-sized vectors, whose passage through the caches slowed the small
        calls of the rounds around it (docs/SCALE.md, session 66)."""
        self.rounds_since_global += 1
        if result.zero_update or self._rounds_behind():
            return
        assert self.w is not None  # a round starts from a held model
        # in place in the actor's own array (a local step made it), else a new one
        self.w = apply_local_step(self.w, result.update, self.local_step(round_index),
                                  in_place=self.w is not self.held_global)

    async def _compute(self, pending: BegunRound, round_index: int) -> RoundResult:
        """Let the round's compute time pass and take its result, on a public schedule.

        ``timing = public``: the time is the speed model's cost of the *expected* batch (a
        public value); with ``pad_release`` (a wall clock) the compute runs within it and the
        release waits for the schedule ``start + k * cost`` (:mod:`~fedsim.runtime.actors.
        round_timing`), so it does not depend on the realised batch unless the compute
        overruns its slot (counted). ``timing = realised``: the cost of the realised batch,
        waited before computing."""
        start = self.clock.now()
        per_sample = self.seconds_per_sample()
        realised = self.exposure.timing == "realised"
        slot = per_sample * (pending.sample_grads if realised else self.expected_sample_grads)
        self._round = timing = RoundTiming(pending, start, slot)
        self._release_moved = False
        try:
            if realised or not self.exposure.pad_release:
                await self.clock.sleep(slot)
                return pending.result()
            result = await timing.padded(self.clock, switch=self.interrupt == "switch",
                                         in_thread=self.exposure.compute_in_thread,
                                         min_part_seconds=self.exposure.min_part_seconds)
        finally:
            self._round = None
        self._release_moved = timing.moved
        if timing.overran:
            self.timing_overruns += 1
            (_log.warning if self.timing_overruns == 1 else _log.debug)(
                "round overran its public release slot", client=self.client_id,
                round=round_index, slot=slot, compute=timing.computed - start,
                released=timing.released - start)
        return result
