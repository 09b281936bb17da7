"""The deployed server process: the scenario's :class:`ServerActor` on the wall clock, behind an
MQTT endpoint, with a checkpoint after every window (see :mod:`fedsim.runtime.deployed.deployment` for
the crash-safety contract).

:func:`serve` lays out the output directory, restores the checkpoint if there is one, waits
for the clients, runs the actor with the per-window monitor (metrics line, applied log,
checkpoint, acknowledgements, stop condition) and writes ``server.json``.
"""

from __future__ import annotations

import asyncio
import json
import os
import time as wallclock
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import IO, Any

import structlog

from fedsim.clock import ScaledClock
from fedsim.config.loading import LoadedScenario, dump_scenario
from fedsim.config.schema import Scenario
from fedsim.errors import TransportError
from fedsim.protocol.messages import ClientStatus, GlobalModel, Message, RunFinished
from fedsim.runtime.actors.integrity import window_refusals
from fedsim.runtime.actors.server import ServerActor, ServerSnapshot, WindowReport
from fedsim.runtime.actors.tasks import unless_stopped
from fedsim.runtime.deployed.checkpoint import ServerCheckpoint
from fedsim.runtime.deployed.deployment import message_limit, reconnect_policy, run_name
from fedsim.runtime.deployed.guarantees import require_public_slots
from fedsim.runtime.deployed.options import DeploymentOptions
from fedsim.runtime.population import (
    Population,
    build_population,
    make_evaluator,
    make_server_actor,
)
from fedsim.runtime.run_outputs import (
    APPLIED_FILE,
    FINISHED_STATES,
    METRICS_FILE,
    SCENARIO_FILE,
    SERVER_FILE,
    json_line,
    write_json,
)
from fedsim.transports.mqtt import BrokerSettings, MqttServerEndpoint

__all__ = ["keep_windows_through", "save_and_acknowledge", "serve"]

_log = structlog.get_logger("fedsim.runtime.deployed.server_process")


def save_and_acknowledge(
    server: ServerActor, checkpoint: ServerCheckpoint, endpoint: MqttServerEndpoint
) -> None:
    """Checkpoint the server, then acknowledge the updates that checkpoint records.

    In this order: a receipt lets the client forget its update, so it must never precede the
    durable record. The de-duplication table holds every update the server has judged
    (applied, stale, or outside the window's participants); received updates not in it are
    still waiting for their window and stay unacknowledged."""
    snapshot = server.snapshot()
    checkpoint.save(snapshot)
    endpoint.acknowledge(snapshot.seen)


class _CheckpointBeforeBroadcast:
    """The server's endpoint, writing a checkpoint before every global model leaves, so that
    a restarted server never publishes a version older than one already seen.

    Once the stop condition holds (``stop_reason()`` is not empty), the broadcast that would
    open the next window announces the end of the run instead (:class:`RunFinished`): no
    client starts a round on a model nobody will apply updates to."""

    def __init__(self, inner: MqttServerEndpoint, checkpoint: ServerCheckpoint) -> None:
        self.inner = inner
        self.checkpoint = checkpoint
        self.server: ServerActor | None = None  # set once the actor exists
        self.stop_reason: Callable[[], str] = str  # set once the monitor exists
        self.announced = False

    async def publish(self, message: Message) -> None:
        if isinstance(message, GlobalModel):
            if self.server is None:
                raise TransportError("a global model left before its server was set up")
            save_and_acknowledge(self.server, self.checkpoint, self.inner)
            if self.stop_reason():
                await self.announce_end(message.version, message.sent_at)
                return
        await self.inner.publish(message)

    async def announce_end(self, version: int, time: float) -> None:
        """Tell the clients the run is over (retained), once."""
        if not self.announced:
            self.announced = True
            await self.inner.publish(RunFinished(version, self.stop_reason(), time))

    async def receive(self) -> Message:
        return await self.inner.receive()

    async def close(self) -> None:
        await self.inner.close()


def _write_lines(handle: IO[str], lines: Sequence[Mapping[str, Any]]) -> None:
    for line in lines:
        handle.write(json_line(line))
    handle.flush()
    os.fsync(handle.fileno())


def keep_windows_through(path: Path, windows: int) -> None:
    """Drop the lines of windows after the checkpoint's (a restarted server redoes them) and a
    torn last line from a per-window JSON-lines file; rewritten atomically."""
    if not path.exists():
        return
    kept = []
    for text in path.read_text(encoding="utf-8").splitlines():
        try:
            line = json.loads(text)
        except ValueError:
            continue
        if (
            isinstance(line, dict)
            and isinstance(line.get("window"), int)
            and line["window"] <= windows
        ):
            kept.append(text + "\n")
    temporary = path.with_name(path.name + ".tmp")
    temporary.write_text("".join(kept), encoding="utf-8")
    os.replace(temporary, path)


