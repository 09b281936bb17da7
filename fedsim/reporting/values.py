"""Values read from files a report is handed (a run directory, a server's output directory):
each read as what it must be, or as unknown (None, ''), never trusted to be well formed.

A run directory may come from elsewhere (a colleague's, a container's), so a number may be a
boolean, an integer of hundreds of digits, NaN; a string may carry terminal escapes. A report
says "unknown" for those rather than crash or print them.

Also how a report prints an epsilon (:func:`epsilon_text`, defined with every output's rule in
:mod:`fedsim.privacy.epsilon_text`; :func:`spread`), one rule for the tables and the sentences.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Iterable
from typing import Any

from fedsim.privacy.epsilon_text import epsilon_text

__all__ = ["accuracy", "count", "epsilon_text", "finite_number", "name_text", "printable",
           "relative_gap", "spread"]


def finite_number(value: Any) -> float | None:
    """``value`` as a finite float if it is a JSON number that is one (not a bool, not an
    integer too large for a float), else None."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    try:
        number = float(value)
    except OverflowError:
        return None
    return number if math.isfinite(number) else None


def accuracy(value: Any) -> float | None:
    """``value`` if it is an accuracy: a finite JSON number from 0 to 1 (a review's summary.json
    stating 1e308 was printed as 309 digits, a metrics line's 400-digit one broke the plot),
    else None."""
    number = finite_number(value)
    return number if number is not None and 0.0 <= number <= 1.0 else None


def relative_gap(reported: float, recomputed: float) -> float:
    """``(reported - recomputed)`` relative to the larger of the two (at least 1e-12): how far a
    figure a file states is from the one recomputed from the ledgers (positive: it states
    more), the one measure the report's and the comparison's checks use."""
    return (reported - recomputed) / max(abs(reported), abs(recomputed), 1e-12)


def count(value: Any) -> int | None:
    """``value`` if it is a count (a non-negative int, not a bool), else None."""
    return value if type(value) is int and value >= 0 else None


def printable(value: Any, limit: int = 500) -> str:
    """``value`` if it is a string, its first ``limit`` characters with every character that
    is not printable (terminal escapes, newlines) shown as '?', else ''."""
    if not isinstance(value, str):
        return ""
    return "".join(c if c.isprintable() else "?" for c in value[:limit])


def name_text(value: object) -> str:
    """A file's name or path, taken from a directory someone handed over, as a message prints
    it: itself where every character is printable, else each character that is not written as
    ``repr`` writes it (``\\x1b``, ``\\n``): a review's ledger named with a terminal escape
    sequence was printed raw in an error. (:func:`printable` is for values read from files: it
    shows such a character as '?', which would not tell two names apart.)"""
    text = str(value)
    if text.isprintable():
        return text
    return "".join(c if c.isprintable() else repr(c)[1:-1] for c in text)


def spread(values: Iterable[float]) -> str:
    """``min a / median b / max c`` of one or more epsilons, each by :func:`epsilon_text`."""
    ordered = sorted(values)
    return (f"min {epsilon_text(ordered[0])} / median "
            f"{epsilon_text(float(statistics.median(ordered)))} / max {epsilon_text(ordered[-1])}")
