"""The scenario schema: one YAML file describes a whole run.

Every model is frozen and forbids unknown keys, so a typo is an error rather than a silently
ignored setting. Cross-field rules live in ``model_validator`` s so that their errors carry the
YAML path of the section they concern; each ``mode="after"`` rule must hold on its own (none
may assume that an earlier one passed): where a field is invalid,
:mod:`fedsim.config.cross_field` still runs every rule that does not read it, one by one.
:mod:`fedsim.config.loading` turns pydantic's errors into
``clients.groups[1].batch_size: must be > 0`` lines.

Units: times are virtual seconds; ``speed`` is virtual seconds of compute per sample gradient;
bandwidth is bytes per second; probabilities are in [0, 1].
"""

from __future__ import annotations

from collections import Counter
from typing import Annotated, Any, ClassVar, Literal

from pydantic import AfterValidator, Field, model_validator

from fedsim.config import limits
from fedsim.config.aggregation import (
    AdaptiveClipping,
    Aggregation,
    DpNormalisation,
    LocalStepSequence,
    ServerOptimizerConfig,
    StalenessWeighting,
    WindowsAggregation,
)
from fedsim.config.compression import Compression
from fedsim.config.dataset import Dataset
from fedsim.config.distributions import (
    BatchSize,
    ClientCount,
    Constant,
    Delta,
    Distribution,
    Exponential,
    Fraction,
    LogNormal,
    OpenUnit,
    PositiveInt,
    PositiveSeconds,
    RoundCount,
    Scale,
    Seed,
    ShardCount,
    ShiftedExponential,
    StepCount,
    Strict,
    ThreadCount,
    Uniform,
    VersionCount,
    WindowCount,
    zero_seconds,
)
from fedsim.config.features import DpPca, too_many_components
from fedsim.config.kind_keys import KeysOfKind, refuse_other_kinds_keys
from fedsim.config.model import Model
from fedsim.config.network import Aggregators, Link, LinkOverride, Network
from fedsim.config.posture import (
    Budget,
    Clip,
    ClipTiedNoise,
    ConstantClip,
    ConstantNoise,
    DecayClip,
    GrowingMuNoise,
    Noise,
    TargetNoise,
)

__all__ = [
    "Budget", "ClientGroup", "ClipTiedNoise", "Clients", "Clip", "Constant", "ConstantClip", "ConstantNoise",
    "Dataset", "DecayClip", "Distribution", "Exponential", "GrowingMuNoise", "Link", "LogNormal",
    "Model", "Network", "Noise", "Scenario", "Server", "ShiftedExponential", "Stop",
    "TargetNoise", "Uniform",
]

_Strict = Strict


# ---------------------------------------------------------------------------------------------
# Data and model


class FieldProblem(ValueError):
    """A scenario-wide check's problem with one field, at ``path`` from the scenario's root:
    an error then names that field and its line, as a field's own check does (a stranger:
    these read "scenario (line 1): clients.groups[0].speed: ..."). Its text is the path and
    the ``message``."""

    def __init__(self, path: tuple[str | int, ...], message: str) -> None:
        where = "".join(f"[{part}]" if isinstance(part, int) else f".{part}" for part in path)
        super().__init__(f"{where.lstrip('.')}: {message}")
        self.path = path
        self.message = message


