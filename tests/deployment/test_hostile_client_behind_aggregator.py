"""One hostile client behind an aggregation node, over a real mosquitto (127.0.0.1, free port,
stopped by PID; session 56's reviews), with its own generated credentials:

* ``adopt``: its first status claims 2,000 rounds (the server adopts them: its rounds below
  2,000 count as judged), then it sends rounds 0, 1, 2, ... of a zero update. Before, its
  aggregator folded each beside its neighbours' updates and the server refused every such
  group whole: the model reached version 5 of 15 and honest updates were left unapplied.
* ``leap``: round 1,100 (refused by the server alone), then 2,000, 2,001, ...: the aggregator
  had recorded 1,100 and folded 2,000 with its neighbours' (refused: version 5 of 15).

Now the server names the clients' watermarks in its window closes and the aggregator records
only what the server will: no group is refused and every honest update is applied once.

Scenario: the shipped ``four_clients.yaml`` with a fifth client (the hostile ``c-004``, which
the launcher does not start), one aggregator, 16 windows, at 0.25 wall seconds a scenario
second.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import aiomqtt
import numpy as np
import pytest
import torch

from fedsim.protocol import codec
from fedsim.protocol.messages import ClientStatus, ClientUpdate, GlobalModel
from fedsim.runtime.deployed.launcher import Launcher
from fedsim.runtime.deployed.options import LAUNCH_WAIT_FOR_CLIENTS, DeploymentOptions
from fedsim.transports.broker import MOSQUITTO_MISSING, find_mosquitto
from fedsim.transports.topics import Topics
from tests.deployment.test_deployed_run import SCENARIO, _check_applied_against_ledgers, _lines

pytestmark = [
    pytest.mark.mqtt,
    pytest.mark.slow,
    pytest.mark.skipif(find_mosquitto() is None, reason=MOSQUITTO_MISSING),
]
torch.set_num_threads(1)

HOSTILE = "c-004"
HONEST = [f"c-{i:03d}" for i in range(4)]


async def _attack(launcher: Launcher, plan: str) -> int:
    """Play c-004: be told the incarnation; ``adopt``: claim 2,000 rounds, then send rounds
    0, 1, ... (one every 0.3 wall s, 40 in all); ``leap``: send round 1,100, then 2,000,
    2,001, ... (39 more); the updates sent."""
    broker = launcher.local_broker
    assert broker is not None
    topics = Topics(launcher.run)
    incarnation, version, size = "", -1, 0
    async with aiomqtt.Client(broker.host, broker.port, username=HOSTILE,
                              password=broker.secrets.for_client(HOSTILE).password) as mqtt:
        await mqtt.subscribe(topics.acks(HOSTILE), qos=1)
        await mqtt.subscribe(topics.global_model, qos=1)

        async def listen() -> None:
            nonlocal incarnation, version, size
            async for message in mqtt.messages:
                payload = bytes(message.payload)  # type: ignore[arg-type]
                if str(message.topic) == topics.acks(HOSTILE):
                    incarnation = json.loads(payload)["incarnation"]
                    continue
                frame = codec.decode_frame(payload)
                if isinstance(frame.message, GlobalModel) and frame.incarnation == incarnation:
                    version, size = frame.message.version, frame.message.params.size

        listener = asyncio.create_task(listen())
        try:
            async with asyncio.timeout(60):
                while not incarnation:
                    await mqtt.publish(topics.hello(HOSTILE), b"", qos=0)
                    await asyncio.sleep(0.3)
                claim = 2000 if plan == "adopt" else 0
                await mqtt.publish(topics.status(HOSTILE), codec.encode(ClientStatus(
                    HOSTILE, "waiting", claim, 0.0, 1e-5, "connected"), incarnation=incarnation),
                    qos=1)
                while version < 1:
                    await asyncio.sleep(0.05)
            rounds = range(40) if plan == "adopt" else [1100, *range(2000, 2039)]
            for round_index in rounds:
                update = ClientUpdate(HOSTILE, round_index, version,
                                      np.zeros(size, np.float32), 32.0)
                await mqtt.publish(topics.updates(HOSTILE),
                                   codec.encode(update, incarnation=incarnation), qos=1)
                await asyncio.sleep(0.3)
        finally:
            listener.cancel()
    return 40


@pytest.mark.parametrize("plan", ["adopt", "leap"])
def test_one_client_cannot_stall_its_aggregators_partials(tmp_path: Path, plan: str) -> None:
    out = tmp_path / "hostile"
    options = DeploymentOptions(time_scale=0.25, max_backoff=0.5,
                                wait_for_clients=LAUNCH_WAIT_FOR_CLIENTS)
    launcher = Launcher(SCENARIO, out, options=options, overrides=[
        "clients.groups[0].count=5", "stop.windows=16", "aggregators.count=1"])
    try:
        launcher.prepare()
        for name in launcher.processes:
            if name != HOSTILE:
                launcher.start(name)
        assert asyncio.run(asyncio.wait_for(_attack(launcher, plan), 120)) == 40
        assert launcher.wait("server", 120) == 0
        launcher.stop_all()
        summary = launcher.collect()
    finally:
        launcher.close()
    metrics = _lines(out / "metrics.jsonl")
    refused = sum(line["rejections"].get("bad_partial", 0) for line in metrics)
    assert refused == 0, f"{refused} updates refused in partials"
    assert summary["final_version"] >= 12  # 15 without the attacker (control run: 15)
    applied = _check_applied_against_ledgers(out)
    # adopt: all below its adopted 2,000; leap: all beyond what the server knows of it.
    assert HOSTILE not in {client for client, _ in applied}
    for client_id in HONEST:
        state = json.loads((out / "state" / client_id / f"client-{client_id}.json").read_text())
        released = [r["round"] for r in state["released"]]
        mine = sorted(r for client, r in applied if client == client_id)
        # Every round applied once but the client's last, which (or whose receipt) may still
        # have been in flight when the run ended, as without an attacker.
        assert mine == released[:len(mine)] and len(mine) >= len(released) - 1, client_id
        assert set(state["unacknowledged"]) <= {released[-1]}, client_id
