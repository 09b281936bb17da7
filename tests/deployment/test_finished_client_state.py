"""A client restarted on the state of a client whose run ended (a stranger's review): it waited
for a welcome no server would send until it was killed (60 s, even while a re-run server
announced the end under a new run incarnation). Its exit report now records the server's end
of the run (``run_finished``), and a client started on it refuses at once, in one line and
exit status 2, as ``fedsim server`` refuses a finished run's ``--state``
(tests/deployment/test_finished_state.py), before it opens its ledger or connects: it never
spends privacy after its run ended. A client that stopped before the end (its budget spent)
never saw it: the run incarnations it followed are kept (its report's, and ``followed.json``,
written as the live server confirms each, so a client SIGKILLed before it ever wrote a report
has them too), and the broker's retained end of one of them ends it at once, the same way. A
client resuming a run still going on is unchanged, and so is a client of a new run of the same
name, which the earlier run's retained end reaches before its server's welcome."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from fedsim.config import load_scenario
from fedsim.config.limits import MAX_RUN_FILE_BYTES
from fedsim.errors import ConfigError
from fedsim.privacy.ledger import PrivacyLedger
from fedsim.privacy.ledger_mark import mark_path
from fedsim.protocol import codec
from fedsim.protocol.messages import GlobalModel, RunFinished
from fedsim.runtime.deployed.client_lives import DOWN_AT_THE_END
from fedsim.runtime.deployed.client_process import run_client
from fedsim.runtime.deployed.launcher import Launcher
from fedsim.runtime.deployed.options import LAUNCH_WAIT_FOR_CLIENTS, DeploymentOptions
from fedsim.runtime.deployed.state_owner import (
    FOLLOWED_FILE,
    MAX_FOLLOWED,
    MAX_FOLLOWED_BYTES,
    RUN_FINISHED,
    client_state_file,
    ended_run,
    followed_runs,
    refuse_ended_run,
    remember_followed,
)
from fedsim.runtime.run_outputs import ledger_file
from fedsim.transports.broker import MOSQUITTO_MISSING, LocalMosquitto, find_mosquitto
from fedsim.transports.mqtt import FollowedRuns, MqttClientEndpoint, parse_broker_url
from tests.deployment.test_deployed_run import _ledger_rounds, _wait_for_window
from tests.deployment.test_state_owner import _used_by

SCENARIO = Path(__file__).with_name("four_clients.yaml")
ENDED = {"client_id": "c-000", "state": "done", "stop_kind": "server_finished",
         "stop_reason": "the server finished the run at version 4 (it closed 3 windows)",
         RUN_FINISHED: {"version": 4, "reason": "it closed 3 windows"}}


@pytest.mark.parametrize(("report", "said"), [
    (ENDED, "at version 4 (it closed 3 windows)"),
    # Down (due to rejoin) when the run ended: no server_finished stop, but it saw the end.
    ({"state": "crashed", "stop_kind": None, "stop_reason": DOWN_AT_THE_END,
      RUN_FINISHED: {"version": 9, "reason": ""}}, "at version 9 (no reason given)"),
    # An earlier fedsim's report: its server_finished stop says it.
    ({k: v for k, v in ENDED.items() if k != RUN_FINISHED},
     "(the server finished the run at version 4 (it closed 3 windows))"),
    # Damage does not pass for a run still going on.
    ({**ENDED, RUN_FINISHED: 4}, f"(its {RUN_FINISHED} reads '4')"),
])
def test_a_report_that_saw_the_end_says_the_run_ended(report: dict[str, Any], said: str) -> None:
    assert ended_run(report) == said


@pytest.mark.parametrize("report", [
    {},  # a first start, or a process killed before its report
    {"state": "training", "stop_kind": None, "signalled": True, RUN_FINISHED: None},  # SIGTERM
    {"state": "crashed", "stop_kind": None, "stop_reason": ""},  # killed, restarted by a launch
    {"state": "budget_exhausted", "stop_kind": "budget", "stop_reason": "its next round ..."},
    {"state": "done", "stop_kind": "done", "stop_reason": "finished its 5 rounds"},
    {"state": "crashed", "stop_kind": "crashed", "stop_reason": "crashed for good"},
])
def test_a_report_of_a_run_still_going_on_resumes(report: dict[str, Any]) -> None:
    assert ended_run(report) is None


def test_the_refusal_is_one_line_and_writes_nothing(tmp_path: Path) -> None:
    state = tmp_path / "c"
    _used_by(state, "c-000")
    client_state_file(state, "c-000").write_text(json.dumps(ENDED))
    before = {p: p.read_bytes() for p in state.rglob("*") if p.is_file()}
    with pytest.raises(ConfigError) as refused:
        refuse_ended_run(state, "c-000")
    text = str(refused.value)
    assert "\n" not in text and refused.value.exit_code == 2
    assert text == (f"{state}: the run of client 'c-000' ended at version 4 (it closed 3 "
                    "windows), as client-c-000.json records; nothing to resume: start a new "
                    "run on a fresh --state directory")
    assert {p: p.read_bytes() for p in state.rglob("*") if p.is_file()} == before
    refuse_ended_run(tmp_path / "fresh", "c-000")  # nothing there: a first start
    assert not (tmp_path / "fresh").exists()


@pytest.mark.parametrize("damage", ["truncated", "not-utf8", "array", "fifo", "directory",
                                    "huge"])
def test_a_damaged_report_is_refused_not_taken_for_none(tmp_path: Path, damage: str) -> None:
    """A stranger's review: the report that says the run ended was read as ``{}`` when it
    could not be read, was cut short, was not an object or was larger than a run writes, so
    the client of a run that ended started again. Its damage is a one-line refusal naming the
    file and what to do (exit status 2), as a damaged ``owner.json`` is."""
    state = tmp_path / "c"
    _used_by(state, "c-000")
    report = client_state_file(state, "c-000")
    report.unlink()
    if damage == "fifo":
        os.mkfifo(report)
    elif damage == "directory":
        report.mkdir()
    elif damage == "huge":  # (sparse: past the 512 MiB a run file may hold, on no disk)
        with report.open("wb") as handle:
            handle.truncate(MAX_RUN_FILE_BYTES + 1)
    else:
        report.write_bytes({"truncated": json.dumps(ENDED).encode()[:-9],
                            "not-utf8": b'{"stop_reason": "\xff"}',
                            "array": json.dumps([ENDED]).encode()}[damage])
    with pytest.raises(ConfigError) as refused:
        refuse_ended_run(state, "c-000")
    text = str(refused.value)
    assert text.startswith(f"{report}: ") and "\n" not in text
    assert refused.value.exit_code == 2
    assert "exit report of client 'c-000'" in text and "restore it" in text


def test_the_client_refuses_before_it_opens_its_ledger_or_a_connection(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from fedsim.cli import main

    state = tmp_path / "c"
    _used_by(state, "c-000")
    client_state_file(state, "c-000").write_text(json.dumps(ENDED))
    before = {p: p.read_bytes() for p in state.rglob("*") if p.is_file()}
    broker = parse_broker_url("mqtt://127.0.0.1:9")  # never reached: refused before connecting
    with pytest.raises(ConfigError, match="ended at version 4"):
        asyncio.run(run_client(load_scenario(SCENARIO), "c-000", broker, state_dir=state))
    capsys.readouterr()
    assert main(["client", "--scenario", str(SCENARIO), "--client-id", "c-000", "--broker",
                 "mqtt://127.0.0.1:9", "--state", str(state), "-q"]) == 2
    err = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert len(err) == 1 and "start a new run on a fresh --state directory" in err[0], err
    assert {p: p.read_bytes() for p in state.rglob("*") if p.is_file()} == before


@pytest.mark.parametrize("followed", [True, False])
def test_the_retained_end_of_a_run_it_followed_ends_a_restarted_client(followed: bool) -> None:
    """Before any welcome: the retained end names the incarnation the client's report says it
    followed (or one its lineage continues): its run is over, nothing waits for a welcome. Any
    other end may be an earlier run's and waits for the live server, as before."""
    old, new = "0123456789abcdef", "fedcba9876543210"

    async def main() -> MqttClientEndpoint:
        endpoint = MqttClientEndpoint("mqtt://127.0.0.1:1", run="r", client_id="c1",
                                      followed=FollowedRuns(frozenset(
                                          {old if followed else "00ff00ff00ff00ff"})))
        endpoint._on_message(endpoint.topics.global_model, codec.encode(
            RunFinished(7, "windows", 30.0), incarnation=new, lineage=(old,)))
        return endpoint

    endpoint = asyncio.run(main())
    assert endpoint.incarnation.current is None and endpoint.stats.received == 0
    assert endpoint.ended_before == (RunFinished(7, "windows", 30.0) if followed else None)
    assert bool(endpoint.incarnation.held_back) is not followed


