"""An attacker's review (session 66b): a client floods its own topics with messages naming
another client's id. The broker lets them through (they are on the client's own topics), and
the server's endpoint (and an aggregator's) refuses each as a forged client id: counted, as it
should be, but logged at warning once per message. Issue 25 finding 3 throttled every other
per-message refusal (``fedsim.logging.REJECTION_EVENTS``); this one was left out, so one
client wrote the server's log at the rate it sent (2,000 statuses of 300 bytes: 2,000 warning
lines, 1.1 MB). Now the first per sender is a warning and the rest are summarised, and every
message is still counted (``forged_client_id``)."""

from __future__ import annotations

import asyncio
import io
import json
from collections.abc import Iterator
from contextlib import contextmanager, redirect_stderr

import aiomqtt
import numpy as np
import pytest

from fedsim.logging import configure_logging
from fedsim.protocol import codec
from fedsim.protocol.messages import ClientStatus, ClientUpdate
from fedsim.transports.broker import LocalMosquitto as Broker
from fedsim.transports.mqtt import (
    MqttAggregatorEndpoint,
    MqttServerEndpoint,
    ReconnectPolicy,
)
from fedsim.transports.topics import Topics, aggregator_of

RUN = "test-run"  # the ``mosquitto`` fixture's run (conftest.py)
PARAMS = 8
FAST = ReconnectPolicy(initial_delay=0.05, max_delay=0.4, connect_timeout=5.0)
FLOOD = 2_000
FORGED_EVENTS = ("access denied: forged client id",)


def _raw(broker: Broker, client_id: str) -> aiomqtt.Client:
    creds = broker.secrets.for_client(client_id)
    return aiomqtt.Client(broker.host, broker.port, username=creds.username,
                          password=creds.password)


async def _until(check, timeout: float = 30.0) -> None:
    async with asyncio.timeout(timeout):
        while not check():
            await asyncio.sleep(0.05)


def _warnings(text: str, event: str) -> list[dict]:
    lines = [json.loads(line) for line in text.splitlines() if line.startswith("{")]
    return [line for line in lines if line.get("event") == event
            and line.get("level") == "warning"]


@contextmanager
def _json_log() -> Iterator[io.StringIO]:
    """The JSON log lines written within the block (stderr), as a library caller sees them."""
    stream = io.StringIO()
    with redirect_stderr(stream):
        configure_logging(json=True, level="info")
        try:
            yield stream
        finally:
            configure_logging(json=False, level="info")


def _warned_once(stream: io.StringIO) -> list[dict]:
    """The forged-id warnings logged: one, whatever the flood."""
    warned = _warnings(stream.getvalue(), "access denied: forged client id")
    assert len(warned) == 1, f"{len(warned)} warnings for {FLOOD} forged messages"
    return warned


@pytest.mark.mqtt
async def test_a_flood_of_forged_ids_at_the_server_is_counted_and_logged_once(
        mosquitto: Broker) -> None:
    topics = Topics(RUN)
    with _json_log() as stream:
        async with MqttServerEndpoint(mosquitto.server_url(), run=RUN,
                                      expected_params=PARAMS, reconnect=FAST, seed=0,
                                      clients=("c1", "c2", "c3")) as server:
            stamp = server.incarnation.current
            forged = codec.encode(ClientStatus("c2", "done", 1, 0.1, 1e-5),
                                  incarnation=stamp)
            async with _raw(mosquitto, "c1") as raw:  # c1's own topic, c2's id inside
                for _ in range(FLOOD):
                    await raw.publish(topics.status("c1"), forged, qos=1)
            await _until(lambda: server.stats.denied >= FLOOD)
            assert server.stats.refused_by_kind == {"forged_client_id": FLOOD}
    warned = _warned_once(stream)
    assert "summarised" in warned[0]["further"]


@pytest.mark.mqtt
async def test_a_flood_of_forged_ids_at_an_aggregator_is_counted_and_logged_once(
        mosquitto: Broker) -> None:
    topics = Topics(RUN)
    aggregators = ("aggregator-0",)
    delta = np.zeros(PARAMS, dtype=np.float32)
    with _json_log() as stream:
        creds = mosquitto.secrets.for_server()  # (the fixture's ACL has no aggregators:
        # the server's credentials read every update topic, as an aggregator reads its own)
        url = f"mqtt://{creds.username}:{creds.password}@{mosquitto.host}:{mosquitto.port}"
        async with MqttAggregatorEndpoint(url, run=RUN, aggregator_id=aggregators[0],
                                          aggregators=aggregators,
                                          client_ids=("c1", "c2", "c3"),
                                          expected_params=PARAMS, reconnect=FAST,
                                          seed=0) as node:
            assert aggregator_of("c1", aggregators) == aggregators[0]
            forged = codec.encode(ClientUpdate("c2", 1, 0, delta, 1.0))
            await asyncio.sleep(0.3)  # subscribed
            async with _raw(mosquitto, "c1") as raw:
                for _ in range(FLOOD):
                    await raw.publish(topics.updates("c1"), forged, qos=1)
            await _until(lambda: node.stats.denied >= FLOOD)
            assert node.stats.refused_by_kind == {"forged_client_id": FLOOD}
    _warned_once(stream)
