"""``fedsim server --scenario S --broker mqtt://HOST:PORT [--state DIR] [--out DIR]``: the
scenario's server as its own process, talking to the clients through an MQTT broker.

It resumes from the checkpoint in ``--state`` if there is one, writes ``metrics.jsonl``,
``scenario.resolved.yaml`` and ``server.json`` to ``--out`` (default: the state directory) and
exits 0 when the scenario's stop condition holds (or on SIGTERM/SIGINT).

Time: scenario times (window length, speeds, ``stop.virtual_seconds``) are scenario seconds;
``--time-scale X`` runs them at X wall seconds each (default 1.0; 0.1 runs ten times faster).
Credentials: ``user:password@`` in the broker URL, or the secrets file ``fedsim deploy`` writes
(``--secrets FILE`` or ``$FEDSIM_SECRETS``); the broker may also come from ``$FEDSIM_BROKER``.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from fedsim.config import load_scenario

DESCRIPTION = (
    "Run a scenario's server as its own process, talking to the clients through an MQTT broker."
)


def add_deployment_options(parser: argparse.ArgumentParser) -> None:
    """Options every deployed process (and ``fedsim launch``) shares."""
    parser.add_argument(
        "--broker",
        metavar="URL",
        help="The broker, as mqtt://[user:password@]HOST[:PORT] or mqtts://... (by "
        "default $FEDSIM_BROKER).",
    )
    parser.add_argument(
        "--secrets",
        metavar="FILE",
        help="The credentials file written by fedsim deploy (by default "
        "$FEDSIM_SECRETS); not needed if the broker URL has user:password.",
    )
    parser.add_argument(
        "--run",
        metavar="NAME",
        help="The run's name in the MQTT topics (by default the secrets file's run, "
        "else the scenario name).",
    )
    parser.add_argument(
        "--time-scale",
        type=float,
        default=1.0,
        metavar="X",
        help="Wall seconds per scenario second (default 1.0; smaller is faster).",
    )
    parser.add_argument(
        "--max-backoff",
        type=float,
        default=10.0,
        metavar="SECONDS",
        help="The longest wait between reconnection attempts, in seconds (default 10).",
    )
    parser.add_argument(
        "--set",
        dest="overrides",
        action="append",
        default=[],
        metavar="PATH=VALUE",
        help="Override one scenario setting with a YAML value; repeatable.",
    )
    parser.add_argument(
        "--json-logs",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="Write log lines as JSON (by default exactly when stderr is not a terminal).",
    )


def add_tls_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--tls-ca", metavar="FILE", help="The CA bundle for mqtts:// (by default the system's).")
    parser.add_argument("--tls-cert", metavar="FILE", help="The client certificate for mqtts://.")
    parser.add_argument("--tls-key", metavar="FILE", help="The client certificate's key for mqtts://.")
    parser.add_argument(
        "--tls-insecure", action="store_true", help="Skip certificate checks (for testing only)."
    )


def tls_settings(args: argparse.Namespace) -> Any:
    from fedsim.transports.mqtt import TlsSettings

    return TlsSettings(
        ca_certs=args.tls_ca,
        certfile=args.tls_cert,
        keyfile=args.tls_key,
        insecure=args.tls_insecure,
    )


def register(subparsers: Any) -> argparse.ArgumentParser:
    parser = subparsers.add_parser(
        "server", help="Run a scenario's server as a process talking to an MQTT broker.",
        description=DESCRIPTION,
    )
    parser.add_argument("--scenario", required=True, metavar="FILE", help="The scenario YAML file.")
    parser.add_argument(
        "--state", metavar="DIR", help="The checkpoint directory (by default fedsim-state/RUN/server)."
    )
    parser.add_argument(
        "--out", metavar="DIR", help="Where metrics.jsonl and server.json go (by default the --state directory)."
    )
    parser.add_argument(
        "--wait-for-clients",
        type=float,
        default=0.0,
        metavar="SECONDS",
        help="Before the first window, wait up to this long for every client to "
        "connect (default 0: start at once; not when resuming from a checkpoint).",
    )
    add_deployment_options(parser)
    add_tls_options(parser)
    parser.set_defaults(func=run)
    return parser


def run(args: argparse.Namespace) -> int:
    from fedsim.runtime.deployment import reconnect_policy, resolve_broker, run_process, serve

    loaded = load_scenario(args.scenario, args.overrides)
    broker, run_name = resolve_broker(
        args.broker, secrets_file=args.secrets, role="server", run=args.run, tls=tls_settings(args)
    )
    run_name = run_name or loaded.scenario.name
    state = Path(args.state) if args.state else Path("fedsim-state") / run_name / "server"
    out = Path(args.out) if args.out else state
    outcome = run_process(
        lambda stop: serve(
            loaded,
            broker,
            run=run_name,
            state_dir=state,
            out_dir=out,
            time_scale=args.time_scale,
            reconnect=reconnect_policy(args.max_backoff),
            wait_for_clients=args.wait_for_clients,
            stop=stop,
        ),
        loaded.scenario.torch_threads,
    )
    accuracy = outcome.get("last_accuracy")
    print(
        f"server {run_name}: {outcome.get('windows')} windows, version "
        f"{outcome.get('final_version')}, accuracy "
        f"{'n/a' if accuracy is None else f'{accuracy:.4f}'}; {outcome['stop_reason']}"
    )
    return 0