@dataclass
class _ServerMonitor:
    """The server process's per-window bookkeeping: metrics line, checkpoint, stop condition."""

    scenario: Scenario
    server: ServerActor
    endpoint: MqttServerEndpoint
    checkpoint: ServerCheckpoint
    metrics: IO[str]
    applied: IO[str]
    stop_reason: str = ""
    _refused_seen: dict[str, int] = field(default_factory=dict)
    _missing_reported: int = 0

    def active_clients(self) -> int:
        states = {c: s.state for c, s in self.server.statuses.items()}
        return sum(states.get(c, "waiting") not in FINISHED_STATES for c in self.server.clients)

    def on_window(self, report: WindowReport) -> bool:
        # What the endpoint refused (undecodable, forged, another incarnation) since last time.
        refused, self._refused_seen = window_refusals(self.endpoint.stats, self._refused_seen)
        active = self.active_clients()
        # Released (by the clients' statuses and round numbers) but never received: the change
        # since the last line (a late arrival makes it negative; the sum is the run's total).
        missing = self.server.missing_updates()
        line = report.metrics_line(
            rejected=report.rejected + sum(refused.values()),
            dropped_in_flight=missing - self._missing_reported,
            active_clients=active,
            min_remaining_epsilon=None,  # the ledgers live with the clients
            refused=refused,
        )
        self._missing_reported = missing
        _write_lines(
            self.applied,
            [
                {"window": report.window, "client_id": c, "round": r, "base_version": base}
                for c, r, base in report.applied_updates
            ],
        )
        _write_lines(self.metrics, [line])
        # After the lines: a restart trims lines past the checkpoint's window and redoes them.
        save_and_acknowledge(self.server, self.checkpoint, self.endpoint)
        if report.accuracy is not None:
            _log.info(
                "window",
                **{
                    k: line[k]
                    for k in (
                        "window",
                        "time",
                        "version",
                        "accuracy",
                        "applied",
                        "rejected",
                        "active_clients",
                    )
                },
            )
        self.stop_reason = report.stop_reason(
            self.scenario.stop, active_clients=active, seconds="scenario"
        )
        return bool(self.stop_reason)


