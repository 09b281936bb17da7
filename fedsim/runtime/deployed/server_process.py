"""The deployed server process: the scenario's :class:`ServerActor` on the wall clock, behind an
MQTT endpoint, with a checkpoint after every window (see :mod:`fedsim.runtime.deployed.deployment` for
the crash-safety contract).

**Checkpoints off the event loop** (issue 25, finding 4). A checkpoint is a snapshot taken on
the event loop (a copy of the model and of the client book: ``O(parameters + clients)``) and
written on one worker thread (:class:`Checkpoints`), so that receiving and judging go on while
it is serialised, fsynced and renamed; updates are acknowledged once the checkpoint that records
them is durable. A global model leaves only once a durable checkpoint covers its version: each
checkpoint grants a *version ceiling*, and only a model above the durable ceiling waits for a
new checkpoint. Under time windows the ceiling is the checkpoint's own version (the window's
one model is published right after its checkpoint); under the on-arrival policies (FedAsync,
FedBuff publish a model per applied buffer) it is the version plus twice the versions published
in the last window, at least :data:`MIN_VERSION_LEASE`. So the server writes one checkpoint per
window, plus one whenever an on-arrival window publishes more versions than its lease; a
restarted server renews its version above the ceiling, so no client ever holds a newer version
than it publishes. The versions it skips count as staleness for updates still in flight
(limit: with ``max_staleness`` below the lease, those are refused as stale after a crash).
What a crash loses: the
updates applied since the last checkpoint (unacknowledged, so their clients resend them and they
are applied once, to the restored model) and the record of versions published since (updates
based on them are refused as unpublished).

:func:`serve` lays out the output directory, restores the checkpoint if there is one, waits
for the clients, runs the actor with the per-window monitor (metrics line, applied log,
checkpoint, acknowledgements, stop condition) and writes ``server.json``.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import time as wallclock
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import IO, Any

from fedsim.atomic import LinkRefused, open_log, read_regular, write_atomically
from fedsim.clock import ScaledClock
from fedsim.config.loading import LoadedScenario, dump_scenario
from fedsim.config.schema import Scenario
from fedsim.errors import ConfigError, TransportError
from fedsim.json_input import parse_json
from fedsim.logging import get_logger
from fedsim.protocol.messages import ClientStatus, RunFinished
from fedsim.runtime.actors.client_book import BookState, ClientBook
from fedsim.runtime.actors.integrity import window_refusals
from fedsim.runtime.actors.server import ServerActor, WindowReport
from fedsim.runtime.actors.server_snapshot import ServerSnapshot
from fedsim.runtime.actors.stops import RunStop, RunStopKind, stop_fields
from fedsim.runtime.actors.tasks import unless_stopped
from fedsim.runtime.assembly import make_evaluator, make_server_actor
from fedsim.runtime.deployed.checkpoint import ServerCheckpoint, ServerStateLock
from fedsim.runtime.deployed.deployment import (
    STOPPED_BEFORE_CONNECTING,
    connected,
    least_kept_counts,
    message_limit,
    partial_limit,
    reconnect_policy,
    run_name,
)
from fedsim.runtime.deployed.guarantees import require_public_slots
from fedsim.runtime.deployed.options import DeploymentOptions
from fedsim.runtime.deployed.state_owner import add_counts
from fedsim.runtime.population import Population, build_population
from fedsim.runtime.run_outputs import (
    APPLIED_FILE,
    METRICS_FILE,
    SCENARIO_FILE,
    SERVER_FILE,
    STOPPED_STATES,
    json_line,
    read_json,
    write_json,
)
from fedsim.runtime.run_record import RELEASED_UNACKNOWLEDGED, released_unacknowledged
from fedsim.transports.mqtt import BrokerSettings, MqttServerEndpoint
from fedsim.transports.topics import aggregator_ids

__all__ = ["MIN_VERSION_LEASE", "Checkpoints", "keep_windows_through", "serve"]

_log = get_logger("fedsim.runtime.deployed.server_process")


MIN_VERSION_LEASE = 16
"""Versions a checkpoint lets the server publish beyond its own before the next one."""


class Checkpoints:
    """The server's checkpoints, written in order on one worker thread (module docstring)."""

    def __init__(self, checkpoint: ServerCheckpoint, endpoint: MqttServerEndpoint) -> None:
        self.checkpoint = checkpoint
        self.endpoint = endpoint
        self.durable_ceiling = -1
        self.lease = 0
        self._window_version: int | None = None
        self._pending: tuple[int, asyncio.Task[None]] | None = None
        self._executor = ThreadPoolExecutor(1, thread_name_prefix="fedsim-checkpoint")

    def start(self, server: ServerActor, *, window: bool = False) -> asyncio.Task[None]:
        """Snapshot ``server`` now and write it on the worker thread; acknowledge what it
        records once durable. ``window``: the per-window checkpoint (it sizes the lease)."""
        self._raise_failed()
        if not server.policy.on_arrival:
            self.lease = 0  # the window's one model leaves right after its checkpoint
        elif window or not self.lease:
            published = 0 if self._window_version is None else server.version - self._window_version
            self.lease = max(MIN_VERSION_LEASE, 2 * published)
            self._window_version = server.version
        ceiling = server.version + self.lease
        snapshot = replace(server.snapshot(), version_ceiling=ceiling)
        written = asyncio.get_running_loop().run_in_executor(
            self._executor, self.checkpoint.save, snapshot)

        async def durable() -> None:
            await written
            self.durable_ceiling = max(self.durable_ceiling, ceiling)
            self.endpoint.acknowledge(snapshot.book)

        task = asyncio.ensure_future(durable())
        self._pending = (ceiling, task)
        return task

    def _raise_failed(self) -> None:
        if self._pending is not None and self._pending[1].done():
            self._pending[1].result()  # a failed write (disk full, ...) stops the server here

    async def cover(self, server: ServerActor, version: int) -> None:
        """Return once a durable checkpoint lets ``version`` be published."""
        if version <= self.durable_ceiling:
            self._raise_failed()
            return
        if self._pending is not None and self._pending[0] >= version:
            await asyncio.shield(self._pending[1])
        if version > self.durable_ceiling:
            await asyncio.shield(self.start(server))

    async def drain(self, finished: str | None = None) -> None:
        """Wait for the checkpoint being written; release the worker thread. ``finished``:
        the run ended, for this reason: the state directory then says so once its last
        checkpoint is durable (:meth:`ServerCheckpoint.mark_finished`), and no server goes on
        from it."""
        try:
            if self._pending is not None:
                await asyncio.shield(self._pending[1])
            if finished is not None:
                await asyncio.get_running_loop().run_in_executor(
                    self._executor, self.checkpoint.mark_finished, finished)
        finally:
            self._executor.shutdown(wait=True)


