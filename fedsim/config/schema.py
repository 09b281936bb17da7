"""The scenario schema: one YAML file describes a whole run.

Every model is frozen and forbids unknown keys, so a typo is an error rather than a silently
ignored setting. Cross-field rules live in ``model_validator`` s so that their errors carry the
YAML path of the section they concern. :mod:`fedsim.config.loading` turns pydantic's errors into
``clients.groups[1].batch_size: must be > 0`` lines.

Units: times are virtual seconds; ``speed`` is virtual seconds of compute per sample gradient;
bandwidth is bytes per second; probabilities are in [0, 1].
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from typing import TYPE_CHECKING, Annotated, Any, Literal

import numpy as np
from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, field_validator, model_validator

from fedsim.config.aggregation import (
    AdaptiveClipping,
    Aggregation,
    LocalStepSequence,
    ServerOptimizerConfig,
    StalenessWeighting,
    WindowsAggregation,
)

Probability = Annotated[float, Field(ge=0.0, le=1.0)]
PositiveFloat = Annotated[float, Field(gt=0.0, allow_inf_nan=False)]
NonNegativeFloat = Annotated[float, Field(ge=0.0, allow_inf_nan=False)]
PositiveInt = Annotated[int, Field(gt=0)]


class _Strict(BaseModel):
    """Base of every scenario section: immutable, unknown keys rejected."""

    model_config = ConfigDict(frozen=True, extra="forbid", validate_default=True)


# ---------------------------------------------------------------------------------------------
# Distributions (latency, compute speed, on/off periods)


class _Distribution(_Strict):
    """Base of the distributions; each defines ``sample(rng) -> float`` (finite, >= 0)."""

    if TYPE_CHECKING:  # each subclass defines it (a pydantic model: no abstract methods here)

        def sample(self, rng: np.random.Generator) -> float: ...

    def sampler(self) -> Callable[[np.random.Generator], float]:
        """``sample`` as a plain callable, as :class:`~fedsim.transports.simulated.LinkModel`
        takes it."""
        return self.sample

    @property
    def is_zero(self) -> bool:
        return False


class Constant(_Distribution):
    """Always ``value``. A bare number in YAML means this."""

    kind: Literal["constant"] = "constant"
    value: NonNegativeFloat

    def sample(self, rng: np.random.Generator) -> float:
        return self.value

    @property
    def is_zero(self) -> bool:
        return self.value == 0.0


class Uniform(_Distribution):
    """Uniform on [low, high]."""

    kind: Literal["uniform"]
    low: NonNegativeFloat
    high: NonNegativeFloat

    @model_validator(mode="after")
    def _ordered(self) -> Uniform:
        if self.high < self.low:
            raise ValueError(f"high ({self.high}) must be >= low ({self.low})")
        return self

    def sample(self, rng: np.random.Generator) -> float:
        return float(rng.uniform(self.low, self.high))


class Exponential(_Distribution):
    """Exponential with the given mean (memoryless waiting times, e.g. crashes)."""

    kind: Literal["exponential"]
    mean: PositiveFloat

    def sample(self, rng: np.random.Generator) -> float:
        return float(rng.exponential(self.mean))


class LogNormal(_Distribution):
    """exp(N(log(median), sigma^2)): heavy-tailed positive times (stragglers, network jitter)."""

    kind: Literal["lognormal"]
    median: PositiveFloat
    sigma: NonNegativeFloat

    def sample(self, rng: np.random.Generator) -> float:
        return float(self.median * math.exp(self.sigma * rng.standard_normal()))


class ShiftedExponential(_Distribution):
    """``minimum`` + Exponential(mean): a fixed propagation delay plus queueing jitter."""

    kind: Literal["shifted_exponential"]
    minimum: NonNegativeFloat
    mean: PositiveFloat

    def sample(self, rng: np.random.Generator) -> float:
        return float(self.minimum + rng.exponential(self.mean))


def _number_is_constant(value: Any) -> Any:
    """A bare number in YAML stands for ``{kind: constant, value: number}``."""
    if isinstance(value, int | float) and not isinstance(value, bool):
        return {"kind": "constant", "value": value}
    return value


Distribution = Annotated[
    Constant | Uniform | Exponential | LogNormal | ShiftedExponential,
    Field(discriminator="kind"),
    BeforeValidator(_number_is_constant),
]


# ---------------------------------------------------------------------------------------------
# Data and model


class Partition(_Strict):
    """How a group's share of the training set is split among its clients."""

    scheme: Literal["iid", "dirichlet", "shards", "unequal"] = "iid"
    alpha: PositiveFloat = 0.5  # dirichlet concentration (smaller = more label skew)
    shards_per_client: PositiveInt = 2
    size_sigma: PositiveFloat = 1.0  # unequal: log-normal spread of client sizes


