"""One scenario, one process, deterministic virtual time: the virtual-time run.

:func:`run_scenario` builds the population (:func:`~fedsim.runtime.population.build_population`:
data, partition, model, per-client plans), one durable
:class:`~fedsim.privacy.ledger.PrivacyLedger` and one :class:`ClientActor` per client, the
:class:`ServerActor`, and the simulated network between them, and runs them on the
:class:`~fedsim.runtime.simulated.kernel.VirtualTimeLoop` until the stop condition holds (checked at the
end of each server window). Availability (on/off periods, crashes and rejoins) is played out
here in virtual time; the run directory is written by
:func:`~fedsim.runtime.run_outputs.write_run_outputs` from the run's
:class:`~fedsim.runtime.run_record.RunRecord`.

Every random draw comes from the scenario seed through the :class:`SeedTree`
(``client/<id>/train`` for batches and noise, ``client/<id>/speed``, ``client/<id>/availability``,
``network``, ``partition``, ``server/participation``, ``model-init``), and nothing reads the wall
clock, so the same scenario and seed give byte-identical files. Wall time goes only to
``timing.json``.
"""

from __future__ import annotations

import asyncio
import io
import time as wallclock
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from fedsim.config.loading import LoadedScenario, dump_scenario
from fedsim.config.network import client_links
from fedsim.logging import get_logger, set_population
from fedsim.privacy.ledger import PrivacyLedger
from fedsim.protocol.norms import measured_for_sender
from fedsim.runtime.actors.aggregator import aggregator_ids
from fedsim.runtime.actors.client import Trainer
from fedsim.runtime.actors.exposure import client_exposure, invitation_positions
from fedsim.runtime.actors.releases import Releases
from fedsim.runtime.actors.server import ServerActor, WindowReport
from fedsim.runtime.actors.stops import RunStop
from fedsim.runtime.actors.tasks import helper_tasks
from fedsim.runtime.allocator import release_free_memory
from fedsim.runtime.assembly import (
    make_aggregator_actor,
    make_client_actor,
    make_evaluator,
    make_server_actor,
)
from fedsim.runtime.dp_pca import pca_components, release_projection
from fedsim.runtime.incarnations import ClientRecord, crashes_and_rejoins
from fedsim.runtime.population import BatchedTrainer, ClientPlan, Population, build_population
from fedsim.runtime.run_outputs import (
    FINISHED_STATES,
    LEDGER_DIR,
    METRICS_FILE,
    SCENARIO_FILE,
    check_unused,
    client_rows,
    json_line,
    write_run_outputs,
)
from fedsim.runtime.run_record import RunRecord, StoppedClient
from fedsim.runtime.simulated.availability import on_off_periods
from fedsim.runtime.simulated.kernel import VirtualClock, run_virtual
from fedsim.runtime.simulated.memory import (
    long_lived_spared,
    speed_streams_parked,
)
from fedsim.runtime.simulated.run_ledgers import RunLedgers
from fedsim.training.batched import RoundBatcher
from fedsim.training.rounds import PendingRound
from fedsim.transports.link_model import LinkModel, link_model
from fedsim.transports.simulated import SimulatedNetwork

__all__ = ["ClientRecord", "RunResult", "TrainerHook", "run_scenario"]

_log = get_logger("fedsim.runtime.simulated.simulation")

TrainerHook = Callable[[ClientPlan, Trainer], Trainer]
"""Wraps each client's trainer when the run builds it (instrumentation: benchmarks/simulator.py
times every round through one)."""

BatcherFactory = Callable[[Population], RoundBatcher]
"""Builds the run's batcher (the executor of batched passes: in-process by default, or on Ray
workers, :mod:`fedsim.runtime.simulated.ray_executor`)."""


def _local_batcher(population: Population) -> RoundBatcher:
    # Each update measured as the pass makes it: the client's check then reads no cold vector.
    return RoundBatcher(population.model, measure=measured_for_sender)


@dataclass
class RunResult:
    """What :func:`run_scenario` wrote, plus the numbers its callers print."""

    out_dir: Path
    summary: dict[str, Any]
    wall_seconds: float
    sample_grads: int
    final_params: np.ndarray
    metrics: list[dict[str, Any]] = field(default_factory=list)
    applied_log: list[tuple[str, int, int, int]] = field(default_factory=list)
    """(client_id, round, base_version, version it was applied to) of every applied update
    (kept only with ``keep_history``; empty otherwise)."""
    clients: dict[str, ClientRecord] = field(default_factory=dict)
    cpu_seconds: float = 0.0
    """CPU time of the simulation loop (all threads of this process)."""
    setup_seconds: float = 0.0
    """Wall seconds the run took to build its ledgers, actors and network (in ``wall_seconds``)."""
    client_rows: list[dict[str, Any]] = field(default_factory=list)
    """The rows of ``clients.csv`` as computed (:func:`~fedsim.runtime.run_outputs.client_rows`:
    numbers before they are written as text, an unbounded epsilon ``inf``)."""


