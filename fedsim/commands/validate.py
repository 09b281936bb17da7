"""``fedsim validate FILE``: check a scenario file and list every problem with its YAML path.

Beyond the schema it checks what can be known without training: that the data set is found
(fetched into the user cache where it is nowhere, unless ``--offline``), that every group's
data share gives each client at least ``batch_size`` records (q = m/N <= 1), that the model's
size is trainable and that noise targets can be calibrated; it warns about clients whose budget
cannot pay for a single round (they would never train). Exit status 0 when the file is valid
(warnings included), 2 otherwise.
"""

from __future__ import annotations

import argparse
from typing import Any

from fedsim.config import load_scenario

DESCRIPTION = (
    "Check a scenario file and list every problem with its place in the YAML file. Beyond the "
    "schema it checks what can be known without training: that the data set can be found, that "
    "every client gets at least batch_size records and that noise targets can be calibrated. "
    "The exit status is 0 when the file is valid and 2 otherwise."
)


def register(subparsers: Any) -> argparse.ArgumentParser:
    parser = subparsers.add_parser("validate", help="Check a scenario file and list every error.",
                                   description=DESCRIPTION)
    parser.add_argument("scenario", metavar="FILE", help="The scenario YAML file.")
    parser.add_argument("--set", dest="overrides", action="append", default=[],
                        metavar="PATH=VALUE", help="Override one setting with a YAML value, for example "
                             "stop.windows=10; repeatable.")
    parser.add_argument("--schema-only", action="store_true",
                        help="Check the schema only; skip the checks that load the data set.")
    parser.set_defaults(func=run)
    return parser


def run(args: argparse.Namespace) -> int:
    loaded = load_scenario(args.scenario, args.overrides)
    scenario = loaded.scenario
    if not args.schema_only:
        from fedsim.runtime.population import build_population  # torch import only when needed
        from fedsim.training.preflight import preflight_warnings

        population = build_population(loaded)
        clients = len(population.plans)
        warnings = preflight_warnings(population.plans, log=False)  # printed below
    else:
        clients, warnings = scenario.clients.total, []
    print(f"{args.scenario}: valid ({clients} clients in {len(scenario.clients.groups)} groups, "
          f"seed {scenario.seed})")
    for line in warnings:
        print(f"  warning: {line}")
    from fedsim.runtime.deployed.guarantees import guarantee_lines

    for line in guarantee_lines(scenario):
        print(f"  {line}")
    return 0
