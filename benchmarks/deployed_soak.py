"""Soak a deployed fedsim server at its ingest ceiling over a real mosquitto, sampled every minute.

``python benchmarks/deployed_soak.py [--minutes 30] [--clients 100] [--rate 3000] [--in-flight 32]``

Four processes besides this one, all on 127.0.0.1 and all ended by their PIDs:

* a **mosquitto** with per-client passwords, the ACL and the limits of
  :class:`fedsim.transports.broker.LocalMosquitto` (``max_packet_size`` sized from the model,
  as ``fedsim deploy`` writes it; the queued-message caps of the shipped broker config);
* the **server**: ``fedsim server`` (its CLI entry point, ``--time-scale 1``) for a tiny
  scenario (logistic regression on synthetic data, ``--clients`` clients, one-second time
  windows, the shipped defaults otherwise). Only a timing wrapper is added around
  :meth:`ServerCheckpoint.save` so that each checkpoint's duration reaches this script (the
  server keeps only its last hundred, and says them only at exit);
* **load generators** (``--load-processes``, 2): ``--clients`` MQTT connections in all, each with its own credentials, playing
  the scenario's clients by hand (hello, a "connected" status, then encoded
  :class:`~fedsim.protocol.messages.ClientUpdate` messages within the norm bound, on the newest
  global model, one round after another, QoS 1), together offering ``--rate`` updates per
  second with random phases, each within its public pacing slot. Like a deployed client, each
  holds at most ``--in-flight`` updates unacknowledged and waits for the server's receipts
  (sent once a checkpoint records them) before it sends more: offered above what the server
  acknowledges, the clients are paced by the server, which runs at its ceiling. Like a deployed
  client, each resends what stays unacknowledged (after the deployed client's ``resend_after``,
  then at doubling intervals: the broker may have dropped it, until it is stale by the newest
  model seen) and keeps at most 256 updates (the oldest abandoned beyond).

Every ``--sample`` seconds (60) the script records the server's and the broker's resident set
size (``/proc/<pid>/status``), the checkpoint file's size, the number and the longest of the
checkpoints written since the last sample, the windows closed, updates applied and refused
(``metrics.jsonl``) and the updates offered. The verdict compares the last two thirds of the
run (the last 20 minutes of 30): the RSS slope relative to its mean, the longest checkpoint
against the first minutes', and the spread of the per-minute window and applied rates.

``--trial`` (2 minutes, print only) finds the rate to offer; with a large ``--in-flight`` (clients
that never wait for receipts) it shows what happens above the ceiling. Writes
``benchmarks/results/deployed_soak.json``.

``--overload`` (docs/DEPLOYMENT.md, "Overload") runs two phases of ``--minutes`` each: the
clients paced by receipts (the applied rate is the server's capacity), then the same clients
offering ``--rate`` without waiting for receipts; it reports both applied rates, their ratio,
the overload factor (offered over capacity), the share of what reached the server that it
applied (a collapse drives it to 0; on two shared cores the flooding generators also take CPU
from the server, which lowers the first ratio but not this one) and what was shed, and writes
``benchmarks/results/deployed_soak_overload.json``. The scenario's public slot is made short
enough for ``--rate`` (its clients stay within their pace).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import platform
import random
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import commit, write_json  # noqa: E402

from fedsim.config import limits  # noqa: E402

RESULT = Path(__file__).resolve().parent / "results" / "deployed_soak.json"
OVERLOAD_RESULT = RESULT.with_name("deployed_soak_overload.json")
RUN = "soak"
BATCH = 16
_QUIET = logging.getLogger("deployed_soak.clients")
_QUIET.setLevel(logging.CRITICAL)


def scenario(clients: int, rate: float = 0.0) -> dict[str, Any]:
    """The soak's scenario: tests/deployment/four_clients.yaml with ``clients`` clients, whose
    public slot (speed x batch) leaves room for ``rate`` updates per second among them."""
    speed = min(0.002, clients / max(rate, 1e-9) / BATCH / 1.25)
    return {
        "name": "deployed-soak",
        "seed": 5,
        "stop": {"windows": 1_000_000},  # the soak ends the server with SIGTERM
        "dataset": {"name": "synthetic", "num_samples": 100 * clients, "num_test_samples": 600,
                    "num_features": 10, "num_classes": 3},
        "model": {"name": "logreg"},
        "clients": {"groups": [{
            "name": "c", "count": clients, "data_share": 1.0, "batch_size": BATCH,
            "sampling": "poisson", "clip": 1.0, "noise": 1.0, "local_lr": 0.5,
            "speed": speed,  # 0.002: a public slot of 0.032 s, a client may send 31 updates/s
            "staleness": {"max_versions_behind": 1},
            "budget": {"epsilon": 8.0, "delta": 1.0e-5},
        }]},
        "server": {"window": 1.0, "max_staleness": 3},
    }


# -- the server process ----------------------------------------------------------------------
def _server_process(timings: str, argv: list[str]) -> int:
    """``fedsim server`` with each checkpoint's duration appended to ``timings`` (JSON lines)."""
    from fedsim.cli import main
    from fedsim.runtime.deployed.checkpoint import ServerCheckpoint

    save = ServerCheckpoint.save
    handle = open(timings, "a", encoding="utf-8")  # noqa: SIM115  # open for the process's life

    def timed(self: ServerCheckpoint, snapshot: Any) -> None:
        started = time.perf_counter()
        save(self, snapshot)
        handle.write(json.dumps({"t": time.time(), "s": time.perf_counter() - started}) + "\n")
        handle.flush()

    ServerCheckpoint.save = timed  # type: ignore[method-assign]
    return main(argv)


