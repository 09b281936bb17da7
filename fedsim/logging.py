"""Structured logging for fedsim (structlog).

Logs go to stderr: one JSON object per line when stderr is not a terminal (CI, files, a
process supervisor), a readable coloured console line otherwise. stdout is left for command
output (tables, ``--json`` answers), so ``fedsim ... --json | jq`` keeps working while logs
flow.

Call :func:`configure_logging` once at process start (the CLI does); calling it again simply
replaces the configuration, so it is safe in tests. Library code only calls
:func:`get_logger`; before configuration structlog's defaults apply.
"""

from __future__ import annotations

import logging as std_logging
import sys
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


class _NamedPrintLogger(structlog.PrintLogger):
    """A PrintLogger that knows its name (``structlog.stdlib.add_logger_name`` reads it)."""

    def __init__(self, file: TextIO, name: str) -> None:
        super().__init__(file)
        self.name = name


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


def get_logger(name: str, **context: Any) -> Any:
    """A structlog logger whose lines carry ``logger=name`` and ``context``.

    It is a lazy proxy: safe to create at import time, before :func:`configure_logging`.
    """
    return structlog.get_logger(name, **context)