class Dataset(_Strict):
    """Training / held-out data.

    A named data set (``mnist``) is looked for at ``path`` when given (relative to the scenario
    file's directory first, then to the working directory), then in ``$FEDSIM_DATA_DIR``, then
    in the user cache, and otherwise downloaded (sha256-verified) into the cache unless
    offline; see :mod:`fedsim.training.datasets`.
    """

    name: Literal["mnist", "synthetic"]
    path: str | None = None
    # synthetic only: a seeded Gaussian-mixture classification problem
    num_samples: PositiveInt = 6000
    num_test_samples: PositiveInt = 1000
    num_features: PositiveInt = 20
    num_classes: Annotated[int, Field(ge=2)] = 4
    # evaluation on at most this many held-out samples (None: all), for speed
    test_subset: PositiveInt | None = None

    @model_validator(mode="after")
    def _path_only_for_files(self) -> Dataset:
        if self.name == "synthetic" and self.path is not None:
            raise ValueError("path: a synthetic dataset is generated, it takes no path")
        return self


# ``package.module:function`` (or ``:Class.method``); the same pattern as
# fedsim.training.models.FACTORY_PATTERN, which cannot be imported here (torch).
_FACTORY = r"^[A-Za-z_]\w*(\.[A-Za-z_]\w*)*:[A-Za-z_]\w*(\.[A-Za-z_]\w*)*$"
OptionValue = int | float | str | bool | None | list[Any] | dict[str, Any]


class Model(_Strict):
    """The model: a built-in one by ``name``, or the user's own ``factory``, with options.

    ``factory: "package.module:function"`` is imported when the run is built (the module must
    be installed or on PYTHONPATH; the current directory and the scenario file's directory are
    also searched) and called with ``options`` as keyword arguments, plus ``num_classes`` and
    ``input_shape`` (one example's shape) from the data when it takes them and ``options``
    does not give them. It must return a ``torch.nn.Module`` that DP-SGD can train (checked).
    Neither given: the model comes from Python (``model_factory``).
    """

    name: str | None = Field(default=None, min_length=1)
    factory: str | None = None
    options: dict[str, OptionValue] = Field(default_factory=dict)

    @field_validator("factory")
    @classmethod
    def _factory_shape(cls, value: str | None) -> str | None:
        if value is not None and not re.match(_FACTORY, value):
            raise ValueError(
                f"{value!r} is not of the form 'package.module:function' (a dotted module path, "
                "a colon, the name of a callable in it)"
            )
        return value

    @model_validator(mode="after")
    def _name_or_factory(self) -> Model:
        if self.name is not None and self.factory is not None:
            raise ValueError(
                "give either name (a built-in model) or factory ('package.module:function'), "
                "not both"
            )
        return self


# ---------------------------------------------------------------------------------------------
# Client DP posture


class ConstantClip(_Strict):
    kind: Literal["constant"] = "constant"
    value: PositiveFloat


class DecayClip(_Strict):
    """Sensitivity decay (Du et al., paper 002): C_t = initial * final_ratio^(t/T) over the
    group's T = ``rounds``, so the clip falls from ``initial`` to ``initial * final_ratio``."""

    kind: Literal["decay"]
    initial: PositiveFloat
    final_ratio: Annotated[float, Field(gt=0.0, le=1.0)]


Clip = Annotated[
    ConstantClip | DecayClip, Field(discriminator="kind"), BeforeValidator(_number_is_constant)
]


class ConstantNoise(_Strict):
    """A fixed noise multiplier sigma (noise std / sensitivity)."""

    kind: Literal["constant"] = "constant"
    sigma: PositiveFloat


class TargetNoise(_Strict):
    """Calibrate sigma at start: the smallest sigma whose ``rounds`` releases (the group's
    ``rounds``) are (epsilon, delta)-DP under the group's accountant."""

    kind: Literal["target"]
    epsilon: PositiveFloat
    delta: Annotated[float, Field(gt=0.0, lt=1.0)]


