"""One scenario, one process, deterministic virtual time: build everything, run, write the run
directory.

:func:`run_scenario` loads the data, splits it among the client groups (``data_share``) and
within each group (``partition``), builds one shared model (trainers load each round's
parameters into it), one :class:`~fedsim.training.LocalTrainer`, one durable
:class:`~fedsim.privacy.ledger.PrivacyLedger` and one :class:`ClientActor` per client, the
:class:`ServerActor`, and the simulated network between them, and runs them on the
:class:`~fedsim.runtime.kernel.VirtualTimeLoop` until the stop condition holds (checked at the
end of each server window).

Every random draw comes from the scenario seed through the :class:`SeedTree`
(``client/<id>/train`` for batches and noise, ``client/<id>/speed``, ``client/<id>/availability``,
``network``, ``partition``, ``server/participation``, ``model-init``), and nothing reads the wall
clock, so the same scenario and seed give byte-identical files. Wall time goes only to
``timing.json``.

Run directory (read by :mod:`fedsim.reporting`)::

    scenario.resolved.yaml  metrics.jsonl  clients.csv  summary.json  ledgers/<id>.jsonl
    timing.json (wall-clock seconds; the only file that differs between identical runs)
"""

from __future__ import annotations

import asyncio
import csv
import io
import json
import math
import time as wallclock
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import structlog
import torch

from fedsim.aggregation import make_step_size, make_strategy
from fedsim.config.loading import LoadedScenario, dump_scenario, resolve_path
from fedsim.config.schema import ClientGroup, Link, Scenario
from fedsim.errors import ConfigError, FedsimError
from fedsim.privacy.accountant import make_accountant
from fedsim.privacy.events import GaussianStep, group_steps
from fedsim.privacy.ledger import Budget, PrivacyLedger
from fedsim.privacy.schedules import Schedule
from fedsim.runtime.client import ClientActor, RoundRecord, StalenessPolicy
from fedsim.runtime.clock import Clock
from fedsim.runtime.exposure import (
    ClientExposure,
    client_exposure,
    expected_sample_grads,
    privacy_caveats,
)
from fedsim.runtime.kernel import VirtualClock, run_virtual
from fedsim.runtime.rng import SeedTree
from fedsim.runtime.schedules import make_schedule
from fedsim.runtime.server import ClientInfo, ServerActor, WindowReport
from fedsim.training import LocalTrainer, evaluate, flat_params, load_flat_params
from fedsim.training.batched import RoundBatcher
from fedsim.training.data import load_dataset, partition
from fedsim.training.dpsgd import step_for
from fedsim.training.local import DoneRound, PendingRound, RoundResult
from fedsim.training.models import build_scenario_model
from fedsim.transports.base import Endpoint
from fedsim.transports.simulated import LinkModel, SimulatedNetwork

__all__ = [
    "ClientPlan",
    "Population",
    "RunResult",
    "build_population",
    "client_ids",
    "make_client_actor",
    "make_evaluator",
    "make_server_actor",
    "open_ledger",
    "run_scenario",
]

_log = structlog.get_logger("fedsim.runtime.simulation")

CLIENT_COLUMNS = (
    "client_id",
    "group",
    "num_samples",
    "batch_size",
    "sampling",
    "q",
    "rounds",
    "steps",
    "sigma",
    "clip",
    "epsilon",
    "mu_clt",
    "budget_epsilon",
    "remaining_epsilon",
    "state",
    "stopped_at",
    "stop_reason",
)


# ---------------------------------------------------------------------------------------------
# Building the population


@dataclass(frozen=True, eq=False)
class ClientPlan:
    """A client's static description: who it is, which records it holds, its DP posture."""

    client_id: str
    group: ClientGroup
    indices: np.ndarray
    schedule: Schedule
    declared_samples: int | None = None  # public size (runtime/exposure.py); None: len(indices)

    @property
    def num_samples(self) -> int:
        return len(self.indices)

    @property
    def public_samples(self) -> int:
        return self.declared_samples or len(self.indices)

    @property
    def q(self) -> float:
        return self.group.batch_size / self.public_samples


