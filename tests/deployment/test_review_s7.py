"""Session 7 attacker's review, over a real mosquitto (127.0.0.1, free port, deploy-generated
passwords and ACL): can a client forge or replay the server's end of the run (RunFinished) to
stop the other clients?"""

from __future__ import annotations

import asyncio
import signal
from collections.abc import AsyncIterator
from pathlib import Path

import aiomqtt
import numpy as np
import pytest

from fedsim.protocol import codec
from fedsim.protocol.messages import GlobalModel, RunFinished
from fedsim.transports.broker import LocalMosquitto, find_mosquitto
from fedsim.transports.incarnation import new_incarnation
from fedsim.transports.mqtt import MqttClientEndpoint, MqttServerEndpoint, ReconnectPolicy
from fedsim.transports.topics import Topics

pytestmark = [
    pytest.mark.mqtt,
    pytest.mark.skipif(find_mosquitto() is None, reason="mosquitto is not installed"),
]

RUN = "review-run"
PARAMS = 8
FAST = ReconnectPolicy(initial_delay=0.05, max_delay=0.4, connect_timeout=5.0)


@pytest.fixture
async def broker(tmp_path: Path) -> AsyncIterator[LocalMosquitto]:
    mosquitto = LocalMosquitto(tmp_path / "broker", RUN, ("mallory", "honest"))
    mosquitto.start()
    try:
        yield mosquitto
    finally:
        mosquitto.kill(signal.SIGTERM)


async def _received(endpoint: MqttClientEndpoint, quiet: float = 0.5) -> list[object]:
    got: list[object] = []
    while True:
        try:
            got.append(await asyncio.wait_for(endpoint.receive(), quiet))
        except TimeoutError:
            return got


@pytest.mark.slow
async def test_a_client_cannot_end_the_run_for_the_others(broker: LocalMosquitto) -> None:
    """Mallory holds valid client credentials and knows the live incarnation (it is in every
    global model). It publishes, retained, a RunFinished stamped with the live incarnation, one
    stamped with an invented incarnation that names the live one in its lineage, and a
    RunFinished on its own updates and status topics. The broker's ACL drops the global-topic
    ones; the honest client (connected before, and one connecting after) never sees a
    RunFinished and keeps receiving the server's models; the server refuses the others."""
    topics = Topics(RUN)
    server = MqttServerEndpoint(broker.server_url(), run=RUN, expected_params=PARAMS,
                                reconnect=FAST, seed=0)
    honest = MqttClientEndpoint(broker.client_url("honest"), run=RUN, client_id="honest",
                                expected_params=PARAMS, reconnect=FAST, seed=1)
    async with asyncio.timeout(60):
        async with server, honest:
            await server.publish(GlobalModel(1, np.zeros(PARAMS, np.float32)))
            while honest.incarnation.current is None:
                await asyncio.sleep(0.02)
            live = server.incarnation.current
            forged = [
                codec.encode(RunFinished(1, "forged by mallory", 1.0), incarnation=live),
                codec.encode(RunFinished(1, "forged child", 1.0), incarnation=new_incarnation(),
                             lineage=(live,)),
            ]
            creds = broker.secrets.for_client("mallory")
            async with aiomqtt.Client(broker.host, broker.port, username=creds.username,
                                      password=creds.password) as raw:
                for payload in forged:
                    await raw.publish(topics.global_model, payload, qos=1, retain=True)
                await raw.publish(topics.updates("mallory"), forged[0], qos=1)
                await raw.publish(topics.status("mallory"), forged[0], qos=1)
            await server.publish(GlobalModel(2, np.ones(PARAMS, np.float32)))
            got = await _received(honest)
            assert not any(isinstance(m, RunFinished) for m in got), got
            assert [m.version for m in got if isinstance(m, GlobalModel)][-1] == 2
            refused = dict(server.stats.refused_by_kind)
            assert refused == {"wrong_topic": 2}, refused  # a RunFinished from a client
            late = MqttClientEndpoint(broker.client_url("mallory"), run=RUN,
                                      client_id="mallory", expected_params=PARAMS,
                                      reconnect=FAST, seed=2)
            async with late:  # the retained message is still the server's model
                got_late = await _received(late, quiet=1.5)
            assert [type(m) for m in got_late] == [GlobalModel], got_late
            assert got_late[0].version == 2  # type: ignore[attr-defined]
