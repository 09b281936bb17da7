"""The messages actors exchange. The byte encoding is in :mod:`fedsim.protocol.codec`.

Parameters and updates travel as flat float32 vectors (the model's parameters concatenated in
``named_parameters()`` order); shapes are checked against the model on decode.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

import numpy as np

from fedsim.config.compression import Compression

PROTOCOL_VERSION = 4
"""2: updates lost ``num_samples`` (N is private) and gained ``window``; global models carry
the window they open and its invitation. 3: global models carry the server step size
``step_size`` of the window they open. 4: the server's welcomes and receipts carry the rounds
it knows the client released (``known``, :mod:`fedsim.transports.mqtt`), which a version-3
client would refuse as malformed and wait forever: the frames' version makes a mixed
deployment fail at once, with the versions named."""


@dataclass(frozen=True, eq=False)
class ClientUpdate:
    """One noised local round: ``delta`` is Ubar/m (already clipped, noised, averaged).

    ``(client_id, round)`` identifies the update; the server applies each at most once.
    ``base_version`` is the global model version the round was computed on; ``window`` the
    window whose invitation the round was begun under (0 when the server invites everyone).

    Nothing here depends on the client's exact data set size N except ``delta`` (the
    mechanism's output): under add/remove neighbours N itself is private, so the server weighs
    by the scenario's declared sizes (:mod:`fedsim.runtime.actors.exposure`) and ``sent_at`` follows a
    schedule of public values.
    """

    client_id: str
    round: int
    base_version: int
    delta: np.ndarray
    batch_size: float  # m, a public parameter (the expected batch size for Poisson)
    sent_at: float = 0.0  # sender's clock, for latency metrics only
    window: int = 0
    norm: float | None = field(default=None, repr=False)
    """The L2 norm of ``delta`` (:func:`fedsim.protocol.norms.vector_norm`), set by the decoder
    from the same pass that checks the values are finite; not on the wire. None: not known
    (a receiver computes it)."""
    compression: Compression | None = field(default=None, repr=False)
    """How the sender's codec compresses ``delta`` on the wire (the group's ``compression:``,
    :mod:`fedsim.protocol.compression`); None: the full vector. A decoded update holds the
    dense vector the payload stands for, and None here."""


@dataclass(frozen=True, eq=False)
class GlobalModel:
    """A global model broadcast by the server; clients ignore versions older than theirs.

    It also carries the invitation to window ``window`` (client sampling by invitation, see
    :mod:`fedsim.runtime.actors.exposure`): ``invited`` is a bitmap over the scenario's sorted client
    ids (bit ``i`` of byte ``i // 8``, least significant first), or None when every client is
    invited. A client trains only under the latest invitation that names it.

    ``step_size`` is the server step size s_t of the window it opens (van Dijk & Nguyen: the server
    "decides when to reduce the step size ... and broadcasts the new step sizes to the
    clients"); a client that follows it steps ``w <- w - s_t eta_i u`` locally.
    """

    version: int
    params: np.ndarray
    sent_at: float = 0.0
    window: int = 0
    invited: bytes | None = None
    step_size: float = 1.0


@dataclass(frozen=True)
class RunFinished:
    """The server's last word: the run is over (its stop condition held) at model ``version``.

    Published by the server only (on the global topic, which only the server may publish to,
    retained, so a client that reconnects later learns it too) before it exits. A client that
    receives it stops at once: a round begun but not released is cancelled and not charged.
    """

    version: int
    reason: str
    sent_at: float = 0.0


ClientState = Literal["training", "waiting", "budget_exhausted", "offline", "done", "crashed"]


@dataclass(frozen=True)
class ClientStatus:
    """A client's self-report: its state and what its ledger says it has spent.

    ``unacknowledged`` is set in a deployed client's *final* status only, the one it sends
    once it has seen the end of the run: how many of its released (charged) updates the server
    never acknowledged (None: not a final status)."""

    client_id: str
    state: ClientState
    rounds: int
    epsilon: float
    delta: float
    detail: str = ""
    sent_at: float = 0.0
    extra: dict[str, float] = field(default_factory=dict)
    unacknowledged: int | None = None


@dataclass(frozen=True)
class WindowClose:
    """The server closes window ``window`` at model ``version`` (time windows with aggregation
    nodes): every aggregator flushes what it holds for the window as one :class:`Partial`.

    Published by the server only (on the aggregators' control topic); ``version`` is the model
    the window's updates are judged against (staleness, base versions). ``watermarks`` are
    ``(client_id, round)``: every round of that client below ``round`` counts as judged at the
    server, for a reason an aggregator cannot see (a client's status adopted there, or an entry
    of that client refused a partial), so an aggregator folds none of them: it forwards them for
    the server to judge one by one (:mod:`fedsim.runtime.actors.aggregator`). ``refused`` are
    ``(aggregator_id, window, base_version)`` of partials' groups the server refused since the
    last close: that aggregator forwards the updates it folded into such a group, one by one."""

    window: int
    version: int
    sent_at: float = 0.0
    watermarks: tuple[tuple[str, int], ...] = ()
    refused: tuple[tuple[str, int, int], ...] = ()


@dataclass(frozen=True)
class ManifestEntry:
    """One update an aggregator folded into a partial: its ``(client_id, round)``, the
    ``base_version`` it was computed on, the ``window`` of its invitation and the mixing
    ``weight`` the aggregator gave it (the scenario's raw weight of the client, which the
    server recomputes)."""

    client_id: str
    round: int
    base_version: int
    window: int
    weight: float


@dataclass(frozen=True, eq=False)
class Partial:
    """An aggregator's pre-mixed updates of one window (:mod:`fedsim.runtime.actors.aggregator`).

    ``bases`` are the distinct base versions of the folded updates, ascending; ``sums`` holds
    one vector per base version, concatenated in that order: ``sum_i weight_i eta_i u_i``
    over the ``entries`` of that base version (``eta_i`` the client's agreed step size of
    the round). ``settled`` are ``(client_id, round)`` the aggregator judged for good without
    folding (stale, not invited), ``rejections`` what it refused by kind (the
    :class:`~fedsim.runtime.actors.client_book.Kind` names, plus ``duplicate`` and ``stale``).
    ``waiting`` is how many updates the aggregator's pacer holds deferred as it sends the
    partial, not yet judged there (the server's stop on spent budgets waits for them, within
    its bounds: :mod:`fedsim.runtime.actors.partials`).
    An aggregator sends exactly one per :class:`WindowClose`, empty when it holds nothing."""

    aggregator_id: str
    window: int
    bases: tuple[int, ...]
    entries: tuple[ManifestEntry, ...]
    sums: np.ndarray
    settled: tuple[tuple[str, int], ...] = ()
    rejections: dict[str, int] = field(default_factory=dict)
    sent_at: float = 0.0
    waiting: int = 0

    def group(self, index: int, size: int) -> np.ndarray:
        """The sum of base version ``bases[index]`` (a view of ``sums``; ``size`` parameters)."""
        return self.sums[index * size:(index + 1) * size]


Message = ClientUpdate | GlobalModel | ClientStatus | RunFinished | WindowClose | Partial