class GrowingMuNoise(_Strict):
    """Growing mu_t (Du et al., paper 002): per-round GDP mu_t = mu_0 * growth^(t/T) (noise
    sigma_t = 1/mu_t shrinking over the group's T = ``rounds``). mu_0 is solved in one of two
    ways (give exactly one):

    * ``epsilon`` + ``delta``: the T rounds meet (epsilon, delta) under the group's accountant
      (a guarantee; :func:`fedsim.privacy.schedules.solve_growing_mu`);
    * ``mu_total``: CLT APPROXIMATION - the heterogeneous GDP CLT over the T rounds,
      mu = q sqrt(sum_t (e^{mu_t^2} - 1)) (Du et al. Thm 1), meets ``mu_total``. The paper's
      own calibration; it can under-report eps (:func:`fedsim.privacy.schedules.clt_growing_mu`).
    """

    kind: Literal["growing_mu"]
    growth: Annotated[float, Field(ge=1.0)]
    epsilon: PositiveFloat | None = None
    delta: Annotated[float, Field(gt=0.0, lt=1.0)] | None = None
    mu_total: PositiveFloat | None = None

    @model_validator(mode="after")
    def _one_target(self) -> GrowingMuNoise:
        by_budget = self.epsilon is not None or self.delta is not None
        if by_budget and (self.epsilon is None or self.delta is None):
            raise ValueError("growing_mu: give epsilon and delta together")
        if by_budget == (self.mu_total is not None):
            raise ValueError("growing_mu: give either epsilon + delta (solved under the "
                             "group's accountant) or mu_total (CLT approximation), not both")
        return self


def _bare_sigma_is_constant(value: Any) -> Any:
    """``noise: 1.1`` and ``noise: {sigma: 1.1}`` both mean a constant sigma."""
    if isinstance(value, int | float) and not isinstance(value, bool):
        return {"kind": "constant", "sigma": value}
    if isinstance(value, dict) and "kind" not in value and "sigma" in value:
        return {"kind": "constant", **value}
    return value


Noise = Annotated[
    ConstantNoise | TargetNoise | GrowingMuNoise,
    Field(discriminator="kind"),
    BeforeValidator(_bare_sigma_is_constant),
]


class Budget(_Strict):
    """A client's privacy budget: it never releases an update past (epsilon, delta)."""

    epsilon: PositiveFloat
    delta: Annotated[float, Field(gt=0.0, lt=1.0)]


class Staleness(_Strict):
    """When a client waits for a fresh global model before its next round (van Dijk & Nguyen: "if the
    last received global model happened too many rounds ago" or "deviates too far").

    ``max_versions_behind``: local rounds applied on top of the held global model; at this many
    the client waits for a newer global. ``max_distance``: L2 distance between the local model
    and the held global model beyond which it waits. None disables a rule.
    """

    max_versions_behind: PositiveInt | None = None
    max_distance: PositiveFloat | None = None


class Crashes(_Strict):
    """Crash-stop failures: after ``every`` (a distribution of up-times) the client process dies,
    losing its in-memory model; it rejoins after ``rejoin_after`` (None: never) with its ledger
    resumed from disk."""

    every: Distribution
    rejoin_after: Distribution | None = None



class Availability(_Strict):
    """Alternating on/off periods (an offline client neither trains nor receives) and crashes.
    With ``online`` unset the client is always on (apart from crashes)."""

    online: Distribution | None = None
    offline: Distribution | None = None
    crashes: Crashes | None = None


    @model_validator(mode="after")
    def _both_periods(self) -> Availability:
        if (self.online is None) != (self.offline is None):
            raise ValueError("online and offline periods go together: give both or neither")
        return self


# ---------------------------------------------------------------------------------------------
# Network


class Link(_Strict):
    """One direction of the network: per-message latency, losses, and bandwidth."""

    latency: Distribution = Field(default_factory=lambda: Constant(value=0.0))
    drop: Probability = 0.0
    duplicate: Probability = 0.0
    reorder: Probability = 0.0
    bandwidth_bytes_per_s: PositiveFloat | None = None  # None: transfer time is zero



class LinkOverride(_Strict):
    """Per-group network settings; unset fields inherit the scenario's ``network``."""

    uplink: Link | None = None
    downlink: Link | None = None


class Network(_Strict):
    uplink: Link = Field(default_factory=Link)
    downlink: Link = Field(default_factory=Link)
    max_message_bytes: PositiveInt = 64 * 1024 * 1024


# ---------------------------------------------------------------------------------------------
# Clients


