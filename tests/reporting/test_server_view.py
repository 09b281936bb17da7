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
                      "detail": "its next round (round 40, counted from 0) would exceed its "
                                "privacy budget", "sent_at": 0.9},
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
    assert "2 windows, 1.00 s scenario time" in out and "final 0.7000" in out
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


@pytest.mark.parametrize("server", [
    {"time": 10**400, "final_evaluation": {"accuracy": 10**400}, "windows": True,
     "statuses": {"phone-000": {"state": "done", "epsilon": 10**400, "sent_at": 10**400,
                                "rounds": True}}},
    {"stop_kind": [], "stop_reason": "x", "statuses": []},
    {"stop_kind": "windows", "stop_reason": {"nested": 1}, "windows": -3},
])
def test_hostile_values_in_a_servers_file_read_as_unknown(
        tmp_path: Path, server: dict, capsys: pytest.CaptureFixture[str]) -> None:
    """An attacker's review: a 401-digit number, a list for a kind, a bool for a count made
    fedsim report crash with a traceback (OverflowError, TypeError)."""
    root = _server_dir(tmp_path / "server", {})
    (root / "server.json").write_text(json.dumps(server))
    view = RunDirectory.load(root)
    assert view.summary["virtual_time"] == 1.0 and view.summary["windows"] == 2  # its metrics
    assert main(["report", str(root)]) == 0
    assert "True windows" not in capsys.readouterr().out


@pytest.mark.parametrize("text", ['{"windows": ' + "9" * 5000 + "}",
                                  '{"x": ' + "[" * 5000 + "]" * 5000 + "}"])
def test_a_server_file_that_json_cannot_hold_is_refused(
        tmp_path: Path, text: str, capsys: pytest.CaptureFixture[str]) -> None:
    root = _server_dir(tmp_path / "server", {})
    (root / "server.json").write_text(text)
    assert main(["report", str(root)]) == 2
    err = capsys.readouterr().err
    assert ("server.json: not JSON (a number of more digits than can be read" in err
            or "server.json: not JSON (nested too deeply to read" in err), err


