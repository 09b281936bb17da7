"""``fedsim client --scenario S --client-id ID --broker mqtt://HOST:PORT [--state DIR]``: one
client of a scenario as its own process.

The client takes its data partition (the simulator's seeded split: client ID holds the same
records in both modes) and its DP posture (batch size, sampling, clipping, noise, budget) from
the scenario. Its privacy ledger lives in ``--state`` and is resumed, never reset, when the
process restarts. It exits 0 when its rounds or budget end (after the server has acknowledged
its updates) or on SIGTERM/SIGINT; started on the state of a client whose run ended (its exit
report says so, or the broker's retained end of the run it followed), it exits 2 at once,
saying so in one line. Time scale, credentials and broker:
see ``fedsim server``.
"""

from __future__ import annotations

import argparse
from typing import Any

from fedsim.commands.processes import add_process_parser, process_setup
from fedsim.runtime.deployed.options import FLUSH_TIMEOUT, DeploymentOptions

DESCRIPTION = (
    "Run one client of a scenario as its own process, talking to the server through an MQTT "
    "broker. Its privacy ledger lives in the --state directory and is resumed, never reset, "
    "when the process restarts; so do the updates it sent and saw no receipt for, which a "
    "restarted process sends again."
)


def register(subparsers: Any) -> argparse.ArgumentParser:
    parser = add_process_parser(
        subparsers, "client",
        help="Run one client of a scenario as a process talking to an MQTT broker.",
        description=DESCRIPTION,
        identity=("--client-id", "Which client of the scenario to run, for example phone-000."),
        state_help="The client's own directory: its ledger and its unacknowledged updates "
                   "(by default fedsim-state/RUN/CLIENT-ID).",
    )
    parser.add_argument(
        "--flush-timeout",
        type=float,
        default=FLUSH_TIMEOUT,
        metavar="SECONDS",
        help="How long to wait for the server's receipts before exiting (default: "
        "%(default)s).",
    )
    DeploymentOptions.add_arguments(parser)
    parser.set_defaults(func=run)
    return parser


def run(args: argparse.Namespace) -> int:
    from fedsim.runtime.deployed.client_process import run_client
    from fedsim.runtime.deployed.deployment import run_process

    setup = process_setup(args, role="client", identity=args.client_id)
    outcome = run_process(
        lambda stop: run_client(
            setup.loaded,
            args.client_id,
            setup.broker,
            run=setup.run_name,
            state_dir=setup.state,
            options=setup.options,
            flush_timeout=args.flush_timeout,
            stop=stop,
        ),
        setup.loaded.scenario.torch_threads,
    )
    print(
        f"client {args.client_id}: {outcome['state']}, {len(outcome['ledger_rounds'])} rounds "
        f"in its ledger{'; ' + outcome['stop_reason'] if outcome['stop_reason'] else ''}"
    )
    return 0
