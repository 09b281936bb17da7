"""One scenario as separate processes talking through a real MQTT broker.

The server process (:func:`serve`) and each client process (:func:`run_client`) build exactly
the actors the simulator builds (:func:`~fedsim.runtime.simulation.make_server_actor`,
:func:`~fedsim.runtime.simulation.make_client_actor`) from the same seeded
:func:`~fedsim.runtime.simulation.build_population`, so client ``i`` holds the same records and
the same DP posture in both modes; only the clock (:class:`ScaledClock`, wall time) and the
endpoint (:mod:`fedsim.transports.mqtt`) differ. :class:`Launcher` starts a server and all
clients as local processes running the command lines of :func:`process_commands` (what
``docker-compose.yml`` runs in containers), waits for the stop condition and collects the same
run directory as ``fedsim run``.

**Time.** Scenario time quantities (window length, compute speed, on/off periods, the
``virtual_seconds`` stop) are seconds of *scenario time*; here scenario time runs at
``time_scale`` wall seconds per scenario second (1.0: real time; 0.1: ten times faster, for
short test runs). A round lasts the speed model's cost of its expected batch; the real compute
runs inside it and the update leaves at its end (:mod:`fedsim.runtime.exposure`: send times
must not reveal the realised batch), so heterogeneous clients keep their relative speeds. The simulated ``network`` section and
``availability.crashes`` are not emulated: the real broker is the network, real process deaths
are the crashes. On/off ``availability`` periods are emulated by pausing the client.

**Crash safety.** A client's ledger lives in its state directory and is resumed, never reset;
it is fsynced before each update is published (the actor's order), so a SIGKILL cannot forget
a released update. A restarted client continues after its last committed round; every process
draws its batches and noise from OS entropy (in the opt-in, not private, seeded mode: from a
fresh seed stream keyed by that round: replaying the first incarnation's stream would release
the same noise twice). The server writes a checkpoint
(:mod:`fedsim.runtime.checkpoint`) after every window and before every broadcast, so no
version it ever published is lost; a restarted server resumes model, version, step size,
de-duplication table and window count and continues ``metrics.jsonl`` and ``applied.jsonl``
(one line per applied update, for audits) from there. An update is acknowledged to its client
only after the checkpoint that records it (applied, or judged duplicate or stale, in the
de-duplication table) is on disk (:func:`_save_and_acknowledge`); updates received in the
window in progress when the server dies were never acknowledged, so their clients resend them
(after ``resend_after``, :func:`client_resend_after`) and the restarted server applies them
once: not lost, and not applied twice, since those in the checkpoint's table are duplicates.
So that clients waiting for a model newer than the restored one do not wait for their resend,
the restarted server re-publishes its model under a new version
(:meth:`~fedsim.runtime.server.ServerActor.renew_version`).

State directory layout: server ``<state>/server.ckpt``; client ``<state>/ledgers/<id>.jsonl``
and ``<state>/client-<id>.json`` (what the last incarnation reported on exit).
"""

from __future__ import annotations

import asyncio
import importlib.util
import json
import math
import multiprocessing
import os
import resource
import signal
import subprocess
import sys
import time as wallclock
from collections.abc import Callable, Coroutine, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import numpy as np
import structlog
import torch

from fedsim.config.loading import LoadedScenario, dump_scenario, load_scenario, resolve_path
from fedsim.config.schema import Scenario
from fedsim.errors import ConfigError, FedsimError, TransportError
from fedsim.privacy.ledger_file import copy_ledger
from fedsim.protocol.messages import ClientStatus, GlobalModel, Message
from fedsim.runtime.checkpoint import ServerCheckpoint
from fedsim.runtime.client import ClientActor, RoundRecord
from fedsim.runtime.clock import WallClock
from fedsim.runtime.exposure import client_exposure, client_generator
from fedsim.runtime.server import ServerActor, WindowReport
from fedsim.runtime.simulation import (
    ClientPlan,
    Population,
    build_population,
    client_ids,
    make_client_actor,
    make_evaluator,
    make_server_actor,
    open_ledger,
)
from fedsim.transports.broker import LocalMosquitto
from fedsim.transports.mqtt import (
    BrokerSettings,
    MqttClientEndpoint,
    MqttServerEndpoint,
    ReconnectPolicy,
    TlsSettings,
    parse_broker_url,
)
from fedsim.transports.security import load_secrets
from fedsim.transports.topics import Topics

__all__ = [
    "Launcher",
    "ScaledClock",
    "client_resend_after",
    "client_state_file",
    "collect_outputs",
    "ledger_path",
    "process_commands",
    "reconnect_policy",
    "resolve_broker",
    "run_client",
    "run_process",
    "serve",
    "training_generator",
]

_log = structlog.get_logger("fedsim.runtime.deployment")
T = TypeVar("T")

