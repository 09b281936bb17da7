"""What a deployed run does not do as its simulation does, said by validate and the launch's
summary (:mod:`fedsim.runtime.deployed.differences`; a stranger's review)."""

from __future__ import annotations

from pathlib import Path

import pytest

from fedsim.cli import main
from fedsim.config import load_scenario
from fedsim.runtime.deployed.differences import measured_differences, scenario_differences

REPO = Path(__file__).resolve().parents[2]


def test_a_lossy_switching_scenario_names_each_difference() -> None:
    scenario = load_scenario(REPO / "scenarios" / "lossy-network.yaml",
                             ["clients.groups[wired].availability={crashes: {every: 30.0}}"]
                             ).scenario
    lines = scenario_differences(scenario)
    # The clients' links and crashes are emulated when deployed (fedsim.transports.emulated,
    # fedsim.runtime.deployed.client_lives): no line for either.
    assert len(lines) == 1
    assert lines[0].startswith("interrupt switch with public timing (groups wired, wireless)")
    measured = measured_differences(scenario, [3, 0, 4], 40, [2, 5, 0])
    assert measured[0] == lines[0] + ("; this run: 7 of those groups' 40 released rounds were "
                                      "moved to a later slot by a model's arrival, and 7 models "
                                      "arriving mid-round came after the round's last part "
                                      "began (the next round's)")


def test_the_aggregation_nodes_links_are_named_as_not_emulated() -> None:
    scenario = load_scenario(REPO / "scenarios" / "lossy-network.yaml",
                             ["aggregators={count: 2, latency: 0.05, drop: 0.1}"]).scenario
    lines = scenario_differences(scenario)
    assert lines[0] == ("not emulated: the aggregation nodes' links (aggregators.latency, "
                        "aggregators.drop); the broker is the network between the nodes and the "
                        "server (the clients' links are emulated)")
    quiet = load_scenario(REPO / "scenarios" / "lossy-network.yaml",
                          ["aggregators={count: 2}"]).scenario
    assert not any("aggregation nodes" in line for line in scenario_differences(quiet))


def test_a_perfect_network_snapshot_or_realised_scenario_has_none() -> None:
    base = REPO / "tests" / "deployment" / "four_clients.yaml"
    assert len(scenario_differences(load_scenario(base).scenario)) == 1  # switch, public
    for override in ("clients.groups[*].interrupt=snapshot", "privacy.timing=realised"):
        assert scenario_differences(load_scenario(base, [override]).scenario) == []


def test_validate_says_them_under_if_deployed(capsys: pytest.CaptureFixture[str]) -> None:
    lossy = str(REPO / "scenarios" / "lossy-network.yaml")
    assert main(["validate", lossy, "--schema-only"]) == 0
    out = capsys.readouterr().out  # (a stranger: the notes buried the warnings)
    assert "if deployed (fedsim launch, fedsim deploy): 3 notes on its pacing" in out
    assert "`fedsim validate --deployed` lists them" in out and "interrupt switch" not in out
    assert main(["validate", lossy, "--schema-only", "--deployed"]) == 0
    out = capsys.readouterr().out
    deployed = out.split("if deployed (fedsim launch, fedsim deploy):\n", 1)[1]
    assert "not emulated: the simulated network" not in deployed  # emulated at each client
    assert "    interrupt switch with public timing" in deployed