@dataclass(eq=False)
class Population:
    """Everything a run needs that does not depend on the clock or the network."""

    scenario: Scenario
    tree: SeedTree
    model: torch.nn.Module
    initial_params: np.ndarray
    train_x: torch.Tensor
    train_y: torch.Tensor
    test_x: torch.Tensor
    test_y: torch.Tensor
    plans: list[ClientPlan]
    dataset_path: Path | None

    def trainer(
        self,
        plan: ClientPlan,
        *,
        message_only: bool = False,
        generator: torch.Generator | None = None,
        batcher: RoundBatcher | None = None,
    ) -> LocalTrainer | VirtualDurationTrainer | BatchedTrainer:
        """The client's trainer, its batches and noise drawn from ``client/<id>/train`` (or
        from ``generator``: a restarted client process must not replay released noise); with a
        ``batcher`` its begun rounds wait there to be computed together with other clients'."""
        group = plan.group
        if generator is None:
            generator = self.tree.torch("client", plan.client_id, "train")
        if message_only:
            return VirtualDurationTrainer(plan, self.initial_params.size, generator)
        index = torch.from_numpy(plan.indices)
        # index_select: several times faster than advanced indexing for image tensors on CPU.
        trainer = LocalTrainer(
            self.model,
            self.train_x.index_select(0, index),
            self.train_y.index_select(0, index),
            batch_size=group.batch_size,
            sampling=group.sampling,
            clip=plan.schedule,
            noise=plan.schedule,
            local_steps=group.local_steps,
            local_lr=group.local_lr,
            max_physical_batch=group.max_physical_batch,
            generator=generator,
            declared_records=plan.public_samples,
        )
        return trainer if batcher is None else BatchedTrainer(trainer, batcher)


class BatchedTrainer:
    """A client's :class:`LocalTrainer` whose begun rounds wait in the run's
    :class:`RoundBatcher` (computed with the rounds other clients began meanwhile)."""

    def __init__(self, trainer: LocalTrainer, batcher: RoundBatcher) -> None:
        self.trainer = trainer
        self.batcher = batcher

    def planned_steps(self, round_index: int) -> list[GaussianStep]:
        return self.trainer.planned_steps(round_index)

    def begin_round(self, params: np.ndarray, round_index: int) -> PendingRound:
        return self.trainer.begin_round(params, round_index, self.batcher)


class VirtualDurationTrainer:
    """Training replaced by its cost: the same privacy events and sample counts as the real
    trainer, a zero update, no gradient computed (message-only runs of the protocol)."""

    def __init__(self, plan: ClientPlan, num_params: int, generator: torch.Generator) -> None:
        self.plan = plan
        self.num_params = num_params
        self.generator = generator

    def planned_steps(self, round_index: int) -> list[GaussianStep]:
        group = self.plan.group
        sigma = float(self.plan.schedule.sigma(round_index))
        return [
            step_for(
                group.sampling, self.plan.public_samples, group.batch_size, sigma, group.local_steps
            )
        ]

    def begin_round(self, params: np.ndarray, round_index: int) -> DoneRound:
        group = self.plan.group
        steps = self.planned_steps(round_index)
        if group.sampling == "poisson":
            rate = torch.full((group.local_steps,), self.plan.q, dtype=torch.float64)
            counts = torch.binomial(
                torch.full_like(rate, self.plan.num_samples), rate, generator=self.generator
            )
            sizes = [int(c) for c in counts]
        else:
            sizes = [group.batch_size] * group.local_steps
        return DoneRound(RoundResult(
            update=np.zeros(self.num_params, np.float32),
            steps=steps,
            batch_sizes=sizes,
            clip=float(self.plan.schedule.clip(round_index)),
            sigma=steps[0].sigma,
            mean_loss=math.nan,
            sample_grads=sum(sizes),
        ))


def _client_ids(group: ClientGroup) -> list[str]:
    width = max(3, len(str(group.count - 1)))
    return [f"{group.name}-{i:0{width}d}" for i in range(group.count)]


def client_ids(scenario: Scenario) -> list[str]:
    """Every client id of a scenario, in group order (the ids :func:`build_population` uses)."""
    return [client_id for group in scenario.clients.groups for client_id in _client_ids(group)]


