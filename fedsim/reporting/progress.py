"""A progress bar for ``fedsim run`` and ``fedsim launch`` (tqdm), shown only on a terminal.

The bar advances in virtual seconds (``fedsim launch``: scenario seconds), shown to 0.1 s,
or in server windows; its total is the run's expected
end (:mod:`fedsim.reporting.horizon`: the stop that will come first, the budgets' end
estimated) and can be changed while the bar is shown (:meth:`RunProgress.set_total`). Its
postfix shows the virtual time, the window, the last held-out accuracy, the clients still
training and the lowest remaining privacy budget over all clients. While the bar is shown,
log lines are written through it (``tqdm.write``), so they never garble it. When stderr is not
a terminal the bar is disabled, so log files and CI output stay clean (the structured logs
carry the same numbers).
"""

from __future__ import annotations

import math
import os
import sys
from contextlib import ExitStack
from types import TracebackType
from typing import Any, Literal, Self, TextIO

from tqdm import tqdm

from fedsim.errors import ConfigError
from fedsim.logging import get_logger, route_lines

ProgressUnit = Literal["time", "windows"]
ProgressClock = Literal["virtual", "scenario"]


DEFAULT_COLUMNS, DEFAULT_LINES = 80, 24
"""The screen the bar assumes on a terminal that says it has no size."""


def _terminal_size(stream: TextIO) -> tuple[int | None, int | None]:
    """(columns, lines) of the terminal ``stream`` is; (None, None) when it is none."""
    try:
        size = os.get_terminal_size(stream.fileno())
    except (AttributeError, OSError, ValueError):  # not a terminal, or no descriptor
        return None, None
    return size.columns, size.lines


class _SecondsBar(tqdm):
    """A tqdm bar that shows its count and total in seconds to 0.1 s ("160.7/1200.0 s"), not
    as the float it advances by ("160.7273662500029/1200.0")."""

    @staticmethod
    def format_meter(n: float, total: float | None, elapsed: float,
                     *args: object, **kwargs: object) -> str:
        return tqdm.format_meter(round(n, 1), None if total is None else round(total, 1),
                                 elapsed, *args, **kwargs)


