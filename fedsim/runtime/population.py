"""What both runtimes build from a scenario: the population.

:func:`build_population` loads the data, splits it among the client groups (``data_share``)
and within each group (``partition``), builds one shared model (trainers load each round's
parameters into it) and a :class:`ClientPlan` per client: who it is, which records it holds,
its DP posture. No clock, no network, no files: the virtual-time run
(:mod:`fedsim.runtime.simulated.simulation`) and the deployed processes (:mod:`fedsim.runtime.deployed`)
build their actors from it (:mod:`fedsim.runtime.assembly`), so client ``i`` holds the same records and the same DP posture in both modes.

Every random draw comes from the scenario seed through the :class:`SeedTree`
(``partition``, ``model-init``, ``client/<id>/train`` for batches and noise,
``server/participation``).
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from fedsim.aggregation import make_step_size
from fedsim.config.factories import require_allowed
from fedsim.config.features import too_many_components
from fedsim.config.loading import LoadedScenario
from fedsim.config.schema import ClientGroup, Scenario
from fedsim.data.arrays import TensorSplits
from fedsim.data.load import scenario_data
from fedsim.data.partition import split_groups
from fedsim.errors import ConfigError
from fedsim.logging import get_logger
from fedsim.privacy.events import GaussianStep
from fedsim.privacy.group_schedules import make_schedule
from fedsim.privacy.ledger import PrivacyLedger
from fedsim.privacy.schedules import Schedule
from fedsim.protocol import codec
from fedsim.runtime.dp_pca import check_pca_budget, pca_components
from fedsim.runtime.normalisation import (
    check_normalisation_budget,
    held_out_features,
    normalised_features,
)
from fedsim.runtime.rng import CounterSeededTorch, SeedTree
from fedsim.training import LocalTrainer, flat_params
from fedsim.training.batched import RoundBatcher
from fedsim.training.devices import resolve_device
from fedsim.training.dp_pca import Projection
from fedsim.training.dpsgd import step_for
from fedsim.training.local import AdaptiveClipConfig, sum_noise_multiplier
from fedsim.training.losses import build_loss, check_class_outputs, check_per_example_loss
from fedsim.training.models import build_scenario_model
from fedsim.training.persample import LossFn, per_example_cross_entropy
from fedsim.training.preflight import batch_problem, check_model_size
from fedsim.training.rounds import DoneRound, PendingRound, RoundResult
from fedsim.training.step_sequence import StepSequence

__all__ = [
    "BatchedTrainer",
    "ClientPlan",
    "Population",
    "VirtualDurationTrainer",
    "build_population",
    "client_ids",
    "client_plans",
    "partial_sums",
    "plan_of",
]

_log = get_logger("fedsim.runtime.population")


@dataclass(frozen=True, eq=False)
class ClientPlan:
    """A client's static description: who it is, which records it holds, its DP posture."""

    client_id: str
    group: ClientGroup
    indices: np.ndarray
    schedule: Schedule
    declared_samples: int | None = None  # public size (runtime/exposure.py); None: len(indices)
    first_server_step: float = 1.0
    """s_0, the server step-size schedule's value for the first window (from the public
    scenario): a client following the server steps by ``eta_i(r) s_t / s_0``."""

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
    device: torch.device = torch.device("cpu")
    """Where the model, the clients' records and their rounds live (scenario ``device``)."""
    loss_fn: LossFn = per_example_cross_entropy
    """The per-example training loss (``model.loss``, :mod:`fedsim.training.losses`)."""
    pca_released: bool = False
    """With ``dp_pca``: whether the clients' releases are charged and (unless the run is
    message-only) :meth:`project` has applied their projection (:mod:`fedsim.runtime.dp_pca`)."""

    def project(self, projection: Projection | None) -> None:
        """Mark the DP-PCA releases done; with a ``projection``, replace the training and
        held-out features by their projected coordinates (every client's records projected by
        the shared projection, the server's held-out set likewise, then standardised as
        :func:`~fedsim.runtime.normalisation.held_out_features` says: with
        ``dp_normalisation`` each client standardises its projected coordinates, so the
        held-out set is standardised after its projection too)."""
        if projection is not None:
            self.train_x = projection.apply(self.train_x)
            self.test_x = held_out_features(self.scenario, projection.apply(self.test_x))
        self.pca_released = True

    def trainer(
        self,
        plan: ClientPlan,
        *,
        message_only: bool = False,
        generator: torch.Generator | None = None,
        batcher: RoundBatcher | None = None,
        ledger: PrivacyLedger | None = None,
        normalisation_generator: torch.Generator | None = None,
    ) -> LocalTrainer | VirtualDurationTrainer | BatchedTrainer:
        """The client's trainer, its batches and noise drawn from ``client/<id>/train`` (or
        from ``generator``: a restarted client process must not replay released noise); with a
        ``batcher`` its begun rounds wait there to be computed together with other clients'.
        With ``dp_normalisation`` its features are standardised first, the release charged to
        ``ledger`` (:mod:`fedsim.runtime.normalisation`; noise from ``normalisation_generator``,
        by default ``client/<id>/dp-normalisation``)."""
        group = plan.group
        if group.dp_pca is not None and not self.pca_released:
            raise ConfigError(f"client {plan.client_id}: dp_pca needs every client's release "
                              "before round 0 (fedsim.runtime.dp_pca.release_projection), which "
                              "only the simulated runtime gathers")
        index = torch.from_numpy(np.asarray(plan.indices, dtype=np.int64))
        rows: torch.Tensor | None = None
        if group.dp_normalisation is not None:
            if ledger is None:
                raise ConfigError(f"client {plan.client_id}: dp_normalisation needs its ledger")
            # The client's own standardised copy of its records (by its released moments).
            features = normalised_features(
                plan, None if message_only else self.train_x.index_select(0, index), ledger,
                normalisation_generator or self.tree.torch(
                    "client", plan.client_id, "dp-normalisation"))
            labels = self.train_y.index_select(0, index)
        elif message_only:
            features = None
        elif self.device.type == "cpu":
            # On the CPU the data set is stored once: the client's trainer holds its row
            # indices (a batch is gathered from the shared tensors; index_select, several times
            # faster than advanced indexing for image tensors on CPU).
            features, labels, rows = self.train_x, self.train_y, index
        else:  # on an accelerator each client's records are copied there once
            features, labels = self.train_x.index_select(0, index), self.train_y.index_select(0, index)
        if features is None:  # message-only: batch sizes drawn per round from the seed alone
            seed = generator.initial_seed() if generator is not None else \
                self.tree.integer("client", plan.client_id, "train")
            return VirtualDurationTrainer(plan, self.initial_params.size, seed)
        if generator is None:
            generator = self.tree.torch("client", plan.client_id, "train")
        trainer = LocalTrainer(
            self.model,
            features.to(self.device),
            labels.to(self.device),
            rows=rows,
            batch_size=group.batch_size,
            sampling=group.sampling,
            clip=plan.schedule,
            noise=plan.schedule,
            local_steps=group.local_steps,
            local_lr=step_sequence(group) or group.local_lr,
            max_physical_batch=group.max_physical_batch,
            adaptive_clip=adaptive_clip(group),
            per_example_steps=group.per_example_steps,
            per_example_lr=group.per_example_lr,
            generator=generator,
            declared_records=plan.public_samples,
            loss_fn=self.loss_fn,
        )
        return trainer if batcher is None else BatchedTrainer(trainer, batcher, plan.client_id)


