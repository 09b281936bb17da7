"""A client group's DP posture in a scenario: clipping, noise and the privacy budget.

Bare numbers stand for constants (``clip: 1.0``, ``noise: 1.1``); schedules over a group's
rounds (sensitivity decay, growing mu) follow Du et al., "Dynamic Differential-Privacy
Preserving SGD". Bounds come from :mod:`fedsim.config.limits`.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Annotated, Any, Literal

from pydantic import BaseModel, BeforeValidator, Field, model_validator

from fedsim.config import limits
from fedsim.config.distributions import Delta, Epsilon, Fraction, Scale, Strict, number_or_mapping
from fedsim.config.distributions import number_is_constant as _number_is_constant

__all__ = ["Budget", "Clip", "ClipTiedNoise", "ConstantClip", "ConstantNoise", "DecayClip",
           "GrowingMuNoise",
           "Noise", "TargetNoise"]

_Strict = Strict




class ConstantClip(_Strict):
    """The same clipping norm in every round."""

    kind: Literal["constant"] = Field(default="constant", description="The same clip in every round.")
    value: Scale = Field(description="The L2 norm each example's gradient is clipped to.")


class DecayClip(_Strict):
    """Sensitivity decay (Du et al., "Dynamic Differential-Privacy Preserving SGD"):
    C_t = initial * final_ratio^(t/T) over the group's T = ``rounds``, so the clip falls from
    ``initial`` to ``initial * final_ratio``."""

    kind: Literal["decay"] = Field(
        description="A clip that decays geometrically over the group's rounds (sensitivity "
        "decay of Du et al., \"Dynamic Differential-Privacy Preserving SGD\").")
    initial: Scale = Field(description="The clipping norm of the first round.")
    final_ratio: Fraction = Field(
        description="The last round's clip as a fraction of the first (in (0, 1]).")


_TaggedClip = Annotated[ConstantClip | DecayClip, Field(discriminator="kind")]
Clip = Annotated[
    _TaggedClip,
    # the JSON Schema says what is accepted: a bare number (a constant clip) or a tagged one
    BeforeValidator(_number_is_constant, json_schema_input_type=Scale | _TaggedClip),
]


class ConstantNoise(_Strict):
    """A fixed noise multiplier sigma (noise std / sensitivity)."""

    kind: Literal["constant"] = Field(
        default="constant", description="The same noise multiplier in every round.")
    sigma: Scale = Field(description="The noise multiplier: noise standard deviation divided "
                                     "by the sensitivity.")


class TargetNoise(_Strict):
    """Calibrate sigma at start: the smallest sigma whose ``rounds`` releases (the group's
    ``rounds``) are (epsilon, delta)-DP under the group's accountant."""

    kind: Literal["target"] = Field(
        description="The smallest constant sigma whose rounds meet (epsilon, delta) under the "
        "group's accountant, calibrated at start.")
    epsilon: Epsilon = Field(description="The epsilon the group's rounds must meet "
                                         "(at most 100).")
    delta: Delta = Field(description="The delta at which epsilon is met (in [1e-12, 1)).")


class GrowingMuNoise(_Strict):
    """Growing mu_t (Du et al., "Dynamic Differential-Privacy Preserving SGD"): per-round GDP
    mu_t = mu_0 * growth^(t/T) (noise sigma_t = 1/mu_t shrinking over the group's
    T = ``rounds``). mu_0 is solved in one of two ways (give exactly one):

    * ``epsilon`` + ``delta``: the T rounds meet (epsilon, delta) under the group's accountant
      (a guarantee; :func:`fedsim.privacy.schedules.solve_growing_mu`);
    * ``mu_total``: CLT APPROXIMATION - the heterogeneous GDP CLT over the T rounds,
      mu = q sqrt(sum_t (e^{mu_t^2} - 1)) (Du et al. Thm 1), meets ``mu_total``. The paper's
      own calibration; it can under-report eps (:func:`fedsim.privacy.schedules.clt_growing_mu`).
    """

    kind: Literal["growing_mu"] = Field(
        description="Noise that shrinks over the group's rounds, mu_t = mu_0 growth^(t/T) "
        "(Du et al., \"Dynamic Differential-Privacy Preserving SGD\").")
    growth: Annotated[float, Field(ge=1.0, le=limits.MAX_SCALE, allow_inf_nan=False)] = Field(
        description="How much larger the last round's mu is than the first's (at least 1).")
    epsilon: Epsilon | None = Field(
        default=None, description="With delta: solve mu_0 so the rounds meet (epsilon, delta) under "
        "the group's accountant (a guarantee).")
    delta: Delta | None = Field(default=None, description="The delta at which epsilon is met.")
    mu_total: Scale | None = Field(
        default=None, description="Instead of epsilon and delta: solve mu_0 so the heterogeneous GDP "
        "central limit theorem gives this total mu (an approximation that can under-report "
        "epsilon).")

    @model_validator(mode="after")
    def _one_target(self) -> GrowingMuNoise:
        _one_target(self.kind, self.epsilon, self.delta, self.mu_total)
        return self


