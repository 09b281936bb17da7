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
from pathlib import Path
from typing import Any

from fedsim.commands.server import add_deployment_options, add_tls_options

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
    parser.add_argument("scenario", metavar="SCENARIO", help="The scenario YAML file.")
    parser.add_argument(
        "--out", metavar="DIR", help="The run directory (by default runs/NAME-launch)."
    )
    parser.add_argument(
        "--timeout",
        type=float,
        default=3600.0,
        metavar="SECONDS",
        help="Give up if the server has not stopped after this many wall seconds.",
    )
    parser.add_argument("--no-plots", action="store_true", help="Do not draw the plots.")
    add_deployment_options(parser)
    add_tls_options(parser)
    parser.set_defaults(func=run)
    return parser


def tls_arguments(args: argparse.Namespace) -> list[str]:
    """The TLS options given to ``fedsim launch``, to pass on to every process (absolute paths:
    the processes may run elsewhere)."""
    forwarded: list[str] = []
    for flag, value in (
        ("--tls-ca", args.tls_ca),
        ("--tls-cert", args.tls_cert),
        ("--tls-key", args.tls_key),
    ):
        if value is not None:
            forwarded += [flag, str(Path(value).resolve())]
    if args.tls_insecure:
        forwarded.append("--tls-insecure")
    return forwarded


def run(args: argparse.Namespace) -> int:
    from fedsim.config import load_scenario
    from fedsim.errors import ConfigError
    from fedsim.reporting.horizon import HorizonTracker, bound_horizon
    from fedsim.reporting.progress import RunProgress
    from fedsim.runtime.deployment import Launcher

    if args.run is not None:
        raise ConfigError("fedsim launch names the run after the scenario; --run is not used")
    name = load_scenario(args.scenario, args.overrides).scenario.name
    out = Path(args.out) if args.out else Path("runs") / f"{name}-launch"
    launcher = Launcher(
        args.scenario,
        out,
        overrides=args.overrides,
        broker=args.broker,
        secrets_file=args.secrets,
        time_scale=args.time_scale,
        max_backoff=args.max_backoff,
        tls_options=tls_arguments(args),
    )
    horizon = bound_horizon(launcher.scenario)  # the first hard stop, in scenario seconds
    tracker = HorizonTracker(horizon, launcher.scenario.server.window)
    quiet = getattr(args, "quiet", False)

    def on_window(line: dict[str, Any]) -> None:
        progress.set_total(tracker.observe(line["time"], line["active_clients"]))
        progress.update(line["time"], line["window"], line["accuracy"],
                        line["min_remaining_epsilon"], line["active_clients"])

    with RunProgress(horizon.seconds, unit="time", enabled=False if quiet else None) as progress:
        summary = launcher.run_to_end(args.timeout, plots=not args.no_plots, on_window=on_window)
    accuracy = summary["final_accuracy"]
    print(
        f"{out}: {summary['windows']} windows, {summary['virtual_time']:.1f} scenario s, "
        f"final accuracy {'n/a' if accuracy is None else f'{accuracy:.4f}'}, "
        f"{len(launcher.client_ids)} client processes"
    )
    print(summary["explanation"])
    return 0
