"""How many CNN-sized updates per second the MQTT server endpoint ingests through mosquitto.

Same run, same broker settings, same payloads, two receivers:

* ``ceiling``: a bare aiomqtt subscriber on ``fedsim/<run>/updates/+`` that only counts
  messages (what the broker and aiomqtt deliver at best);
* ``fedsim``: :class:`fedsim.transports.mqtt.MqttServerEndpoint` with everything it does per
  message (decode, header schema, shape against the model, finite check, client id against
  topic) and ``receive()`` by the caller, which acknowledges what it has received every
  ``ACK_EVERY`` updates (as the deployed server does after each window's checkpoint; the
  receipts then go to the clients).

The publishers are a separate process (K raw aiomqtt connections, one per client, QoS 1, at most
20 publishes in flight each) sending encoded ``ClientUpdate`` messages of the DP MNIST CNN's
size (26,010 float32 parameters). Each repetition starts a fresh authenticated mosquitto on
loopback; the two receivers alternate and the medians are reported. The rate is
``(N - 1) / (last arrival - first arrival)`` at the receiver; alongside it, the receiving
process's CPU time per update (``time.process_time``), which depends less on what else the
machine runs, and the median ratio of back-to-back pairs.

    python benchmarks/mqtt_ingest.py            # writes benchmarks/results/mqtt_ingest.json
    python benchmarks/mqtt_ingest.py --quick    # a short check, prints only

``--aggregators 0,1,2`` measures the deployed topology instead (issue 26, item 6; ``_mqtt_tier``):
the server actor and K aggregator processes, ``--clients`` publishers (half routed to each of two
aggregators) sending ``--updates`` updates at full speed, K rotated within each repetition.
Per run: updates applied per second from the first publication to the last application, each
process's CPU per applied update (``/proc/<pid>/stat``), publish-to-application latency,
drops; the summary's ``paired_rate_ratio_to_flat`` compares runs of one repetition. The
publishers all log in before any publishes, and the broker's CPU is read then too, so its CPU
per message is reported apart from its logins (PBKDF2, ~0.1 s of CPU each at the shipped
rounds); ``ceiling_updates_per_s_one_core_per_process`` is the rate the processes' CPU per
update would allow with a core each (the clients elsewhere), the busiest one setting the pace.
Writes ``benchmarks/results/mqtt_ingest_aggregators.json``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import _common  # noqa: F401 - first: this checkout's fedsim on sys.path (see _common)
import aiomqtt
import numpy as np

from fedsim.protocol import codec
from fedsim.protocol.messages import ClientUpdate
from fedsim.transports.broker import LocalMosquitto
from fedsim.transports.mqtt import MqttServerEndpoint
from fedsim.transports.topics import Topics, aggregator_ids

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import commit  # noqa: E402
from _mqtt_tier import (  # noqa: E402
    DELTA_SCALE,
    Tier,
    balanced_ids,
    child_env,
    cpu_seconds,
    summarise,
)

CNN_PARAMS = 26_010
RUN = "bench"
RESULTS = Path(__file__).parent / "results" / "mqtt_ingest.json"
ACK_EVERY = 100  # updates per acknowledged batch: a window's worth at a few hundred per second
# aiomqtt warns about every publish beyond 10 in flight; 20 in flight is the point here.
_QUIET = logging.getLogger("mqtt_ingest.publisher")
_QUIET.setLevel(logging.ERROR)


def _update(client_id: str, round_: int, delta: np.ndarray, incarnation: str,
            sent_at: float = 0.0) -> bytes:
    update = ClientUpdate(client_id, round_, 0, delta, 64.0, sent_at)
    return codec.encode(update, incarnation=incarnation)


async def _publish(config: dict) -> None:
    """Publisher process body: every client publishes its share of the updates at full speed."""
    topics = Topics(config["run"])
    scale = config.get("scale", 1.0)
    delta = (scale * np.random.default_rng(0).standard_normal(CNN_PARAMS)).astype(np.float32)
    sent_at: dict[str, list[float]] = {}
    connected = {"count": 0}
    all_connected, go = asyncio.Event(), asyncio.Event()

    async def one_client(client_id: str, password: str, count: int) -> None:
        async with aiomqtt.Client(
            config["host"],
            config["port"],
            username=client_id,
            password=password,
            max_concurrent_outgoing_calls=20,
            timeout=120,
            logger=_QUIET,
        ) as client:
            topic = topics.updates(client_id)
            connected["count"] += 1
            if connected["count"] == len(config["clients"]):
                all_connected.set()
            await go.wait()  # every client logged in: the broker's logins are behind it

            async def send(round_: int) -> None:
                now = time.time()
                payload = _update(client_id, round_, delta, config["incarnation"], now)
                sent_at.setdefault(client_id, []).append(now)
                await client.publish(topic, payload, qos=1)

            await asyncio.gather(*(send(r) for r in range(count)))

    clients = config["clients"]
    share, extra = divmod(config["updates"], len(clients))
    sending = asyncio.gather(
        *(
            one_client(cid, password, share + (i < extra))
            for i, (cid, password) in enumerate(clients.items())
        )
    )
    await all_connected.wait()
    # The broker's CPU once every publisher has logged in (PBKDF2: ~0.1 s each at the
    # shipped rounds), so its CPU per message can be told from its CPU per login.
    broker_cpu = cpu_seconds(config["broker_pid"]) if config.get("broker_pid") else None
    go.set()
    await sending
    if config.get("sent_at"):
        Path(config["sent_at"]).write_text(json.dumps({"sent_at": sent_at,
                                                       "cpu_s": time.process_time(),
                                                       "broker_cpu_logged_in": broker_cpu}))


def _start_publishers(
    broker: LocalMosquitto, updates: int, incarnation: str, **extra: object
) -> subprocess.Popen[str]:
    config = {
        **extra,
        "run": broker.run,
        "incarnation": incarnation,  # the receiving server's (publishers play its clients)
        "host": broker.host,
        "port": broker.port,
        "updates": updates,
        "clients": {cid: c.password for cid, c in broker.secrets.clients.items()},
    }
    process = subprocess.Popen(
        [sys.executable, __file__, "--publisher"], stdin=subprocess.PIPE, text=True,
        env=child_env(),
    )
    assert process.stdin is not None
    process.stdin.write(json.dumps(config))
    process.stdin.close()
    return process


class _Arrivals:
    """Arrival times at the receiver, and the receiving process's CPU time over the same span."""

    def __init__(self) -> None:
        self.count = 0
        self.first = self.last = 0.0
        self.first_cpu = self.last_cpu = 0.0

    def tick(self) -> None:
        now, cpu = time.perf_counter(), time.process_time()
        if self.count == 0:
            self.first, self.first_cpu = now, cpu
        self.last, self.last_cpu = now, cpu
        self.count += 1

    def result(self) -> tuple[float, float]:
        """(updates/s, receiver CPU microseconds per update)."""
        spans = self.count - 1
        return spans / (self.last - self.first), (self.last_cpu - self.first_cpu) / spans * 1e6


