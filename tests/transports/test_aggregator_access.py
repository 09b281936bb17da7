"""Aggregation nodes over a real mosquitto (127.0.0.1, free port, stopped by PID) with the
passwords and ACL ``fedsim deploy`` writes: an aggregator reads the updates of exactly the
clients routed to it and writes only its own partials topic and the receipts it passes on
(reaching only its own clients); a client can neither publish a
partial nor read another client's updates nor the window closes. And the endpoints: a client's
update reaches its one aggregator, a window close reaches every aggregator, a partial and a
forwarded update reach the server (which waits to acknowledge what they name)."""

from __future__ import annotations

import asyncio
import json
import signal
from collections.abc import Iterator
from pathlib import Path

import aiomqtt
import numpy as np
import pytest

from fedsim.protocol import codec
from fedsim.protocol.messages import ClientUpdate, ManifestEntry, Partial, WindowClose
from fedsim.transports.broker import MOSQUITTO_MISSING, LocalMosquitto, find_mosquitto
from fedsim.transports.mqtt import (
    MqttAggregatorEndpoint,
    MqttClientEndpoint,
    MqttServerEndpoint,
    ReconnectPolicy,
)
from fedsim.transports.security import load_secrets
from fedsim.transports.topics import Topics, aggregator_ids, aggregator_of

pytestmark = [pytest.mark.mqtt, pytest.mark.slow, pytest.mark.skipif(find_mosquitto() is None,
                                                    reason=MOSQUITTO_MISSING)]

RUN = "agg-run"
CLIENTS = ("c-000", "c-001", "c-002", "c-003")
AGGREGATORS = aggregator_ids(2)
FAST = ReconnectPolicy(initial_delay=0.05, max_delay=0.4, connect_timeout=10.0)
QUIET = 1.0  # seconds a denied message is given to arrive (it must not)


@pytest.fixture
def broker(tmp_path: Path) -> Iterator[LocalMosquitto]:
    mosquitto = LocalMosquitto(tmp_path / "broker", RUN, CLIENTS, aggregators=AGGREGATORS)
    mosquitto.start()
    try:
        yield mosquitto
    finally:
        mosquitto.kill(signal.SIGTERM)


def _clients_of(aggregator: str) -> list[str]:
    return [c for c in CLIENTS if aggregator_of(c, AGGREGATORS) == aggregator]


def _partial(aggregator: str, client: str) -> bytes:
    return codec.encode(Partial(aggregator, 1, (0,), (ManifestEntry(client, 0, 0, 1, 1.0),),
                                np.zeros(4, np.float32)))


def _update(client: str, round_index: int = 0) -> bytes:
    return codec.encode(ClientUpdate(client, round_index, 0, np.zeros(4, np.float32), 8.0))


async def _received(broker: LocalMosquitto, who: tuple[str, str], topics: list[str],
                    send: list[tuple[tuple[str, str], str, bytes]]) -> list[str]:
    """Subscribe as ``who`` (username, password) to ``topics``, then publish ``send`` (each as
    its own user); the topics of the messages ``who`` received within :data:`QUIET`."""
    got: list[str] = []
    async with aiomqtt.Client(broker.host, broker.port, username=who[0], password=who[1]) as sub:
        for topic in topics:
            await sub.subscribe(topic, qos=1)

        async def collect() -> None:
            async for message in sub.messages:
                got.append(str(message.topic))

        collector = asyncio.ensure_future(collect())
        for (user, password), topic, payload in send:
            async with aiomqtt.Client(broker.host, broker.port, username=user,
                                      password=password) as pub:
                await pub.publish(topic, payload, qos=1)
        await asyncio.sleep(QUIET)
        collector.cancel()
        await asyncio.gather(collector, return_exceptions=True)
    return got


