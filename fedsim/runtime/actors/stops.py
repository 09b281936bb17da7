"""Why a client stopped and why a run ended: a typed kind with the sentence that explains it.

The kind is what programs count and compare (``summary.json``'s ``stop_kind`` and each stopped
client's ``kind``, ``clients.csv``'s ``stop_kind``, the report's and the comparison's tallies);
the text is what people read, and may name numbers (:func:`budget_stop_reason`: ``its next
round (round 498, counted from 0) would exceed its privacy budget``). Nothing parses the text
back into a kind. The enums are ``str`` enums, so a kind
is written to JSON and CSV as its value.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

__all__ = ["ClientStopKind", "RunStop", "RunStopKind", "budget_stop_reason", "client_stop_phrase",
           "finished_stop_kind", "stop_fields"]


class ClientStopKind(StrEnum):
    """Why a client will never train again."""

    BUDGET = "budget"
    """Its next round would exceed its privacy budget."""
    DONE = "done"
    """It finished its configured rounds."""
    SERVER_FINISHED = "server_finished"
    """The server finished the run (the text carries the server's reason)."""
    CRASHED = "crashed"
    """It crashed and did not rejoin."""


_CLIENT_PHRASES = {
    ClientStopKind.BUDGET: "their next round would have exceeded their privacy budget",
    ClientStopKind.DONE: "they finished their configured rounds",
    ClientStopKind.SERVER_FINISHED: "the server finished the run",
    ClientStopKind.CRASHED: "they crashed and did not rejoin",
}


def budget_stop_reason(round_index: int, detail: str = "") -> str:
    """A client's stop text when round ``round_index`` (its next) would exceed its budget
    (``detail``: the ledger's refusal, where the ledger refused it). Round indices count
    from 0: "round 272 would exceed its privacy budget" beside ``clients.csv``'s
    ``rounds=272`` (its rounds released) read as a round off by one (a new user)."""
    return (f"its next round (round {round_index}, counted from 0) would exceed its privacy "
            f"budget" + (f" ({detail})" if detail else ""))


def client_stop_phrase(kind: ClientStopKind | str) -> str:
    """The summary's explanation of a group of clients that stopped for ``kind``."""
    try:
        return _CLIENT_PHRASES[ClientStopKind(kind)]
    except ValueError:
        return str(kind) or "they stopped"


class RunStopKind(StrEnum):
    """Which stop condition ended a run."""

    WINDOWS = "windows"
    """``stop.windows`` server windows."""
    DURATION = "duration"
    """``stop.virtual_seconds`` of scenario time."""
    TARGET_ACCURACY = "target_accuracy"
    """``stop.target_accuracy`` reached."""
    BUDGETS_SPENT = "budgets_spent"
    """No client can train any more and every update has arrived."""
    SIGNAL = "signal"
    """Interrupted by a signal (the outputs are partial)."""


@dataclass(frozen=True)
class RunStop:
    """Why a run ends: its :class:`RunStopKind` and the sentence the summary prints."""

    kind: RunStopKind
    text: str

    def __str__(self) -> str:
        return self.text

    @classmethod
    def read(cls, obj: Mapping[str, Any]) -> RunStop | None:
        """The stop that :func:`stop_fields` wrote into ``obj`` (None: none, or an unknown
        kind: the reason is kept only as text then, never guessed from it)."""
        kind, text = obj.get("stop_kind"), obj.get("stop_reason")
        if not isinstance(text, str) or not isinstance(kind, str) or kind not in set(RunStopKind):
            return None
        return cls(RunStopKind(kind), text)


def stop_fields(stop: RunStop | None) -> dict[str, str | None]:
    """``stop_reason`` (the text, '' for none) and ``stop_kind`` (None for none), as
    ``summary.json`` and the deployed server's outcome hold them."""
    return {"stop_reason": stop.text if stop is not None else "",
            "stop_kind": stop.kind.value if stop is not None else None}


def finished_stop_kind(report: Mapping[str, Any], status: Mapping[str, Any],
                       rounds: int | None) -> ClientStopKind:
    """A finished deployed client's stop kind: from its process's report (``stop_kind``), or,
    where the process died before writing one or the report is elsewhere (a server's output
    directory read alone), from its last status (typed fields: the state and the rounds
    against the group's limit ``rounds``, never the text)."""
    kind = report.get("stop_kind")
    if kind in set(ClientStopKind):
        return ClientStopKind(kind)
    if status.get("state") == "budget_exhausted":
        return ClientStopKind.BUDGET
    if status.get("state") == "crashed":  # a deployed client's crash for good
        return ClientStopKind.CRASHED
    if rounds is not None and int(status.get("rounds", 0)) >= rounds:
        return ClientStopKind.DONE
    return ClientStopKind.SERVER_FINISHED
