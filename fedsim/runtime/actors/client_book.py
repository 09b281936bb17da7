"""The server's book of its clients: what it judged of each, its statuses, its published
versions and invitations, and the one verdict on an update (docs/SECURITY.md).

**Never applied twice, in bounded state.** Per client the book keeps a *low watermark* ``low``
and a bitmap of the judged rounds in ``[low, low + WINDOW)``. A round is *judged* once the server
has classified it for good (applied, refused as a bad mix, stale, or of a window the client was
not invited to); its update is then a duplicate forever. The rule, exact and not approximate:

* every round below ``low`` counts as judged: an update of it is a duplicate (never applied);
* ``low`` only moves up: past a judged round (the bitmap's leading run), or when a judged round
  lands ``WINDOW`` or more above it, to that round minus ``WINDOW - 1``. Rounds it passes over
  that were never judged (lost in flight, or not yet arrived) are then refused as duplicates
  too. An honest client has at most 256 updates unacknowledged (its outbox), so none of its
  resends is ever ``WINDOW`` (= :data:`~fedsim.runtime.actors.integrity.MAX_ROUND_GAP`, 1024)
  rounds behind its newest judged round: for honest clients the window changes no verdict.
* a round more than ``MAX_ROUND_GAP`` beyond what the book knows of the client is refused
  (``round_ahead``) and never recorded, so a hostile client moves its window by at most
  ``MAX_ROUND_GAP`` per update that passes every public check (and each one costs it a token of
  its pace, :class:`~fedsim.runtime.actors.admission.Pacer`).

So the book holds ``O(1)`` per client (the bitmap is at most 1024 bits) whatever the run's
length, its checkpoint is ``O(clients)``, and :meth:`ClientBook.judge` is ``O(1)`` per update.

**What a client may claim.** The rounds the book *knows* of a client are its newest judged round
plus one, its adopted base (below), or its kept status's count. A status may claim at most
``MAX_ROUND_GAP`` rounds beyond the *judged* ones (never beyond an earlier status: claims do not
ratchet, issue 25 finding 5), never fewer than were judged, never more than its round limit,
and "done" only at its limit or once the run has ended (a client told that the run is
finished stops as done, whatever its rounds); an update may name a round at most ``MAX_ROUND_GAP`` beyond the
known rounds.

**Adopted rounds** (finding 6). A client the book has no record of (no judged round, no kept
status: a server whose state was lost, or a client whose ledger outlived an earlier run) may
hold more rounds than ``MAX_ROUND_GAP``; its first status that claims them is *adopted*: the
book sets the client's base and watermark to the claimed count, so its rounds below it are
refused (duplicates: released before this server's record began, possibly applied to a model
the server lost) and its new rounds are judged as usual. An adoption never makes a round
acceptable twice (the watermark only moves up) and happens once per client; it is logged,
counted (:attr:`ClientBook.adoptions`) and reported in the server's summary.

**Published versions** (finding R4c): a client can only have trained on a model the server
published; with ``broadcast_every > 1`` the versions between broadcasts are never sent, and an
update claiming one would get staleness 0 where every honest update has more, or pass
``max_staleness``. So an update whose ``base_version`` was never published is refused
(``unpublished_version``). The versions are kept as ``[first, last]`` runs, the newest :data:`PUBLISHED_RUNS`
of them (with ``broadcast_every = 1`` every version is published: one run); a base version
older than the oldest kept run is refused as unpublished (no honest update is that old unless
``max_staleness`` is off and a client is thousands of broadcasts behind). **Invitations** are
kept as bitmaps over the sorted client ids for the newest :data:`INVITED_WINDOWS` windows; an
update naming an older window is refused as not invited.

**Forked clients.** Two copies of one client's state directory running at once (a restored
backup beside the original) each release every round under one id, and each copy's ledger
counts only its own releases. An update of a round judged before is a duplicate, never applied;
but a duplicate of the client's newest round whose base version or norm differs from the first
one's is no resend (a resend carries the same bytes): it is refused as ``forked`` (counted,
logged with both), the one sign the server has that the client's privacy is spent twice. The
book remembers that newest round's base version and norm only (O(1) a client, not
checkpointed): a fork showing only in older rounds, or across a server restart, is not seen.

The book uses public scenario values only and nothing of the server's model but its version:
an aggregator that checks updates for the server can keep one of its own.
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from enum import StrEnum
from typing import Any

from fedsim.logging import get_logger
from fedsim.protocol.messages import ClientStatus, ClientUpdate
from fedsim.protocol.norms import vector_norm
from fedsim.runtime.actors.exposure import invitation_bits_in, is_invited
from fedsim.runtime.actors.integrity import MAX_ROUND_GAP, ClientLimits

__all__ = ["INVITED_WINDOWS", "PUBLISHED_RUNS", "WINDOW", "BookState", "ClientBook", "Kind",
           "PublishedVersions", "Verdict"]

_log = get_logger("fedsim.runtime.actors.client_book")

WINDOW = MAX_ROUND_GAP
"""Rounds above a client's low watermark that the book tells apart (module docstring)."""
PUBLISHED_RUNS = 4096
"""Runs of published versions kept (newest first); older base versions are unpublished."""
INVITED_WINDOWS = 4096
"""Windows whose invitations are kept; an update of an older window is not invited."""