class _BeforePublish:
    """The deployed server's explicit step before each global model leaves
    (:attr:`ServerActor.before_publish`): a durable checkpoint that covers the model's version,
    so that a restarted server never publishes a version older than one already seen.

    Once the stop condition holds (``stop_reason()`` is not None), the broadcast that would
    open the next window announces the end of the run instead (:class:`RunFinished`): no
    client starts a round on a model nobody will apply updates to."""

    def __init__(self, mqtt: MqttServerEndpoint, checkpoints: Checkpoints,
                 server: ServerActor) -> None:
        self.mqtt = mqtt
        self.checkpoints = checkpoints
        self.server = server
        self.stop_reason: Callable[[], RunStop | None] = lambda: None  # set with the monitor
        self.announced = False
        self.running_at_end: set[str] = set()
        """The clients whose kept status was not a stopped one when the end was announced:
        those whose final statuses the server waits for and hears (:func:`_final_statuses`)."""
        server.before_publish = self

    async def __call__(self, version: int, time: float) -> bool:
        await self.checkpoints.cover(self.server, version)
        if self.stop_reason() is not None:
            await self.announce_end(version, time)
            return False
        return True

    async def announce_end(self, version: int, time: float) -> None:
        """Tell the clients the run is over (retained), once, noting first which were still
        running (:attr:`running_at_end`)."""
        if not self.announced:
            self.announced = True
            # Taken before the end goes out: the "done" a client's actor sends when it sees
            # the end may be judged before the wait for final statuses begins, and must not
            # make that client one whose final status is refused (a CI run's flake).
            self.running_at_end = {c for c, s in self.server.statuses.items()
                                   if s.state not in STOPPED_STATES}
            await self.mqtt.publish(RunFinished(version, str(self.stop_reason() or ""), time))


