"""The deployed topology that ``mqtt_ingest.py --aggregators`` and ``mqtt_load.py --aggregators``
measure end to end over a real mosquitto on loopback (issue 26, item 6).

Every role is its own process, as deployed, so that each one's CPU time can be read apart
(``/proc/<pid>/stat``: user + system time, not wall time):

* the **server**: :class:`~fedsim.runtime.actors.server.ServerActor` on the wall clock over
  :class:`~fedsim.transports.mqtt.MqttServerEndpoint` (time windows of ``window`` seconds;
  with aggregators it announces each close, waits up to ``wait`` seconds for the partials
  (the scenario's ``aggregators.wait``), checks their manifests and mixes them). A partial that
  comes after its window closed counts as dropped in flight; under a burst an aggregator's
  socket holds a backlog of updates ahead of the close (QoS 0), so the benchmarks wait long
  enough for the backlog rather than count it dropped. It acknowledges what it applied after every window, as the
  deployed server does after its checkpoint, and stops once ``expected`` updates are applied
  (or at its time bound);
* ``K`` **aggregators**: :class:`~fedsim.runtime.actors.aggregator.AggregatorActor` over
  :class:`~fedsim.transports.mqtt.MqttAggregatorEndpoint` (each reads the clients routed to
  it, :func:`~fedsim.transports.topics.aggregator_of`);
* the load generator (the calling benchmark's own process) and mosquitto.

The clients' public values are those of ``aggregator_cpu.py`` (clip 1, sigma 1, batch 64, not
paced); every update is based on version 0 (published by the server's first broadcast, never
stale: no staleness bound), so every update that arrives is applied: with aggregators through a
partial, without them alone. An update's latency is the wall time from its publication (the
load generator's record) to the close of the window that applied it (the server's record);
both processes share the machine's clock. Per run also the spread over windows of how long
the server waited for the partials after a window's end (``partial_wait_s``) and of how late
each window closed after its scheduled end (``close_after_end_s``).

Not imported by fedsim: the benchmarks load it from this directory.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import statistics
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import IO, Any

import _common  # noqa: F401 - first: this checkout's fedsim on sys.path (see _common)
import numpy as np

import fedsim
from fedsim.aggregation import ConstantStepSize, DataSizeWeights
from fedsim.aggregation.policies import TimeWindows
from fedsim.clock import WallClock
from fedsim.logging import configure_logging
from fedsim.protocol import codec
from fedsim.runtime.actors.aggregator import AggregatorActor
from fedsim.runtime.actors.integrity import ClientLimits
from fedsim.runtime.actors.server import ClientInfo, ServerActor
from fedsim.runtime.actors.window_report import WindowReport
from fedsim.transports.broker import LocalMosquitto
from fedsim.transports.mqtt import MqttAggregatorEndpoint, MqttServerEndpoint
from fedsim.transports.topics import aggregator_ids, aggregator_of

PARAMS = 26_010  # the DP MNIST CNN
DELTA_SCALE = 1e-3  # an update's entries: N(0, 1e-3), norm ~0.16, well inside its bound
_TICK = os.sysconf("SC_CLK_TCK")


def client_infos(client_ids: Sequence[str]) -> dict[str, ClientInfo]:
    """The public values the server and the aggregators know of every client."""
    limits = ClientLimits(sampling="poisson", batch_size=64.0, num_samples=600, dim=PARAMS,
                          clip=lambda r: 1.0, sigma=lambda r: 1.0)
    return {c: ClientInfo(600, 0.1, limits=limits) for c in client_ids}


def balanced_ids(count: int, prefix: str = "c") -> list[str]:
    """``count`` client ids, half routed to each of two aggregators (so K = 2 splits the load
    evenly; K = 1 and K = 0 see the same ids)."""
    pair = aggregator_ids(2)
    halves: dict[str, list[str]] = {a: [] for a in pair}
    index = 0
    while min(len(h) for h in halves.values()) < (count + 1) // 2:
        client = f"{prefix}{index:05d}"
        halves[aggregator_of(client, pair)].append(client)
        index += 1
    first, second = halves[pair[0]][: (count + 1) // 2], halves[pair[1]][: count // 2]
    return sorted(first + second)


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of process ``pid`` so far (``/proc/<pid>/stat``, fields 14-15)."""
    with open(f"/proc/{pid}/stat", encoding="ascii") as stat:
        fields = stat.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / _TICK