class Partition(_Strict):
    """How a group's share of the training set is split among its clients."""

    scheme: Literal["iid", "dirichlet", "shards", "unequal", "natural"] = Field(
        default="iid", description="How the group's records are split among its clients: iid (equal "
        "random parts), dirichlet (label skew), shards (a few labels each) or unequal (IID "
        "contents, log-normal sizes) or natural (whole writers per client, for data sets "
        "with writers such as femnist).")
    alpha: Scale = Field(
        default=0.5, description="The Dirichlet concentration of the dirichlet scheme (Hsu, Qi and "
        "Brown, \"Measuring the Effects of Non-Identical Data Distribution\"); smaller means "
        "more label skew.")
    shards_per_client: ShardCount = Field(
        default=2, description="Label-sorted shards dealt to each client by the shards scheme "
        "(McMahan et al., \"Communication-Efficient Learning of Deep Networks from "
        "Decentralized Data\").")
    size_sigma: Annotated[float, Field(gt=0.0, le=limits.MAX_LOGNORMAL_SIGMA)] = Field(
        default=1.0, description="The log-normal spread of client sizes under the unequal scheme.")

    KEYS_OF_KIND: ClassVar[KeysOfKind] = {
        "iid": frozenset(), "dirichlet": frozenset({"alpha"}),
        "shards": frozenset({"shards_per_client"}), "unequal": frozenset({"size_sigma"}),
        "natural": frozenset()}

    @model_validator(mode="after")
    def _keys_of_its_scheme(self) -> Partition:
        refuse_other_kinds_keys(self, self.KEYS_OF_KIND)
        return self


# ---------------------------------------------------------------------------------------------
# Client availability and staleness


class Staleness(_Strict):
    """When a client waits for a fresh global model before its next round (van Dijk et al.,
    "Considerations on the Theory of Training Models with Differential Privacy": "if the last
    received global model happened too many rounds ago" or "deviates too far").

    ``max_versions_behind``: local rounds applied on top of the held global model; at this many
    the client waits for a newer global. ``max_distance``: L2 distance between the local model
    and the held global model beyond which it waits. None disables a rule.
    """

    max_versions_behind: PositiveInt | None = Field(
        default=None, description="Local rounds on top of the held global model after which the client "
        "waits for a newer one; omitted, it never waits for this reason.")
    max_distance: Scale | None = Field(
        default=None, description="L2 distance between the local and the held global model beyond "
        "which the client waits for a newer global model; omitted, no distance rule.")


class Crashes(_Strict):
    """Crash-stop failures: after ``every`` (a distribution of up-times) the client process dies,
    losing its in-memory model; it rejoins after ``rejoin_after`` (None: never) with its ledger
    resumed from disk."""

    every: Distribution = Field(description="The up-time before each crash, in virtual seconds.")
    rejoin_after: Distribution | None = Field(
        default=None, description="The down-time before a crashed client rejoins with its ledger "
        "resumed from disk; omitted, it never rejoins.")

    @model_validator(mode="after")
    def _up_for_a_while(self) -> Crashes:
        if self.every.is_zero:
            raise ValueError("every: a client that crashes after 0 s never runs (and crashing "
                             "at once forever would stall the run); give a positive up-time")
        return self


class Availability(_Strict):
    """Alternating on/off periods (an offline client neither trains nor receives) and crashes.
    With ``online`` unset the client is always on (apart from crashes)."""

    online: Distribution | None = Field(
        default=None, description="How long a client stays online, in virtual seconds; omitted, it is "
        "always online.")
    offline: Distribution | None = Field(
        default=None, description="How long a client stays offline (neither training nor receiving).")
    crashes: Crashes | None = Field(
        default=None, description="Crash-stop failures of the client process; omitted, it never crashes.")

    @model_validator(mode="after")
    def _both_periods(self) -> Availability:
        if (self.online is None) != (self.offline is None):
            raise ValueError("online and offline periods go together: give both or neither")
        if self.online is not None and self.online.is_zero:
            raise ValueError("online: a client online for 0 s never trains (and switching at "
                             "the same instant forever would stall the run)")
        return self


# ---------------------------------------------------------------------------------------------
# Clients


