"""Structured logging for fedsim (structlog).

Logs go to stderr: one JSON object per line when stderr is not a terminal (CI, files, a
process supervisor), a readable coloured console line otherwise. stdout is left for command
output (tables, ``--json`` answers), so ``fedsim ... --json | jq`` keeps working while logs
flow.

Call :func:`configure_logging` once at process start (the CLI does, with the level that
``--quiet``, ``--verbose`` or ``--log-level`` chose); calling it again simply replaces the
configuration, so it is safe in tests. Library code only calls :func:`get_logger`.

As a library (``fedsim.simulate`` and friends in someone else's process) fedsim configures
nothing: while structlog is configured (by the CLI's :func:`configure_logging`, or by the
caller's own ``structlog.configure``) its loggers follow that configuration; while it is not,
they hand their lines to the standard library's ``logging`` (loggers named ``fedsim.*``, the
line's fields after its event), whose defaults show warnings and errors on stderr and nothing
else - ``logging.basicConfig(level=logging.INFO)`` (or a level on the ``fedsim`` logger)
shows more. Nothing is ever written to stdout.

While a progress bar is drawn, :func:`route_lines` sends every finished log line through it
(``tqdm.write``), so lines never garble the bar. Events that every client emits ("client
stopped") are logged at :func:`client_event_level`: info for a small population, debug for a
large one, whose runs log a summary at info instead (:func:`summarise_counts`).
"""

from __future__ import annotations

import logging as std_logging
import sys
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from typing import Any, TextIO

import structlog

from fedsim.errors import ConfigError

LEVELS: dict[str, int] = {
    "debug": std_logging.DEBUG,
    "info": std_logging.INFO,
    "warning": std_logging.WARNING,
    "error": std_logging.ERROR,
    "critical": std_logging.CRITICAL,
}


# Populations above this size log per-client events at debug (a summary goes to info).
PER_CLIENT_INFO_LIMIT = 20

_line_sink: Callable[[str], None] | None = None
_client_event_level = std_logging.INFO


class _NamedPrintLogger(structlog.PrintLogger):
    """A PrintLogger that knows its name (``structlog.stdlib.add_logger_name`` reads it) and
    writes through the line sink of :func:`route_lines` while one is set."""

    def __init__(self, file: TextIO, name: str) -> None:
        super().__init__(file)
        self.name = name

    def msg(self, message: str) -> None:
        sink = _line_sink
        if sink is None:
            super().msg(message)
        else:
            sink(message)

    log = debug = info = warn = warning = msg
    fatal = failure = err = error = critical = exception = msg


@contextmanager
def route_lines(sink: Callable[[str], None]) -> Iterator[None]:
    """Within the block, every log line is handed to ``sink`` (one rendered line, no newline)
    instead of being written to stderr; e.g. ``tqdm.write`` while a progress bar is shown."""
    global _line_sink
    previous, _line_sink = _line_sink, sink
    try:
        yield
    finally:
        _line_sink = previous


def set_population(clients: int) -> None:
    """Tell the logs how many clients a run has: above :data:`PER_CLIENT_INFO_LIMIT` their
    per-client events go to debug."""
    global _client_event_level
    _client_event_level = std_logging.DEBUG if clients > PER_CLIENT_INFO_LIMIT else std_logging.INFO


def client_event_level() -> int:
    """The level of per-client events ("client stopped", "client crashed"): see
    :func:`set_population`."""
    return _client_event_level


def summarise_counts(total: int, counts: Mapping[str, int], what: str = "clients stopped") -> str:
    """``"1000 clients stopped: 954 budget, 46 done"`` (kinds by count, largest first)."""
    parts = ", ".join(f"{n} {kind}" for kind, n in sorted(counts.items(),
                                                         key=lambda item: (-item[1], item[0])))
    return f"{total} {what}" + (f": {parts}" if parts else "")