class BatchedTrainer:
    """A client's :class:`LocalTrainer` whose begun rounds wait in the run's
    :class:`RoundBatcher` (computed with the rounds other clients began meanwhile)."""

    def __init__(self, trainer: LocalTrainer, batcher: RoundBatcher, owner: str) -> None:
        self.trainer = trainer
        self.batcher = batcher
        self.owner = owner
        """The client's id (the runtime's round schedule maps the trainer's rounds to it)."""

    def planned_steps(self, round_index: int) -> list[GaussianStep]:
        return self.trainer.planned_steps(round_index)

    def begin_round(self, params: np.ndarray, round_index: int) -> PendingRound:
        return self.trainer.begin_round(params, round_index, self.batcher)


class VirtualDurationTrainer:
    """Training replaced by its cost: the same privacy events and sample counts as the real
    trainer, a zero update, no gradient computed (message-only runs of the protocol). A round's
    Poisson batch sizes are drawn from the counter-based stream ``seed`` at the round's index
    (:class:`~fedsim.runtime.rng.CounterSeededTorch`), so a client holds an integer, not a
    generator's 2.5 KB of state."""

    __slots__ = ("draws", "num_params", "plan", "zeros")

    def __init__(self, plan: ClientPlan, num_params: int, seed: int) -> None:
        self.plan = plan
        self.num_params = num_params
        self.draws = CounterSeededTorch(seed)
        self.zeros = _zeros(num_params)

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
            count, rate = _binomial_arguments(group.local_steps, self.plan.num_samples,
                                              self.plan.q)
            counts = self.draws.draw(
                round_index, lambda generator: torch.binomial(count, rate, generator=generator))
            sizes = [int(c) for c in counts.tolist()]
        else:
            sizes = [group.batch_size] * group.local_steps
        return DoneRound(RoundResult(
            update=self.zeros,
            steps=steps,
            batch_sizes=sizes,
            clip=float(self.plan.schedule.clip(round_index)),
            sigma=steps[0].sigma,
            mean_loss=math.nan,
            sample_grads=sum(sizes),
            zero_update=True,
        ))


