"""What one server window reports (a line of ``metrics.jsonl``) and when the run stops after it.

Shared by the simulator and the deployed server (:mod:`fedsim.runtime.actors.server` fills it)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from fedsim.clock import seconds_text
from fedsim.config.schema import Stop
from fedsim.logging import get_logger
from fedsim.runtime.actors.stops import RunStop, RunStopKind

__all__ = ["DURATION_RELATIVE_TOLERANCE", "WindowReport", "duration_stop"]

_log = get_logger("fedsim.runtime.actors.server")


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
    shed: int = 0
    """Of the ``stale``, those that arrived stale and were judged at once (an overload's
    backlog; :attr:`ServerActor.shed_on_arrival`)."""
    duplicate: int = 0
    rejected: int = 0
    step_size: float = 0.0
    accuracy: float | None = None
    loss: float | None = None
    rejections: dict[str, int] = field(default_factory=dict)
    """Rejected updates and statuses by kind (``rejected`` counts the updates among them)."""
    applied_updates: list[tuple[str, int, int]] = field(default_factory=list)
    """(client_id, round, base_version) of each applied update; the version before applying
    was ``version - 1`` (time windows; on-arrival policies: :attr:`applied_to`)."""
    applied_to: list[int] = field(default_factory=list)
    """The version each applied update was applied to (the model's version before it)."""
    lost_in_partials: int = 0
    """Updates in aggregators' partials that came after the end of the run (dropped in flight;
    a partial late for its window joins the next one's mix: :mod:`fedsim.runtime.actors.server`)."""
    partial_wait: float | None = None
    """Seconds the server waited after the window's end for the aggregators' partials (on its
    clock; at most ``aggregator_wait``; None: no aggregators). Not a ``metrics.jsonl`` column."""
    accepted: int = 0
    """Updates judged in this window that passed every check (applied in it, or in a later
    one where a policy buffers them). Not a ``metrics.jsonl`` column."""
    waiting: int = 0
    """Updates held unjudged as the window closes (their clients ahead of their public
    compute slots: :class:`~fedsim.runtime.actors.admission.Pacer`) that could still be
    applied (of rounds their clients say they released, not yet judged): by the server, and
    by its aggregation nodes as far as the server counts their claims
    (:attr:`waiting_at_aggregators`). Not a ``metrics.jsonl`` column."""
    waiting_at_aggregators: int = 0
    """Of :attr:`waiting`, those the aggregation nodes hold, bounded
    (:meth:`~fedsim.runtime.actors.partials.PartialIntake.deferred_at_aggregators`). Not a
    ``metrics.jsonl`` column."""
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

    def log_events(self) -> None:
        """One line for the window's per-message events (duplicates, stale updates, rejections
        by kind), none when there were none: a lossy network's duplicates are counted, not
        logged one by one (each is logged at debug where it is judged). At info where an
        update was stale or refused; a window of duplicates alone, which a scenario's network
        asks for, at debug (a stranger: 33 such lines broke up the quickstart's progress bar;
        metrics.jsonl counts them)."""
        if not (self.duplicate or self.stale or self.rejected or self.rejections):
            return
        log = _log.info if self.stale or self.rejected or self.rejections else _log.debug
        log("window events", window=self.window, duplicate=self.duplicate, stale=self.stale,
            rejected=self.rejected, rejections=dict(sorted(self.rejections.items())),
            **({"shed_on_arrival": self.shed} if self.shed else {}))  # (shed ones are stale)

    def stop_reason(self, stop: Stop, *, active_clients: int, in_flight: int = 0,
                    seconds: str = "virtual") -> RunStop | None:
        """Why the run ends after this window under the scenario's ``stop`` conditions, in
        their order (windows, duration, target accuracy, all budgets spent); None to go on.

        Shared by the simulator and the deployed server; ``seconds`` names their clock and
        ``in_flight`` counts updates the network still carries (0 where delivery is
        at-least-once end to end)."""
        if stop.windows is not None and self.window >= stop.windows:
            return RunStop(RunStopKind.WINDOWS, f"it reached {stop.windows} windows")
        if stop.virtual_seconds is not None:
            reason = duration_stop(stop.virtual_seconds, self.window,
                                   self.time if self.end is None else self.end, seconds,
                                   closed=self.time)
            if reason:
                return RunStop(RunStopKind.DURATION, reason)
        if (stop.target_accuracy is not None and self.accuracy is not None
                and self.accuracy >= stop.target_accuracy):
            return RunStop(RunStopKind.TARGET_ACCURACY,
                           f"it reached the target accuracy {stop.target_accuracy:g}")
        # Quiet: nothing judged in the window passed and nothing that could is waiting. A
        # window of duplicates, stale updates or rejections alone - which a hostile client's
        # replays or junk, or an aggregator's counts, could make of every window - is as
        # quiet as an empty one, where the stop once waited for a window with no arrival.
        if stop.all_budgets_spent and active_clients == 0 and self.accepted == 0 \
                and self.waiting == 0 and in_flight == 0:
            return RunStop(RunStopKind.BUDGETS_SPENT,
                           "no client can train any more and every update has arrived")
        return None


# Window ends are sums and products of floats: 300 windows of 0.1 s end at 29.99999999999996 s
# under virtual time. Ends this close to the limit count as reaching it.
DURATION_RELATIVE_TOLERANCE = 1e-9


def duration_stop(limit: float, window: int, end: float, seconds: str = "virtual", *,
                  closed: float | None = None) -> str:
    """The stop reason of a ``virtual_seconds`` limit after window ``window`` ending at ``end``
    ('' while ``end`` is before the limit): the run ends with the first window whose end is at
    or after the limit, and the reason says where that end was when it is not the limit.
    ``closed``: when the window was closed (a deployed server's clock), said when it is
    visibly later than its end (more than 1% of it: the server ran behind its windows, and
    the run's stop time is that close, not the window's end)."""
    tolerance = DURATION_RELATIVE_TOLERANCE * max(1.0, abs(limit))
    if end < limit - tolerance:
        return ""
    late = ""
    if closed is not None and closed > end + max(tolerance, 0.01 * abs(end)):
        late = (f" (closed at {seconds_text(closed)} {seconds} seconds: the server ran behind "
                f"its windows)")
    if end <= limit + tolerance:
        return f"it reached its limit of {limit:g} {seconds} seconds{late}"
    return (f"window {window} ended at {seconds_text(end)} {seconds} seconds{late}, the first "
            f"window end at or after its limit of {limit:g} s")
