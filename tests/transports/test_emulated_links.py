"""A deployed client's emulated scenario links (:mod:`fedsim.transports.emulated`): the same
fates and times as the simulated network gives the same messages, a drop that never reaches
the MQTT outbox, and what is left in flight at the end."""

from __future__ import annotations

import asyncio
from typing import Any

import numpy as np
import pytest

from fedsim.errors import ConfigError, TransportError
from fedsim.protocol.messages import ClientStatus, ClientUpdate, GlobalModel, Message
from fedsim.runtime.simulated.kernel import VirtualClock, run_virtual
from fedsim.transports.emulated import EmulatedLinks
from fedsim.transports.link_model import LinkModel, exponential_latency, uniform_latency
from fedsim.transports.simulated import SimulatedNetwork

PARAMS = 6

LOSSY = LinkModel(latency=exponential_latency(0.3, minimum=0.05), drop=0.2, duplicate=0.15,
                  reorder=0.2, bandwidth_bytes_per_s=4_000.0)


def update(round_index: int, at: float = 0.0) -> ClientUpdate:
    return ClientUpdate("c0", round_index, 0, np.full(PARAMS, 0.5, np.float32), 1.0, at)


def model(version: int) -> GlobalModel:
    return GlobalModel(version, np.zeros(PARAMS, np.float32), float(version))


class Recorder:
    """The endpoint behind the links: what it was given, and when (the clock's time)."""

    def __init__(self, clock: VirtualClock | None = None) -> None:
        self.clock = clock
        self.published: list[tuple[float, int]] = []
        self.released: list[int] = []
        self.kept: list[int] = []  # released to a link that carries it (kept on disk)
        self.inbox: asyncio.Queue[Message] = asyncio.Queue()
        self.closed = False
        self.fail_after: int | None = None

    async def publish(self, message: Message) -> None:
        if self.fail_after is not None and len(self.published) >= self.fail_after:
            raise TransportError("the broker went away")
        assert self.clock is not None
        key = message.round if isinstance(message, ClientUpdate) else -1
        self.published.append((round(self.clock.now(), 9), key))

    async def receive(self) -> Message:
        if self.closed:
            raise TransportError("closed")
        return await self.inbox.get()

    async def close(self) -> None:
        self.closed = True

    def note_released(self, round_index: int) -> None:
        self.released.append(round_index)

    async def release(self, message: ClientUpdate) -> None:
        self.released.append(message.round)
        self.kept.append(message.round)


def _collect(receive: Any, clock: VirtualClock, got: list[tuple[float, int]]) -> asyncio.Task[None]:
    """A task that notes (time, version or round) of every message ``receive`` gives."""

    async def collect() -> None:
        while True:
            message = await receive()
            key = message.version if isinstance(message, GlobalModel) else message.round
            got.append((round(clock.now(), 9), key))

    return asyncio.get_running_loop().create_task(collect())


def _send_times(count: int) -> list[float]:
    rng = np.random.default_rng(7)
    return list(np.cumsum(rng.uniform(0.0, 0.4, count)))


def test_uplink_gives_the_simulated_networks_fates_and_times() -> None:
    """200 updates through the emulated uplink arrive at the endpoint at the times, in the
    order and with the drops and duplicates the simulated network delivers them to its server
    (same link model, same stream of draws)."""
    times = _send_times(200)

    async def emulated(clock: VirtualClock) -> list[tuple[float, int]]:
        inner = Recorder(clock)
        links = EmulatedLinks(inner, uplink=LOSSY, downlink=LinkModel(), clock=clock,
                              uplink_rng=np.random.default_rng(3),
                              downlink_rng=np.random.default_rng(99), client_id="c0")
        for k, at in enumerate(times):
            await clock.sleep(at - clock.now())
            await links.publish(update(k, at))
        assert await links.drain(60.0)
        counts = links.counts()["uplink"]
        assert counts["sent"] == 200 and 0 < counts["dropped"] < 200
        assert counts["duplicated"] > 0 and counts["reordered"] > 0
        assert inner.released == list(range(200))  # every release noted, dropped ones too
        # Kept on disk (released to the endpoint) before the link held it: exactly those the
        # link carries, each once, in release order (a duplicate is the same file).
        assert inner.kept == sorted({key for _, key in inner.published})
        assert len(inner.kept) == 200 - counts["dropped"]
        return inner.published

    async def simulated(clock: VirtualClock) -> list[tuple[float, int]]:
        network = SimulatedNetwork(clock, rng=np.random.default_rng(3), uplink=LOSSY,
                                   downlink=LinkModel(), expected_params=PARAMS)
        server = network.server_endpoint()
        client = network.client_endpoint("c0")
        got: list[tuple[float, int]] = []
        task = _collect(server.receive, clock, got)
        for k, at in enumerate(times):
            await clock.sleep(at - clock.now())
            await client.publish(update(k, at))
        await clock.sleep(60.0)
        task.cancel()
        return got

    expected = run_virtual(simulated)
    assert len(expected) > 100
    assert run_virtual(emulated) == expected


