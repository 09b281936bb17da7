"""The in-process network under the virtual-time kernel: exact times and same seed => same trace."""

from __future__ import annotations

import asyncio

import numpy as np

from fedsim.protocol import codec
from fedsim.protocol.messages import ClientUpdate, GlobalModel
from fedsim.runtime.simulated.kernel import VirtualClock, run_virtual
from fedsim.transports.link_model import (
    LinkModel,
    constant_latency,
    exponential_latency,
    uniform_latency,
)
from fedsim.transports.network_stats import TraceEntry
from fedsim.transports.simulated import SimulatedNetwork

PARAMS = 32


def update(client_id: str, round_: int) -> ClientUpdate:
    return ClientUpdate(client_id, round_, 0, np.full(PARAMS, round_, np.float32), 4.0)


def model(version: int) -> GlobalModel:
    return GlobalModel(version, np.full(PARAMS, version, np.float32))


def make(
    clock: VirtualClock, seed: int, up: LinkModel, down: LinkModel | None = None
) -> SimulatedNetwork:
    return SimulatedNetwork(
        clock,
        rng=np.random.default_rng(seed),
        uplink=up,
        downlink=down or LinkModel(),
        expected_params=PARAMS,
        record_trace=True,
    )


def test_constant_latency_delivers_at_exact_virtual_times() -> None:
    async def main(clock: VirtualClock) -> list[tuple[float, int]]:
        net = make(clock, 0, LinkModel(constant_latency(0.25)))
        server, client = net.server_endpoint(), net.client_endpoint("c1")
        await client.publish(update("c1", 0))
        await clock.sleep(1.0)
        await client.publish(update("c1", 1))
        arrivals = []
        for _ in range(2):
            message = await server.receive()
            arrivals.append((clock.now(), message.round))
        return arrivals

    # The first arrived (at 0.25) while the sender slept; it is taken at 1.0.
    assert run_virtual(main) == [(1.0, 0), (1.25, 1)]


def test_bandwidth_and_latency_add_up_exactly() -> None:
    size = len(codec.encode(update("c1", 0)))
    bandwidth, latency = 1000.0, 0.5

    async def main(clock: VirtualClock) -> list[float]:
        net = make(clock, 0, LinkModel(constant_latency(latency), bandwidth_bytes_per_s=bandwidth))
        server, client = net.server_endpoint(), net.client_endpoint("c1")
        for r in range(3):
            await client.publish(update("c1", r))
        times = []
        for _ in range(3):
            await server.receive()
            times.append(clock.now())
        return times

    times = run_virtual(main)
    expected = [(k + 1) * size / bandwidth + latency for k in range(3)]
    assert np.allclose(times, expected, rtol=0, atol=1e-9)


def test_reorder_holds_a_message_back_by_one_more_latency_draw() -> None:
    latency = 1.0

    async def main(clock: VirtualClock) -> list[tuple[float, int]]:
        net = make(clock, 5, LinkModel(constant_latency(latency), reorder=0.5, duplicate=0.3))
        server, client = net.server_endpoint(), net.client_endpoint("c1")
        for r in range(40):
            await client.publish(update("c1", r))
        arrivals = []
        while len(arrivals) < 40 + net.stats.uplink.duplicated:
            message = await server.receive()
            arrivals.append((clock.now(), message.round))
        return arrivals

    arrivals = run_virtual(main)
    first_copy: dict[int, float] = {}
    for time, round_ in arrivals:
        first_copy.setdefault(round_, time)
    # In-order messages arrive after one latency, held-back ones after two; duplicates of
    # either one latency after their first copy. Nothing else is possible.
    assert set(first_copy.values()) == {1.0, 2.0}
    assert {t for t, _ in arrivals} <= {1.0, 2.0, 3.0}
    in_order = [r for t, r in arrivals if t == 1.0 and first_copy[r] == 1.0]
    assert in_order == sorted(in_order)


def test_random_latency_keeps_fifo_arrival_times() -> None:
    async def main(clock: VirtualClock) -> list[tuple[float, int]]:
        net = make(clock, 9, LinkModel(exponential_latency(0.2)))
        server, client = net.server_endpoint(), net.client_endpoint("c1")
        for r in range(50):
            await client.publish(update("c1", r))
            await clock.sleep(0.01)
        return [(clock.now(), (await server.receive()).round) for _ in range(50)]

    arrivals = run_virtual(main)
    assert [r for _, r in arrivals] == list(range(50))
    assert [t for t, _ in arrivals] == sorted(t for t, _ in arrivals)


