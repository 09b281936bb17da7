"""``fedsim compare DIR [DIR ...] [--plots DIR] [--json]``: run directories side by side.

Prints one row per run: final and best held-out accuracy, the clients' epsilon (min /
median / max at the scenario's delta), virtual time, windows, and how many clients stopped
for each kind of reason (budget, done, crashed). Draws overlaid accuracy and epsilon plots
(epsilon per neighbouring relation; see :mod:`fedsim.reporting.compare`) into ``--plots``
(default: ``compare/`` in the current directory).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from fedsim.errors import ConfigError
from fedsim.reporting.values import printable

DESCRIPTION = (
    "Put run directories side by side: a table of final and best accuracy, the clients' "
    "epsilon (min, median, max), virtual time and stops by kind, and overlaid accuracy and "
    "epsilon plots."
)


def register(subparsers: Any) -> argparse.ArgumentParser:
    parser = subparsers.add_parser("compare", help="Compare run directories in a table and plots.",
                                   description=DESCRIPTION)
    parser.add_argument("run_dirs", metavar="DIR", nargs="+",
                        help="Run directories written by fedsim run, fedsim launch or fedsim "
                             "sweep.")
    parser.add_argument("--plots", metavar="DIR", default="compare",
                        help="Where to draw accuracy.png and epsilon.png (default: compare).")
    parser.add_argument("--no-plots", action="store_true", help="Print the table only.")
    parser.add_argument("--delta", type=float, metavar="D",
                        help="State every run's eps at this delta, from its ledgers (default: "
                             "each run's own, its scenario's privacy.delta).")
    parser.add_argument("--json", action="store_true", help="Print the rows as JSON.")
    parser.set_defaults(func=run)
    return parser


def run(args: argparse.Namespace) -> int:
    from fedsim.reporting.compare import (
        delta_note,
        draw_comparison,
        format_table,
        relations_note,
        run_row,
        unique_labels,
    )
    from fedsim.reporting.ledgers import read_ledgers
    from fedsim.reporting.rundir import RunDirectory
    from fedsim.runtime.run_outputs import require_writable_dir

    if args.delta is not None and not 0.0 < args.delta < 1.0:  # (nan fails both)
        raise ConfigError(f"--delta must be in (0, 1), got {args.delta}")
    if not args.no_plots:
        require_writable_dir(args.plots, "--plots")
    paths = [Path(p) for p in args.run_dirs]
    if len({p.resolve() for p in paths}) != len(paths):
        raise ConfigError("the same run directory is given twice")
    runs = [RunDirectory.load(p) for p in paths]
    labels = unique_labels(paths)
    ledgers = [read_ledgers(r) for r in runs]  # once, for the table and the plot
    rows = [run_row(r, label, ledgers=lgs, delta=args.delta)
            for r, label, lgs in zip(runs, labels, ledgers, strict=True)]
    drawn = [] if args.no_plots else draw_comparison(runs, labels, Path(args.plots), ledgers,
                                                     args.delta)
    note = delta_note(runs, labels, args.delta)
    relations = relations_note(rows)
    if args.json:
        print(json.dumps({"runs": rows, "plots": [str(p) for p in drawn],
                          "notes": [n for n in (relations, note) if n]}, indent=2))
        return 0
    lines = [*format_table(rows),
             *(line for row in rows for line in row["warnings"] + row["notes"])]
    if relations:
        lines.append(relations)
    deltas = sorted({row["delta"] for row in rows if row["delta"] is not None})
    lines.append(f"eps: each client's guarantee about its own data at delta = "
                 f"{', '.join(f'{d:g}' for d in deltas)} (pld)")
    if note:
        lines.append(note)
    for line in lines:
        print(printable(line, limit=100_000))
    if drawn:
        print("plots: " + ", ".join(str(p) for p in drawn))
    return 0