def rss_mib(pid: int) -> float:
    """Resident set size of process ``pid`` now, in MiB."""
    with open(f"/proc/{pid}/status", encoding="ascii") as status:
        for line in status:
            if line.startswith("VmRSS"):
                return int(line.split()[1]) / 1024
    return float("nan")


def child_env() -> dict[str, str]:
    """The environment for a benchmark's child process: it imports the same fedsim as this one
    (a checkout's, not another editable install's)."""
    return {**os.environ, "PYTHONPATH": str(Path(fedsim.__file__).resolve().parents[1])}


def _read_line(stream: IO[str], what: str) -> dict[str, Any]:
    line = stream.readline()
    if not line:
        raise RuntimeError(f"{what} exited before reporting")
    return json.loads(line)


# -- the server process ------------------------------------------------------------------------
async def _serve(config: dict[str, Any]) -> dict[str, Any]:
    ids = aggregator_ids(config["aggregators"])
    endpoint = MqttServerEndpoint(config["url"], run=config["run"], expected_params=PARAMS,
                                  max_message_bytes=codec.max_message_bytes(PARAMS),
                                  aggregators=ids)
    window = config["window"]
    applied_at: dict[str, list[float]] = {}
    waits: list[float] = []  # per window: seconds waited for the partials after its end
    late: list[float] = []  # per window: seconds its close came after its scheduled end
    totals = {"applied": 0, "received": 0, "rejected": 0, "duplicate": 0, "stale": 0,
              "lost_in_partials": 0, "windows": 0}
    async with endpoint:
        server = ServerActor(clock=WallClock(), endpoint=endpoint,
                             initial_params=np.zeros(PARAMS, np.float32),
                             clients=client_infos(config["clients"]), window=window,
                             strategy=DataSizeWeights(), step_size=ConstantStepSize(1.0),
                             aggregators=ids, aggregator_wait=config["wait"])
        print(json.dumps({"incarnation": endpoint.incarnation.current}), flush=True)
        # Windows start once the aggregators are up: an aggregator whose first close is not
        # the run's first joins "a run in progress" and forwards old-based updates unmixed.
        await asyncio.to_thread(sys.stdin.readline)
        deadline = time.time() + config["bound"]
        progress = [time.time()]

        def on_window(report: WindowReport) -> bool:
            now = time.time()
            for client, _round, _ in report.applied_updates:
                applied_at.setdefault(client, []).append(now)
            totals["applied"] += report.applied
            totals["received"] += report.received
            totals["rejected"] += report.rejected
            totals["duplicate"] += report.duplicate
            totals["stale"] += report.stale
            totals["lost_in_partials"] += report.lost_in_partials
            totals["windows"] += 1
            if report.partial_wait is not None:
                waits.append(report.partial_wait)
            if report.end is not None:
                late.append(report.time - report.end)
            if report.applied:
                progress[0] = now
            endpoint.acknowledge({(c, r) for c, r, _ in report.applied_updates})
            # Done: all applied, the time bound, or nothing new for ``idle`` seconds since
            # the last application (what was sent and never applied counts as dropped).
            return (totals["applied"] >= config["expected"] or now > deadline
                    or (totals["applied"] > 0 and now - progress[0] > config.get("idle", 30.0)))

        await server.run(on_window)
        stats = endpoint.stats.as_dict()
    return {"applied_at": applied_at, "totals": totals, "mqtt": stats,
            "refused": server._rejections.as_dict(), "partial_wait_s": _spread(waits),
            "close_after_end_s": _spread(late)}


def _spread(values: list[float]) -> dict[str, float] | None:
    """p50, p99 and max of per-window seconds (None: no window had any)."""
    if not values:
        return None
    ordered = sorted(values)
    return {"p50": round(statistics.median(ordered), 3),
            "p99": round(ordered[int(0.99 * (len(ordered) - 1))], 3),
            "max": round(ordered[-1], 3)}