SERVER_FILE = "server.json"
SCENARIO_FILE = "scenario.resolved.yaml"
METRICS_FILE = "metrics.jsonl"
APPLIED_FILE = "applied.jsonl"  # one line per applied update: window, client_id, round, base
BROKER_ENV = "FEDSIM_BROKER"
SECRETS_ENV = "FEDSIM_SECRETS"
ANNOUNCE_EVERY = 1.0  # wall seconds between a starting client's "connected" statuses
# A client that reported one of these will never train again.
FINISHED_STATES = frozenset({"budget_exhausted", "done"})


# ---------------------------------------------------------------------------------------------
# Time


class ScaledClock:
    """Scenario time on the wall clock: ``time_scale`` wall seconds per scenario second.

    ``start`` is the scenario time at construction (a restarted server continues its timeline
    from its checkpoint; the time it was down is not counted).
    """

    def __init__(self, time_scale: float = 1.0, *, start: float = 0.0) -> None:
        if not (math.isfinite(time_scale) and time_scale > 0):
            raise ConfigError(f"--time-scale must be a positive number, got {time_scale!r}")
        self.time_scale = float(time_scale)
        self._start = float(start)
        self._wall = WallClock()

    def now(self) -> float:
        return self._start + self._wall.now() / self.time_scale

    async def sleep(self, seconds: float) -> None:
        await self._wall.sleep(seconds * self.time_scale)


# ---------------------------------------------------------------------------------------------
# Broker access


def resolve_broker(
    url: str | None,
    *,
    secrets_file: str | Path | None,
    role: str,
    client_id: str | None = None,
    run: str | None = None,
    tls: TlsSettings | None = None,
) -> tuple[BrokerSettings, str | None]:
    """Broker settings with credentials, and the run name the credentials are for.

    ``url`` (default ``$FEDSIM_BROKER``) may carry ``user:password@``; otherwise the
    credentials of ``role`` (``server`` or ``client`` ``client_id``) come from the secrets file
    written by ``fedsim deploy`` / :func:`fedsim.transports.security.write_secrets` (default
    ``$FEDSIM_SECRETS``). Without either the connection is anonymous (refused by brokers set
    up by fedsim). The returned run is the secrets file's, or ``run``; they must agree.
    """
    url = url or os.environ.get(BROKER_ENV)
    if not url:
        raise ConfigError(f"no broker: pass --broker mqtt://HOST:PORT or set ${BROKER_ENV}")
    settings = parse_broker_url(url, tls=tls)
    secrets_file = secrets_file or os.environ.get(SECRETS_ENV) or None
    if secrets_file is None:
        return settings, run
    secrets = load_secrets(secrets_file)
    if run is not None and run != secrets.run:
        raise ConfigError(f"secrets file {secrets_file} is for run {secrets.run!r}, not {run!r}")
    if settings.username is None:
        credentials = secrets.server if role == "server" else secrets.for_client(str(client_id))
        settings = settings.with_credentials(credentials)
    return settings, secrets.run


def _run_name(scenario: Scenario, run: str | None) -> str:
    name = run or scenario.name
    Topics(name)  # validates it (it names MQTT topics)
    return name


def reconnect_policy(max_backoff: float) -> ReconnectPolicy:
    if not (math.isfinite(max_backoff) and max_backoff > 0):
        raise ConfigError(f"--max-backoff must be a positive number of seconds, got {max_backoff}")
    return ReconnectPolicy(initial_delay=min(0.1, max_backoff), max_delay=max_backoff)


# ---------------------------------------------------------------------------------------------
# The server process


