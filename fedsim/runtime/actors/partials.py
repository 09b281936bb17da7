"""The server's side of aggregation nodes: taking their partials, waiting for them at a window's
close, and checking them against the client book (:class:`PartialIntake`, held by
:class:`~fedsim.runtime.actors.server.ServerActor`, which mixes the accepted groups).

**Aggregation nodes** (``aggregators``, :mod:`fedsim.runtime.actors.aggregator`): at each
window's end the server announces the close (:class:`~fedsim.protocol.messages.WindowClose`,
with its version) and waits, at most ``aggregator_wait`` seconds, for a partial from every live
aggregator (one that answered the previous close, or any partial since). A partial's manifest is
checked group by group (one group per base version): every entry passes the book's checks
(:meth:`~fedsim.runtime.actors.client_book.ClientBook.judge_entry`: a known client, its rounds,
no ``(client, round)`` judged before or named twice across aggregators and direct updates, a
published base version, staleness, invitation), carries the scenario's weight of its client,
and the group's sum is no longer than ``sum_i w_i |eta_i| bound_i`` (float32 rounding aside);
a group failing any of it is refused whole (``bad_partial``, its updates counted as rejected).

**One client cannot get the others' updates refused** (session 56's reviews). A group is one
sum, so an entry the server refuses takes the group's other updates with it. An honest
aggregator folds only what passes the checks it can make, and records in its book what it
judged or forwarded, as the server records what it judges. The two books part where the
server learns what the aggregator cannot see: a client's statuses (an adopted count of rounds,
:mod:`~fedsim.runtime.actors.client_book`: every round below it is then judged), and a
forwarded update the server refuses that the aggregator counted judged (:data:`FORWARDED_KINDS`:
a client that leapt past such a round had its next leap folded and refused). So
(:class:`CloseNotes`):

* every window close names the watermarks (``WindowClose.watermarks``) of the clients whose
  status the server adopted (their adopted count), and of every client with an entry in a
  refused group or a forwarded update refused so (:data:`~fedsim.protocol.headers.MAX_COUNTER`:
  all its rounds, for the rest of the run); an aggregator folds none of such a client's
  rounds below its mark and forwards them, to be judged one by one. The names are repeated at every close (new ones first,
  then in turn, :data:`~fedsim.protocol.headers.MAX_CLOSE_WATERMARKS` a close): a restarted
  aggregator, which forwards every update of its first window anyway, knows them all before
  it folds; and they are in the server's checkpoint (a restarted server names them again);
* the next close names every refused group (``WindowClose.refused``: aggregator, window, base
  version), and that aggregator forwards the updates it folded into it, so the honest ones are
  judged (and applied) one window later instead of waiting for their clients' resends, which
  could come too late for ``max_staleness`` (past the header's 256 names, each aggregator
  keeps a share, :func:`fair_share`: one aggregator's flood of refused groups cannot push
  another's out).

A client that claims a far count and then sends its low rounds (the finding: its aggregator's
every partial refused, eight windows without a model) has none of them folded once the close
after its status arrives; if its status lands between a close and that window's partials,
that one group is refused and its honest updates reach the server one window later.
Accepted groups join the window's mix with the coefficient ``S(s) / total`` their updates would
have had one by one (time windows are linear in each update's weight), so with aggregators the
model is the flat deployment's up to float32 rounding of the sums. A partial of a window
already closed (a late aggregator's) joins the next window's mix, as a direct update arriving
after its window's close would (judged then: a group whose base version has grown too stale
counts as stale; at most :data:`MAX_LATE_PARTIALS` of an aggregator between two closes, a
further one is refused and its clients' resends are forwarded); only a partial that comes
after the end of the run is lost
(``WindowReport.lost_in_partials``, dropped in flight; their privacy was spent on the client).
So the wait trades how soon a slow aggregator's updates are applied against how late each
window closes, and loses nothing.

**An aggregator's rejection counts** (``Partial.rejections``, added to the window's
``metrics.jsonl`` columns) are bounded too: each kind one an aggregator counts
(:data:`AGGREGATOR_KINDS`), each count a non-negative integer, and in all at most
:func:`rejection_allowance` of the clients routed to it. An honest aggregator reports no more
(:meth:`~fedsim.runtime.actors.integrity.Rejections.take`: a flood's excess goes into its next
partials), so counts past it are made up: the partial's counts are left out (counted in the
window's ``metrics.jsonl`` rejections as ``implausible_counts``, one a partial, and logged) and
the rest of it is judged as ever.

**Updates deferred at an aggregator** (:meth:`PartialIntake.deferred_at_aggregators`): an
aggregator's pacer defers updates as the server's does, and each partial says how many it
holds (:attr:`~fedsim.protocol.messages.Partial.waiting`). The stop on spent budgets waits for
them as for the server's own (:attr:`WindowReport.waiting
<fedsim.runtime.actors.window_report.WindowReport.waiting>`), but a count the server cannot
check is bounded twice: it counts at most the updates the clients released (by their
statuses) that the server has not judged and does not hold itself (``ClientBook.missing``:
with nothing missing, a claim holds nothing), and it holds the stop for at most
:func:`deferred_hold_windows` windows in a row in which nothing else does (no update accepted,
none waiting at the server): as many as an honest aggregator's longest queue of that many
updates takes to drain, one update a slot of the slowest client, plus two windows for the
partial that carries the last one. So an honest deferred update is waited for and applied, and
a hostile aggregator's claim delays the stop by that bound at most.
"""

