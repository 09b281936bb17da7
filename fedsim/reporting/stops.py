"""Clients' stops by kind, for the report, the comparison and the run's last log line.

A stop's kind is written with it (``clients.csv``'s ``stop_kind``, each entry of
``summary.json``'s ``stopped``; :class:`fedsim.runtime.actors.stops.ClientStopKind`); it is
counted as written, never guessed from the reason's text. A run directory written before stop
kinds existed counts its stops as ``stopped``."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable

UNKNOWN_KIND = "stopped"


def stop_counts(kinds: Iterable[object]) -> Counter[str]:
    """How many clients stopped for each kind (an empty or missing kind: ``stopped``)."""
    return Counter(str(kind) if kind else UNKNOWN_KIND for kind in kinds)