def _split_groups(
    labels: np.ndarray, groups: Sequence[ClientGroup], tree: SeedTree
) -> list[list[np.ndarray]]:
    """Record indices per group (by ``data_share``) and then per client (``partition``)."""
    n = len(labels)
    order = tree.numpy("partition", "groups").permutation(n)
    result: list[list[np.ndarray]] = []
    start = 0
    for index, group in enumerate(groups):
        size = int(math.floor(group.data_share * n))
        members = np.sort(order[start : start + size])
        start += size
        where = f"clients.groups[{index}]"
        if size < group.count:
            raise ConfigError(
                f"{where}: data_share {group.data_share} gives {size} records for "
                f"{group.count} clients"
            )
        scheme = group.partition
        try:
            parts = partition(
                labels[members],
                group.count,
                scheme.scheme,
                rng=tree.numpy("partition", group.name),
                alpha=scheme.alpha,
                shards_per_client=scheme.shards_per_client,
                size_sigma=scheme.size_sigma,
            )
        except FedsimError as exc:
            raise ConfigError(f"{where}: cannot partition its data: {exc}") from None
        result.append([members[p] for p in parts])
    return result


def _model_options(scenario: Scenario, train_x: torch.Tensor, num_classes: int) -> dict[str, Any]:
    """The model's options, with the input size and class count filled in from the data for
    flat-input models when the scenario does not give them."""
    options: dict[str, Any] = dict(scenario.model.options)
    if scenario.model.name in ("logreg", "mlp"):
        options.setdefault("in_features", int(np.prod(train_x.shape[1:])))
        options.setdefault("num_classes", num_classes)
    return options


def build_population(
    loaded: LoadedScenario, *, model_factory: Callable[..., torch.nn.Module] | None = None
) -> Population:
    """Data, partition, model and per-client plans (no clock, no network, no files).
    ``model_factory``: a Python callable that builds the model (instead of ``model:``)."""
    scenario = loaded.scenario
    tree = SeedTree(scenario.seed)
    dataset = scenario.dataset
    path = resolve_path(dataset.path, loaded.base_dir) if dataset.path is not None else None
    if dataset.name == "synthetic":
        train_x, train_y, test_x, test_y = load_dataset(
            "synthetic",
            seed=tree.integer("dataset"),
            num_train=dataset.num_samples,
            num_test=dataset.num_test_samples,
            num_features=dataset.num_features,
            num_classes=dataset.num_classes,
        )
    else:
        train_x, train_y, test_x, test_y = load_dataset(dataset.name, path=path)
    if dataset.test_subset is not None:
        test_x, test_y = test_x[: dataset.test_subset], test_y[: dataset.test_subset]
    labels = train_y.numpy()
    num_classes = int(max(labels.max(), test_y.max())) + 1
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(tree.integer("model-init"))
        model = build_scenario_model(
            scenario.model, _model_options(scenario, train_x, num_classes), sample=train_x[:2],
            num_classes=num_classes, factory=model_factory, base_dir=loaded.base_dir)
    plans: list[ClientPlan] = []
    split = _split_groups(labels, scenario.clients.groups, tree)
    for index, (group, parts) in enumerate(zip(scenario.clients.groups, split, strict=True)):
        where = f"clients.groups[{index}]"
        smallest = min(len(p) for p in parts)
        if group.batch_size > smallest:
            raise ConfigError(
                f"{where}.batch_size: {group.batch_size} exceeds the {smallest} records of the "
                "group's smallest client (q = m/N would be > 1); lower batch_size or raise "
                "data_share"
            )
        # One schedule per group, calibrated at the group's largest q = m/N (its smallest
        # client): a larger q costs more privacy, so the target then holds for every client.
        schedule = make_schedule(group, q=group.batch_size / smallest, where=where)
        for client_id, indices in zip(_client_ids(group), parts, strict=True):
            plans.append(ClientPlan(client_id, group, indices, schedule))
    return Population(
        scenario, tree, model, flat_params(model), train_x, train_y, test_x, test_y, plans, path
    )


# ---------------------------------------------------------------------------------------------
# Running


def open_ledger(plan: ClientPlan, path: Path) -> PrivacyLedger:
    """The client's durable ledger at ``path`` (resumed if it exists), with its group's budget
    and accountant."""
    group = plan.group
    budget = Budget(group.budget.epsilon, group.budget.delta) if group.budget else None
    return PrivacyLedger.open(
        path,
        client_id=plan.client_id,
        sampling=group.sampling,
        budget=budget,
        accountant=group.accountant,
    )


