"""A compressed frame whose wire form its client's group never sends is refused from its
header, before its payload is expanded (an attacker's review of the compression surface).

A sparse frame of 240 bytes (``count: 0``) stands for the model's whole dense vector: decoding
it allocates, zeroes and measures ``4 d`` bytes. The server and an aggregator refused such a
frame (``compression``) only *after* that decode, inside the broker connection's read callback
on the event loop: at 2 M parameters each 240-byte frame cost 0.7 ms of the receiver's CPU
(an 8 MB honest frame, 0.4 ms), so a client flooding them cost the receiver thousands of times
more than it sent. A client of a ``top_k`` group, whose frames are sparse, could do the same
with ``count: 0``: its group's honest frames always keep exactly ``k = max(1, ceil(fraction
d))`` coordinates. Now both are refused before anything is expanded.

No broker: the endpoints' message handlers are called as the read callback calls them.
"""

from __future__ import annotations

import functools
import json
import struct
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

from fedsim.config.compression import QuantiseCompression, TopKCompression
from fedsim.protocol import codec, compression
from fedsim.protocol.messages import ClientUpdate
from fedsim.transports.mqtt import MqttAggregatorEndpoint, MqttServerEndpoint
from fedsim.transports.topics import Topics, aggregator_ids

RUN = "packing-run"
DIM = 20_000
TOP_K = TopKCompression(kind="top_k", fraction=0.01)  # k = 200 of 20,000
QUANTISE = QuantiseCompression(kind="quantise", bits=8)
DENSE, SPARSE, QUANTISED = "dense-000", "topk-000", "quant-000"
COMPRESSIONS = {DENSE: None, SPARSE: TOP_K, QUANTISED: QUANTISE}
CLIENTS = tuple(COMPRESSIONS)
AGGREGATORS = aggregator_ids(1)


def _frame(client: str, round_index: int, *, spec: Any = None, stamp: str = "") -> bytes:
    values = np.random.default_rng(round_index).standard_normal(DIM).astype(np.float32)
    return codec.encode(ClientUpdate(client, round_index, 0, values, 8.0, compression=spec),
                        incarnation=stamp)


def _sparse_frame(client: str, round_index: int, count: int) -> bytes:
    """A sparse frame keeping the first ``count`` coordinates (valid for the codec)."""
    dense = codec.encode(ClientUpdate(client, round_index, 0, np.zeros(DIM, np.float32), 8.0))
    (length,) = struct.unpack_from("<I", dense, 6)
    header = json.loads(dense[codec.PREFIX_BYTES:codec.PREFIX_BYTES + length])
    header["compression"] = {"kind": "sparse", "count": count}
    text = json.dumps(header).encode()
    body = (np.arange(count, dtype="<u4").tobytes() + np.ones(count, dtype="<f4").tobytes())
    return dense[:6] + struct.pack("<I", len(text)) + text + body


@pytest.fixture
def expansions(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Every compressed payload the codec expands, by kind."""
    seen: list[str] = []

    def spy(kind: str, real: Callable[..., np.ndarray]) -> Callable[..., np.ndarray]:
        def expand(*args: Any, **kwargs: Any) -> np.ndarray:
            seen.append(kind)
            return real(*args, **kwargs)
        return expand

    monkeypatch.setattr(compression, "unpack_sparse", spy("sparse", compression.unpack_sparse))
    monkeypatch.setattr(compression, "unpack_quantised",
                        spy("quantised", compression.unpack_quantised))
    return seen


def _server() -> MqttServerEndpoint:
    return MqttServerEndpoint("mqtt://127.0.0.1:1", run=RUN, expected_params=DIM,
                              clients=CLIENTS, compressions=COMPRESSIONS)


def _aggregator() -> MqttAggregatorEndpoint:
    return MqttAggregatorEndpoint("mqtt://127.0.0.1:1", run=RUN, aggregator_id=AGGREGATORS[0],
                                  aggregators=AGGREGATORS, client_ids=CLIENTS,
                                  expected_params=DIM, compressions=COMPRESSIONS)


@pytest.mark.parametrize("make", [_server, _aggregator], ids=["server", "aggregator"])
def test_a_wire_form_the_group_never_sends_is_refused_before_it_is_expanded(
        make: Callable[[], MqttServerEndpoint | MqttAggregatorEndpoint],
        expansions: list[str]) -> None:
    endpoint = make()
    topics = Topics(RUN)
    hostile = [
        (DENSE, _sparse_frame(DENSE, 0, 0)),  # 240 bytes for 80 KB: its group is dense
        (DENSE, _frame(DENSE, 1, spec=TOP_K)),
        (DENSE, _frame(DENSE, 2, spec=QUANTISE)),
        (SPARSE, _frame(SPARSE, 0, spec=QUANTISE)),
        (SPARSE, _sparse_frame(SPARSE, 1, 0)),  # its group keeps exactly 200
        (SPARSE, _sparse_frame(SPARSE, 2, 199)),
        (SPARSE, _sparse_frame(SPARSE, 3, 201)),
        (QUANTISED, _sparse_frame(QUANTISED, 0, 0)),
        (QUANTISED, _frame(QUANTISED, 1)),  # dense: a quantising group sends codes only
    ]
    assert len(hostile[0][1]) < 300
    for client, payload in hostile:
        endpoint._on_message(topics.updates(client), payload)
    assert expansions == []  # nothing of them was decoded beyond its header
    assert endpoint.stats.refused_by_kind == {"compression": len(hostile)}
    assert endpoint.stats.rejected == len(hostile)

    # The forms each group does send still pass, expanded once each.
    stamp = endpoint.incarnation.current or ""  # (a server takes its own run's updates only)
    honest = [(DENSE, _frame(DENSE, 5, stamp=stamp)),
              (SPARSE, _frame(SPARSE, 5, spec=TOP_K, stamp=stamp)),
              (SPARSE, _frame(SPARSE, 6, stamp=stamp)),
              (QUANTISED, _frame(QUANTISED, 5, spec=QUANTISE, stamp=stamp))]
    assert json.loads(honest[1][1][10:10 + struct.unpack_from("<I", honest[1][1], 6)[0]]
                      )["compression"] == {"kind": "sparse", "count": 200}
    for client, payload in honest:
        endpoint._on_message(topics.updates(client), payload)
    assert expansions == ["sparse", "quantised"]
    assert endpoint.stats.refused_by_kind == {"compression": len(hostile)}
    if isinstance(endpoint, MqttAggregatorEndpoint):
        assert len(endpoint._held) == len(honest)  # (held until the incarnation is known)
    else:
        assert endpoint.unacknowledged == len(honest)


@pytest.mark.parametrize("length", [1, 2, 3, 7, 100, 1_001, 6_003])
@pytest.mark.parametrize("fraction", [1e-9, 0.001, 0.01, 0.1, 0.333, 0.49, 0.5, 0.51, 1.0])
def test_every_honest_top_k_frame_passes_the_header_check(length: int, fraction: float) -> None:
    spec = TopKCompression(kind="top_k", fraction=fraction)
    values = np.random.default_rng(length).standard_normal(length).astype(np.float32)
    frame = codec.encode(ClientUpdate("c-000", 0, 0, values, 8.0, compression=spec))
    checked = codec.decode_frame(frame, expected_params=length,
                                 wire_form=functools.partial(compression.wire_form_problem, spec))
    assert checked.packing in compression.packings(spec)
