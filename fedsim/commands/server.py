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

from fedsim.commands.processes import add_process_parser, process_setup
from fedsim.commands.run import out_argument
from fedsim.runtime.deployed.options import DeploymentOptions

DESCRIPTION = (
    "Run a scenario's server as its own process, talking to the clients through an MQTT broker."
)


def register(subparsers: Any) -> argparse.ArgumentParser:
    parser = add_process_parser(
        subparsers, "server",
        help="Run a scenario's server as a process talking to an MQTT broker.",
        description=DESCRIPTION,
        state_help="The checkpoint directory (by default fedsim-state/RUN/server).",
    )
    parser.add_argument(
        "--out", metavar="DIR", type=out_argument, help="Where metrics.jsonl and server.json go (by default the --state directory)."
    )
    DeploymentOptions.add_arguments(parser, wait_for_clients=0.0)
    parser.set_defaults(func=run)
    return parser


def run(args: argparse.Namespace) -> int:
    from fedsim.runtime.deployed.deployment import run_process
    from fedsim.runtime.deployed.server_process import serve

    setup = process_setup(args, role="server")
    out = Path(args.out) if args.out else setup.state
    outcome = run_process(
        lambda stop: serve(
            setup.loaded,
            setup.broker,
            run=setup.run_name,
            state_dir=setup.state,
            out_dir=out,
            options=setup.options,
            stop=stop,
        ),
        setup.loaded.scenario.torch_threads,
    )
    print(outcome_line(setup.run_name, outcome))
    return 0


def outcome_line(run: str, outcome: dict[str, Any]) -> str:
    """The line the server prints at its end. The accuracy is the final model's evaluation
    where the server made one, else the last periodic one's (a stranger's 24-window run printed
    "accuracy n/a" from the periodic evaluation alone, while server.json held the final
    model's 0.6184)."""
    if outcome.get("windows") is None:
        # stopped before its first window: a stranger's server, stopped while it waited for
        # its broker, printed "None windows, version None, accuracy n/a (not evaluated)"
        resumed = outcome.get("resumed_from_window")
        return (f"server {run}: no window closed"
                + (f" in this part (resumed after window {resumed})" if resumed else "")
                + f"; {outcome['stop_reason']}")
    final = outcome.get("final_evaluation")
    if final is not None:
        accuracy = f"final accuracy {final['accuracy']:.4f}"
    elif outcome.get("last_accuracy") is not None:
        accuracy = f"last evaluated accuracy {outcome['last_accuracy']:.4f}"
    else:
        accuracy = "accuracy n/a (not evaluated)"
    return (f"server {run}: {outcome.get('windows')} windows, version "
            f"{outcome.get('final_version')}, {accuracy}; {outcome['stop_reason']}")
