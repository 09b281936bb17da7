"""The ``fedsim`` command line: ``fedsim <command> ...``.

Each command lives in ``fedsim/commands/<name>.py`` and exposes
``register(subparsers) -> argparse.ArgumentParser`` whose parser sets ``func=run(args) -> int``.
A :class:`~fedsim.errors.FedsimError` becomes one line on stderr and its exit code (2 for bad
input), never a traceback.
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
    "report",
    "data",
    "server",
    "client",
    "launch",
    "deploy",
)

# Commands that may load a data set: they take --offline (no download; FEDSIM_OFFLINE=1).
DATA_COMMANDS = frozenset({"run", "validate", "server", "client", "launch"})
OFFLINE_HELP = ("never download a data set: use only a local copy (the same as FEDSIM_OFFLINE=1; "
                "processes started by this command inherit it)")


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:  # argparse's own errors also exit 2, no traceback
        self.print_usage(sys.stderr)
        self.exit(2, f"{self.prog}: error: {message}\n")


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="fedsim", description=__doc__.splitlines()[0])
    parser.add_argument("--version", action="version", version=f"fedsim {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    for name in COMMANDS:
        try:
            module = importlib.import_module(f"fedsim.commands.{name}")
        except ModuleNotFoundError as exc:
            if exc.name == f"fedsim.commands.{name}":
                continue
            raise
        command = module.register(sub)
        if name in DATA_COMMANDS:
            command.add_argument("--offline", action="store_true", default=argparse.SUPPRESS,
                                 help=OFFLINE_HELP)
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


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help(sys.stderr)
        return 2
    try:
        with _offline(getattr(args, "offline", False)):
            return int(args.func(args) or 0)
    except FedsimError as exc:
        print(f"fedsim {args.command}: error: {exc}", file=sys.stderr)
        return exc.exit_code
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