class ClientGroup(_Strict):
    """``count`` clients that share one DP posture, speed and availability model."""

    name: str = Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,47}$",
                      description="The group's name, which prefixes its client ids.")
    count: ClientCount = Field(description="How many clients the group has.")
    data_share: Fraction = Field(
        description="The fraction of the training set the group's clients hold together "
        "(a single group: 1 unless given).")
    partition: Partition = Field(
        default_factory=Partition, description="How the group's share is split among its "
        "clients.")
    batch_size: BatchSize = Field(
        description="The expected (Poisson) or exact (fixed) number of records per DP-SGD "
        "step, m; each client needs at least m records (q = m/N <= 1).")
    sampling: Literal["poisson", "fixed"] = Field(
        default="poisson", description="Poisson batches (each record joins with probability m/N; "
        "add/remove neighbours, sensitivity C) or fixed-size batches (replace-one neighbours, "
        "sensitivity 2C).")
    clip: Clip = Field(description="The clipping norm C: a number, or a constant or decay "
                                   "schedule.")
    noise: Noise = Field(description="The noise multiplier sigma: a number, or a constant, "
                                     "target, growing_mu or clip_tied schedule.")
    local_steps: StepCount = Field(
        default=1, description="DP-SGD steps in each round before its update is released.")
    local_lr: Scale = Field(default=0.1, description="The learning rate of the local DP-SGD steps.")
    max_physical_batch: BatchSize = Field(
        default=256, description="The most examples whose per-example gradients are held at once; "
        "larger batches are computed in parts (the same result).")
    rounds: RoundCount | None = Field(
        default=None, description="After this many rounds a client stops (done); needed by schedules "
        "that are calibrated over a fixed number of rounds.")
    speed: Distribution = zero_seconds(
        "Virtual seconds of compute per sample gradient. 0 (the default) makes "
        "rounds take no virtual time: allowed only where rounds, a budget or a staleness rule "
        "bound or pace them.")
    availability: Availability = Field(
        default_factory=Availability, description="Online and offline periods and crashes.")
    staleness: Staleness = Field(
        default_factory=Staleness, description="When a client waits for a fresh global model.")
    budget: Budget | None = Field(
        default=None, description="The privacy budget each client never exceeds; omitted, no budget.")
    accountant: Literal["pld", "rdp"] = Field(
        default="pld", description="The accountant of the clients' ledgers: pld (privacy-loss "
        "distributions) or rdp (Renyi DP with the optimal conversion of Asoodeh et al., \"A "
        "Better Bound Gives a Hundred Rounds\").")
    weight: Scale = Field(
        default=1.0, description="The clients' mixing weight when server.mixing is configured.")
    network: LinkOverride | None = Field(
        default=None, description="The group's own links; unset parts inherit the scenario's network.")
    adaptive_clip: AdaptiveClipping | None = Field(
        default=None, description="Adaptive (quantile) clipping; the clip value is its start.")
    per_example_steps: StepCount = Field(
        default=1, description="Each a_h as that many SGD steps on its example alone (van Dijk "
        "et al.); 1: its gradient. The same privacy, that many times the compute.")
    per_example_lr: Scale = Field(default=0.1, description="The step size of per_example_steps.")
    step_sequence: LocalStepSequence = Field(
        default_factory=LocalStepSequence,
        description="The round step sizes eta(r) agreed a priori with the server, from local_lr.")
    follow_server_step: bool = Field(
        default=True,
        description="Multiply the local step by s_t / s_0, the server step size each model "
        "carries over the server schedule's first value (van Dijk et al.: the server broadcasts "
        "the new step sizes): start at local_lr, follow the server's reductions; false: don't.")
    interrupt: Literal["switch", "snapshot"] = Field(default="switch", description=(
        "A global model arriving mid-round: 'switch' (van Dijk et al.'s interrupt service "
        "routine) computes the round's gradients not yet computed at the new model, with the "
        "batch and noise drawn at round start; 'snapshot' computes every gradient at the model "
        "the round began on. The same privacy either way (the new model is post-processing)."))
    dp_normalisation: DpNormalisation | None = Field(default=None, description="DP feature "
        "standardisation before round 0, charged to the ledger (every group or none).")
    dp_pca: DpPca | None = Field(default=None, description="DP principal components before "
        "round 0, charged to the ledger; one shared projection (every group or none).")
    compression: Compression | None = Field(default=None, description="How the clients "
        "compress each update on the wire (top_k, threshold, quantise), after its noise: "
        "post-processing, no privacy cost; omitted, the full float32 vector.")

    @model_validator(mode="after")
    def _calibration_needs_rounds(self) -> ClientGroup:
        if self.rounds is None:
            if self.noise.kind in ("target", "growing_mu", "clip_tied"):
                raise ValueError(
                    f"noise kind {self.noise.kind!r} is calibrated over a fixed number of "
                    "rounds: set rounds")
            if self.clip.kind == "decay":
                raise ValueError("clip kind 'decay' decays over a fixed number of rounds: set rounds")
        if self.dp_normalisation is not None and self.noise.kind in ("growing_mu", "clip_tied"):
            raise ValueError("dp_normalisation: calibrate with noise kind target or constant")
        if self.dp_pca is not None and self.noise.kind in ("growing_mu", "clip_tied"):
            raise ValueError("dp_pca: calibrate with noise kind target or constant")
        if self.adaptive_clip is not None and self.clip.kind != "constant":
            raise ValueError("adaptive_clip moves the clipping norm itself: give a constant clip "
                             "(its starting value), not a schedule")
        if self.adaptive_clip is not None and isinstance(self.clip, ConstantClip):
            ceiling = self.adaptive_clip.ceiling(self.clip.value)
            if ceiling < self.clip.value:
                raise ValueError(f"adaptive_clip.max_clip={ceiling:g} is below the starting "
                                 f"clip {self.clip.value:g}")
        return self

    def adaptive_clip_ceiling(self) -> float | None:
        """The public ceiling of the group's adaptive clip (None without adaptive clipping)."""
        if self.adaptive_clip is None or not isinstance(self.clip, ConstantClip):
            return None
        return self.adaptive_clip.ceiling(self.clip.value)

    def client_ids(self) -> list[str]:
        """The group's client ids, in order: ``<name>-<index>``, the index zero-padded to at
        least three digits (the ids every runtime and report uses)."""
        width = max(3, len(str(self.count - 1)))
        return [f"{self.name}-{i:0{width}d}" for i in range(self.count)]


