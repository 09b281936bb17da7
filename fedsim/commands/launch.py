"""``fedsim launch SCENARIO [--broker URL] [--out DIR]``: run a scenario as separate local
processes - one server, one per client and ``--aggregators K`` aggregation nodes - talking
through MQTT (what ``docker-compose.yml``
does with containers, without Docker), then collect the same run directory as ``fedsim run``.

Without ``--broker`` a private mosquitto with generated passwords and ACL is started on
127.0.0.1 (a free port) and stopped at the end. With ``--broker``, pass the run's secrets file
(``fedsim deploy``) with ``--secrets``, and for ``mqtts://`` the ``--tls-*`` options, which
every process gets. ``--time-scale X``: X wall seconds per scenario second. Interrupted
(Ctrl-C or SIGTERM), it stops the processes and still writes a partial summary that ``fedsim
report`` reads, as ``fedsim run`` does; so it does, and exits 1, at its ``--timeout``, when the
server process fails, or when a client process is killed again and again (one killed by a
signal is restarted from its state). ``fedsim launch --resume DIR`` goes on with it (the
server from its checkpoint, each client from its ledger) and writes the run directory again.
"""

from __future__ import annotations

import argparse
import importlib.util
from pathlib import Path
from typing import Any

from fedsim.commands.run import out_argument
from fedsim.runtime.deployed.options import LAUNCH_WAIT_FOR_CLIENTS, DeploymentOptions

DESCRIPTION = (
    "Run a scenario as separate local processes, one server and one per client, talking through "
    "MQTT, and collect the same run directory as fedsim run. Without --broker a private "
    "mosquitto broker is started on 127.0.0.1 and stopped at the end."
)


def register(subparsers: Any) -> argparse.ArgumentParser:
    parser = subparsers.add_parser(
        "launch",
        help="Run a scenario as local server and client processes over MQTT.",
        description=DESCRIPTION,
    )
    parser.add_argument("scenario", metavar="SCENARIO", nargs="?",
                        help="The scenario YAML file (not with --resume).")
    parser.add_argument(
        "--out", metavar="DIR", type=out_argument,
        help="The run directory (by default runs/NAME-launch, with a numeric suffix if that "
             "exists, as fedsim run does)."
    )
    parser.add_argument(
        "--resume", metavar="DIR",
        help="Go on with the interrupted or stopped launch in DIR, with its own resolved "
             "scenario: the server resumes from its checkpoint, each client from its ledger, "
             "and the run directory is written again at the end.")
    parser.add_argument(
        "--timeout",
        type=float,
        default=3600.0,
        metavar="SECONDS",
        help="Give up if the server has not stopped after this many wall seconds (default: "
        "%(default)s): the processes are stopped, a partial summary is written and "
        "--resume goes on with the run.",
    )
    parser.add_argument(
        "--aggregators",
        type=int,
        metavar="K",
        help="Start K aggregation nodes between the clients and the server (the same as --set "
        "aggregators.count=K; by default the scenario's aggregators.count).",
    )
    parser.add_argument("--no-plots", action="store_true", help="Do not draw the plots.")
    DeploymentOptions.add_arguments(parser, wait_for_clients=LAUNCH_WAIT_FOR_CLIENTS,
                                    launcher=True)
    parser.set_defaults(func=run)
    return parser


def _scenario_file(args: argparse.Namespace) -> tuple[Path, Path | None]:
    """The scenario to launch, and with ``--resume DIR`` that directory (checked)."""
    from fedsim.errors import ConfigError
    from fedsim.runtime.deployed.resume import resumable_scenario

    if args.resume is not None:
        if args.scenario is not None or args.out is not None or args.overrides:
            raise ConfigError("--resume DIR runs DIR's own resolved scenario into DIR: give "
                              "no SCENARIO, --out, --set or --aggregators with it")
        return resumable_scenario(args.resume), Path(args.resume)
    if args.scenario is None:
        raise ConfigError("give a SCENARIO to launch (or --resume DIR to go on with an "
                          "interrupted launch)")
    return Path(args.scenario), None


