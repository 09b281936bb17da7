"""What a hostile client with valid credentials can make an aggregator or the server hold, over a
real mosquitto (127.0.0.1, free port, stopped by PID; an attacker's review):

* a top-k frame of 224 bytes decodes to the whole dense update (24 KB of a 6,003-parameter
  model): a client whose group does not compress may not send one (refused, ``compression``),
  at the aggregator and at the server;
* before the run's first window close an aggregator holds its clients' updates (it does not
  yet know the run's incarnation): 20,000 frames grew it from 306 to 720 MB. Now it holds at
  most 256 rounds a client (an honest client's unacknowledged ones), a repeat replacing the
  held copy; further rounds are refused (``rate``), and the honest clients' updates still
  arrive once the first close comes.
"""

from __future__ import annotations

import asyncio
import collections
import signal
from collections.abc import Iterator
from pathlib import Path

import aiomqtt
import numpy as np
import pytest

from fedsim.config.compression import TopKCompression
from fedsim.protocol import codec
from fedsim.protocol.messages import ClientUpdate, WindowClose
from fedsim.transports.broker import MOSQUITTO_MISSING, LocalMosquitto, find_mosquitto
from fedsim.transports.mqtt import (
    MqttAggregatorEndpoint,
    MqttServerEndpoint,
    ReconnectPolicy,
)
from fedsim.transports.mqtt_aggregator import MAX_HELD_PER_CLIENT
from fedsim.transports.security import load_secrets
from fedsim.transports.topics import Topics, aggregator_ids, aggregator_of

pytestmark = [pytest.mark.mqtt, pytest.mark.skipif(find_mosquitto() is None,
                                                   reason=MOSQUITTO_MISSING)]

RUN = "held-run"
CLIENTS = tuple(f"c-{i:03d}" for i in range(6))
AGGREGATORS = aggregator_ids(1)
DIM = 2_000
FAST = ReconnectPolicy(initial_delay=0.05, max_delay=0.4, connect_timeout=10.0)
TOP_K = TopKCompression(kind="top_k", fraction=1e-9)
HOSTILE, SPARSE, *HONEST = CLIENTS
COMPRESSIONS = {c: (TOP_K if c in (HOSTILE, SPARSE) else None) for c in CLIENTS}
FLOOD = 1_500


def _broker(tmp_path: Path, aggregators: tuple[str, ...]) -> LocalMosquitto:
    broker = LocalMosquitto(tmp_path / "broker", RUN, CLIENTS, aggregators=aggregators)
    broker.start()
    return broker


@pytest.fixture
def broker(tmp_path: Path) -> Iterator[LocalMosquitto]:
    mosquitto = _broker(tmp_path, AGGREGATORS)
    try:
        yield mosquitto
    finally:
        mosquitto.kill(signal.SIGTERM)


@pytest.fixture
def flat_broker(tmp_path: Path) -> Iterator[LocalMosquitto]:
    mosquitto = _broker(tmp_path, ())
    try:
        yield mosquitto
    finally:
        mosquitto.kill(signal.SIGTERM)


def _frame(client: str, round_index: int, *, compressed: bool, incarnation: str = "") -> bytes:
    return codec.encode(ClientUpdate(client, round_index, 0, np.zeros(DIM, np.float32), 8.0,
                                     compression=TOP_K if compressed else None),
                        incarnation=incarnation)


async def _publish(broker: LocalMosquitto, client: str,
                   frames: list[bytes]) -> None:
    secret = load_secrets(broker.files.secrets_file).for_client(client)
    async with aiomqtt.Client(broker.host, broker.port, username=secret.username,
                              password=secret.password) as mqtt:
        for frame in frames:
            await mqtt.publish(Topics(RUN).updates(client), frame, qos=1)


async def _until(condition: object, seconds: float = 20.0) -> None:
    deadline = asyncio.get_running_loop().time() + seconds
    while not condition() and asyncio.get_running_loop().time() < deadline:  # type: ignore[operator]
        await asyncio.sleep(0.05)


