"""A launched run over a real mosquitto emulates the scenario's lossy client links
(:mod:`fedsim.transports.emulated`): updates and models are dropped, duplicated,
delayed and held back as in a simulation; a dropped update is never resent, nothing is applied
twice, every ledger stays whole, and the counts reach the clients' reports and the summary."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch

from fedsim.cli import main
from fedsim.transports.broker import MOSQUITTO_MISSING, find_mosquitto
from tests.deployment.test_deployed_run import (
    SCENARIO,
    TIME_SCALE,
    _check_applied_against_ledgers,
)

pytestmark = [
    pytest.mark.mqtt,
    pytest.mark.slow,
    pytest.mark.skipif(find_mosquitto() is None, reason=MOSQUITTO_MISSING),
]
torch.set_num_threads(1)

LOSSY = [
    "network.uplink={latency: {kind: uniform, low: 0.02, high: 0.2}, drop: 0.3, "
    "duplicate: 0.3, reorder: 0.3}",
    "network.downlink={latency: {kind: uniform, low: 0.01, high: 0.1}, drop: 0.25}",
    "stop.windows=60",  # some 150 updates and 240 models: the fractions below are 4 sd wide
]


def _launch(out: Path, *overrides: str) -> dict[str, Any]:
    """four_clients.yaml launched into ``out`` with ``overrides`` (each a --set): its
    summary.json (the launch must succeed)."""
    sets = [part for override in overrides for part in ("--set", override)]
    assert main(["launch", str(SCENARIO), "--out", str(out), "--time-scale", TIME_SCALE,
                 "--max-backoff", "1", "--no-plots", "--timeout", "100", *sets]) == 0
    summary: dict[str, Any] = json.loads((out / "summary.json").read_text())
    return summary


def test_a_launch_emulates_the_scenarios_lossy_links(tmp_path: Path) -> None:
    out = tmp_path / "launch"
    summary = _launch(out, *LOSSY)
    assert summary["windows"] == 60
    # The network is no longer a difference from the simulation.
    assert not any("network" in line for line in summary["deployed_differences"])
    reports = [json.loads(path.read_text()) for path in sorted(
        (out / "state").glob("*/client-*.json"))]
    assert len(reports) == 4
    totals: dict[str, dict[str, int]] = {"uplink": {}, "downlink": {}}
    for report in reports:
        assert report["refused"] is None
        links = report["emulated_network"]
        for direction, counts in links.items():
            for key, value in counts.items():
                totals[direction][key] = totals[direction].get(key, 0) + value
        # Every released update is given to the uplink (statuses go around it).
        up = links["uplink"]
        assert up["sent"] == len(report["released"]) > 5
    assert summary["network"]["emulated_links"] == totals
    assert (f"The clients' scenario links were emulated: {totals['uplink']['dropped']} of "
            f"{totals['uplink']['sent']} updates and {totals['downlink']['dropped']} of "
            f"{totals['downlink']['sent']} global models were dropped") in summary["explanation"]
    up, down = totals["uplink"], totals["downlink"]
    # About the links' probabilities (generous bounds: a few hundred messages).
    assert 0.15 < up["dropped"] / up["sent"] < 0.45
    assert 0.12 < up["duplicated"] / (up["sent"] - up["dropped"]) < 0.5
    assert up["reordered"] > 0
    assert 0.1 < down["dropped"] / down["sent"] < 0.4
    # Fewer updates reached the server than the clients released, none applied twice, and
    # every applied update is in its client's ledger.
    released = sum(len(report["released"]) for report in reports)
    applied = _check_applied_against_ledgers(out)
    assert 0 < len(applied) < released
    assert summary["updates"]["received"] < released + up["duplicated"]
    assert summary["updates"]["duplicate"] > 0  # the emulated duplicates, refused as such
    print(f"released {released}, applied {len(applied)}, links {totals}, "
          f"accuracy {summary['final_accuracy']:.3f}")


def test_a_launch_emulates_crashes_rejoins_and_a_crash_for_good(tmp_path: Path) -> None:
    """Crashes every 4-8 scenario seconds with 1 s down: every client crashes and rejoins,
    its rounds continue, nothing is applied twice, every applied update is in its ledger.
    Then crashes for good after 6 s in a run that stops once no client can train (the
    scenario's windows stop set far away): the server learns of each crash from the client's
    status and ends the run, as a simulation does, instead of waiting for its stop time."""
    out = tmp_path / "launch"
    summary = _launch(out, "clients.groups[c].availability={crashes: {every: {kind: uniform, "
                      "low: 4.0, high: 8.0}, rejoin_after: 1.0}}")
    assert summary["windows"] == 24
    assert not any("crash" in line for line in summary["deployed_differences"])
    reports = [json.loads(path.read_text()) for path in sorted(
        (out / "state").glob("*/client-*.json"))]
    crashes = sum(report["crashes"] for report in reports)
    assert summary["crashes"] == {"crashes": crashes, "clients": 4, "for_good": 0}
    assert f"4 client(s) crashed {crashes} time(s) as availability.crashes has them (0 for " \
        "good)." in summary["explanation"]
    for report in reports:
        assert report["crashes"] >= 2, report["client_id"]
        rounds = [r["round"] for r in report["released"]]
        assert rounds == sorted(set(rounds)) and rounds
        assert set(rounds) <= set(report["ledger_rounds"])
    _check_applied_against_ledgers(out)

    for_good = tmp_path / "for-good"
    summary = _launch(for_good, "stop={windows: 400, all_budgets_spent: true}",
                      "clients.groups[c].availability={crashes: {every: 6.0}}")
    assert summary["stop_kind"] == "budgets_spent", summary["stop_reason"]
    assert summary["windows"] < 20  # not the 400 windows of the stop condition
    assert [s["kind"] for s in summary["stopped"]] == ["crashed"] * 4
    assert summary["crashes"] == {"crashes": 4, "clients": 4, "for_good": 4}
    for report in (json.loads(p.read_text()) for p in (for_good / "state").glob("*/client-*.json")):
        assert (report["state"], report["stop_kind"], report["crashes"]) == (
            "crashed", "crashed", 1)
        assert report["stopped_at"] >= 6.0  # (the client's clock: it started before the
        # server's, and the up-time counts from the first model)
    # The crashes came 6 s into the run on the server's clock (a simulation's time): the
    # server heard of them then and ended the run.
    assert 6.0 <= summary["virtual_time"] <= 9.0, summary["virtual_time"]


def test_a_run_that_ends_on_spent_budgets_waits_for_the_updates_on_the_links(
        tmp_path: Path) -> None:
    """Every client spends its budget in a few rounds over an uplink of 1-3 s latency and no
    loss: the run ends once no client can train *and* their updates have arrived (an
    attacker's review: the server, told by the statuses that every client stopped, ended the
    run with all 12 updates still on the links), and each client's last updates are
    acknowledged (closing the endpoint with the links had left them unacknowledged)."""
    out = tmp_path / "launch"
    summary = _launch(out, "stop={windows: 200, all_budgets_spent: true}",
                      "clients.groups[c].budget={epsilon: 1.6, delta: 1.0e-5}",
                      "clients.groups[c].staleness={max_versions_behind: 50}",
                      "network.uplink={latency: {kind: uniform, low: 1.0, high: 3.0}}")
    assert summary["stop_kind"] == "budgets_spent", summary["stop_reason"]
    reports = [json.loads(p.read_text()) for p in (out / "state").glob("*/client-*.json")]
    released = sum(len(report["released"]) for report in reports)
    assert released >= 8
    assert summary["updates"]["applied"] + summary["updates"]["stale"] == released
    assert all(report["unacknowledged"] == [] for report in reports), [
        report["unacknowledged"] for report in reports]
    assert all(report["state"] == "budget_exhausted" for report in reports)
