"""The in-process network under a real asyncio loop with millisecond delays.

(The same network under the virtual-time kernel is tested in test_simulated_virtual.py.)
"""

from __future__ import annotations

import asyncio
import math

import numpy as np
import pytest

from fedsim.clock import WallClock
from fedsim.errors import ConfigError, TransportError
from fedsim.protocol.messages import ClientStatus, ClientUpdate, GlobalModel
from fedsim.transports.base import Endpoint
from fedsim.transports.link_model import LinkModel, constant_latency, uniform_latency
from fedsim.transports.simulated import SimulatedNetwork

PARAMS = 16


def update(client_id: str, round_: int, *, params: int = PARAMS) -> ClientUpdate:
    return ClientUpdate(client_id, round_, 0, np.full(params, round_, np.float32), 8.0)


def model(version: int) -> GlobalModel:
    return GlobalModel(version, np.full(PARAMS, version, np.float32))


def network(
    seed: int = 0, *, up: LinkModel | dict | None = None, down: LinkModel | None = None, **kwargs
) -> SimulatedNetwork:
    return SimulatedNetwork(
        WallClock(),
        rng=np.random.default_rng(seed),
        uplink=up if up is not None else LinkModel(),
        downlink=down if down is not None else LinkModel(),
        expected_params=PARAMS,
        **kwargs,
    )


async def drain(endpoint: Endpoint, *, quiet: float = 0.05) -> list:
    """Everything the endpoint receives until nothing arrives for ``quiet`` seconds."""
    received = []
    while True:
        try:
            received.append(await asyncio.wait_for(endpoint.receive(), quiet))
        except TimeoutError:
            return received


def conserved(net: SimulatedNetwork) -> bool:
    for s in (net.stats.uplink, net.stats.downlink):
        if s.sent + s.duplicated != s.delivered + s.dropped + s.rejected + s.lost + s.in_flight:
            return False
    return True


async def test_endpoints_satisfy_the_endpoint_protocol() -> None:
    net = network()
    assert isinstance(net.server_endpoint(), Endpoint)
    assert isinstance(net.client_endpoint("c1"), Endpoint)


async def test_faster_link_arrives_first() -> None:
    net = network(
        up={"slow": LinkModel(constant_latency(0.04)), "fast": LinkModel(constant_latency(0.005))}
    )
    server = net.server_endpoint()
    slow, fast = net.client_endpoint("slow"), net.client_endpoint("fast")
    clock = WallClock()
    await slow.publish(update("slow", 1))
    await fast.publish(update("fast", 1))
    first = await server.receive()
    assert first.client_id == "fast" and clock.now() < 0.04
    second = await server.receive()
    assert second.client_id == "slow" and clock.now() >= 0.039


async def test_random_latency_without_reorder_keeps_send_order() -> None:
    net = network(up=LinkModel(uniform_latency(0.0, 0.02)))
    server, client = net.server_endpoint(), net.client_endpoint("c1")
    for r in range(40):
        await client.publish(update("c1", r))
    rounds = [m.round for m in await drain(server)]
    assert rounds == list(range(40))


async def test_drop_and_duplicate_frequencies_match_the_model() -> None:
    n, p_drop, p_dup = 3000, 0.2, 0.1
    net = network(7, up=LinkModel(drop=p_drop, duplicate=p_dup))
    server, client = net.server_endpoint(), net.client_endpoint("c1")
    for r in range(n):
        await client.publish(update("c1", r))
    received = await drain(server)
    stats = net.stats.uplink
    # Binomial counts within 4 standard deviations of their means.
    assert abs(stats.dropped - n * p_drop) < 4 * math.sqrt(n * p_drop * (1 - p_drop))
    kept = n - stats.dropped
    assert abs(stats.duplicated - kept * p_dup) < 4 * math.sqrt(kept * p_dup * (1 - p_dup))
    assert len(received) == stats.delivered == kept + stats.duplicated
    rounds = [m.round for m in received]
    assert len(set(rounds)) == kept  # every surviving update arrives, copies are extra
    assert conserved(net) and stats.in_flight == 0


async def test_reordered_messages_are_overtaken_by_later_ones() -> None:
    n, p = 400, 0.25
    net = network(3, up=LinkModel(constant_latency(0.005), reorder=p))
    server, client = net.server_endpoint(), net.client_endpoint("c1")
    for r in range(n):
        await client.publish(update("c1", r))
    rounds = [m.round for m in await drain(server)]
    assert sorted(rounds) == list(range(n))
    # Sent together with a constant latency, a held-back message arrives after every in-order
    # one, so it is exactly a message that some later-sent message overtook.
    held_back = [r for i, r in enumerate(rounds) if any(later > r for later in rounds[:i])]
    assert abs(len(held_back) - n * p) < 4 * math.sqrt(n * p * (1 - p))
    in_order = [r for r in rounds if r not in held_back]
    assert in_order == sorted(in_order)


async def test_same_seed_same_sampled_trace_and_different_seed_differs() -> None:
    async def trace(seed: int) -> list[tuple[str, str, str]]:
        net = network(
            seed, up=LinkModel(drop=0.3, duplicate=0.3), down=LinkModel(drop=0.3), record_trace=True
        )
        server = net.server_endpoint()
        clients = [net.client_endpoint(f"c{i}") for i in range(4)]
        for r in range(10):
            for c in clients:
                await c.publish(update(c.client_id, r))
            await server.publish(model(r))
        await drain(server)
        return [(e.direction, e.client_id, e.event) for e in net.trace if e.event != "deliver"]

    first, again, other = await trace(11), await trace(11), await trace(12)
    assert first == again
    assert first != other