class _RoundSchedule:
    """The runtime's record of its clients' pending rounds, which the batcher asks
    (:class:`fedsim.training.batched.RoundSchedule`): a round is its client's (by the client's
    trainer), it ends when the client actor says (:attr:`ClientActor.split_deadline`), and a
    model can next reach the client at the earlier of the server's next possible publish and
    the next model in flight to it. Nothing is written on the rounds."""

    def __init__(self, owners: dict[int, str], clients: dict[str, ClientRecord],
                 server: ServerActor, network: SimulatedNetwork) -> None:
        self.owners, self.clients, self.server, self.network = owners, clients, server, network

    def _owner(self, round_: PendingRound) -> str | None:
        return self.owners.get(id(round_.trainer))

    def ends_at(self, round_: PendingRound) -> float | None:
        owner = self._owner(round_)
        actor = self.clients[owner].actor if owner is not None else None
        return actor.split_deadline if actor is not None else None

    def horizon(self, rounds: Sequence[PendingRound]) -> list[float]:
        network = self.network
        publish = self.server.earliest_publish(network.next_arrival("uplink"))
        return [min(publish, network.next_arrival("downlink") if owner is None
                    else network.next_arrival_to(owner))
                for owner in (self._owner(r) for r in rounds)]


class _Simulation:
    def __init__(
        self,
        population: Population,
        out_dir: Path,
        *,
        message_only: bool,
        on_window: Callable[[dict[str, Any]], None] | None,
        batch_rounds: bool = True,
        wrap_trainer: TrainerHook | None = None,
        make_batcher: BatcherFactory | None = None,
        keep_history: bool = False,
    ) -> None:
        self.make_batcher = make_batcher
        self.keep_history = keep_history
        self.population = population
        self.scenario = population.scenario
        self.out_dir = out_dir
        self.message_only = message_only
        self.on_window_hook = on_window
        self.wrap_trainer = wrap_trainer
        self.batch_rounds = batch_rounds and not message_only
        self.batcher: RoundBatcher | None = None
        self.metrics: list[dict[str, Any]] = []
        self.applied_log: list[tuple[str, int, int, int]] = []
        self.clients: dict[str, ClientRecord] = {}
        self.stopped: list[StoppedClient] = []
        self.stop_reason: RunStop | None = None
        self.cpu_seconds = 0.0
        self.setup_seconds = 0.0  # wall seconds from the run's start to the server's first window
        self.network_stats: dict[str, Any] = {}
        self._remaining_cache: dict[str, tuple[int, float | None]] = {}
        self._positions = invitation_positions(p.client_id for p in population.plans)
        self._dropped_seen = 0
        self._late_partials = 0
        self.ledgers: RunLedgers | None = None  # opened with the run (main)
        self._spare_set_up: Callable[[], None] = lambda: None  # see memory.long_lived_spared
        self._metrics_file: io.TextIOBase | None = None
        self.final_evaluation: dict[str, Any] | None = None

    # -- setup --------------------------------------------------------------------------------
    def _network(self, clock: VirtualClock) -> SimulatedNetwork:
        network = self.scenario.network
        overrides = {
            p.client_id: p.group.network
            for p in self.population.plans
            if p.group.network is not None
        }
        links: dict[str, LinkModel | dict[str, LinkModel]] = {}
        for index, direction in enumerate(("uplink", "downlink")):
            default = link_model(getattr(network, direction))
            if not overrides:
                links[direction] = default
                continue
            per_client: dict[str, LinkModel] = {}
            shared = getattr(network, direction)
            for plan in self.population.plans:
                link = client_links(network, plan.group.network)[index]
                per_client[plan.client_id] = default if link is shared else link_model(link)
            links[direction] = per_client
        aggregators = self.scenario.aggregators
        return SimulatedNetwork(
            clock,
            rng=self.population.tree.numpy("network"),
            uplink=links["uplink"],
            downlink=links["downlink"],
            max_message_bytes=network.max_message_bytes,
            expected_params=self.population.initial_params.size,
            aggregators=aggregator_ids(aggregators.count),
            aggregator_link=LinkModel(latency=aggregators.latency.sampler(),
                                      drop=aggregators.drop),
        )

    def _start_actor(self, client: ClientRecord, clock: VirtualClock, network: SimulatedNetwork) -> None:
        plan = client.plan
        actor = make_client_actor(
            plan,
            clock=clock,
            endpoint=network.client_endpoint(plan.client_id),
            trainer=client.trainer,
            ledger=client.ledger,
            speed_rng=self.population.tree.numpy("client", plan.client_id, "speed", client.crashes),
            delta=self.scenario.privacy.delta,
            exposure=client_exposure(self.scenario, self._positions, plan.client_id),
            park_speed_stream=speed_streams_parked(len(self.population.plans)),
            # one list for every incarnation: the client's history in order
            releases=None if client.history is None else Releases(kept=client.history),
        )
        actor.set_online(client.online)
        client.actor = actor
        client.task = asyncio.create_task(actor.run(), name=f"client-{plan.client_id}")

    def _rejoin(self, client: ClientRecord, clock: VirtualClock,
                network: SimulatedNetwork) -> None:
        """A crashed client's new process: it re-reads its ledger from disk (spending is
        never forgotten) and starts a new actor."""
        assert self.ledgers is not None
        client.ledger.close()
        client.ledger = self.ledgers.open(client.plan)
        self._start_actor(client, clock, network)

    def _start_aggregators(self, clock: VirtualClock,
                           network: SimulatedNetwork) -> list[asyncio.Task[None]]:
        """The scenario's aggregation nodes, each on its endpoint (none: an empty list)."""
        return [asyncio.create_task(make_aggregator_actor(
            self.population, aggregator_id, clock=clock,
            endpoint=network.aggregator_endpoint(aggregator_id)).run(), name=aggregator_id)
            for aggregator_id in network.aggregator_ids]

    # -- per-window bookkeeping ------------------------------------------------------------------
    def _remaining_epsilon(self, client: ClientRecord) -> float | None:
        if client.plan.group.budget is None:
            return None
        steps = client.ledger.steps
        count = sum(s.count for s in steps)
        cached = self._remaining_cache.get(client.plan.client_id)
        if cached is not None and cached[0] == count:
            return cached[1]
        remaining = client.ledger.remaining_epsilon
        value = float(remaining) if remaining is not None else None
        self._remaining_cache[client.plan.client_id] = (count, value)
        return value

    def _min_remaining(self) -> float | None:
        values = [v for c in self.clients.values() if (v := self._remaining_epsilon(c)) is not None]
        return min(values) if values else None

    def _note_stops(self) -> None:
        known = {entry["client_id"] for entry in self.stopped}
        for client in self.clients.values():
            actor = client.actor
            if (
                actor is not None
                and actor.state in FINISHED_STATES
                and client.plan.client_id not in known
                and actor.stop_kind is not None  # set with the finished state (_stop)
            ):
                self.stopped.append(
                    {
                        "client_id": client.plan.client_id,
                        "time": actor.stopped_at,
                        "reason": actor.stop_reason,
                        "kind": actor.stop_kind,
                    }
                )

    def _check_tasks(self) -> None:
        for client in self.clients.values():
            task = client.task
            if task is not None and task.done() and not task.cancelled():
                error = task.exception()
                if error is not None:
                    raise error  # a bug in an actor must not be silently swallowed

    def _window_done(self, report: WindowReport, network: SimulatedNetwork) -> bool:
        release_free_memory()  # thousands of clients fragment the heap (runtime/allocator.py)
        self._check_tasks()
        self._note_stops()
        stats = network.stats
        # Updates lost with a partial (its link, or after the end of the run) are in flight too.
        dropped = stats.uplink.dropped + stats.uplink.lost + network.partial_updates_lost
        self._late_partials += report.lost_in_partials
        dropped += self._late_partials
        evaluated = report.accuracy is not None
        active = sum(not c.finished for c in self.clients.values())
        line = report.metrics_line(
            rejected=report.rejected,
            dropped_in_flight=dropped - self._dropped_seen,
            active_clients=active,
            min_remaining_epsilon=self._min_remaining() if evaluated else None,
        )
        self._dropped_seen = dropped
        self.metrics.append(line)
        if self.keep_history:
            self.applied_log.extend((c, r, base, before) for (c, r, base), before
                                    in zip(report.applied_updates, report.applied_to, strict=True))
        assert self._metrics_file is not None
        self._metrics_file.write(json_line(line))
        self._metrics_file.flush()
        if self.on_window_hook is not None:
            self.on_window_hook(line)
        links = network.aggregator_stats  # (zeros without aggregators)
        in_flight = stats.uplink.in_flight + links["uplink"]["in_flight"]
        self.stop_reason = report.stop_reason(
            self.scenario.stop, active_clients=active, in_flight=in_flight
        )
        return self.stop_reason is not None

    # -- the run --------------------------------------------------------------------------------
    def make_ledgers_durable(self, *, or_log: bool = False) -> None:
        """The run's ledgers' spends made durable (:meth:`RunLedgers.make_durable`; a run
        that failed or was interrupted: ``or_log``, a failure logged, not raised)."""
        if self.ledgers is None:
            return  # none opened
        if or_log:
            self.ledgers.make_durable_or_log()
        else:
            self.ledgers.make_durable()

    def _open_ledgers(self) -> dict[str, PrivacyLedger]:
        """Every client's ledger, with the DP-PCA releases charged to them and their shared
        projection applied to the population (before anything holds its features); a DP
        normalisation is charged later, by each client's trainer."""
        population = self.population
        run_ledgers = self.ledgers = RunLedgers(self.out_dir, len(population.plans))
        ledgers = {plan.client_id: run_ledgers.open(plan) for plan in population.plans}
        if pca_components(self.scenario) is not None:
            population.project(release_projection(
                population, ledgers, self.out_dir / LEDGER_DIR, message_only=self.message_only))
        return ledgers

    async def main(self, clock: VirtualClock) -> ServerActor:
        setup_started = wallclock.perf_counter()
        population = self.population
        network = self._network(clock)
        ledgers = self._open_ledgers()
        # One batcher for the run: the rounds clients begin are computed together when the
        # first of them is needed (see fedsim.training.batched).
        batcher = self.batcher = (
            (self.make_batcher or _local_batcher)(population) if self.batch_rounds else None)
        owners: dict[int, str] = {}  # id of a client's LocalTrainer -> its client id
        for plan in population.plans:
            ledger = ledgers[plan.client_id]
            trainer: Trainer = population.trainer(
                plan, message_only=self.message_only, batcher=batcher, ledger=ledger
            )
            if isinstance(trainer, BatchedTrainer):
                owners[id(trainer.trainer)] = plan.client_id
            if self.wrap_trainer is not None:
                trainer = self.wrap_trainer(plan, trainer)
            self.clients[plan.client_id] = ClientRecord(
                plan, trainer, ledger, history=[] if self.keep_history else None)
        server = make_server_actor(
            population,
            clock=clock,
            endpoint=network.server_endpoint(),
            evaluate=None if self.message_only else make_evaluator(population),
        )
        if batcher is not None and any(g.interrupt == "switch" for g in self.scenario.clients.groups):
            # Rounds a w-hat may still split wait in the batcher until none can (see there).
            network.track_arrivals = True
            batcher.schedule = _RoundSchedule(owners, self.clients, server, network)
        async with helper_tasks() as tasks:
            tasks.extend(self._start_aggregators(clock, network))  # before the first model
            for client in self.clients.values():
                self._start_actor(client, clock, network)
                availability = client.plan.group.availability
                if availability.online is not None:
                    tasks.append(asyncio.create_task(
                        on_off_periods(client, clock, network, population.tree)))
                if availability.crashes is not None:
                    tasks.append(asyncio.create_task(crashes_and_rejoins(
                        client, clock,
                        population.tree.numpy("client", client.plan.client_id, "crashes"),
                        stopped=self.stopped,
                        rejoin=lambda c: self._rejoin(c, clock, network))))
            self.setup_seconds = wallclock.perf_counter() - setup_started
            self._spare_set_up()  # the clients, ledgers and actors live for the run
            try:
                await server.run(lambda report: self._window_done(report, network))
            finally:  # the clients' current incarnations end with the helpers
                tasks.extend(c.task for c in self.clients.values() if c.task is not None)
        self._check_tasks()
        self.network_stats = dict(network.stats.as_dict())
        if network.aggregator_ids:
            self.network_stats["aggregators"] = network.aggregator_stats
        # The model the run ends with (the last periodic evaluation may be of an older one).
        final = server.evaluate_final()
        self.final_evaluation = None if final is None else asdict(final)
        return server

    def record(self, server: ServerActor, wall_seconds: float) -> RunRecord:
        """The finished run, for :func:`write_run_outputs`."""
        batcher = self.batcher
        return RunRecord(
            scenario=self.scenario,
            out_dir=self.out_dir,
            metrics=self.metrics,
            clients=[client.outcome() for client in self.clients.values()],
            stopped=self.stopped,
            stop_reason=self.stop_reason,
            final_version=server.version,
            network=self.network_stats,
            wall_seconds=wall_seconds,
            cpu_seconds=self.cpu_seconds,
            rounds_batched=batcher.rounds_batched if batcher is not None else 0,
            batched_passes=batcher.batches if batcher is not None else 0,
            rounds_recomputed=batcher.recomputed if batcher is not None else 0,
            final_evaluation=self.final_evaluation,
        )

    def run(self) -> tuple[ServerActor, float]:
        self.out_dir.mkdir(parents=True, exist_ok=True)
        (self.out_dir / SCENARIO_FILE).write_text(
            dump_scenario(self.scenario, dataset_path=self.population.dataset_path),
            encoding="utf-8",
        )
        started, cpu_started = wallclock.perf_counter(), wallclock.process_time()
        with open(self.out_dir / METRICS_FILE, "w", encoding="utf-8") as metrics:
            self._metrics_file = metrics
            with torch.random.fork_rng(devices=[]), long_lived_spared() as spare:
                self._spare_set_up = spare
                server = run_virtual(self.main)
        # CPU time of this process: on a shared machine it says what the run costs.
        self.cpu_seconds = wallclock.process_time() - cpu_started
        return server, wallclock.perf_counter() - started