class Clients(_Strict):
    """The client population, as groups that share a posture."""

    groups: list[ClientGroup] = Field(
        min_length=1, description="The client groups, at least one; names must be unique.")

    @model_validator(mode="before")
    @classmethod
    def _one_group_holds_everything(cls, data: Any) -> Any:
        """A single group without ``data_share`` holds the whole training set (a stranger was
        told ``data_share`` is required with one group, where no other value makes sense
        but a deliberate subset); with several groups each must say its share."""
        groups = data.get("groups") if isinstance(data, dict) else None
        if isinstance(groups, list) and len(groups) == 1 and isinstance(groups[0], dict) \
                and "data_share" not in groups[0]:
            return {**data, "groups": [{**groups[0], "data_share": 1.0}]}
        return data

    @model_validator(mode="after")
    def _shares_and_names(self) -> Clients:
        counts = Counter(g.name for g in self.groups)
        duplicates = sorted(name for name, count in counts.items() if count > 1)
        if duplicates:
            raise ValueError(f"group names must be unique, repeated: {duplicates}")
        total = sum(g.data_share for g in self.groups)
        if total > 1.0 + 1e-9:
            raise ValueError(f"data_share of all groups sums to {total:g}, must be <= 1")
        if len({g.dp_normalisation is None for g in self.groups}) > 1:
            raise ValueError("dp_normalisation: set it for every group or none (the model and "
                             "its evaluation see one input scale)")
        if len({None if g.dp_pca is None else g.dp_pca.components for g in self.groups}) > 1:
            raise ValueError("dp_pca: set it for every group or none, with the same "
                             "components (the model sees one projected input)")
        if self.total > limits.MAX_CLIENTS:
            raise ValueError(f"the groups have {self.total} clients together, more than the "
                             f"{limits.MAX_CLIENTS} one simulation holds")
        return self

    @property
    def total(self) -> int:
        return sum(g.count for g in self.groups)


