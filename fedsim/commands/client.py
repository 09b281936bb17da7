"""``fedsim client --scenario S --client-id ID --broker mqtt://HOST:PORT [--state DIR]``: one
client of a scenario as its own process.

The client takes its data partition (the simulator's seeded split: client ID holds the same
records in both modes) and its DP posture (batch size, sampling, clipping, noise, budget) from
the scenario. Its privacy ledger lives in ``--state`` and is resumed, never reset, when the
process restarts. It exits 0 when its rounds or budget end (after the server has acknowledged
its updates) or on SIGTERM/SIGINT. Time scale, credentials and broker: see ``fedsim server``.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from fedsim.config import load_scenario
from fedsim.runtime.deployed.options import DeploymentOptions

DESCRIPTION = (
    "Run one client of a scenario as its own process, talking to the server through an MQTT "
    "broker. Its privacy ledger lives in the --state directory and is resumed, never reset, "
    "when the process restarts."
)


def register(subparsers: Any) -> argparse.ArgumentParser:
    parser = subparsers.add_parser(
        "client", help="Run one client of a scenario as a process talking to an MQTT broker.",
        description=DESCRIPTION,
    )
    parser.add_argument("--scenario", required=True, metavar="FILE", help="The scenario YAML file.")
    parser.add_argument(
        "--client-id",
        required=True,
        metavar="ID",
        help="Which client of the scenario to run, for example phone-000.",
    )
    parser.add_argument(
        "--state", metavar="DIR", help="The ledger directory (by default fedsim-state/RUN/CLIENT-ID)."
    )
    parser.add_argument(
        "--flush-timeout",
        type=float,
        default=10.0,
        metavar="SECONDS",
        help="How long to wait for the server's receipts before exiting.",
    )
    DeploymentOptions.add_arguments(parser)
    parser.set_defaults(func=run)
    return parser


def run(args: argparse.Namespace) -> int:
    from fedsim.runtime.deployed.client_process import run_client
    from fedsim.runtime.deployed.deployment import broker_for, run_process

    options = DeploymentOptions.from_args(args)
    loaded = load_scenario(args.scenario, args.overrides,
                           allow_factories=options.allow_factories)
    broker, run_name = broker_for(options, role="client", client_id=args.client_id)
    run_name = run_name or loaded.scenario.name
    state = Path(args.state) if args.state else Path("fedsim-state") / run_name / args.client_id
    outcome = run_process(
        lambda stop: run_client(
            loaded,
            args.client_id,
            broker,
            run=run_name,
            state_dir=state,
            options=options,
            flush_timeout=args.flush_timeout,
            stop=stop,
        ),
        loaded.scenario.torch_threads,
    )
    print(
        f"client {args.client_id}: {outcome['state']}, {len(outcome['ledger_rounds'])} rounds "
        f"in its ledger{'; ' + outcome['stop_reason'] if outcome['stop_reason'] else ''}"
    )
    return 0