class Kind(StrEnum):
    """What the server makes of an update or a status: the rejection kinds are the keys of
    ``WindowReport.rejections`` (``metrics.jsonl``), everywhere the same names."""

    ACCEPTED = "accepted"
    DUPLICATE = "duplicate"
    STALE = "stale"
    UNKNOWN_CLIENT = "unknown_client"
    SHAPE = "shape"
    ROUND_AHEAD = "round_ahead"
    FUTURE_VERSION = "future_version"
    UNPUBLISHED_VERSION = "unpublished_version"
    NON_FINITE = "non_finite"
    NORM = "norm"
    NOT_INVITED = "not_invited"
    STATUS_INCONSISTENT = "status_inconsistent"
    RATE = "rate"
    BAD_MIX = "bad_mix"
    BAD_PARTIAL = "bad_partial"
    FORKED = "forked"
    """A second, *different* update of the newest round the book saw of a client (not a
    resend: its base version or norm differ): two copies of the client's state are running,
    each spending its privacy (module docstring, "Forked clients")."""
    IMPLAUSIBLE_COUNTS = "implausible_counts"
    """An aggregation node's partial whose rejection counts were left out as made up (one a
    partial, not an update: :func:`~fedsim.runtime.actors.partials.implausible_rejections`)."""

    @property
    def rejected(self) -> bool:
        """A rejection (counted by kind), not a duplicate, a stale update or an accepted one."""
        return self not in (Kind.ACCEPTED, Kind.DUPLICATE, Kind.STALE)


@dataclass(frozen=True, slots=True)
class Verdict:
    """The book's verdict on one update or status; ``dropped_status`` is why the client's kept
    status was dropped by this update (it contradicts a finished status), or ''."""

    kind: Kind
    reason: str = ""
    dropped_status: str = ""


ACCEPTED = Verdict(Kind.ACCEPTED)


@dataclass(slots=True)
class _Client:
    low: int = 0  # every round below is judged (or passed over: module docstring)
    bits: int = 0  # bit i: round low + i judged
    highest: int = -1  # the newest judged round
    judged: int = 0  # rounds judged (for what never arrived)
    base: int = 0  # adopted rounds: released before this book's record of the client began
    status: ClientStatus | None = None
    # The newest round whose update the book judged, its base version and norm: a resend
    # has the same, a forked copy's update of that round another (not checkpointed).
    seen_round: int = -1
    seen_base: int = -1
    seen_norm: float = math.nan

    def holds(self, round_index: int) -> bool:
        offset = round_index - self.low
        return offset < 0 or (offset < WINDOW and bool(self.bits >> offset & 1))

    def record(self, round_index: int) -> bool:
        if self.holds(round_index):
            return False
        offset = round_index - self.low
        if offset >= WINDOW:  # pass over the oldest rounds: the window holds WINDOW rounds
            shift = offset - WINDOW + 1
            self.bits >>= shift
            self.low += shift
            offset -= shift
        self.bits |= 1 << offset
        run = (~self.bits & (self.bits + 1)).bit_length() - 1  # the judged run at low
        self.bits >>= run
        self.low += run
        self.judged += 1
        self.highest = max(self.highest, round_index)
        return True

    def known(self) -> int:
        """Rounds known released: judged, adopted, or claimed by the kept status."""
        return max(self.highest + 1, self.base, self.status.rounds if self.status else 0)

    def judged_known(self) -> int:
        """Rounds known from what the book judged itself (never from a status)."""
        return max(self.highest + 1, self.base)