def test_a_signalled_server_is_an_interrupted_run_whose_clients_may_resume(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The review: a server stopped by a signal (it announces no end) was said to have ended
    the run and stopped its clients, in a sentence that read 'because stopped by'."""
    root = _server_dir(tmp_path / "server", {"phone-000": {"state": "training"}})
    server = json.loads((root / "server.json").read_text())
    server.update(stop_kind="signal", stop_reason="stopped by a signal after 2 windows")
    del server["windows"]
    (root / "server.json").write_text(json.dumps(server))
    view = RunDirectory.load(root)
    assert view.interrupted and view.summary["windows"] == 2
    explanation = view.summary["explanation"]
    assert "The server stopped: stopped by a signal after 2 windows." in explanation
    assert "does not end the run" in explanation and "its end stops them" not in explanation
    assert main(["compare", str(root), "--no-plots"]) == 0
    assert "interrupted" in capsys.readouterr().out


def test_a_status_that_disagrees_with_its_ledger_is_warned_and_best_is_never_below_final(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The module promised a warning where a client's status and its ledger, copied in,
    disagree, and printed none (a status under-reporting its eps 2.447 as 0.01); the view's
    best accuracy left out the final evaluation (final 0.70, best 0.60)."""
    from fedsim.privacy.events import GaussianStep
    from fedsim.privacy.ledger import PrivacyLedger

    root = _server_dir(tmp_path / "server", {
        "phone-000": {"state": "budget_exhausted", "rounds": 30, "epsilon": 0.01},
        "phone-001": {"state": "training", "rounds": 3, "epsilon": 0.0},  # older: no warning
    })
    (root / "ledgers").mkdir()
    for client_id in ("phone-000", "phone-001"):
        with PrivacyLedger.open(root / "ledgers" / f"{client_id}.jsonl", client_id=client_id,
                                sampling="poisson", budget=None) as ledger:
            for r in range(30):
                ledger.spend(GaussianStep("poisson", 0.1, 1.0), time=float(r), round=r)
    view = RunDirectory.load(root)
    assert view.summary["best_accuracy"] == 0.7 == view.summary["final_accuracy"]
    assert main(["report", str(root)]) == 0
    out = capsys.readouterr().out
    warned = [line for line in out.splitlines() if line.startswith("warning: client")]
    assert len(warned) == 1 and "phone-000" in warned[0] and "reported eps 0.01" in warned[0]
    # Only the stopped client's status is quoted (a running one's is older than the end).
    assert "The 1 stopped clients' last statuses reported eps" in out
    # compare puts no eps of 2 clients beside whole runs' (a stranger's table did).
    assert main(["compare", str(root), "--no-plots", "--json"]) == 0
    [row] = json.loads(capsys.readouterr().out)["runs"]
    assert row["eps_median"] is None and any("2 of its 10 clients" in w for w in row["warnings"])


def test_the_views_self_reported_eps_are_never_pooled_across_neighbouring_relations(
        tmp_path: Path) -> None:
    """A stranger's server view gave one min / median / max of the stopped clients' reported
    eps, add/remove (Poisson) and replace-one (fixed-size) pooled, where a run's summary
    keeps the two apart: guarantees about different neighbours."""
    done = {"state": "done", "rounds": 5}
    root = _server_dir(tmp_path / "server", {
        "phone-000": {**done, "epsilon": 0.25}, "laptop-000": {**done, "epsilon": 0.5},
        "server-000": {**done, "epsilon": 0.75}})  # quickstart: phone, laptop poisson
    explanation = RunDirectory.load(root).summary["explanation"]
    assert ("The 3 stopped clients' last statuses reported eps (delta = 1e-05) by neighbouring "
            "relation, guarantees about different neighbours that are not to be compared: "
            "add/remove clients min 0.2500 / median 0.3750 / max 0.5000; replace-one clients "
            "min 0.7500 / median 0.7500 / max 0.7500: self-reports the server cannot verify.") \
        in explanation, explanation


def test_report_replaces_a_planted_plot_link_and_refuses_a_fifo_ledger(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The review: plots/accuracy.png linked to another file had that file overwritten; a FIFO
    named as a ledger hung the report for ever; a stop reason's terminal escape reached the
    terminal."""
    import os

    root = _server_dir(tmp_path / "server", {})
    server = json.loads((root / "server.json").read_text())
    server["stop_reason"] = "it reached 2 windows\x1b]0;PWNED\x07"
    (root / "server.json").write_text(json.dumps(server))
    victim = tmp_path / "victim.txt"
    victim.write_text("mine")
    (root / "plots").mkdir()
    (root / "plots" / "accuracy.png").symlink_to(victim)
    assert main(["report", str(root)]) == 0
    assert victim.read_text() == "mine"
    assert not (root / "plots" / "accuracy.png").is_symlink()
    assert "\x1b" not in capsys.readouterr().out
    (root / "ledgers").mkdir()
    os.mkfifo(root / "ledgers" / "phone-000.jsonl")
    assert main(["report", str(root)]) == 2
    assert "not a regular file" in capsys.readouterr().err


def test_a_run_directorys_summary_cannot_claim_to_be_a_servers_view(tmp_path: Path) -> None:
    """The view is what the files present make it, not a summary key: a handed-over
    summary.json saying "view": "server" silenced the warning that clients.csv's clients have
    no ledger (a review)."""
    from fedsim.reporting.ledgers import ledger_gaps

    root = tmp_path / "run"
    root.mkdir()
    (root / "metrics.jsonl").write_text(json.dumps({"window": 1, "time": 1.0}) + "\n")
    (root / "summary.json").write_text(json.dumps({"privacy": {"delta": 1e-5},
                                                   "view": "server"}))
    (root / "clients.csv").write_text("client_id,epsilon\nphone-000,1.5\n")
    run = RunDirectory.load(root)
    assert not run.server_view
    [warning] = ledger_gaps(run)
    assert "1 client(s) of clients.csv have no ledger" in warning