def test_the_acl_gives_aggregators_their_clients_and_clients_no_partials(
        broker: LocalMosquitto) -> None:
    secrets = load_secrets(broker.files.secrets_file)
    topics = Topics(RUN)
    server = (secrets.server.username, secrets.server.password)
    agg = {a: (secrets.aggregators[a].username, secrets.aggregators[a].password)
           for a in AGGREGATORS}
    cli = {c: (secrets.clients[c].username, secrets.clients[c].password) for c in CLIENTS}
    mine, other = _clients_of("aggregator-0"), _clients_of("aggregator-1")
    assert len(mine) > 1 and other  # both aggregators have clients (the route spreads these ids)

    async def scenario() -> None:
        # The server reads an aggregator's own partials; not a client's "partial", nor one an
        # aggregator writes on the other's topic.
        got = await _received(broker, server, [topics.all_partials], [
            (cli[mine[0]], topics.partials("aggregator-0"), _partial("aggregator-0", mine[0])),
            (agg["aggregator-1"], topics.partials("aggregator-0"),
             _partial("aggregator-0", mine[0])),
            (agg["aggregator-0"], topics.partials("aggregator-0"),
             _partial("aggregator-0", mine[0])),
        ])
        assert got == [topics.partials("aggregator-0")]
        # Aggregator 0 reads its clients' updates and nobody else's.
        got = await _received(broker, agg["aggregator-0"], [topics.all_updates], [
            (cli[c], topics.updates(c), _update(c)) for c in CLIENTS])
        assert sorted(got) == sorted(topics.updates(c) for c in mine)
        # A client reads neither another client's updates nor the window closes.
        got = await _received(broker, cli[mine[0]], [topics.updates(other[0]), topics.close], [
            (cli[other[0]], topics.updates(other[0]), _update(other[0])),
            (server, topics.close, codec.encode(WindowClose(1, 0)))])
        assert got == []
        # ... which every aggregator reads; and an aggregator cannot write the global model.
        got = await _received(broker, agg["aggregator-1"], [topics.close, topics.global_model], [
            (server, topics.close, codec.encode(WindowClose(1, 0))),
            (agg["aggregator-0"], topics.global_model, b"forged")])
        assert got == [topics.close]
        # Receipts: the server writes them to an aggregator's receipts topic, which only that
        # aggregator reads (not a client, not the other aggregator); nobody else writes there.
        got = await _received(broker, agg["aggregator-0"], [topics.receipts("aggregator-0")], [
            (cli[mine[0]], topics.receipts("aggregator-0"), b"{}"),
            (agg["aggregator-1"], topics.receipts("aggregator-0"), b"{}"),
            (server, topics.receipts("aggregator-0"), b"{}")])
        assert got == [topics.receipts("aggregator-0")]
        for reader in (cli[mine[0]], agg["aggregator-1"]):
            got = await _received(broker, reader, [topics.receipts("aggregator-0")], [
                (server, topics.receipts("aggregator-0"), b"{}")])
            assert got == []
        # An aggregator passes receipts on under its own prefix only, and a client reads there
        # only its own, from its own aggregator: what aggregator 1 (or another client) writes
        # for aggregator 0's client reaches nobody.
        relayed = topics.relayed_acks("aggregator-0", mine[0])
        got = await _received(broker, cli[mine[0]], [topics.root + "/acks/#"], [
            (agg["aggregator-1"], topics.acks(mine[0]), b"{}"),
            (agg["aggregator-1"], topics.relayed_acks("aggregator-0", mine[0]), b"{}"),
            (agg["aggregator-1"], topics.relayed_acks("aggregator-1", mine[0]), b"{}"),
            (cli[mine[1]], relayed, b"{}"),
            (agg["aggregator-0"], topics.relayed_acks("aggregator-0", mine[1]), b"{}"),
            (agg["aggregator-0"], relayed, b"{}"),
            (server, topics.acks(mine[0]), b"{}")])
        assert sorted(got) == sorted([relayed, topics.acks(mine[0])])

    asyncio.run(scenario())