# ---------------------------------------------------------------------------------------------
# Server


class ConstantStep(_Strict):
    """The same server step size in every window."""

    kind: Literal["constant"] = Field(default="constant", description="The same step in every window.")
    value: Scale = Field(default=1.0, description="The step size the server applies in every window.")


class PlateauStep(_Strict):
    """Multiply by ``factor`` whenever held-out accuracy does not improve on its best for
    ``patience`` evaluations (van Dijk et al.'s "decrease the step size by 10%"), never below
    ``minimum``."""

    kind: Literal["plateau"] = Field(
        description="Shrink the step whenever held-out accuracy stops improving.")
    initial: Scale = Field(default=1.0, description="The first window's step size.")
    factor: OpenUnit = Field(default=0.9, description="What the step is multiplied by on a plateau.")
    patience: PositiveInt = Field(
        default=1, description="Evaluations without a new best accuracy that make a plateau.")
    minimum: Annotated[float, Field(ge=0.0, le=limits.MAX_SCALE)] = Field(
        default=0.0, description="The step size never falls below this.")


class InverseTimeStep(_Strict):
    """initial / (1 + decay * window) ** power: a diminishing step-size law."""

    kind: Literal["inverse_time"] = Field(
        description="A diminishing step, initial / (1 + decay window)^power.")
    initial: Scale = Field(default=1.0, description="The first window's step size.")
    decay: Annotated[float, Field(ge=0.0, le=limits.MAX_SCALE)] = Field(
        description="How fast the step shrinks per window.")
    power: Annotated[float, Field(gt=0.0, le=100.0)] = Field(
        default=1.0, description="The exponent of the decay.")


StepSize = Annotated[ConstantStep | PlateauStep | InverseTimeStep, Field(discriminator="kind")]


class Server(_Strict):
    """Time windows, mixing, step size, evaluation and broadcast (van Dijk et al.,
    "Considerations on the Theory of Training Models with Differential Privacy", sec. 3); the
    aggregation policy, staleness weighting and server optimizer (:mod:`fedsim.aggregation`).
    ``window`` is also the reporting period (metrics, evaluation, stop checks) of on-arrival
    policies; ``normalize`` applies to time windows (a buffer is normalised over itself)."""

    window: Annotated[float, Field(ge=limits.MIN_WINDOW, le=limits.MAX_SECONDS,
                                   allow_inf_nan=False)] = Field(
        description="The length of a server window in virtual seconds (at least 0.001): "
        "updates that arrive in one window are mixed together.")
    mixing: Literal["data_size", "configured", "uniform"] = Field(
        default="data_size", description="How clients' updates are weighted: by declared data size, "
        "by each group's weight, or equally.")
    normalize: Literal["population", "window"] = Field(
        default="population", description="population divides each weight by all clients' weight, so "
        "a window in which few clients report moves the model less; window mixes whatever "
        "arrived in the window convexly.")
    participation: Fraction = Field(
        default=1.0, description="The fraction of clients whose updates a window takes.")
    step_size: StepSize = Field(default_factory=ConstantStep,
                                description="The server's step size over windows.")
    broadcast_every: WindowCount = Field(
        default=1, description="Broadcast the global model every this many windows.")
    max_staleness: VersionCount | None = Field(
        default=None, description="Refuse updates computed on a model this many versions old or "
        "older; omitted, accept all.")
    eval_every: WindowCount = Field(
        default=1, description="Evaluate on the held-out set every this many windows.")
    aggregation: Aggregation = Field(
        default_factory=WindowsAggregation,
        description="When updates are applied: windows (default), fedbuff, fedasync.")
    staleness_weight: StalenessWeighting = Field(
        default_factory=StalenessWeighting,
        description="How much an update s versions old counts: constant, polynomial, hinge.")
    optimizer: ServerOptimizerConfig = Field(
        default_factory=ServerOptimizerConfig,
        description="The server optimizer: sgd (default), momentum, adam, yogi.")


# ---------------------------------------------------------------------------------------------
# Run