class RunProgress:
    """Context manager around a tqdm bar for one simulation run.

    Args:
        total: the run's end in ``unit`` (virtual seconds or windows); ``None`` if unknown
            (e.g. the run stops at a target accuracy or when every budget is spent).
        unit: ``"time"`` (advance by virtual time) or ``"windows"`` (advance by window).
        enabled: force the bar on or off; ``None`` (default) shows it only when ``stream`` is
            a terminal.
        stream: where the bar is drawn; defaults to the current ``sys.stderr``.
        clock: what the seconds are: ``"virtual"`` (``fedsim run``) or ``"scenario"``
            (``fedsim launch``: the wall clock times the time scale); the bar's label.
    """

    def __init__(self, total: float | None, *, unit: ProgressUnit = "time",
                 enabled: bool | None = None, stream: TextIO | None = None,
                 clock: ProgressClock = "virtual") -> None:
        if unit not in ("time", "windows"):
            raise ConfigError(f"progress unit must be 'time' or 'windows', got {unit!r}")
        if total is not None and not (math.isfinite(total) and total > 0):
            raise ConfigError(f"progress total must be a finite number > 0, got {total!r}")
        self.total = total
        self.unit: ProgressUnit = unit
        self.clock: ProgressClock = clock
        self._stream = stream if stream is not None else sys.stderr
        if enabled is None:
            isatty = getattr(self._stream, "isatty", None)
            enabled = bool(isatty and isatty())
        self.enabled = enabled
        self._bar: tqdm | None = None
        self._routing = ExitStack()
        self.position = 0.0
        self.postfix: dict[str, str] = {}

    def __enter__(self) -> Self:
        if self.enabled:
            self._routing.enter_context(route_lines(self.write))
        bar = _SecondsBar if self.unit == "time" else tqdm
        columns, lines = _terminal_size(self._stream)
        self._bar = bar(
            total=self.total,
            unit="s" if self.unit == "time" else "window",
            desc=f"{self.clock} time" if self.unit == "time" else "windows",
            file=self._stream,
            disable=not self.enabled,
            # A terminal that says it is 0 columns wide or 0 lines high (a pty nobody sized:
            # `script`, some CI runners) drew no bar at all (tqdm hides bars below the
            # screen's last line): such a one gets DEFAULT_COLUMNS x DEFAULT_LINES.
            dynamic_ncols=columns != 0,
            ncols=DEFAULT_COLUMNS if columns == 0 else None,
            nrows=DEFAULT_LINES if lines == 0 else None,
            leave=True,
        )
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self._routing.close()
        if self._bar is not None:
            self._bar.close()
            self._bar = None

    def write(self, line: str) -> None:
        """Write one line above the bar (the bar is redrawn below it)."""
        if self._bar is not None and self.enabled:
            self._bar.write(line, file=self._stream)
        else:
            self._stream.write(line + "\n")
            self._stream.flush()

    def set_total(self, total: float | None) -> None:
        """Change the bar's end (e.g. once the budgets' end is known); None: unknown."""
        if total is not None and not (math.isfinite(total) and total > 0):
            raise ConfigError(f"progress total must be a finite number > 0, got {total!r}")
        if total == self.total:
            return
        self.total = total
        if self._bar is not None:
            self._bar.total = total
            self._bar.refresh()

    def start_at(self, time: float, window: int) -> None:
        """Start the bar's clock now, at virtual ``time`` / ``window``: its rate and time left
        count from here (a launch's first window comes after its processes' start-up, which
        a stranger saw in the rate; a resumed launch's first is far along)."""
        position = float(time) if self.unit == "time" else float(window)
        if self.total is not None:
            position = min(position, float(self.total))
        self.position = max(self.position, position)
        if self._bar is None or self._bar.disable:
            return
        self._bar.reset(total=self.total)
        initial = int(self.position) if self.unit == "windows" else self.position
        self._bar.n = self._bar.last_print_n = initial

    def update(self, time: float, window: int, accuracy: float | None = None,
               min_remaining_epsilon: float | None = None,
               active_clients: int | None = None) -> None:
        """Move the bar to virtual ``time`` / ``window`` and refresh the shown fields.

        ``accuracy``, ``min_remaining_epsilon`` and ``active_clients`` may be ``None`` (not
        evaluated in this window, no budget configured, not known); the last known value is
        then kept.
        """
        position = float(time) if self.unit == "time" else float(window)
        if self.total is not None:
            position = min(position, float(self.total))
        self.postfix["t"] = f"{time:.1f}s"
        self.postfix["window"] = str(window)
        if accuracy is not None:
            self.postfix["acc"] = f"{accuracy:.4f}"
        if active_clients is not None:
            self.postfix["training"] = str(active_clients)
        if min_remaining_epsilon is not None:
            self.postfix["min eps left"] = f"{min_remaining_epsilon:.3f}"
        advance = position - self.position
        self.position = max(self.position, position)
        if self._bar is None:
            return
        self._bar.set_postfix(self.postfix, refresh=False)
        if advance > 0:
            # Whole windows display as "4/10", not "4.0/10".
            self._bar.update(int(advance) if self.unit == "windows" else advance)
        else:
            self._bar.refresh()


_RUN_LOG = get_logger("fedsim.run")
EVALUATION_KEYS = ("window", "time", "version", "accuracy", "applied", "active_clients")


def log_evaluation(line: dict[str, Any]) -> None:
    """A run's progress in its log: one info line (``fedsim.run``, "window") for each window
    that evaluated the model (``fedsim run``'s and :func:`fedsim.simulate`'s)."""
    if line["accuracy"] is not None:
        _RUN_LOG.info("window", **{key: line[key] for key in EVALUATION_KEYS})