def test_updates_closes_and_partials_travel_between_the_endpoints(
        broker: LocalMosquitto) -> None:
    secrets = load_secrets(broker.files.secrets_file)
    mine = _clients_of("aggregator-0")

    async def scenario() -> None:
        server = MqttServerEndpoint(broker.server_url(), run=RUN, expected_params=4,
                                    reconnect=FAST, aggregators=AGGREGATORS, ack_interval=0.05)
        aggregators = [MqttAggregatorEndpoint(
            broker.aggregator_url(a), run=RUN, aggregator_id=a, aggregators=AGGREGATORS,
            client_ids=CLIENTS, expected_params=4, reconnect=FAST) for a in AGGREGATORS]
        client = MqttClientEndpoint(broker.client_url(mine[0]), run=RUN, client_id=mine[0],
                                    expected_params=4, reconnect=FAST, aggregator="aggregator-0")
        assert secrets.for_aggregator("aggregator-0").username == "fedsim-aggregator-0"
        async with server, aggregators[0], aggregators[1], client:
            assert set(aggregators[0].client_ids) == set(mine)
            # A close reaches both aggregators and tells them the run's incarnation.
            await server.publish(WindowClose(1, 0, 0.0))
            for endpoint in aggregators:
                close = await asyncio.wait_for(endpoint.receive(), 10)
                assert isinstance(close, WindowClose) and close.window == 1
                assert endpoint.incarnation.current == server.incarnation.current
            # The client's update reaches its aggregator (stamped "" before its welcome: the
            # aggregator accepts the incarnation it follows only, so the client learns it).
            await asyncio.wait_for(_welcomed(client), 10)
            await client.publish(ClientUpdate(mine[0], 0, 0, np.zeros(4, np.float32), 8.0))
            update = await asyncio.wait_for(aggregators[0].receive(), 10)
            assert isinstance(update, ClientUpdate) and update.client_id == mine[0]
            # A forwarded update and a partial reach the server, which acknowledges what they
            # name once recorded; a forged partial (another aggregator's id) is denied.
            await aggregators[0].publish(update)
            await aggregators[0].publish(Partial("aggregator-0", 1, (0,),
                                                 (ManifestEntry(mine[0], 1, 0, 1, 1.0),),
                                                 np.zeros(4, np.float32)))
            await aggregators[0].publish(Partial("aggregator-1", 1, (), (),
                                                 np.zeros(0, np.float32)))
            forwarded = await asyncio.wait_for(server.receive(), 10)
            partial = await asyncio.wait_for(server.receive(), 10)
            assert isinstance(forwarded, ClientUpdate) and isinstance(partial, Partial)
            assert server.unacknowledged == 2
            await asyncio.sleep(0.3)
            assert server.stats.denied == 1
            # The server's receipt goes to the client's aggregator, which passes it on.
            sent_before = server.stats.acks_sent
            assert server.acknowledge({(mine[0], 0)}) == 1
            assert await client.flush(10)
            await asyncio.sleep(0.2)  # (the aggregator counts once its publish has returned)
            assert aggregators[0].stats.acks_sent == 1 and aggregators[1].stats.acks_sent == 0
            assert server.stats.acks_sent == sent_before + 1  # one message to aggregator-0
            # The receipt of a round (1, folded in the partial) recorded later comes too; a
            # receipt of another incarnation, or naming a client routed elsewhere, is not
            # passed on.
            await client.publish(ClientUpdate(mine[0], 1, 0, np.zeros(4, np.float32), 8.0))
            await asyncio.wait_for(aggregators[0].receive(), 10)
            assert client.unacknowledged == (1,)
            refused = aggregators[0].stats.rejected, aggregators[0].stats.other_incarnation
            async with aiomqtt.Client(broker.host, broker.port, username=secrets.server.username,
                                      password=secrets.server.password) as forger:
                for incarnation, whom in (("0" * 16, mine[0]), (server.incarnation.current,
                                                                _clients_of("aggregator-1")[0])):
                    await forger.publish(Topics(RUN).receipts("aggregator-0"), json.dumps(
                        {"receipts": {whom: [1]}, "incarnation": incarnation,
                         "lineage": []}).encode())
            await asyncio.sleep(QUIET)
            assert client.unacknowledged == (1,)
            assert (aggregators[0].stats.rejected, aggregators[0].stats.other_incarnation) == (
                refused[0] + 1, refused[1] + 1)
            assert server.acknowledge({(mine[0], 1)}) == 1
            assert await client.flush(10)

    asyncio.run(scenario())


async def _welcomed(client: MqttClientEndpoint) -> None:
    while client.incarnation.current is None:
        await asyncio.sleep(0.05)
