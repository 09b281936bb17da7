"""Per-client pacing of updates to their public compute slots (docs/SECURITY.md).

Every update of a client passes the norm bound of :mod:`fedsim.runtime.actors.integrity`, but a client
that sends its legal rounds back to back would otherwise be applied once per round: under the
on-arrival policies (FedAsync, FedBuff) each round moves the model separately, and under
``normalize: population`` each update gets the client's ``lambda_i``, so one client's flood
moved the model many bounds in one window (findings R4a, R4b). Two public facts bound an
honest client's rate:

* **its compute slot.** A round's release comes at least one public compute slot after the
  round began (``runtime/client.py`` ``_compute``: ``timing = public`` waits the speed model's
  cost of the *expected* batch, ``seconds_per_sample * expected_sample_grads``), and a client
  runs its rounds one after another, so its ``k``-th release comes at least ``k`` slots after
  the server's first model. :func:`public_round_seconds` is a lower bound of that slot from the
  scenario's speed distribution (exact for ``constant``, its ``low``/``minimum`` for
  ``uniform``/``shifted_exponential``, the ``1e-12`` lower quantile for ``lognormal``, a
  quarter of the mean for ``exponential`` (:data:`EXPONENTIAL_PACE`). Under ``timing:
  realised`` a round takes the cost of its realised batch: a fixed-size batch is the expected
  one, a Poisson batch is paced at a quarter of its expected cost (:data:`REALISED_PACE`;
  not with an ``exponential`` speed, whose two sources of randomness this does not bound).
* **its arrivals jitter.** Network delay, reordering, a broker outage or an outbox replay
  bunch honest updates: ``j`` slots of jitter bunch at most ``j + 1`` releases.

:class:`Pacer` is a token bucket per client (rate one token per slot, capacity
:data:`BURST` tokens, one token at the server's start: the first model needs a slot before an
honest round can arrive, so an honest client always has a token when its update arrives unless
its arrivals bunched by more than ``BURST - 1`` slots). An update that finds no token is
**deferred**, never dropped: it waits in the client's queue and is judged, in arrival order,
as soon as a token has accrued (at the next arrival of any update or the next window's end).
There is no "one update per client per FedBuff buffer" rule: with fewer than ``K`` clients
active (availability, dropouts, ``K`` above the population) it would stall the buffer for good,
and an honest fast client legitimately fills several places of one (Nguyen et al. 2022 buffer
any ``K`` updates); the rate already bounds how many places of the buffers a client takes, its
share of the updates. Only a client that has
:data:`MAX_DEFERRED` updates waiting has further ones refused (kind ``rate``): an honest client
has at most 256 unacknowledged updates in its outbox. So a flooding client gets its honest
share, ``1 + t / slot`` updates in ``t`` seconds plus one burst, however fast it sends; an
honest run, whose clients never outrun their slots, is unchanged. The bucket of a restarted
server starts full (its clients' outboxes replay what the crash left unacknowledged).

All of this uses public scenario values only; it costs the clients no privacy.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import dataclass, field
from statistics import NormalDist

from fedsim.config.distributions import (
    Constant,
    Exponential,
    LogNormal,
    ShiftedExponential,
    Uniform,
)
from fedsim.config.schema import ClientGroup
from fedsim.logging import get_logger
from fedsim.protocol.messages import ClientUpdate
from fedsim.runtime.actors.client_book import ClientBook, Kind
from fedsim.runtime.actors.exposure import group_sample_grads

__all__ = ["BURST", "EXPONENTIAL_PACE", "MAX_DEFERRED", "PASSED_KEPT", "REALISED_PACE", "Pacer",
           "RateSlot", "group_slot", "public_round_seconds"]

BURST = 16.0
"""Token-bucket capacity: an honest client's arrivals may bunch by up to ``BURST - 1`` slots
(network delay, reordering, an outage) without a single update waiting."""
MAX_DEFERRED = 256
"""Updates one client may have waiting for a token; further ones are refused (``rate``)."""
PASSED_KEPT = 1024
"""Rounds per client whose passing the pacer remembers: those among the ``PASSED_KEPT`` round
indices up to the highest that passed (a repeat of one is free: a network duplicate or a
resend, which the judge then counts as a duplicate); a repeat of an older one costs a token
like any update (an honest client resends only its 256 unacknowledged ones). One bit a round:
a bucket's memory does not grow with the run."""
_log = get_logger("fedsim.runtime.actors.admission")
EXPONENTIAL_PACE = 4.0
"""An ``exponential`` speed has no minimum, but its rounds' times are independent: an honest
client's ``k`` consecutive rounds take ``Gamma(k, mean)`` seconds per expected gradient. Its
slot is ``mean / EXPONENTIAL_PACE``, so one of its updates waits only if some ``k`` consecutive
rounds take less than ``k - B`` slots for the burst ``B`` left to them: per run of rounds at
most ``sum_{k > B} P(Gamma(k, 1) < (k - B) / 4)``, 4.0e-17 with the whole burst (16) and 5.3e-9
with half of it (the other half taken by network jitter); checked against scipy in the tests.
Its bucket starts full (:class:`RateSlot`: the first rounds may come close together). A
flooding client gets four times its honest mean rate, plus one burst."""
REALISED_PACE = 4.0
"""``timing: realised`` with Poisson sampling: a round's time is its speed times its realised
batch, and ``k`` rounds' batches sum to ``Binomial(k N, q)``, about ``Poisson(k g)`` for ``g``
expected gradients a round, so a round may even take no time (an empty batch). The slot is the
expected round's minimum cost divided by ``REALISED_PACE``; an update waits only if ``k``
consecutive rounds draw fewer than ``(k - B) g / 4`` gradients in all: per run of rounds at
most ``sum_{k > B} P(Poisson(k g) < (k - B) g / 4)``, 1.0e-7 for ``g = 1`` (mostly 17 empty
rounds in a row, ``e^-17``) and 4.3e-15 for ``g = 2`` with the whole burst (16); checked
against scipy in the tests. A deferred update waits, it is not dropped. The bucket starts full
(:class:`RateSlot`)."""
_QUANTILE = 1e-12  # the lower quantile of a heavy-tailed speed taken as its minimum
_Z = -NormalDist().inv_cdf(_QUANTILE)