def _traced_run(seed: int) -> tuple[tuple[TraceEntry, ...], dict]:
    async def main(clock: VirtualClock) -> tuple[tuple[TraceEntry, ...], dict]:
        net = make(
            clock,
            seed,
            LinkModel(
                exponential_latency(0.05, minimum=0.01), drop=0.1, duplicate=0.1, reorder=0.2
            ),
            LinkModel(uniform_latency(0.01, 0.1), drop=0.1, bandwidth_bytes_per_s=1e4),
        )
        server = net.server_endpoint()
        clients = [net.client_endpoint(f"c{i}") for i in range(5)]
        received: list[tuple[float, str, int]] = []

        async def serve() -> None:
            version = 0
            while True:
                message = await server.receive()
                received.append((clock.now(), message.client_id, message.round))
                if len(received) % 5 == 0:
                    version += 1
                    await server.publish(model(version))

        async def run_client(index: int) -> None:
            endpoint = clients[index]
            for r in range(20):
                await endpoint.publish(update(endpoint.client_id, r))
                await clock.sleep(0.03 * (index + 1))
                if r == 10 and index == 2:
                    net.set_online("c2", False)
                if r == 14 and index == 2:
                    net.set_online("c2", True)

        server_task = asyncio.ensure_future(serve())
        await asyncio.gather(*(run_client(i) for i in range(5)))
        await clock.sleep(5.0)
        server_task.cancel()
        return net.trace, net.stats.as_dict()

    return run_virtual(main)


def test_same_seed_gives_the_same_timed_trace_and_another_seed_does_not() -> None:
    trace, stats = _traced_run(42)
    again, stats_again = _traced_run(42)
    other, _ = _traced_run(43)
    assert trace == again and stats == stats_again
    assert trace != other
    events = {e.event for e in trace}
    assert {"send", "deliver", "drop", "duplicate", "lost"} <= events
    for direction in ("uplink", "downlink"):
        s = stats[direction]
        assert s["in_flight"] == 0
        assert (
            s["sent"] + s["duplicated"] == s["delivered"] + s["dropped"] + s["rejected"] + s["lost"]
        )


def test_next_arrival_to_is_each_clients_own_next_delivery() -> None:
    """The per-client bound the batcher's horizon uses: before a broadcast arrives, each
    client's next delivery time is exactly when its copy arrives; the direction's bound is the
    earliest of them, and nothing is due once all have arrived."""
    names = ("a", "b", "c", "d")

    async def main(clock: VirtualClock) -> tuple[dict, dict, float, dict, float]:
        net = make(clock, 3, LinkModel(), LinkModel(uniform_latency(0.1, 0.5)))
        net.track_arrivals = True
        server = net.server_endpoint()
        clients = {name: net.client_endpoint(name) for name in names}
        await server.publish(model(1))
        bounds = {name: net.next_arrival_to(name) for name in names}
        earliest = net.next_arrival("downlink")
        arrived: dict[str, float] = {}

        async def take(name: str) -> None:
            await clients[name].receive()
            arrived[name] = clock.now()

        await asyncio.gather(*(take(name) for name in names))
        await clock.sleep(0.01)  # a delivery at ``now`` may still be due: step past the last
        after = {name: net.next_arrival_to(name) for name in names}
        return bounds, arrived, earliest, after, net.next_arrival_to("nobody")

    bounds, arrived, earliest, after, unknown = run_virtual(main)
    assert bounds == arrived and len(set(arrived.values())) == len(names)
    assert earliest == min(arrived.values())
    assert all(t == float("inf") for t in after.values()) and unknown == float("inf")


def test_tracked_arrivals_hold_only_what_is_in_flight() -> None:
    """Nobody asks for the downlink bound of a client that stopped training: its delivery
    times must not pile up over a long run (one entry per broadcast per client otherwise)."""
    names = [f"c{k}" for k in range(5)]

    async def main(clock: VirtualClock) -> tuple[int, int]:
        net = make(clock, 4, LinkModel(), LinkModel(constant_latency(0.1)))
        net.track_arrivals = True
        server = net.server_endpoint()
        clients = [net.client_endpoint(name) for name in names]
        for version in range(200):
            await server.publish(model(version))
            for client in clients:
                await client.receive()
            await clock.sleep(0.5)
        return (len(net._arrivals["downlink"]),
                max(len(heap) for heap in net._arrivals_to.values()))

    in_direction, per_client = run_virtual(main)
    assert in_direction <= len(names) and per_client <= 1