def _duplicate(entry: _Client | None, round_index: int, base_version: int,
               update: ClientUpdate | None) -> Verdict:
    """The verdict on an update of a round judged (or accepted and waiting) before: a
    duplicate, or ``forked`` where it is a different update of the newest round seen (module
    docstring, "Forked clients")."""
    low = entry.low if entry is not None else 0
    if update is not None and update.norm is not None and entry is not None \
            and round_index == entry.seen_round \
            and (base_version, update.norm) != (entry.seen_base, entry.seen_norm):
        return Verdict(Kind.FORKED, (
            f"a second, different update of round {round_index} (base version {base_version}, "
            f"norm {update.norm:.6g}; the first: {entry.seen_base}, {entry.seen_norm:.6g}): "
            f"two copies of this client's state may be running, each spending its privacy; "
            f"stop one"))
    return Verdict(Kind.DUPLICATE, "judged before" if round_index >= low else
                   f"round {round_index} is below the client's watermark {low}")


def _entry_of(row: Sequence[Any] | None, status: ClientStatus | None) -> _Client:
    """A client's entry from its checkpoint row ``[low, bits as hex, highest, judged, base]``
    (:class:`BookState`; None: none) and its kept status."""
    entry = _Client(status=status)
    if row is not None:
        low, bits, highest, judged, base = row
        entry.low, entry.bits, entry.highest = int(low), int(str(bits), 16), int(highest)
        entry.judged, entry.base = int(judged), int(base)
    return entry


class PublishedVersions:
    """Published versions as sorted runs, the newest :data:`PUBLISHED_RUNS` of them."""

    def __init__(self, runs: Iterable[Iterable[int]] = ([0, 0],)) -> None:
        self.firsts: list[int] = []
        self.lasts: list[int] = []
        for first, last in (tuple(r) for r in runs):
            self.firsts.append(int(first))
            self.lasts.append(int(last))

    def __contains__(self, version: object) -> bool:
        if not isinstance(version, int) or not self.firsts:
            return False
        if self.firsts[-1] <= version <= self.lasts[-1]:
            return True  # the common case: the newest run
        i = bisect.bisect_right(self.firsts, version) - 1
        return i >= 0 and version <= self.lasts[i]

    def add(self, version: int) -> None:
        if version in self:
            return
        i = bisect.bisect_right(self.firsts, version)
        if i > 0 and self.lasts[i - 1] == version - 1:
            self.lasts[i - 1] = version
            if i < len(self.firsts) and self.firsts[i] == version + 1:
                self.lasts[i - 1] = self.lasts.pop(i)
                self.firsts.pop(i)
        elif i < len(self.firsts) and self.firsts[i] == version + 1:
            self.firsts[i] = version
        else:
            self.firsts.insert(i, version)
            self.lasts.insert(i, version)
        if len(self.firsts) > PUBLISHED_RUNS:
            del self.firsts[0], self.lasts[0]

    def runs(self) -> list[list[int]]:
        return [[f, last] for f, last in zip(self.firsts, self.lasts, strict=True)]

    def oldest(self) -> int:
        return self.firsts[0] if self.firsts else 0


@dataclass(frozen=True)
class BookState:
    """A copy of the book for a checkpoint (JSON-ready through :meth:`document`): per client
    ``[low, bitmap as hex, highest, judged, base]`` and its status, the published runs and the
    kept invitations (window -> bitmap as hex). Its size is ``O(clients + windows kept)``."""

    clients: dict[str, list[Any]] = field(default_factory=dict)
    statuses: dict[str, ClientStatus] = field(default_factory=dict)
    published: list[list[int]] = field(default_factory=lambda: [[0, 0]])
    invitations: dict[int, str] = field(default_factory=dict)
    adoptions: int = 0

    def __contains__(self, key: object) -> bool:
        """Whether ``(client_id, round)`` was judged when the copy was taken (a deployed server
        acknowledges an update once a checkpoint holding it is durable)."""
        if not isinstance(key, tuple) or len(key) != 2 or not isinstance(key[1], int):
            return False
        entry = self.clients.get(key[0])
        if entry is None:
            return False
        offset = key[1] - entry[0]
        return offset < 0 or (offset < WINDOW and bool(int(entry[1], 16) >> offset & 1))

    def known_rounds(self, client_id: str) -> int:
        """:meth:`ClientBook.known_rounds` of the book this copy restores."""
        row, status = self.clients.get(client_id), self.statuses.get(client_id)
        return _entry_of(row, status).known() if row or status else 0

    def document(self) -> dict[str, Any]:
        return {"clients": self.clients,
                "statuses": {c: asdict(s) for c, s in self.statuses.items()},
                "published": self.published,
                "invitations": {str(w): bits for w, bits in self.invitations.items()},
                "adoptions": self.adoptions}

    @classmethod
    def from_document(cls, document: Mapping[str, Any]) -> BookState:
        return cls(
            clients={str(c): [int(v[0]), str(v[1]), int(v[2]), int(v[3]), int(v[4])]
                     for c, v in document["clients"].items()},
            statuses={str(c): ClientStatus(**s) for c, s in document["statuses"].items()},
            published=[[int(f), int(last)] for f, last in document["published"]],
            invitations={int(w): str(bits) for w, bits in document["invitations"].items()},
            adoptions=int(document.get("adoptions", 0)))