# -- the load generator process --------------------------------------------------------------
CLIENT_OUTBOX = limits.MAX_UNACKNOWLEDGED
"""Unacknowledged updates a client keeps (``MqttClientEndpoint``'s ``max_unacknowledged``)."""
CONNECTING = 4
"""Connections opened at once: each costs the broker a PBKDF2 password check (the rounds
``fedsim deploy`` writes, :data:`~fedsim.transports.security.PBKDF2_ITERATIONS`)."""


class _Outbox:
    """One client's unacknowledged updates, as a deployed client keeps them
    (:class:`~fedsim.transports.mqtt.MqttClientEndpoint`): at most ``CLIENT_OUTBOX`` (the oldest
    abandoned beyond), each resent after ``resend_after`` seconds, then at doubling intervals,
    until its base version is more than ``max_staleness`` behind the newest model seen."""

    def __init__(self, resend_after: float, max_staleness: int) -> None:
        self.resend_after = resend_after
        self.max_staleness = max_staleness
        self.pending: dict[int, list[Any]] = {}  # round -> [payload, sent at, resends, base]
        self.freed = asyncio.Event()
        self.resent = self.abandoned = self.expired = 0

    def keep(self, round_: int, payload: bytes, base: int) -> None:
        self.pending[round_] = [payload, time.monotonic(), 0, base]
        while len(self.pending) > CLIENT_OUTBOX:
            del self.pending[next(iter(self.pending))]
            self.abandoned += 1

    def acknowledged(self, rounds: Any) -> None:
        for round_ in rounds:
            self.pending.pop(round_, None)
        self.freed.set()

    def due(self, newest: int) -> list[tuple[int, bytes]]:
        from fedsim.transports.mqtt_client import RESEND_BACKOFF_MAX

        now, due = time.monotonic(), []
        for round_, entry in list(self.pending.items()):
            if newest - entry[3] > self.max_staleness:
                del self.pending[round_]
                self.expired += 1
                self.freed.set()
                continue
            if entry[1] <= now - self.resend_after * min(2 ** entry[2], RESEND_BACKOFF_MAX):
                entry[1], entry[2] = now, entry[2] + 1
                due.append((round_, entry[0]))
        return due


