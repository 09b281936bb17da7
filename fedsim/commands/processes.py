"""What the deployed-process commands share (``fedsim server``, ``fedsim client``, ``fedsim
aggregator``): their parser's common options and the set-up their ``run`` starts with."""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from fedsim.config import load_scenario
from fedsim.runtime.deployed.options import DeploymentOptions

if TYPE_CHECKING:  # (the MQTT stack is imported by run, not by building the parser)
    from fedsim.config.loading import LoadedScenario
    from fedsim.transports.mqtt_settings import BrokerSettings

__all__ = ["ProcessSetup", "add_process_parser", "process_setup"]


def add_process_parser(subparsers: Any, name: str, *, help: str, description: str,
                       state_help: str, identity: tuple[str, str] | None = None
                       ) -> argparse.ArgumentParser:
    """The ``name`` command's parser with ``--scenario``, the process's identity option
    (``(flag, help)``, required, ``ID``; None: the server) and ``--state``; the command adds its
    own options, then :meth:`DeploymentOptions.add_arguments`."""
    parser: argparse.ArgumentParser = subparsers.add_parser(name, help=help,
                                                            description=description)
    parser.add_argument("--scenario", required=True, metavar="FILE", help="The scenario YAML file.")
    if identity is not None:
        flag, identity_help = identity
        parser.add_argument(flag, required=True, metavar="ID", help=identity_help)
    parser.add_argument("--state", metavar="DIR", help=state_help)
    return parser


@dataclass(frozen=True)
class ProcessSetup:
    """A deployed process's options, scenario, broker, run name and state directory."""

    options: DeploymentOptions
    loaded: LoadedScenario
    broker: BrokerSettings
    run_name: str
    state: Path


def process_setup(args: argparse.Namespace, *, role: str, identity: str | None = None
                  ) -> ProcessSetup:
    """Read the options, load the scenario and resolve the broker of a process playing
    ``role`` as ``identity`` (a client's or aggregator's id; None: the server). The run name is
    the broker's or the scenario's; the state directory ``--state`` or
    ``fedsim-state/RUN/(identity or role)``."""
    from fedsim.runtime.deployed.deployment import broker_for

    options = DeploymentOptions.from_args(args)
    loaded = load_scenario(args.scenario, args.overrides,
                           allow_factories=options.allow_factories)
    broker, run_name = broker_for(options, role=role, client_id=identity)
    run_name = run_name or loaded.scenario.name
    state = Path(args.state) if args.state else Path("fedsim-state") / run_name / (identity or role)
    return ProcessSetup(options, loaded, broker, run_name, state)
