"""The aggregation node (issue 26; van Dijk & Nguyen: "from the clients through aggregation
nodes to the server"): it takes a share of the clients' updates off the server.

An aggregator keeps a :class:`~fedsim.runtime.actors.client_book.ClientBook` of its own and
applies every check that needs only public data, the server's in the same order: codec and
finite values (the endpoint's decoder), the norm bound from the client's public C, m, sigma and
sampling, its pace (:class:`~fedsim.runtime.actors.admission.Pacer`), its round limit, base
versions, staleness and invitations (learnt from the global models and window closes the server
publishes), duplicates by ``(client, round)``.

**Time windows** (the default policy): it holds the window's updates and, when the server
announces the window's close (:class:`~fedsim.protocol.messages.WindowClose`, which carries the
server's version), judges them against that version and pre-mixes the accepted ones into one
sum per base version, ``sum_i w_i eta_i u_i`` (``w_i`` the mixing strategy's raw weight of the
client, ``eta_i`` its agreed step size of the round; float64, sent as float32), and sends one
:class:`~fedsim.protocol.messages.Partial`: the sums plus the manifest (each folded ``(client,
round, base_version, window, weight)``, the ``(client, round)`` it settled as stale, its
rejections by kind). The server's staleness weighting and normalisation are linear in each
update's weight, so the server finishes the mix from the sums alone
(:meth:`~fedsim.runtime.actors.server.ServerActor.close_window`).

**On-arrival policies** (FedAsync, FedBuff) need each update alone: the aggregator checks it on
arrival and forwards it unmixed; at each window's close its partial carries its rejections only.

An update whose verdict depends on what only the server knows for sure (a base version the
aggregator has not seen published, an invitation it has not seen, a round beyond what it knows of
the client: the server also keeps the clients' statuses) is forwarded unmixed, and the server
judges it as if it had come straight from its client. A copy of an update judged here before (a
client resends what the server has not acknowledged, e.g. a receipt lost while it was
disconnected) is forwarded unmixed too: the server judges it (a duplicate it acknowledges again,
or an update whose partial was lost, applied once); only a copy of an update folded into the same
partial stops here.

**Rounds the server holds back** (:mod:`fedsim.runtime.actors.partials`): a window close may
name clients' watermarks, below which every round counts as judged at the server for a reason
an aggregator cannot see (a status adopted there, or an entry of that client that got a group
refused: then all its rounds); none of those rounds is folded from then on,
each is forwarded unmixed, so one client's entry never gets its neighbours' group refused.

**Refused groups**: the updates folded into the last two partials are kept (a partial judged
late, in the window after its own, has its refusal named a close later); if a close names
one of their groups as refused (``WindowClose.refused``), they are forwarded unmixed then, so
the server judges the honest ones alone a window later instead of waiting for their clients'
resends. An update forwarded because only the server can judge it
(``FORWARDED_KINDS``) is recorded in this book as judged (a restarted aggregator learns a
long-running client's rounds so, and folds its next ones); were the server to refuse it, the
server names the client, with all its rounds, in its next close (a client that leaps past a
refused round would otherwise have its next leap folded).

**Joining a run in progress** (a restarted aggregator, whose predecessor's book died with it):
the server may already have applied an update that reaches it again as a resend, and a partial
naming it would be refused whole. Such an update was computed on a model published before this
aggregator's first window close, so from the first close it sees (if that is not the run's first)
it forwards unmixed every update whose base version is at most that close's version
(``unsure_through``) and folds only the newer ones.

**Rejection counts**: a partial counts at most
:func:`~fedsim.runtime.actors.partials.rejection_allowance` rejections (the server leaves more
out as made up); a flood's excess waits for the next partials.

**Deferred updates**: each partial says how many updates the aggregator's pacer holds
deferred, not judged here (:attr:`~fedsim.protocol.messages.Partial.waiting`): an honest
update it would forward once its client's token accrues. The server's stop on spent budgets
waits for them as for its own deferred updates, within bounds a hostile aggregator cannot
stretch (:meth:`~fedsim.runtime.actors.partials.PartialIntake.deferred_at_aggregators`).

Everything here is post-processing of released updates: it costs the clients no privacy. The
actor sees only a :class:`~fedsim.clock.Clock` and an
:class:`~fedsim.transports.base.Endpoint`, so it runs unchanged over MQTT.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping

import numpy as np

from fedsim.aggregation import MixingStrategy
from fedsim.aggregation.mixing import client_weights
from fedsim.aggregation.policies import AggregationPolicy
from fedsim.clock import Clock
from fedsim.logging import get_logger
from fedsim.protocol.headers import MAX_PARTIAL_ENTRIES, MAX_PARTIAL_GROUPS
from fedsim.protocol.messages import ClientUpdate, GlobalModel, ManifestEntry, Partial, WindowClose
from fedsim.runtime.actors.admission import Pacer
from fedsim.runtime.actors.client_book import ClientBook, Kind
from fedsim.runtime.actors.integrity import Rejections
from fedsim.runtime.actors.partials import FORWARDED_KINDS, rejection_allowance, routed_clients
from fedsim.runtime.actors.server import ClientInfo
from fedsim.transports.base import Endpoint
from fedsim.transports.topics import aggregator_ids

__all__ = ["AggregatorActor", "aggregator_ids"]

_log = get_logger("fedsim.runtime.actors.aggregator")

class AggregatorActor:
    """Checks and pre-mixes the updates routed to it, window by window (module docstring)."""

    def __init__(
        self,
        *,
        aggregator_id: str,
        clock: Clock,
        endpoint: Endpoint,
        clients: Mapping[str, ClientInfo],
        size: int,
        strategy: MixingStrategy,
        policy: AggregationPolicy,
        max_staleness: int | None = None,
        invites: bool = False,
        max_groups: int = MAX_PARTIAL_GROUPS,
        aggregators: Collection[str] | None = None,
    ) -> None:
        if not 1 <= max_groups <= MAX_PARTIAL_GROUPS:
            raise ValueError(f"max_groups must be in [1, {MAX_PARTIAL_GROUPS}], got {max_groups}")
        self.aggregator_id = aggregator_id
        self.clock = clock
        self.endpoint = endpoint
        self.clients = dict(clients)
        self.size = size
        self.policy = policy
        self.max_groups = max_groups
        """Sums (base versions) one partial carries at most: as many as the server's message
        limit takes (:func:`~fedsim.protocol.codec.partial_groups`); an update of a further
        base version goes to the server alone."""
        self.book = ClientBook({c: info.limits for c, info in self.clients.items()}, size,
                               max_staleness=max_staleness, invites=invites)
        self.weights = client_weights(strategy, [(c, info.num_samples, info.weight)
                                                 for c, info in sorted(self.clients.items())])
        self.pacer = Pacer({c: info.slot for c, info in self.clients.items()}, clock.now())
        self._paced = False  # the pacer starts with the first global model
        # A time window's updates held for its close, by (client, round), in arrival order;
        # the rounds whose differing copies were refused as forked (logged once a window).
        self._held: dict[tuple[str, int], ClientUpdate] = {}
        self._forked: set[tuple[str, int]] = set()
        self._rejections = Rejections()
        # The most rejections one partial reports, as the server bounds them (the rest wait
        # for the next): ``aggregators`` are the run's (None: this one alone).
        self._allowance = rejection_allowance(routed_clients(
            self.clients, aggregators or (aggregator_id,))[aggregator_id])
        self.held_back: dict[str, int] = {}
        """Per client (of this aggregator's), the server's watermark: rounds below it are
        forwarded unmixed (module docstring)."""
        self.unsure_through: int | None = None
        """Updates with a base version up to this are forwarded unmixed (module docstring,
        "Joining a run in progress"); -1 once a run's first close showed a fresh start."""
        self.folded = 0
        """Updates folded into partials so far."""
        self.forwarded = 0
        """Updates forwarded unmixed so far."""
        self.partials = 0
        """Partials sent so far."""
        self.resent = 0
        """Updates of refused groups forwarded one by one (``WindowClose.refused``)."""
        self._kept_groups: dict[int, dict[int, list[ClientUpdate]]] = {}
        """The last two partials' folded updates, by window and base version (module
        docstring, "Refused groups")."""

    async def run(self) -> None:
        """Serve until cancelled."""
        while True:
            message = await self.endpoint.receive()
            if isinstance(message, ClientUpdate):
                await self._arrived(message)
            elif isinstance(message, GlobalModel):
                self._learn(message)
            elif isinstance(message, WindowClose):
                await self.flush(message)
            else:
                _log.warning("aggregator ignored a message", kind=type(message).__name__)

    def _learn(self, model: GlobalModel) -> None:
        """What a global model tells: a published version, the server's version, an invitation."""
        if not self._paced:  # as the server's pacer: from the first model, full after a restart
            self.pacer.restart(self.clock.now(), full=model.version > 0)
            self._paced = True
        self.book.publish(model.version)
        self.book.version = max(self.book.version, model.version)
        if model.invited is not None:
            self.book.remember_invitation(model.window, model.invited)

    async def _arrived(self, update: ClientUpdate) -> None:
        if not self.policy.on_arrival:
            self._hold(update)
            return
        now = self.clock.now()
        for due in self.pacer.due(now):
            await self._check_and_forward(due)
        if self.pacer.offer(update, now) == "pass":
            await self._check_and_forward(update)

    def _hold(self, update: ClientUpdate) -> None:
        """Keep a time window's ``update`` for its close, paced by its arrival time, unless
        the pacer refuses it (``rate``, counted at the close) or it is another copy of a round
        held for this close: a resend (the same base version and norm) is counted
        ``duplicate``, a different update ``forked`` (the client book's verdicts at the close,
        given at once; the first fork of a round logged). So a window holds per client what
        its pace lets through, its 256 waiting updates and one copy of each round, however
        fast or however variously it sends (attackers' reviews: a flood was held whole until
        the close, and copies of a held round differing in base version or norm were held
        too)."""
        key = (update.client_id, update.round)
        held = self._held.get(key)
        if held is not None:
            if (held.base_version, held.norm) == (update.base_version, update.norm):
                self._rejections.add(Kind.DUPLICATE)
            elif key in self._forked:
                self._rejections.add(Kind.FORKED)
            else:
                self._forked.add(key)
                self._refuse(update, Kind.FORKED, (
                    f"a second, different update of round {update.round} held for this "
                    f"window's close (base version {update.base_version}, norm "
                    f"{update.norm}; the first: {held.base_version}, {held.norm}): two copies "
                    f"of this client's state may be running, each spending its privacy"))
            return
        if self.pacer.note(update, self.clock.now(), keep_refused=False) != "refuse":
            self._held[key] = update

    async def _check_and_forward(self, update: ClientUpdate) -> None:
        """On-arrival policies: forward ``update`` unless a public check refuses it."""
        verdict = self.book.judge(update)
        if verdict.kind in (Kind.ACCEPTED, Kind.DUPLICATE, *FORWARDED_KINDS):
            self.book.record(update.client_id, update.round)  # judged here: later copies stop
            await self._forward(update)
        else:
            self._refuse(update, verdict.kind, verdict.reason)

    async def _forward(self, update: ClientUpdate) -> None:
        self.forwarded += 1
        await self.endpoint.publish(update)

    def _refuse(self, update: ClientUpdate, kind: Kind, reason: str) -> None:
        self._rejections.add(kind)
        if kind.rejected:
            _log.warning("update rejected", client=update.client_id, round=update.round,
                         base_version=update.base_version, kind=kind, reason=reason,
                         aggregator=self.aggregator_id)

    async def _paced_at_close(self, now: float) -> list[ClientUpdate]:
        """The held updates the pacer lets through at a close (on-arrival policies: the
        deferred ones are checked and forwarded now, none is held)."""
        if self.policy.on_arrival:  # the deferred updates whose token has accrued
            for due in self.pacer.due(now):
                await self._check_and_forward(due)
            paced = []
        else:
            paced = self.pacer.due(now) + self.pacer.judged_now(list(self._held.values()), now)
            self._held, self._forked = {}, set()
        if refused := self.pacer.take_refused():
            self._rejections.add(Kind.RATE, refused)
        return paced

    def _learn_close(self, close: WindowClose) -> list[ClientUpdate]:
        """What a window close tells: the server's version, the rounds it holds back, and
        (the first close seen) whether this aggregator joined a run in progress; the updates
        of this aggregator's groups it refused, to forward one by one."""
        self.book.version = max(self.book.version, close.version)
        for client_id, below in close.watermarks:
            if client_id in self.clients:
                self.held_back[client_id] = max(below, self.held_back.get(client_id, 0))
        if self.unsure_through is None:
            self.unsure_through = close.version if close.window > 1 else -1
        kept = self._kept_groups
        return [update for aggregator_id, window, base in close.refused
                if aggregator_id == self.aggregator_id
                for update in kept.get(window, {}).pop(base, [])]

    def _alone(self, update: ClientUpdate, folded: int, sums: dict[int, np.ndarray]) -> bool:
        """Whether an accepted ``update`` goes to the server alone: joining a run, a round
        the server holds back, or past what one partial may carry (the codec's bounds, and
        :attr:`max_groups`)."""
        assert self.unsure_through is not None
        return (update.base_version <= self.unsure_through
                or update.round < self.held_back.get(update.client_id, 0)
                or folded >= MAX_PARTIAL_ENTRIES
                or (update.base_version not in sums and len(sums) >= self.max_groups))

    async def flush(self, close: WindowClose) -> Partial:
        """Judge the held updates against the server's ``close.version``, send the window's
        partial (and forward what only the server can judge); the partial sent."""
        now = self.clock.now()
        for update in self._learn_close(close):  # a refused group's, judged alone now
            self.resent += 1
            await self._forward(update)
        paced = await self._paced_at_close(now)
        folded: dict[int, list[ClientUpdate]] = {}
        sums: dict[int, np.ndarray] = {}
        entries: list[ManifestEntry] = []
        settled: list[tuple[str, int]] = []
        keys: set[tuple[str, int]] = set()
        scaled = np.empty(self.size, dtype=np.float64)
        for update in paced:
            verdict = self.book.judge(update, keys)
            key = (update.client_id, update.round)
            accepted = verdict.kind is Kind.ACCEPTED
            if accepted and self._alone(update, len(entries), sums):
                self.book.record(*key)
                await self._forward(update)
            elif accepted:
                weight = self.weights[update.client_id]
                eta = self.clients[update.client_id].step_at(update.round)
                total = sums.get(update.base_version)
                if total is None:
                    total = sums[update.base_version] = np.zeros(self.size, dtype=np.float64)
                np.multiply(update.delta, weight * eta, out=scaled, dtype=np.float64)
                total += scaled
                entries.append(ManifestEntry(update.client_id, update.round,
                                             update.base_version, update.window, weight))
                folded.setdefault(update.base_version, []).append(update)
                keys.add(key)
            elif verdict.kind in FORWARDED_KINDS or (verdict.kind is Kind.DUPLICATE
                                                     and key not in keys):
                self.book.record(*key)  # (the server decides; module docstring)
                await self._forward(update)
            elif verdict.kind is Kind.STALE and len(settled) >= MAX_PARTIAL_ENTRIES:
                await self._forward(update)  # the book recorded it; the server finds it stale
            else:
                if verdict.kind is Kind.STALE:
                    settled.append(key)  # the book recorded it: judged for good
                self._refuse(update, verdict.kind, verdict.reason)
        for client_id, round_index in keys:
            self.book.record(client_id, round_index)
        bases = tuple(sorted(sums))
        vectors = [sums[b].astype(np.float32) for b in bases]
        # What its pacer still holds deferred, not judged here: the server's stop on spent
        # budgets waits for it (module docstring, "Deferred updates").
        waiting = self.pacer.waiting_to_apply(self.book, released=False)
        partial = Partial(
            aggregator_id=self.aggregator_id, window=close.window, bases=bases,
            entries=tuple(sorted(entries, key=lambda e: e.base_version)),
            sums=np.concatenate(vectors) if vectors else np.zeros(0, dtype=np.float32),
            settled=tuple(settled), rejections=self._rejections.take(self._allowance),
            sent_at=now, waiting=waiting)
        # Kept for the next two closes: a partial judged late (in the next window) has its
        # refusal named one close later than an on-time one.
        self._kept_groups = {w: g for w, g in self._kept_groups.items() if w >= close.window - 1}
        self._kept_groups[close.window] = folded
        self.folded += len(entries)
        self.partials += 1
        await self.endpoint.publish(partial)
        return partial