def public_round_seconds(speed: object, expected_grads: float, timing: str,
                         sampling: str = "poisson") -> float | None:
    """A lower bound of an honest round's compute slot (``seconds_per_sample`` drawn from
    ``speed`` times ``expected_grads``, or times the realised gradients under ``timing:
    realised``), or None where the scenario gives none (module docstring): a ``lognormal``'s
    minimum is taken as its ``1e-12`` lower quantile ``median * exp(-z sigma)``, so that an
    honest round below it, at that probability, only spends a token of the bucket's burst."""
    if timing not in ("public", "realised") or not expected_grads > 0:
        return None
    realised_poisson = timing == "realised" and sampling == "poisson"
    if realised_poisson and isinstance(speed, Exponential):
        return None
    if realised_poisson:
        expected_grads = expected_grads / REALISED_PACE
    if isinstance(speed, Constant):
        low = speed.value
    elif isinstance(speed, Uniform):
        low = speed.low
    elif isinstance(speed, ShiftedExponential):
        low = speed.minimum
    elif isinstance(speed, LogNormal):
        low = speed.median * math.exp(-_Z * speed.sigma)
    elif isinstance(speed, Exponential):
        low = speed.mean / EXPONENTIAL_PACE
    else:
        return None
    slot = float(low) * float(expected_grads)
    if not (slot > 0 and math.isfinite(slot)):
        return None
    return RateSlot(slot) if realised_poisson or isinstance(speed, Exponential) else slot


def group_slot(group: ClientGroup, timing: str) -> float | None:
    """The public slot of ``group``'s clients under ``timing`` (:func:`public_round_seconds` of
    the group's speed and expected per-example gradients), or None where it has none."""
    return public_round_seconds(group.speed, group_sample_grads(group), timing, group.sampling)


class RateSlot(float):
    """A slot that bounds an honest client's *rate* of rounds, not each round
    (:data:`EXPONENTIAL_PACE`, :data:`REALISED_PACE`): its first rounds may come faster than
    one a slot, so its bucket starts full (:data:`BURST` tokens) instead of with one."""

    __slots__ = ()