async def _receive_raw(
    broker: LocalMosquitto, updates: int, ready: asyncio.Event, stamp: dict[str, str]
) -> tuple[float, float]:
    arrivals = _Arrivals()
    server = broker.secrets.server
    async with aiomqtt.Client(
        broker.host,
        broker.port,
        username=server.username,
        password=server.password,
        identifier=f"fedsim-{broker.run}-server",
        clean_session=False,
        keepalive=30,
        max_concurrent_outgoing_calls=20,
    ) as client:
        await client.subscribe(Topics(broker.run).all_updates, qos=1)
        ready.set()
        async for _ in client.messages:
            arrivals.tick()
            if arrivals.count == updates:
                break
    return arrivals.result()


async def _receive_fedsim(
    broker: LocalMosquitto, updates: int, ready: asyncio.Event, stamp: dict[str, str]
) -> tuple[float, float]:
    arrivals = _Arrivals()
    async with MqttServerEndpoint(
        broker.server_url(),
        run=broker.run,
        expected_params=CNN_PARAMS,
        max_message_bytes=codec.max_message_bytes(CNN_PARAMS),
    ) as endpoint:
        stamp["incarnation"] = endpoint.incarnation.current
        ready.set()
        recorded: set[tuple[str, int]] = set()
        while arrivals.count < updates:
            message = await endpoint.receive()
            assert isinstance(message, ClientUpdate) and message.delta.shape == (CNN_PARAMS,)
            arrivals.tick()
            recorded.add((message.client_id, message.round))
            if arrivals.count % ACK_EVERY == 0:
                endpoint.acknowledge(recorded)
        endpoint.acknowledge(recorded)
        if endpoint.stats.rejected or endpoint.stats.denied or endpoint.stats.other_incarnation:
            raise RuntimeError(f"updates rejected during the benchmark: {endpoint.stats}")
    return arrivals.result()