class _Load:
    """The clients, played by hand in one process (module docstring)."""

    def __init__(self, config: dict[str, Any]) -> None:
        from fedsim.transports.topics import Topics

        self.config = config
        self.topics = Topics(config["run"])
        self.clients: dict[str, str] = config["clients"]
        self.first = next(iter(self.clients))
        self.period = len(self.clients) / config["rate"]
        self.deadline = float("inf")  # set once every client is connected
        self.incarnation = ""
        self.version = -1
        self.dim = 0
        self.sent = self.errors = self.connected = self.waits = self.resent = 0
        self.all_connected = asyncio.Event()
        self.connecting = asyncio.Semaphore(CONNECTING)
        self.rng = np.random.default_rng(0)

    async def watch(self, mqtt: Any, client_id: str, outbox: _Outbox) -> None:
        """On the first client's connection (the broker takes the username as the MQTT client
        id, so one connection per client): the incarnation and the newest model's version."""
        from fedsim.protocol import codec
        from fedsim.protocol.messages import GlobalModel

        await mqtt.subscribe(self.topics.acks(client_id), qos=1)
        await mqtt.subscribe(self.topics.global_model, qos=1)

        async def hello() -> None:
            while not self.incarnation:
                await mqtt.publish(self.topics.hello(client_id), b"", qos=0)
                await asyncio.sleep(0.5)

        hellos = asyncio.create_task(hello())
        try:
            async for message in mqtt.messages:
                payload = bytes(message.payload)
                if str(message.topic) == self.topics.acks(client_id):
                    receipt = json.loads(payload)
                    self.incarnation = receipt.get("incarnation") or self.incarnation
                    outbox.acknowledged(receipt.get("rounds", ()))
                    continue
                frame = codec.decode_frame(payload)
                if isinstance(frame.message, GlobalModel):
                    self.version = max(self.version, frame.message.version)
                    self.dim = frame.message.params.size
        finally:
            hellos.cancel()

    async def resend(self, mqtt: Any, client_id: str, outbox: _Outbox) -> None:
        """Resend what stays unacknowledged (a broker that dropped it never says so)."""
        while True:
            await asyncio.sleep(outbox.resend_after / 2)
            for _, payload in outbox.due(self.version):
                await mqtt.publish(self.topics.updates(client_id), payload, qos=1)
                outbox.resent += 1
                self.resent += 1

    def _joined(self) -> None:
        self.connected += 1
        if self.connected == len(self.clients):
            self.deadline = time.monotonic() + self.config["seconds"]
            self.all_connected.set()

    async def receipts(self, mqtt: Any, client_id: str, outbox: _Outbox) -> None:
        """Count the rounds the server acknowledges (its checkpoint recorded them)."""
        await mqtt.subscribe(self.topics.acks(client_id), qos=0)
        async for message in mqtt.messages:
            if str(message.topic) == self.topics.acks(client_id):
                outbox.acknowledged(json.loads(bytes(message.payload)).get("rounds", ()))

    async def one(self, client_id: str, password: str, phase: float) -> None:
        """One client: connect, say "connected", then one update every period until the end,
        with at most ``in_flight`` unacknowledged (an honest client holds them for resending)."""
        import aiomqtt

        from fedsim.protocol import codec
        from fedsim.protocol.messages import ClientStatus, ClientUpdate

        try:
            await self.connecting.acquire()
            async with aiomqtt.Client(self.config["host"], self.config["port"],
                                      username=client_id, password=password, timeout=300,
                                      logger=_QUIET) as mqtt:
                self.connecting.release()
                self._joined()
                outbox = _Outbox(self.config["resend_after"], self.config["max_staleness"])
                listener = asyncio.create_task(
                    self.watch(mqtt, client_id, outbox) if client_id == self.first
                    else self.receipts(mqtt, client_id, outbox))
                resender = asyncio.create_task(self.resend(mqtt, client_id, outbox))
                await self.all_connected.wait()
                while not (self.incarnation and self.dim):
                    await asyncio.sleep(0.2)
                status = ClientStatus(client_id, "waiting", 0, 0.0, 1e-5, "connected")
                await mqtt.publish(self.topics.status(client_id),
                                   codec.encode(status, incarnation=self.incarnation), qos=1)
                await asyncio.sleep(phase)
                next_at, round_ = time.monotonic(), 0
                while time.monotonic() < self.deadline:
                    if len(outbox.pending) >= self.config["in_flight"]:
                        outbox.freed.clear()
                        self.waits += 1
                        await outbox.freed.wait()
                        next_at = time.monotonic()  # no catching up: the pace stays the slot's
                        continue
                    delta = (0.01 * self.rng.standard_normal(self.dim)).astype(np.float32)
                    update = ClientUpdate(client_id, round_, self.version, delta, float(BATCH),
                                          time.time())
                    payload = codec.encode(update, incarnation=self.incarnation)
                    outbox.keep(round_, payload, update.base_version)
                    await mqtt.publish(self.topics.updates(client_id), payload, qos=1)
                    self.sent += 1
                    round_ += 1
                    next_at += self.period
                    await asyncio.sleep(max(0.0, next_at - time.monotonic()))
                listener.cancel()
                resender.cancel()
        except aiomqtt.MqttError:
            self.errors += 1
            self.connecting.release()
            self._joined()

    def report(self, **extra: Any) -> None:
        print(json.dumps({"t": time.time(), "sent": self.sent, "errors": self.errors,
                          "waits_for_receipts": self.waits, "resent": self.resent,
                          "connected": self.connected, "version": self.version, **extra}),
              flush=True)

    async def run(self) -> None:
        async def reports() -> None:
            while True:
                self.report()
                await asyncio.sleep(10)

        rand = random.Random(0)
        reporter = asyncio.create_task(reports())
        started = time.monotonic()
        clients = [asyncio.create_task(self.one(c, p, rand.uniform(0, self.period)))
                   for c, p in self.clients.items()]
        await self.all_connected.wait()
        self.report(connect_seconds=round(time.monotonic() - started, 1))
        await asyncio.gather(*clients)
        reporter.cancel()
        self.report()


