"""``fedsim validate FILE``: check a scenario file and list every problem with its YAML path.

Every problem of the schema comes in one run: each field's error, and the checks that tie
fields together (unique group names, data shares, a run that can stop) wherever every field
they read is valid (:mod:`fedsim.config.cross_field`).

Validation reads the file, never the network. Beyond the schema it checks what can be known
without training: that every group's data share gives each client at least ``batch_size``
records (q = m/N <= 1), that the model's size is trainable and that noise targets can be
calibrated; it warns about clients whose budget cannot pay for a single round (they would
never train), and refuses the file when no client of any group can (a run would train
nothing). Those checks need the data set's records, so they run when the data is on this
machine (synthetic data, an ``arrays`` file, a registered data set found where ``fedsim data
where`` looks); otherwise they are skipped, and the output says so. ``--check-data`` makes the
data's presence part of the check: it fetches a registered data set that is nowhere (unless
``--offline``), runs a ``dataset.factory``, and a data set that cannot be had is an error.
Exit status 0 when the file is valid (warnings and skipped checks included), 2 otherwise.

A ``model.factory`` or ``dataset.factory`` is code the scenario makes this machine run: it is
neither imported nor called without ``--allow-factory``. The checks that need it are then
skipped, and the output says which (a scenario whose model alone is a factory still has its
data, partition and calibration checked).
"""

from __future__ import annotations

import argparse
from typing import Any

from fedsim.commands.run import seed_argument
from fedsim.config import LoadedScenario, load_scenario
from fedsim.config.factories import ALLOW_FLAG, scenario_factories
from fedsim.config.schema import Scenario
from fedsim.runtime.deployed.options import add_allow_factory_option

DESCRIPTION = (
    "Check a scenario file and list every problem with its place in the YAML file: each "
    "field's error and, wherever the fields they read are valid, the checks that tie fields "
    "together. It reads "
    "the file, never the network. Beyond the schema it checks what can be known without "
    "training: that every client gets at least batch_size records, that the model's size is "
    "trainable, that noise targets can be calibrated and that some client can afford a round "
    "within its budget; these checks read the data set, so "
    "they run when it is on this machine and are otherwise skipped, saying so. With "
    "--check-data the data set must be had: fetched where it is nowhere (unless --offline). "
    "A model or data set factory the scenario names is not run without --allow-factory. "
    "The exit status is 0 when the file is valid and 2 otherwise."
)


def register(subparsers: Any) -> argparse.ArgumentParser:
    parser = subparsers.add_parser("validate", help="Check a scenario file and list every error.",
                                   description=DESCRIPTION)
    parser.add_argument("scenario", metavar="FILE", help="The scenario YAML file.")
    parser.add_argument("--seed", type=seed_argument,
                        help="Check with this seed instead of the scenario's (as fedsim run "
                             "--seed: the partition, and with it each client's records, "
                             "follows the seed).")
    parser.add_argument("--set", dest="overrides", action="append", default=[],
                        metavar="PATH=VALUE", help="Override one setting with a YAML value, for example "
                             "stop.windows=10; repeatable.")
    checks = parser.add_mutually_exclusive_group()
    checks.add_argument("--schema-only", action="store_true",
                        help="Check the schema only; skip the checks that read the data set.")
    checks.add_argument("--check-data", action="store_true",
                        help="Also check that the data set can be had: fetch a registered one "
                             "that is not on this machine (unless --offline) and run a data "
                             "set factory; one that cannot be had is an error.")
    parser.add_argument("--deployed", action="store_true",
                        help="List every note on a deployment of the scenario (fedsim launch, "
                             "fedsim deploy): each group's pacing and release times, and what a "
                             "deployed run does not do as a simulation does (without it only a "
                             "group that cannot be deployed or whose release times are not "
                             "padded is named).")
    add_allow_factory_option(parser)
    parser.set_defaults(func=run)
    return parser


def _missing_dataset_path(loaded: LoadedScenario) -> list[str]:
    """A warning when ``dataset.path`` names a place holding no copy of a registered data set
    (runs then look further: :func:`fedsim.data.datasets.path_missing`)."""
    dataset = loaded.scenario.dataset
    if (not dataset.path or dataset.factory is not None
            or dataset.name in (None, "synthetic", "arrays")):
        return []
    from fedsim.data.datasets import path_missing

    if not path_missing(dataset.name, dataset.path, loaded.base_dir):
        return []
    return [f"dataset.path {dataset.path} holds no {dataset.name} (a typo?); runs look further "
            f"($FEDSIM_DATA_DIR, the user cache, a download) and use the first copy they find "
            f"(`fedsim data where {dataset.name}` lists the places)"]


def data_not_here(loaded: LoadedScenario) -> str | None:
    """Why the scenario's data cannot be read without the network or the user's code (a
    registered data set in none of the places it is looked for, a ``dataset.factory``), or
    None when it is on this machine (synthetic, an ``arrays`` file, a local copy)."""
    dataset = loaded.scenario.dataset
    if dataset.factory is not None:
        return f"dataset.factory {dataset.factory!r} is code that may fetch its data"
    if dataset.name is None or dataset.name in ("synthetic", "arrays"):
        return None
    from fedsim.data import datasets

    spec = datasets.get(dataset.name)
    for place in (p.where for p in datasets.places(spec, dataset.path, loaded.base_dir)):
        try:
            if place is not None and datasets.holds(spec, place):
                return None
        except OSError:  # a name the operating system refuses: not a place that holds it
            continue
    return f"{spec.name} is not on this machine (`fedsim data where {spec.name}` lists the places)"