def make_client_actor(
    plan: ClientPlan,
    *,
    clock: Clock,
    endpoint: Endpoint,
    trainer: Any,
    ledger: PrivacyLedger,
    speed_rng: np.random.Generator,
    delta: float,
    exposure: ClientExposure = ClientExposure(),
) -> ClientActor:
    """The plan's :class:`ClientActor`; its rounds continue after the last one in ``ledger``
    (so ``(client, round)`` stays unique across restarts). Used by the simulation and by the
    deployed client process alike."""
    group = plan.group
    rounds_done = {record.round for record in ledger.records}
    return ClientActor(
        plan.client_id,
        clock=clock,
        endpoint=endpoint,
        trainer=trainer,
        ledger=ledger,
        local_lr=group.local_lr,
        batch_size=float(group.batch_size),
        seconds_per_sample=lambda: group.speed.sample(speed_rng),
        expected_sample_grads=expected_sample_grads(group.batch_size, group.local_steps),
        exposure=exposure,
        staleness=StalenessPolicy(
            group.staleness.max_versions_behind, group.staleness.max_distance
        ),
        max_rounds=group.rounds,
        first_round=max(rounds_done, default=-1) + 1,
        status_epsilon=lambda: (ledger.epsilon(delta), delta),
    )


def make_evaluator(population: Population) -> Callable[[np.ndarray], tuple[float, float]]:
    """Held-out (accuracy, loss) of a flat parameter vector, on the population's test set."""

    def evaluate_params(params: np.ndarray) -> tuple[float, float]:
        load_flat_params(population.model, params)
        return evaluate(population.model, population.test_x, population.test_y)

    return evaluate_params


def make_server_actor(
    population: Population,
    *,
    clock: Clock,
    endpoint: Endpoint,
    evaluate: Callable[[np.ndarray], tuple[float, float]] | None,
) -> ServerActor:
    """The scenario's :class:`ServerActor` (simulation and deployed server process alike)."""
    server_config = population.scenario.server
    return ServerActor(
        clock=clock,
        endpoint=endpoint,
        initial_params=population.initial_params,
        clients={
            p.client_id: ClientInfo(p.public_samples, p.group.local_lr, p.group.weight)
            for p in population.plans
        },
        window=server_config.window,
        strategy=make_strategy(server_config.mixing),
        step_size=make_step_size(server_config.step_size),
        evaluate=evaluate,
        eval_every=server_config.eval_every,
        broadcast_every=server_config.broadcast_every,
        max_staleness=server_config.max_staleness,
        participation=server_config.participation,
        rng=population.tree.numpy("server", "participation"),
        normalize=server_config.normalize,
    )


def _link_model(link: Link) -> LinkModel:
    return LinkModel(
        latency=link.latency.sampler(),
        drop=link.drop,
        duplicate=link.duplicate,
        reorder=link.reorder,
        bandwidth_bytes_per_s=link.bandwidth_bytes_per_s,
    )


@dataclass(eq=False)
class ClientRecord:
    """A client's runtime state across crashes."""

    plan: ClientPlan
    trainer: Any
    ledger_path: Path
    ledger: PrivacyLedger
    actor: ClientActor | None = None
    task: asyncio.Task[None] | None = None
    online: bool = True
    crashed_for_good: bool = False
    crashes: int = 0
    earlier_rounds: list[RoundRecord] = field(default_factory=list)

    def released_rounds(self) -> list[RoundRecord]:
        """Rounds released by every incarnation of this client (crashes included)."""
        return self.earlier_rounds + (self.actor.released if self.actor is not None else [])

    @property
    def state(self) -> str:
        """The current incarnation's state; "crashed" while down (for now or for good)."""
        return self.actor.state if self.actor is not None else "crashed"

    @property
    def finished(self) -> bool:
        """Will never train again: budget spent, rounds done, or crashed without rejoining."""
        return self.crashed_for_good or (
            self.actor is not None and self.actor.state in ("budget_exhausted", "done")
        )


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
    """(client_id, round, base_version, version it was applied to) of every applied update."""
    clients: dict[str, ClientRecord] = field(default_factory=dict)
    cpu_seconds: float = 0.0
    """CPU time of the simulation loop (all threads of this process)."""