def _save_and_acknowledge(
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


def client_resend_after(scenario: Scenario, time_scale: float) -> float:
    """Wall seconds after which a client resends an unacknowledged update.

    The server acknowledges at the end of the window after arrival (after its checkpoint), so a
    receipt takes up to one window of wall time; 1.5 windows plus a second keeps resends to
    updates that were really lost (a crashed server, a broker that lost its queue)."""
    return max(2.0, 1.5 * scenario.server.window * time_scale + 1.0)


class _CheckpointBeforeBroadcast:
    """The server's endpoint, writing a checkpoint before every global model leaves, so that
    a restarted server never publishes a version older than one already seen."""

    def __init__(self, inner: MqttServerEndpoint, save: Callable[[], None]) -> None:
        self.inner = inner
        self.save = save

    async def publish(self, message: Message) -> None:
        if isinstance(message, GlobalModel):
            self.save()
        await self.inner.publish(message)

    async def receive(self) -> Message:
        return await self.inner.receive()

    async def close(self) -> None:
        await self.inner.close()


def _write_lines(handle: Any, lines: Sequence[Mapping[str, Any]]) -> None:
    for line in lines:
        clean = {
            k: (None if isinstance(v, float) and not math.isfinite(v) else v)
            for k, v in line.items()
        }
        handle.write(json.dumps(clean, allow_nan=False) + "\n")
    handle.flush()
    os.fsync(handle.fileno())


def _keep_windows_through(path: Path, windows: int) -> None:
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
    metrics: Any
    applied: Any
    stop_reason: str = ""
    _refused_seen: int = 0

    def active_clients(self) -> int:
        states = {c: s.state for c, s in self.server.statuses.items()}
        return sum(states.get(c, "waiting") not in FINISHED_STATES for c in self.server.clients)

    def on_window(self, report: WindowReport) -> bool:
        stats = self.endpoint.stats
        refused = stats.rejected + stats.denied  # undecodable or forged: refused by the endpoint
        active = self.active_clients()
        line = report.metrics_line(
            rejected=report.rejected + refused - self._refused_seen,
            # Delivery is at-least-once end to end (acks + resend), so nothing is lost in flight.
            dropped_in_flight=0,
            active_clients=active,
            min_remaining_epsilon=None,  # the ledgers live with the clients
        )
        self._refused_seen = refused
        _write_lines(
            self.applied,
            [
                {"window": report.window, "client_id": c, "round": r, "base_version": base}
                for c, r, base in report.applied_updates
            ],
        )
        _write_lines(self.metrics, [line])
        # After the lines: a restart trims lines past the checkpoint's window and redoes them.
        _save_and_acknowledge(self.server, self.checkpoint, self.endpoint)
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


async def _unless_stopped(
    work: Coroutine[Any, Any, T], stop: asyncio.Event | None
) -> tuple[bool, T | None]:
    """``(True, result)`` once ``work`` is done, or ``(False, None)`` if ``stop`` is set first
    (``work`` is then cancelled). A failure of ``work`` is raised."""
    task = asyncio.ensure_future(work)
    if stop is None:
        return True, await task
    stopper = asyncio.ensure_future(stop.wait())
    try:
        await asyncio.wait({task, stopper}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        stopper.cancel()
    if task.done():
        return True, task.result()
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)
    return False, None


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
    time_scale: float = 1.0,
    reconnect: ReconnectPolicy = ReconnectPolicy(),
    wait_for_clients: float = 0.0,
    stop: asyncio.Event | None = None,
    population: Population | None = None,
) -> dict[str, Any]:
    """Run the server until the scenario's stop condition (or ``stop`` is set).

    Resumes from ``state_dir``'s checkpoint if there is one; otherwise first waits up to
    ``wait_for_clients`` wall seconds until every client has said it is connected. Writes
    ``metrics.jsonl``, ``scenario.resolved.yaml`` and ``server.json`` (the outcome, also
    returned) to ``out_dir``.
    """
    scenario = loaded.scenario
    run = _run_name(scenario, run)
    started = wallclock.perf_counter()
    population = population or build_population(loaded)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    (out / SCENARIO_FILE).write_text(
        dump_scenario(scenario, dataset_path=population.dataset_path), encoding="utf-8"
    )
    identity = {
        "run": run,
        "scenario": scenario.name,
        "seed": scenario.seed,
        "parameters": int(population.initial_params.size),
        "clients": [p.client_id for p in population.plans],
    }
    checkpoint = ServerCheckpoint(state_dir, identity)
    snapshot = checkpoint.load()
    resumed_from = snapshot.windows_closed if snapshot is not None else None
    for name in (METRICS_FILE, APPLIED_FILE):
        _keep_windows_through(out / name, resumed_from or 0)
    clock = ScaledClock(time_scale, start=snapshot.time if snapshot is not None else 0.0)
    outcome: dict[str, Any] = {
        "run": run,
        "resumed_from_window": resumed_from,
        "stop_reason": "",
        "finished": False,
    }
    mqtt = MqttServerEndpoint(
        broker,
        run=run,
        expected_params=int(population.initial_params.size),
        max_message_bytes=scenario.network.max_message_bytes,
        reconnect=reconnect,
        seed=scenario.seed,
    )
    server: ServerActor | None = None
    monitor: _ServerMonitor | None = None
    try:
        with (
            open(out / METRICS_FILE, "a", encoding="utf-8") as metrics,
            open(out / APPLIED_FILE, "a", encoding="utf-8") as applied,
        ):
            async with mqtt:
                joined: dict[str, ClientStatus] = {}
                if snapshot is None and wait_for_clients > 0:
                    ids = [p.client_id for p in population.plans]
                    waited, joined = await _unless_stopped(
                        _wait_for_clients(mqtt, ids, wait_for_clients), stop
                    )
                    if not waited:
                        outcome["stop_reason"] = "stopped by a signal before the first window"
                        return outcome
                    clock = ScaledClock(time_scale)  # scenario time starts with window 1
                endpoint = _CheckpointBeforeBroadcast(
                    mqtt, lambda: _save_and_acknowledge(server, checkpoint, mqtt)
                )
                server = make_server_actor(
                    population, clock=clock, endpoint=endpoint, evaluate=make_evaluator(population)
                )
                server.statuses.update(joined)
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
                monitor = _ServerMonitor(scenario, server, mqtt, checkpoint, metrics, applied)
                finished, _ = await _unless_stopped(server.run(monitor.on_window), stop)
                outcome["finished"] = finished
                if not finished:
                    monitor.stop_reason = "stopped by a signal"
    finally:
        if server is not None and monitor is not None:
            outcome.update(
                {
                    "stop_reason": monitor.stop_reason,
                    "final_version": server.version,
                    "windows": server.windows_closed,
                    "last_accuracy": server.last_accuracy,
                    "time": clock.now(),
                    "statuses": {c: asdict(s) for c, s in sorted(server.statuses.items())},
                    "duplicates_seen_table": len(server.seen),
                }
            )
        outcome.update(
            {
                "mqtt": mqtt.stats.as_dict(),
                "checkpoints_written": checkpoint.saves,
                "wall_seconds": wallclock.perf_counter() - started,
            }
        )
        (out / SERVER_FILE).write_text(
            json.dumps(outcome, indent=2, default=_json_default) + "\n", encoding="utf-8"
        )
    return outcome


