"""``fedsim sweep SCENARIO --grid PATH=V1,V2 ... [--seeds 0,1,2] [--jobs N] [--out DIR]``:
run every combination of the grid values and seeds, one run directory each, and a table.

Each ``--grid`` is a ``--set`` path (``[*]`` and ``[name]`` select groups, e.g.
``clients.groups[*].noise.sigma=1.0,1.5``) with comma-separated YAML values (commas inside
brackets stay in the value: ``hidden=[64,32],[128]``). Every combination is validated before
the first run starts. DIR (default ``runs/<scenario name>-sweep``) gets one run directory per
combination and seed (``000-sigma=1.0-seed0``, ...), and ``sweep.csv`` / ``sweep.json``: one
row per run with its grid values, seed, final and best accuracy, eps min / median / max,
virtual time, windows, stops by kind and status. ``--jobs N`` runs N at a time in separate
processes (same results: each run depends only on its scenario and seed).

``--private-tuning {nb,poisson} [--tuning-mean M]`` tunes privately instead: K random trials,
each with a candidate drawn uniformly from the grid, the best released and every client charged
the tuning's bound (:mod:`fedsim.commands.private_tuning`).
"""

from __future__ import annotations

import argparse
import collections
import csv
import itertools
import json
import re
import signal
from collections.abc import Sequence
from concurrent.futures import ProcessPoolExecutor, as_completed
from multiprocessing import active_children, get_context
from pathlib import Path
from types import FrameType
from typing import Any

from fedsim.commands.run import out_argument
from fedsim.errors import ConfigError, FedsimError
from fedsim.runtime.deployed.options import add_allow_factory_option
from fedsim.runtime.interrupted import (
    SIGNAL_EXIT,
    cancel_main_task,
    interrupting_signal,
    note_signal,
    signals_ignored,
    signals_interrupt,
)

DESCRIPTION = (
    "Run every combination of grid values and seeds, one run directory each, and write a "
    "table of their results (sweep.csv and sweep.json). Every combination is validated before "
    "the first run starts."
)
TABLE_COLUMNS = ("final_accuracy", "best_accuracy", "eps_min", "eps_median", "eps_max",
                 "virtual_time", "windows", "stops", "status")


def register(subparsers: Any) -> argparse.ArgumentParser:
    parser = subparsers.add_parser("sweep", help="Run a grid of settings and seeds, with a table.",
                                   description=DESCRIPTION)
    parser.add_argument("scenario", metavar="SCENARIO", help="The scenario YAML file.")
    parser.add_argument("--grid", action="append", default=[], metavar="PATH=V1,V2",
                        help="A setting and its comma-separated values, for example "
                             "clients.groups[*].noise.sigma=1.0,1.5; repeatable, every "
                             "combination runs.")
    parser.add_argument("--seeds", default=None, metavar="S1,S2",
                        help="Seeds to run each combination with (by default the scenario's).")
    parser.add_argument("--set", dest="overrides", action="append", default=[],
                        metavar="PATH=VALUE",
                        help="Override one setting in every run with a YAML value; repeatable.")
    parser.add_argument("--jobs", type=int, default=1, metavar="N",
                        help="How many runs at a time, each in its own process (default 1).")
    parser.add_argument("--out", metavar="DIR", type=out_argument,
                        help="The sweep directory; it must be new or empty (by default "
                        "runs/NAME-sweep, with a numeric suffix if that exists, as fedsim run "
                        "does).")
    parser.add_argument("--no-plots", action="store_true", help="Do not draw each run's plots.")
    tuning = parser.add_argument_group(
        "private tuning", "Run a random number K of trials, each with a candidate drawn "
        "uniformly from the grid, release the best by final accuracy, and charge every client "
        "the tuning's privacy bound (Papernot & Steinke 2022; docs/API.md)")
    tuning.add_argument("--private-tuning", choices=("nb", "poisson"), default=None,
                        help="K's distribution: nb (truncated negative binomial) or poisson.")
    # (defaults None: given without --private-tuning, they are refused, not ignored)
    tuning.add_argument("--tuning-mean", type=float, default=None, metavar="M",
                        help="E[K], the mean number of trials (default 10).")
    tuning.add_argument("--tuning-eta", type=float, default=None, metavar="ETA",
                        help="The eta of nb, above -1 (default 0: the logarithmic distribution).")
    tuning.add_argument("--tuning-budget", type=float, default=None, metavar="EPS",
                        help="Refuse, before any trial, if a client's tuned total exceeds EPS.")
    add_allow_factory_option(parser)
    parser.set_defaults(func=run)
    return parser