class Stop(_Strict):
    """The run ends at whichever set condition comes first, checked at the end of each server
    window (so ``virtual_seconds`` ends at the first window end at or after it).
    ``all_budgets_spent`` (on by default) ends it once no client can train any more (budget
    spent, rounds done, crashed for good) and every update in flight has arrived."""

    virtual_seconds: PositiveSeconds | None = Field(
        default=None, description="Stop at the first window end at or after this virtual time.")
    windows: WindowCount | None = Field(
        default=None, description="Stop after this many server windows.")
    target_accuracy: Fraction | None = Field(
        default=None, description="Stop once held-out accuracy reaches this.")
    all_budgets_spent: bool = Field(
        default=True, description="Stop once no client can train any more (budget spent, rounds done "
        "or crashed for good) and every update in flight has arrived.")


class Privacy(_Strict):
    """Reporting settings: eps in clients.csv / summary.json is taken at ``delta``.

    ``timing``: ``public`` (default) makes a round's compute time the speed model's cost of the
    expected batch (a public value), ``realised`` the cost of the realised Poisson batch, which
    reveals that batch's size to the server and is not covered by the accountant.
    ``deployed_randomness``: ``os_entropy`` (default) keys deployed clients' batches, noise and
    interrupt phases from the operating system; ``seeded_not_private`` from the scenario seed,
    for reproducible tests only: the server can then regenerate every client's noise (marked in
    the outputs)."""

    delta: Delta = Field(default=1e-5, description="The delta at which reports give each client's "
                                           "epsilon.")
    timing: Literal["public", "realised"] = Field(
        default="public", description="public times a deployed round by the expected batch (a "
        "public value); realised by the realised Poisson batch, which reveals its size to the "
        "server and is not covered by the accountant.")
    deployed_randomness: Literal["os_entropy", "seeded_not_private"] = Field(
        default="os_entropy", description="os_entropy keys deployed clients' batches and noise "
        "from the operating system; seeded_not_private from the scenario seed, for "
        "reproducible tests only (the server could regenerate the noise).")


def _one_path_component(name: str) -> str:
    """The default run directory is ``runs/<name>-seed<N>``: the name must not leave it."""
    if not 1 <= len(name) <= 120 or name[0] == "." or any(
            c in "/\\" or ord(c) < 32 for c in name):
        raise ValueError("must be 1 to 120 characters without '/', '\\' or control characters, "
                         "not starting with '.' (it names the run directory)")
    return name