def test_an_aggregator_refuses_packing_its_group_does_not_send_and_holds_a_bounded_backlog(
        broker: LocalMosquitto) -> None:
    assert all(aggregator_of(c, AGGREGATORS) == "aggregator-0" for c in CLIENTS)
    assert len(_frame(HOSTILE, 0, compressed=True)) < 300  # 8 KB dense

    async def scenario() -> None:
        server = MqttServerEndpoint(broker.server_url(), run=RUN, expected_params=DIM,
                                    reconnect=FAST, aggregators=AGGREGATORS)
        aggregator = MqttAggregatorEndpoint(
            broker.aggregator_url("aggregator-0"), run=RUN, aggregator_id="aggregator-0",
            aggregators=AGGREGATORS, client_ids=CLIENTS, expected_params=DIM, reconnect=FAST,
            compressions=COMPRESSIONS)
        async with server, aggregator:
            stamp = server.incarnation.current  # (the clients' welcomes tell them)
            # A client whose group does not compress sends a top-k frame: refused, counted.
            await _publish(broker, HONEST[0], [_frame(HONEST[0], 0, compressed=True,
                                                      incarnation=stamp)])
            # The hostile client (its group compresses: top-k frames are its own) floods
            # distinct rounds, and repeats one, before the first close.
            flood = [_frame(HOSTILE, r, compressed=True, incarnation=stamp)
                     for r in range(FLOOD)]
            await _publish(broker, HOSTILE, flood + [flood[0]] * 200)
            # The honest clients' updates (dense; one sparse group's top-k) are held.
            for client in HONEST:
                await _publish(broker, client, [_frame(client, r, compressed=False,
                                                       incarnation=stamp) for r in range(3)])
            await _publish(broker, SPARSE, [_frame(SPARSE, 0, compressed=True,
                                                   incarnation=stamp)])
            refused = aggregator.stats.refused_by_kind
            await _until(lambda: refused.get("rate", 0) >= FLOOD - MAX_HELD_PER_CLIENT
                         and len(aggregator._held) >= MAX_HELD_PER_CLIENT + 3 * len(HONEST))
            assert refused == {"compression": 1, "rate": FLOOD - MAX_HELD_PER_CLIENT}
            held = MAX_HELD_PER_CLIENT + 3 * len(HONEST) + 1
            # what it holds (decoded: 4 * DIM bytes each), at most 256 rounds a client
            per_client = collections.Counter(client for client, _ in aggregator._held)
            assert len(aggregator._held) == held
            assert per_client[HOSTILE] == MAX_HELD_PER_CLIENT
            # The first close: every held update of the honest clients reaches the actor.
            await server.publish(WindowClose(1, 0, 0.0))
            got: list[tuple[str, int]] = []
            while len(got) < held:
                message = await asyncio.wait_for(aggregator.receive(), 10)
                if isinstance(message, ClientUpdate):
                    got.append((message.client_id, message.round))
            assert {(c, r) for c in HONEST for r in range(3)} | {(SPARSE, 0)} <= set(got)
            assert sorted(r for c, r in got if c == HOSTILE) == list(range(MAX_HELD_PER_CLIENT))
            assert not aggregator._held

    asyncio.run(asyncio.wait_for(scenario(), 120))


def test_the_server_refuses_a_compressed_update_of_a_group_that_does_not_compress(
        flat_broker: LocalMosquitto) -> None:
    async def scenario() -> None:
        server = MqttServerEndpoint(flat_broker.server_url(), run=RUN, expected_params=DIM,
                                    reconnect=FAST, clients=CLIENTS, compressions=COMPRESSIONS)
        async with server:
            stamp = server.incarnation.current
            await _publish(flat_broker, HONEST[0], [
                _frame(HONEST[0], 0, compressed=True, incarnation=stamp),
                _frame(HONEST[0], 1, compressed=False, incarnation=stamp)])
            await _publish(flat_broker, SPARSE, [
                _frame(SPARSE, 0, compressed=True, incarnation=stamp)])
            got = [await asyncio.wait_for(server.receive(), 10) for _ in range(2)]
            assert sorted((m.client_id, m.round) for m in got  # type: ignore[union-attr]
                          ) == [(SPARSE, 0), (HONEST[0], 1)]
            assert server.stats.refused_by_kind == {"compression": 1}
            assert server.unacknowledged == 2  # the refused one waits for no receipt

    asyncio.run(asyncio.wait_for(scenario(), 60))