def _seeds_once(grid: list[tuple[str, list[str]]], seeds: list[int] | None) -> None:
    """Refuse a seed given by both --grid and --seeds (a stranger's --grid seed=1,2 --seeds 3
    ran seed 3 twice, in directories named seed=1 and seed=2 whose grid column read 3:
    --seeds sets every run's seed)."""
    if seeds is not None and "seed" in dict(grid):
        raise ConfigError("--grid seed=... and --seeds both set the seed: give the seeds "
                          "with --seeds alone")


def _require_private_tuning(args: argparse.Namespace) -> None:
    """Refuse a tuning option without ``--private-tuning`` (a stranger's --tuning-mean 3
    alone ran an ordinary sweep, no tuning charged, and said nothing of it)."""
    given = [flag for flag, value in (("--tuning-mean", args.tuning_mean),
                                      ("--tuning-eta", args.tuning_eta),
                                      ("--tuning-budget", args.tuning_budget)) if value is not None]
    if args.private_tuning is None and given:
        raise ConfigError(f"{given[0]} sets a private tuning: give --private-tuning nb or "
                          "poisson with it (without, the sweep runs every combination and "
                          "charges no tuning)")


def split_values(text: str) -> list[str]:
    """Comma-separated values, commas inside [...] / {...} / quotes kept."""
    values, depth, quote, current = [], 0, "", ""
    for char in text:
        if quote:
            quote = "" if char == quote else quote
        elif char in "'\"":
            quote = char
        elif char in "[{":
            depth += 1
        elif char in "]}":
            depth -= 1
        elif char == "," and depth == 0:
            values.append(current.strip())
            current = ""
            continue
        current += char
    values.append(current.strip())
    if any(v == "" for v in values):
        raise ConfigError(f"--grid values {text!r}: an empty value (two commas in a row?)")
    return values


def parse_grid(items: Sequence[str]) -> list[tuple[str, list[str]]]:
    grid = []
    for item in items:
        path, sep, values = item.partition("=")
        if not sep or not path.strip() or not values.strip():
            raise ConfigError(f"--grid {item!r}: expected PATH=V1,V2,...")
        found = split_values(values)
        twice = sorted(v for v, n in collections.Counter(found).items() if n > 1)
        if twice:  # the same run twice, in two directories: a typo, not a plan
            raise ConfigError(f"--grid {path.strip()}: the value {twice[0]!r} is given twice")
        grid.append((path.strip(), found))
    paths = [p for p, _ in grid]
    if len(set(paths)) != len(paths):
        raise ConfigError(f"--grid: a path is given twice: {paths}")
    return grid


def parse_seeds(text: str | None) -> list[int] | None:
    if text is None:
        return None
    try:
        seeds = [int(s) for s in split_values(text)]
    except ValueError:
        raise ConfigError(f"--seeds {text!r}: expected integers like 0,1,2") from None
    if any(s < 0 for s in seeds) or len(set(seeds)) != len(seeds):
        raise ConfigError(f"--seeds {text!r}: seeds must be distinct and >= 0")
    return seeds


def _short(path: str) -> str:
    key = next((p for p in reversed(re.split(r"[.\[\]]", path)) if p and p != "*"), path)
    return key


def _slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.=+-]+", "_", text).strip("_")[:60]


def plan_runs(scenario: str, grid: list[tuple[str, list[str]]], seeds: list[int] | None,
              overrides: Sequence[str], out: Path) -> list[dict[str, Any]]:
    """Every run of the sweep (validated): its directory, overrides, grid values and seed."""
    from fedsim.config import load_scenario

    combos = list(itertools.product(*[values for _, values in grid])) or [()]
    runs: list[dict[str, Any]] = []
    for combo in combos:
        settings = dict(zip([p for p, _ in grid], combo, strict=True))
        for seed in seeds if seeds is not None else [None]:
            lines = [*overrides, *(f"{p}={v}" for p, v in settings.items())]
            if seed is not None:
                lines.append(f"seed={seed}")
            try:  # (the user's own --set lines were checked alone before)
                loaded = load_scenario(scenario, lines)
            except ConfigError as exc:  # say which of the sweep's runs, and that --grid made it
                made = " ".join([*(f"--grid {p}={v}" for p, v in settings.items()),
                                 *([f"--seeds {seed}"] if seed is not None else [])])
                raise ConfigError(f"the sweep's run {made}: {exc}") from None
            label = "-".join([_slug(f"{_short(p)}={v}") for p, v in settings.items()]
                             + [f"seed{loaded.scenario.seed}"])
            runs.append({"dir": str(out / f"{len(runs):03d}-{label}"), "overrides": lines,
                         "grid": settings, "seed": loaded.scenario.seed})
    return runs


