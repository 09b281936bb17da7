"""The server's CPU per client update with K = 0, 1, 2 aggregation nodes, in one process (issue
26, item 6 in part: no MQTT; the broker's and aiomqtt's share is in mqtt_ingest.py).

Per window every one of ``CLIENTS`` clients sends one update of the DP MNIST CNN's size (26,010
float32 parameters, norm well inside its bound). What is timed (``time.process_time``), window
by window:

* ``K = 0``: the server decoding every update (:func:`fedsim.protocol.codec.decode`, with its
  norm and finite pass) and closing the window (judging each through its client book, mixing);
* ``K >= 1``: each aggregator decoding its share of the updates and flushing its partial
  (judging, pre-mixing, encoding), and, apart, the server decoding the K partials and closing
  the window (checking each manifest entry through its book, the sums' norms, the mix).

The server's time per client update is what the issue's target speaks of (<= 1/10 of the
flat server's); the aggregators' time says what the work moved to.

    python benchmarks/aggregator_cpu.py          # writes benchmarks/results/aggregator_cpu.json
    python benchmarks/aggregator_cpu.py --quick  # a short check, prints only
"""

from __future__ import annotations

import argparse
import asyncio
import os
import platform
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import commit, write_json  # noqa: E402

from fedsim.aggregation import ConstantStepSize, DataSizeWeights  # noqa: E402
from fedsim.aggregation.policies import TimeWindows  # noqa: E402
from fedsim.clock import WallClock  # noqa: E402
from fedsim.logging import configure_logging  # noqa: E402
from fedsim.protocol import codec  # noqa: E402
from fedsim.protocol.messages import ClientUpdate, GlobalModel, Message, WindowClose  # noqa: E402
from fedsim.runtime.actors.aggregator import AggregatorActor, aggregator_ids  # noqa: E402
from fedsim.runtime.actors.integrity import ClientLimits  # noqa: E402
from fedsim.runtime.actors.server import ClientInfo, ServerActor  # noqa: E402

PARAMS = 26_010
RESULTS = Path(__file__).resolve().parent / "results" / "aggregator_cpu.json"


class _Collect:
    """An endpoint that keeps what is published (the benchmark moves messages by hand)."""

    def __init__(self) -> None:
        self.published: list[Message] = []

    async def publish(self, message: Message) -> None:
        self.published.append(message)

    async def receive(self) -> Message:
        raise RuntimeError("the benchmark delivers by hand")

    async def close(self) -> None:
        pass


def _clients(count: int) -> dict[str, ClientInfo]:
    limits = ClientLimits(sampling="poisson", batch_size=64.0, num_samples=600, dim=PARAMS,
                          clip=lambda r: 1.0, sigma=lambda r: 1.0)
    return {f"c{i:04d}": ClientInfo(600, 0.1, limits=limits) for i in range(count)}


async def _run(aggregators: int, clients: int, windows: int) -> dict[str, Any]:
    infos = _clients(clients)
    clock = WallClock()
    server_endpoint = _Collect()
    ids = aggregator_ids(aggregators)
    server = ServerActor(clock=clock, endpoint=server_endpoint,
                         initial_params=np.zeros(PARAMS, np.float32), clients=infos, window=1.0,
                         strategy=DataSizeWeights(), step_size=ConstantStepSize(1.0),
                         aggregators=ids)
    nodes = [AggregatorActor(aggregator_id=i, clock=clock, endpoint=_Collect(), clients=infos,
                             size=PARAMS, strategy=DataSizeWeights(), policy=TimeWindows())
             for i in ids]
    rng = np.random.default_rng(0)
    server_cpu = aggregator_cpu = 0.0
    for window in range(1, windows + 1):
        version = server.version
        server.book.publish(version)
        model = GlobalModel(version, server.params, window=window)
        for node in nodes:
            node._learn(model)
        encoded = [codec.encode(ClientUpdate(cid, window - 1, version,
                                             rng.normal(0, 1e-3, PARAMS).astype(np.float32), 64.0))
                   for cid in infos]
        if not nodes:
            started = time.process_time()
            server._inbox = [codec.decode(data, expected_params=PARAMS) for data in encoded]
            report = server.close_window()
            server_cpu += time.process_time() - started
        else:
            partials = []
            for index, node in enumerate(nodes):
                started = time.process_time()
                for data in encoded[index::len(nodes)]:
                    await node._arrived(codec.decode(data, expected_params=PARAMS))  # type: ignore[arg-type]
                partial = await node.flush(WindowClose(window, version))
                partials.append(codec.encode(partial))
                aggregator_cpu += time.process_time() - started
            started = time.process_time()
            for data in partials:
                server._take_partial(codec.decode(data, expected_params=PARAMS))  # type: ignore[arg-type]
            report = server.close_window()
            server_cpu += time.process_time() - started
        assert report.applied == clients, report
    updates = clients * windows
    return {"aggregators": aggregators, "updates": updates,
            "server_cpu_us_per_update": 1e6 * server_cpu / updates,
            "aggregator_cpu_us_per_update": 1e6 * aggregator_cpu / updates if nodes else None}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args()
    configure_logging(level="warning")
    clients, windows, repeats = (50, 2, 1) if args.quick else (200, 5, 3)
    rows: dict[int, list[dict[str, Any]]] = {0: [], 1: [], 2: []}
    for _ in range(repeats):
        for k in rows:  # alternated, so the machine's load falls on each alike
            rows[k].append(asyncio.run(_run(k, clients, windows)))
    summary = {}
    for k, runs in rows.items():
        summary[str(k)] = {
            "server_cpu_us_per_update": statistics.median(r["server_cpu_us_per_update"] for r in runs),
            "aggregator_cpu_us_per_update": None if k == 0 else statistics.median(
                r["aggregator_cpu_us_per_update"] for r in runs),
            "runs": runs,
        }
    flat = summary["0"]["server_cpu_us_per_update"]
    for k in ("1", "2"):
        summary[k]["server_share_of_flat"] = summary[k]["server_cpu_us_per_update"] / flat
    document = {
        "benchmark": "aggregator_cpu", "commit": commit(), "python": platform.python_version(),
        "machine": f"{platform.machine()}, {os.cpu_count()} CPUs, shared with other work "
                   "(2 cores, up to 8 people at once): CPU times, not wall rates",
        "params": PARAMS, "clients_per_window": clients, "windows": windows,
        "repeats": repeats, "by_aggregators": summary,
    }
    for k, row in summary.items():
        print(f"K={k}: server {row['server_cpu_us_per_update']:.0f} us/update"
              + (f", aggregators {row['aggregator_cpu_us_per_update']:.0f} us/update, "
                 f"server share {row['server_share_of_flat']:.3f}" if k != "0" else ""))
    if not args.quick:
        write_json(RESULTS, document)


if __name__ == "__main__":
    main()
