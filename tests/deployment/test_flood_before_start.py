"""A hostile client floods the server before the run starts, over a real mosquitto (127.0.0.1,
free port, stopped by PID; an attacker's review): it is told the incarnation (a hello), then
sends updates before its "connected" status while the server waits for it.

Before, each wrote one warning to ``server.log`` ("message before the run started dropped":
20,000 lines, 3.8 MB, for 20,000 updates), none was counted as a rejection, and ``server.json``
reported their rounds as ``unjudged_updates`` (1,000), a field for what arrived after the last
window. Now each is counted (``before_start``, in the first window's rejections and the
server's ``refused_by_kind``), the log says it once (rejections are summarised) and the
unjudged updates are what they say.

Scenario: the shipped ``four_clients.yaml`` with a fifth client (the hostile ``c-004``, which
the launcher does not start), 4 windows, at 0.25 wall seconds a scenario second.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from pathlib import Path

import aiomqtt
import numpy as np
import pytest

from fedsim.config import load_scenario
from fedsim.protocol import codec
from fedsim.protocol.messages import ClientStatus, ClientUpdate
from fedsim.runtime.deployed.launcher import Launcher
from fedsim.runtime.population import build_population
from fedsim.transports.broker import MOSQUITTO_MISSING, find_mosquitto
from fedsim.transports.topics import Topics
from tests.deployment.test_deployed_run import SCENARIO, _lines
from tests.deployment.test_hostile_client import HOSTILE, launch_beside

pytestmark = [pytest.mark.mqtt, pytest.mark.slow,
              pytest.mark.skipif(find_mosquitto() is None, reason=MOSQUITTO_MISSING)]

FLOOD = 2_000
ROUNDS = 500  # distinct rounds among them (each a round the server would wait to acknowledge)
OVERRIDES = ["clients.groups[0].count=5", "stop.windows=4"]


async def _flood(launcher: Launcher, size: int) -> None:
    broker = launcher.local_broker
    assert broker is not None
    topics = Topics(launcher.run)
    async with aiomqtt.Client(broker.host, broker.port, username=HOSTILE,
                              password=broker.secrets.for_client(HOSTILE).password) as mqtt:
        await mqtt.subscribe(topics.acks(HOSTILE), qos=1)
        incarnation = ""
        async with asyncio.timeout(60):  # told the incarnation, as a client is (its welcome)
            while not incarnation:
                await mqtt.publish(topics.hello(HOSTILE), b"", qos=0)
                with contextlib.suppress(TimeoutError):
                    welcome = await asyncio.wait_for(anext(mqtt.messages), 0.3)
                    incarnation = json.loads(bytes(welcome.payload))["incarnation"]  # type: ignore[arg-type]
        for r in range(FLOOD):
            update = ClientUpdate(HOSTILE, r % ROUNDS, 0, np.zeros(size, np.float32), 32.0)
            await mqtt.publish(topics.updates(HOSTILE),
                               codec.encode(update, incarnation=incarnation), qos=1)
        await asyncio.sleep(1.0)  # (the server reads them before the status)
        await mqtt.publish(topics.status(HOSTILE), codec.encode(ClientStatus(
            HOSTILE, "waiting", 0, 0.0, 1e-5, "connected"), incarnation=incarnation), qos=1)
        await asyncio.sleep(1.0)


def test_a_flood_before_the_run_starts_is_counted_and_logged_once(tmp_path: Path) -> None:
    out = tmp_path / "flood"
    size = int(build_population(load_scenario(SCENARIO, OVERRIDES)).initial_params.size)
    launch_beside(out, OVERRIDES, lambda launcher: _flood(launcher, size))
    server = json.loads((out / "server.json").read_text())
    assert server["mqtt"]["refused_by_kind"].get("before_start") == FLOOD
    # (what honest clients sent after the last window at most, not the flood's 500 rounds)
    assert server["unjudged_updates"] < 10, server["unjudged_updates"]
    metrics = _lines(out / "metrics.jsonl")
    assert metrics[0]["rejections"].get("before_start") == FLOOD
    assert metrics[0]["rejected"] >= FLOOD
    log = (out / "logs" / "server.log").read_text().splitlines()
    assert sum("before_start" in line for line in log) <= 2, len(log)  # a warning (+ a summary)
    assert len(log) < 200, len(log)
