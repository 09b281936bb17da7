"""Clients' stop reasons by kind: "round 498 would exceed its privacy budget" is a *budget*
stop, "finished its 12 rounds" is *done*, "crashed and did not rejoin" is *crashed*."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable

# (word in the reason, kind), first match wins.
STOP_KINDS: tuple[tuple[str, str], ...] = (
    ("budget", "budget"),
    ("finished", "done"),
    ("rounds", "done"),
    ("crash", "crashed"),
)


def stop_kind(reason: str) -> str:
    """The kind of a client's stop reason: budget, done, crashed, or the reason itself."""
    text = reason.lower()
    return next((kind for word, kind in STOP_KINDS if word in text), reason or "stopped")


def stop_counts(reasons: Iterable[str]) -> Counter[str]:
    """How many clients stopped for each kind of reason."""
    return Counter(stop_kind(reason) for reason in reasons)
