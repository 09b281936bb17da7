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
     :mod:`fedsim.runtime.exposure`), and take its update (computed by then, or now: under
     virtual time the rounds of clients that overlap are computed together, see
     :mod:`fedsim.training.batched`); on a wall clock the real compute runs inside that time
     and the release waits for the public schedule;
  4. commit the events to the ledger (durable, fsynced) and only then publish the update
     ``(client, r, base_version, Ubar/m)`` - the ledger is charged even if the network then
     drops the message;
  5. apply the update locally: ``w <- w - eta * Ubar/m``.

**A round in progress continues when a global model arrives mid-round.** Every gradient of the
round is computed at the single ``w`` the round started from (its snapshot) - van Dijk & Nguyen require
exactly this: "each gradient a_h is computed for the same w", since the sensitivity bound 2C
(or C) of U needs the per-example gradients not to influence each other. The overwrite replaces
``w`` immediately, so the finished update is applied on top of the *new* global model and the
next round starts from it; the update itself is still sent, tagged with the version it was
computed on, so the server's staleness policy judges it. Restarting instead would throw away a
finished computation and, whenever the server broadcasts more often than a slow client
finishes a round, starve that client for ever - against the paper's point that clients compute
at their own rate, independent of the broadcast rate. Not releasing the discarded work would
cost no privacy, but the starvation is the decisive argument.

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
from typing import TYPE_CHECKING, Protocol

import numpy as np
import structlog

from fedsim.clock import Clock
from fedsim.errors import BudgetExhausted, TransportError
from fedsim.logging import client_event_level
from fedsim.privacy.events import GaussianStep
from fedsim.protocol.messages import ClientState, ClientStatus, ClientUpdate, GlobalModel
from fedsim.runtime.exposure import ClientExposure, is_invited, release_time
from fedsim.runtime.integrity import bad_model
from fedsim.runtime.tasks import helper_tasks
from fedsim.transports.base import Endpoint

if TYPE_CHECKING:  # the actor never imports torch itself
    from fedsim.training.rounds import RoundResult

__all__ = ["ClientActor", "Ledger", "RoundRecord", "StalenessPolicy", "Trainer"]

_log = structlog.get_logger("fedsim.runtime.client")


class BegunRound(Protocol):
    """A begun round as the actor holds it (:class:`fedsim.training.rounds.PendingRound`, or
    :class:`~fedsim.training.rounds.DoneRound` when nothing is left to compute)."""

    sample_grads: int

    def result(self) -> RoundResult: ...

    def cancel(self) -> None: ...


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


@dataclass(frozen=True)
class RoundRecord:
    """One released round, for the runtime's bookkeeping (never sent anywhere)."""

    round: int
    time: float
    base_version: int
    sample_grads: int
    clip: float
    sigma: float
    window: int = 0  # the invitation it was begun under (0: the server invites everyone)