def run_one(scenario: str, plan: dict[str, Any], plots: bool,
            allow_factories: bool = False) -> dict[str, Any]:
    """Simulate one run of the sweep and return its table row (a failed run: its status)."""
    from fedsim.api import simulate
    from fedsim.logging import configure_logging
    from fedsim.reporting.rundir import RunDirectory

    configure_logging(None, level="warning")
    row = _planned(plan)
    if _STOPPING is not None and _STOPPING.is_set():  # the sweep was interrupted: start none
        return {**row, "status": NOT_RUN}
    # In a worker process (_STOPPING set) a signal interrupts its run once, as Ctrl-C does
    # (_stop_once): a partial run, readable; the row says which signal, and the sweep stops.
    # (The sweep's own process holds its rule around every run it makes itself.)
    worker = _STOPPING is not None
    if worker and _SIGNALLED:
        return {**row, "status": NOT_RUN, "signal": _SIGNALLED[0]}
    _IN_RUN[:] = [True]
    try:
        result = simulate(scenario, overrides=plan["overrides"], out=plan["dir"],
                          progress=False, plots=plots, allow_factories=allow_factories)
    except KeyboardInterrupt:
        if not worker:
            raise
        return {**row_on_disk(plan), "signal": _SIGNALLED[0] if _SIGNALLED else "SIGINT"}
    except FedsimError as exc:
        return {**row, "status": f"failed: {exc}"}
    finally:
        _IN_RUN[:] = [False]
    return {**_measured(row, RunDirectory.load(plan["dir"])),
            "wall_seconds": round(result.wall_seconds, 3), "status": "ok"}


def _planned(plan: dict[str, Any]) -> dict[str, Any]:
    """A plan's row before its run: its name, grid values and seed."""
    return {"run": Path(plan["dir"]).name, **plan["grid"], "seed": plan["seed"]}


def _measured(row: dict[str, Any], run: Any) -> dict[str, Any]:
    """``row`` with its run's figures (the table's columns of its comparison row)."""
    from fedsim.reporting.compare import run_row

    measured = run_row(run)
    return {**row, **{k: measured[k] for k in (*TABLE_COLUMNS, "relations") if k in measured}}


def _notes(rows: Sequence[dict[str, Any]]) -> list[str]:
    """What the table's figures need said beside them: eps of both neighbouring relations
    (:func:`~fedsim.reporting.compare.relations_note`, ``fedsim compare``'s note)."""
    from fedsim.reporting.compare import relations_note

    note = relations_note(rows)
    return [note] if note else []


NOT_RUN = "not run: the sweep was interrupted"
TUNING_MEAN = 10.0  # --tuning-mean's default
TUNING_ETA = 0.0  # --tuning-eta's default
_STOPPING: Any = None
"""In a sweep's worker process: the event the sweep sets when interrupted (no queued run
starts after it: the pool's workers outlive a Ctrl-C and took the next queued run)."""


class SweepInterrupted(Exception):  # noqa: N818 - an interrupt, as KeyboardInterrupt
    """A signal stopped one of the sweep's workers: the sweep stops as if it had received it."""

    def __init__(self, signal: str) -> None:
        super().__init__(f"a worker was interrupted by {signal}")
        self.signal = signal


_SIGNALLED: list[str] = []
"""In a sweep's worker process: the first signal it received (then no run starts in it)."""
_IN_RUN = [False]
"""In a sweep's worker process: whether it is inside a run (a signal then interrupts it)."""


def _worker_started(stopping: Any) -> None:
    global _STOPPING
    _STOPPING = stopping
    # For the worker's life: a scheduler signals every process of the job, the sweep its
    # workers when it stops, and both may come; the first interrupts the run, the rest are
    # ignored (a second one raised inside the interrupted run's own writing).
    for number in (signal.SIGINT, signal.SIGTERM):
        signal.signal(number, _stop_once)