class _Simulation:
    def __init__(
        self,
        population: Population,
        out_dir: Path,
        *,
        message_only: bool,
        on_window: Callable[[dict[str, Any]], None] | None,
        batch_rounds: bool = True,
    ) -> None:
        self.population = population
        self.scenario = population.scenario
        self.out_dir = out_dir
        self.message_only = message_only
        self.on_window_hook = on_window
        self.batch_rounds = batch_rounds and not message_only
        self.batcher: RoundBatcher | None = None
        self.metrics: list[dict[str, Any]] = []
        self.applied_log: list[tuple[str, int, int, int]] = []
        self.clients: dict[str, ClientRecord] = {}
        self.stopped: list[dict[str, Any]] = []
        self.stop_reason = ""
        self.cpu_seconds = 0.0
        self._remaining_cache: dict[str, tuple[int, float | None]] = {}
        self._dropped_seen = 0
        self._metrics_file: io.TextIOBase | None = None

    # -- setup --------------------------------------------------------------------------------
    def _network(self, clock: VirtualClock) -> SimulatedNetwork:
        network = self.scenario.network
        overrides = {
            p.client_id: p.group.network
            for p in self.population.plans
            if p.group.network is not None
        }
        links: dict[str, LinkModel | dict[str, LinkModel]] = {}
        for direction in ("uplink", "downlink"):
            default = _link_model(getattr(network, direction))
            if not overrides:
                links[direction] = default
                continue
            per_client: dict[str, LinkModel] = {}
            for plan in self.population.plans:
                override = plan.group.network and getattr(plan.group.network, direction)
                per_client[plan.client_id] = _link_model(override) if override else default
            links[direction] = per_client
        return SimulatedNetwork(
            clock,
            rng=self.population.tree.numpy("network"),
            uplink=links["uplink"],
            downlink=links["downlink"],
            max_message_bytes=network.max_message_bytes,
            expected_params=self.population.initial_params.size,
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
            exposure=client_exposure(self.scenario, list(self.clients), plan.client_id),
        )
        if not client.online:
            actor.online.clear()
        client.actor = actor
        client.task = asyncio.create_task(actor.run(), name=f"client-{plan.client_id}")

    # -- availability ---------------------------------------------------------------------------
    async def _on_off(
        self, client: ClientRecord, clock: VirtualClock, network: SimulatedNetwork
    ) -> None:
        availability = client.plan.group.availability
        assert availability.online is not None and availability.offline is not None
        rng = self.population.tree.numpy("client", client.plan.client_id, "availability")
        while True:
            await clock.sleep(availability.online.sample(rng))
            client.online = False
            network.set_online(client.plan.client_id, False)
            if client.actor is not None:
                client.actor.online.clear()
            await clock.sleep(availability.offline.sample(rng))
            client.online = True
            network.set_online(client.plan.client_id, True)
            if client.actor is not None:
                client.actor.online.set()

    async def _crashes(
        self, client: ClientRecord, clock: VirtualClock, network: SimulatedNetwork
    ) -> None:
        crashes = client.plan.group.availability.crashes
        assert crashes is not None
        rng = self.population.tree.numpy("client", client.plan.client_id, "crashes")
        while True:
            await clock.sleep(crashes.every.sample(rng))
            if client.finished or client.task is None:
                return
            client.task.cancel()
            try:
                await client.task
            except asyncio.CancelledError:
                pass
            client.crashes += 1
            if client.actor is not None:
                client.earlier_rounds.extend(client.actor.released)
                client.actor = None
            _log.info("client crashed", client=client.plan.client_id, time=clock.now())
            if crashes.rejoin_after is None:
                client.crashed_for_good = True
                self.stopped.append(
                    {
                        "client_id": client.plan.client_id,
                        "time": clock.now(),
                        "reason": "crashed and did not rejoin",
                    }
                )
                return
            await clock.sleep(crashes.rejoin_after.sample(rng))
            # A restarted process re-reads its ledger from disk: spending is never forgotten.
            client.ledger.close()
            client.ledger = open_ledger(client.plan, client.ledger_path)
            self._start_actor(client, clock, network)
            _log.info(
                "client rejoined",
                client=client.plan.client_id,
                time=clock.now(),
                next_round=client.actor.next_round if client.actor else None,
            )

    # -- per-window bookkeeping ------------------------------------------------------------------
    def _remaining_epsilon(self, client: ClientRecord) -> float | None:
        if client.plan.group.budget is None:
            return None
        steps = client.ledger.steps
        count = sum(s.count for s in steps)
        cached = self._remaining_cache.get(client.plan.client_id)
        if cached is not None and cached[0] == count:
            return cached[1]
        value = float(client.ledger.remaining_epsilon)
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
                and actor.state in ("budget_exhausted", "done")
                and client.plan.client_id not in known
            ):
                self.stopped.append(
                    {
                        "client_id": client.plan.client_id,
                        "time": actor.stopped_at,
                        "reason": actor.stop_reason,
                    }
                )

    def _check_tasks(self) -> None:
        for client in self.clients.values():
            task = client.task
            if task is not None and task.done() and not task.cancelled() and task.exception():
                raise task.exception()  # a bug in an actor must not be silently swallowed

    def _window_done(self, report: WindowReport, network: SimulatedNetwork) -> bool:
        self._check_tasks()
        self._note_stops()
        stats = network.stats
        dropped = stats.uplink.dropped + stats.uplink.lost
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
        before = report.version - (1 if report.applied else 0)
        self.applied_log.extend((c, r, base, before) for c, r, base in report.applied_updates)
        assert self._metrics_file is not None
        self._metrics_file.write(_json_line(line))
        self._metrics_file.flush()
        if self.on_window_hook is not None:
            self.on_window_hook(line)
        self.stop_reason = report.stop_reason(
            self.scenario.stop, active_clients=active, in_flight=stats.uplink.in_flight
        )
        return bool(self.stop_reason)

    # -- the run --------------------------------------------------------------------------------
    async def main(self, clock: VirtualClock) -> ServerActor:
        population = self.population
        network = self._network(clock)
        ledger_dir = self.out_dir / "ledgers"
        ledger_dir.mkdir(parents=True, exist_ok=True)
        # One batcher for the run: the rounds clients begin are computed together when the
        # first of them is needed (see fedsim.training.batched).
        batcher = self.batcher = RoundBatcher(population.model) if self.batch_rounds else None
        for plan in population.plans:
            path = ledger_dir / f"{plan.client_id}.jsonl"
            self.clients[plan.client_id] = ClientRecord(
                plan,
                population.trainer(plan, message_only=self.message_only, batcher=batcher),
                path,
                open_ledger(plan, path),
            )
        server = make_server_actor(
            population,
            clock=clock,
            endpoint=network.server_endpoint(),
            evaluate=None if self.message_only else make_evaluator(population),
        )
        helpers: list[asyncio.Task[None]] = []
        for client in self.clients.values():
            self._start_actor(client, clock, network)
            availability = client.plan.group.availability
            if availability.online is not None:
                helpers.append(asyncio.create_task(self._on_off(client, clock, network)))
            if availability.crashes is not None:
                helpers.append(asyncio.create_task(self._crashes(client, clock, network)))
        try:
            await server.run(lambda report: self._window_done(report, network))
        finally:
            tasks = helpers + [c.task for c in self.clients.values() if c.task is not None]
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
        self._check_tasks()
        self.network_stats = network.stats.as_dict()
        return server

    def run(self) -> tuple[ServerActor, float]:
        self.out_dir.mkdir(parents=True, exist_ok=True)
        (self.out_dir / "scenario.resolved.yaml").write_text(
            dump_scenario(self.scenario, dataset_path=self.population.dataset_path),
            encoding="utf-8",
        )
        started, cpu_started = wallclock.perf_counter(), wallclock.process_time()
        with open(self.out_dir / "metrics.jsonl", "w", encoding="utf-8") as metrics:
            self._metrics_file = metrics
            with torch.random.fork_rng(devices=[]):
                server = run_virtual(self.main)
        # CPU time of this process: on a shared machine it says what the run costs.
        self.cpu_seconds = wallclock.process_time() - cpu_started
        return server, wallclock.perf_counter() - started