def server_main(config_path: str) -> None:
    """The server process: reports its incarnation, serves, reports what it applied, then
    waits for its standard input to close (so its CPU time can be read while it is idle)."""
    configure_logging(level="error")
    config = json.loads(Path(config_path).read_text())
    outcome = asyncio.run(_serve(config))
    Path(config["out"]).write_text(json.dumps(outcome))
    print(json.dumps({"done": outcome["totals"]}), flush=True)
    sys.stdin.read()


# -- an aggregator process ---------------------------------------------------------------------
async def _aggregate(config: dict[str, Any]) -> dict[str, Any]:
    ids = aggregator_ids(config["aggregators"])
    endpoint = MqttAggregatorEndpoint(config["url"], run=config["run"],
                                      aggregator_id=config["id"], aggregators=ids,
                                      client_ids=config["clients"], expected_params=PARAMS,
                                      max_message_bytes=codec.max_message_bytes(PARAMS))
    stop = asyncio.Event()
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
    async with endpoint:
        actor = AggregatorActor(aggregator_id=config["id"], clock=WallClock(), endpoint=endpoint,
                                clients=client_infos(sorted(endpoint.client_ids)), size=PARAMS,
                                strategy=DataSizeWeights(), policy=TimeWindows())
        print(json.dumps({"ready": config["id"], "clients": len(endpoint.client_ids)}),
              flush=True)
        serving = asyncio.ensure_future(actor.run())
        await stop.wait()
        serving.cancel()
        await asyncio.gather(serving, return_exceptions=True)
        return {"folded": actor.folded, "forwarded": actor.forwarded,
                "partials": actor.partials, "mqtt": endpoint.stats.as_dict()}


def aggregator_main(config_path: str) -> None:
    """An aggregator process: reports ready, serves until SIGTERM, reports its counts."""
    configure_logging(level="error")
    outcome = asyncio.run(_aggregate(json.loads(Path(config_path).read_text())))
    print(json.dumps(outcome), flush=True)


# -- the whole topology ------------------------------------------------------------------------
class Tier:
    """A server process and ``aggregators`` aggregator processes on ``broker``, started by
    ``with``; :meth:`sample` reads every process's CPU time; :meth:`finish` waits for the
    server to apply ``expected`` updates and stops the aggregators."""

    def __init__(self, broker: LocalMosquitto, directory: Path, aggregators: int,
                 clients: Sequence[str], *, expected: int, window: float, bound: float,
                 wait: float, idle: float = 30.0) -> None:
        self.broker = broker
        self.directory = directory
        self.aggregators = aggregator_ids(aggregators)
        self.clients = list(clients)
        self.expected = expected
        self.window = window
        self.bound = bound
        self.wait = wait
        self.idle = idle
        self.server: subprocess.Popen[str] | None = None
        self.nodes: list[subprocess.Popen[str]] = []
        self.incarnation = ""

    def _spawn(self, role: str, config: dict[str, Any]) -> subprocess.Popen[str]:
        # Command lines without "aggregator" or "server": others on a shared machine end their
        # own processes by such names (pkill -f), and would end these.
        path = self.directory / f"tier-{role}-{len(self.nodes)}.json"
        path.write_text(json.dumps(config))
        return subprocess.Popen([sys.executable, __file__, role, str(path)], env=child_env(),
                                stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)

    def __enter__(self) -> Tier:
        common = {"run": self.broker.run, "aggregators": len(self.aggregators),
                  "clients": self.clients}
        self.server = self._spawn("head", {
            **common, "url": self.broker.server_url(), "expected": self.expected,
            "window": self.window, "bound": self.bound, "wait": self.wait, "idle": self.idle,
            "out": str(self.directory / "head-out.json")})
        assert self.server.stdout is not None
        self.incarnation = _read_line(self.server.stdout, "the server")["incarnation"]
        for aggregator in self.aggregators:
            self.nodes.append(self._spawn("node", {
                **common, "id": aggregator, "url": self.broker.aggregator_url(aggregator)}))
        for node in self.nodes:
            assert node.stdout is not None
            _read_line(node.stdout, "an aggregator")
        assert self.server.stdin is not None
        self.server.stdin.write("go\n")
        self.server.stdin.flush()
        return self

    def __exit__(self, *exc: object) -> None:
        for process in [*self.nodes, self.server]:
            if process is not None and process.poll() is None:
                process.kill()
                process.wait()

    def pids(self) -> dict[str, int]:
        assert self.server is not None and self.broker.pid is not None
        pids = {"server": self.server.pid, "broker": self.broker.pid}
        pids.update({a: n.pid for a, n in zip(self.aggregators, self.nodes, strict=True)})
        return pids

    def sample(self) -> dict[str, float]:
        return {role: cpu_seconds(pid) for role, pid in self.pids().items()}

    def memory(self) -> dict[str, float]:
        return {role: round(rss_mib(pid), 1) for role, pid in self.pids().items()}

    def finish(self) -> tuple[dict[str, Any], dict[str, float], list[dict[str, Any]]]:
        """Wait for the server's end; (its outcome, every process's CPU seconds then, the
        aggregators' counts)."""
        assert self.server is not None and self.server.stdout is not None
        _read_line(self.server.stdout, "the server")
        cpu, memory = self.sample(), self.memory()
        nodes = []
        for node in self.nodes:
            node.send_signal(signal.SIGTERM)
        for node in self.nodes:
            assert node.stdout is not None
            line = node.stdout.readline()
            # A process that died (on a shared machine, killed by someone else) says so.
            nodes.append(json.loads(line) if line else {"exited": node.wait(30)})
            node.wait(30)
        assert self.server.stdin is not None
        self.server.stdin.close()
        self.server.wait(30)
        outcome = json.loads((self.directory / "head-out.json").read_text())
        outcome["rss_mib"] = memory
        return outcome, cpu, nodes