def run(args: argparse.Namespace) -> int:
    from fedsim.config import load_scenario
    from fedsim.config.factories import require_allowed
    from fedsim.errors import ConfigError
    from fedsim.runtime.run_outputs import claimed_run_dir

    options = DeploymentOptions.from_args(args)
    if not args.timeout > 0:  # (NaN too) a stranger's --timeout -1 started every process first
        raise ConfigError(f"--timeout must be a positive number of seconds, got {args.timeout!r}")
    if args.aggregators is not None:  # one spelling of the count: the scenario's
        args.overrides = [*args.overrides, f"aggregators.count={args.aggregators}"]
    scenario_file, resumed = _scenario_file(args)
    loaded = load_scenario(scenario_file, args.overrides)
    require_allowed(loaded.scenario, options.allow_factories)  # before any directory is made
    if resumed or args.out:
        return _launch_into(args, options, scenario_file, resumed or Path(args.out), resumed)
    # claimed at once (two launches started together take two), given back if it fails first
    with claimed_run_dir(f"{loaded.scenario.name}-launch") as out:
        return _launch_into(args, options, scenario_file, out, resumed)


def _launch_into(args: argparse.Namespace, options: DeploymentOptions, scenario_file: Path,
                 out: Path, resumed: Path | None) -> int:
    """:func:`run` into the run directory ``out``."""
    from fedsim.commands.run import interrupted_exit
    from fedsim.reporting.horizon import HorizonTracker, bound_horizon
    from fedsim.reporting.progress import RunProgress, log_evaluation
    from fedsim.runtime.deployed.launcher import Launcher
    from fedsim.runtime.interrupted import signals_interrupt
    from fedsim.runtime.run_outputs import require_writable_dir

    # before any work, as fedsim run (a stranger's launch into a file's path: a traceback)
    require_writable_dir(out, "--resume" if resumed else "--out" if args.out
                         else "run directory")
    launcher = Launcher(scenario_file, out, options=options, overrides=args.overrides,
                        resume=args.resume is not None)
    horizon = bound_horizon(launcher.scenario)  # the first hard stop, in scenario seconds
    tracker = HorizonTracker(horizon, launcher.scenario.server.window)
    quiet = getattr(args, "quiet", False)

    started: list[bool] = []

    def on_window(line: dict[str, Any]) -> None:
        if not started:  # the rate counts from the first window, not the processes' start-up
            started.append(True)
            progress.start_at(line["time"], line["window"])
        progress.set_total(tracker.observe(line["time"], line["active_clients"]))
        progress.update(line["time"], line["window"], line["accuracy"],
                        line["min_remaining_epsilon"], line["active_clients"])
        log_evaluation(line)  # as fedsim run's (a stranger: off a terminal it said nothing)

    with RunProgress(horizon.seconds, unit="time", clock="scenario",
                     enabled=False if quiet else None) as progress:
        try:
            with signals_interrupt():
                summary = launcher.run_to_end(args.timeout, on_window=on_window)
        except KeyboardInterrupt:
            summary = None
    if summary is None:
        code = interrupted_exit(out)
        if (out / "processes.json").exists():
            print(f"'fedsim launch --resume {out}' goes on with it")
        return code
    if not args.no_plots and importlib.util.find_spec("fedsim.reporting.plots") is not None:
        from fedsim.reporting.plots import draw_all

        draw_all(out)
    from fedsim.clock import seconds_text

    accuracy = summary["final_accuracy"]
    print(
        f"{out}: {summary['windows']} windows, {seconds_text(summary['virtual_time'])} "
        f"scenario s, "
        f"final accuracy {'n/a' if accuracy is None else f'{accuracy:.4f}'}, "
        f"{len(launcher.client_ids)} client processes"
        + (f", {len(launcher.aggregator_ids)} aggregators" if launcher.aggregator_ids else "")
    )
    print(summary["explanation"])
    return 0