def _json_default(value: Any) -> Any:
    if isinstance(value, np.floating | np.integer):
        return value.item()
    raise TypeError(f"not JSON-serialisable: {type(value).__name__}")


# ---------------------------------------------------------------------------------------------
# A client process


def ledger_path(state_dir: str | Path, client_id: str) -> Path:
    return Path(state_dir) / "ledgers" / f"{client_id}.jsonl"


def client_state_file(state_dir: str | Path, client_id: str) -> Path:
    return Path(state_dir) / f"client-{client_id}.json"


def _plan_of(population: Population, client_id: str) -> ClientPlan:
    for plan in population.plans:
        if plan.client_id == client_id:
            return plan
    known = [p.client_id for p in population.plans]
    shown = ", ".join(known[:8]) + (" ..." if len(known) > 8 else "")
    raise ConfigError(
        f"--client-id {client_id!r} is not a client of scenario "
        f"{population.scenario.name!r} (its clients: {shown})"
    )


def training_generator(population: Population, client_id: str, first_round: int) -> torch.Generator:
    """The generator of batches and noise for a client process that starts at ``first_round``.

    The first incarnation (round 0) draws the simulator's stream ``client/<id>/train``. A
    restarted one must not replay noise that was already released (two releases with the same
    noise vector would reveal the difference of their gradients), so it draws from a stream
    keyed by the round it resumes at. Each released round comes from the stream of the
    incarnation that released it, and an incarnation starting at round r releases nothing
    before r; two incarnations can only share a stream if the first released nothing.
    Only with ``privacy.deployed_randomness: seeded_not_private``; by default the stream is
    keyed from OS entropy (:func:`fedsim.runtime.exposure.client_generator`).
    """
    randomness = population.scenario.privacy.deployed_randomness
    return client_generator(population.tree, client_id, first_round, randomness)


async def _on_off(
    actor: ClientActor,
    plan: ClientPlan,
    population: Population,
    clock: ScaledClock,
    first_round: int,
) -> None:
    """Pause and resume the actor on the group's on/off periods (scenario time)."""
    availability = plan.group.availability
    assert availability.online is not None and availability.offline is not None
    rng = population.tree.numpy("client", plan.client_id, "availability", "from-round", first_round)
    while True:
        await clock.sleep(availability.online.sample(rng))
        actor.online.clear()
        await clock.sleep(availability.offline.sample(rng))
        actor.online.set()


async def _announce(
    actor: ClientActor, endpoint: MqttClientEndpoint, ledger: Any, delta: float
) -> None:
    """Say "connected" until the first global model arrives (the server may wait for every
    client before its first window, and a status sent before it subscribed is lost)."""
    while actor.held_version < 0:
        rounds = len({record.round for record in ledger.records})
        await endpoint.publish(
            ClientStatus(
                actor.client_id,
                "waiting",
                rounds,
                ledger.epsilon(delta),
                delta,
                "connected",
                actor.clock.now(),
            )
        )
        await asyncio.sleep(ANNOUNCE_EVERY)


async def _alongside(
    main: Coroutine[Any, Any, None], helpers: list[Coroutine[Any, Any, None]]
) -> None:
    """Run ``main`` with ``helpers`` beside it; the helpers end when ``main`` does."""
    tasks = [asyncio.create_task(helper) for helper in helpers]
    try:
        await main
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