def test_downlink_gives_the_simulated_networks_fates_and_times() -> None:
    """Global models the endpoint delivers reach the actor as the simulated network's
    broadcast reaches one client; anything else passes at once."""
    times = _send_times(120)

    async def emulated(clock: VirtualClock) -> list[tuple[float, int]]:
        inner = Recorder(clock)
        links = EmulatedLinks(inner, uplink=LinkModel(), downlink=LOSSY, clock=clock,
                              uplink_rng=np.random.default_rng(99),
                              downlink_rng=np.random.default_rng(11), client_id="c0")
        got: list[tuple[float, int]] = []
        task = _collect(links.receive, clock, got)
        for k, at in enumerate(times):
            await clock.sleep(at - clock.now())
            inner.inbox.put_nowait(model(k))
        await clock.sleep(60.0)
        task.cancel()
        return got

    async def simulated(clock: VirtualClock) -> list[tuple[float, int]]:
        network = SimulatedNetwork(clock, rng=np.random.default_rng(11), uplink=LinkModel(),
                                   downlink=LOSSY, expected_params=PARAMS)
        server = network.server_endpoint()
        client = network.client_endpoint("c0")
        got: list[tuple[float, int]] = []
        task = _collect(client.receive, clock, got)
        for k, at in enumerate(times):
            await clock.sleep(at - clock.now())
            await server.publish(model(k))
        await clock.sleep(60.0)
        task.cancel()
        return got

    expected = run_virtual(simulated)
    assert 50 < len(expected)
    assert run_virtual(emulated) == expected


def test_a_dropped_update_never_reaches_the_endpoint_and_statuses_go_around() -> None:
    """drop 1: no update reaches the MQTT endpoint (no outbox, no resend), but every update's
    round is noted as released; a status is the deployment's own traffic (a deployed server
    learns from it that a client stopped), handed on at once."""

    async def main(clock: VirtualClock) -> tuple[Recorder, dict[str, Any]]:
        inner = Recorder(clock)
        links = EmulatedLinks(inner, uplink=LinkModel(drop=1.0), downlink=LinkModel(),
                              clock=clock, uplink_rng=np.random.default_rng(0),
                              downlink_rng=np.random.default_rng(1), client_id="c0")
        for k in range(5):
            await links.publish(update(k))
            await links.publish(ClientStatus("c0", "training", k + 1, 0.1, 1e-5, "", 0.0))
        return inner, links.counts()

    inner, counts = run_virtual(main)
    assert inner.published == [(0.0, -1)] * 5  # the statuses alone
    assert inner.released == [0, 1, 2, 3, 4]
    assert counts["uplink"] == {"sent": 5, "dropped": 5, "duplicated": 0, "reordered": 0,
                                "lost_at_close": 0}


def test_a_perfect_link_hands_on_at_once() -> None:
    """Zero latency and no loss: every update reaches the endpoint within the publish call."""

    async def main(clock: VirtualClock) -> list[tuple[float, int]]:
        inner = Recorder(clock)
        links = EmulatedLinks(inner, uplink=LinkModel(), downlink=LinkModel(), clock=clock,
                              uplink_rng=np.random.default_rng(0),
                              downlink_rng=np.random.default_rng(1), client_id="c0")
        for k in range(3):
            await links.publish(update(k))
            assert inner.published[-1] == (0.0, k)
        return inner.published

    assert run_virtual(main) == [(0.0, 0), (0.0, 1), (0.0, 2)]


def test_close_counts_what_is_in_flight_and_closes_the_endpoint() -> None:

    async def main(clock: VirtualClock) -> tuple[Recorder, dict[str, Any], bool]:
        inner = Recorder(clock)
        links = EmulatedLinks(inner, uplink=LinkModel(latency=uniform_latency(5.0, 6.0)),
                              downlink=LinkModel(), clock=clock, uplink_rng=np.random.default_rng(0),
                              downlink_rng=np.random.default_rng(1), client_id="c0")
        for k in range(4):
            await links.publish(update(k))
        drained = await links.drain(0.0)  # a timeout of 0: nothing has arrived yet
        await links.close()
        await clock.sleep(10.0)  # nothing is sent after the close
        with pytest.raises(TransportError):
            await links.publish(update(9))
        with pytest.raises(TransportError):
            await links.receive()
        return inner, links.counts(), drained

    inner, counts, drained = run_virtual(main)
    assert not drained
    assert inner.published == [] and inner.closed
    assert counts["uplink"]["lost_at_close"] == 4