def level_from(*, quiet: bool = False, verbose: bool = False, log_level: str | None = None) -> str:
    """The log level the command-line flags ask for: ``--log-level`` wins, ``--quiet`` is
    ``warning``, ``--verbose`` is ``debug``, otherwise ``info``."""
    if log_level is not None:
        return log_level
    if quiet:
        return "warning"
    return "debug" if verbose else "info"


REJECTION_EVENTS = frozenset({
    "message rejected", "update rejected", "status rejected",
    "message of another run incarnation ignored",
    "access denied: forged client id", "access denied: not a client of this run",
    "access denied: not this aggregator's",
    "update of a round the client was not invited to",
    "partial's rejection counts implausible: left out",
})
"""Warnings a hostile or broken peer can cause once per message it sends (:class:`Throttle`).
The refusals of a message naming another client than its topic's, or sent on a topic of no
client of the run, are among them (an attacker's review, session 66b: one client's 2,000
statuses naming another client wrote 2,000 warnings to the server's log, every one of them
counted as well, as every refusal is: ``forged_client_id``)."""
SUMMARY_EVERY = 60.0
"""Seconds between two summaries of the throttled warnings."""
MAX_THROTTLE_KEYS = 10_000
"""(event, sender, kind) triples remembered as already warned about; beyond it every
further rejection is summarised only (memory stays bounded whatever the peers send)."""


class Throttle:
    """A structlog processor that keeps a peer's flood of rejections from flooding the log.

    The first of :data:`REJECTION_EVENTS` per ``(event, sender, kind)`` is a warning (it says
    that the rest are summarised); the others are counted and written at debug only (when the
    log level is debug) and, every :data:`SUMMARY_EVERY` seconds, one info line counts them by
    event and kind (``rejections summarised``; the line replaces the rejection that is due
    when the period is over). The counts by kind and window are in ``metrics.jsonl`` as ever:
    this changes the log, not what is counted (issue 25, finding 3: 1.2-1.6 GB of warnings
    an hour from one client)."""

    def __init__(self, threshold: int, clock: Callable[[], float] = time.monotonic) -> None:
        self.debug = threshold <= std_logging.DEBUG
        self.clock = clock
        self.warned: set[tuple[str, str, str]] = set()
        self.counts: dict[str, int] = {}
        self.since = clock()

    def __call__(self, logger: Any, method: str, event: dict[str, Any]) -> dict[str, Any]:
        name = event.get("event")
        if name not in REJECTION_EVENTS or method not in ("warning", "warn"):
            return event
        kind = str(event.get("kind", ""))
        sender = event.get("client", event.get("topic", event.get("aggregator", "")))
        key = (str(name), str(sender), kind)
        if key not in self.warned and len(self.warned) < MAX_THROTTLE_KEYS:
            self.warned.add(key)
            return {**event, "further": f"summarised every {SUMMARY_EVERY:g} s at info"}
        label = f"{name}: {kind}" if kind else str(name)
        self.counts[label] = self.counts.get(label, 0) + 1
        now = self.clock()
        if now - self.since >= SUMMARY_EVERY:
            counts, self.counts, self.since = self.counts, {}, now
            kept = {k: v for k, v in event.items() if k in ("timestamp", "logger")}
            return kept | {"event": "rejections summarised", "level": "info",
                           "seconds": SUMMARY_EVERY, "counts": dict(sorted(counts.items()))}
        if self.debug:
            return {**event, "level": "debug"}
        raise structlog.DropEvent


class _StderrLoggerFactory:
    """Creates named loggers that write to the *current* ``sys.stderr``.

    Looking the stream up on every new logger (instead of capturing it at configuration time)
    keeps redirections made later (pytest's capture, ``contextlib.redirect_stderr``) working.
    """

    def __call__(self, *args: Any) -> _NamedPrintLogger:
        return _NamedPrintLogger(sys.stderr, str(args[0]) if args else "fedsim")