async def _one(arm: str, updates: int, publishers: int, timeout: float) -> tuple[float, float]:
    receiver = _receive_raw if arm == "ceiling" else _receive_fedsim
    with tempfile.TemporaryDirectory() as tmp:
        client_ids = [f"pub{i}" for i in range(publishers)]
        with LocalMosquitto(tmp, RUN, client_ids) as broker:
            ready = asyncio.Event()
            stamp = {"incarnation": ""}
            receiving = asyncio.create_task(receiver(broker, updates, ready, stamp))
            await asyncio.wait_for(ready.wait(), 30)
            process = _start_publishers(broker, updates, stamp["incarnation"])
            try:
                measured = await asyncio.wait_for(receiving, timeout)
            finally:
                process.wait(timeout=60)
            if process.returncode != 0:
                raise RuntimeError(f"publisher process exited with {process.returncode}")
            return measured


def _one_tier(aggregators: int, updates: int, clients: int, window: float, wait: float,
              timeout: float) -> dict:
    """One end-to-end measurement with ``aggregators`` aggregator processes (0: flat)."""
    ids = balanced_ids(clients, "pub")
    with tempfile.TemporaryDirectory() as tmp, \
            LocalMosquitto(tmp, RUN, ids, aggregators=aggregator_ids(aggregators)) as broker, \
            Tier(broker, Path(tmp), aggregators, ids, expected=updates, window=window,
                 bound=timeout, wait=wait) as tier:
        before = tier.sample()
        sent_file = Path(tmp) / "sent.json"
        process = _start_publishers(broker, updates, tier.incarnation, scale=DELTA_SCALE,
                                    sent_at=str(sent_file), broker_pid=broker.pid)
        try:
            outcome, after, nodes = tier.finish()
        finally:
            process.wait(timeout=60)
        if process.returncode != 0:
            raise RuntimeError(f"publisher process exited with {process.returncode}")
        published = json.loads(sent_file.read_text())
    sent_at = published["sent_at"]
    first = min(t for times in sent_at.values() for t in times)
    row = {"aggregators": aggregators,
           **summarise(outcome, sent_at, first, before, after, nodes)}
    row["cpu_seconds"]["load_generator"] = round(published["cpu_s"], 2)
    if published.get("broker_cpu_logged_in") is not None:
        # The broker's CPU per update after its logins: what it costs per message.
        row["broker_cpu_us_per_update_after_logins"] = round(
            1e6 * (after["broker"] - published["broker_cpu_logged_in"])
            / max(row["applied"], 1), 1)
    return row


TIER_RESULTS = Path(__file__).parent / "results" / "mqtt_ingest_aggregators.json"


def _ceiling(summary: dict) -> float:
    """Updates/s the deployment would ingest with a core for each process (the clients on
    other machines): every process here is single-threaded, so the one with the most CPU per
    update sets the pace; the broker counted per message, without its logins."""
    costs = [us for role, us in summary["cpu_us_per_update"].items() if role != "broker"]
    costs.append(summary["broker_cpu_us_per_update_after_logins"])
    return round(1e6 / max(costs), 1)