def test_a_delayed_send_that_fails_is_raised_to_the_actor() -> None:

    async def main(clock: VirtualClock) -> None:
        inner = Recorder(clock)
        inner.fail_after = 0
        links = EmulatedLinks(inner, uplink=LinkModel(latency=uniform_latency(1.0, 1.0)),
                              downlink=LinkModel(), clock=clock, uplink_rng=np.random.default_rng(0),
                              downlink_rng=np.random.default_rng(1), client_id="c0")
        await links.publish(update(0))
        await clock.sleep(2.0)
        with pytest.raises(TransportError, match="the broker went away"):
            await links.publish(update(1))

    run_virtual(main)


def test_a_latency_that_draws_nan_is_a_config_error_naming_the_link() -> None:

    async def main(clock: VirtualClock) -> None:
        links = EmulatedLinks(Recorder(clock), uplink=LinkModel(latency=lambda rng: float("nan")),
                              downlink=LinkModel(), clock=clock, uplink_rng=np.random.default_rng(0),
                              downlink_rng=np.random.default_rng(1), client_id="c0")
        with pytest.raises(ConfigError, match="uplink latency of 'c0'"):
            await links.publish(update(0))

    run_virtual(main)


def test_a_status_follows_every_update_sent_before_it_and_is_never_dropped() -> None:
    """A client's final status reaches the endpoint only after its last updates have (an
    attacker's review: a deployed server told that every client stopped ended the run with
    their updates still on the link), and no draw drops or delays it."""

    async def main(clock: VirtualClock) -> list[tuple[float, int]]:
        inner = Recorder(clock)
        links = EmulatedLinks(inner, uplink=LinkModel(latency=uniform_latency(1.0, 2.0),
                                                      reorder=0.5, duplicate=0.5),
                              downlink=LinkModel(), clock=clock,
                              uplink_rng=np.random.default_rng(5),
                              downlink_rng=np.random.default_rng(6), client_id="c0")
        for k in range(6):
            await links.publish(update(k))
        await links.publish(ClientStatus("c0", "budget_exhausted", 6, 1.0, 1e-5, "", 0.0))
        lossy = EmulatedLinks(inner, uplink=LinkModel(drop=1.0, latency=uniform_latency(1, 2)),
                              downlink=LinkModel(), clock=clock,
                              uplink_rng=np.random.default_rng(5),
                              downlink_rng=np.random.default_rng(6), client_id="c0")
        await lossy.publish(ClientStatus("c0", "done", 6, 1.0, 1e-5, "", 0.0))
        return inner.published

    published = run_virtual(main)
    status_at = [t for t, key in published if key == -1]
    updates_at = [t for t, key in published if key >= 0]
    assert len(status_at) == 2 and len(updates_at) >= 6
    assert status_at[0] >= max(updates_at) >= 1.0  # after every update and every copy
    assert status_at[1] == status_at[0]  # the second links drop everything, but no status


def test_stopping_the_links_leaves_the_endpoint_open() -> None:
    """The process stops the links and then waits for the server's receipts on the endpoint
    (an attacker's review: closing it there left every last update unacknowledged)."""

    async def main(clock: VirtualClock) -> tuple[bool, bool]:
        inner = Recorder(clock)
        links = EmulatedLinks(inner, uplink=LinkModel(drop=0.5), downlink=LinkModel(),
                              clock=clock, uplink_rng=np.random.default_rng(0),
                              downlink_rng=np.random.default_rng(1), client_id="c0")
        await links.stop()
        open_after_stop = not inner.closed
        await links.close()
        return open_after_stop, inner.closed

    assert run_virtual(main) == (True, True)


def test_a_failing_downlink_ends_receive_instead_of_hanging() -> None:

    async def main(clock: VirtualClock) -> None:
        inner = Recorder(clock)
        links = EmulatedLinks(inner, uplink=LinkModel(),
                              downlink=LinkModel(latency=lambda rng: float("nan")),
                              clock=clock, uplink_rng=np.random.default_rng(0),
                              downlink_rng=np.random.default_rng(1), client_id="c0")
        inner.inbox.put_nowait(model(1))
        with pytest.raises(TransportError, match="emulated downlink failed"):
            await asyncio.wait_for(links.receive(), 5.0)

    run_virtual(main)