def _write_lines(handle: IO[str], lines: Sequence[Mapping[str, Any]]) -> None:
    for line in lines:
        handle.write(json_line(line))
    handle.flush()
    os.fsync(handle.fileno())


def keep_windows_through(path: Path, windows: int) -> None:
    """Drop the lines of windows after the checkpoint's (a restarted server redoes them) and a
    torn last line from a per-window JSON-lines file; rewritten atomically. Read as a file of
    a run directory someone else may have prepared: a link there is refused
    (:class:`~fedsim.atomic.LinkRefused`), a FIFO or anything but a regular file is a
    :class:`ConfigError` naming it, not waited on (an attacker's review, session 64: a FIFO
    hung a resumed server before it connected)."""
    if not os.path.lexists(path):
        return
    try:
        content = read_regular(path, no_link=True)
    except LinkRefused:
        raise
    except OSError as exc:
        raise ConfigError(f"{path}: cannot be read ({exc.strerror})") from None
    kept = []
    for text in content.decode("utf-8", errors="replace").splitlines():
        try:
            line = parse_json(text)
        except ValueError:
            continue
        if (
            isinstance(line, dict)
            and isinstance(line.get("window"), int)
            and line["window"] <= windows
        ):
            kept.append(text + "\n")
    # Durable: the lines appended after the trim are fsynced, worth nothing if the file they
    # were appended to could revert to its untrimmed version after a power failure.
    write_atomically(path, "".join(kept), durability="durable")


@dataclass
class _ServerMonitor:
    """The server process's per-window bookkeeping: metrics line, checkpoint, stop condition."""

    scenario: Scenario
    server: ServerActor
    endpoint: MqttServerEndpoint
    checkpoints: Checkpoints
    metrics: IO[str]
    applied: IO[str]
    stop_reason: RunStop | None = None
    _refused_seen: dict[str, int] = field(default_factory=dict)
    _missing_reported: int = 0

    def __post_init__(self) -> None:
        # A restored server's book already counts what the earlier parts' lines reported
        # (a stranger: a resumed launch's first window reported the whole total again).
        self._missing_reported = self.server.missing_updates()

    def active_clients(self) -> int:
        states = {c: s.state for c, s in self.server.statuses.items()}
        return sum(states.get(c, "waiting") not in STOPPED_STATES for c in self.server.clients)

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
        line["shed"] = report.shed  # of the stale: judged as they arrived (an overload)
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
        self.checkpoints.start(self.server, window=True)
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
        return self.stop_reason is not None


async def _wait_for_clients(
    endpoint: MqttServerEndpoint, client_ids: Sequence[str], timeout: float
) -> dict[str, ClientStatus]:
    """The clients' "connected" statuses, waiting up to ``timeout`` wall seconds for all."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    joined: dict[str, ClientStatus] = {}
    waiting = set(client_ids)  # kept, not recomputed a message: 10^5 clients cost 16 ms each
    while waiting and loop.time() < deadline:
        try:
            message = await asyncio.wait_for(endpoint.receive(), deadline - loop.time())
        except TimeoutError:
            break
        if isinstance(message, ClientStatus):
            joined[message.client_id] = message
            waiting.discard(message.client_id)
        else:  # computed on a model no server of this run published: nothing to apply it to
            endpoint.refuse_before_start(message)  # (counted; a flood's log summarised)
    missing = sorted(waiting)
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
    (the outcome, also returned) to ``out_dir``. Holds ``state_dir``'s lock
    (:class:`~fedsim.runtime.deployed.checkpoint.ServerStateLock`) while it runs: a second
    server on the same state directory is refused.
    """
    with ServerStateLock(state_dir):
        return await _serve(loaded, broker, run=run, state_dir=state_dir, out_dir=out_dir,
                            options=options, stop=stop, population=population)