def _stop_once(signum: int, frame: FrameType | None) -> None:
    """A sweep worker's SIGINT and SIGTERM handler: the first interrupts the run in progress
    as Ctrl-C does (its main task cancelled: its outputs are written), or, in a run before its
    loop started, raises KeyboardInterrupt there; between runs it only keeps the next from
    starting. Every later one is ignored."""
    if _SIGNALLED:
        return
    name = signal.Signals(signum).name
    _SIGNALLED.append(name)
    note_signal(name)
    if not cancel_main_task() and _IN_RUN[0]:
        raise KeyboardInterrupt


def row_on_disk(plan: dict[str, Any]) -> dict[str, Any]:
    """The row of a plan whose run was not reported to the sweep (interrupted), from what its
    run directory holds: a run's summary (``ok``, or a partial run's), else not run. A
    stranger's Ctrl-C: runs that had written their summary were listed as not run."""
    from fedsim.reporting.rundir import RunDirectory
    from fedsim.runtime.run_outputs import SUMMARY_FILE

    row = _planned(plan)
    if not (Path(plan["dir"]) / SUMMARY_FILE).is_file():
        return {**row, "status": NOT_RUN}
    try:
        run = RunDirectory.load(plan["dir"])
        measured = _measured(row, run)
    except (FedsimError, OSError) as exc:
        return {**row, "status": f"interrupted: its run directory cannot be read ({exc})"}
    return {**measured, "status": "interrupted: partial run" if run.interrupted else "ok"}


def write_table(out: Path, rows: list[dict[str, Any]], grid_paths: Sequence[str],
                meta: dict[str, Any], extra: Sequence[str] = ()) -> tuple[Path, Path]:
    columns = ["run", *grid_paths, "seed", *TABLE_COLUMNS, "wall_seconds", *extra]
    csv_path, json_path = out / "sweep.csv", out / "sweep.json"
    with csv_path.open("w", encoding="utf-8", newline="") as handle:
        writer = csv.writer(handle, lineterminator="\n")
        writer.writerow(columns)
        for row in rows:
            cells = []
            for column in columns:
                value = row.get(column)
                if column == "stops" and isinstance(value, dict):
                    value = ";".join(f"{k}={n}" for k, n in value.items())
                cells.append("" if value is None else value)
            writer.writerow(cells)
    json_path.write_text(json.dumps({**meta, "runs": rows}, indent=2) + "\n", encoding="utf-8")
    return csv_path, json_path


def run(args: argparse.Namespace) -> int:
    from fedsim.config import load_scenario
    from fedsim.config.factories import require_allowed
    from fedsim.runtime.run_outputs import claimed_run_dir

    if args.jobs < 1:
        raise ConfigError(f"--jobs must be >= 1, got {args.jobs}")
    grid = parse_grid(args.grid)
    seeds = parse_seeds(args.seeds)
    _seeds_once(grid, seeds)
    base = load_scenario(args.scenario, args.overrides).scenario
    require_allowed(base, args.allow_factories)  # refused once, before any run is planned
    if args.out:
        return _sweep_into(args, grid, seeds, base, Path(args.out))
    # claimed at once (two sweeps started together take two), given back if it fails first
    with claimed_run_dir(f"{base.name}-sweep") as out:
        return _sweep_into(args, grid, seeds, base, out)


