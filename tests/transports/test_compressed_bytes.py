"""The simulated network puts compressed updates on the wire at their encoded size: counted in
``bytes_sent`` and timed by the bandwidth model."""

from __future__ import annotations

import numpy as np
import pytest

from fedsim.config.compression import QuantiseCompression
from fedsim.protocol import codec
from fedsim.protocol.messages import ClientUpdate
from fedsim.runtime.simulated.kernel import VirtualClock, run_virtual
from fedsim.transports.link_model import LinkModel
from fedsim.transports.simulated import SimulatedNetwork

Q4 = QuantiseCompression(kind="quantise", bits=4)


def _update(x: np.ndarray, spec: QuantiseCompression | None) -> ClientUpdate:
    return ClientUpdate("c-1", 3, 0, x, 16.0, compression=spec)


def _vector(n: int) -> np.ndarray:
    return np.random.default_rng(0).normal(size=n).astype(np.float32)


def test_the_simulated_network_counts_and_times_the_compressed_bytes() -> None:
    """The uplink's ``bytes_sent`` is the encoded frames' size, and the bandwidth model sends
    a 4-bit update in about an eighth of the dense one's time (virtual clock: exact)."""
    x = _vector(25_000)

    async def main(clock: VirtualClock) -> tuple[float, float, int]:
        net = SimulatedNetwork(clock, rng=np.random.default_rng(0),
                               uplink=LinkModel(bandwidth_bytes_per_s=1e6), downlink=LinkModel())
        server, client = net.server_endpoint(), net.client_endpoint("c-1")
        await client.publish(_update(x, None))
        await server.receive()
        dense_at = clock.now()
        await client.publish(_update(x, Q4))
        received = await server.receive()
        assert isinstance(received, ClientUpdate)
        return dense_at, clock.now() - dense_at, net.stats.uplink.bytes_sent

    dense_at, q4_time, sent = run_virtual(main)
    sizes = len(codec.encode(_update(x, None))), len(codec.encode(_update(x, Q4)))
    assert sent == sum(sizes)
    assert dense_at == pytest.approx(sizes[0] / 1e6)
    assert q4_time == pytest.approx(sizes[1] / 1e6)