@pytest.mark.mqtt
@pytest.mark.slow
@pytest.mark.skipif(find_mosquitto() is None, reason=MOSQUITTO_MISSING)
@pytest.mark.parametrize("budget", [None, 0.3], ids=["saw-the-end", "spent-before-the-end"])
def test_a_client_restarted_after_its_run_ended_exits_2_at_once(
        tmp_path: Path, budget: float | None) -> None:
    """A short launch (its own mosquitto on a free port of 127.0.0.1, stopped by its PID at
    ``close``) runs to its end; one client restarted by the same command on its state, the
    broker still holding the run's retained end, exits 2 within seconds, its ledger as the
    run left it. With a budget of 0.3 every client stops on it before the end (the run ends
    on spent budgets): the retained end of the incarnation its report names stops it."""
    out, ids = tmp_path / "run", [f"c-{i:03d}" for i in range(4)]
    options = DeploymentOptions(time_scale=0.1, max_backoff=0.5,
                                wait_for_clients=LAUNCH_WAIT_FOR_CLIENTS)
    overrides = ["stop.windows=3"] if budget is None else [
        "stop.windows=200", f"clients.groups[0].budget.epsilon={budget}"]
    launcher = Launcher(SCENARIO, out, options=options, overrides=overrides)
    try:
        launcher.prepare()
        launcher.start_all()
        assert launcher.wait("server", 90.0) == 0, "the server did not finish within 90 s"
        assert all(launcher.wait(c, 30.0) == 0 for c in ids)  # each stopped by itself
        state = out / "state" / "c-001"
        ledger = ledger_file(state, "c-001")
        before = {p: p.read_bytes() for p in state.rglob("*") if p.is_file()}
        report = json.loads(client_state_file(state, "c-001").read_text())
        if budget is None:
            assert report["stop_kind"] == "server_finished" and report[RUN_FINISHED] is not None
        else:  # it never saw the end: its report cannot refuse the start
            assert report["stop_kind"] == "budget" and report[RUN_FINISHED] is None
            assert report["incarnations"], report
        assert mark_path(ledger).read_bytes()
        log = out / "logs" / "c-001.log"
        logged = log.read_bytes()
        started = time.monotonic()
        launcher.start("c-001")  # as the launch started it: same argv, broker, --state
        code = launcher.wait("c-001", 30.0)
        took = time.monotonic() - started
    finally:
        launcher.close()
    assert code == 2, f"exit status {code} after {took:.1f} s"
    assert took < 10.0, took
    after = {p: p.read_bytes() for p in state.rglob("*") if p.is_file()}
    said = log.read_bytes()[len(logged):].decode()
    assert "start a new run on a fresh --state directory" in said, said
    if budget is None:  # refused from its report: nothing written
        assert after == before
        assert f"the run of client 'c-001' ended at version {report[RUN_FINISHED]['version']}" \
            in said, said
        return
    # Ended by the broker: its report keeps its budget stop and now says the run ended (the
    # next start is refused from it); its ledger and mark are as the run left them.
    assert "as the broker's retained end of the run it followed says" in said, said
    assert {p for p in after if p.parent.name == "ledgers"} == \
        {p for p in before if p.parent.name == "ledgers"}
    assert all(after[p] == before[p] for p in before if p.parent.name == "ledgers")
    again = json.loads(client_state_file(state, "c-001").read_text())
    assert {k: again[k] for k in ("state", "stop_kind", "stop_reason", "stopped_at")} == \
        {k: report[k] for k in ("state", "stop_kind", "stop_reason", "stopped_at")}
    assert again[RUN_FINISHED] is not None and again["released"] == report["released"]
    with pytest.raises(ConfigError, match="as client-c-001.json records"):
        refuse_ended_run(state, "c-001")