def _stream_is_terminal(stream: TextIO) -> bool:
    isatty = getattr(stream, "isatty", None)
    try:
        return bool(isatty and isatty())
    except ValueError:  # a closed stream
        return False


def configure_logging(json: bool | None = None, level: str = "info") -> bool:
    """Configure structlog for the whole process; returns whether JSON lines were chosen.

    Args:
        json: ``True`` for JSON lines, ``False`` for the console renderer, ``None`` (default)
            to choose JSON exactly when stderr is not a terminal.
        level: lowest level written: ``debug``, ``info``, ``warning``, ``error``, ``critical``.

    Raises:
        ConfigError: an unknown level.
    """
    try:
        threshold = LEVELS[level.lower()]
    except (KeyError, AttributeError):
        raise ConfigError(f"log level must be one of {sorted(LEVELS)}, got {level!r}") from None
    use_json = not _stream_is_terminal(sys.stderr) if json is None else bool(json)

    shared: list[Any] = [
        structlog.contextvars.merge_contextvars,
        structlog.processors.add_log_level,
        structlog.stdlib.add_logger_name,
        structlog.processors.TimeStamper(fmt="iso", utc=True),
        Throttle(threshold),
    ]
    renderer: Any
    if use_json:
        shared += [structlog.processors.format_exc_info]
        renderer = structlog.processors.JSONRenderer(sort_keys=True)
    else:
        renderer = structlog.dev.ConsoleRenderer(colors=_stream_is_terminal(sys.stderr))
    structlog.reset_defaults()
    structlog.configure(
        processors=[*shared, renderer],
        wrapper_class=structlog.make_filtering_bound_logger(threshold),
        logger_factory=_StderrLoggerFactory(),
        # No caching: loggers created at import time, before this call, follow it, and a later
        # reconfiguration (or a test's redirected stderr) takes effect at once.
        cache_logger_on_first_use=False,
    )
    return use_json


def _field(value: Any) -> str:
    """A field's value in a message line: quoted where it is a string with spaces (or empty)."""
    if isinstance(value, str) and (not value or any(c.isspace() for c in value)):
        return repr(value)
    return str(value)


def _stdlib_message(_logger: Any, _method: str, event_dict: dict[str, Any]) -> Any:
    """The last processor towards the standard library: ``"event key=value ..."`` as the
    record's message, an exception as the record's own ``exc_info`` (its handler formats it)."""
    exc_info = event_dict.pop("exc_info", None)
    event = event_dict.pop("event", "")
    fields = " ".join(f"{key}={_field(value)}" for key, value in sorted(event_dict.items()))
    message = f"{event} {fields}" if fields else str(event)
    return (message,), ({"exc_info": exc_info} if exc_info else {})


_STDLIB_PROCESSORS: list[Any] = [
    structlog.stdlib.filter_by_level,  # below the logger's level: dropped before rendering
    structlog.contextvars.merge_contextvars,
    _stdlib_message,
]


class _Logger:
    """What :func:`get_logger` returns: each call goes to structlog's configuration when there
    is one, otherwise to the standard library's ``logging`` (see the module's docstring)."""

    __slots__ = ("_context", "_name")

    def __init__(self, name: str, context: dict[str, Any]) -> None:
        self._name = name
        self._context = context

    def _target(self) -> Any:
        if structlog.is_configured():
            return structlog.get_logger(self._name, **self._context)
        return structlog.wrap_logger(
            std_logging.getLogger(self._name), processors=_STDLIB_PROCESSORS,
            wrapper_class=structlog.stdlib.BoundLogger, context_class=dict, **self._context)

    def bind(self, **values: Any) -> Any:
        return self._target().bind(**values)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._target(), name)


def get_logger(name: str, **context: Any) -> Any:
    """A structlog logger whose lines carry ``logger=name`` and ``context``.

    It is a lazy proxy: safe to create at import time, before :func:`configure_logging`, and
    it follows whichever configuration holds when it logs (see the module's docstring).
    """
    return _Logger(name, dict(context))