def _one_target(kind: str, epsilon: float | None, delta: float | None,
                mu_total: float | None) -> None:
    by_budget = epsilon is not None or delta is not None
    if by_budget and (epsilon is None or delta is None):
        raise ValueError(f"{kind}: give epsilon and delta together")
    if by_budget == (mu_total is not None):
        raise ValueError(f"{kind}: give either epsilon + delta (solved under the "
                         "group's accountant) or mu_total (CLT approximation), not both")


class ClipTiedNoise(_Strict):
    """Du et al.'s allocation ("Dynamic Differential-Privacy Preserving SGD", Sec. 3, remark on
    the noise term D_1, App. A.7): the noise follows the clip schedule, mu_t proportional to
    sqrt(C_t) (noise std proportional to sqrt(C_t)), the common factor solved like
    ``growing_mu``'s mu_0: ``epsilon`` + ``delta`` under the group's accountant (a guarantee)
    or ``mu_total`` by the heterogeneous GDP CLT (an approximation)
    (:func:`fedsim.privacy.schedules.clip_tied`)."""

    kind: Literal["clip_tied"] = Field(
        description="Noise tied to the clip schedule, mu_t proportional to sqrt(C_t) (Du et "
        "al.'s allocation), calibrated over the group's rounds.")
    epsilon: Epsilon | None = Field(
        default=None, description="With delta: the rounds meet (epsilon, delta) under the "
        "group's accountant (a guarantee).")
    delta: Delta | None = Field(default=None, description="The delta at which epsilon is met.")
    mu_total: Scale | None = Field(
        default=None, description="Instead of epsilon and delta: the heterogeneous GDP central "
        "limit theorem gives this total mu (an approximation that can under-report epsilon).")

    @model_validator(mode="after")
    def _one_target(self) -> ClipTiedNoise:
        _one_target(self.kind, self.epsilon, self.delta, self.mu_total)
        return self


def _bare_sigma_is_constant(value: Any) -> Any:
    """``noise: 1.1`` and ``noise: {sigma: 1.1}`` both mean a constant sigma."""
    if isinstance(value, int | float) and not isinstance(value, bool):
        return {"kind": "constant", "sigma": value}
    if isinstance(value, dict) and "kind" not in value and "sigma" in value:
        return {"kind": "constant", **value}
    return number_or_mapping(value)


_TaggedNoise = Annotated[ConstantNoise | TargetNoise | GrowingMuNoise | ClipTiedNoise,
                         Field(discriminator="kind")]
Noise = Annotated[
    _TaggedNoise,
    # the JSON Schema says what is accepted: a bare sigma, a constant one without its kind, or
    # a tagged one
    BeforeValidator(_bare_sigma_is_constant,
                    json_schema_input_type=Scale | ConstantNoise | _TaggedNoise),
]


class Budget(_Strict):
    """A client's privacy budget: it never releases an update past (epsilon, delta)."""

    epsilon: Epsilon = Field(description="The largest epsilon a client may reach "
                                         "(at most 100).")
    delta: Delta = Field(description="The delta at which the budget's epsilon is measured.")

    @model_validator(mode="before")
    @classmethod
    def _a_pair(cls, value: Any) -> Any:
        # A bare number (budget: 2.5) read "Input should be a valid dictionary or instance of
        # Budget": say that a budget is a pair, and how to write one.
        if isinstance(value, Mapping | BaseModel):
            return value
        raise ValueError("a budget is a pair: write {epsilon: 2.5, delta: 1e-5}")