def _check_model_options(name: str | None, options: dict[str, Any]) -> None:
    """A built-in model's option names, checked without its data (torch imported here only)."""
    if name is None:
        return
    from fedsim.errors import ConfigError, ModelError
    from fedsim.training.models import check_model_options

    try:
        check_model_options(name, options)
    except ModelError as exc:
        raise ConfigError(f"model.options: {exc}") from None


def _budget_warnings(loaded: LoadedScenario, plans: list[Any]) -> list[str]:
    """The warnings about clients whose budget cannot pay for one round; the file's problem
    when no client of any group can, each group's warning line under it (a run would end at
    once with the initial model: a stranger read "valid" above three warnings as a file
    worth running)."""
    from fedsim.config.schema import FieldProblem
    from fedsim.training.preflight import preflight_warnings, trains_nobody

    lines = preflight_warnings(plans, log=False)
    if not trains_nobody(plans):
        return lines
    message = ("no client of any group can afford a single round within its budget, so a run "
               "would train nothing (it would end at once with the initial model); raise "
               "budget.epsilon or noise, or lower batch_size:")
    raise loaded.problems_error([FieldProblem(("clients", "groups"),
                                              "\n    ".join([message, *lines]))])


def run(args: argparse.Namespace) -> int:  # noqa: C901 - one branch per check that may be skipped, in order
    overrides = [*args.overrides, *([f"seed={args.seed}"] if args.seed is not None else [])]
    loaded = load_scenario(args.scenario, overrides, allow_factories=args.allow_factories)
    scenario = loaded.scenario
    factories = {} if loaded.allow_factories else scenario_factories(scenario)
    skipped: list[str] = []
    not_here: str | None = None
    clients, warnings = scenario.clients.total, []
    if not args.schema_only:
        plans: list[Any] = []
        if "dataset.factory" in factories:  # the data is the user's code: not run
            skipped.append("the data, partition, calibration and model checks")
        elif not args.check_data and (not_here := data_not_here(loaded)) is not None:
            # Said below: the checks that read the data need it on this machine; a built-in
            # model's option names need none.
            _check_model_options(scenario.model.name, scenario.model.options)
        # torch is imported only when needed
        elif not factories:
            from fedsim.runtime.population import build_population

            plans = build_population(loaded).plans
        else:  # the data checked, the model (a factory) not built
            from fedsim.data.load import scenario_data
            from fedsim.runtime.population import client_plans
            from fedsim.runtime.rng import SeedTree

            tree = SeedTree(scenario.seed)
            found = scenario_data(scenario.dataset, base_dir=loaded.base_dir,
                                  seed=tree.integer("dataset"))
            plans = client_plans(loaded, tree, found.tensors[1].numpy(),
                                 found.train_writers)
            skipped.append("the model checks (size, DP compatibility, forward probe)")
        if plans:
            clients = len(plans)
            warnings = _budget_warnings(loaded, plans)  # printed below
    groups = len(scenario.clients.groups)
    print(f"{args.scenario}: valid ({clients} client{'s' if clients != 1 else ''} in {groups} "
          f"group{'s' if groups != 1 else ''}, "
          f"seed {scenario.seed})")
    if not_here is not None:
        print(f"  not checked: the records each client gets, the model's size and the noise "
              f"calibration, which read the data: {not_here}; `fedsim validate --check-data` "
              f"checks them")
    if not args.schema_only:
        warnings += _missing_dataset_path(loaded)
    other_delta = scenario.budgets_at_other_delta()
    if other_delta:
        warnings.append(
            f"the budgets of {', '.join(other_delta)} hold at their own delta, not "
            f"privacy.delta {scenario.privacy.delta:g}, the delta every report gives eps at: "
            "their eps may read above their budget there (clients.csv says budget_delta)")
    for line in warnings:
        print(f"  warning: {line}")
    if factories:
        named = ", ".join(f"{where} {reference!r}" for where, reference in factories.items())
        print(f"  not run: {named} is Python code this scenario would import and call; "
              f"validate runs it only with {ALLOW_FLAG} (and run, launch, client, server and "
              "deploy refuse it without that flag)"
              + (f"; skipped: {'; '.join(skipped)}" if skipped else ""))
    _print_deployed(scenario, every_note=args.deployed)
    return 0


def _print_deployed(scenario: Scenario, *, every_note: bool) -> None:
    """The "if deployed" lines: every note with ``every_note`` (--deployed), else their count
    and only the groups' caveats (one that cannot be deployed, release times not padded)."""
    from fedsim.runtime.deployed.differences import scenario_differences
    from fedsim.runtime.deployed.guarantees import group_guarantees

    # (Every group's line, under one heading: a stranger running simulations only took
    # "deployed, paced at ..." for something about their run. Without --deployed only what
    # a deployment must not miss: another stranger found the whole block buried the warnings.)
    guarantees = group_guarantees(scenario)
    notes = [g.text for g in guarantees] + scenario_differences(scenario)
    shown = notes if every_note else [g.text for g in guarantees if g.caveat]
    print("  if deployed (fedsim launch, fedsim deploy):"
          + ("" if shown else f" {len(notes)} note{'s' if len(notes) != 1 else ''} on its "
             f"pacing, release times and what it does not do as a simulation does; "
             f"`fedsim validate --deployed` lists them"))
    for line in shown:
        print(f"    {line}")
    if shown and len(shown) < len(notes):
        print(f"    and {len(notes) - len(shown)} more note(s): `fedsim validate --deployed` "
              f"lists them")