def test_the_runs_a_client_followed_are_kept_as_they_are_confirmed(tmp_path: Path) -> None:
    """``followed.json`` is written as the live server confirms an incarnation (a process
    killed before its report wrote none there), read beside the report's list (an earlier
    fedsim's evidence), the newest ``MAX_FOLLOWED`` kept (its damage: the next test)."""
    state = tmp_path / "c"
    state.mkdir()
    assert followed_runs(state, {}) == []
    remember_followed(state, "aaaaaaaaaaaaaaaa")
    remember_followed(state, "aaaaaaaaaaaaaaaa")  # kept once
    remember_followed(state, "bbbbbbbbbbbbbbbb")
    assert json.loads((state / FOLLOWED_FILE).read_text()) == {
        "incarnations": ["aaaaaaaaaaaaaaaa", "bbbbbbbbbbbbbbbb"]}
    report = {"incarnations": ["cccccccccccccccc", "aaaaaaaaaaaaaaaa"]}
    assert followed_runs(state, report) == \
        ["cccccccccccccccc", "aaaaaaaaaaaaaaaa", "bbbbbbbbbbbbbbbb"]
    many = [f"{i:016x}" for i in range(MAX_FOLLOWED + 3)]
    for incarnation in many:
        remember_followed(state, incarnation)
    assert followed_runs(state, {}) == many[-MAX_FOLLOWED:]
    remember_followed(state, "")  # no server's incarnation: nothing kept
    assert followed_runs(state, {}) == many[-MAX_FOLLOWED:]