class Scenario(_Strict):
    """One run: data, model, clients, server, network, stop condition and seed."""

    name: Annotated[str, AfterValidator(_one_path_component)] = Field(
        default="scenario", description="The scenario's name, which names the default run "
        "directory (one path component of at most 120 characters).")
    seed: Seed = Field(
        default=0, description="The seed every random draw of a simulated run comes from.")
    stop: Stop = Field(description="The conditions that end the run; the first one met ends it.")
    dataset: Dataset = Field(description="The training and held-out data.")
    model: Model = Field(description="The model every client trains.")
    clients: Clients = Field(description="The client population, as groups of clients that share a posture.")
    server: Server = Field(description="The server's windows, mixing and step size.")
    network: Network = Field(default_factory=Network,
                             description="The simulated network between clients and the server.")
    aggregators: Aggregators = Field(
        default_factory=Aggregators,
        description="Aggregation nodes between the clients and the server (none by default).")
    privacy: Privacy = Field(default_factory=Privacy,
                             description="How the reports state each client's privacy.")
    torch_threads: ThreadCount = Field(
        default=1, description="torch threads for training; one by default, as more threads often slow "
        "a shared CPU down.")
    device: Literal["cpu", "cuda", "mps", "auto"] = Field(
        default="cpu", description="Where rounds and evaluation run: cpu, cuda, mps, or auto "
        "(cuda, else mps, else cpu); generators, ledgers and accounting stay on the CPU.")

    @model_validator(mode="after")
    def _pca_model(self) -> Scenario:
        pca = self.clients.groups[0].dp_pca
        dataset = self.dataset
        if pca is not None and dataset.name == "synthetic" and dataset.factory is None and (
                problem := too_many_components(pca.components, dataset.num_features,
                                               " (dataset.num_features)")):
            # (known before any data: other data sets are checked when loaded, before any
            # release is charged; a stranger's passed validate, then failed after charging)
            raise ValueError(problem)
        if pca is None or self.model.name is None:
            return self
        if self.model.name not in ("logreg", "mlp"):
            raise ValueError(f"dp_pca: the model sees {pca.components} projected features; "
                             f"use a flat-input model (logreg or mlp), not {self.model.name!r}")
        given = self.model.options.get("in_features", pca.components)
        if given != pca.components:
            raise FieldProblem(("model", "options", "in_features"),
                               f"{given!r}, but dp_pca gives the model {pca.components} inputs "
                               f"(its components)")
        return self

    @model_validator(mode="after")
    def _invitations_fit(self) -> Scenario:
        total = self.clients.total
        if self.server.participation < 1.0 and total > limits.MAX_INVITED_CLIENTS:
            raise FieldProblem(
                ("server", "participation"),
                f"below 1 invites clients by a bitmap in the global model's header, which "
                f"names at most {limits.MAX_INVITED_CLIENTS} clients; this scenario has {total}")
        return self

    @model_validator(mode="after")
    def _rounds_take_time(self) -> Scenario:
        """A round of (next to) no virtual time that nothing bounds or paces trains for ever
        at one instant: virtual time never reaches the next window and the run never ends (a
        stranger's scenario without a speed, 0 by default, ran 168,393 rounds a client at time
        0). Refused past MAX_ROUNDS_PER_WINDOW expected rounds a client and server window (the
        speed's mean times the round's expected gradients), unless ``rounds`` bounds them or
        ``staleness.max_versions_behind`` waits for a newer global model after a few of
        them. A budget does not pace them (a large one affords millions of rounds at time 0),
        nor a distance rule (it may never fire): a review found both."""
        window = self.server.window
        for index, group in enumerate(self.clients.groups):
            if group.rounds is not None or group.staleness.max_versions_behind is not None:
                continue
            seconds = group.speed.average * group.batch_size * group.local_steps
            if seconds > 0 and window / seconds <= limits.MAX_ROUNDS_PER_WINDOW:
                continue
            default = "" if "speed" in group.model_fields_set else ", the default"
            raise FieldProblem(
                ("clients", "groups", index, "speed"),
                f"a round of group {group.name!r} takes "
                f"{seconds:.3g} virtual s on average (speed {group.speed.average:.3g} s a "
                f"sample gradient{default}), more than {limits.MAX_ROUNDS_PER_WINDOW:,} "
                f"rounds a client in a {window:g} s server window, and nothing bounds or paces "
                "them (rounds, staleness.max_versions_behind): virtual time would stand still "
                "and the run would never end; set speed, the virtual seconds of one sample "
                "gradient (for example speed: 0.003)")
        return self

    def budgets_at_other_delta(self) -> list[str]:
        """The groups whose budget holds at another delta than ``privacy.delta`` (the delta
        of every reported eps), as "phone (delta 0.001)": their reported eps may read above
        their budget."""
        return [f"{g.name} (delta {g.budget.delta:g})" for g in self.clients.groups
                if g.budget is not None and g.budget.delta != self.privacy.delta]

    @model_validator(mode="after")
    def _can_stop(self) -> Scenario:
        stop = self.stop
        if stop.virtual_seconds is not None and \
                stop.virtual_seconds / self.server.window > limits.MAX_WINDOWS:
            raise FieldProblem(
                ("stop", "virtual_seconds"),
                f"stop.virtual_seconds / server.window is "
                f"{stop.virtual_seconds / self.server.window:.3g} windows, more than "
                f"{limits.MAX_WINDOWS}; lengthen server.window")
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
