"""The simulated network carries actors' messages sealed (issue 24): a run is bit for bit the
run whose every message is encoded to bytes and decoded (``wire_bytes=True``), over lossy
links, through aggregators, with compressed updates and message-only clients; forged bytes are
still decoded in full and refused as before. (A logistic regression: no torch product here
rounds by the address of a received model, which a frame's view moves; docs/SCALE.md.)"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from fedsim.clock import WallClock
from fedsim.protocol import codec, norms
from fedsim.protocol.messages import ClientStatus, ClientUpdate, GlobalModel
from fedsim.runtime.simulated import simulation
from fedsim.transports.link_model import LinkModel
from fedsim.transports.simulated import SimulatedNetwork
from tests.runtime.test_simulation import OUTPUT_FILES, run, scenario


class _BytesNetwork(SimulatedNetwork):
    """The network of a run, encoding every message to bytes."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, wire_bytes=True, **kwargs)


def _outputs(out: Path) -> dict[str, bytes]:
    files = {name: (out / name).read_bytes() for name in OUTPUT_FILES}
    files.update({f"ledgers/{p.name}": p.read_bytes() for p in (out / "ledgers").iterdir()})
    return files


CASES: dict[str, dict[str, Any]] = {
    "lossy": {"network.downlink": {"latency": 0.1, "drop": 0.1, "duplicate": 0.2,
                                   "bandwidth_bytes_per_s": 2000.0}},
    "aggregators": {"aggregators": {"count": 2, "drop": 0.1,
                                    "latency": {"kind": "uniform", "low": 0.0, "high": 0.3},
                                    "wait": 0.2}},
    "compressed": {"clients.groups.0.compression": {"kind": "top_k", "fraction": 0.3},
                   "clients.groups.1.compression": {"kind": "quantise", "bits": 4}},
}


@pytest.mark.parametrize("case", list(CASES))
def test_a_sealed_run_is_the_byte_run(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                      case: str) -> None:
    data = scenario(**CASES[case])
    sealed = run(data, tmp_path / "sealed")
    with monkeypatch.context() as patch:
        patch.setattr(simulation, "SimulatedNetwork", _BytesNetwork)
        encoded = run(data, tmp_path / "bytes")
    assert _outputs(tmp_path / "sealed") == _outputs(tmp_path / "bytes")
    assert sealed.final_params.tobytes() == encoded.final_params.tobytes()
    assert sealed.summary["network"] == encoded.summary["network"]
    network = sealed.summary["network"]
    assert network["uplink"]["bytes_sent"] > 0 and network["uplink"]["delivered"] > 0
    if case == "aggregators":
        assert network["aggregators"]["uplink"]["delivered"] > 0
    assert sealed.summary["updates"]["applied"] > 0


def test_a_message_only_run_is_the_byte_run(tmp_path: Path,
                                            monkeypatch: pytest.MonkeyPatch) -> None:
    data = scenario(**CASES["lossy"])
    run(data, tmp_path / "sealed", message_only=True)
    with monkeypatch.context() as patch:
        patch.setattr(simulation, "SimulatedNetwork", _BytesNetwork)
        run(data, tmp_path / "bytes", message_only=True)
    assert _outputs(tmp_path / "sealed") == _outputs(tmp_path / "bytes")


@pytest.mark.parametrize("wire_bytes", [False, True], ids=["sealed", "bytes"])
async def test_refusals_and_sizes_are_the_same_on_both_paths(wire_bytes: bool) -> None:
    """What each path delivers, refuses and counts, message by message, against the frames'
    own sizes and the receiver's own decode."""
    net = SimulatedNetwork(WallClock(), rng=np.random.default_rng(5), uplink=LinkModel(),
                           downlink=LinkModel(), expected_params=4, record_trace=True,
                           max_message_bytes=codec.max_message_bytes(4), wire_bytes=wire_bytes)
    server = net.server_endpoint()
    client = net.client_endpoint("c-1")
    messages = [
        ClientUpdate("c-1", 0, 0, np.arange(4, dtype=np.float32), 2.0, 0.5),
        ClientUpdate("c-2", 1, 0, np.ones(4, np.float32), 2.0, 0.5),  # not its sender
        ClientUpdate("c-1", 2, 0, np.ones(5, np.float32), 2.0, 0.5),  # the wrong length
        ClientStatus("c-1", "done", 3, 1.0, 1e-5, "", 0.5, {"loss": 0.25}),
    ]
    frames = [codec.encode(m) for m in messages]
    for message in messages:
        await client.publish(message)
    client.publish_bytes(frames[0][:-1])  # truncated bytes: decoded in full, refused
    await server.publish(GlobalModel(1, np.full(4, 0.5, np.float32), 0.5))
    update, status = [await asyncio.wait_for(server.receive(), 1.0) for _ in range(2)]
    model = await asyncio.wait_for(client.receive(), 1.0)
    assert isinstance(update, ClientUpdate) and update.norm == norms.vector_norm(update.delta)
    assert update.delta.tobytes() == np.arange(4, dtype=np.float32).tobytes()
    assert not update.delta.flags.writeable
    assert isinstance(status, ClientStatus) and status.extra == {"loss": 0.25}
    assert isinstance(model, GlobalModel) and not model.params.flags.writeable
    assert model.params.tobytes() == np.full(4, 0.5, np.float32).tobytes()
    uplink = net.stats.uplink
    assert (uplink.sent, uplink.delivered, uplink.rejected) == (5, 2, 3)
    sizes = [entry.nbytes for entry in net.trace
             if entry.event == "send" and entry.direction == "uplink"]
    assert sizes == [len(f) for f in frames] + [len(frames[0]) - 1]
    assert uplink.bytes_sent == sum(sizes)
    assert net.stats.downlink.bytes_sent == len(codec.encode(
        GlobalModel(1, np.full(4, 0.5, np.float32), 0.5)))