def _damage_followed(path: Path, damage: str) -> None:
    """``path`` (a client's ``followed.json``) made ``damage``."""
    ok = ["aaaaaaaaaaaaaaaa"]
    if damage == "fifo":
        os.mkfifo(path)
    elif damage == "directory":
        path.mkdir()
    elif damage == "link":  # (to a file as fedsim writes it: the link is the damage)
        path.with_name("elsewhere.json").write_text(json.dumps({"incarnations": ok}))
        path.symlink_to("elsewhere.json")
    elif damage == "huge":  # (sparse: 1 GiB that takes no disk; read to 512 MiB before)
        with path.open("wb") as handle:
            handle.truncate(2**30)
    elif damage == "padded":  # valid JSON, but larger than fedsim ever writes
        path.write_text(json.dumps({"incarnations": ok}) + " " * MAX_FOLLOWED_BYTES)
    else:
        path.write_bytes({
            "garbage": b"\x00\x01 not json",
            "not-utf8": b'{"incarnations": ["\xff"]}',
            "not-a-list": b'{"incarnations": 7}',
            "array": b'["aaaaaaaaaaaaaaaa"]',
            "thousands": json.dumps({"incarnations": [f"{i:016x}" for i in range(5000)]},
                                    separators=(",", ":")).encode()[:MAX_FOLLOWED_BYTES - 2]
            .rsplit(b",", 1)[0] + b"]}",  # (more than 16, within the size bound)
            "non-strings": json.dumps({"incarnations": [*ok, 7, None, {"a": 1}]}).encode(),
            "empty-string": json.dumps({"incarnations": [*ok, ""]}).encode(),
            "too-long": json.dumps({"incarnations": [*ok, "a" * 33]}).encode(),
            "extra-key": json.dumps({"incarnations": ok, "also": 1}).encode(),
        }[damage])


FOLLOWED_DAMAGE = ["fifo", "directory", "link", "huge", "padded", "garbage", "not-utf8",
                   "not-a-list", "array", "thousands", "non-strings", "empty-string",
                   "too-long", "extra-key"]