# -- sampling --------------------------------------------------------------------------------
def rss_of(pid: int) -> float | None:
    """The resident set size of process ``pid`` in MiB (None once it has exited)."""
    try:
        with open(f"/proc/{pid}/status", encoding="ascii") as status:
            for line in status:
                if line.startswith("VmRSS"):
                    return int(line.split()[1]) / 1024
    except OSError:
        return None
    return None


class _Lines:
    """The JSON lines appended to a file since the last read."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.offset = 0

    def new(self) -> list[dict[str, Any]]:
        if not self.path.exists():
            return []
        with open(self.path, "rb") as handle:
            handle.seek(self.offset)
            data = handle.read()
        complete = data[: data.rfind(b"\n") + 1]
        self.offset += len(complete)
        return [json.loads(t) for t in complete.decode().splitlines() if t.strip()]


def _slope(values: list[float]) -> float:
    """Least-squares slope per sample."""
    x = np.arange(len(values), dtype=float)
    return float(np.polyfit(x, np.asarray(values, dtype=float), 1)[0]) if len(values) > 1 else 0.0


def verdict(series: list[dict[str, Any]], rate_tolerance: float = 0.15,
            rss_tolerance: float = 0.05) -> dict[str, Any]:
    """Flat or not, over the last two thirds of the samples (the first third warms up)."""
    tail = series[len(series) // 3:]
    first = series[: max(1, len(series) // 3)]
    rss = [s["server_rss_mb"] for s in tail]
    broker = [s["broker_rss_mb"] for s in tail]
    windows = [s["windows"] for s in tail]
    applied = [s["applied"] for s in tail]
    ckpt = [s["checkpoint_max_s"] for s in tail if s["checkpoint_max_s"] is not None]
    early = [s["checkpoint_max_s"] for s in first if s["checkpoint_max_s"] is not None]
    span = len(tail)
    rss_drift = _slope(rss) * span / statistics.mean(rss)
    broker_drift = _slope(broker) * span / statistics.mean(broker)
    window_spread = (max(windows) - min(windows)) / statistics.mean(windows)
    applied_cv = statistics.pstdev(applied) / statistics.mean(applied)
    checks = {
        "server_rss_flat": abs(rss_drift) <= rss_tolerance,
        "broker_rss_flat": abs(broker_drift) <= rss_tolerance,
        "window_rate_stable": window_spread <= rate_tolerance,
        "applied_rate_stable": applied_cv <= rate_tolerance,
        "checkpoint_time_flat": bool(ckpt) and bool(early)
        and max(ckpt) <= max(0.05, 3 * statistics.median(early)),
    }
    return {
        "samples_judged": span,
        "server_rss_drift_over_tail": round(rss_drift, 4),
        "broker_rss_drift_over_tail": round(broker_drift, 4),
        "rss_tolerance": rss_tolerance,
        "window_rate_spread": round(window_spread, 4),
        "applied_rate_cv": round(applied_cv, 4),
        "rate_tolerance": rate_tolerance,
        "checkpoint_max_s_tail": max(ckpt) if ckpt else None,
        "checkpoint_max_s_first_third_median": statistics.median(early) if early else None,
        "checks": checks,
        "flat": all(checks.values()),
    }


def _stop(process: subprocess.Popen[Any], sig: int = signal.SIGTERM, wait: float = 60) -> None:
    if process.poll() is None:
        process.send_signal(sig)
        try:
            process.wait(wait)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


class _Soak:
    """The broker, the server and the load generators of one soak, and the samples."""

    def __init__(self, args: argparse.Namespace, root: Path) -> None:
        self.args = args
        self.root = root
        self.seconds = args.minutes * 60
        self.ids = [f"c-{i:03d}" for i in range(args.clients)]
        self.state, self.timings = root / "state", root / "checkpoints.jsonl"
        self.env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])}
        self.processes: list[subprocess.Popen[bytes]] = []
        self.logs: list[Any] = []
        self.series: list[dict[str, Any]] = []
        self.connect_seconds: list[float] = []
        self.load_reports: dict[int, dict[str, Any]] = {}  # each generator's latest

    def _log(self, name: str) -> Any:
        handle = open(self.root / name, "wb")  # noqa: SIM115  # closed by close()
        self.logs.append(handle)
        return handle

    def start_server(self, broker: Any, scenario_file: Path) -> subprocess.Popen[bytes]:
        server = subprocess.Popen(
            [sys.executable, __file__, "--server-process", str(self.timings), "server",
             "--scenario", str(scenario_file), "--broker", broker.server_url(),
             "--run", RUN, "--state", str(self.state), "--time-scale", "1", "--json-logs"],
            env=self.env, stdout=self._log("server.log"), stderr=subprocess.STDOUT)
        self.processes.append(server)
        ready_by = time.monotonic() + 300
        while not (self.state / "server.ckpt").exists():  # up: it closed its first window
            if server.poll() is not None or time.monotonic() > ready_by:
                raise RuntimeError("the server did not start: " + self.server_log())
            time.sleep(0.5)
        return server

    def server_log(self) -> str:
        return (self.root / "server.log").read_text(errors="replace")[-2000:]

    def start_load(self, broker: Any, resend_after: float, max_staleness: int
                   ) -> list[_Lines]:
        """``--load-processes`` generators, each with its share of the clients and the rate;
        returns once every client is connected (the samples start then)."""
        parts = self.args.load_processes
        outputs = []
        for part in range(parts):
            ids = self.ids[part::parts]
            name = f"load{part}.jsonl"
            load = subprocess.Popen([sys.executable, __file__, "--load-process"], env=self.env,
                                    stdin=subprocess.PIPE, stdout=self._log(name))
            self.processes.append(load)
            assert load.stdin is not None
            load.stdin.write(json.dumps({
                "run": RUN, "host": broker.host, "port": broker.port,
                "rate": self.args.rate * len(ids) / len(self.ids),
                "seconds": self.seconds + 2 * self.args.sample,
                "in_flight": self.args.in_flight,
                "resend_after": resend_after,
                "max_staleness": max_staleness,
                "clients": {c: broker.secrets.for_client(c).password for c in ids},
            }).encode())
            load.stdin.close()
            outputs.append(_Lines(self.root / name))
        ready_by = time.monotonic() + 900
        while len(self.connect_seconds) < parts:
            if time.monotonic() > ready_by or any(p.poll() is not None for p in self.processes):
                raise RuntimeError("the clients did not connect: " + self.server_log())
            time.sleep(1)
            for lines in outputs:
                self.connect_seconds += [r["connect_seconds"] for r in lines.new()
                                         if "connect_seconds" in r]
        return outputs

    def sample(self, server: subprocess.Popen[bytes], broker_pid: int, loads: list[_Lines]
               ) -> None:
        """One sample every ``--sample`` seconds for ``--minutes``."""
        metrics, checkpoints = _Lines(self.state / "metrics.jsonl"), _Lines(self.timings)
        metrics.new(), checkpoints.new()  # what came before the clients were all connected
        sent = [0] * len(loads)
        for i, load in enumerate(loads):
            sent[i] = max([0] + [r["sent"] for r in load.new()])
        ckpt = self.state / "server.ckpt"
        started = time.monotonic()
        for index in range(1, int(self.seconds // self.args.sample) + 1):
            time.sleep(max(0.0, started + index * self.args.sample - time.monotonic()))
            if any(p.poll() is not None for p in self.processes):
                raise RuntimeError("a process exited early: " + self.server_log())
            lines, saves = metrics.new(), checkpoints.new()
            before = sum(sent)
            for i, load in enumerate(loads):
                reports = load.new()
                sent[i] = max([sent[i]] + [r["sent"] for r in reports])
                self.load_reports[i] = reports[-1] if reports else self.load_reports.get(i, {})
            self.series.append({
                "t_s": round(time.monotonic() - started),
                "server_rss_mb": rss_of(server.pid),
                "broker_rss_mb": rss_of(broker_pid),
                "checkpoint_bytes": ckpt.stat().st_size if ckpt.exists() else None,
                "checkpoints": len(saves),
                "checkpoint_max_s": round(max(s["s"] for s in saves), 4) if saves else None,
                "windows": len(lines),
                "received": sum(line.get("received", 0) for line in lines),
                "applied": sum(line.get("applied", 0) for line in lines),
                "rejected": sum(line.get("rejected", 0) for line in lines),
                "stale": sum(line.get("stale", 0) for line in lines),
                "shed_on_arrival": sum(line.get("shed", 0) for line in lines),
                "dropped_in_flight": sum(line.get("dropped_in_flight", 0) for line in lines),
                "offered": sum(sent) - before,
                "version": lines[-1].get("version") if lines else None,
                "load_average_1min": round(os.getloadavg()[0], 2),
            })
            print(json.dumps(self.series[-1]), flush=True)

    def close(self) -> None:
        """End the load generators, then the server (SIGTERM: it writes server.json)."""
        for process in self.processes[1:]:
            _stop(process, signal.SIGKILL, 5)
        if self.processes:
            _stop(self.processes[0])
        for handle in self.logs:
            handle.close()


def soak(args: argparse.Namespace) -> dict[str, Any]:
    from fedsim.config import load_scenario
    from fedsim.runtime.deployed.client_process import client_resend_after
    from fedsim.runtime.deployed.deployment import message_limit
    from fedsim.runtime.population import build_population
    from fedsim.transports.broker import LocalMosquitto
    from fedsim.transports.security import packet_limit

    with tempfile.TemporaryDirectory(prefix="deployed-soak-") as tmp:
        root = Path(args.keep or tmp)
        root.mkdir(parents=True, exist_ok=True)
        scenario_file = root / "scenario.yaml"
        scenario_file.write_text(yaml.safe_dump(scenario(args.clients, args.rate)),
                                 encoding="utf-8")
        loaded = load_scenario(scenario_file)
        params = int(build_population(loaded).initial_params.size)
        limit = packet_limit(message_limit(loaded.scenario, params))
        run = _Soak(args, root)
        with LocalMosquitto(root / "broker", RUN, run.ids, max_packet_bytes=limit) as broker:
            assert broker.pid is not None
            try:
                server = run.start_server(broker, scenario_file)
                resend_after = client_resend_after(loaded.scenario, 1.0)
                max_staleness = loaded.scenario.server.max_staleness
                assert max_staleness is not None
                run.sample(server, broker.pid, run.start_load(broker, resend_after, max_staleness))
            finally:
                run.close()
            server_file = run.state / "server.json"
            outcome = json.loads(server_file.read_text()) if server_file.exists() else {}
    return {
        "commit": commit(),
        "what": "a deployed fedsim server (fedsim server, logreg, 1 s time windows) over a real "
                "authenticated mosquitto on loopback, offered updates by hand-played clients "
                "at or above its ingest ceiling; sampled every minute",
        "clients": args.clients,
        "offered_updates_per_s": args.rate,
        "load_processes": args.load_processes,
        "in_flight_per_client": args.in_flight,
        "connect_seconds": run.connect_seconds,
        # Each generator's last report: updates sent, the times a client waited for receipts
        # (it held --in-flight unacknowledged: the server, not the clients, set the pace).
        "load_generators": [run.load_reports.get(i, {}) for i in range(args.load_processes)],
        "minutes": args.minutes,
        "sample_seconds": args.sample,
        "series": run.series,
        "verdict": verdict(run.series) if len(run.series) >= 3 else None,
        "server": {k: outcome.get(k) for k in ("windows", "final_version", "checkpoints_written",
                                               "checkpoint_seconds_max", "mqtt",
                                               "stop_reason", "wall_seconds")},
        "machine": {"cpus": os.cpu_count(), "python": platform.python_version(),
                    "load_average_at_end": [round(v, 2) for v in os.getloadavg()]},
    }


def _rate(result: dict[str, Any], key: str) -> float:
    """Per second, over the samples after the first (the first fills the pipes)."""
    tail = result["series"][1:]
    return sum(s[key] for s in tail) / (len(tail) * result["sample_seconds"])


def overload(args: argparse.Namespace) -> dict[str, Any]:
    """The server's capacity, then the same clients offering ``--rate`` without waiting for
    receipts: applied updates per second in both, and their ratio (docs/DEPLOYMENT.md,
    "Overload"). Each phase is a fresh broker, server and clients, ``--minutes`` long."""
    def phase(name: str, in_flight: int) -> dict[str, Any]:
        keep = args.keep / name if args.keep else None
        return soak(argparse.Namespace(**{**vars(args), "in_flight": in_flight, "keep": keep}))

    paced, flood = phase("paced", args.in_flight), phase("overload", 10**9)
    capacity, applied = _rate(paced, "applied"), _rate(flood, "applied")
    offered, received = _rate(flood, "offered"), _rate(flood, "received")
    return {
        "commit": commit(),
        "what": "applied updates/s of a deployed server (fedsim server, logreg, 1 s windows) "
                "over a real mosquitto on loopback: clients paced by receipts (its capacity), "
                "then the same clients offering --rate without waiting for receipts",
        "clients": args.clients,
        "offered_updates_per_s_nominal": args.rate,
        "minutes_per_phase": args.minutes,
        "sample_seconds": args.sample,
        "capacity_applied_per_s": round(capacity, 1),
        "overload_offered_per_s": round(offered, 1),
        "overload_factor": round(offered / capacity, 2) if capacity else None,
        "overload_applied_per_s": round(applied, 1),
        "applied_ratio": round(applied / capacity, 3) if capacity else None,
        # Of what reached the server in the overload, the share it applied (the rest arrived
        # stale): a collapse drives it to 0, whatever the CPU the load generators leave it.
        "overload_received_per_s": round(received, 1),
        "overload_applied_share_of_received": round(applied / received, 3) if received else None,
        "overload_shed_on_arrival_per_s": round(_rate(flood, "shed_on_arrival"), 1),
        "overload_stale_per_s": round(_rate(flood, "stale"), 1),
        "overload_dropped_in_flight_per_s": round(_rate(flood, "dropped_in_flight"), 1),
        "paced_series": paced["series"],
        "overload_series": flood["series"],
        "server": {"paced": paced["server"], "overload": flood["server"]},
        "machine": {"cpus": os.cpu_count(), "python": platform.python_version(),
                    "load_average_at_end": [round(v, 2) for v in os.getloadavg()]},
    }


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["--server-process"]:
        return _server_process(argv[1], argv[2:])
    if argv[:1] == ["--load-process"]:
        asyncio.run(_Load(json.loads(sys.stdin.read())).run())
        return 0
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--minutes", type=float, default=30.0)
    parser.add_argument("--clients", type=int, default=100)
    parser.add_argument("--rate", type=float, default=3000.0, help="updates offered per second")
    parser.add_argument("--in-flight", type=int, default=32,
                        help="unacknowledged updates a client may hold before it waits")
    parser.add_argument("--load-processes", type=int, default=2,
                        help="processes the clients are spread over")
    parser.add_argument("--sample", type=float, default=60.0, help="seconds between samples")
    parser.add_argument("--trial", action="store_true", help="2 minutes, print only")
    parser.add_argument("--out", type=Path, default=RESULT)
    parser.add_argument("--keep", type=Path, help="work in this (new) directory and keep it")
    parser.add_argument("--overload", action="store_true",
                        help="capacity, then --rate offered without waiting for receipts, "
                             "--minutes each (writes deployed_soak_overload.json)")
    args = parser.parse_args(argv)
    if args.trial:
        args.minutes = 2.0
    if args.overload:
        signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
        outcome = overload(args)
        print(json.dumps({k: v for k, v in outcome.items() if not k.endswith("series")},
                         indent=2))
        if not args.trial:
            write_json(OVERLOAD_RESULT if args.out == RESULT else args.out, outcome)
        return 0
    # SIGTERM ends the soak through its clean-up (the processes it started, by PID).
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    result = soak(args)
    print(json.dumps({k: v for k, v in result.items() if k != "series"}, indent=2))
    if not args.trial:
        write_json(args.out, result)
    return 0 if result["verdict"] is None or result["verdict"]["flat"] else 1


if __name__ == "__main__":
    sys.exit(main())