async def _serve(loaded: LoadedScenario, broker: BrokerSettings, *, run: str | None,
                 state_dir: str | Path, out_dir: str | Path, options: DeploymentOptions,
                 stop: asyncio.Event | None, population: Population | None) -> dict[str, Any]:
    """:func:`serve`, its state directory locked."""
    scenario = loaded.scenario
    require_public_slots(scenario)
    run = run_name(scenario, run)
    started = wallclock.perf_counter()
    population = population or build_population(loaded)
    checkpoint = ServerCheckpoint(state_dir, _identity(run, population))
    checkpoints: Checkpoints | None = None
    snapshot = checkpoint.load()
    resumed_from = snapshot.windows_closed if snapshot is not None else None
    out = _prepare_out(Path(out_dir), population, resumed_from or 0)
    # A resumed server's counts go on from its last report's (a stranger: they were its
    # last part's alone); a part killed outright wrote none.
    earlier_mqtt = read_json(out / SERVER_FILE).get("mqtt") if resumed_from is not None else None
    outcome: dict[str, Any] = {
        "run": run,
        "resumed_from_window": resumed_from,
        **stop_fields(None),
        "finished": False,
    }
    clock = ScaledClock(options.time_scale, start=snapshot.time if snapshot is not None else 0.0)
    known = _KnownRounds(snapshot.book if snapshot is not None else None)
    mqtt = MqttServerEndpoint(
        broker,
        run=run,
        expected_params=int(population.initial_params.size),
        max_message_bytes=message_limit(scenario, int(population.initial_params.size)),
        max_partial_bytes=partial_limit(scenario, int(population.initial_params.size)),
        reconnect=reconnect_policy(options),
        seed=scenario.seed,
        lineage=snapshot.incarnations if snapshot is not None else (),
        aggregators=aggregator_ids(scenario.aggregators.count),
        clients=[plan.client_id for plan in population.plans],
        known_rounds=known,
        compressions={plan.client_id: plan.group.compression for plan in population.plans},
        least_kept=least_kept_counts(population.plans, int(population.initial_params.size)),
    )
    outcome["incarnation"] = mqtt.incarnation.current
    try:
        with (
            _append_to(out / METRICS_FILE) as metrics,
            _append_to(out / APPLIED_FILE) as applied,
        ):
            async with connected(mqtt, stop) as made:
                joined = (await _joined(mqtt, population, options, stop, resumed=snapshot is not None)
                          if made else None)
                if joined is None:
                    outcome.update(stop_fields(RunStop(RunStopKind.SIGNAL, (
                        "stopped by a signal before the first window" if made
                        else STOPPED_BEFORE_CONNECTING))))
                    return outcome
                if (snapshot is None or options.wait_on_resume) and options.wait_for_clients > 0:
                    # scenario time starts with window 1, or goes on from the checkpoint's
                    clock = ScaledClock(options.time_scale,
                                        start=snapshot.time if snapshot is not None else 0.0)
                checkpoints = Checkpoints(checkpoint, mqtt)
                server = _server_actor(population, clock, mqtt, snapshot, joined)
                known.book = server.book
                before_publish = _BeforePublish(mqtt, checkpoints, server)
                monitor = _ServerMonitor(scenario, server, mqtt, checkpoints, metrics, applied)
                before_publish.stop_reason = lambda: monitor.stop_reason
                try:
                    finished, _ = await unless_stopped(server.run(monitor.on_window), stop)
                    outcome["finished"] = finished
                    if finished:  # the clients stop at once (a signal leaves room to resume)
                        await before_publish.announce_end(server.version, clock.now())
                        outcome.update(await _after_the_end(
                            mqtt, server, options, stop, before_publish.running_at_end))
                    else:
                        monitor.stop_reason = RunStop(RunStopKind.SIGNAL, "stopped by a signal")
                finally:
                    outcome.update(_server_outcome(server, monitor.stop_reason, clock))
                    # (before the receipts it leads to go out; a finished run's end marked)
                    await checkpoints.drain(str(monitor.stop_reason) if outcome["finished"]
                                            else None)
    finally:
        outcome.update(
            {
                "mqtt": add_counts(add_counts({}, earlier_mqtt), mqtt.stats.as_dict()),
                "checkpoints_written": checkpoint.saves,
                "checkpoint_seconds_max": max(checkpoint.seconds, default=None),
                # Received but never judged: arrived after the last window closed.
                "unjudged_updates": mqtt.unacknowledged,
                "wall_seconds": wallclock.perf_counter() - started,
            }
        )
        write_json(out / SERVER_FILE, outcome)
    if outcome.get("finished") and not mqtt.stats.received:
        # (a stranger's server, started by hand without --wait-for-clients, ran its windows
        # to the end before any client had started, and said nothing of it)
        _log.warning("the run ended without a message from any client: were they started, "
                     "on this broker and run? (--wait-for-clients makes the first window wait "
                     "for them)", run=run)
    return outcome