# ---------------------------------------------------------------------------------------------
# Output files


def _clean(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, np.floating | np.integer):
        return _clean(value.item())
    return value


def _json_line(obj: dict[str, Any]) -> str:
    return json.dumps({k: _clean(v) for k, v in obj.items()}, allow_nan=False) + "\n"


def _client_rows(sim: _Simulation) -> list[dict[str, Any]]:
    from fedsim.privacy.gdp import clt_mu  # imported here: only the report needs it

    delta = sim.scenario.privacy.delta
    rows = []
    for client in sim.clients.values():
        plan = client.plan
        ledger = client.ledger
        steps = group_steps(ledger.steps)
        rounds = len({record.round for record in ledger.records})
        released = client.released_rounds()
        last_sigma = released[-1].sigma if released else float(plan.schedule.sigma(0))
        last_clip = released[-1].clip if released else float(plan.schedule.clip(0))
        budget = plan.group.budget
        stopped = next((s for s in sim.stopped if s["client_id"] == plan.client_id), None)
        rows.append(
            {
                "client_id": plan.client_id,
                "group": plan.group.name,
                "num_samples": plan.num_samples,
                "batch_size": plan.group.batch_size,
                "sampling": plan.group.sampling,
                "q": plan.q,
                "rounds": rounds,
                "steps": sum(s.count for s in steps),
                "sigma": last_sigma,
                "clip": last_clip,
                "epsilon": make_accountant("pld", steps).epsilon(delta) if steps else 0.0,
                "mu_clt": clt_mu(steps) if steps else 0.0,
                "budget_epsilon": budget.epsilon if budget else None,
                "remaining_epsilon": float(ledger.remaining_epsilon) if budget else None,
                "state": client.state,
                "stopped_at": stopped["time"] if stopped else None,
                "stop_reason": stopped["reason"] if stopped else "",
            }
        )
    return rows