def _read_json(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


async def run_client(
    loaded: LoadedScenario,
    client_id: str,
    broker: BrokerSettings,
    *,
    run: str | None = None,
    state_dir: str | Path,
    time_scale: float = 1.0,
    reconnect: ReconnectPolicy = ReconnectPolicy(),
    flush_timeout: float = 10.0,
    stop: asyncio.Event | None = None,
    population: Population | None = None,
) -> dict[str, Any]:
    """Run one client until its rounds or budget end (or ``stop`` is set); then wait up to
    ``flush_timeout`` wall seconds for the server to acknowledge every update sent.

    Resumes the ledger in ``state_dir``; writes ``client-<id>.json`` there (also returned).
    """
    scenario = loaded.scenario
    run = _run_name(scenario, run)
    population = population or build_population(loaded)
    plan = _plan_of(population, client_id)
    state = Path(state_dir)
    ledger = open_ledger(plan, ledger_path(state, client_id))
    first_round = max((record.round for record in ledger.records), default=-1) + 1
    trainer = population.trainer(
        plan, generator=training_generator(population, client_id, first_round)
    )
    clock = ScaledClock(time_scale, start=ledger.last_time)  # records never go back in time
    endpoint = MqttClientEndpoint(
        broker,
        run=run,
        client_id=client_id,
        expected_params=int(population.initial_params.size),
        max_message_bytes=scenario.network.max_message_bytes,
        reconnect=reconnect,
        resend_after=client_resend_after(scenario, time_scale),
        seed=population.tree.integer("client", client_id, "mqtt", first_round),
    )
    report_file = client_state_file(state, client_id)
    previous = _read_json(report_file)
    _log.info(
        "client starting",
        client=client_id,
        first_round=first_round,
        ledger_rounds=len({r.round for r in ledger.records}),
        run=run,
    )
    actor: ClientActor | None = None
    try:
        async with endpoint:
            actor = make_client_actor(
                plan,
                clock=clock,
                endpoint=endpoint,
                trainer=trainer,
                ledger=ledger,
                speed_rng=population.tree.numpy(
                    "client", client_id, "speed", "from-round", first_round
                ),
                delta=scenario.privacy.delta,
                exposure=client_exposure(scenario, [p.client_id for p in population.plans],
                                         client_id, deployed=True),
            )
            helpers = [_announce(actor, endpoint, ledger, scenario.privacy.delta)]
            if plan.group.availability.online is not None:
                helpers.append(_on_off(actor, plan, population, clock, first_round))
            await _unless_stopped(_alongside(actor.run(), helpers), stop)
            if not await endpoint.flush(flush_timeout):
                _log.warning(
                    "updates not acknowledged before exit",
                    client=client_id,
                    rounds=list(endpoint.unacknowledged),
                )
    finally:
        released = list(previous.get("released", []))
        if actor is not None:
            released += [asdict(r) for r in actor.released]
        outcome = {
            "client_id": client_id,
            "first_round": first_round,
            "state": actor.state if actor is not None else "waiting",
            "stop_reason": actor.stop_reason if actor is not None else "",
            "stopped_at": actor.stopped_at if actor is not None else None,
            "ledger_rounds": sorted({r.round for r in ledger.records}),
            "released": released,
            "unacknowledged": list(endpoint.unacknowledged),
            "mqtt": endpoint.stats.as_dict(),
            "randomness": scenario.privacy.deployed_randomness,
            "timing_overruns": actor.timing_overruns if actor is not None else 0,
        }
        ledger.close()
        state.mkdir(parents=True, exist_ok=True)
        temporary = report_file.with_name(report_file.name + ".tmp")
        temporary.write_text(json.dumps(outcome, indent=2) + "\n", encoding="utf-8")
        os.replace(temporary, report_file)
    return outcome


# ---------------------------------------------------------------------------------------------
# Collecting a run directory


@dataclass
class _FinishedActor:
    """What :func:`fedsim.runtime.simulation.write_run_outputs` reads of a client actor."""

    state: str
    released: list[RoundRecord]
    stopped_at: float | None = None
    stop_reason: str = ""
    client_id: str = ""
    randomness: str = ""
    timing_overruns: int = 0


@dataclass
class _DeployedRun:
    """What :func:`fedsim.runtime.simulation.write_run_outputs` reads of a finished run (the
    attributes of its ``_Simulation``); tests/deployment fail if the two drift apart."""

    scenario: Scenario
    out_dir: Path
    metrics: list[dict[str, Any]]
    stopped: list[dict[str, Any]]
    stop_reason: str
    network_stats: dict[str, Any]
    cpu_seconds: float
    clients: dict[str, Any] = field(default_factory=dict)
    batcher: None = None  # each deployed client computes its own rounds


@dataclass(frozen=True)
class _FinalServer:
    version: int


def collect_outputs(
    loaded: LoadedScenario,
    out_dir: str | Path,
    client_state_dirs: Mapping[str, Path],
    *,
    wall_seconds: float,
    cpu_seconds: float = math.nan,
    population: Population | None = None,
) -> dict[str, Any]:
    """Gather a deployed run into ``out_dir`` the way ``fedsim run`` lays it out.

    ``wall_seconds`` and ``cpu_seconds`` (of all processes together) go to ``timing.json``.

    ``out_dir`` already holds the server's ``metrics.jsonl`` and ``server.json``; the clients'
    ledgers are copied from their state directories into ``ledgers/`` and ``clients.csv``,
    ``summary.json`` and ``timing.json`` are written by the simulator's own writer. Returns the
    summary.
    """
    from fedsim.runtime.simulation import ClientRecord, write_run_outputs

    out = Path(out_dir)
    population = population or build_population(loaded)
    server = _read_json(out / SERVER_FILE)
    metrics = []
    if (out / METRICS_FILE).exists():
        metrics = [json.loads(t) for t in (out / METRICS_FILE).read_text().splitlines() if t]
    (out / "ledgers").mkdir(parents=True, exist_ok=True)
    record = _DeployedRun(
        loaded.scenario,
        out,
        metrics,
        [],
        server.get("stop_reason", ""),
        {"mqtt_server": server.get("mqtt", {})},
        cpu_seconds,
    )
    statuses = server.get("statuses", {})
    for plan in population.plans:
        client_id = plan.client_id
        state_dir = client_state_dirs.get(client_id)
        copied = out / "ledgers" / f"{client_id}.jsonl"
        if state_dir is not None and ledger_path(state_dir, client_id).exists():
            copy_ledger(ledger_path(state_dir, client_id), copied)  # with its mark
        report = _read_json(client_state_file(state_dir, client_id)) if state_dir else {}
        status = statuses.get(client_id, {})
        state = report.get("state") or status.get("state") or "waiting"
        reason = report.get("stop_reason") or status.get("detail", "")
        stopped_at = report.get("stopped_at", status.get("sent_at"))
        actor = _FinishedActor(
            state, [RoundRecord(**r) for r in report.get("released", [])], stopped_at, reason,
            client_id, report.get("randomness", ""), int(report.get("timing_overruns", 0)),
        )
        if state in FINISHED_STATES:
            record.stopped.append({"client_id": client_id, "time": stopped_at, "reason": reason})
        record.clients[client_id] = ClientRecord(
            plan, None, copied, open_ledger(plan, copied), actor=actor
        )
    try:
        return write_run_outputs(
            record, _FinalServer(int(server.get("final_version", 0))), wall_seconds
        )
    finally:
        for client in record.clients.values():
            client.ledger.close()


# ---------------------------------------------------------------------------------------------
# Launching everything as local processes


def _children_cpu_seconds() -> float:
    """CPU seconds (user + system) of this process's ended and waited-for children."""
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def process_commands(
    scenario_file: str | Path,
    client_ids: Sequence[str],
    *,
    broker: str,
    run: str,
    secrets_file: str | Path | None,
    state_root: str | Path,
    out: str | Path,
    time_scale: float = 1.0,
    max_backoff: float = 10.0,
    wait_for_clients: float = 600.0,
    json_logs: bool = True,
    tls_options: Sequence[str] = (),
    overrides: Sequence[str] = (),
) -> dict[str, list[str]]:
    """The command line of every process of a deployed run, clients first, then ``server``:
    ``fedsim client ... --state <state_root>/<id>`` and ``fedsim server ... --state
    <state_root>/server --out <out>``. The one source of these command lines: :class:`Launcher`
    runs them as local processes, ``fedsim deploy --compose`` puts them (with container paths)
    into the compose file. ``tls_options`` (``--tls-ca FILE`` ...) are passed to every process
    as given; ``overrides`` (``PATH=VALUE``) become ``--set`` options."""
    common = [
        "--scenario", str(scenario_file), "--broker", broker, "--run", run,
        "--time-scale", repr(float(time_scale)), "--max-backoff", repr(float(max_backoff)),
        "--json-logs" if json_logs else "--no-json-logs",
    ]  # fmt: skip
    if secrets_file is not None:
        common += ["--secrets", str(secrets_file)]
    common += list(tls_options)
    for override in overrides:
        common += ["--set", override]
    state = Path(state_root)
    commands = {
        client_id: ["fedsim", "client", *common, "--client-id", client_id,
                    "--state", str(state / client_id)]
        for client_id in client_ids
    }  # fmt: skip
    commands["server"] = [
        "fedsim", "server", *common, "--state", str(state / "server"), "--out", str(out),
        "--wait-for-clients", repr(float(wait_for_clients)),
    ]  # fmt: skip
    return commands


class _ForkedChild:
    """A child forked from the launcher, which has already imported fedsim and torch (tens of
    seconds on a busy machine, per process), running ``fedsim <argv>``. Same interface as the
    parts of :class:`subprocess.Popen` the launcher uses."""

    def __init__(self, argv: list[str], log: Path) -> None:
        context = multiprocessing.get_context("fork")
        self._process = context.Process(target=_child_main, args=(argv, str(log)), daemon=False)
        self._process.start()
        self.pid = self._process.pid

    def poll(self) -> int | None:
        return self._process.exitcode

    def wait(self, timeout: float | None = None) -> int:
        self._process.join(timeout)
        if self._process.exitcode is None:
            raise subprocess.TimeoutExpired(f"fedsim process {self.pid}", timeout or 0.0)
        return self._process.exitcode

    def send_signal(self, sig: int) -> None:
        if self._process.exitcode is None:
            os.kill(self.pid, sig)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)


