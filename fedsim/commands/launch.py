"""``fedsim launch SCENARIO [--broker URL] [--out DIR]``: run a scenario as separate local
processes - one server, one per client - talking through MQTT (what ``docker-compose.yml``
does with containers, without Docker), then collect the same run directory as ``fedsim run``.

Without ``--broker`` a private mosquitto with generated passwords and ACL is started on
127.0.0.1 (a free port) and stopped at the end. With ``--broker``, pass the run's secrets file
(``fedsim deploy``) with ``--secrets``, and for ``mqtts://`` the ``--tls-*`` options, which
every process gets. ``--time-scale X``: X wall seconds per scenario second.
"""

from __future__ import annotations

import argparse
import importlib.util
from pathlib import Path
from typing import Any

from fedsim.runtime.options import LAUNCH_WAIT_FOR_CLIENTS, DeploymentOptions


def register(subparsers: Any) -> argparse.ArgumentParser:
    parser = subparsers.add_parser(
        "launch",
        help="run a scenario as local server/client processes",
        description=__doc__.splitlines()[0],
    )
    parser.add_argument("scenario", metavar="SCENARIO", help="scenario YAML file")
    parser.add_argument(
        "--out", metavar="DIR", help="run directory (default: runs/<scenario name>-launch)"
    )
    parser.add_argument(
        "--timeout",
        type=float,
        default=3600.0,
        metavar="SECONDS",
        help="give up if the server has not stopped after this long (wall)",
    )
    parser.add_argument("--no-plots", action="store_true", help="do not draw plots")
    DeploymentOptions.add_arguments(parser, wait_for_clients=LAUNCH_WAIT_FOR_CLIENTS)
    parser.set_defaults(func=run)
    return parser


def run(args: argparse.Namespace) -> int:
    from fedsim.config import load_scenario
    from fedsim.logging import configure_logging
    from fedsim.reporting.progress import ProgressUnit, RunProgress
    from fedsim.runtime.launcher import Launcher

    options = DeploymentOptions.from_args(args)
    configure_logging(options.json_logs)
    name = load_scenario(args.scenario, args.overrides).scenario.name
    out = Path(args.out) if args.out else Path("runs") / f"{name}-launch"
    launcher = Launcher(args.scenario, out, options=options, overrides=args.overrides)
    stop = launcher.scenario.stop
    total: float | None
    unit: ProgressUnit
    if stop.virtual_seconds is not None:
        total, unit = stop.virtual_seconds, "time"
    else:
        total, unit = (float(stop.windows) if stop.windows else None), "windows"
    with RunProgress(total, unit=unit) as progress:
        summary = launcher.run_to_end(
            args.timeout,
            on_window=lambda line: progress.update(
                line["time"], line["window"], line["accuracy"], line["min_remaining_epsilon"]
            ),
        )
    if not args.no_plots and importlib.util.find_spec("fedsim.reporting.plots") is not None:
        from fedsim.reporting.plots import draw_all

        draw_all(out)
    accuracy = summary["final_accuracy"]
    print(
        f"{out}: {summary['windows']} windows, {summary['virtual_time']:.1f} scenario s, "
        f"final accuracy {'n/a' if accuracy is None else f'{accuracy:.4f}'}, "
        f"{len(launcher.client_ids)} client processes"
    )
    print(summary["explanation"])
    return 0