from __future__ import annotations

import asyncio
import math
from collections import Counter
from collections.abc import Callable, Collection, Mapping
from typing import NamedTuple

import numpy as np

from fedsim.clock import Clock
from fedsim.config import limits
from fedsim.errors import ConfigError
from fedsim.logging import get_logger
from fedsim.protocol.headers import MAX_CLOSE_REFUSED, MAX_CLOSE_WATERMARKS, MAX_COUNTER
from fedsim.protocol.messages import ManifestEntry, Partial, WindowClose
from fedsim.protocol.norms import vector_norm
from fedsim.runtime.actors.admission import MAX_DEFERRED
from fedsim.runtime.actors.client_book import ClientBook, Kind
from fedsim.runtime.actors.integrity import MAX_ROUND_GAP, Rejections
from fedsim.runtime.actors.window_report import WindowReport
from fedsim.transports.base import Endpoint
from fedsim.transports.topics import aggregator_of

_log = get_logger("fedsim.runtime.actors.server")

PARTIAL_ROUNDING = 1.0 + 1e-5
"""Slack on a partial's norm bound: its sum is rounded to float32 once (a relative error below
``2^-24`` per value) after float64 accumulation."""
TAKEN_HORIZON = 64
"""How many windows before an aggregator's latest partial the server remembers as taken or not:
a partial reordered behind a later one within it still joins the mix (once); an older one is
ignored, logged (taken already or not, the server cannot tell; its clients resend what was
not acknowledged)."""
TAKEN_MASK = (1 << TAKEN_HORIZON) - 1
MAX_LATE_PARTIALS = 4
"""How many late partials (of windows already closed) of one aggregator the server holds
between two closes; a further one is refused (``bad_partial``, logged; remembered as taken, so
a copy is ignored): its clients resend what was not acknowledged, and their aggregator forwards
the resends unmixed. An honest aggregator sends one partial a close, so late ones come one or two at a
time (a reordered or reconnecting link). Without the bound an aggregator silent for ``n``
windows could then send a partial of each of them, every one held until the next close: up to
64 sums and a 4 MiB manifest each (``codec.max_partial_bytes``), 1.9 GB of the server's memory
for 150 partials of a 50,890-parameter model (attackers' review of the 64-sum partials)."""