class ClientGroup(_Strict):
    """``count`` clients that share one DP posture, speed and availability model."""

    name: str = Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,47}$")
    count: PositiveInt
    data_share: Annotated[float, Field(gt=0.0, le=1.0)]
    partition: Partition = Field(default_factory=Partition)
    batch_size: PositiveInt
    sampling: Literal["poisson", "fixed"] = "poisson"
    clip: Clip
    noise: Noise
    local_steps: PositiveInt = 1
    local_lr: PositiveFloat = 0.1
    max_physical_batch: PositiveInt = 256
    rounds: PositiveInt | None = None  # stop ("done") after this many rounds
    speed: Distribution = Field(default_factory=lambda: Constant(value=0.0))
    availability: Availability = Field(default_factory=Availability)
    staleness: Staleness = Field(default_factory=Staleness)
    budget: Budget | None = None
    accountant: Literal["pld", "rdp"] = "pld"
    weight: PositiveFloat = 1.0  # mixing weight under server.mixing = "configured"
    network: LinkOverride | None = None
    adaptive_clip: AdaptiveClipping | None = Field(
        default=None, description="adaptive (quantile) clipping; the clip value is its start")
    per_example_steps: PositiveInt = Field(
        default=1, description="a_h as that many SGD steps on the example alone (van Dijk & Nguyen); "
                               "1: its gradient. Same privacy, that many times the compute")
    per_example_lr: PositiveFloat = Field(default=0.1,
                                          description="step size of per_example_steps")
    step_sequence: LocalStepSequence = Field(
        default_factory=LocalStepSequence,
        description="the round step sizes eta(r) agreed a priori with the server, from local_lr")
    follow_server_step: bool = Field(
        default=True,
        description="multiply the local step by the server step size each global model carries "
                    "(van Dijk & Nguyen: the server broadcasts the new step sizes); false: local_lr only")
    interrupt: Literal["switch", "snapshot"] = Field(
        default="switch",
        description=(
            "A global model arriving mid-round: 'switch' (van Dijk & Nguyen's interrupt service routine) "
            "computes the round's gradients not yet computed at the new model, with the batch "
            "and noise drawn at round start; 'snapshot' computes every gradient at the model the "
            "round began on. Same privacy either way (the new model is post-processing)."),
    )


    @model_validator(mode="after")
    def _calibration_needs_rounds(self) -> ClientGroup:
        if self.rounds is None:
            if self.noise.kind in ("target", "growing_mu"):
                raise ValueError(
                    f"noise kind {self.noise.kind!r} is calibrated over a fixed number of "
                    "rounds: set rounds")
            if self.clip.kind == "decay":
                raise ValueError("clip kind 'decay' decays over a fixed number of rounds: set rounds")
        if self.adaptive_clip is not None and self.clip.kind != "constant":
            raise ValueError("adaptive_clip moves the clipping norm itself: give a constant clip "
                             "(its starting value), not a schedule")
        return self


class Clients(_Strict):
    groups: list[ClientGroup] = Field(min_length=1)

    @model_validator(mode="after")
    def _shares_and_names(self) -> Clients:
        names = [g.name for g in self.groups]
        duplicates = sorted({n for n in names if names.count(n) > 1})
        if duplicates:
            raise ValueError(f"group names must be unique, repeated: {duplicates}")
        total = sum(g.data_share for g in self.groups)
        if total > 1.0 + 1e-9:
            raise ValueError(f"data_share of all groups sums to {total:g}, must be <= 1")
        return self

    @property
    def total(self) -> int:
        return sum(g.count for g in self.groups)


# ---------------------------------------------------------------------------------------------
# Server


class ConstantStep(_Strict):
    kind: Literal["constant"] = "constant"
    value: PositiveFloat = 1.0


class PlateauStep(_Strict):
    """Multiply by ``factor`` whenever held-out accuracy does not improve on its best for
    ``patience`` evaluations (van Dijk & Nguyen's "decrease the step size by 10%"), never below
    ``minimum``."""

    kind: Literal["plateau"]
    initial: PositiveFloat = 1.0
    factor: Annotated[float, Field(gt=0.0, lt=1.0)] = 0.9
    patience: PositiveInt = 1
    minimum: NonNegativeFloat = 0.0


class InverseTimeStep(_Strict):
    """initial / (1 + decay * window) ** power: a diminishing step-size law."""

    kind: Literal["inverse_time"]
    initial: PositiveFloat = 1.0
    decay: NonNegativeFloat
    power: PositiveFloat = 1.0


