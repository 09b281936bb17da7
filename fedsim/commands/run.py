"""Simulate a scenario in one process under deterministic virtual time and write its run
directory.

The run directory gets metrics.jsonl, clients.csv, summary.json, scenario.resolved.yaml,
timing.json (wall-clock seconds), the clients' ledgers and plots. Its default is runs/NAME-seedN (with a numeric suffix if that
exists). On a terminal a progress bar shows the run's progress towards the stop that will come
first; log lines are JSON when stderr is not a terminal. An interrupted run (Ctrl-C or SIGTERM)
still writes a partial summary that 'fedsim report' reads.
"""

from __future__ import annotations

import argparse
import importlib.util
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from fedsim.config import load_scenario
from fedsim.errors import ConfigError
from fedsim.runtime.deployed.options import add_allow_factory_option


def register(subparsers: Any) -> argparse.ArgumentParser:
    parser = subparsers.add_parser(
        "run", help="Simulate a scenario under virtual time.",
        description=" ".join(__doc__.split()))
    parser.add_argument("scenario", metavar="SCENARIO", help="The scenario YAML file.")
    parser.add_argument("--out", metavar="DIR", type=out_argument,
                        help="The run directory to write; it must not hold a run already.")
    parser.add_argument("--seed", type=seed_argument,
                        help="Use this seed instead of the scenario's.")
    parser.add_argument("--set", dest="overrides", action="append", default=[],
                        metavar="PATH=VALUE",
                        help="Override one setting with a YAML value, for example "
                             "stop.windows=10; repeatable.")
    parser.add_argument("--executor", choices=("local", "ray"), default="local",
                        help="Where the batched training passes run: in this process (the "
                             "default) or on Ray workers that hold the clients' data shards "
                             "(extra fedsim[ray]; the same outputs, see docs/RAY.md).")
    parser.add_argument("--address", metavar="ADDR",
                        help="The Ray cluster's address (ray start --head prints it); by "
                             "default a local Ray with --ray-workers CPUs.")
    parser.add_argument("--ray-workers", type=int, default=None, metavar="N",
                        help="How many Ray workers (data shards) --executor ray uses; 2 by "
                             "default.")
    parser.add_argument("--device", choices=("cpu", "cuda", "mps", "auto"),
                        help="Where the rounds and the evaluation run, instead of the "
                             "scenario's device; auto takes cuda, else mps, else cpu.")
    parser.add_argument("--no-plots", action="store_true", help="Do not draw the plots.")
    parser.add_argument("--tensorboard", metavar="DIR",
                        help="Also write TensorBoard scalars to DIR: per window as the run "
                             "goes, per-client epsilon when it ends; needs the "
                             "fedsim[tensorboard] extra.")
    parser.add_argument("--json-logs", action=argparse.BooleanOptionalAction, default=None,
                        help="Write log lines as JSON (by default exactly when stderr is not "
                             "a terminal).")
    add_allow_factory_option(parser)
    parser.set_defaults(func=run)
    return parser


def out_argument(text: str) -> str:
    """``--out``'s value (``fedsim run``, ``sweep``, ``launch``, ``server``): an empty path is
    refused (a stranger's ``--out ""`` silently wrote to the default directory)."""
    if not text.strip():
        raise argparse.ArgumentTypeError("an empty path names no directory (leave --out out "
                                         "for the default one)")
    return text


def seed_argument(text: str) -> int:
    """``--seed``'s value (``fedsim run``, ``fedsim validate``), refused as the flag (a stranger: ``--seed -1`` was reported as a
    ``--set seed=-1`` never typed)."""
    try:
        seed = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a whole number: {text!r}") from None
    if seed < 0:
        raise argparse.ArgumentTypeError(f"must be >= 0, got {seed}")
    return seed


def run(args: argparse.Namespace) -> int:
    from fedsim.logging import get_logger
    from fedsim.runtime.run_outputs import claimed_run_dir

    log = get_logger("fedsim.run")
    overrides = list(args.overrides)
    if args.seed is not None:
        overrides.append(f"seed={args.seed}")
    if args.device is not None:
        overrides.append(f"device={args.device}")
    loaded = load_scenario(args.scenario, overrides, allow_factories=args.allow_factories)
    scenario = loaded.scenario
    if args.out:
        return _run_into(args, loaded, Path(args.out), log)
    # The default directory is claimed at once (two runs started together take two), and
    # given back if the run fails before it is one.
    with claimed_run_dir(f"{scenario.name}-seed{scenario.seed}") as out:
        return _run_into(args, loaded, out, log)


def _run_into(args: argparse.Namespace, loaded: Any, out: Path, log: Any) -> int:
    """:func:`run` into the run directory ``out``."""
    from fedsim.reporting.horizon import RunBar
    from fedsim.reporting.progress import RunProgress, log_evaluation
    from fedsim.reporting.tensorboard import tensorboard_during
    from fedsim.runtime.interrupted import signals_interrupt
    from fedsim.runtime.run_outputs import require_new_run_dir, require_writable_dir
    from fedsim.runtime.simulated.simulation import run_scenario
    from fedsim.training.preflight import preflight_warnings

    scenario = loaded.scenario
    require_new_run_dir(out, "--out" if args.out else "run directory")  # before any work
    if args.tensorboard:
        from fedsim.reporting.tensorboard import require_tensorboard

        require_writable_dir(args.tensorboard, "--tensorboard")
        require_tensorboard()
    make_batcher = _batcher(args)  # refused now: no run directory left half made
    log.info("run starting", scenario=scenario.name, seed=scenario.seed, out=str(out),
             clients=scenario.clients.total)
    population, built_in = _built(loaded, log)
    preflight_warnings(population.plans)  # logged as warnings before anything trains
    shown = RunBar(scenario, population.plans)
    horizon = shown.horizon
    log.info("run horizon", seconds=horizon.seconds, source=horizon.source,
             estimated=horizon.estimated)
    quiet = getattr(args, "quiet", False)
    with RunProgress(horizon.seconds, unit="time", enabled=False if quiet else None) as progress, \
            tensorboard_during(args.tensorboard, out) as to_tensorboard:
        def on_window(line: dict[str, Any]) -> None:
            shown.on_window(progress, line)
            log_evaluation(line)
            to_tensorboard(line)

        try:
            with signals_interrupt(), _removed_if_failed_at_start(out):
                result = run_scenario(loaded, out, on_window=on_window, population=population,
                                      make_batcher=make_batcher)
            shown.on_end(progress, result.summary)  # the real end
        except KeyboardInterrupt:
            result = None
    if result is None:
        return interrupted_exit(out)
    return _finished(args, out, result, log, built_in)


