"""The duration stop is exact: the run ends with the first window whose end is at or after
``stop.virtual_seconds``, and the stop reason says where that end was."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pytest

from fedsim.config import LoadedScenario, parse_scenario
from fedsim.config.schema import Stop
from fedsim.runtime.actors.server import WindowReport, duration_stop
from fedsim.runtime.actors.stops import ClientStopKind, RunStop, RunStopKind, client_stop_phrase
from fedsim.runtime.simulated.simulation import run_scenario


def tiny(window: float, seconds: float) -> dict[str, Any]:
    return {
        "name": "tiny-stop",
        "seed": 1,
        "stop": {"virtual_seconds": seconds},
        "dataset": {"name": "synthetic", "num_samples": 300, "num_test_samples": 60,
                    "num_features": 4, "num_classes": 2},
        "model": {"name": "logreg"},
        "clients": {"groups": [
            {"name": "p", "count": 2, "data_share": 1.0, "batch_size": 10, "clip": 1.0,
             "noise": 1.0, "speed": 0.01},
        ]},
        "server": {"window": window},
    }


@pytest.mark.parametrize(("window", "seconds"), [(0.1, 30.0), (0.3, 30.0), (0.7, 30.0),
                                                  (1.1, 30.0), (1.0, 30.0), (0.25, 7.3)])
def test_run_ends_with_the_first_window_end_at_or_after_the_limit(
        window: float, seconds: float, tmp_path: Path) -> None:
    result = run_scenario(LoadedScenario(parse_scenario(tiny(window, seconds)), None),
                          tmp_path / "run", message_only=True)
    # The first k with k * window >= seconds, computed in exact decimal arithmetic.
    from fractions import Fraction

    expected_windows = math.ceil(Fraction(str(seconds)) / Fraction(str(window)))
    summary = result.summary
    assert summary["windows"] == expected_windows
    end = float(expected_windows * Fraction(str(window)))
    assert summary["virtual_time"] == pytest.approx(end, rel=1e-12)
    assert summary["stop_kind"] == RunStopKind.DURATION
    if end == seconds:
        assert summary["stop_reason"] == f"it reached its limit of {seconds:g} virtual seconds"
    else:
        assert summary["stop_reason"] == (
            f"window {expected_windows} ended at {end:.2f} virtual seconds, the first window end "
            f"at or after its limit of {seconds:g} s")
    assert f"because {summary['stop_reason']}" in summary["explanation"]


def test_duration_stop_tolerates_float_rounding_only() -> None:
    assert duration_stop(30.0, 300, 29.99999999999996) == "it reached its limit of 30 virtual seconds"
    assert duration_stop(30.0, 299, 29.9) == ""
    assert duration_stop(30.0, 300, 29.9999) == ""  # a real shortfall is not rounding
    stop = Stop(virtual_seconds=30.0)
    # The scheduled end decides, not the (later, wall-clock) time the window was closed at.
    late = WindowReport(window=30, time=30.2, version=30, end=30.0)  # late by < 1%: jitter
    assert late.stop_reason(stop, active_clients=1, seconds="scenario") == RunStop(
        RunStopKind.DURATION, "it reached its limit of 30 scenario seconds")
    # A server far behind its windows (a stranger's: window 80 due at 20.05 s, closed at
    # 27.28) says so: the run's stop time is the close, not the end the reason names.
    behind = WindowReport(window=30, time=37.5, version=30, end=30.0)
    assert behind.stop_reason(stop, active_clients=1, seconds="scenario") == RunStop(
        RunStopKind.DURATION, "it reached its limit of 30 scenario seconds (closed at 37.50 "
        "scenario seconds: the server ran behind its windows)")
    past = WindowReport(window=31, time=40.0, version=31, end=31.0)
    assert past.stop_reason(stop, active_clients=1, seconds="scenario") == RunStop(
        RunStopKind.DURATION, "window 31 ended at 31.00 scenario seconds (closed at 40.00 scenario "
        "seconds: the server ran behind its windows), the first window end at or after its "
        "limit of 30 s")
    early = WindowReport(window=29, time=30.2, version=29, end=29.0)
    assert early.stop_reason(stop, active_clients=1) is None


@pytest.mark.parametrize("server_reason", [
    "it reached 1200 windows",
    "no client can train any more and every update has arrived",
    "every client finished its rounds or spent its budget",  # words a parser would misread
])
def test_a_client_stopped_by_the_servers_end_is_typed_so_whatever_the_text(
        server_reason: str) -> None:
    """A client stopped by the server's end of the run is not said to have finished its
    rounds or spent its budget (a deployed run's clients: issue 27, finding 12): the kind is
    set where the stop happens, not parsed from the text (issue 28, item 5)."""
    from types import SimpleNamespace

    from fedsim.protocol.messages import RunFinished
    from fedsim.runtime.actors.client import ClientActor

    actor = SimpleNamespace(finished=RunFinished(version=856, reason=server_reason),
                            max_rounds=12, next_round=12)
    actor._finished_reason = lambda: ClientActor._finished_reason(actor)  # type: ignore[arg-type]
    kind, text = ClientActor._end_before_round(actor)  # type: ignore[arg-type,misc]
    assert kind is ClientStopKind.SERVER_FINISHED
    assert server_reason in text
    assert client_stop_phrase(kind) == "the server finished the run"
    done = SimpleNamespace(finished=None, max_rounds=12, next_round=12)
    assert ClientActor._end_before_round(done) == (  # type: ignore[arg-type]
        ClientStopKind.DONE, "finished its 12 rounds")


def test_budget_and_round_stops_carry_their_kind_into_the_outputs(tmp_path: Path) -> None:
    """One group stops on its budget, one on its rounds: summary.json's stopped entries and
    clients.csv's stop_kind say which, next to the text; the run's stop is typed too."""
    import csv

    data = tiny(0.5, 200.0)
    data["stop"] = {"all_budgets_spent": True, "virtual_seconds": 200.0}
    data["clients"]["groups"] = [
        {"name": "b", "count": 1, "data_share": 0.5, "batch_size": 10, "clip": 1.0,
         "noise": 2.0, "speed": 0.01, "budget": {"epsilon": 1.0, "delta": 1e-5}},
        {"name": "r", "count": 1, "data_share": 0.5, "batch_size": 10, "clip": 1.0,
         "noise": 1.0, "speed": 0.01, "rounds": 3},
    ]
    result = run_scenario(LoadedScenario(parse_scenario(data), None), tmp_path / "run",
                          message_only=True)
    summary = result.summary
    kinds = {e["client_id"]: (e["kind"], e["reason"]) for e in summary["stopped"]}
    (budget_id,) = [c for c in kinds if c.startswith("b")]
    (rounds_id,) = [c for c in kinds if c.startswith("r")]
    assert kinds[budget_id][0] == ClientStopKind.BUDGET
    assert "budget" in kinds[budget_id][1]
    assert kinds[rounds_id] == (ClientStopKind.DONE, "finished its 3 rounds")
    assert summary["stop_kind"] == RunStopKind.BUDGETS_SPENT
    assert summary["stop_reason"] == "no client can train any more and every update has arrived"
    written = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert written["stop_kind"] == "budgets_spent"
    assert {e["kind"] for e in written["stopped"]} == {"budget", "done"}
    with open(tmp_path / "run" / "clients.csv", encoding="utf-8") as handle:
        rows = {r["client_id"]: r for r in csv.DictReader(handle)}
    assert rows[budget_id]["stop_kind"] == "budget" and rows[rounds_id]["stop_kind"] == "done"
    # Round indices count from 0: "round 272 would exceed its privacy budget" beside
    # rounds=272 read as off by one (a new user); the text says which round it is.
    rounds = int(rows[budget_id]["rounds"])
    assert rounds > 0
    assert rows[budget_id]["stop_reason"] == kinds[budget_id][1] == (
        f"its next round (round {rounds}, counted from 0) would exceed its privacy budget")
    assert "exceeded their privacy budget" in summary["explanation"]
    assert "finished their configured rounds" in summary["explanation"]


@pytest.mark.parametrize("time_kind", ["virtual", "scenario"])
def test_a_deployed_runs_text_says_whose_clock_a_clients_stop_is_on(
        tmp_path: Path, time_kind: str) -> None:
    """A stranger's launch: "10 client(s) stopped between 273.774 s and 825.648 s" after "The
    run stopped at scenario time 821.919 s". A deployed client's clock starts with its process,
    before the server's first window, and a resumed one where its ledger ends: its stop is now
    said on the server's clock, as it measured it, and a stop as the run ends is at the end
    (the text says so; a simulated run's does not). One rule for both runtimes: every stop
    time within the run's span."""
    from fedsim.runtime.run_record import RunRecord
    from fedsim.runtime.run_summary import DEPLOYED_CLOCKS, _explain

    record = RunRecord(
        scenario=parse_scenario(tiny(0.5, 10.0)), out_dir=tmp_path, metrics=[{"time": 821.9}],
        clients=[], stopped=[{"client_id": "phone-000", "time": 825.6, "reason": "budget",
                              "kind": ClientStopKind.BUDGET}],
        stop_reason=None, final_version=1, network={}, wall_seconds=1.0, cpu_seconds=1.0,
        time_kind=time_kind)
    text = _explain(record, [], [])
    assert record.stopped[0]["time"] == 821.9
    assert "at 821.90 s" in text
    assert (DEPLOYED_CLOCKS in text) == (time_kind == "scenario")


def test_a_budget_at_another_delta_is_said_wherever_eps_meets_it(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A stranger's group budget at delta 1e-3 in a run at privacy.delta 1e-5: clients.csv read
    eps 1.39 against budget 1.0 with budget left, the plot drew the group's curve far over its
    budget line, and no output said why. Each budget's delta is now in clients.csv (and the
    API's rows), the run's text, the plot's budget line and validate's warnings."""
    import csv

    from fedsim.cli import main
    from fedsim.reporting.plots import _budgets
    from fedsim.reporting.rundir import RunDirectory

    data = tiny(0.5, 20.0)
    data["clients"]["groups"][0]["budget"] = {"epsilon": 1.0, "delta": 1e-3}
    result = run_scenario(LoadedScenario(parse_scenario(data), None), tmp_path / "run",
                          message_only=True)
    with open(tmp_path / "run" / "clients.csv", encoding="utf-8") as handle:
        rows = list(csv.DictReader(handle))
    assert {row["budget_delta"] for row in rows} == {"0.001"}
    assert "The budgets of p (delta 0.001) hold at their own delta, not the run's 1e-05" \
        in result.summary["explanation"]
    assert _budgets(RunDirectory.load(tmp_path / "run")) == {1.0: ["p at delta = 0.001"]}
    (tmp_path / "s.yaml").write_text(json.dumps(data), encoding="utf-8")
    assert main(["validate", str(tmp_path / "s.yaml"), "--schema-only"]) == 0
    assert "warning: the budgets of p (delta 0.001) hold at their own delta" in \
        capsys.readouterr().out
    # At the run's delta: no word anywhere.
    data["clients"]["groups"][0]["budget"]["delta"] = 1e-5
    same = run_scenario(LoadedScenario(parse_scenario(data), None), tmp_path / "same",
                        message_only=True)
    assert "their own delta" not in same.summary["explanation"]
    assert _budgets(RunDirectory.load(tmp_path / "same")) == {1.0: ["p"]}


def test_a_run_ended_before_its_first_window_is_a_readable_run_directory(
        tmp_path: Path) -> None:
    """A sweep's worker interrupted before its run's first window left summary.json without
    metrics.jsonl: "not a run directory", and the sweep's table said it could not be read."""
    from fedsim.reporting.rundir import RunDirectory
    from fedsim.runtime.run_outputs import write_run_outputs
    from fedsim.runtime.run_record import RunRecord

    record = RunRecord(
        scenario=parse_scenario(tiny(0.5, 10.0)), out_dir=tmp_path, metrics=[], clients=[],
        stopped=[], stop_reason=None, final_version=0, network={}, wall_seconds=0.1,
        cpu_seconds=0.1, interrupted="SIGINT")
    write_run_outputs(record)
    run = RunDirectory.load(tmp_path)
    assert run.metrics == () and run.interrupted == "SIGINT" and run.virtual_time == 0.0


@pytest.mark.parametrize(("window", "said", "recorded"), [
    (107, "the last from window 107.", 107),
    (None, "the last from the start (no window had closed before it).", 0)])
def test_a_launch_resumed_before_its_first_window_says_it_went_on_from_the_start(
        tmp_path: Path, window: int | None, said: str, recorded: int) -> None:
    """A stranger's launch interrupted before its first window, then resumed: its summary said
    "It ran in 2 parts: ..., the last from window None" and ``last_from_window: null``."""
    from fedsim.runtime.run_outputs import write_run_outputs
    from fedsim.runtime.run_record import RunRecord

    record = RunRecord(
        scenario=parse_scenario(tiny(0.5, 10.0)), out_dir=tmp_path, metrics=[],
        clients=[], stopped=[], stop_reason=None, final_version=37, network={},
        wall_seconds=1.0, cpu_seconds=1.0, time_kind="scenario", parts=2,
        resumed_from_window=window)
    summary = write_run_outputs(record)
    assert f"It ran in 2 parts: interrupted and resumed (fedsim launch --resume), {said}" \
        in summary["explanation"]
    assert "None" not in summary["explanation"]
    assert summary["resumed"] == {"parts": 2, "last_from_window": recorded}