StepSize = Annotated[ConstantStep | PlateauStep | InverseTimeStep, Field(discriminator="kind")]


class Server(_Strict):
    """Time windows, mixing, step size, evaluation and broadcast (van Dijk & Nguyen, sec. 3); the
    aggregation policy, staleness weighting and server optimizer (:mod:`fedsim.aggregation`).
    ``window`` is also the reporting period (metrics, evaluation, stop checks) of on-arrival
    policies; ``normalize`` applies to time windows (a buffer is normalised over itself)."""

    window: PositiveFloat
    mixing: Literal["data_size", "configured", "uniform"] = "data_size"
    # population: lambda_i = weight_i / (all clients' weight), so a window in which few clients
    # report moves the model less; window: a convex mix of whatever arrived in the window.
    normalize: Literal["population", "window"] = "population"
    participation: Annotated[float, Field(gt=0.0, le=1.0)] = 1.0
    step_size: StepSize = Field(default_factory=ConstantStep)
    broadcast_every: PositiveInt = 1
    max_staleness: Annotated[int, Field(ge=0)] | None = None  # versions; None: accept all
    eval_every: PositiveInt = 1
    aggregation: Aggregation = Field(
        default_factory=WindowsAggregation,
        description="when updates are applied: windows (default), fedbuff, fedasync")
    staleness_weight: StalenessWeighting = Field(
        default_factory=StalenessWeighting,
        description="how much an update s versions old counts: constant, polynomial, hinge")
    optimizer: ServerOptimizerConfig = Field(
        default_factory=ServerOptimizerConfig,
        description="server optimizer: sgd (default), momentum, adam, yogi")


# ---------------------------------------------------------------------------------------------
# Run


class Stop(_Strict):
    """The run ends at whichever set condition comes first, checked at the end of each server
    window (so ``virtual_seconds`` ends at the first window end at or after it).
    ``all_budgets_spent`` (on by default) ends it once no client can train any more (budget
    spent, rounds done, crashed for good) and every update in flight has arrived."""

    virtual_seconds: PositiveFloat | None = None
    windows: PositiveInt | None = None
    target_accuracy: Annotated[float, Field(gt=0.0, le=1.0)] | None = None
    all_budgets_spent: bool = True


class Privacy(_Strict):
    """Reporting settings: eps in clients.csv / summary.json is taken at ``delta``.

    ``timing``: ``public`` (default) makes a round's compute time the speed model's cost of the
    expected batch (a public value), ``realised`` the cost of the realised Poisson batch, which
    reveals that batch's size to the server and is not covered by the accountant.
    ``deployed_randomness``: ``os_entropy`` (default) keys deployed clients' batches and noise
    from the operating system; ``seeded_not_private`` from the scenario seed, for reproducible
    tests only: the server can then regenerate every client's noise (marked in the outputs)."""

    delta: Annotated[float, Field(gt=0.0, lt=1.0)] = 1e-5
    timing: Literal["public", "realised"] = "public"
    deployed_randomness: Literal["os_entropy", "seeded_not_private"] = "os_entropy"


class Scenario(_Strict):
    """One run: data, model, clients, server, network, stop condition and seed."""

    name: str = Field(default="scenario", min_length=1)
    seed: Annotated[int, Field(ge=0)] = 0
    stop: Stop
    dataset: Dataset
    model: Model
    clients: Clients
    server: Server
    network: Network = Field(default_factory=Network)
    privacy: Privacy = Field(default_factory=Privacy)
    # torch threads for training: one by default (on a shared CPU more threads often slow down)
    torch_threads: PositiveInt = 1

    @model_validator(mode="after")
    def _can_stop(self) -> Scenario:
        stop = self.stop
        bounded = stop.virtual_seconds is not None or stop.windows is not None
        if bounded:
            return self
        if not stop.all_budgets_spent:
            raise ValueError(
                "stop: no stop condition bounds the run; set virtual_seconds or windows "
                "(target_accuracy alone may never be reached)"
            )
        endless = [
            g.name for g in self.clients.groups
            if g.budget is None and g.rounds is None and g.availability.crashes is None
        ]
        if endless:
            raise ValueError(
                f"stop: only all_budgets_spent is set but groups {endless} have neither a budget "
                "nor rounds, so the run would never end; set stop.virtual_seconds or "
                "stop.windows"
            )
        return self