async def _after_the_end(endpoint: MqttServerEndpoint, server: ServerActor,
                         options: DeploymentOptions, stop: asyncio.Event | None,
                         running: set[str]) -> dict[str, Any]:
    """Once the end is announced: the final model's evaluation, then the final statuses of
    the clients ``running`` when it was (:func:`_final_statuses`)."""
    final = server.evaluate_final()  # the model the run ends with
    return {"final_evaluation": None if final is None else asdict(final),
            "final_statuses": await _final_statuses(endpoint, server,
                                                    options.final_status_wait, stop, running)}


MAX_LISTED_MISSING = 20
"""At most this many ids of the clients whose final status never came, in ``server.json``."""


async def _final_statuses(endpoint: MqttServerEndpoint, server: ServerActor, bound: float,
                          stop: asyncio.Event | None, awaited: set[str]) -> dict[str, Any]:
    """After the end of the run: take what arrives (statuses judged and kept as any are,
    updates counted as after the end) until every client of ``awaited`` (those still running
    when the end was announced: one never heard from, or stopped before, is not awaited) has
    sent its final status (``ClientStatus.unacknowledged`` set; the actor's own "done" comes
    first; one judged already before the wait counts), for at most ``bound`` wall seconds
    whatever arrives, or until ``stop``. A client that never answers keeps its last status.
    Returns what ``server.json`` says of the wait, with the statuses refused meanwhile (by
    the book, or from a client not awaited; no window's line counts them any more; the
    endpoint's own refusals are in its ``mqtt`` counters)."""
    kept = server.statuses
    # only shrinks: a flood of statuses keeps nothing more
    waiting = {c for c in awaited if c not in kept or kept[c].unacknowledged is None}
    rejected = 0

    async def take() -> None:
        nonlocal rejected
        while waiting:
            message = await endpoint.receive()
            if not isinstance(message, ClientStatus):
                await server.take(message)
            elif message.client_id not in awaited or not server.accept_status(message):
                # (a client that had stopped, or was never heard from, has nothing to say
                # now: its kept status stays, and nothing it claims enters the totals)
                rejected += 1
            elif message.unacknowledged is not None:
                waiting.discard(message.client_id)

    started = wallclock.perf_counter()
    if waiting and bound > 0:
        with contextlib.suppress(TimeoutError, TransportError):
            await unless_stopped(asyncio.wait_for(take(), bound), stop)
    waited = wallclock.perf_counter() - started
    if waiting:
        _log.warning("clients sent no final status: their last statuses are kept",
                     count=len(waiting), clients=sorted(waiting)[:MAX_LISTED_MISSING],
                     waited=round(waited, 3))
    return {"awaited": len(awaited), "received": len(awaited) - len(waiting),
            "missing": sorted(waiting)[:MAX_LISTED_MISSING], "rejected": rejected,
            "waited_seconds": waited, "bound_seconds": bound}