@dataclass(slots=True)
class _Bucket:
    tokens: float
    last: float
    # At most MAX_DEFERRED, in arrival order (a list: every client has a bucket, and an empty
    # deque is 760 bytes).
    waiting: list[ClientUpdate] = field(default_factory=list)
    deferred: int = 0
    index: int = 0  # the bucket's creation order: waiting clients are served in it
    # Bit k: round ``top - k`` passed (k < PASSED_KEPT); an int of at most PASSED_KEPT bits,
    # not a set of every round, so a bucket stays a few hundred bytes however long the run.
    passed: int = 0
    top: int = -1  # the highest round that passed (-1: none yet)

    def has_passed(self, round_index: int) -> bool:
        back = self.top - round_index
        return 0 <= back < PASSED_KEPT and bool(self.passed >> back & 1)

    def pass_round(self, round_index: int) -> None:
        back = self.top - round_index
        if back >= 0:
            if back < PASSED_KEPT:
                self.passed |= 1 << back
            return
        # a new highest round: shift the older ones back, forgetting those past PASSED_KEPT
        shifted = self.passed << -back if -back < PASSED_KEPT else 0
        self.passed = (shifted | 1) & _KEPT_MASK
        self.top = round_index


_KEPT_MASK = (1 << PASSED_KEPT) - 1


