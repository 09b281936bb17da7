"""A server restarted on the state directory of a run that ended (a stranger's review): it
closed a window 13 after the run's 12, printed "13 windows", rewrote ``server.json``,
announced the end again and warned "no message from any client". The run's end is now marked
durably in the state directory's high-water mark (``server.hwm``), and a server started on it
refuses with one line, as ``fedsim launch --resume`` refuses a finished launch."""

from __future__ import annotations

import asyncio
import json
import signal
from pathlib import Path

import pytest

from fedsim.runtime.deployed.checkpoint import (
    MARK_NAME,
    CheckpointError,
    HighWaterMark,
    ServerCheckpoint,
)
from fedsim.transports.broker import MOSQUITTO_MISSING, find_mosquitto
from tests.deployment.test_checkpoint import IDENTITY, _busy_server

SCENARIO = Path(__file__).with_name("four_clients.yaml")


def test_a_finished_runs_checkpoint_is_refused_with_its_reason(tmp_path: Path) -> None:
    checkpoint = ServerCheckpoint(tmp_path, IDENTITY)
    checkpoint.save(_busy_server().snapshot())
    assert ServerCheckpoint(tmp_path, IDENTITY).load() is not None  # unfinished: resumed
    checkpoint.mark_finished("every client's budget is spent")
    mark = HighWaterMark.model_validate_json((tmp_path / MARK_NAME).read_text())
    assert (mark.windows_closed, mark.finished) == (12, "every client's budget is spent")
    with pytest.raises(CheckpointError, match=r"its run ended at window 12 \(every client's "
                                              r"budget is spent\); nothing to resume"):
        ServerCheckpoint(tmp_path, IDENTITY).load()


def test_a_mark_written_by_a_fedsim_without_the_finished_field_still_loads(
        tmp_path: Path) -> None:
    checkpoint = ServerCheckpoint(tmp_path, IDENTITY)
    checkpoint.save(_busy_server().snapshot())
    document = json.loads((tmp_path / MARK_NAME).read_text())
    document.pop("finished")
    (tmp_path / MARK_NAME).write_text(json.dumps(document))
    assert ServerCheckpoint(tmp_path, IDENTITY).load() is not None


@pytest.mark.mqtt
@pytest.mark.slow
@pytest.mark.skipif(find_mosquitto() is None, reason=MOSQUITTO_MISSING)
def test_a_server_restarted_on_a_finished_runs_state_refuses_and_changes_nothing(
        tmp_path: Path) -> None:
    from fedsim.cli import main
    from fedsim.config import load_scenario
    from fedsim.runtime.deployed.options import DeploymentOptions
    from fedsim.runtime.deployed.server_process import serve
    from fedsim.transports.broker import LocalMosquitto
    from fedsim.transports.mqtt_settings import parse_broker_url

    loaded = load_scenario(SCENARIO, ["stop.windows=3"])
    ids = [f"c-{i:03d}" for i in range(4)]
    broker = LocalMosquitto(tmp_path / "broker", loaded.scenario.name, ids)
    broker.start()
    state, out = tmp_path / "state", tmp_path / "out"
    try:
        outcome = asyncio.run(serve(
            loaded, parse_broker_url(broker.server_url()), run=loaded.scenario.name,
            state_dir=state, out_dir=out, options=DeploymentOptions(time_scale=0.02)))
        assert outcome["finished"] is True and outcome["windows"] == 3
        before = {p.name: p.read_bytes() for p in out.iterdir()}
        with pytest.raises(CheckpointError, match="its run ended at window 3"):
            asyncio.run(serve(
                loaded, parse_broker_url(broker.server_url()), run=loaded.scenario.name,
                state_dir=state, out_dir=out, options=DeploymentOptions(time_scale=0.02)))
        assert {p.name: p.read_bytes() for p in out.iterdir()} == before
    finally:
        broker.kill(signal.SIGTERM)
    # The command says it in one line, exit 2 (no broker is reached: refused before).
    assert main(["server", "--scenario", str(SCENARIO), "--run", "deploy-four","--set", "stop.windows=3", "--broker",
                 "mqtt://127.0.0.1:9", "--state", str(state), "--out", str(out), "-q"]) == 2
