"""``fedsim aggregator --scenario S --aggregator-id aggregator-K --broker mqtt://HOST:PORT``: one
aggregation node of a deployed run as its own process (docs/DEPLOYMENT.md, "Aggregation nodes").

It reads the updates of the clients routed to it, checks what public data allows, pre-mixes
them and sends the server one partial per window; it exits 0 when the server announces the end
of the run (or on SIGTERM/SIGINT). The scenario's ``aggregators.count`` (or ``--set
aggregators.count=K``, as ``fedsim launch --aggregators K`` passes it) says how many there are;
the server and every aggregator must agree on it. Credentials: ``user:password@`` in the broker
URL, or the secrets file ``fedsim deploy`` writes (``--secrets FILE`` or ``$FEDSIM_SECRETS``).
"""

from __future__ import annotations

import argparse
from typing import Any

from fedsim.commands.processes import add_process_parser, process_setup
from fedsim.runtime.deployed.options import DeploymentOptions

DESCRIPTION = (
    "Run one aggregation node of a scenario as its own process, between the clients and the "
    "server, through an MQTT broker."
)


def register(subparsers: Any) -> argparse.ArgumentParser:
    parser = add_process_parser(
        subparsers, "aggregator", help="Run one aggregation node of a scenario as a process.",
        description=DESCRIPTION,
        identity=("--aggregator-id", "Which aggregator to run: aggregator-0 ... aggregator-(K-1)."),
        state_help="Where its outcome file goes (by default fedsim-state/RUN/AGGREGATOR-ID).",
    )
    DeploymentOptions.add_arguments(parser)
    parser.set_defaults(func=run)
    return parser


def run(args: argparse.Namespace) -> int:
    from fedsim.runtime.deployed.aggregator_process import run_aggregator
    from fedsim.runtime.deployed.deployment import run_process

    setup = process_setup(args, role="aggregator", identity=args.aggregator_id)
    outcome = run_process(
        lambda stop: run_aggregator(setup.loaded, args.aggregator_id, setup.broker,
                                    run=setup.run_name, state_dir=setup.state,
                                    options=setup.options, stop=stop),
        setup.loaded.scenario.torch_threads,
    )
    print(f"{args.aggregator_id}: {outcome['folded']} updates folded into {outcome['partials']} "
          f"partials, {outcome['forwarded']} forwarded"
          f"{'' if outcome['finished'] else '; stopped before the end of the run'}")
    return 0