def run_scenario(
    loaded: LoadedScenario,
    out_dir: str | Path,
    *,
    message_only: bool = False,
    on_window: Callable[[dict[str, Any]], None] | None = None,
    population: Population | None = None,
    batch_rounds: bool = True,
    wrap_trainer: TrainerHook | None = None,
    make_batcher: BatcherFactory | None = None,
    keep_history: bool = False,
) -> RunResult:
    """Run a scenario under virtual time and write its run directory to ``out_dir``.

    ``out_dir`` must not already hold ledgers (a ledger is never reset, so reusing a run
    directory would silently continue spending). ``message_only`` replaces training by its
    virtual duration (zero updates, the same privacy events). With ``batch_rounds`` (the
    default) rounds that overlap in virtual time are computed together
    (:mod:`fedsim.training.batched`); without, each round alone, as a client on its own
    computes it (same randomness, results equal up to floating-point summation order).
    ``wrap_trainer(plan, trainer)`` may wrap each client's trainer (the same interface, e.g. to
    time its rounds). ``make_batcher(population)`` builds the executor of the batched passes
    (default in-process; :func:`fedsim.runtime.simulated.ray_executor.ray_batcher` runs them on Ray).
    ``keep_history``: keep every applied update (:attr:`RunResult.applied_log`) and every
    client's released rounds (:meth:`ClientRecord.released_rounds`) in memory, for analyses
    and tests; off by default, as they grow with the run's length (a run's outputs are its
    files, and its clients' sums: :meth:`ClientRecord.releases`).
    """
    out = Path(out_dir)
    check_unused(out)
    # Per-client events at info for a few clients, at debug for a population (10^6 clients
    # logged 643,444 "client stopped" lines at info through this entry point).
    set_population(loaded.scenario.clients.total)
    previous_threads = torch.get_num_threads()
    torch.set_num_threads(loaded.scenario.torch_threads)
    try:
        population = population or build_population(loaded)
        sim = _Simulation(population, out, message_only=message_only, on_window=on_window,
                          batch_rounds=batch_rounds, wrap_trainer=wrap_trainer,
                          make_batcher=make_batcher, keep_history=keep_history)
        started = wallclock.perf_counter()
        try:
            server, wall_seconds = sim.run()
            sim.make_ledgers_durable()
            record = sim.record(server, wall_seconds)
            rows = client_rows(record)
            summary = write_run_outputs(record, rows)
        except KeyboardInterrupt:  # Ctrl-C, or SIGTERM under fedsim.runtime.interrupted
            from fedsim.runtime.interrupted import write_interrupted_outputs

            sim.make_ledgers_durable(or_log=True)
            write_interrupted_outputs(sim, wallclock.perf_counter() - started)
            raise
        finally:
            sim.make_ledgers_durable(or_log=True)  # a failed run's (done on the paths above)
            for client in sim.clients.values():
                client.ledger.close()
            if sim.ledgers is not None:
                sim.ledgers.close()
    finally:
        torch.set_num_threads(previous_threads)
    return RunResult(
        out,
        summary,
        wall_seconds,
        record.sample_grads,
        server.params.copy(),
        sim.metrics,
        sim.applied_log,
        sim.clients,
        sim.cpu_seconds,
        sim.setup_seconds,
        rows,
    )