def _format_cell(value: Any) -> str:
    value = _clean(value)
    if value is None:
        return ""
    return repr(value) if isinstance(value, float) else str(value)


def _explain(sim: _Simulation, rows: list[dict[str, Any]], virtual_time: float) -> str:
    parts = [
        f"The run stopped at virtual time {virtual_time:.6g} s after "
        f"{len(sim.metrics)} server windows because {sim.stop_reason}."
    ]
    by_reason: dict[str, list[dict[str, Any]]] = {}
    for entry in sim.stopped:
        by_reason.setdefault(_reason_kind(entry["reason"]), []).append(entry)
    for kind, entries in sorted(by_reason.items()):
        times = [e["time"] for e in entries if e["time"] is not None]
        names = ", ".join(e["client_id"] for e in entries[:5]) + (
            " and others" if len(entries) > 5 else ""
        )
        span = (
            (
                f"between {min(times):.6g} s and {max(times):.6g} s"
                if len(set(times)) > 1
                else f"at {times[0]:.6g} s"
            )
            if times
            else ""
        )
        parts.append(f"{len(entries)} client(s) stopped {span} because {kind} ({names}).")
    active = [c.plan.client_id for c in sim.clients.values() if not c.finished]
    if active:
        parts.append(f"{len(active)} client(s) could still train when the run ended.")
    epsilons = [r["epsilon"] for r in rows]
    if epsilons:
        budgeted = sum(r["budget_epsilon"] is not None for r in rows)
        parts.append(
            f"Per-client epsilon at delta={sim.scenario.privacy.delta:g} (pld) ranges from "
            f"{min(epsilons):.4g} to {max(epsilons):.4g}."
            + (f" None of the {budgeted} client(s) with a budget exceeded it: every release was "
               "checked against, and written to, its ledger first." if budgeted else
               " No client had a budget; every release was still written to its ledger.")
        )
    return " ".join(parts)


def _reason_kind(reason: str) -> str:
    if "budget" in reason:
        return "their next round would have exceeded their privacy budget"
    if "finished" in reason:
        return "they finished their configured rounds"
    if "crash" in reason:
        return "they crashed and did not rejoin"
    return reason


