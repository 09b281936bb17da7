"""The ``fedsim`` command line: ``fedsim <command> ...``.

Each command lives in ``fedsim/commands/<name>.py`` and exposes
``register(subparsers) -> argparse.ArgumentParser`` whose parser sets ``func=run(args) -> int``.
A :class:`~fedsim.errors.FedsimError` becomes one line on stderr and its exit code (2 for bad
input), never a traceback. Every command takes ``--quiet``, ``--verbose`` and ``--log-level``;
:func:`main` configures the logs from them before the command runs.
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import NoReturn

from fedsim import __version__
from fedsim.errors import FedsimError

# Order is the order shown in --help. A module that is missing is skipped, so partial installs
# still give a working CLI for what is there.
COMMANDS: tuple[str, ...] = (
    "run",
    "validate",
    "schema",
    "account",
    "ledger",
    "report",
    "compare",
    "sweep",
    "data",
    "server",
    "client",
    "aggregator",
    "launch",
    "deploy",
)

# Commands that may load a data set: they take --offline (no download; FEDSIM_OFFLINE=1).
DATA_COMMANDS = frozenset({"run", "validate", "server", "client", "aggregator", "launch"})
OFFLINE_HELP = ("Never download a data set: use only a local copy (the same as "
                "FEDSIM_OFFLINE=1).")
# (a stranger: `fedsim client --help` said its processes inherit it; only launch starts any)
LAUNCH_OFFLINE_HELP = OFFLINE_HELP[:-2] + "; the processes it starts inherit it)."


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:  # argparse's own errors also exit 2, no traceback
        self.print_usage(sys.stderr)
        self.exit(2, f"{self.prog}: error: {message}\n")


class _CommandParser(_Parser):
    """A command's (or sub-command's) parser: an argument it does not know is its error, said
    with its own usage (argparse hands such arguments up, and the top-level parser's usage,
    ``fedsim [-h] [--version] COMMAND ...``, told a stranger nothing about ``--sed 3``)."""

    def parse_known_args(  # type: ignore[override]
        self, args: Sequence[str] | None = None, namespace: argparse.Namespace | None = None
    ) -> tuple[argparse.Namespace, list[str]]:
        parsed, extras = super().parse_known_args(args, namespace)
        if extras:
            self.error(f"unrecognized arguments: {' '.join(extras)}{self._suggestion(extras)}")
        return parsed, extras

    def _suggestion(self, extras: Sequence[str]) -> str:
        """" (did you mean --seed?)" for the first unknown option close to one of this
        parser's (``--sed``), else ""."""
        import difflib

        # Compared without their dashes (which every option shares), and strictly: a
        # suggestion that is not what was meant is worse than none.
        options = {option.lstrip("-"): option for option in self._option_string_actions}
        for extra in extras:
            if extra.startswith("-"):
                near = difflib.get_close_matches(extra.split("=", 1)[0].lstrip("-"),
                                                 list(options), n=1, cutoff=0.75)
                if near:
                    return f" (did you mean {options[near[0]]}?)"
        return ""


DESCRIPTION = (
    "Simulate asynchronous federated learning in which every client trains with DP-SGD and "
    "keeps its own privacy ledger, in one process under virtual time or as processes talking "
    "through an MQTT broker. Run 'fedsim COMMAND --help' for a command's options."
)


def add_output_options(parser: argparse.ArgumentParser) -> None:
    """``--quiet``, ``--verbose`` and ``--log-level`` (one of them at most), on ``parser`` or,
    if it has sub-commands, on each of them."""
    from fedsim.logging import LEVELS

    nested = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    if nested:
        for action in nested:
            for sub in action.choices.values():
                add_output_options(sub)
        parser.set_defaults(quiet=False, verbose=False, log_level=None)
        return
    group = parser.add_argument_group("logging")
    choice = group.add_mutually_exclusive_group()
    choice.add_argument("-q", "--quiet", action="store_true",
                        help="Log only warnings and errors (and show no progress bar, where "
                             "the command has one).")
    choice.add_argument("-v", "--verbose", action="store_true",
                        help="Log details too (debug level; a run logs each client's stop).")
    choice.add_argument("--log-level", choices=sorted(LEVELS, key=LEVELS.__getitem__),
                        type=str.lower, metavar="LEVEL",
                        help="Lowest level of log line written: debug, info (the default), "
                             "warning, error or critical.")


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="fedsim", description=DESCRIPTION)
    parser.add_argument("--version", action="version", version=f"fedsim {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_CommandParser)
    for name in COMMANDS:
        try:
            module = importlib.import_module(f"fedsim.commands.{name}")
        except ModuleNotFoundError as exc:
            if exc.name == f"fedsim.commands.{name}":
                continue
            raise
        command = module.register(sub)
        add_output_options(command)
        if name in DATA_COMMANDS:
            command.add_argument("--offline", action="store_true", default=argparse.SUPPRESS,
                                 help=LAUNCH_OFFLINE_HELP if name == "launch" else OFFLINE_HELP)
    _sentences(parser)
    return parser


@contextmanager
def _offline(on: bool) -> Iterator[None]:
    """FEDSIM_OFFLINE=1 for the command's duration (and for the processes it starts)."""
    if not on:
        yield
        return
    before = os.environ.get("FEDSIM_OFFLINE")
    os.environ["FEDSIM_OFFLINE"] = "1"
    try:
        yield
    finally:
        if before is None:
            os.environ.pop("FEDSIM_OFFLINE", None)
        else:
            os.environ["FEDSIM_OFFLINE"] = before


def _sentences(parser: argparse.ArgumentParser) -> None:
    """argparse's own -h and --version help as whole sentences, on every (sub-)parser."""
    for action in parser._actions:
        if isinstance(action, argparse._HelpAction):
            action.help = "Show this help message and exit."
        elif isinstance(action, argparse._VersionAction):
            action.help = "Show fedsim's version and exit."
        elif isinstance(action, argparse._SubParsersAction):
            for sub in action.choices.values():
                _sentences(sub)


def _keep_freed_memory() -> None:
    """This process is fedsim's: its allocator keeps freed memory for the next training step
    (fedsim.runtime.allocator says why and how to opt out)."""
    from fedsim.logging import get_logger
    from fedsim.runtime.allocator import keep_freed_memory

    if keep_freed_memory():
        get_logger("fedsim.cli").debug("allocator keeps freed memory for reuse")


def main(argv: Sequence[str] | None = None) -> int:
    try:
        parser = build_parser()  # (about 2 s: the commands' imports)
        args = parser.parse_args(argv)
    except KeyboardInterrupt:  # Ctrl-C before the command started: no traceback either
        print("interrupted", file=sys.stderr)
        return 130
    if not getattr(args, "func", None):
        parser.print_help(sys.stderr)
        return 2
    from fedsim.logging import configure_logging, level_from

    args.log_level = level_from(quiet=getattr(args, "quiet", False),
                                verbose=getattr(args, "verbose", False),
                                log_level=getattr(args, "log_level", None))
    try:
        configure_logging(getattr(args, "json_logs", None), level=args.log_level)
        _keep_freed_memory()
        with _offline(getattr(args, "offline", False)):
            return int(args.func(args) or 0)
    except FedsimError as exc:
        print(f"fedsim {args.command}: error: {exc}", file=sys.stderr)
        return exc.exit_code
    except BrokenPipeError:  # e.g. piped into head: the reader left, nothing more to say
        sys.stderr.close()
        return 141
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