def _batcher(args: argparse.Namespace) -> Any:
    """``--executor ray``'s batcher factory, checked before anything is written (the ray
    package, ``--ray-workers``, a cluster answering at ``--address``); None for the local
    executor, which refuses the Ray flags rather than ignoring them."""
    if args.executor != "ray":
        given = [flag for flag, value in (("--ray-workers", args.ray_workers),
                                          ("--address", args.address)) if value is not None]
        if given:
            verb = "applies" if len(given) == 1 else "apply"
            raise ConfigError(f"{' and '.join(given)} {verb} only with --executor ray")
        return None
    from fedsim.runtime.simulated.ray_executor import ray_batcher

    workers = 2 if args.ray_workers is None else args.ray_workers
    return ray_batcher(workers=workers, address=args.address)


@contextmanager
def _removed_if_failed_at_start(out: Path) -> Iterator[None]:
    """Remove ``out`` if this process made it (here, by one ``mkdir``) and the run failed
    before recording a window or charging a round (e.g. its Ray workers could not start):
    what is left then is no run (no metrics, ledgers without a record), and a rerun into the
    same directory would be refused. An interrupt keeps it, and so does a failure after any
    ledger recorded a spend: a privacy record is never removed. A directory that existed
    before, or that another process made first, is never removed."""
    try:  # made here, atomically: True for one process only (a review's second run on the
        out.mkdir(parents=True)  # same --out, failing, removed the first's live directory)
        created = True
    except FileExistsError:
        created = False
    try:
        yield
    except Exception:
        if created:
            from fedsim.runtime.run_outputs import give_back_if_no_run

            give_back_if_no_run(out)
        raise


def _built(loaded: Any, log: Any) -> tuple[Any, float]:
    """The scenario's population and the wall seconds it took, logged: data, models and the
    privacy calibration took 17 s of dynamic-dpsgd's 30, while the run's own "wall s" said
    10 (a stranger wondered where the rest went)."""
    from fedsim.runtime.population import build_population

    log.info("building the population: data, models, privacy calibration")
    started = time.perf_counter()
    population = build_population(loaded)
    seconds = time.perf_counter() - started
    log.info("population built", clients=len(population.plans), seconds=round(seconds, 2))
    return population, seconds


def interrupted_exit(out: Path) -> int:
    """What an interrupted run (``fedsim run`` or ``launch``) prints; its exit status (128 + the
    signal's number)."""
    from fedsim.runtime.interrupted import SIGNAL_EXIT, interrupting_signal

    name = interrupting_signal()
    summary_file = out / "summary.json"
    if summary_file.exists():
        print(f"{out}: interrupted by {name}; partial summary in {summary_file} "
              f"('fedsim report {out}' draws its plots)")
    else:
        print(f"interrupted by {name} before the run had started")
    return SIGNAL_EXIT.get(name, 130)


def _finished(args: argparse.Namespace, out: Path, result: Any, log: Any,
              built_in: float) -> int:
    """Log the stops' summary, draw the plots and print the run's answer."""
    from fedsim.clock import seconds_text
    from fedsim.privacy.epsilon_text import epsilon_range
    from fedsim.reporting.stops import log_stops

    summary = result.summary
    log_stops(summary["stopped"])
    plots: list[Path] = []
    if not args.no_plots and importlib.util.find_spec("fedsim.reporting.plots") is not None:
        from fedsim.reporting.plots import draw_all

        plots = draw_all(out)
    log.info("run finished", out=str(out), final_accuracy=summary["final_accuracy"],
             windows=summary["windows"], virtual_time=summary["virtual_time"],
             wall_seconds=round(result.wall_seconds, 2), plots=len(plots))
    accuracy = summary["final_accuracy"]
    privacy = summary["privacy"]
    # One range a neighbouring relation: their guarantees are not to be compared
    relations = privacy.get("by_relation") or {"": privacy}
    ranges = ", ".join(
        f"{(relation + ' ') if relation else ''}"
        + ("n/a" if r["epsilon_min"] is None else epsilon_range(r["epsilon_min"], r["epsilon_max"]))
        for relation, r in relations.items())
    print(f"{out}: {summary['windows']} windows, {seconds_text(summary['virtual_time'])} virtual "
          f"s, final accuracy {accuracy if accuracy is None else f'{accuracy:.4f}'}, "
          f"eps (delta={privacy['delta']:g}) {ranges}, "
          f"{seconds_text(result.wall_seconds)} wall s (after {seconds_text(built_in)} s to "
          f"build the population: data, models, privacy calibration)")
    print(summary["explanation"])
    return 0