@pytest.mark.parametrize("damage", FOLLOWED_DAMAGE)
def test_a_damaged_followed_file_is_refused_and_kept(tmp_path: Path, damage: str) -> None:
    """An attacker's review: a ``followed.json`` that could not be read, was huge (read up to
    512 MiB), a link, not JSON or not what fedsim writes passed for none (the runs it kept
    forgotten: a client of a run that ended waited for a welcome again), and the next
    incarnation the client followed was written over it, losing them for good. It is refused
    at the start, as a damaged ``owner.json`` is, and a write never replaces it."""
    state = tmp_path / "c"
    state.mkdir()
    path = state / FOLLOWED_FILE
    _damage_followed(path, damage)
    before = os.lstat(path)
    with pytest.raises(ConfigError) as refused:
        followed_runs(state, {"incarnations": ["cccccccccccccccc"]})
    text = str(refused.value)
    assert text.startswith(f"{path} is damaged (") and "\n" not in text
    assert refused.value.exit_code == 2 and "restore it" in text
    with pytest.raises(ConfigError):
        remember_followed(state, "dddddddddddddddd")
    after = os.lstat(path)
    assert (after.st_ino, after.st_size, after.st_mode) == \
        (before.st_ino, before.st_size, before.st_mode)


@pytest.mark.parametrize("damage", ["report", "followed"])
def test_a_client_with_damaged_evidence_refuses_before_it_opens_its_ledger(
        tmp_path: Path, damage: str) -> None:
    """A damaged exit report or ``followed.json`` stops the client at once (exit status 2),
    before its ledger or a connection, and leaves its state directory as it was."""
    state = tmp_path / "c"
    _used_by(state, "c-000")
    if damage == "report":
        client_state_file(state, "c-000").write_text('{"run_finished": {"version": 4,')
    else:
        _damage_followed(state / FOLLOWED_FILE, "garbage")
    before = {p: p.read_bytes() for p in state.rglob("*") if p.is_file()}
    ledger = ledger_file(state, "c-000")
    broker = parse_broker_url("mqtt://127.0.0.1:9")  # never reached: refused before connecting
    with pytest.raises(ConfigError, match="is damaged|not JSON") as refused:
        asyncio.run(run_client(load_scenario(SCENARIO), "c-000", broker, state_dir=state))
    assert refused.value.exit_code == 2
    assert {p: p.read_bytes() for p in state.rglob("*") if p.is_file()} == before
    with PrivacyLedger.open(ledger, client_id="c-000", sampling="poisson", budget=None):
        pass  # not held: the refusal came before the client opened it


async def test_the_endpoint_hands_on_each_run_it_follows_before_any_model_of_it() -> None:
    """The welcome of the live server, and a model of a restarted server that continues it,
    are each handed to ``remember`` before a model of theirs reaches the client (which then
    trains and spends): a process killed at any point after it could spend has them kept."""
    first, restarted = "0123456789abcdef", "fedcba9876543210"
    seen: list[tuple[str, int]] = []
    endpoint = MqttClientEndpoint(
        "mqtt://127.0.0.1:1", run="r", client_id="c1",
        followed=FollowedRuns(remember=lambda i: seen.append((i, endpoint.stats.received))))
    topic = endpoint.topics.global_model
    endpoint._on_message(topic, codec.encode(
        GlobalModel(3, np.zeros(2, np.float32)), incarnation=first))  # retained: held back
    assert seen == [] and endpoint.stats.received == 0
    welcome = {"rounds": [], "incarnation": first, "lineage": []}
    endpoint._on_ack(endpoint.topics.acks("c1"), json.dumps(welcome).encode())
    assert seen == [(first, 0)] and endpoint.stats.received == 1
    endpoint._on_ack(endpoint.topics.acks("c1"), json.dumps(welcome).encode())  # same run
    endpoint._on_message(topic, codec.encode(
        GlobalModel(4, np.zeros(2, np.float32)), incarnation=restarted, lineage=(first,)))
    assert seen == [(first, 0), (restarted, 1)] and endpoint.stats.received == 2


