"""The end of a deployed run over a real mosquitto: once the server's stop condition holds,
no client releases (or charges its ledger for) another round, and every client stops by itself.

Scenario: ``four_clients.yaml`` for 8 windows at 0.25 wall seconds per scenario second. Each
client trains one round per global model (``max_versions_behind: 1``), so the model the server
broadcasts as it closes its last window starts one more round on every client: the one that
used to be released (and charged) after the server had stopped.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from fedsim.config import load_scenario
from fedsim.runtime.actors.client_book import BookState
from fedsim.runtime.assembly import open_ledger
from fedsim.runtime.deployed.launcher import Launcher
from fedsim.runtime.deployed.options import LAUNCH_WAIT_FOR_CLIENTS, DeploymentOptions
from fedsim.runtime.population import build_population
from fedsim.transports.broker import MOSQUITTO_MISSING, find_mosquitto

pytestmark = [
    pytest.mark.mqtt,
    pytest.mark.slow,
    pytest.mark.skipif(find_mosquitto() is None, reason=MOSQUITTO_MISSING),
]
torch.set_num_threads(1)

SCENARIO = Path(__file__).with_name("four_clients.yaml")
IDS = [f"c-{i:03d}" for i in range(4)]
WINDOWS = 8
CLIENT_EXIT = 20.0  # wall seconds a client may take to stop after the server (it is ~0.5 s)


def _lines(path: Path) -> list[dict[str, Any]]:
    return [json.loads(t) for t in path.read_text().splitlines() if t.strip()]


def _ledger_path(out: Path, client_id: str) -> Path:
    return out / "state" / client_id / "ledgers" / f"{client_id}.jsonl"


def test_no_round_is_released_or_charged_after_the_server_finished(tmp_path: Path) -> None:
    out = tmp_path / "run"
    options = DeploymentOptions(time_scale=0.25, max_backoff=0.5,
                                wait_for_clients=LAUNCH_WAIT_FOR_CLIENTS)
    launcher = Launcher(SCENARIO, out, options=options, overrides=[f"stop.windows={WINDOWS}"])
    exits: dict[str, int | None] = {}
    try:
        launcher.prepare()
        launcher.start_all()
        assert launcher.wait("server", 90.0) == 0, "the server did not finish within 90 s"
        # The ledgers' bytes when the server's process has ended (the client holds the lock:
        # read the file itself). Nothing may be appended to them from here on.
        at_server_end = {c: _ledger_path(out, c).read_bytes() for c in IDS}
        server_end = time.monotonic()
        deadline = server_end + CLIENT_EXIT
        for client_id in IDS:  # every client stops by itself: no signal is sent
            exits[client_id] = launcher.wait(client_id, max(0.1, deadline - time.monotonic()))
        last_exit = time.monotonic() - server_end
    finally:
        launcher.close()
    server = json.loads((out / "server.json").read_text())
    assert server["finished"] and server["windows"] == WINDOWS
    with np.load(out / "state" / "server" / "server.ckpt") as archive:
        book = BookState.from_document(json.loads(archive["state"].tobytes())["book"])
    applied = {(m["client_id"], m["round"]) for m in _lines(out / "applied.jsonl")}
    dropped = sum(m["dropped_in_flight"] for m in _lines(out / "metrics.jsonl"))
    population = build_population(load_scenario(SCENARIO))
    charged: dict[str, list[int]] = {}
    for plan in population.plans:
        client_id = plan.client_id
        state = json.loads((out / "state" / client_id / f"client-{client_id}.json").read_text())
        assert exits[client_id] == 0, f"{client_id} did not stop by itself: {state}"
        assert state["state"] == "done", state
        assert "the server finished the run" in state["stop_reason"], state
        assert state["signalled"] is False, state  # it stopped by itself
        assert _ledger_path(out, client_id).read_bytes() == at_server_end[client_id], client_id
        with open_ledger(plan, _ledger_path(out, client_id)) as ledger:
            charged[client_id] = sorted({record.round for record in ledger.records})
        assert charged[client_id] == state["ledger_rounds"]
        assert [r["round"] for r in state["released"]] == charged[client_id]
        assert state["unacknowledged"] == [], f"{client_id}: released, never acknowledged"
    ledger_rounds = {(c, r) for c, rounds in charged.items() for r in rounds}
    print(f"server: {WINDOWS} windows, {len(applied)} applied, "
          f"{server['unjudged_updates']} unjudged, dropped_in_flight {dropped}; ledgers: "
          f"{ {c: len(r) for c, r in charged.items()} }; clients all exited {last_exit:.2f} s "
          "after the server")
    # Every charged round reached the server before it finished and was judged there (applied,
    # or refused as stale): none is left over, none arrived after its last window.
    assert all(key in book for key in applied)
    assert {key for key in ledger_rounds if key not in book} == set() and dropped == 0
    assert server["unjudged_updates"] == 0
    assert all(len(rounds) >= WINDOWS - 2 for rounds in charged.values()), charged


def test_clients_stop_by_themselves_after_a_server_that_ended_at_once(tmp_path: Path) -> None:
    """A stranger's launch at --time-scale 0.05: the server's 40 windows took 0.75 wall s, it
    published the end of the run at QoS 0 and exited before its event loop wrote it, and every
    client waited until the launcher's SIGTERM 10 s later (reports: signalled, training). The
    end now goes at QoS 1 (its publish returns once the broker holds it)."""
    from fedsim.cli import main

    out = tmp_path / "run"
    assert main(["launch", str(SCENARIO), "--out", str(out), "--time-scale", "0.05",
                 "--set", "stop.windows=40", "--no-plots", "-q", "--timeout", "120"]) == 0
    for client_id in IDS:
        report = json.loads((out / "state" / client_id / f"client-{client_id}.json").read_text())
        assert report["signalled"] is False and report["state"] == "done", report
        assert "the server finished the run" in report["stop_reason"]


def test_a_server_whose_run_ends_before_any_client_came_says_so(tmp_path: Path) -> None:
    """A stranger started a server by hand without --wait-for-clients: it ran every window
    before the first client had started, and exited 0 saying nothing of it."""
    import asyncio
    import signal

    from structlog.testing import capture_logs

    from fedsim.config import load_scenario
    from fedsim.runtime.deployed.options import DeploymentOptions
    from fedsim.runtime.deployed.server_process import serve
    from fedsim.transports.broker import LocalMosquitto
    from fedsim.transports.mqtt_settings import parse_broker_url

    loaded = load_scenario(SCENARIO, ["stop.windows=4"])
    broker = LocalMosquitto(tmp_path / "broker", loaded.scenario.name, list(IDS))
    broker.start()
    try:
        with capture_logs() as logs:
            outcome = asyncio.run(serve(
                loaded, parse_broker_url(broker.server_url()), run=loaded.scenario.name,
                state_dir=tmp_path / "state", out_dir=tmp_path / "out",
                options=DeploymentOptions(time_scale=0.02)))
    finally:
        broker.kill(signal.SIGTERM)
    assert outcome["finished"] is True
    assert any(e["event"].startswith("the run ended without a message from any client")
               and e["log_level"] == "warning" for e in logs)