class ClientBook:
    """What the server knows of its ``clients`` (id -> limits, None: unbounded) and judges
    updates of a ``size``-parameter model with (module docstring)."""

    def __init__(self, clients: Mapping[str, ClientLimits | None], size: int, *,
                 max_staleness: int | None = None, invites: bool = False) -> None:
        self.limits = dict(clients)
        self.size = size
        self.max_staleness = max_staleness
        self.invites = invites
        self.version = 0
        self._order = {c: i for i, c in enumerate(sorted(self.limits))}
        self._clients: dict[str, _Client] = {}
        self.published = PublishedVersions()
        self._invitations: dict[int, bytes] = {}
        self.adoptions = 0
        """Clients whose claimed rounds the book adopted (module docstring)."""

    # -- what it knows ----------------------------------------------------------------------
    def __contains__(self, key: object) -> bool:
        """Whether ``(client_id, round)`` is judged (an update of it is a duplicate)."""
        if not isinstance(key, tuple) or len(key) != 2:
            return False
        entry = self._clients.get(key[0])
        return entry is not None and isinstance(key[1], int) and entry.holds(key[1])

    @property
    def statuses(self) -> dict[str, ClientStatus]:
        """The kept statuses (a copy)."""
        return {c: e.status for c, e in self._clients.items() if e.status is not None}

    def status(self, client_id: str) -> ClientStatus | None:
        entry = self._clients.get(client_id)
        return entry.status if entry is not None else None

    def known_rounds(self, client_id: str) -> int:
        """Rounds the book knows ``client_id`` released (judged, adopted or claimed by its
        kept status): an honest client's ledger records at least as many, so a client that
        starts below it has lost its ledger (told with its welcome and receipts,
        docs/SECURITY.md)."""
        entry = self._clients.get(client_id)
        return entry.known() if entry is not None else 0

    def judged_count(self, client_id: str) -> int:
        entry = self._clients.get(client_id)
        return entry.judged if entry is not None else 0

    def watermark(self, client_id: str) -> int:
        entry = self._clients.get(client_id)
        return entry.low if entry is not None else 0

    def missing(self) -> int:
        """Rounds the clients released (by their statuses and round numbers, after any adopted
        base) that were never judged: lost, or still in flight."""
        return sum(max(0, e.known() - e.base - e.judged) for e in self._clients.values())

    def _entry(self, client_id: str) -> _Client:
        entry = self._clients.get(client_id)
        if entry is None:
            entry = self._clients[client_id] = _Client()
        return entry

    # -- recording --------------------------------------------------------------------------
    def record(self, client_id: str, round_index: int) -> None:
        """``(client_id, round_index)`` is judged for good (applied, bad mix, stale, uninvited)."""
        self._entry(client_id).record(round_index)

    def publish(self, version: int) -> None:
        self.published.add(version)

    def invite(self, window: int, invited: Iterable[str]) -> bytes:
        """Remember ``window``'s invitees (added to an earlier draw of it); its bitmap."""
        bits = invitation_bits_in(self._order, invited)
        self.remember_invitation(window, bits)
        return bits

    def remember_invitation(self, window: int, bits: bytes) -> None:
        """Keep ``window``'s invitation bitmap as a global model carried it (an aggregator
        learns the server's draws from the models it publishes)."""
        old = self._invitations.pop(window, bytes(len(bits)))
        if len(old) == len(bits):
            self._invitations[window] = bytes(a | b for a, b in zip(old, bits, strict=True))
        while len(self._invitations) > INVITED_WINDOWS:
            del self._invitations[next(iter(self._invitations))]

    def invited(self, client_id: str, window: int) -> bool:
        bits = self._invitations.get(window)
        return bits is not None and is_invited(bits, self._order.get(client_id, -1))

    # -- the verdicts -----------------------------------------------------------------------
    def judge(self, update: ClientUpdate, pending: Any = frozenset()) -> Verdict:
        """The verdict on ``update`` (docs/SECURITY.md, in this order): unknown client, wrong
        length, round beyond its limit or ``MAX_ROUND_GAP`` beyond the known rounds, duplicate
        (judged, or accepted and waiting in ``pending``), a base version ahead of the server's
        or never published, not finite, beyond the norm bound; then stale (``max_staleness``)
        and not invited, both recorded as judged; else accepted (recorded once applied).
        ``O(1)``."""
        return self._judge(update.client_id, update.round, update.base_version, update.window,
                           pending, update)

    def judge_entry(self, client_id: str, round_index: int, base_version: int, window: int,
                    pending: Any = frozenset()) -> Verdict:
        """:meth:`judge` of an update known by its manifest entry alone (an aggregator's
        partial, :mod:`~fedsim.runtime.actors.aggregator`): every check but the vector's
        length, finiteness and norm, which the server checks on the partial's sum."""
        return self._judge(client_id, round_index, base_version, window, pending, None)

    def _judge(self, client_id: str, round_index: int, base_version: int, window: int,  # noqa: PLR0911, PLR0913 - one return per check, in order
               pending: Any, update: ClientUpdate | None) -> Verdict:
        if client_id not in self.limits:
            return Verdict(Kind.UNKNOWN_CLIENT, "not a client of this scenario")
        limits = self.limits[client_id]
        if update is not None and (update.delta.size != self.size or update.delta.ndim != 1):
            return Verdict(Kind.SHAPE, f"{update.delta.size} values, the model has {self.size}")
        if limits is not None and limits.max_rounds is not None and round_index >= limits.max_rounds:
            return Verdict(Kind.ROUND_AHEAD,
                           f"round {round_index} beyond the client's {limits.max_rounds} rounds")
        entry = self._clients.get(client_id)
        known = entry.known() if entry is not None else 0
        if round_index > known + MAX_ROUND_GAP:
            return Verdict(Kind.ROUND_AHEAD, f"round {round_index} is more than {MAX_ROUND_GAP} "
                                             f"ahead of the {known} rounds known")
        if (entry is not None and entry.holds(round_index)) or (client_id, round_index) in pending:
            return _duplicate(entry, round_index, base_version, update)
        problem = self._claims(base_version, update, limits)
        if problem is not None:
            return problem
        if update is not None and update.norm is not None:  # this round's first one judged
            self._saw(client_id, round_index, base_version, update.norm)
        dropped = self._contradicted(entry, round_index)
        if self.max_staleness is not None and self.version - base_version > self.max_staleness:
            self.record(client_id, round_index)
            return Verdict(Kind.STALE, f"staleness {self.version - base_version}", dropped)
        if self.invites and not self.invited(client_id, window):
            self.record(client_id, round_index)
            return Verdict(Kind.NOT_INVITED, f"window {window}", dropped)
        return Verdict(Kind.ACCEPTED, "", dropped) if dropped else ACCEPTED

    def _saw(self, client_id: str, round_index: int, base_version: int, norm: float) -> None:
        """Remember the newest round's update by its base version and norm (a resend's are
        the same; "Forked clients")."""
        entry = self._entry(client_id)
        if round_index >= entry.seen_round:
            entry.seen_round, entry.seen_base, entry.seen_norm = round_index, base_version, norm

    def _claims(self, base_version: int, update: ClientUpdate | None,
                limits: ClientLimits | None) -> Verdict | None:
        if base_version > self.version:
            return Verdict(Kind.FUTURE_VERSION, f"base version {base_version} > server "
                                                f"version {self.version}")
        if base_version not in self.published:
            older = base_version < self.published.oldest()
            return Verdict(Kind.UNPUBLISHED_VERSION, f"base version {base_version} was "
                           + ("published before the versions the server keeps" if older
                              else "never published"))
        if update is None:
            return None
        norm = update.norm if update.norm is not None else vector_norm(update.delta)
        if not math.isfinite(norm):
            return Verdict(Kind.NON_FINITE, "the update is not finite")
        if limits is not None:
            bound = limits.norm_bound(update.round)
            if norm > bound:
                return Verdict(Kind.NORM, f"norm {norm:.4g} exceeds the bound {bound:.4g} for "
                                          "this client")
        return None

    @staticmethod
    def _contradicted(entry: _Client | None, round_index: int) -> str:
        """Drop a finished status that this update's round contradicts; why, or ''."""
        status = entry.status if entry is not None else None
        if entry is None or status is None or status.state not in ("done", "budget_exhausted", "crashed") \
                or round_index < status.rounds:
            return ""
        entry.status = None
        return f"round {round_index} arrived after a {status.state!r} status claiming " \
               f"{status.rounds} rounds"

    def judge_status(self, status: ClientStatus, *, run_ended: bool = False) -> Verdict:
        """Keep ``status`` (``ACCEPTED``) if it agrees with what the book judged (module
        docstring: claims bounded by the judged rounds, a first far claim adopted), else a
        ``status_inconsistent`` or ``unknown_client`` verdict (nothing kept). ``run_ended``:
        the server has announced the run's end, to which a client answers "done"."""
        client_id, rounds = status.client_id, status.rounds
        if client_id not in self.limits:
            return Verdict(Kind.UNKNOWN_CLIENT, "not a client of this scenario")
        limits = self.limits[client_id]
        entry = self._clients.get(client_id)
        judged = entry.judged + entry.base if entry is not None else 0
        bad = Kind.STATUS_INCONSISTENT
        if (fault := _claim_fault(status, judged, run_ended)) is not None:
            return Verdict(bad, fault)
        known = entry.judged_known() if entry is not None else 0
        adopt = rounds > known + MAX_ROUND_GAP and (entry is None or (
            entry.judged == 0 and entry.base == 0 and entry.status is None))
        if rounds > known + MAX_ROUND_GAP and not adopt:
            return Verdict(bad, f"claims {rounds} rounds, more than {MAX_ROUND_GAP} beyond the "
                                f"{known} judged")
        max_rounds = limits.max_rounds if limits is not None else None
        if max_rounds is not None and rounds > max_rounds:
            return Verdict(bad, f"claims {rounds} rounds, its limit is {max_rounds}")
        if status.state == "done" and limits is not None and not run_ended and (
                max_rounds is None or rounds != max_rounds):
            return Verdict(bad, f"'done' after {rounds} rounds, its limit is {max_rounds}")
        entry = self._entry(client_id)
        if adopt:
            entry.base = entry.low = rounds
            entry.bits = 0
            self.adoptions += 1
            _log.warning("client's rounds adopted: the server has no record of them (a lost "
                         "server state, or a ledger older than this run)",
                         client=client_id, rounds=rounds)
        entry.status = status
        return ACCEPTED

    # -- checkpoints ------------------------------------------------------------------------
    def state(self, *, publishing: int | None = None) -> BookState:
        """A copy for a checkpoint, ``O(clients + kept windows)``; ``publishing``: a version
        about to be published, recorded as published in the copy."""
        published = self.published
        if publishing is not None and publishing not in published:
            published = PublishedVersions(published.runs())
            published.add(publishing)
        return BookState(
            clients={c: [e.low, format(e.bits, "x"), e.highest, e.judged, e.base]
                     for c, e in self._clients.items()},
            statuses=self.statuses,
            published=published.runs(),
            invitations={w: bits.hex() for w, bits in self._invitations.items()},
            adoptions=self.adoptions)

    def load(self, state: BookState) -> None:
        """Continue from ``state`` (:meth:`state`); its clients must be this book's."""
        self._clients = {client_id: _entry_of(state.clients.get(client_id),
                                              state.statuses.get(client_id))
                         for client_id in {**state.clients, **state.statuses}}
        self.published = PublishedVersions(state.published)
        self._invitations = {int(w): bytes.fromhex(bits) for w, bits in state.invitations.items()}
        self.adoptions = state.adoptions


def _claim_fault(status: ClientStatus, judged: int, run_ended: bool) -> str | None:
    """What is wrong with the counts ``status`` claims, or None: no fewer rounds than the
    ``judged``, and a final status (one that counts its client's unacknowledged updates,
    :class:`ClientStatus`) comes after the run's end only and counts no more updates than its
    client released."""
    if status.rounds < judged:
        return f"claims {status.rounds} rounds released, the server received {judged}"
    if status.unacknowledged is None:
        return None
    if not run_ended:
        return "a final status before the run's end"
    if status.unacknowledged > status.rounds:
        return (f"claims {status.unacknowledged} of its {status.rounds} released rounds "
                f"unacknowledged")
    return None