def adaptive_clip(group: ClientGroup) -> AdaptiveClipConfig | None:
    """The group's adaptive clipping (None: its clip schedule as given)."""
    config = group.adaptive_clip
    if config is None:
        return None
    ceiling = group.adaptive_clip_ceiling()
    assert ceiling is not None  # the schema gives adaptive clipping a constant start
    return AdaptiveClipConfig(config.target_quantile, config.learning_rate,
                              config.count_noise_std, ceiling)


def step_sequence(group: ClientGroup) -> StepSequence | None:
    """The group's agreed round step sizes eta(r) (None: the constant ``local_lr``)."""
    config = group.step_sequence
    if config.kind == "constant":
        return None
    return StepSequence(group.local_lr, config.kind, config.decay, config.power, config.factor,
                        config.minimum)


@functools.lru_cache(maxsize=256)
def _binomial_arguments(steps: int, num_samples: int, q: float) -> tuple[torch.Tensor, torch.Tensor]:
    """The count and rate tensors of a message-only client's Poisson batch sizes (``steps``
    draws of Binomial(N, q)), shared by clients alike (read only: ``torch.binomial`` does not
    write them; building them was 4/5 of a message-only round's start)."""
    rate = torch.full((steps,), q, dtype=torch.float64)
    return torch.full_like(rate, num_samples), rate


_ZEROS: dict[int, np.ndarray] = {}


def _zeros(size: int) -> np.ndarray:
    """One read-only zero update of each size, shared by every message-only client."""
    zeros = _ZEROS.get(size)
    if zeros is None:
        zeros = _ZEROS[size] = np.zeros(size, np.float32)
        zeros.setflags(write=False)
    return zeros


def client_ids(scenario: Scenario) -> list[str]:
    """Every client id of a scenario, in group order (the ids :func:`build_population` uses)."""
    return [client_id for group in scenario.clients.groups for client_id in group.client_ids()]


def _model_options(scenario: Scenario, train_x: torch.Tensor, num_classes: int) -> dict[str, Any]:
    """The model's options, with the input size and class count filled in from the data for
    flat-input models when the scenario does not give them."""
    options: dict[str, Any] = dict(scenario.model.options)
    if scenario.model.name in ("logreg", "mlp"):
        # with dp_pca the model sees the projected coordinates (the schema checks a given size)
        components = pca_components(scenario)
        options.setdefault("in_features", components or int(np.prod(train_x.shape[1:])))
        options.setdefault("num_classes", num_classes)
    return options


