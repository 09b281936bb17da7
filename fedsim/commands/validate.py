"""``fedsim validate FILE``: check a scenario file and list every problem with its YAML path.

Beyond the schema it checks what can be known without training: that the data set is found
(fetched into the user cache where it is nowhere, unless ``--offline``), that every group's
data share gives each client at least ``batch_size`` records (q = m/N <= 1), that the model's
size is trainable and that noise targets can be calibrated; it warns about clients whose budget
cannot pay for a single round (they would never train). Exit status 0 when the file is valid
(warnings included), 2 otherwise.

A ``model.factory`` or ``dataset.factory`` is code the scenario makes this machine run: it is
neither imported nor called without ``--allow-factory``. The checks that need it are then
skipped, and the output says which (a scenario whose model alone is a factory still has its
data, partition and calibration checked).
"""

from __future__ import annotations

import argparse
from typing import Any

from fedsim.config import load_scenario
from fedsim.config.factories import ALLOW_FLAG, scenario_factories
from fedsim.runtime.deployed.options import add_allow_factory_option

DESCRIPTION = (
    "Check a scenario file and list every problem with its place in the YAML file. Beyond the "
    "schema it checks what can be known without training: that the data set can be found, that "
    "every client gets at least batch_size records and that noise targets can be calibrated. "
    "A model or data set factory the scenario names is not run without --allow-factory. "
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
    add_allow_factory_option(parser)
    parser.set_defaults(func=run)
    return parser


def run(args: argparse.Namespace) -> int:
    loaded = load_scenario(args.scenario, args.overrides, allow_factories=args.allow_factories)
    scenario = loaded.scenario
    factories = {} if loaded.allow_factories else scenario_factories(scenario)
    skipped: list[str] = []
    clients, warnings = scenario.clients.total, []
    if not args.schema_only:
        # torch is imported only when needed
        from fedsim.training.preflight import preflight_warnings

        if not factories:
            from fedsim.runtime.population import build_population

            plans = build_population(loaded).plans
        elif "dataset.factory" not in factories:  # the data checked, the model not built
            from fedsim.data.load import scenario_data
            from fedsim.runtime.population import client_plans
            from fedsim.runtime.rng import SeedTree

            tree = SeedTree(scenario.seed)
            found = scenario_data(scenario.dataset, base_dir=loaded.base_dir,
                                  seed=tree.integer("dataset"))
            plans = client_plans(scenario, tree, found.tensors[1].numpy(), found.train_writers)
            skipped.append("the model checks (size, DP compatibility, forward probe)")
        else:
            plans = []
            skipped.append("the data, partition, calibration and model checks")
        if plans:
            clients = len(plans)
            warnings = preflight_warnings(plans, log=False)  # printed below
    print(f"{args.scenario}: valid ({clients} clients in {len(scenario.clients.groups)} groups, "
          f"seed {scenario.seed})")
    for line in warnings:
        print(f"  warning: {line}")
    if factories:
        named = ", ".join(f"{where} {reference!r}" for where, reference in factories.items())
        print(f"  not run: {named} is Python code this scenario would import and call; "
              f"validate runs it only with {ALLOW_FLAG} (and run, launch, client, server and "
              "deploy refuse it without that flag)"
              + (f"; skipped: {'; '.join(skipped)}" if skipped else ""))
    from fedsim.runtime.deployed.guarantees import guarantee_lines

    for line in guarantee_lines(scenario):
        print(f"  {line}")
    return 0
