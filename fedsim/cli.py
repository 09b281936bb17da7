"""The ``fedsim`` command line: ``fedsim <command> ...``.

Each command lives in ``fedsim/commands/<name>.py`` and exposes
``register(subparsers) -> argparse.ArgumentParser`` whose parser sets ``func=run(args) -> int``.
A :class:`~fedsim.errors.FedsimError` becomes one line on stderr and its exit code (2 for bad
input), never a traceback.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence

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
    "data",
    "server",
    "client",
    "launch",
    "deploy",
)


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # argparse's own errors also exit 2, without traceback
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
        module.register(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help(sys.stderr)
        return 2
    try:
        return int(args.func(args) or 0)
    except FedsimError as exc:
        print(f"fedsim {args.command}: error: {exc}", file=sys.stderr)
        return exc.exit_code
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