def build_population(
    loaded: LoadedScenario, *, model_factory: Callable[..., torch.nn.Module] | None = None,
    data: TensorSplits | None = None, loss: LossFn | None = None, fix_batchnorm: bool = False,
) -> Population:
    """Data, partition, model and per-client plans (no clock, no network, no files).
    ``model_factory``: a Python callable that builds the model (instead of ``model:``);
    ``data``: the arrays given from Python (:mod:`fedsim.data.arrays`); ``loss``: a
    per-example loss from Python (instead of ``model.loss``); ``fix_batchnorm``: replace
    BatchNorm by GroupNorm (as ``model.fix_batchnorm``). A scenario that names a factory is
    refused unless ``loaded.allow_factories`` (before anything is imported)."""
    scenario = loaded.scenario
    require_allowed(scenario, loaded.allow_factories, unused=(
        *(["model.factory"] if model_factory is not None else []),
        *(["model.loss"] if loss is not None else []),
        *(["dataset.factory"] if data is not None else [])))
    tree = SeedTree(scenario.seed)
    device = resolve_device(scenario.device)  # before the data: a missing device fails fast
    found = scenario_data(scenario.dataset, base_dir=loaded.base_dir,
                          seed=tree.integer("dataset"), given=data)
    (train_x, train_y, test_x, test_y), path, writers = (
        found.tensors, found.path, found.train_writers)
    if pca_components(scenario) is None:  # with dp_pca: after its projection (project)
        test_x = held_out_features(scenario, test_x)  # standardised if the clients' records are
    labels = train_y.numpy()
    num_classes = int(max(labels.max(), test_y.max())) + 1
    _warn_of_unseen_labels(labels, test_y)
    components = pca_components(scenario)
    if components is not None and (problem := too_many_components(
            components, int(np.prod(train_x.shape[1:])))):  # before any release is charged
        raise ConfigError(f"clients.groups[*].{problem}")
    # what the model sees: with dp_pca, a record's projected coordinates (zeros as the probe)
    sample = train_x[:2] if components is None else torch.zeros(2, components,
                                                                 dtype=train_x.dtype)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(tree.integer("model-init"))
        options = _model_options(scenario, train_x, num_classes)
        if model_factory is None:  # a registered model: its shapes checked before allocation
            check_model_size(scenario.model.name, options,
                             max_message_bytes=scenario.network.max_message_bytes)
        model = build_scenario_model(
            scenario.model, options, sample=sample,
            num_classes=num_classes, factory=model_factory, base_dir=loaded.base_dir,
            fix_batchnorm=fix_batchnorm)
        loss_fn, where = build_loss(scenario.model.loss, scenario.model.loss_options, loss=loss,
                                    base_dir=loaded.base_dir)
        if loss is None and scenario.model.loss is None:  # before the probe: a clear error
            check_class_outputs(model, sample, num_classes)
        check_per_example_loss(loss_fn, model, sample, train_y[:2], where)
    model.to(device)  # initialised on the CPU: the same initial weights on every device
    params = flat_params(model)
    if scenario.aggregators.count:
        partial_sums(scenario, int(params.size))  # refused before anything runs
    plans = client_plans(loaded, tree, labels, writers)
    return Population(
        scenario, tree, model, params, train_x, train_y, test_x, test_y, plans, path,
        device, loss_fn,
    )


def _warn_of_unseen_labels(train_labels: np.ndarray, test_labels: torch.Tensor) -> None:
    """Log held-out labels that no training record has (1-based test labels, another data
    set's): the model then has outputs it is never trained for, and its accuracy on them is
    0, with nothing else to say why."""
    unseen = np.setdiff1d(np.unique(test_labels.numpy()), np.unique(train_labels))
    if unseen.size:
        _log.warning("held-out labels that no training record has; their accuracy is 0",
                     labels=[int(v) for v in unseen[:20]], count=int(unseen.size))