async def _wait_for_clients(
    endpoint: MqttServerEndpoint, client_ids: Sequence[str], timeout: float
) -> dict[str, ClientStatus]:
    """The clients' "connected" statuses, waiting up to ``timeout`` wall seconds for all."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    joined: dict[str, ClientStatus] = {}
    while set(client_ids) - set(joined) and loop.time() < deadline:
        try:
            message = await asyncio.wait_for(endpoint.receive(), deadline - loop.time())
        except TimeoutError:
            break
        if isinstance(message, ClientStatus):
            joined[message.client_id] = message
        else:  # computed on a model no server of this run published: nothing to apply it to
            _log.warning("message before the run started dropped", kind=type(message).__name__)
    missing = sorted(set(client_ids) - set(joined))
    if missing:
        _log.warning("starting without every client", missing=missing[:10], count=len(missing))
    else:
        _log.info("every client is connected", clients=len(joined))
    return joined


async def serve(
    loaded: LoadedScenario,
    broker: BrokerSettings,
    *,
    run: str | None = None,
    state_dir: str | Path,
    out_dir: str | Path,
    options: DeploymentOptions = DeploymentOptions(),
    stop: asyncio.Event | None = None,
    population: Population | None = None,
) -> dict[str, Any]:
    """Run the server until the scenario's stop condition (or ``stop`` is set); at the stop
    condition it tells the clients the run is over (:class:`RunFinished`, retained).

    Resumes from ``state_dir``'s checkpoint if there is one; otherwise first waits up to
    ``options.wait_for_clients`` wall seconds until every client has said it is connected.
    Writes ``metrics.jsonl``, ``applied.jsonl``, ``scenario.resolved.yaml`` and ``server.json``
    (the outcome, also returned) to ``out_dir``.
    """
    scenario = loaded.scenario
    require_public_slots(scenario)
    run = run_name(scenario, run)
    started = wallclock.perf_counter()
    population = population or build_population(loaded)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    (out / SCENARIO_FILE).write_text(
        dump_scenario(scenario, dataset_path=population.dataset_path), encoding="utf-8"
    )
    checkpoint = ServerCheckpoint(state_dir, _identity(run, population))
    snapshot = checkpoint.load()
    resumed_from = snapshot.windows_closed if snapshot is not None else None
    for name in (METRICS_FILE, APPLIED_FILE):
        keep_windows_through(out / name, resumed_from or 0)
    outcome: dict[str, Any] = {
        "run": run,
        "resumed_from_window": resumed_from,
        "stop_reason": "",
        "finished": False,
    }
    clock = ScaledClock(options.time_scale, start=snapshot.time if snapshot is not None else 0.0)
    mqtt = MqttServerEndpoint(
        broker,
        run=run,
        expected_params=int(population.initial_params.size),
        max_message_bytes=message_limit(scenario, int(population.initial_params.size)),
        reconnect=reconnect_policy(options),
        seed=scenario.seed,
        lineage=snapshot.incarnations if snapshot is not None else (),
    )
    outcome["incarnation"] = mqtt.incarnation.current
    try:
        with (
            open(out / METRICS_FILE, "a", encoding="utf-8") as metrics,
            open(out / APPLIED_FILE, "a", encoding="utf-8") as applied,
        ):
            async with mqtt:
                joined: dict[str, ClientStatus] = {}
                if snapshot is None and options.wait_for_clients > 0:
                    ids = [p.client_id for p in population.plans]
                    waited, statuses = await unless_stopped(
                        _wait_for_clients(mqtt, ids, options.wait_for_clients), stop
                    )
                    if not waited or statuses is None:
                        outcome["stop_reason"] = "stopped by a signal before the first window"
                        return outcome
                    joined = statuses
                    clock = ScaledClock(options.time_scale)  # scenario time starts with window 1
                server = _server_actor(population, clock, mqtt, checkpoint, snapshot, joined)
                monitor = _ServerMonitor(scenario, server, mqtt, checkpoint, metrics, applied)
                endpoint = server.endpoint
                assert isinstance(endpoint, _CheckpointBeforeBroadcast)
                endpoint.stop_reason = lambda: monitor.stop_reason
                try:
                    finished, _ = await unless_stopped(server.run(monitor.on_window), stop)
                    outcome["finished"] = finished
                    if finished:  # the clients stop at once (a signal leaves room to resume)
                        await endpoint.announce_end(server.version, clock.now())
                        final = server.evaluate_final()  # the model the run ends with
                        outcome["final_evaluation"] = None if final is None else asdict(final)
                    else:
                        monitor.stop_reason = "stopped by a signal"
                finally:
                    outcome.update(_server_outcome(server, monitor.stop_reason, clock))
    finally:
        outcome.update(
            {
                "mqtt": mqtt.stats.as_dict(),
                "checkpoints_written": checkpoint.saves,
                # Received but never judged: arrived after the last window closed.
                "unjudged_updates": mqtt.unacknowledged,
                "wall_seconds": wallclock.perf_counter() - started,
            }
        )
        write_json(out / SERVER_FILE, outcome)
    return outcome


def _identity(run: str, population: Population) -> dict[str, Any]:
    """What a checkpoint must match to be resumed: the same run, scenario, seed and clients."""
    scenario = population.scenario
    return {
        "run": run,
        "scenario": scenario.name,
        "seed": scenario.seed,
        "parameters": int(population.initial_params.size),
        "clients": [p.client_id for p in population.plans],
    }


def _server_actor(
    population: Population,
    clock: ScaledClock,
    mqtt: MqttServerEndpoint,
    checkpoint: ServerCheckpoint,
    snapshot: ServerSnapshot | None,
    joined: Mapping[str, ClientStatus],
) -> ServerActor:
    """The scenario's server actor behind a checkpoint-before-broadcast endpoint, restored from
    ``snapshot`` (and renewed, see :mod:`fedsim.runtime.deployed.deployment`) if there is one."""
    endpoint = _CheckpointBeforeBroadcast(mqtt, checkpoint)
    server = endpoint.server = make_server_actor(
        population, clock=clock, endpoint=endpoint, evaluate=make_evaluator(population)
    )
    for status in joined.values():
        server.accept_status(status)
    if snapshot is not None:
        server.restore(snapshot)
        server.renew_version()
        _log.info(
            "server resumed from checkpoint",
            window=snapshot.windows_closed,
            version=snapshot.version,
            renewed_version=server.version,
            seen=len(snapshot.seen),
        )
    server.incarnations = mqtt.incarnation.all  # kept by every checkpoint
    return server


def _server_outcome(server: ServerActor, stop_reason: str, clock: ScaledClock) -> dict[str, Any]:
    return {
        "stop_reason": stop_reason,
        "final_version": server.version,
        "windows": server.windows_closed,
        "last_accuracy": server.last_accuracy,
        "time": clock.now(),
        "statuses": {c: asdict(s) for c, s in sorted(server.statuses.items())},
        "duplicates_seen_table": len(server.seen),
        "updates_after_end": server.updates_after_end,
    }
