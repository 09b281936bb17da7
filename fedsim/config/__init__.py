"""Scenario schema (pydantic, frozen, extra="forbid") and YAML loading: the only place that
parses user input. Errors name the YAML path of what is wrong."""

from fedsim.config.loading import (
    LoadedScenario,
    ScenarioError,
    apply_override,
    dump_scenario,
    load_scenario,
    parse_scenario,
    scenario_json_schema,
)
from fedsim.config.network import Link
from fedsim.config.schema import ClientGroup, Distribution, Scenario

__all__ = [
    "ClientGroup",
    "Distribution",
    "LoadedScenario",
    "Link",
    "Scenario",
    "ScenarioError",
    "apply_override",
    "dump_scenario",
    "load_scenario",
    "parse_scenario",
    "scenario_json_schema",
]