def _killed_before_its_report(first: Launcher, out: Path, ids: list[str]) -> int:
    """Run ``first`` to its end, c-001 SIGKILLed once it has spent (no report written), then
    restart c-001 as the launch started it; its exit status, asserted to come within 10 s and
    to leave its ledger as the kill did."""
    state = out / "state" / "c-001"
    first.prepare()
    first.start_all()
    _wait_for_window(out, 3)
    first.kill("c-001", signal.SIGKILL)
    assert not client_state_file(state, "c-001").exists()  # no report, ever
    assert _ledger_rounds(out, "c-001"), "c-001 spent nothing before its kill"
    assert first.wait("server", 90.0) == 0, "the server did not finish within 90 s"
    assert all(first.wait(c, 30.0) == 0 for c in ids if c != "c-001")
    ledgers = {p: p.read_bytes() for p in (state / "ledgers").iterdir()}
    started = time.monotonic()
    first.start("c-001")  # as the launch started it: same argv, broker, --state
    code = first.wait("c-001", 30.0)
    took = time.monotonic() - started
    assert code is not None and took < 10.0, f"exit status {code} after {took:.1f} s"
    assert {p: p.read_bytes() for p in (state / "ledgers").iterdir()} == ledgers
    return code


@pytest.mark.mqtt
@pytest.mark.slow
@pytest.mark.skipif(find_mosquitto() is None, reason=MOSQUITTO_MISSING)
def test_a_client_killed_before_any_report_exits_2_after_the_end_and_a_new_run_is_not_refused(
        tmp_path: Path) -> None:
    """Run 1 on a mosquitto of 127.0.0.1 (a free port; stopped by its PID): client c-001 is
    SIGKILLed once it has spent, before it ever wrote a report; restarted after the end, the
    broker holding run 1's retained end, it exits 2 within seconds, its ledger untouched
    (it waited for a welcome until it was stopped). Run 2 of the same name on that broker, on
    fresh state directories, starts its clients before its server: run 1's retained end
    reaches them first and refuses none of them; they train on run 2."""
    ids = [f"c-{i:03d}" for i in range(4)]
    broker = LocalMosquitto(tmp_path / "broker", "deploy-four", ids)
    broker.start()

    def launcher(out: Path, windows: int) -> Launcher:
        options = DeploymentOptions(time_scale=0.1, max_backoff=0.5,
                                    wait_for_clients=LAUNCH_WAIT_FOR_CLIENTS,
                                    broker=broker.url(),
                                    secrets_file=str(broker.files.secrets_file))
        return Launcher(SCENARIO, out, options=options, overrides=[f"stop.windows={windows}"])

    run1, run2 = tmp_path / "run1", tmp_path / "run2"
    log = run1 / "logs" / "c-001.log"
    try:
        first = launcher(run1, 8)
        try:
            code = _killed_before_its_report(first, run1, ids)
        finally:
            first.close()
        second = launcher(run2, 3)
        summary = second.run_to_end(120)
    finally:
        broker.kill(signal.SIGTERM)
    said = log.read_text()
    assert code == 2, said[-2000:]
    assert "as the broker's retained end of the run it followed says" in said, said[-2000:]
    assert "start a new run on a fresh --state directory" in said
    state = run1 / "state" / "c-001"
    report = json.loads(client_state_file(state, "c-001").read_text())
    assert report[RUN_FINISHED] is not None and report["released"] == []
    with pytest.raises(ConfigError, match="as client-c-001.json records"):
        refuse_ended_run(state, "c-001")
    assert summary["client_states"] == {"done": 4}, summary["client_states"]
    server = json.loads((run2 / "server.json").read_text())
    for client_id in ids:
        again = json.loads(client_state_file(run2 / "state" / client_id, client_id).read_text())
        assert again["stop_kind"] == "server_finished", (client_id, again["stop_reason"])
        assert again[RUN_FINISHED]["version"] == server["final_version"], client_id
        assert again["released"], client_id
    assert "the broker holds the end of a run this client did not follow" in \
        (run2 / "logs" / "c-001.log").read_text()
