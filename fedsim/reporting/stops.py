"""Clients' stops by kind, for the report, the comparison and the run's last log line.

A stop's kind is written with it (``clients.csv``'s ``stop_kind``, each entry of
``summary.json``'s ``stopped``; :class:`fedsim.runtime.actors.stops.ClientStopKind`); it is
counted as written, never guessed from the reason's text. A run directory written before stop
kinds existed counts its stops as ``stopped``."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from fedsim.logging import get_logger, summarise_counts

UNKNOWN_KIND = "stopped"


def stop_counts(kinds: Iterable[object]) -> Counter[str]:
    """How many clients stopped for each kind (an empty or missing kind: ``stopped``)."""
    return Counter(str(kind) if kind else UNKNOWN_KIND for kind in kinds)


def log_stops(stopped: Sequence[Mapping[str, Any]], logger: str = "fedsim.run") -> None:
    """The run's one info line on its clients' stops (``"1000 clients stopped: 954 budget, 46
    done"``), from ``summary.json``'s ``stopped``: every entry point that runs a simulation
    logs it, since past a few clients each stop is logged at debug only
    (:func:`fedsim.logging.set_population`)."""
    if stopped:
        counts = stop_counts(entry.get("kind") for entry in stopped)
        get_logger(logger).info(summarise_counts(len(stopped), counts), **dict(counts))