def _child_main(argv: list[str], log: str) -> None:
    """Entry point of a forked child: output to its log, then ``fedsim <argv>``."""
    from fedsim.cli import main

    fd = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    sys.stdout.flush()
    sys.stderr.flush()
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    os.close(fd)
    # The parent's sys.stdout/stderr may not be fds 1/2 (pytest's capture, a notebook).
    sys.stdout = open(1, "w", buffering=1, encoding="utf-8", closefd=False)
    sys.stderr = open(2, "w", buffering=1, encoding="utf-8", closefd=False)
    code = main(argv)
    sys.stdout.flush()
    sys.stderr.flush()
    sys.exit(code)


@dataclass
class _Process:
    name: str
    argv: list[str]  # after "fedsim"
    log: Path
    child: subprocess.Popen[bytes] | _ForkedChild | None = None
    starts: int = 0

    @property
    def running(self) -> bool:
        return self.child is not None and self.child.poll() is None


class Launcher:
    """The server and every client of a scenario as local processes (``fedsim launch``).

    Each process runs ``fedsim server ...`` / ``fedsim client ...`` (the commands are in
    ``processes.json``, the same ones ``docker-compose.yml`` runs). ``fork=True`` (default)
    forks them from this already-initialised process instead of starting fresh interpreters,
    which saves the import of torch per process; ``fork=False`` execs ``python -m fedsim``.

    Clients start first; the server waits (``--wait-for-clients``) until every client has said
    it is connected, so the first window does not pass while processes are still starting.

    Layout under ``out``: the run directory files, ``state/server/``, ``state/<client id>/``,
    ``logs/<name>.log`` (appended across restarts), ``broker/`` (a private mosquitto's files,
    if no broker URL is given) and ``processes.json``. Individual processes can be killed and
    restarted (:meth:`kill`, :meth:`start`) to test crash recovery.
    """

    def __init__(
        self,
        scenario_file: str | Path,
        out: str | Path,
        *,
        overrides: Sequence[str] = (),
        broker: str | None = None,
        secrets_file: str | Path | None = None,
        time_scale: float = 1.0,
        max_backoff: float = 10.0,
        wait_for_clients: float = 600.0,
        fork: bool = True,
        json_logs: bool = True,
        tls_options: Sequence[str] = (),
    ) -> None:
        self.out = Path(out)
        ledgers = self.out / "ledgers"
        if ledgers.exists() and any(ledgers.iterdir()):
            raise ConfigError(f"{self.out} already holds a run's ledgers; choose a new --out")
        self.loaded = load_scenario(scenario_file, overrides)
        self.scenario = self.loaded.scenario
        self.run = _run_name(self.scenario, None)
        self.client_ids = client_ids(self.scenario)
        ScaledClock(time_scale)  # validates it here, not in every child
        self.time_scale = time_scale
        self.max_backoff = max_backoff
        self.wait_for_clients = wait_for_clients
        self.tls_options = list(tls_options)
        self.fork = fork
        self.json_logs = json_logs
        self.broker_url = broker
        self.secrets_file = Path(secrets_file) if secrets_file is not None else None
        self.local_broker: LocalMosquitto | None = None
        self.processes: dict[str, _Process] = {}
        self.exit_codes: dict[str, list[int]] = {}
        self._started = wallclock.perf_counter()
        self._children_cpu_at_start = _children_cpu_seconds()

    # -- setup -------------------------------------------------------------------------------
    def state_dir(self, name: str) -> Path:
        return self.out / "state" / name

    def prepare(self) -> None:
        """Write the resolved scenario, start a private broker if none was given."""
        self.out.mkdir(parents=True, exist_ok=True)
        (self.out / "logs").mkdir(exist_ok=True)
        dataset_path = None
        if self.scenario.dataset.path is not None:
            dataset_path = resolve_path(self.scenario.dataset.path, self.loaded.base_dir)
        self.scenario_file = (self.out / SCENARIO_FILE).resolve()
        self.scenario_file.write_text(
            dump_scenario(self.scenario, dataset_path=dataset_path), encoding="utf-8"
        )
        if self.broker_url is None:
            self.local_broker = LocalMosquitto(self.out / "broker", self.run, self.client_ids)
            self.local_broker.start()
            self.broker_url = self.local_broker.url()
            self.secrets_file = self.local_broker.files.secrets_file
            _log.info("private broker started", url=self.broker_url, pid=self.local_broker.pid)
        commands = process_commands(
            self.scenario_file,
            self.client_ids,
            broker=self.broker_url,
            run=self.run,
            secrets_file=self.secrets_file.resolve() if self.secrets_file else None,
            state_root=(self.out / "state").resolve(),
            out=self.out.resolve(),
            time_scale=self.time_scale,
            max_backoff=self.max_backoff,
            wait_for_clients=self.wait_for_clients,
            json_logs=self.json_logs,
            tls_options=self.tls_options,
        )
        for name, argv in commands.items():
            self.processes[name] = _Process(name, argv[1:], self.out / "logs" / f"{name}.log")

    # -- processes ---------------------------------------------------------------------------
    def start(self, name: str) -> None:
        """Start (or restart) one process."""
        process = self.processes[name]
        if process.running:
            raise FedsimError(f"process {name} is already running")
        if self.fork:
            process.child = _ForkedChild(process.argv, process.log)
        else:
            with process.log.open("ab") as log:
                process.child = subprocess.Popen(
                    [sys.executable, "-m", "fedsim", *process.argv],
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    stdin=subprocess.DEVNULL,
                )
        process.starts += 1

    def start_all(self) -> None:
        for name in self.processes:  # clients first, the server last
            self.start(name)

    def _ended(self, process: _Process, code: int) -> int:
        self.exit_codes.setdefault(process.name, []).append(code)
        process.child = None
        return code

    def kill(self, name: str, sig: int = signal.SIGKILL, timeout: float = 60.0) -> int:
        """Signal one process by its PID and wait for it; returns its exit status."""
        process = self.processes[name]
        if process.child is None:
            raise FedsimError(f"process {name} is not running")
        process.child.send_signal(sig)
        return self._ended(process, process.child.wait(timeout=timeout))

    def wait(self, name: str, timeout: float) -> int | None:
        """Wait for a process to exit on its own; None if it still runs after ``timeout``."""
        process = self.processes[name]
        if process.child is None:
            raise FedsimError(f"process {name} is not running")
        try:
            return self._ended(process, process.child.wait(timeout=timeout))
        except subprocess.TimeoutExpired:
            return None

    def stop_all(self, grace: float = 15.0) -> None:
        """SIGTERM every running process (clients flush their outboxes), SIGKILL stragglers."""
        running = [p for p in self.processes.values() if p.running]
        for process in running:
            assert process.child is not None
            process.child.send_signal(signal.SIGTERM)
        deadline = wallclock.monotonic() + grace
        for process in running:
            assert process.child is not None
            try:
                code = process.child.wait(timeout=max(0.1, deadline - wallclock.monotonic()))
            except subprocess.TimeoutExpired:
                process.child.kill()
                code = process.child.wait(timeout=grace)
            self._ended(process, code)

    # -- the whole run -----------------------------------------------------------------------
    def collect(self, *, plots: bool = False) -> dict[str, Any]:
        """Write the run directory (after the processes have ended)."""
        summary = collect_outputs(
            self.loaded,
            self.out,
            {c: self.state_dir(c) for c in self.client_ids},
            wall_seconds=wallclock.perf_counter() - self._started,
            cpu_seconds=_children_cpu_seconds() - self._children_cpu_at_start,
        )
        (self.out / "processes.json").write_text(
            json.dumps(
                {
                    name: {
                        "command": ["fedsim", *p.argv],
                        "starts": p.starts,
                        "exit_codes": self.exit_codes.get(name, []),
                    }
                    for name, p in self.processes.items()
                },
                indent=2,
            )
            + "\n",
            encoding="utf-8",
        )
        if plots and importlib.util.find_spec("fedsim.reporting.plots") is not None:
            from fedsim.reporting.plots import draw_all

            draw_all(self.out)
        return summary

    def close(self) -> None:
        """Stop every process and the private broker (idempotent)."""
        self.stop_all(grace=5.0)
        if self.local_broker is not None:
            self.local_broker.kill(signal.SIGTERM)

    def run_to_end(
        self,
        timeout: float,
        *,
        plots: bool = False,
        on_window: Callable[[dict[str, Any]], None] | None = None,
    ) -> dict[str, Any]:
        """Start everything, wait for the server to stop (or ``timeout`` wall seconds), stop
        the clients, collect the run directory and return its summary. ``on_window`` gets each
        new ``metrics.jsonl`` line while the run goes on (a progress display)."""
        try:
            self.prepare()
            self.start_all()
            follower = _LineFollower(self.out / METRICS_FILE)
            deadline = wallclock.monotonic() + timeout
            code = None
            while code is None and wallclock.monotonic() < deadline:
                code = self.wait("server", min(0.5, max(0.0, deadline - wallclock.monotonic())))
                for line in follower.new_lines():
                    if on_window is not None:
                        on_window(line)
            if code is None:
                self.kill("server", signal.SIGTERM)
                raise TransportError(
                    f"the server did not reach the stop condition within "
                    f"{timeout:g} wall seconds (see {self.out / 'logs'})"
                )
            if code != 0:
                raise FedsimError(
                    f"the server exited with status {code} (see {self.out / 'logs' / 'server.log'})"
                )
            self.stop_all()
        finally:
            self.close()
        return self.collect(plots=plots)


class _LineFollower:
    """New complete lines of a JSON-lines file another process appends to."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._offset = 0

    def new_lines(self) -> list[dict[str, Any]]:
        try:
            with open(self.path, "rb") as handle:
                if os.fstat(handle.fileno()).st_size < self._offset:
                    self._offset = 0  # rewritten (a restarted server trimmed it)
                handle.seek(self._offset)
                data = handle.read()
        except FileNotFoundError:
            return []
        complete = data[: data.rfind(b"\n") + 1]
        self._offset += len(complete)
        return [json.loads(text) for text in complete.decode().splitlines() if text.strip()]


def run_process(main: Callable[[asyncio.Event], Any], threads: int) -> Any:
    """Run a server or client coroutine factory with SIGTERM/SIGINT setting its stop event."""
    torch.set_num_threads(threads)

    async def supervised() -> Any:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        return await main(stop)

    return asyncio.run(supervised())
