"""The actors both runtimes build from a population: a client's actor and its ledger, the
server's actor and its evaluation, an aggregation node's actor, a client's on/off periods.

The virtual-time run (:mod:`fedsim.runtime.simulated.simulation`) and the deployed processes
(:mod:`fedsim.runtime.deployed`) give each the clock and the endpoint of their runtime; the rest
comes from the :class:`~fedsim.runtime.population.Population` and its
:class:`~fedsim.runtime.population.ClientPlan`, so client ``i`` has the same records, DP
posture and settings in both modes.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from pathlib import Path

import numpy as np

from fedsim.aggregation import make_step_size, make_strategy
from fedsim.aggregation.build import make_optimizer, make_policy
from fedsim.clock import Clock
from fedsim.config.schema import Scenario
from fedsim.errors import ConfigError
from fedsim.privacy.ledger import Budget, PrivacyLedger
from fedsim.privacy.ledger_directory_lock import DirectoryLock
from fedsim.runtime.actors.admission import group_slot
from fedsim.runtime.actors.aggregator import AggregatorActor, aggregator_ids
from fedsim.runtime.actors.client import ClientActor, StalenessPolicy, Trainer
from fedsim.runtime.actors.exposure import ClientExposure, expected_sample_grads
from fedsim.runtime.actors.integrity import client_limits
from fedsim.runtime.actors.releases import Releases
from fedsim.runtime.actors.server import ClientInfo, ServerActor
from fedsim.runtime.population import ClientPlan, Population, partial_sums, step_sequence
from fedsim.runtime.rng import ParkedStream
from fedsim.training import evaluate, load_flat_params
from fedsim.transports.base import Endpoint

__all__ = [
    "aggregator_wait",
    "client_infos",
    "make_aggregator_actor",
    "make_client_actor",
    "make_evaluator",
    "make_server_actor",
    "open_ledger",
    "toggle_availability",
]


def open_ledger(plan: ClientPlan, path: Path, directory: DirectoryLock | None = None, *,
                fsync: bool = True) -> PrivacyLedger:
    """The client's durable ledger at ``path`` (resumed if it exists), with its group's budget
    and accountant (``directory``: the directory lock this process holds on its folder;
    ``fsync=False``: a simulated run's, :meth:`PrivacyLedger.open`)."""
    group = plan.group
    budget = Budget(group.budget.epsilon, group.budget.delta) if group.budget else None
    return PrivacyLedger.open(
        path,
        client_id=plan.client_id,
        sampling=group.sampling,
        budget=budget,
        accountant=group.accountant,
        directory=directory,
        fsync=fsync,
    )


def make_client_actor(
    plan: ClientPlan,
    *,
    clock: Clock,
    endpoint: Endpoint,
    trainer: Trainer,
    ledger: PrivacyLedger,
    speed_rng: np.random.Generator,
    delta: float,
    exposure: ClientExposure = ClientExposure(),
    park_speed_stream: bool = False,
    releases: Releases | None = None,
) -> ClientActor:
    """The plan's :class:`ClientActor`; its rounds continue after the last one in ``ledger``
    (so ``(client, round)`` stays unique across restarts). Used by the simulation and by the
    deployed client process alike. ``park_speed_stream``: keep the speed stream parked (the
    same draws in a seventh of the memory, a state swap a draw: see :class:`_SpeedDraws`).
    ``releases``: where its released rounds are summed (:class:`Releases`; the actor's own by
    default)."""
    group = plan.group
    return ClientActor(
        plan.client_id,
        clock=clock,
        endpoint=endpoint,
        trainer=trainer,
        ledger=ledger,
        local_lr=step_sequence(group) or group.local_lr,
        batch_size=float(group.batch_size),
        seconds_per_sample=_SpeedDraws(group.speed.sampler(), speed_rng,
                                       parked=park_speed_stream),
        expected_sample_grads=expected_sample_grads(group.batch_size, group.local_steps,
                                                    group.per_example_steps),
        exposure=exposure,
        staleness=_staleness(group.staleness.max_versions_behind, group.staleness.max_distance),
        max_rounds=group.rounds,
        first_round=ledger.next_round,
        status_epsilon=_StatusEpsilon(ledger, delta),
        interrupt=group.interrupt,
        first_server_step=plan.first_server_step if group.follow_server_step else None,
        compression=group.compression,
        releases=releases,
    )


class _SpeedDraws:
    """A client's seconds per sample gradient, drawn from its speed stream: the generator
    itself, or kept parked (:class:`~fedsim.runtime.rng.ParkedStream`: the same draws in a
    seventh of the memory, for populations of millions; its state swap costs about 10 us a
    draw, a live generator's draw 2)."""

    __slots__ = ("_sample", "_stream")

    def __init__(self, sample: Callable[[np.random.Generator], float],
                 rng: np.random.Generator, *, parked: bool) -> None:
        self._sample = sample
        self._stream: ParkedStream | np.random.Generator = ParkedStream(rng) if parked else rng

    def __call__(self) -> float:
        stream = self._stream
        if isinstance(stream, ParkedStream):
            return stream.draw(self._sample)
        return self._sample(stream)


class _StatusEpsilon:
    """``(epsilon, delta)`` of a client's ledger for its status messages (a slotted callable,
    not a closure: 48 bytes instead of 200, issue 24 item 5)."""

    __slots__ = ("_delta", "_ledger")

    def __init__(self, ledger: PrivacyLedger, delta: float) -> None:
        self._ledger, self._delta = ledger, delta

    def __call__(self) -> tuple[float, float]:
        return self._ledger.epsilon(self._delta), self._delta


@functools.lru_cache(maxsize=64)
def _staleness(max_versions_behind: int | None, max_distance: float | None) -> StalenessPolicy:
    """One (frozen) policy object per setting, shared by the clients that have it."""
    return StalenessPolicy(max_versions_behind, max_distance)


def make_evaluator(population: Population) -> Callable[[np.ndarray], tuple[float, float]]:
    """Held-out (accuracy, loss) of a flat parameter vector, on the population's test set."""

    def evaluate_params(params: np.ndarray) -> tuple[float, float]:
        load_flat_params(population.model, params)
        return evaluate(population.model, population.test_x, population.test_y,
                        loss_fn=population.loss_fn)

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
    aggregators = population.scenario.aggregators
    return ServerActor(
        clock=clock,
        endpoint=endpoint,
        initial_params=population.initial_params,
        clients=client_infos(population),
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
        policy=make_policy(server_config),
        optimizer=make_optimizer(server_config.optimizer),
        aggregators=aggregator_ids(aggregators.count),
        aggregator_wait=aggregator_wait(population.scenario),
    )


DEFAULT_WAIT_WINDOWS = 1.0
"""The server's default wait for partials, in windows (``aggregators.wait`` omitted): a
partial comes as soon as its aggregator has read what its clients sent before the close, so
the wait covers an aggregator's backlog (measured in benchmarks/results/mqtt_*_aggregators.json,
``partial_wait_s``); never more than a window, so a close is done before the next window ends."""


def aggregator_wait(scenario: Scenario) -> float:
    """How long the server waits for the aggregators' partials after a window's end, in
    scenario seconds: ``aggregators.wait``, or by default :data:`DEFAULT_WAIT_WINDOWS` windows
    (docs/DEPLOYMENT.md, "Aggregation nodes", says why)."""
    wait = scenario.aggregators.wait
    return wait if wait is not None else DEFAULT_WAIT_WINDOWS * scenario.server.window


def client_infos(population: Population) -> dict[str, ClientInfo]:
    """What the server and its aggregators know of each client in advance (public values).
    Clients of one group with the same declared size know the same: they share one (frozen)
    :class:`ClientInfo` and its :class:`ClientLimits`, whose norm-bound memo depends on
    nothing else (issue 24 item 5: 0.6 KB a client, most of it the memo's dict)."""
    dim, timing = population.initial_params.size, population.scenario.privacy.timing
    shared: dict[tuple[int, int, int], ClientInfo] = {}

    def info(p: ClientPlan) -> ClientInfo:
        key = (id(p.group), p.public_samples, id(p.schedule))
        found = shared.get(key)
        if found is None:
            found = shared[key] = ClientInfo(
                p.public_samples, p.group.local_lr, p.group.weight,
                client_limits(p.group, p.public_samples, p.schedule, dim),
                sequence=step_sequence(p.group), slot=group_slot(p.group, timing))
        return found

    return {p.client_id: info(p) for p in population.plans}


def make_aggregator_actor(population: Population, aggregator_id: str, *, clock: Clock,
                          endpoint: Endpoint) -> AggregatorActor:
    """The scenario's aggregation node ``aggregator_id`` (simulation and deployed alike)."""
    server_config = population.scenario.server
    return AggregatorActor(
        aggregator_id=aggregator_id, clock=clock, endpoint=endpoint,
        clients=client_infos(population), size=population.initial_params.size,
        strategy=make_strategy(server_config.mixing), policy=make_policy(server_config),
        max_staleness=server_config.max_staleness,
        invites=server_config.participation < 1.0,
        max_groups=partial_sums(population.scenario, int(population.initial_params.size)),
        aggregators=aggregator_ids(population.scenario.aggregators.count))


async def toggle_availability(
    plan: ClientPlan,
    clock: Clock,
    rng: np.random.Generator,
    set_online: Callable[[bool], None],
) -> None:
    """Take the client offline and back online, forever, on its group's on/off periods
    (``availability.online`` / ``offline``, drawn from ``rng``, in the clock's time)."""
    availability = plan.group.availability
    if availability.online is None or availability.offline is None:
        raise ConfigError(f"{plan.client_id}: availability needs both online and offline")
    while True:
        await clock.sleep(availability.online.sample(rng))
        set_online(False)
        await clock.sleep(availability.offline.sample(rng))
        set_online(True)