def deferred_hold_windows(deferred: int, slot: float, window: float) -> int:
    """How many windows in a row ``deferred`` updates claimed by aggregators may hold the stop
    on spent budgets (module docstring): an honest queue of that many updates (at most
    :data:`~fedsim.runtime.actors.admission.MAX_DEFERRED` of one client) drains one a ``slot``
    (the slowest paced client's), and its last update is judged at the close after its token
    accrues, or at the next one when its partial is late: two windows more."""
    drain = min(deferred, MAX_DEFERRED) * slot
    return math.ceil(drain / window * (1 - 1e-9)) + 2 if window > 0 else 2


FORWARDED_KINDS = frozenset({Kind.ROUND_AHEAD, Kind.FUTURE_VERSION, Kind.UNPUBLISHED_VERSION,
                             Kind.NOT_INVITED})
"""Verdicts an aggregator may reach only because it knows less than the server: such an update
is forwarded unmixed for the server to judge (:mod:`~fedsim.runtime.actors.aggregator`), and
recorded there as judged; a server that refuses such an update names its client in its next
close (module docstring)."""


AGGREGATOR_KINDS = frozenset(kind.value for kind in Kind) - {
    Kind.ACCEPTED, Kind.BAD_MIX, Kind.BAD_PARTIAL, Kind.STATUS_INCONSISTENT,
    Kind.IMPLAUSIBLE_COUNTS}
"""The kinds a partial's ``rejections`` may count: the verdicts on updates (an aggregator
takes no statuses, mixes no model and judges no partial)."""
REJECTIONS_PER_CLIENT = 16 * limits.MAX_UNACKNOWLEDGED
"""Rejections one partial may count per client routed to its aggregator (4,096): an honest
client sends a window's rounds and resends its 256 unacknowledged updates at most; this leaves
room for a flood's (an attacker's review sent 2,000 new rounds and 2,000 resends in one
window), and an honest aggregator reports the excess of a larger one in its later partials."""


def rejection_allowance(routed: int) -> int:
    """The most rejections in all one partial of an aggregator with ``routed`` clients may
    count (module docstring, "An aggregator's rejection counts")."""
    return routed * REJECTIONS_PER_CLIENT


def routed_clients(client_ids: Collection[str], aggregators: Collection[str]) -> Counter[str]:
    """How many of ``client_ids`` are routed to each of ``aggregators``."""
    ids = sorted(aggregators)
    return Counter(aggregator_of(c, ids) for c in client_ids) if ids else Counter()


def implausible_rejections(counts: Mapping[str, object], allowance: int) -> str | None:
    """Why a partial's rejection counts cannot be an honest aggregator's (None: they can):
    kinds outside :data:`AGGREGATOR_KINDS`, counts that are not non-negative integers, or more
    in all than ``allowance`` (:func:`rejection_allowance`)."""
    kinds = sorted(str(k) for k in counts if k not in AGGREGATOR_KINDS)
    if kinds:
        return f"kinds no aggregator counts: {kinds[:3]}"
    wrong = sorted(k for k, v in counts.items() if type(v) is not int or v < 0)
    if wrong:
        return f"counts that are not non-negative integers: {wrong[:3]}"
    total = sum(v for v in counts.values() if type(v) is int)
    if total > allowance:
        return f"{total} rejections, more than the {allowance} its clients allow"
    return None


class PartialGroup(NamedTuple):
    """A partial's accepted group of one base version, to mix."""

    base_version: int
    total: np.ndarray  # sum_i w_i eta_i u_i over the entries
    weight: float  # sum_i w_i
    bound: float | None  # on the total's norm (None: a client's posture is not known)
    entries: list[ManifestEntry]


EntryBound = Callable[[str, int, float], float | None]
"""``w_i |eta_i(r)| bound_i(r)`` of a client's round at weight ``w_i``: the most its weighted
update can move the model (None: its posture is not known to the server)."""


