"""How many clients one mosquitto and one fedsim server hold with nothing dropped.

A ramp of message-only clients (default 50, 100, 200, 400, 800), each step on a fresh
authenticated mosquitto on 127.0.0.1 (a free port; per-client passwords and the ACL of
:class:`fedsim.transports.broker.LocalMosquitto`). The clients are raw aiomqtt connections in
one separate process, each with its own credentials; every client sends ``--rounds`` encoded
``ClientUpdate`` messages (QoS 1), one per ``--period`` seconds, with a random phase, so the
step offers ``clients / period`` updates per second. The receiver is the deployed server's
endpoint (:class:`fedsim.transports.mqtt.MqttServerEndpoint`: decode, schema, shape, finite
check, client id against topic), acknowledging every 100 updates as the server does after a
window's checkpoint.

A step passes when every ``(client, round)`` arrived (nothing dropped, nothing rejected) within
its time bound; the ramp stops at the first step that does not. Reported per step: updates
sent and received, the share delivered, the connect time of all clients, the end-to-end
latency (publish to receive, p50/p99, same machine clock) and the load average. Loopback
only; bounded in clients, rounds and time.

    python benchmarks/mqtt_load.py [--steps 50,100,200,400,800] [--rounds 5] [--period 2]

writes ``benchmarks/results/mqtt_load.json``.

``--aggregators 2,0`` runs each step through the deployed server actor and K aggregator
processes instead of the bare endpoint (``_mqtt_tier``; issue 26, item 6), clients connecting
500 at a time (3 tries each) against a password file of ``--iterations`` PBKDF2 rounds, and
reports per step what was applied, dropped, each process's CPU per update, latency and memory
(``benchmarks/results/mqtt_load_aggregators.json``). Bounded: ``--bound`` seconds per step,
the server stops once all are applied or after 30 s without progress.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import logging
import os
import platform
import random
import statistics
import subprocess
import sys
import tempfile
import time
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

from _common import commit, rss_mb  # noqa: E402
from _mqtt_tier import Tier, balanced_ids, child_env, summarise  # noqa: E402

CNN_PARAMS = 26_010  # the DP MNIST CNN, as benchmarks/mqtt_ingest.py
RUN = "load"
RESULTS = Path(__file__).parent / "results" / "mqtt_load.json"
ACK_EVERY = 100
_QUIET = logging.getLogger("mqtt_load.clients")
_QUIET.setLevel(logging.CRITICAL)


async def _connect(stack: contextlib.AsyncExitStack, config: dict, client_id: str,
                   password: str, gate: asyncio.Semaphore, tries: int) -> aiomqtt.Client:
    """One client's connection (entered on ``stack``), at most ``tries`` attempts, each
    holding ``gate``."""
    for attempt in range(tries):
        try:
            async with gate:
                return await stack.enter_async_context(aiomqtt.Client(
                    config["host"], config["port"], username=client_id, password=password,
                    timeout=60, logger=_QUIET))
        except aiomqtt.MqttError:
            if attempt == tries - 1:
                raise
    raise AssertionError("unreachable")


async def _clients(config: dict) -> None:
    """The client process: every client connects, then sends its rounds on its own phase."""
    topics = Topics(config["run"])
    delta = np.zeros(CNN_PARAMS, dtype=np.float32)
    rounds, period = config["rounds"], config["period"]
    incarnation = config.get("incarnation", "")
    sent_at: dict[str, list[float]] = {}
    connected = 0
    all_connected = asyncio.Event()
    total = len(config["clients"])
    failures: list[str] = []

    # --aggregators: at most this many connects at once, each tried 3 times (10,000 at once
    # time out behind one another on a loaded machine); unbounded otherwise, as before.
    gate = asyncio.Semaphore(config.get("connect_concurrency") or total)
    tries = 3 if config.get("connect_concurrency") else 1

    async def one(client_id: str, password: str, phase: float) -> None:
        nonlocal connected
        try:
            async with contextlib.AsyncExitStack() as stack:
                client = await _connect(stack, config, client_id, password, gate, tries)
                connected += 1
                if connected == total:
                    all_connected.set()
                await all_connected.wait()
                await asyncio.sleep(phase)
                for round_ in range(rounds):
                    now = time.time()
                    payload = codec.encode(ClientUpdate(client_id, round_, 0, delta, 4.0, now),
                                           incarnation=incarnation)
                    sent_at.setdefault(client_id, []).append(now)
                    await client.publish(topics.updates(client_id), payload, qos=1)
                    await asyncio.sleep(period)
        except aiomqtt.MqttError as exc:
            failures.append(f"{client_id}: {exc}")
            connected += 1
            if connected == total:
                all_connected.set()

    rng = random.Random(0)
    started = time.perf_counter()
    tasks = [asyncio.create_task(one(cid, pw, rng.uniform(0, period)))
             for cid, pw in config["clients"].items()]
    await all_connected.wait()
    print(json.dumps({"connect_seconds": time.perf_counter() - started}), flush=True)
    await asyncio.gather(*tasks)
    if config.get("sent_at"):
        Path(config["sent_at"]).write_text(json.dumps(sent_at))
    print(json.dumps({"failures": failures[:10], "failed": len(failures),
                      "cpu_s": time.process_time(), "rss_mib": rss_mb()}), flush=True)


async def _step(clients: int, rounds: int, period: float, bound: float) -> dict:
    expected = clients * rounds
    with tempfile.TemporaryDirectory() as tmp:
        ids = [f"c{i:04d}" for i in range(clients)]
        with LocalMosquitto(tmp, RUN, ids) as broker:
            config = {"run": broker.run, "host": broker.host, "port": broker.port,
                      "rounds": rounds, "period": period,
                      "clients": {cid: c.password for cid, c in broker.secrets.clients.items()}}
            received: set[tuple[str, int]] = set()
            latencies: list[float] = []
            duplicates = 0
            load_before = os.getloadavg()
            async with MqttServerEndpoint(broker.server_url(), run=broker.run,
                                          expected_params=CNN_PARAMS,
                                          max_message_bytes=codec.max_message_bytes(CNN_PARAMS)
                                          ) as endpoint:
                process = subprocess.Popen([sys.executable, __file__, "--clients-process"],
                                           stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                           text=True)
                assert process.stdin is not None and process.stdout is not None
                process.stdin.write(json.dumps(config))
                process.stdin.close()
                started = time.perf_counter()
                deadline = started + bound
                try:
                    while len(received) < expected and time.perf_counter() < deadline:
                        try:
                            message = await asyncio.wait_for(
                                endpoint.receive(), max(0.1, deadline - time.perf_counter()))
                        except TimeoutError:
                            break
                        assert isinstance(message, ClientUpdate)
                        key = (message.client_id, message.round)
                        if key in received:
                            duplicates += 1
                        received.add(key)
                        latencies.append(time.time() - message.sent_at)
                        if len(received) % ACK_EVERY == 0:
                            endpoint.acknowledge(received)
                    endpoint.acknowledge(received)
                finally:
                    try:
                        await asyncio.to_thread(process.wait, 60)
                    except subprocess.TimeoutExpired:
                        process.kill()
                        process.wait()
                    out = process.stdout.read()
                stats = endpoint.stats
            reports = [json.loads(line) for line in out.splitlines() if line.startswith("{")]
            info = {k: v for r in reports for k, v in r.items()}
            latencies.sort()
            return {
                "clients": clients,
                "offered_updates_per_s": round(clients / period, 1),
                "sent": expected,
                "received": len(received),
                "delivered_share": round(len(received) / expected, 4),
                "dropped": expected - len(received),
                "duplicates": duplicates,
                "rejected": stats.rejected,
                "denied": stats.denied,
                "client_failures": info.get("failed"),
                "connect_seconds": round(info.get("connect_seconds", float("nan")), 2),
                "seconds": round(time.perf_counter() - started, 2),
                "latency_p50_ms": round(1e3 * statistics.median(latencies), 1) if latencies else None,
                "latency_p99_ms": (round(1e3 * latencies[int(0.99 * (len(latencies) - 1))], 1)
                                   if latencies else None),
                "loadavg_before": [round(x, 2) for x in load_before],
                "loadavg_after": [round(x, 2) for x in os.getloadavg()],
            }


def _tier_step(clients: int, aggregators: int, args: argparse.Namespace) -> dict:
    """One step through the deployed server and ``aggregators`` aggregator processes."""
    ids = balanced_ids(clients)
    expected = clients * args.rounds
    with tempfile.TemporaryDirectory() as tmp, \
            LocalMosquitto(tmp, RUN, ids, aggregators=aggregator_ids(aggregators),
                           iterations=args.iterations) as broker, \
            Tier(broker, Path(tmp), aggregators, ids, expected=expected, window=args.window,
                 bound=args.bound, wait=args.wait) as tier:
        load_before = os.getloadavg()
        before = tier.sample()
        sent_file = Path(tmp) / "sent.json"
        config = {"run": broker.run, "host": broker.host, "port": broker.port,
                  "rounds": args.rounds, "period": args.period, "incarnation": tier.incarnation,
                  "sent_at": str(sent_file), "connect_concurrency": 500,
                  "clients": {cid: c.password for cid, c in broker.secrets.clients.items()}}
        process = subprocess.Popen([sys.executable, __file__, "--clients-process"],
                                   stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                                   env=child_env())
        assert process.stdin is not None and process.stdout is not None
        process.stdin.write(json.dumps(config))
        process.stdin.close()
        try:
            outcome, after, nodes = tier.finish()
        finally:
            try:
                process.wait(120)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
        info = {k: v for line in process.stdout.read().splitlines() if line.startswith("{")
                for k, v in json.loads(line).items()}
        sent_at = json.loads(sent_file.read_text()) if sent_file.exists() else {}
    first = min((t for times in sent_at.values() for t in times), default=0.0)
    row = {"clients": clients, "aggregators": aggregators,
           "offered_updates_per_s": round(clients / args.period, 1), "expected": expected,
           **summarise(outcome, sent_at, first, before, after, nodes),
           "client_failures": info.get("failed"),
           "connect_seconds": round(info.get("connect_seconds", float("nan")), 2),
           "load_generator": {"cpu_s": info.get("cpu_s"), "rss_mib": info.get("rss_mib")},
           "loadavg_before": [round(x, 2) for x in load_before],
           "loadavg_after": [round(x, 2) for x in os.getloadavg()]}
    row["dropped"] = expected - row["applied"]
    return row


def _tiers(args: argparse.Namespace) -> int:
    """``--aggregators``: each step with every K, alternating (module docstring)."""
    counts = [int(k) for k in args.aggregators.split(",")]
    steps = []
    for index, clients in enumerate(int(s) for s in args.steps.split(",")):
        order = counts if index % 2 == 0 else counts[::-1]
        for k in order:
            row = _tier_step(clients, k, args)
            print(json.dumps(row), flush=True)
            steps.append(row)
    document = {
        "benchmark": "mqtt_load --aggregators", "commit": commit(),
        "held_with_nothing_dropped": {
            str(k): max((r["clients"] for r in steps if r["aggregators"] == k
                         and not r["dropped"] and not r["client_failures"]), default=0)
            for k in counts},
        "steps": steps, "rounds_per_client": args.rounds, "period_s": args.period,
        "window_s": args.window, "aggregator_wait_s": args.wait,
        "pbkdf2_iterations": args.iterations, "params": CNN_PARAMS,
        "machine": {"cpus": os.cpu_count(), "python": platform.python_version(),
                    "shared": "2 cores shared with other engineers' work (load 5-10 typical)"},
    }
    out = RESULTS.with_name("mqtt_load_aggregators.json")
    out.write_text(json.dumps(document, indent=2) + "\n", encoding="utf-8")
    print(json.dumps(document["held_with_nothing_dropped"]), f"wrote {out}")
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", default="50,100,200,400,800")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--period", type=float, default=2.0)
    parser.add_argument("--bound", type=float, default=120.0, help="seconds per step at most")
    parser.add_argument("--aggregators", default=None,
                        help="e.g. 0,2: each step through the deployed server and K aggregator "
                             "processes (writes mqtt_load_aggregators.json)")
    parser.add_argument("--window", type=float, default=1.0, help="with --aggregators")
    parser.add_argument("--wait", type=float, default=10.0,
                        help="with --aggregators: seconds the server waits for partials")
    parser.add_argument("--iterations", type=int, default=1000,
                        help="with --aggregators: PBKDF2 rounds of the broker's password file "
                             "(login_cost.py: 210,000 cost ~100 ms of broker CPU a login)")
    parser.add_argument("--clients-process", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.clients_process:
        asyncio.run(_clients(json.loads(sys.stdin.read())))
        return 0
    logging.disable(logging.WARNING)
    if args.aggregators is not None:
        return _tiers(args)
    steps = []
    held = 0
    for clients in (int(s) for s in args.steps.split(",")):
        step = asyncio.run(_step(clients, args.rounds, args.period, args.bound))
        print(json.dumps(step), flush=True)
        steps.append(step)
        if step["dropped"] or step["rejected"] or step["client_failures"]:
            break
        held = clients
    result = {
        "held_with_nothing_dropped": held,
        "stopped_at": steps[-1]["clients"] if steps and steps[-1]["clients"] != held else None,
        "steps": steps,
        "rounds_per_client": args.rounds,
        "period_s": args.period,
        "params": CNN_PARAMS,
        "payload_bytes": len(codec.encode(ClientUpdate("c0000", 0, 0, np.zeros(CNN_PARAMS,
                                                                             np.float32), 4.0))),
        "machine": {"cpus": os.cpu_count(), "python": platform.python_version()},
    }
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps(result, indent=2) + "\n", encoding="utf-8")
    print(json.dumps({k: v for k, v in result.items() if k != "steps"}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