class Pacer:
    """Token buckets per client (module docstring); ``slots[client]`` its public slot (None:
    not paced; absent: not a client of the scenario, left to the judge)."""

    def __init__(self, slots: dict[str, float | None], start: float) -> None:
        self.slots = slots
        self.start = start
        self.initial = 1.0
        self._buckets: dict[str, _Bucket] = {}  # in creation order
        self._queued: set[str] = set()  # clients with updates waiting: next_due looks only there
        self.deferred = 0
        """Updates that had to wait (a flooding client's, or bunched by more than the burst)."""
        self._refused = 0
        self._noted: dict[int, tuple[ClientUpdate, str]] = {}  # id -> (the update, its verdict)
        self._released: list[ClientUpdate] = []  # served by note(), judged with due()

    def restart(self, start: float, *, full: bool) -> None:
        """Begin the buckets at ``start`` (the first model's time), full after a restart."""
        self.start = start
        self.initial = BURST if full else 1.0
        self._buckets, self._queued, self._released = {}, set(), []

    def _bucket(self, client_id: str, now: float) -> _Bucket:
        bucket = self._buckets.get(client_id)
        if bucket is None:
            initial = BURST if isinstance(self.slots.get(client_id), RateSlot) else self.initial
            bucket = self._buckets[client_id] = _Bucket(initial, self.start,
                                                        index=len(self._buckets))
        slot = self.slots.get(client_id)
        if slot is not None:
            bucket.tokens = min(BURST, bucket.tokens + max(0.0, now - bucket.last) / slot)
        bucket.last = max(bucket.last, now)
        return bucket

    def _may_pass(self, client_id: str, bucket: _Bucket) -> bool:
        # (1e-9: float rounding of the accrual must not defer an update that is on time)
        return self.slots.get(client_id) is None or bucket.tokens >= 1.0 - 1e-9

    def _take(self, client_id: str, bucket: _Bucket, round_index: int) -> None:
        bucket.pass_round(round_index)
        if self.slots.get(client_id) is not None:
            bucket.tokens -= 1.0

    def offer(self, update: ClientUpdate, now: float) -> str:
        """``'pass'`` (judge it now; its token is spent), ``'wait'`` (deferred; logged at info
        once per client) or ``'refuse'`` (``MAX_DEFERRED`` already waiting; logged, counted
        until :meth:`take_refused`)."""
        client_id = update.client_id
        if client_id not in self.slots:
            return "pass"  # not a client of the scenario: the judge refuses it
        bucket = self._bucket(client_id, now)
        if bucket.has_passed(update.round):
            return "pass"  # a network duplicate or resend: free (the judge counts it duplicate)
        if not bucket.waiting and self._may_pass(client_id, bucket):
            self._take(client_id, bucket, update.round)
            return "pass"
        if len(bucket.waiting) >= MAX_DEFERRED:
            self._refused += 1
            _log.warning("update rejected", client=client_id, round=update.round,
                         base_version=update.base_version, kind=Kind.RATE,
                         reason=f"{MAX_DEFERRED} updates already wait for its compute slot")
            return "refuse"
        if not bucket.deferred:
            _log.info("update deferred: its client is ahead of its public compute slot",
                      client=client_id, round=update.round)
        bucket.waiting.append(update)
        self._queued.add(client_id)
        bucket.deferred += 1
        self.deferred += 1
        return "wait"

    def take_refused(self) -> int:
        """Updates refused (``rate``) since the last call."""
        refused, self._refused = self._refused, 0
        return refused

    def next_due(self, now: float) -> ClientUpdate | None:
        """The earliest-queued waiting update that may now be judged (its token spent), or
        None; a client's updates leave its queue in arrival order."""
        if not self._queued:
            return None  # the common case, on every arrival: no scan of every client's bucket
        for client_id in sorted(self._queued, key=lambda c: self._buckets[c].index):
            due = self._serve(client_id, now)
            if due is not None:
                return due
        return None

    def _serve(self, client_id: str, now: float) -> ClientUpdate | None:
        """The head of ``client_id``'s queue if it may now be judged (its token spent)."""
        bucket = self._bucket(client_id, now)
        round_index = bucket.waiting[0].round
        if not (bucket.has_passed(round_index) or self._may_pass(client_id, bucket)):
            return None
        if not bucket.has_passed(round_index):  # a repeat of a round that passed is free
            self._take(client_id, bucket, round_index)
        due = bucket.waiting.pop(0)
        if not bucket.waiting:
            self._queued.discard(client_id)
        return due

    def note(self, update: ClientUpdate, now: float, *, keep_refused: bool = True) -> str:
        """Pace a time window's ``update`` at its arrival (:meth:`offer`); the verdict is used
        when the window closes (:meth:`judged_now`), and returned. ``keep_refused=False``: a
        refused update is not kept for :meth:`judged_now` (its caller does not hold it either:
        an aggregator, whose window's inbox would otherwise hold every update of a flood
        until the close).

        A client with updates waiting is served at its arrivals too, not only at the window's
        end: its tokens accrue at one a slot but its bucket holds at most :data:`BURST`, so a
        queue served once a window would drain at ``BURST`` updates a window, below the slot
        rate of an honest client whose window is longer than ``BURST`` slots; once deferred,
        such a client would fall behind for good and its updates would wait until stale."""
        client_id = update.client_id
        while client_id in self._queued and (due := self._serve(client_id, now)) is not None:
            self._released.append(due)
        verdict = self.offer(update, now)
        if keep_refused or verdict != "refuse":
            self._noted[id(update)] = (update, verdict)
        return verdict

    def take_released(self) -> list[ClientUpdate]:
        """The updates served at their client's arrivals (:meth:`note`) since the last call."""
        released, self._released = self._released, []
        return released

    def due(self, now: float) -> list[ClientUpdate]:
        """Every waiting update that may now be judged: those served at their client's
        arrivals (:meth:`note`), then :meth:`next_due`, repeatedly."""
        return self.take_released() + list(iter(lambda: self.next_due(now), None))

    def judged_now(self, arrived: list[ClientUpdate], now: float) -> list[ClientUpdate]:
        """Those of a time window's ``arrived`` updates to judge now: those that passed when
        they arrived (:meth:`note`) or, if not noted, pass now; deferred ones wait in their
        client's queue (:meth:`due`), refused ones are gone."""
        noted, self._noted = self._noted, {}
        return [u for u in arrived
                if (noted[id(u)][1] if id(u) in noted else self.offer(u, now)) == "pass"]

    def waiting(self) -> int:
        """Updates waiting for a token."""
        return sum(1 for _ in self.waiting_updates())

    def waiting_to_apply(self, book: ClientBook, *, released: bool = True) -> int:
        """Updates waiting for a token that could still be applied: the one count of what
        waits, which the stop on spent budgets waits for. Of rounds ``book`` has not judged
        and, with ``released``, that their clients' statuses say were released
        (``book.known_rounds``): a flood of replays or of rounds never released does not count
        (an attacker's review: a hostile client kept a queue full to the end), and each round
        counts until it is judged, once. An aggregator, which sees no statuses, counts with
        ``released=False`` and the server bounds its count
        (:meth:`~fedsim.runtime.actors.partials.PartialIntake.deferred_at_aggregators`)."""
        return sum(1 for u in self.waiting_updates()
                   if (u.client_id, u.round) not in book
                   and (not released or u.round < book.known_rounds(u.client_id)))

    def waiting_updates(self) -> Iterator[ClientUpdate]:
        """The updates waiting for a token (only the queued clients' buckets are read: every
        window asks, and a scan of every bucket at 10^5 clients would cost milliseconds)."""
        for client_id in self._queued:
            yield from self._buckets[client_id].waiting