async def _joined(mqtt: MqttServerEndpoint, population: Population, options: DeploymentOptions,
                  stop: asyncio.Event | None, *, resumed: bool) -> dict[str, ClientStatus] | None:
    """The clients' statuses the first window starts from: those of every client after
    ``--wait-for-clients`` (a fresh run, or a resumed one under ``--wait-on-resume``; nothing
    waited for otherwise on a resumed one: ``{}``), or None if a signal came first."""
    if (resumed and not options.wait_on_resume) or options.wait_for_clients <= 0:
        return {}
    ids = [p.client_id for p in population.plans]
    waited, statuses = await unless_stopped(
        _wait_for_clients(mqtt, ids, options.wait_for_clients), stop)
    return statuses if waited else None


def _prepare_out(out: Path, population: Population, windows_kept: int) -> Path:
    """The server's output directory ``out``, made, with the resolved scenario written and the
    per-window files cut back to the ``windows_kept`` a resumed checkpoint covers."""
    out.mkdir(parents=True, exist_ok=True)
    # Replaced, not written in place: a link there (a run directory handed over) is replaced,
    # never written through (docs/SECURITY.md, "Directories someone else prepared").
    write_atomically(out / SCENARIO_FILE,
                     dump_scenario(population.scenario, dataset_path=population.dataset_path),
                     durability="durable")
    for name in (METRICS_FILE, APPLIED_FILE):
        keep_windows_through(out / name, windows_kept)
    return out


def _append_to(path: Path) -> IO[str]:
    """``path`` (a per-window JSON-lines file) opened for appending, created if missing; a
    symbolic link there is refused, never appended through (:func:`~fedsim.atomic.open_log`:
    an attacker's review, session 64, had a dangling ``metrics.jsonl`` link create a file
    elsewhere and the server's lines written to it)."""
    return open(open_log(path), "a", encoding="utf-8")


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


class _KnownRounds:
    """The rounds the server knows each client released, told with its welcomes and receipts
    (:class:`~fedsim.transports.mqtt.MqttServerEndpoint`'s ``known_rounds``): the server
    actor's book once it exists, the checkpoint's before it (a fresh server knows none)."""

    def __init__(self, saved: BookState | None) -> None:
        self.saved = saved
        self.book: ClientBook | None = None

    def __call__(self, client_id: str) -> int:
        if self.book is not None:
            return self.book.known_rounds(client_id)
        return self.saved.known_rounds(client_id) if self.saved is not None else 0


def _server_actor(
    population: Population,
    clock: ScaledClock,
    mqtt: MqttServerEndpoint,
    snapshot: ServerSnapshot | None,
    joined: Mapping[str, ClientStatus],
) -> ServerActor:
    """The scenario's server actor on the MQTT endpoint, restored from ``snapshot`` (and
    renewed, see :mod:`fedsim.runtime.deployed.deployment`) if there is one. The checkpoint
    before each broadcast is a separate, explicit step (:class:`_BeforePublish`)."""
    server = make_server_actor(
        population, clock=clock, endpoint=mqtt, evaluate=make_evaluator(population)
    )
    if snapshot is not None:
        server.restore(snapshot)
        server.renew_version()
        _log.info(
            "server resumed from checkpoint",
            window=snapshot.windows_closed,
            version=snapshot.version,
            renewed_version=server.version,
        )
    for status in joined.values():  # (after a restore: what the clients say now)
        server.accept_status(status)
    server.incarnations = mqtt.incarnation.all  # kept by every checkpoint
    server.shed_on_arrival = True  # an overload's backlog is judged as it arrives
    return server


def _server_outcome(server: ServerActor, stop_reason: RunStop | None, clock: ScaledClock
                    ) -> dict[str, Any]:
    return {
        **stop_fields(stop_reason),
        "final_version": server.version,
        "windows": server.windows_closed,
        "last_accuracy": server.last_accuracy,
        "time": clock.now(),
        "statuses": {c: asdict(s) for c, s in sorted(server.statuses.items())},
        # Clients whose claimed rounds were adopted (the server had no record of them).
        "adopted_clients": server.book.adoptions,
        "updates_after_end": server.updates_after_end,
        # (from the clients' final statuses: a client that sent none is not reported)
        RELEASED_UNACKNOWLEDGED: released_unacknowledged(
            {c: s.unacknowledged for c, s in server.statuses.items()}),
    }
