"""`fedsim report` on a deployed server's output directory (server.json, no summary.json): the
server's view of its run, and its refusals of damaged files. The real directory of a launch
is checked in tests/deployment/test_deployed_run.py; here the server's files are written by
hand to damage them."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from fedsim.cli import main
from fedsim.errors import ConfigError
from fedsim.reporting.rundir import RunDirectory
from fedsim.reporting.server_view import REPORTED_EPSILON

SCENARIO = Path(__file__).parents[2] / "scenarios" / "quickstart.yaml"


def _server_dir(root: Path, statuses: object) -> Path:
    root.mkdir()
    shutil.copyfile(SCENARIO, root / "scenario.resolved.yaml")
    (root / "metrics.jsonl").write_text("".join(
        json.dumps({"window": w, "time": 0.5 * w, "accuracy": 0.5 + 0.1 * w, "received": 3,
                    "applied": 2, "stale": 1, "duplicate": 0, "rejected": 0,
                    "dropped_in_flight": 0}) + "\n" for w in (1, 2)))
    (root / "server.json").write_text(json.dumps({
        "windows": 2, "time": 1.0, "stop_kind": "windows", "stop_reason": "it reached 2 windows",
        "final_evaluation": {"version": 2, "accuracy": 0.7, "loss": 1.0},
        "statuses": statuses}))
    return root


def test_a_servers_directory_reads_as_its_view_and_survives_garbage_statuses(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    statuses = {
        "phone-000": "not a status",
        "phone-001": {"state": 5, "rounds": "many", "epsilon": "NaN", "sent_at": None},
        "phone-002": {"state": "budget_exhausted", "rounds": 40, "epsilon": 1.5,
                      "detail": "round 40 would exceed its privacy budget", "sent_at": 0.9},
        "laptop-000": {"state": "done", "rounds": -3, "epsilon": float("inf")},
        "someone-else": {"state": "done"},  # not a client of the scenario: not a row
    }
    root = _server_dir(tmp_path / "server", statuses)
    view = RunDirectory.load(root)
    assert view.server_view and view.time_name == "scenario time"
    rows = {row["client_id"]: row for row in view.clients}
    assert len(rows) == 10 and "someone-else" not in rows
    assert rows["phone-000"]["state"] == rows["phone-001"]["state"] == "unknown"
    assert rows["phone-001"]["rounds"] is None and rows["phone-001"][REPORTED_EPSILON] is None
    assert rows["phone-002"]["stop_kind"] == "budget" and rows["phone-002"][REPORTED_EPSILON] == 1.5
    # "done" with no rounds known: the server ended it, as far as the server can tell
    assert rows["laptop-000"]["stop_kind"] == "server_finished"
    assert rows["laptop-000"]["rounds"] is None and rows["laptop-000"][REPORTED_EPSILON] is None
    assert view.summary["updates"] == {"received": 6, "applied": 4, "stale": 2, "duplicate": 0,
                                       "rejected": 0, "dropped_in_flight": 0}
    assert view.summary["windows"] == 2 and view.summary["final_accuracy"] == 0.7
    assert main(["report", str(root)]) == 0
    out = capsys.readouterr().out
    assert "2 windows, 1.0 s scenario time" in out and "final 0.7000" in out
    assert "deployed server's output directory" in out and "cannot verify" in out
    assert "clients.csv" not in out  # there is none; the explanation says where ledgers are


@pytest.mark.parametrize(("damage", "message"), [
    ("server.json not JSON", "server.json: not JSON"),
    ("server.json a list", "server.json: must hold a JSON object"),
    ("no scenario", "without its scenario.resolved.yaml"),
    ("a broken scenario", "scenario.resolved.yaml"),
    ("no metrics", "missing metrics.jsonl"),
])
def test_a_damaged_servers_directory_is_refused_with_the_file_named(
        tmp_path: Path, damage: str, message: str, capsys: pytest.CaptureFixture[str]) -> None:
    root = _server_dir(tmp_path / "server", {})
    if damage == "server.json not JSON":
        (root / "server.json").write_text('{"windows": 2,')
    elif damage == "server.json a list":
        (root / "server.json").write_text("[]")
    elif damage == "no scenario":
        (root / "scenario.resolved.yaml").unlink()
    elif damage == "a broken scenario":
        (root / "scenario.resolved.yaml").write_text("clients: [1, 2\n")
    else:
        (root / "metrics.jsonl").unlink()
    with pytest.raises(ConfigError, match=message):
        RunDirectory.load(root)
    assert main(["report", str(root)]) == 2
    assert message.split(":")[0] in capsys.readouterr().err