async def test_offline_client_neither_sends_nor_receives_and_gets_retained_model_back() -> None:
    net = network()
    server = net.server_endpoint()
    online, away = net.client_endpoint("on"), net.client_endpoint("away")
    net.set_online("away", False)
    await server.publish(model(1))
    await away.publish(update("away", 1))
    await server.publish(model(2))
    assert [m.version for m in await drain(online)] == [1, 2]
    assert await drain(server) == []
    assert net.stats.uplink.lost == 1 and net.stats.downlink.lost == 2
    net.set_online("away", True)
    # On rejoin only the retained (latest) model arrives, as from an MQTT broker.
    assert [m.version for m in await drain(away)] == [2]
    await away.publish(update("away", 2))
    assert [m.round for m in await drain(server)] == [2]
    assert conserved(net)


async def test_going_offline_discards_what_was_not_taken_and_in_flight_messages() -> None:
    net = network(down=LinkModel(constant_latency(0.02)))
    server, client = net.server_endpoint(), net.client_endpoint("c1")
    await server.publish(model(1))
    await asyncio.sleep(0.04)  # delivered, not taken
    await server.publish(model(2))  # in flight
    net.set_online("c1", False)
    await asyncio.sleep(0.04)
    net.set_online("c1", True)
    assert [m.version for m in await drain(client)] == [2]  # only the retained copy
    assert net.stats.downlink.lost == 2 and conserved(net)


async def test_late_joiner_receives_latest_global_model() -> None:
    net = network()
    server = net.server_endpoint()
    for version in (1, 2, 3):
        await server.publish(model(version))
    late = net.client_endpoint("late")
    assert [m.version for m in await drain(late)] == [3]


async def test_client_id_mismatch_and_garbage_are_rejected_and_the_server_goes_on() -> None:
    net = network()
    server, mallory = net.server_endpoint(), net.client_endpoint("mallory")
    await mallory.publish(update("alice", 1))  # forged id
    await mallory.publish(ClientStatus("alice", "done", 1, 0.1, 1e-5))
    mallory.publish_bytes(b"\x00garbage")
    mallory.publish_bytes(b"FSIM" + b"\xff" * 40)
    await mallory.publish(update("mallory", 2, params=PARAMS + 1))  # wrong shape
    await mallory.publish(update("mallory", 3))
    received = await drain(server)
    assert [(m.client_id, m.round) for m in received] == [("mallory", 3)]
    assert net.stats.uplink.rejected == 5 and conserved(net)


async def test_oversized_messages_are_rejected_by_the_receiver() -> None:
    net = network(max_message_bytes=400)
    server, client = net.server_endpoint(), net.client_endpoint("c1")
    await client.publish(update("c1", 1))  # ~250 bytes: fits
    client.publish_bytes(b"FSIM" + b"\0" * 500)  # over the limit: never parsed
    await client.publish(update("c1", 2))
    assert [m.round for m in await drain(server)] == [1, 2]
    assert net.stats.uplink.rejected == 1


async def test_bandwidth_serialises_transfers() -> None:
    params = 25_000  # 100 KB
    net = SimulatedNetwork(
        WallClock(),
        rng=np.random.default_rng(0),
        uplink=LinkModel(bandwidth_bytes_per_s=5e6),
        downlink=LinkModel(),
    )
    server, client = net.server_endpoint(), net.client_endpoint("c1")
    clock = WallClock()
    await client.publish(update("c1", 1, params=params))
    await client.publish(update("c1", 2, params=params))
    await server.receive()
    first_at = clock.now()
    await server.receive()
    second_at = clock.now()
    # 100 KB at 5 MB/s = 20 ms each, the second queued behind the first. Only lower bounds:
    # a loaded machine may run timers late (exact times: test_simulated_virtual.py).
    assert first_at >= 0.019
    assert second_at >= 0.039


async def test_endpoint_roles_close_and_takeover() -> None:
    net = network()
    server, client = net.server_endpoint(), net.client_endpoint("c1")
    with pytest.raises(TransportError, match="GlobalModel only"):
        await server.publish(update("c1", 1))
    with pytest.raises(TransportError, match="ClientUpdate or ClientStatus only"):
        await client.publish(model(1))
    waiter = asyncio.ensure_future(client.receive())
    await asyncio.sleep(0)
    replacement = net.client_endpoint("c1")  # same id again: the old endpoint is taken over
    with pytest.raises(TransportError, match="closed"):
        await waiter
    with pytest.raises(TransportError, match="after close"):
        await client.publish(update("c1", 1))
    await replacement.close()
    await replacement.close()  # idempotent
    with pytest.raises(TransportError, match="closed"):
        await replacement.receive()


def test_bad_link_models_are_config_errors() -> None:
    with pytest.raises(ConfigError, match="drop probability"):
        LinkModel(drop=1.5)
    with pytest.raises(ConfigError, match="bandwidth"):
        LinkModel(bandwidth_bytes_per_s=0)
    with pytest.raises(ConfigError, match="latency"):
        constant_latency(-1)
    net = network(up={"known": LinkModel()})
    with pytest.raises(ConfigError, match="no uplink link model for client 'unknown'"):
        net.client_endpoint("unknown")
    with pytest.raises(ConfigError, match="MQTT topics"):
        net.client_endpoint("a/b")