def write_run_outputs(sim: _Simulation, server: ServerActor, wall_seconds: float) -> dict[str, Any]:
    """Write clients.csv, summary.json and timing.json of a finished run and return the summary.

    Shared by the simulator and the deployed server (:func:`fedsim.runtime.deployment.
    collect_outputs`), which passes a record with the same attributes, so both modes write
    identical formats.
    """
    out = sim.out_dir
    rows = _client_rows(sim)
    with open(out / "clients.csv", "w", encoding="utf-8", newline="") as handle:
        writer = csv.writer(handle, lineterminator="\n")
        writer.writerow(CLIENT_COLUMNS)
        for row in rows:
            writer.writerow([_format_cell(row[c]) for c in CLIENT_COLUMNS])
    accuracies = [m["accuracy"] for m in sim.metrics if m["accuracy"] is not None]
    totals = {
        key: sum(m[key] for m in sim.metrics)
        for key in ("received", "applied", "stale", "duplicate", "rejected", "dropped_in_flight")
    }
    states: dict[str, int] = {}
    for row in rows:
        states[row["state"]] = states.get(row["state"], 0) + 1
    epsilons = sorted(r["epsilon"] for r in rows)
    virtual_time = sim.metrics[-1]["time"] if sim.metrics else 0.0
    summary = {
        "scenario": sim.scenario.name,
        "seed": sim.scenario.seed,
        "final_accuracy": accuracies[-1] if accuracies else None,
        "best_accuracy": max(accuracies) if accuracies else None,
        "windows": len(sim.metrics),
        "virtual_time": virtual_time,
        "final_version": server.version,
        "stop_reason": sim.stop_reason,
        "updates": totals,
        "network": sim.network_stats,
        "client_states": dict(sorted(states.items())),
        "stopped": sim.stopped,
        "privacy": {
            "delta": sim.scenario.privacy.delta,
            "epsilon_min": epsilons[0] if epsilons else None,
            "epsilon_median": float(np.median(epsilons)) if epsilons else None,
            "epsilon_max": epsilons[-1] if epsilons else None,
            "accountant": "pld",
            "caveats": privacy_caveats(sim.scenario.privacy.timing,
                                       [c.actor for c in sim.clients.values()]),
        },
        "explanation": _explain(sim, rows, virtual_time),
    }
    (out / "summary.json").write_text(
        json.dumps(_clean_tree(summary), indent=2, allow_nan=False) + "\n", encoding="utf-8"
    )
    sample_grads = _sample_grads(sim)
    (out / "timing.json").write_text(
        json.dumps(
            {
                "wall_seconds": wall_seconds,
                "cpu_seconds": sim.cpu_seconds,
                "sample_grads": sample_grads,
                "sample_grads_per_s": sample_grads / wall_seconds if wall_seconds > 0 else None,
                "simulated_s_per_wall_s": virtual_time / wall_seconds if wall_seconds > 0 else None,
                # How the rounds were computed: batched with other clients' or alone.
                "rounds_batched": sim.batcher.rounds_batched if sim.batcher is not None else 0,
                "batched_passes": sim.batcher.batches if sim.batcher is not None else 0,
            },
            indent=2,
        )
        + "\n",
        encoding="utf-8",
    )
    return summary


def _sample_grads(sim: _Simulation) -> int:
    """Per-example gradients computed in released rounds, over all clients and restarts."""
    return sum(r.sample_grads for c in sim.clients.values() for r in c.released_rounds())


def _clean_tree(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _clean_tree(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_clean_tree(v) for v in value]
    return _clean(value)


def run_scenario(
    loaded: LoadedScenario,
    out_dir: str | Path,
    *,
    message_only: bool = False,
    on_window: Callable[[dict[str, Any]], None] | None = None,
    population: Population | None = None,
    batch_rounds: bool = True,
) -> RunResult:
    """Run a scenario under virtual time and write its run directory to ``out_dir``.

    ``out_dir`` must not already hold ledgers (a ledger is never reset, so reusing a run
    directory would silently continue spending). ``message_only`` replaces training by its
    virtual duration (zero updates, the same privacy events). With ``batch_rounds`` (the
    default) rounds that overlap in virtual time are computed together
    (:mod:`fedsim.training.batched`); without, each round alone, as a client on its own
    computes it (same randomness, results equal up to floating-point summation order).
    """
    out = Path(out_dir)
    if (out / "ledgers").exists() and any((out / "ledgers").iterdir()):
        raise ConfigError(f"{out} already holds a run's ledgers; choose a new --out directory")
    previous_threads = torch.get_num_threads()
    torch.set_num_threads(loaded.scenario.torch_threads)
    try:
        population = population or build_population(loaded)
        sim = _Simulation(population, out, message_only=message_only, on_window=on_window,
                          batch_rounds=batch_rounds)
        try:
            server, wall_seconds = sim.run()
            summary = write_run_outputs(sim, server, wall_seconds)
        finally:
            for client in sim.clients.values():
                client.ledger.close()
    finally:
        torch.set_num_threads(previous_threads)
    return RunResult(
        out,
        summary,
        wall_seconds,
        _sample_grads(sim),
        server.params.copy(),
        sim.metrics,
        sim.applied_log,
        sim.clients,
        sim.cpu_seconds,
    )
