"""``fedsim run SCENARIO [--out DIR] [--seed N] [--set path=value ...] [--executor ray]``: simulate a scenario
in one process under deterministic virtual time and write its run directory.

DIR gets ``metrics.jsonl``, ``clients.csv``, ``summary.json``, ``scenario.resolved.yaml``,
``ledgers/`` and ``plots/``. The default DIR is ``runs/<scenario name>-seed<N>`` (with a
numeric suffix if that exists). A progress bar shows on a terminal; logs are structlog lines
(JSON when stderr is not a terminal).
"""

from __future__ import annotations

import argparse
import importlib.util
from pathlib import Path
from typing import Any

from fedsim.config import load_scenario


def register(subparsers: Any) -> argparse.ArgumentParser:
    parser = subparsers.add_parser("run", help="simulate a scenario under virtual time",
                                   description=__doc__.splitlines()[0])
    parser.add_argument("scenario", metavar="SCENARIO", help="scenario YAML file")
    parser.add_argument("--out", metavar="DIR", help="run directory (must not hold a run)")
    parser.add_argument("--seed", type=int, help="override the scenario's seed")
    parser.add_argument("--set", dest="overrides", action="append", default=[],
                        metavar="PATH=VALUE", help="override a setting (YAML value), repeatable")
    parser.add_argument("--executor", choices=("local", "ray"), default="local",
                        help="where the batched training passes run: in this process (default) "
                             "or on Ray workers holding the data shards (extra fedsim[ray]; "
                             "same outputs, see docs/RAY.md)")
    parser.add_argument("--address", metavar="ADDR",
                        help="Ray cluster address (ray start --head prints it); default: a "
                             "local Ray with --ray-workers CPUs")
    parser.add_argument("--ray-workers", type=int, default=2, metavar="N",
                        help="Ray workers (data shards) for --executor ray (default 2)")
    parser.add_argument("--no-plots", action="store_true", help="do not draw plots")
    parser.add_argument("--json-logs", action=argparse.BooleanOptionalAction, default=None,
                        help="JSON log lines (default: when stderr is not a terminal)")
    parser.set_defaults(func=run)
    return parser


def _default_out(name: str, seed: int) -> Path:
    base = Path("runs") / f"{name}-seed{seed}"
    candidate, suffix = base, 1
    while candidate.exists():
        candidate = base.with_name(f"{base.name}-{suffix}")
        suffix += 1
    return candidate


def run(args: argparse.Namespace) -> int:
    from fedsim.logging import configure_logging, get_logger
    from fedsim.reporting.progress import ProgressUnit, RunProgress
    from fedsim.runtime.simulation import run_scenario

    configure_logging(args.json_logs)
    log = get_logger("fedsim.run")
    overrides = list(args.overrides)
    if args.seed is not None:
        overrides.append(f"seed={args.seed}")
    loaded = load_scenario(args.scenario, overrides)
    scenario = loaded.scenario
    out = Path(args.out) if args.out else _default_out(scenario.name, scenario.seed)
    stop = scenario.stop
    total: float | None
    unit: ProgressUnit
    if stop.virtual_seconds is not None:
        total, unit = stop.virtual_seconds, "time"
    else:
        total, unit = (float(stop.windows) if stop.windows else None), "windows"
    log.info("run starting", scenario=scenario.name, seed=scenario.seed, out=str(out),
             clients=scenario.clients.total)
    with RunProgress(total, unit=unit) as progress:
        def on_window(line: dict[str, Any]) -> None:
            progress.update(line["time"], line["window"], line["accuracy"],
                            line["min_remaining_epsilon"])
            if line["accuracy"] is not None:
                log.info("window", **{k: line[k] for k in ("window", "time", "version", "accuracy",
                                                         "applied", "active_clients")})

        make_batcher = None
        if args.executor == "ray":
            from fedsim.runtime.ray_executor import ray_batcher

            make_batcher = ray_batcher(workers=args.ray_workers, address=args.address)
        result = run_scenario(loaded, out, on_window=on_window, make_batcher=make_batcher)
    summary = result.summary
    plots: list[Path] = []
    if not args.no_plots and importlib.util.find_spec("fedsim.reporting.plots") is not None:
        from fedsim.reporting.plots import draw_all

        plots = draw_all(out)
    log.info("run finished", out=str(out), final_accuracy=summary["final_accuracy"],
             windows=summary["windows"], virtual_time=summary["virtual_time"],
             wall_seconds=round(result.wall_seconds, 2), plots=len(plots))
    accuracy = summary["final_accuracy"]
    print(f"{out}: {summary['windows']} windows, {summary['virtual_time']:.1f} virtual s, "
          f"final accuracy {accuracy if accuracy is None else f'{accuracy:.4f}'}, "
          f"eps (delta={summary['privacy']['delta']:g}) "
          f"{summary['privacy']['epsilon_min']:.3g}..{summary['privacy']['epsilon_max']:.3g}, "
          f"{result.wall_seconds:.1f} wall s")
    print(summary["explanation"])
    return 0
