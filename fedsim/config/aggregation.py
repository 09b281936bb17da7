"""The ``server:`` sections that choose the aggregation policy, the staleness weighting and the
server optimizer (:mod:`fedsim.aggregation.policies`, :mod:`fedsim.aggregation.optimizers`).

A separate module of :mod:`fedsim.config.schema` (which imports these models into ``Server``).
"""

from __future__ import annotations

from typing import Annotated, ClassVar, Literal, Self

from pydantic import BaseModel, ConfigDict, Field, model_validator

from fedsim.config.kind_keys import KeysOfKind, refuse_other_kinds_keys

__all__ = [
    "Aggregation",
    "FedAsyncAggregation",
    "FedBuffAggregation",
    "ADAPTIVE_CLIP_CEILING",
    "AdaptiveClipping",
    "DpNormalisation",
    "LocalStepSequence",
    "ServerOptimizerConfig",
    "StalenessWeighting",
    "WindowsAggregation",
]


class _Strict(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid", validate_default=True)


class WindowsAggregation(_Strict):
    """Van Dijk & Nguyen's time windows: every update that arrived in a window, applied at its end."""

    kind: Literal["windows"] = Field(default="windows", description="Time windows (the default).")


class FedBuffAggregation(_Strict):
    """FedBuff (Nguyen et al. 2022): a buffer of ``buffer_size`` updates, applied (and the model
    published) as soon as it is full."""

    kind: Literal["fedbuff"] = Field(description="FedBuff: a buffer of K updates.")
    buffer_size: int = Field(gt=0, le=1_000_000, description="K: updates per server step.")


class FedAsyncAggregation(_Strict):
    """FedAsync (Xie et al. 2019): every update applied on arrival with weight
    ``alpha * S(staleness)``, the model published at once."""

    kind: Literal["fedasync"] = Field(description="FedAsync: every update on arrival.")
    alpha: float = Field(default=0.6, gt=0.0, le=1.0, allow_inf_nan=False,
                         description="Mixing weight alpha in (0, 1].")


Aggregation = Annotated[
    WindowsAggregation | FedBuffAggregation | FedAsyncAggregation, Field(discriminator="kind")]


class StalenessWeighting(_Strict):
    """``S(s)`` of an update ``s`` versions old (Xie et al.): ``constant`` 1; ``polynomial``
    ``(s + 1)^(-a)``; ``hinge`` 1 for ``s <= b``, else ``1 / (a (s - b) + 1)``."""

    kind: Literal["constant", "polynomial", "hinge"] = Field(
        default="constant", description="The weighting: constant, polynomial or hinge.")
    a: float = Field(default=0.5, gt=0.0, allow_inf_nan=False,
                     description="Polynomial exponent, or the hinge's slope.")
    b: float = Field(default=4.0, ge=0.0, allow_inf_nan=False,
                     description="Hinge: staleness (versions) up to which S = 1.")

    KEYS_OF_KIND: ClassVar[KeysOfKind] = {"constant": frozenset(), "polynomial": frozenset({"a"}),
                                          "hinge": frozenset({"a", "b"})}

    @model_validator(mode="after")
    def _keys_of_its_kind(self) -> Self:
        refuse_other_kinds_keys(self, self.KEYS_OF_KIND)
        return self


class ServerOptimizerConfig(_Strict):
    """How the pseudo-gradient moves the model, at the ``step_size`` of the window (Reddi et al.,
    "Adaptive Federated Optimization"): ``sgd`` (van Dijk & Nguyen's server step), ``momentum``
    (FedAvgM), ``adam`` (FedAdam), ``yogi`` (FedYogi)."""

    kind: Literal["sgd", "momentum", "adam", "yogi"] = Field(
        default="sgd", description="The optimizer: sgd, momentum, adam or yogi.")
    beta1: float = Field(default=0.9, ge=0.0, lt=1.0, allow_inf_nan=False,
                         description="Momentum / first-moment decay.")
    beta2: float = Field(default=0.99, ge=0.0, lt=1.0, allow_inf_nan=False,
                         description="Adam, yogi: second-moment decay.")
    tau: float = Field(default=1e-3, gt=0.0, allow_inf_nan=False,
                       description="Adam, yogi: adaptivity (v starts at tau^2).")

    KEYS_OF_KIND: ClassVar[KeysOfKind] = {
        "sgd": frozenset(), "momentum": frozenset({"beta1"}),
        "adam": frozenset({"beta1", "beta2", "tau"}), "yogi": frozenset({"beta1", "beta2", "tau"})}

    @model_validator(mode="after")
    def _keys_of_its_kind(self) -> Self:
        refuse_other_kinds_keys(self, self.KEYS_OF_KIND)
        return self


class LocalStepSequence(_Strict):
    """A client's a-priori agreed round step sizes eta(r) from its ``local_lr`` (van Dijk & Nguyen):
    ``constant``; ``inverse_time`` ``local_lr / (1 + decay r)^power``; ``exponential``
    ``max(minimum, local_lr factor^r)``. The server applies the same eta(r) to round r's update."""

    kind: Literal["constant", "inverse_time", "exponential"] = Field(
        default="constant", description="The sequence: constant, inverse_time or exponential.")
    decay: float = Field(default=0.0, ge=0.0, allow_inf_nan=False, description="The inverse_time decay per round.")
    power: float = Field(default=1.0, gt=0.0, allow_inf_nan=False, description="The inverse_time power.")
    factor: float = Field(default=1.0, gt=0.0, le=1.0, allow_inf_nan=False,
                          description="Exponential: per-round factor.")
    minimum: float = Field(default=0.0, ge=0.0, allow_inf_nan=False,
                           description="The exponential sequence's floor.")

    KEYS_OF_KIND: ClassVar[KeysOfKind] = {
        "constant": frozenset(), "inverse_time": frozenset({"decay", "power"}),
        "exponential": frozenset({"factor", "minimum"})}

    @model_validator(mode="after")
    def _keys_of_its_kind(self) -> Self:
        refuse_other_kinds_keys(self, self.KEYS_OF_KIND)
        return self


ADAPTIVE_CLIP_CEILING = 10.0
"""Default ceiling of adaptive clipping, as a multiple of the starting clip: the clip may grow
an order of magnitude (Andrew et al. start within one of the quantile they track), and the
server's norm bound, which scales with the ceiling, stays within 10x of the start's."""


class AdaptiveClipping(_Strict):
    """Adaptive (quantile) clipping, Andrew et al. 2021: after each step the clipping norm moves
    geometrically towards the ``target_quantile`` of the per-example gradient norms, from a
    count of unclipped examples released with noise ``count_noise_std``. The group's sigma is
    the step's *effective* multiplier: the sum's noise is raised so that (sum, count) together
    cost exactly one Gaussian step of that sigma (the ledger's events are unchanged)."""

    target_quantile: float = Field(default=0.5, gt=0.0, lt=1.0, allow_inf_nan=False,
                                   description="Fraction of examples meant to be unclipped.")
    learning_rate: float = Field(default=0.2, gt=0.0, allow_inf_nan=False,
                                 description="The rate eta_C of the geometric update.")
    count_noise_std: float = Field(gt=0.0, allow_inf_nan=False,
                                   description="The count's noise std sigma_b (Andrew et al.: "
                                               "about batch_size / 20).")
    max_clip: float | None = Field(
        default=None, gt=0.0, allow_inf_nan=False,
        description="The public ceiling of the moving clip (at least the starting clip): the "
        "clip never exceeds it, and the server bounds the group's updates with it. Omitted: "
        f"{ADAPTIVE_CLIP_CEILING} times the starting clip.")

    def ceiling(self, start: float) -> float:
        """The clip's public ceiling for a group whose clip starts at ``start``."""
        return self.max_clip if self.max_clip is not None else ADAPTIVE_CLIP_CEILING * start


class DpNormalisation(_Strict):
    """DP data normalisation (:mod:`fedsim.training.dp_stats`): before its first round the
    client releases per-feature means and standard deviations of its records with the Gaussian
    mechanism and standardises its features with them. Each record contributes its features and
    their squares clipped jointly to L2 norm ``bound``; under Poisson sampling (add/remove) the
    record count is released too (sensitivity ``sqrt(2) bound``), under fixed-size batches
    (replace-one) the sensitivity is ``2 bound``. The release is one unsampled Gaussian event
    (q = 1, this ``noise_multiplier``) on the client's ledger, composed with its DP-SGD steps."""

    noise_multiplier: float = Field(gt=0.0, le=1e4, allow_inf_nan=False,
                                    description="sigma of the release: noise std / sensitivity.")
    bound: float = Field(gt=0.0, allow_inf_nan=False,
                         description="B: the joint L2 clip of a record's (features, squares).")
    min_std: float = Field(default=0.1, gt=0.0, allow_inf_nan=False,
                           description="Floor of the released standard deviations (a noisy "
                                       "variance may be tiny or negative).")