class PartialIntake:
    """The partials of the aggregation nodes a server waits for (module docstring)."""

    def __init__(self, aggregators: Collection[str], wait: float, *, book: ClientBook,
                 weights: Mapping[str, float], entry_bound: EntryBound, size: int,
                 slot: float = 0.0, window: float = 1.0) -> None:
        if not (math.isfinite(wait) and wait >= 0):
            raise ConfigError(f"aggregator_wait must be >= 0 seconds, got {wait!r}")
        self.aggregators = frozenset(aggregators)
        """The aggregation nodes' ids (empty: updates come straight)."""
        self._slot, self._window = slot, window  # (the slowest paced client's slot)
        self._claims: dict[str, int] = {}  # each aggregator's latest count of deferred updates
        self._held_since: int | None = None  # the first window the claims alone held the stop
        self._held_most = 0  # the most they counted since
        self.wait = float(wait)
        self._book, self._weights, self._entry_bound, self._size = book, weights, entry_bound, size
        self._live: set[str] = set(self.aggregators)
        self._partials: dict[tuple[str, int], Partial] = {}  # to mix at the next close
        # Per aggregator: the last window taken and, as bits, which of the TAKEN_HORIZON
        # windows before it were taken too (network reordering can deliver those late).
        self._taken: dict[str, tuple[int, int]] = {}
        self._answered = asyncio.Event()
        self.lost = 0
        """Updates in partials that came after the end of the run, since the last close."""
        self.waited: float | None = None
        """How long the closing window waited for its partials (None: not waited)."""
        self.notes = CloseNotes()
        """What the window closes tell the aggregators (module docstring)."""
        self._allowance = {a: rejection_allowance(n) for a, n in
                           routed_clients(weights, self.aggregators).items()}

    def hold_back(self, client_id: str, below: int) -> None:
        """Name ``client_id`` in every window close from the next: aggregators fold none of
        its rounds below ``below`` (module docstring); a client of the scenario only."""
        if self.aggregators and client_id in self._weights:
            self.notes.hold_back(client_id, below)

    @property
    def held(self) -> list[tuple[str, int]]:
        """The ``(aggregator, window)`` of the partials waiting for the next close."""
        return sorted(self._partials)

    def take(self, partial: Partial, *, closing: int, ended: bool,
             rejections: Rejections) -> None:
        """Keep ``partial`` for the next close (that of window ``closing``): the closing
        window's, or a late one of a window already closed (it joins the open window's mix, as
        a direct update arriving after its window's close would); one after the end of the run
        (``ended``) is lost in flight; one of an unknown aggregator is counted in
        ``rejections``."""
        aggregator = partial.aggregator_id
        if aggregator not in self.aggregators:
            rejections.add(Kind.BAD_PARTIAL, len(partial.entries))
            _log.warning("partial of an unknown aggregator refused", aggregator=aggregator)
            return
        self._live.add(aggregator)  # it is up: waited for from the next close on
        if ended or partial.window > closing:  # (no close of a later window was sent)
            self.lost += len(partial.entries)
            _log.warning("partial after the end of the run or of a window not closed: its "
                         "updates count as dropped in flight", aggregator=aggregator,
                         window=partial.window, updates=len(partial.entries), closing=closing)
            return
        last, earlier = self._taken.get(aggregator, (0, 0))
        behind = last - partial.window
        if behind == 0 or (0 < behind <= TAKEN_HORIZON and earlier >> (behind - 1) & 1):
            return  # a network duplicate of a partial taken already
        if behind > TAKEN_HORIZON:
            # Taken already or not, the server cannot tell (a duplicate of one it applied
            # would otherwise count as lost): not counted, its clients resend what was not
            # acknowledged.
            _log.warning("partial older than the windows the server remembers: ignored",
                         aggregator=aggregator, window=partial.window,
                         updates=len(partial.entries), last=last)
            return
        if behind > 0:  # overtaken on the way by a later partial: it joins like a late one
            self._taken[aggregator] = (last, earlier | 1 << (behind - 1))
        else:
            ahead = -behind
            shifted = (earlier << ahead | 1 << (ahead - 1)) if last else 0
            self._taken[aggregator] = (partial.window, shifted & TAKEN_MASK)
        if partial.window < closing and self._late(aggregator, closing) >= MAX_LATE_PARTIALS:
            # Remembered as taken: a copy is ignored as a duplicate (judged later, its entries
            # could be duplicates of their clients' resends, and its group refused).
            rejections.add(Kind.BAD_PARTIAL, len(partial.entries))
            _log.warning("an aggregator's late partials since the last close are past the "
                         "bound: refused, its clients resend what was not acknowledged",
                         aggregator=aggregator, window=partial.window,
                         updates=len(partial.entries), closing=closing,
                         bound=MAX_LATE_PARTIALS)
            return
        self._partials[(aggregator, partial.window)] = partial
        if partial.window < closing:
            _log.info("late partial: its updates join the open window's mix",
                      aggregator=aggregator, window=partial.window,
                      updates=len(partial.entries), closing=closing)
        if self._live <= self._answered_close(closing):
            self._answered.set()

    def _late(self, aggregator: str, closing: int) -> int:
        """How many late partials (windows before ``closing``) of ``aggregator`` are held."""
        return sum(1 for a, window in self._partials if a == aggregator and window < closing)

    def _answered_close(self, closing: int) -> set[str]:
        """The aggregators whose partial of window ``closing`` is here."""
        return {a for a, window in self._partials if window == closing}

    async def gather(self, clock: Clock, endpoint: Endpoint, closing: int, version: int) -> None:
        """Announce the close of window ``closing`` (the model at ``version``) and wait for the
        live aggregators' partials (at most :attr:`wait`); those that did not answer are no
        longer waited for."""
        self._answered.clear()
        if self._live <= self._answered_close(closing):
            self._answered.set()
        started = clock.now()
        watermarks, refused = self.notes.take()
        await endpoint.publish(WindowClose(closing, version, clock.now(), watermarks, refused))
        waiter = asyncio.ensure_future(self._answered.wait())
        timer = asyncio.ensure_future(clock.sleep(self.wait))
        try:
            await asyncio.wait({waiter, timer}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for task in (waiter, timer):
                task.cancel()
        self.waited = clock.now() - started
        answered = self._answered_close(closing)
        missing = self._live - answered
        if missing:
            _log.warning("aggregators did not answer the window's close in time",
                         window=closing, aggregators=sorted(missing))
        self._live = answered

    def judge(self, report: WindowReport, keys: set[tuple[str, int]], rejections: Rejections,
              *, on_arrival: bool) -> list[PartialGroup]:
        """Check the closing window's partials (module docstring): the accepted groups; the
        rest counted in ``report`` and ``rejections``; the accepted entries' ``(client,
        round)`` added to ``keys`` (judged in this window). ``on_arrival``: the server's
        policy takes single updates only, and refuses every group. Also moves :attr:`lost`
        and :attr:`waited` into ``report``."""
        report.lost_in_partials, self.lost = self.lost, 0
        report.partial_wait, self.waited = self.waited, None
        groups = []
        partials, self._partials = self._partials, {}
        for (aggregator, _), partial in sorted(partials.items()):
            self._claims[aggregator] = partial.waiting  # (sorted: its latest window's last)
            counts = self._plausible_counts(partial, rejections)
            refused = sum(counts.values())
            report.duplicate += counts.pop(Kind.DUPLICATE.value, 0)
            report.stale += counts.pop(Kind.STALE.value, 0)
            for kind, count in counts.items():
                rejections.add(kind, count)
                report.rejected += count
            report.received += len(partial.entries) + refused
            for client_id, round_index in partial.settled:
                # No further beyond the known rounds than an update could name (ROUND_AHEAD).
                if client_id in self._weights and \
                        round_index <= self._book.known_rounds(client_id) + MAX_ROUND_GAP:
                    self._book.record(client_id, round_index)
            for index, base in enumerate(partial.bases):
                entries = [e for e in partial.entries if e.base_version == base]
                total = partial.group(index, self._size)
                checked = (self._check_group(entries, total, keys) if not on_arrival
                           else "an on-arrival policy takes single updates only")
                if checked is None:  # judged stale for good, as late direct updates can be
                    report.stale += len(entries)
                    keys.update((e.client_id, e.round) for e in entries)
                    continue
                if isinstance(checked, str):
                    self.notes.refused(aggregator, partial.window, base)
                    rejections.add(Kind.BAD_PARTIAL, len(entries))
                    report.rejected += len(entries)
                    _log.warning("partial refused", aggregator=aggregator, base_version=base,
                                 updates=len(entries), reason=checked)
                    continue
                keys.update((e.client_id, e.round) for e in entries)
                report.accepted += len(entries)
                groups.append(PartialGroup(base, total, checked[0], checked[1], entries))
        return groups

    def _plausible_counts(self, partial: Partial, rejections: Rejections) -> dict[str, int]:
        """``partial``'s rejection counts, or none where they are implausible (module
        docstring): then counted in ``rejections`` (the window's, as every refusal is) and
        logged (throttled), and the rest of it judged as ever."""
        why = implausible_rejections(partial.rejections,
                                     self._allowance.get(partial.aggregator_id, 0))
        if why is None:
            return dict(partial.rejections)
        rejections.add(Kind.IMPLAUSIBLE_COUNTS)
        _log.warning("partial's rejection counts implausible: left out",
                     aggregator=partial.aggregator_id, window=partial.window, reason=why)
        return {}

    def deferred_at_aggregators(self, *, window: int, own: int, accepted: int) -> int:
        """The updates the aggregators' latest partials say they hold deferred that the stop on
        spent budgets waits for after window ``window`` (module docstring), where the server
        itself holds ``own`` such updates and accepted ``accepted`` in the window: at most the
        released updates it has not judged and does not hold, and 0 once the claims alone have
        held the stop for :func:`deferred_hold_windows` windows in a row."""
        claimed = sum(self._claims.values())
        if claimed:  # (the book's count reads every client: only when a claim is made)
            claimed = min(claimed, max(0, self._book.missing() - own))
        if claimed == 0 or own or accepted:
            self._held_since, self._held_most = None, 0
            return claimed
        if self._held_since is None:
            self._held_since = window
        self._held_most = max(self._held_most, claimed)
        bound = deferred_hold_windows(self._held_most, self._slot, self._window)
        if window - self._held_since < bound:
            return claimed
        if window - self._held_since == bound:
            _log.warning("aggregators still claim deferred updates past the time an honest "
                         "one takes to send them: the stop on spent budgets no longer waits "
                         "for them", window=window, claimed=claimed,
                         since_window=self._held_since, bound_windows=bound,
                         claims=dict(sorted(self._claims.items())))
        return 0

    def _check_group(self, entries: list[ManifestEntry], total: np.ndarray,
                     keys: set[tuple[str, int]]) -> tuple[float, float | None] | str | None:
        """A partial's group (one base version): its weight and the bound on its sum's norm
        ``sum_i w_i |eta_i| bound_i`` (None: a bound unknown), or why it is refused, or None if
        its base version is too stale by now (a late partial; the book recorded its entries)."""
        weight, bound = 0.0, 0.0
        known = True
        group: set[tuple[str, int]] = set()
        stale = 0
        refused: list[str] = []
        for entry in entries:
            key = (entry.client_id, entry.round)
            verdict = self._book.judge_entry(entry.client_id, entry.round, entry.base_version,
                                             entry.window, keys | group)
            if verdict.kind is Kind.STALE:  # then so is every entry: one base version
                stale += 1
                group.add(key)
                continue
            if verdict.kind is not Kind.ACCEPTED:
                # Whatever made it, every round of the client is judged here alone from now on
                # (module docstring): a bound below would let it leap past it again. Every
                # such client of the group, not the first alone.
                self.hold_back(entry.client_id, MAX_COUNTER)
                refused.append(f"{entry.client_id} round {entry.round}: {verdict.kind} "
                               f"({verdict.reason})")
                continue
            if entry.weight != self._weights[entry.client_id]:
                return (f"{entry.client_id} weighed {entry.weight!r}, the scenario says "
                        f"{self._weights[entry.client_id]!r}")
            group.add(key)
            weight += entry.weight
            entry_bound = self._entry_bound(entry.client_id, entry.round, entry.weight)
            if entry_bound is None:
                known = False
            else:
                bound += entry_bound
        if refused:
            return "; ".join(refused[:3]) + (f"; and {len(refused) - 3} more" if len(refused) > 3
                                               else "")
        if stale:
            return None
        norm = vector_norm(total)
        if known and norm > bound * PARTIAL_ROUNDING:
            return f"its sum's norm {norm:.6g} exceeds the bound {bound:.6g} of its updates"
        return weight, bound if known else None


class CloseNotes:
    """What the server's window closes tell its aggregators (module docstring): the clients'
    watermarks, every one at every close (new ones first, the rest in turn), and the groups
    refused since the last close. Bounded by the scenario's clients (one mark a client) and,
    between two closes, by the partials refused."""

    def __init__(self) -> None:
        self._marks: dict[str, int] = {}
        self._order: list[str] = []  # the named clients, in the order named (their turns)
        self._new: set[str] = set()  # named, or raised, since the last close
        self._turn = 0
        self._refused: list[tuple[str, int, int]] = []

    def hold_back(self, client_id: str, below: int) -> None:
        """Name ``client_id`` with mark ``below`` (a mark is only raised)."""
        held = self._marks.get(client_id)
        if held is None:
            self._order.append(client_id)
        elif below <= held:
            return
        self._marks[client_id] = below
        self._new.add(client_id)

    def marks(self) -> dict[str, int]:
        """Every client named, with its mark (a server checkpoint keeps them)."""
        return dict(self._marks)

    def refused(self, aggregator_id: str, window: int, base_version: int) -> None:
        """A group of ``aggregator_id``'s partial of ``window`` was refused."""
        self._refused.append((aggregator_id, window, base_version))

    def take(self) -> tuple[tuple[tuple[str, int], ...], tuple[tuple[str, int, int], ...]]:
        """The next close's watermarks and refused groups (at most the header's bounds; the
        new marks beyond them wait for the next close; refusals beyond the bound are dropped,
        each aggregator's oldest first, so every aggregator keeps a share (:func:`fair_share`):
        the dropped groups' clients resend)."""
        new = sorted(self._new)[:MAX_CLOSE_WATERMARKS]
        self._new.difference_update(new)
        named = list(new)
        count = len(self._order)
        turns = min(MAX_CLOSE_WATERMARKS - len(named), count)
        chosen = set(named)
        for offset in range(turns):
            client_id = self._order[(self._turn + offset) % count]
            if client_id not in chosen:
                named.append(client_id)
        if count:
            self._turn = (self._turn + turns) % count
        refused, self._refused = fair_share(self._refused, MAX_CLOSE_REFUSED), []
        return tuple((c, self._marks[c]) for c in named), tuple(refused)


def fair_share(refused: list[tuple[str, int, int]], limit: int) -> list[tuple[str, int, int]]:
    """At most ``limit`` of the refused groups ``(aggregator, window, base version)``, taken in
    turn from each aggregator, its newest first, and kept in the order refused: one aggregator
    with many refused groups (a hostile one sends up to ``1 + MAX_LATE_PARTIALS`` partials of
    64 groups between two closes) cannot crowd another's out of the close, which would leave
    that aggregator's honest folded updates to wait for their clients' resends."""
    if len(refused) <= limit:
        return refused
    newest_first: dict[str, list[int]] = {}
    for index in range(len(refused) - 1, -1, -1):
        newest_first.setdefault(refused[index][0], []).append(index)
    chosen: list[int] = []
    depth = 0
    while len(chosen) < limit:
        for indices in newest_first.values():
            if depth < len(indices) and len(chosen) < limit:
                chosen.append(indices[depth])
        depth += 1
    return [refused[index] for index in sorted(chosen)]