def _sweep_into(args: argparse.Namespace, grid: list[tuple[str, list[str]]],
                seeds: list[int] | None, base: Any, out: Path) -> int:
    """:func:`run` into the sweep directory ``out``."""
    from fedsim.reporting.compare import format_table
    from fedsim.runtime.run_outputs import require_writable_dir

    require_writable_dir(out, "--out" if args.out else "sweep directory")
    if out.exists() and any(out.iterdir()):
        raise ConfigError(f"{out} exists and is not empty; choose a new --out directory")
    _require_private_tuning(args)
    if args.private_tuning is not None:
        if seeds is not None:
            raise ConfigError("--seeds: private tuning runs every trial on the scenario's seed "
                              "(its clients' data sets are fixed; K and the candidates come "
                              "from the operating system)")
        if not grid or all(len(values) < 2 for _, values in grid):
            # One candidate: K identical trials, each charged, for nothing to select
            # (a stranger's review: 8x one run's eps for a "search" of one).
            raise ConfigError("--private-tuning selects the best of several candidates: give "
                              "--grid PATH=V1,V2,... with two values or more (one candidate "
                              "would be trained K times, each trial charged, for nothing)")
        return run_private(args, grid, base.privacy.delta, out)
    plans = plan_runs(args.scenario, grid, seeds, args.overrides, out)
    out.mkdir(parents=True, exist_ok=True)
    print(f"{out}: {len(plans)} run(s), {args.jobs} at a time")
    meta = {"scenario": str(args.scenario), "grid": {p: v for p, v in grid}, "seeds": seeds,
            "overrides": list(args.overrides)}
    done: dict[int, dict[str, Any]] = {}
    stopped_by: str | None = None
    try:
        # A SIGTERM (a batch scheduler's, `timeout`'s) stops the sweep as Ctrl-C does: it
        # killed the process, leaving no table and a run directory without its summary.
        with signals_interrupt():
            execute(args, plans, done)
    except KeyboardInterrupt:
        stopped_by = interrupting_signal()
    except SweepInterrupted as exc:  # a worker was signalled: the sweep stops as it would
        stopped_by = exc.signal
    if stopped_by is not None:
        with signals_ignored():  # a second signal must not leave the table unwritten
            # The runs that finished keep their rows, whichever order they finished in;
            # the others say what their run directory holds (the workers are done with it).
            rows = [done[index] if index in done and done[index]["status"] != NOT_RUN
                    else row_on_disk(plan) for index, plan in enumerate(plans)]
            write_table(out, rows, [p for p, _ in grid],
                        {**meta, "interrupted": True, "notes": _notes(rows)})
            # (it read "table of the finished runs" over rows that were partial or not run)
            print(f"interrupted by {stopped_by}; table of every run, its status finished, "
                  f"partial or not run: {out / 'sweep.csv'}, {out / 'sweep.json'}")
        return SIGNAL_EXIT.get(stopped_by, 130)
    rows = [done[index] for index in range(len(plans))]
    notes = _notes(rows)
    csv_path, json_path = write_table(out, rows, [p for p, _ in grid], {**meta, "notes": notes})
    for line in [*format_table(rows, ["run", *[p for p, _ in grid], "seed", *TABLE_COLUMNS]),
                 *notes]:
        print(line)
    print(f"table: {csv_path}, {json_path}")
    return 0 if all(row["status"] == "ok" for row in rows) else 1


def execute(args: argparse.Namespace, plans: list[dict[str, Any]],
            done: dict[int, dict[str, Any]]) -> None:
    """Run ``plans`` (``--jobs`` at a time), putting each one's row in ``done`` under its
    index in ``plans`` as it finishes (an interrupted sweep keeps every finished run's row:
    with ``--jobs`` above 1 a run that finished after one still running was listed as not
    run)."""
    plots = not args.no_plots
    if args.jobs == 1 or len(plans) <= 1:
        for index, plan in enumerate(plans):
            done[index] = run_one(args.scenario, plan, plots, args.allow_factories)
            print(f"  {done[index]['run']}: {done[index]['status']}")
    else:
        # spawn: a fresh interpreter per worker (no forked torch state)
        context = get_context("spawn")
        stopping = context.Event()
        pool = ProcessPoolExecutor(max_workers=min(args.jobs, len(plans)), mp_context=context,
                                   initializer=_worker_started, initargs=(stopping,))
        futures = {pool.submit(run_one, args.scenario, plan, plots, args.allow_factories):
                   index for index, plan in enumerate(plans)}
        try:
            for future in as_completed(futures):
                done[futures[future]] = row = future.result()
                print(f"  {row['run']}: {row['status']}")
                if row.get("signal"):  # its worker was signalled: so is the sweep
                    raise SweepInterrupted(row["signal"])
        except BaseException:
            # Interrupted: no queued run starts (the pool's exit started every one of them,
            # then listed them as not run: a review; its workers outlive a Ctrl-C and took the
            # next queued run: a stranger), the running ones are interrupted (a SIGTERM to
            # the sweep alone waited for them to finish), and a run that finished meanwhile
            # keeps its row. No second signal may interrupt this: one that raised inside the
            # shutdown left the sweep waiting for its workers for ever (a review).
            with signals_ignored():
                stopping.set()
                for worker in active_children():  # each stops its run once, however told
                    worker.terminate()
                pool.shutdown(wait=True, cancel_futures=True)
                for future, index in futures.items():
                    if index not in done and future.done() and not future.cancelled() \
                            and future.exception() is None:
                        done[index] = future.result()
            raise
        pool.shutdown(wait=True)