def summarise(outcome: dict[str, Any], sent_at: dict[str, list[float]], first_sent: float,
              cpu_before: dict[str, float], cpu_after: dict[str, float],
              nodes: list[dict[str, Any]]) -> dict[str, Any]:
    """One measurement: end-to-end rate, CPU per applied update by process, latency, drops."""
    applied_at: dict[str, list[float]] = outcome["applied_at"]
    latencies = sorted(
        a - s for client, times in applied_at.items()
        for a, s in zip(sorted(times), sorted(sent_at.get(client, [])), strict=False))
    applied = outcome["totals"]["applied"]
    last = max((t for times in applied_at.values() for t in times), default=first_sent)
    sent = sum(len(times) for times in sent_at.values())
    per_update = {role: round(1e6 * (cpu_after[role] - cpu_before[role]) / max(applied, 1), 1)
                  for role in cpu_after}
    return {
        "sent": sent,
        "applied": applied,
        "dropped": sent - applied,
        "updates_per_s": round(applied / (last - first_sent), 1) if last > first_sent else None,
        "seconds": round(last - first_sent, 2),
        "cpu_us_per_update": per_update,
        "cpu_seconds": {role: round(cpu_after[role] - cpu_before[role], 2) for role in cpu_after},
        "latency_p50_ms": round(1e3 * statistics.median(latencies), 1) if latencies else None,
        "latency_p99_ms": (round(1e3 * latencies[int(0.99 * (len(latencies) - 1))], 1)
                           if latencies else None),
        "server": outcome["totals"],
        "server_refused": outcome["refused"],
        "partial_wait_s": outcome["partial_wait_s"],
        "close_after_end_s": outcome["close_after_end_s"],
        "server_mqtt": {k: v for k, v in outcome["mqtt"].items() if v},
        "aggregator_processes": [{**n, "mqtt": {k: v for k, v in n.get("mqtt", {}).items() if v}}
                                 for n in nodes],
        "rss_mib": outcome["rss_mib"],
    }


def _main(role: str, config_path: str) -> None:
    """Run ``role``; with ``FEDSIM_TIER_PROFILE=<dir>`` under cProfile, its statistics written
    to ``<dir>/<role>-<pid>.prof`` (where the server's or an aggregator's CPU goes)."""
    body = {"head": server_main, "node": aggregator_main}[role]
    folder = os.environ.get("FEDSIM_TIER_PROFILE")
    if not folder:
        body(config_path)
        return
    import cProfile

    profile = cProfile.Profile()
    try:
        profile.runcall(body, config_path)
    finally:
        Path(folder).mkdir(parents=True, exist_ok=True)
        profile.dump_stats(str(Path(folder) / f"{role}-{os.getpid()}.prof"))


if __name__ == "__main__":
    _main(sys.argv[1], sys.argv[2])