def _summary(rows: list[dict]) -> dict:
    """One K's runs: medians, drops, the waits for partials and the one-core-per-process
    ceiling."""

    def median(pick: Callable[[dict], float]) -> float:
        return round(statistics.median(pick(r) for r in rows), 1)

    roles = rows[0]["cpu_us_per_update"].keys()
    summary = {
        "updates_per_s": median(lambda r: r["updates_per_s"]),
        "cpu_us_per_update": {role: median(lambda r, role=role: r["cpu_us_per_update"][role])
                              for role in roles},
        "latency_p50_ms": median(lambda r: r["latency_p50_ms"]),
        "latency_p99_ms": median(lambda r: r["latency_p99_ms"]),
        "dropped_total": sum(r["dropped"] for r in rows),
    }
    waits = [r["partial_wait_s"] for r in rows if r.get("partial_wait_s")]
    if waits:  # over every run's windows: the longest wait for partials, the median p99
        summary["partial_wait_s"] = {
            "max": max(w["max"] for w in waits),
            "median_p99": round(statistics.median(w["p99"] for w in waits), 3)}
    if all("broker_cpu_us_per_update_after_logins" in r for r in rows):
        summary["broker_cpu_us_per_update_after_logins"] = median(
            lambda r: r["broker_cpu_us_per_update_after_logins"])
        summary["ceiling_updates_per_s_one_core_per_process"] = _ceiling(summary)
    return summary