class ClientActor:
    """One client: see the module docstring for the round and the overwrite semantics."""

    def __init__(
        self,
        client_id: str,
        *,
        clock: Clock,
        endpoint: Endpoint,
        trainer: Trainer,
        ledger: Ledger,
        local_lr: float,
        batch_size: float,
        seconds_per_sample: Callable[[], float],
        staleness: StalenessPolicy = StalenessPolicy(),
        max_rounds: int | None = None,
        first_round: int = 0,
        status_epsilon: Callable[[], tuple[float, float]] | None = None,
        expected_sample_grads: float | None = None,
        exposure: ClientExposure = ClientExposure(),
    ) -> None:
        self.client_id = client_id
        self.clock = clock
        self.endpoint = endpoint
        self.trainer = trainer
        self.ledger = ledger
        self.local_lr = float(local_lr)
        self.batch_size = float(batch_size)
        # Public: the expected per-example gradients of a round (local_steps * m).
        self.expected_sample_grads = (
            float(batch_size) if expected_sample_grads is None else float(expected_sample_grads)
        )
        self.exposure = exposure
        self.randomness = exposure.randomness
        self.timing_overruns = 0
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
        self.stopped_at: float | None = None
        self.w: np.ndarray | None = None
        self.held_global: np.ndarray | None = None
        self.held_version = -1
        self.rounds_since_global = 0
        self.ignored_globals = 0
        self.released: list[RoundRecord] = []
        self.online = asyncio.Event()
        self.online.set()
        self._arrival = asyncio.Event()

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
        arrived, self._arrival = self._arrival, asyncio.Event()
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
        # No copies: w is never modified in place (every local step makes a new array), so the
        # local model may share the received, read-only parameter buffer until it moves.
        self.held_global = np.asarray(message.params, dtype=np.float32)
        self.w = self.held_global
        self.rounds_since_global = 0
        arrived, self._arrival = self._arrival, asyncio.Event()
        arrived.set()
        return True

    async def _receive_forever(self) -> None:
        while True:
            try:
                message = await self.endpoint.receive()
            except TransportError:
                return  # endpoint closed
            if isinstance(message, GlobalModel):
                self.accept_global(message)

    async def _wait_for_newer(self, version: int) -> None:
        while self.held_version <= version:
            await self._arrival.wait()

    async def _wait_for_invitation(self) -> None:
        window = self.invitation_window
        while self.invitation_window <= window:
            await self._arrival.wait()

    # -- staleness ----------------------------------------------------------------------------
    def too_stale(self) -> str | None:
        """Why the held model is too stale to train on, or None."""
        policy = self.staleness
        if policy.max_versions_behind is not None and self.rounds_since_global >= policy.max_versions_behind:
            return f"{self.rounds_since_global} local rounds since the last global model"
        if (policy.max_distance is not None and self.w is not None
                and self.held_global is not None and self.w is not self.held_global):
            # (w is the held global itself until a local round moves it: distance 0.)
            # einsum, not BLAS (np.linalg.norm): BLAS threads spin on a shared machine and made
            # this check cost more than a training round. Its vectorised float32 dot is twice
            # as fast as a float64 sum of squares and accurate to ~1e-7 here.
            moved = self.w - self.held_global
            distance = math.sqrt(max(float(np.einsum("i,i->", moved, moved)), 0.0))
            if distance > policy.max_distance:
                return f"distance {distance:.4g} from the last global model"
        return None

    # -- the actor ----------------------------------------------------------------------------
    async def _stop(self, state: ClientState, reason: str) -> None:
        self.state = state
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
        receiver = asyncio.create_task(self._receive_forever(), name=f"{self.client_id}-receive")
        async with helper_tasks([receiver]):
            await self._rounds()

    async def _rounds(self) -> None:  # noqa: C901 - one branch per way a round can end, in order
        self.state = "waiting"
        if self.max_rounds is not None and self.next_round < self.max_rounds:
            # The rounds left to this client, known up front: the ledger then answers its
            # per-round budget checks by counting instead of re-running the accountant (exact;
            # see PrivacyLedger.plan), which matters when sigma_t changes every round.
            self.ledger.plan([self.trainer.planned_steps(r)
                              for r in range(self.next_round, self.max_rounds)])
        await self._wait_for_newer(-1)
        while True:
            if self.max_rounds is not None and self.next_round >= self.max_rounds:
                await self._stop("done", f"finished its {self.max_rounds} rounds")
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
                await self._stop("budget_exhausted",
                                 f"round {round_index} would exceed its privacy budget")
                return
            self.state = "training"
            assert self.w is not None
            # The round's snapshot: self.w is rebound, never mutated, and the trainer only
            # reads it (a received global model is a read-only view of the message).
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
            if not np.isfinite(result.update).all():
                # Nothing is charged for a round that is not released.
                _log.warning("round produced a non-finite update; not released",
                             client=self.client_id, round=round_index)
                self.state = "waiting"
                await self._wait_for_newer(self.held_version)
                continue
            try:
                self.ledger.spend(result.steps, time=self.clock.now(), round=round_index)
            except BudgetExhausted as exc:
                await self._stop("budget_exhausted", str(exc))
                return
            self.next_round = round_index + 1
            self.released.append(RoundRecord(round_index, self.clock.now(), base_version,
                                             result.sample_grads, result.clip, result.sigma,
                                             window))
            await self.endpoint.publish(ClientUpdate(
                self.client_id, round_index, base_version, result.update, self.batch_size,
                self.clock.now(), window))
            self._step_locally(result)
            # The round's vectors (its update, its snapshot) are not kept while the client
            # waits for its next round: at 10^4 clients each kept one costs 4 GB.
            del result, pending, base

    def _step_locally(self, result: RoundResult) -> None:
        """``w <- w - eta * u`` into a new array (w is never mutated); a zero update leaves
        ``w`` the array it is (``w - eta * 0 == w`` exactly), still shared with the global."""
        if not result.zero_update:
            assert self.w is not None  # a round starts from a held model
            local = result.update * np.float32(-self.local_lr)
            local += self.w
            self.w = local
        self.rounds_since_global += 1

    async def _compute(self, pending: BegunRound, round_index: int) -> RoundResult:
        """Let the round's compute time pass and take its result, on a public schedule.

        ``timing = public``: the time is the speed model's cost of the *expected* batch (a
        public value); with ``pad_release`` (a wall clock) the real compute runs first and the
        release waits for the schedule ``start + k * cost`` (:func:`release_time`), so it does
        not depend on the realised batch unless the compute overruns its slot (counted).
        ``timing = realised``: the cost of the realised batch, waited before computing."""
        start = self.clock.now()
        per_sample = self.seconds_per_sample()
        if self.exposure.timing == "realised":
            await self.clock.sleep(per_sample * pending.sample_grads)
            return pending.result()
        slot = per_sample * self.expected_sample_grads
        if not self.exposure.pad_release:
            await self.clock.sleep(slot)
            return pending.result()
        result = pending.result()
        now = self.clock.now()
        release = release_time(start, slot, now)
        if release > start + slot or slot <= 0:
            self.timing_overruns += 1
            (_log.warning if self.timing_overruns == 1 else _log.debug)("round overran its public release slot", client=self.client_id,
                         round=round_index, slot=slot, compute=now - start, released=release - start)
        await self.clock.sleep(release - now)
        return result