def run_private(args: argparse.Namespace, grid: list[tuple[str, list[str]]], delta: float,
                out: Path) -> int:
    """``--private-tuning``: bound and charge the tuning, then run K trials and select the
    best (:mod:`fedsim.commands.private_tuning`)."""
    from fedsim.commands import private_tuning as tuning
    from fedsim.reporting.compare import format_table
    from fedsim.reporting.values import epsilon_text

    candidates = plan_runs(args.scenario, grid, None, args.overrides, out)
    trials = tuning.trial_distribution(
        args.private_tuning, TUNING_MEAN if args.tuning_mean is None else args.tuning_mean,
        TUNING_ETA if args.tuning_eta is None else args.tuning_eta)
    # every candidate's per-trial releases, per client, bounded before any trial runs
    bounded = [tuning.trial_steps(args.scenario, c["overrides"], args.allow_factories)
               for c in candidates]
    clients = sorted(set().union(*bounded))
    selections = {client: tuning.selection_of(trials, [b.get(client, ()) for b in bounded])
                  for client in clients}
    over = tuning.over_budgets(args.scenario, [c["overrides"] for c in candidates], selections,
                               args.allow_factories)
    if over is not None and args.tuning_budget is None:
        # A client's budget is a promise: a tuning that spends past it runs only when asked
        # to, with the total it may reach (nothing is charged before this refusal).
        raise ConfigError(f"{over}; this tuning is refused without "
                          f"--tuning-budget EPS, the tuned total you accept for every client")
    out.mkdir(parents=True, exist_ok=True)
    totals = tuning.tuning_ledgers(out, selections, delta, args.tuning_budget)
    count = tuning.draw_trials(trials)
    plans = []
    names: set[str] = set()
    for _ in range(count):
        chosen = candidates[tuning.draw_candidate(len(candidates))]
        label = Path(chosen["dir"]).name.split("-", 1)[1]
        # Named at random, not by index: the released trial's directory (and its summary's
        # selected_trial) must not tell how many trials ran (K stays secret).
        name = tuning.trial_name(label, names)
        names.add(name)
        plans.append({**chosen, "dir": str(out / name)})
    print(f"{out}: private tuning, {count} trial(s) of {len(candidates)} candidate(s), "
          f"{args.jobs} at a time (a deployment keeps K and the unselected trials secret)")
    done: dict[int, dict[str, Any]] = {}
    execute(args, plans, done)  # (interrupted: no table; the tuning ledgers are charged)
    rows = [done[index] for index in range(len(plans))]
    best = tuning.best_trial(rows)
    tuned_max = max(totals.values(), default=0.0)
    for index, row in enumerate(rows):
        row["selected"] = index == best
        row["tuned_eps_max"] = tuned_max
    # each trial's own outputs say what it is: the release (with the tuned eps) or not one
    tuning.mark_trials([plan["dir"] for plan in plans], best, totals, delta)
    meta = {"scenario": str(args.scenario), "grid": {p: v for p, v in grid}, "seeds": None,
            "overrides": list(args.overrides),
            "private_tuning": {
                "distribution": args.private_tuning, "mean": trials.mean,
                "parameters": selections[clients[0]].named_parameters if clients else {},
                "trials": count, "candidates": [c["grid"] for c in candidates],
                "selected": None if best is None else rows[best]["run"],
                "delta": delta, "tuned_epsilon": totals, "tuned_epsilon_max": tuned_max,
                "ledgers": str(tuning.TUNING_LEDGER_DIR)}}
    grid_paths = [p for p, _ in grid]
    notes = [*_notes(rows), *([f"warning: {over}; accepted up to eps {args.tuning_budget:g} "
                               f"by --tuning-budget"] if over else [])]
    csv_path, json_path = write_table(out, rows, grid_paths, {**meta, "notes": notes},
                                      extra=("selected", "tuned_eps_max"))
    columns = ["run", *grid_paths, "final_accuracy", "eps_max", "selected", "tuned_eps_max"]
    for line in [*format_table(rows, columns), *notes]:
        print(line)
    chosen_run = "none" if best is None else rows[best]["run"]
    trial_max = max((r["eps_max"] for r in rows if isinstance(r.get("eps_max"), float)),
                    default=None)
    print(f"selected: {chosen_run}; tuned eps (every client, all trials and the selection) "
          f"max {epsilon_text(tuned_max)} at delta {delta:g}"
          + ("" if trial_max is None else f" (largest per-trial eps {epsilon_text(trial_max)})"))
    print(f"table: {csv_path}, {json_path}")
    return 0 if best is not None or count == 0 else 1