def _tiers(args: argparse.Namespace) -> int:
    """``--aggregators``: K = each given count, interleaved, end to end (module docstring)."""
    counts = [int(k) for k in args.aggregators.split(",")]
    rows: dict[int, list[dict]] = {k: [] for k in counts}
    for rep in range(args.reps):
        # Rotate the order so a drift in machine load hits every K alike.
        order = counts[rep % len(counts):] + counts[:rep % len(counts)]
        for k in order:
            load = os.getloadavg()[0]
            row = _one_tier(k, args.updates, args.clients, args.window, args.wait, args.timeout)
            row["loadavg_1min_before"] = round(load, 2)
            rows[k].append(row)
            print(f"rep {rep} K={k}: {row['updates_per_s']} updates/s, server "
                  f"{row['cpu_us_per_update']['server']} us CPU/update, p50 "
                  f"{row['latency_p50_ms']} ms, dropped {row['dropped']}, load {load:.1f}",
                  flush=True)

    summary = {str(k): _summary(rows[k]) for k in counts}
    document: dict = {
        "benchmark": "mqtt_ingest --aggregators",
        "commit": commit(),
        "params": CNN_PARAMS,
        "updates_per_measurement": args.updates,
        "clients": args.clients,
        "window_s": args.window,
        "aggregator_wait_s": args.wait,
        "repetitions": args.reps,
        "by_aggregators": summary,
        "runs": {str(k): rows[k] for k in counts},
        "flat_server_cpu_us_per_update_issue_26": 457.9,
        "machine": {"cpus": os.cpu_count(), "python": platform.python_version(),
                    "shared": "2 cores shared with other engineers' work (load 5-10 typical)",
                    "load_average_at_end": [round(x, 2) for x in os.getloadavg()]},
    }
    if 0 in rows:
        flat_server = summary["0"]["cpu_us_per_update"]["server"]
        for k in counts:
            if k == 0:
                continue
            # Each rep ran K and flat back to back: the paired ratio cancels slow load drifts.
            paired = [r["updates_per_s"] / f["updates_per_s"]
                      for r, f in zip(rows[k], rows[0], strict=True)]
            summary[str(k)]["paired_rate_ratio_to_flat"] = [round(x, 3) for x in paired]
            summary[str(k)]["median_rate_ratio_to_flat"] = round(statistics.median(paired), 3)
            summary[str(k)]["server_cpu_share_of_flat_measured"] = round(
                summary[str(k)]["cpu_us_per_update"]["server"] / flat_server, 4)
            summary[str(k)]["server_cpu_share_of_issue_458us"] = round(
                summary[str(k)]["cpu_us_per_update"]["server"] / 457.9, 4)
            ceilings = (summary["0"].get("ceiling_updates_per_s_one_core_per_process"),
                        summary[str(k)].get("ceiling_updates_per_s_one_core_per_process"))
            if None not in ceilings:
                summary[str(k)]["ceiling_ratio_to_flat_one_core_per_process"] = round(
                    ceilings[1] / ceilings[0], 2)
    print(json.dumps(summary, indent=2))
    if not args.quick:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        out = TIER_RESULTS if args.out == RESULTS else args.out
        out.write_text(json.dumps(document, indent=2) + "\n")
        print(f"wrote {out}")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--updates", type=int, default=2000, help="updates per measurement")
    parser.add_argument("--publishers", type=int, default=4, help="publishing client connections")
    parser.add_argument("--reps", type=int, default=7, help="measurements per receiver")
    parser.add_argument("--timeout", type=float, default=300.0)
    parser.add_argument("--quick", action="store_true", help="500 updates, 1 rep, print only")
    parser.add_argument("--out", type=Path, default=RESULTS)
    parser.add_argument("--aggregators", default=None,
                        help="e.g. 0,1,2: end to end through the deployed server and K "
                             "aggregator processes (writes mqtt_ingest_aggregators.json)")
    parser.add_argument("--clients", type=int, default=20,
                        help="publishing clients with --aggregators (half routed to each of 2)")
    parser.add_argument("--window", type=float, default=1.0,
                        help="the server's window in seconds with --aggregators")
    parser.add_argument("--wait", type=float, default=10.0,
                        help="seconds the server waits for partials after a window's end")
    parser.add_argument("--publisher", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.publisher:
        asyncio.run(_publish(json.loads(sys.stdin.read())))
        return 0
    if args.quick:
        args.updates, args.reps = 500, 1
    if args.aggregators is not None:
        return _tiers(args)

    rates: dict[str, list[float]] = {"ceiling": [], "fedsim": []}
    cpu: dict[str, list[float]] = {"ceiling": [], "fedsim": []}

    async def measure() -> None:
        for rep in range(args.reps):
            # Alternate the order so a drift in machine load hits both receivers alike.
            order = ("ceiling", "fedsim") if rep % 2 == 0 else ("fedsim", "ceiling")
            for arm in order:
                rate, cpu_us = await _one(arm, args.updates, args.publishers, args.timeout)
                rates[arm].append(rate)
                cpu[arm].append(cpu_us)
                print(
                    f"rep {rep} {arm:8s} {rate:8.1f} updates/s {cpu_us:7.0f} us CPU/update",
                    flush=True,
                )

    asyncio.run(measure())
    payload_bytes = len(
        _update("pub0", 0, np.zeros(CNN_PARAMS, dtype=np.float32), "")
    )  # the wire size of one update
    ceiling = statistics.median(rates["ceiling"])
    ingest = statistics.median(rates["fedsim"])
    result = {
        "payload_bytes": payload_bytes,
        "updates_per_s": round(ingest, 1),
        "ceiling_per_s": round(ceiling, 1),
        "ratio": round(ingest / ceiling, 3),
        "target_ratio": 0.8,
        "params": CNN_PARAMS,
        "updates_per_measurement": args.updates,
        "publishers": args.publishers,
        "repetitions": args.reps,
        # Each pair ran back to back, so a pair's ratio cancels slow drifts in machine load.
        "paired_ratio_median": round(
            statistics.median(
                f / c for f, c in zip(rates["fedsim"], rates["ceiling"], strict=True)
            ),
            3,
        ),
        "paired_ratios": [
            round(f / c, 3) for f, c in zip(rates["fedsim"], rates["ceiling"], strict=True)
        ],
        "all_updates_per_s": [round(r, 1) for r in rates["fedsim"]],
        "all_ceiling_per_s": [round(r, 1) for r in rates["ceiling"]],
        "receiver_cpu_us_per_update": round(statistics.median(cpu["fedsim"]), 1),
        "ceiling_receiver_cpu_us_per_update": round(statistics.median(cpu["ceiling"]), 1),
        # The receiver's CPU cost per update, ceiling over fedsim: what the endpoint adds per
        # message, much less disturbed than the rates by other processes on a loaded machine.
        "cpu_ratio": round(statistics.median(cpu["ceiling"]) / statistics.median(cpu["fedsim"]), 3),
        "machine": {
            "cpus": os.cpu_count(),
            "load_average_1min": round(os.getloadavg()[0], 2),
            "python": platform.python_version(),
            "aiomqtt": aiomqtt.__version__ if hasattr(aiomqtt, "__version__") else "unknown",
        },
    }
    print(json.dumps(result, indent=2))
    if not args.quick:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(result, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