def client_plans(loaded: LoadedScenario, tree: SeedTree, labels: np.ndarray,
                 writers: np.ndarray | None) -> list[ClientPlan]:
    """Every client's plan: the data's training ``labels`` split among the groups and within
    each (``writers``: the data set's natural partition, or None), one calibrated schedule per
    group. Needs no model (``fedsim validate`` checks a factory scenario's data with it).

    A group whose clients cannot each hold a batch is a problem of the scenario: every such
    group is listed, each at its ``batch_size`` and line, as loading lists a file's
    (:meth:`~fedsim.config.loading.LoadedScenario.problems_error`)."""
    scenario = loaded.scenario
    plans: list[ClientPlan] = []
    first_step = first_server_step(scenario)
    split = split_groups(labels, scenario.clients.groups,
                         lambda name: tree.numpy("partition", name), writers)
    problems = [problem for index, (group, parts)
                in enumerate(zip(scenario.clients.groups, split, strict=True))
                if (problem := batch_problem(index, group, [len(p) for p in parts])) is not None]
    if problems:
        raise loaded.problems_error(problems)
    for index, (group, parts) in enumerate(zip(scenario.clients.groups, split, strict=True)):
        where = f"clients.groups[{index}]"
        smallest = min(len(p) for p in parts)
        # One schedule per group, calibrated at the group's largest q = m/N (its smallest
        # client): a larger q costs more privacy, so the target then holds for every client.
        check_normalisation_budget(group, where)
        check_pca_budget(group, where)
        schedule = make_schedule(group, q=group.batch_size / smallest, where=where)
        if group.adaptive_clip is not None:  # the count's noise must leave room for the sum's
            try:
                sum_noise_multiplier(float(schedule.sigma(0)), group.adaptive_clip.count_noise_std,
                                     group.sampling)
            except ConfigError as exc:
                raise ConfigError(f"{where}.adaptive_clip: {exc}") from None
        for client_id, indices in zip(group.client_ids(), parts, strict=True):
            plans.append(ClientPlan(client_id, group, indices, schedule,
                                    first_server_step=first_step))
    return plans


def partial_sums(scenario: Scenario, num_params: int) -> int:
    """How many sums (base versions) an aggregation node's partial carries within
    ``network.max_message_bytes`` (:func:`~fedsim.protocol.codec.partial_groups`); a
    :class:`ConfigError` when not even one fits."""
    groups = codec.partial_groups(num_params, scenario.network.max_message_bytes)
    if groups == 0:
        raise ConfigError(
            f"aggregators.count = {scenario.aggregators.count}: an aggregation node's partial of "
            f"this {num_params:,}-parameter model takes up to "
            f"{codec.max_partial_bytes(num_params, 1):,} bytes (one sum and a manifest of up to "
            f"{codec.MAX_PARTIAL_HEADER_BYTES:,}), above network.max_message_bytes = "
            f"{scenario.network.max_message_bytes:,}; raise it, or set aggregators.count: 0")
    return groups


def first_server_step(scenario: Scenario) -> float:
    """s_0: the value the scenario's server step-size schedule gives its first window (the step
    size the first global model carries, before any evaluation could reduce it)."""
    return make_step_size(scenario.server.step_size).current(1)


def plan_of(population: Population, client_id: str) -> ClientPlan:
    """The plan of ``client_id``; a :class:`ConfigError` listing the scenario's clients if it
    has none of that name."""
    for plan in population.plans:
        if plan.client_id == client_id:
            return plan
    known = [p.client_id for p in population.plans]
    shown = ", ".join(known[:8]) + (" ..." if len(known) > 8 else "")
    raise ConfigError(
        f"--client-id {client_id!r} is not a client of scenario "
        f"{population.scenario.name!r} (its clients: {shown})"
    )
