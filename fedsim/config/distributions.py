"""Distributions of times in a scenario (latency, compute speed, on/off periods, crashes) and
the bounded number types every scenario section uses.

Each distribution defines ``sample(rng) -> float`` (finite, >= 0). A bare number in YAML stands
for a constant. Every bound comes from :mod:`fedsim.config.limits`, which says why it is there.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Annotated, Any, Literal

import numpy as np
from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, model_validator

from fedsim.config import limits


def _not_a_bool(value: Any) -> Any:
    """``true`` is not a number: pydantic would otherwise read it as 1."""
    if isinstance(value, bool):
        raise ValueError("must be a number, not a boolean")
    return value


_NoBool = BeforeValidator(_not_a_bool)
Probability = Annotated[float, Field(ge=0.0, le=1.0), _NoBool]
Fraction = Annotated[float, Field(gt=0.0, le=1.0), _NoBool]
OpenUnit = Annotated[float, Field(gt=0.0, lt=1.0), _NoBool]
Delta = Annotated[float, Field(ge=limits.MIN_DELTA, lt=1.0), _NoBool]
Epsilon = Annotated[float, Field(gt=0.0, le=limits.MAX_EPSILON, allow_inf_nan=False), _NoBool]
Scale = Annotated[float, Field(gt=0.0, le=limits.MAX_SCALE, allow_inf_nan=False), _NoBool]
PositiveSeconds = Annotated[float, Field(gt=0.0, le=limits.MAX_SECONDS, allow_inf_nan=False),
                            _NoBool]
Seconds = Annotated[float, Field(ge=0.0, le=limits.MAX_SECONDS, allow_inf_nan=False), _NoBool]


# Integers: "must be > 0" reads better than "must be >= 1", hence gt=0 for positive counts.
PositiveInt = Annotated[int, Field(gt=0, le=2**31 - 1), _NoBool]
ClientCount = Annotated[int, Field(gt=0, le=limits.MAX_CLIENTS), _NoBool]
RoundCount = Annotated[int, Field(gt=0, le=limits.MAX_ROUNDS), _NoBool]
StepCount = Annotated[int, Field(gt=0, le=limits.MAX_LOCAL_STEPS), _NoBool]
WindowCount = Annotated[int, Field(gt=0, le=limits.MAX_WINDOWS), _NoBool]
VersionCount = Annotated[int, Field(ge=0, le=limits.MAX_WINDOWS), _NoBool]
BatchSize = Annotated[int, Field(gt=0, le=limits.MAX_BATCH), _NoBool]
SampleCount = Annotated[int, Field(gt=0, le=limits.MAX_SAMPLES), _NoBool]
FeatureCount = Annotated[int, Field(gt=0, le=limits.MAX_FEATURES), _NoBool]
ClassCount = Annotated[int, Field(ge=2, le=limits.MAX_CLASSES), _NoBool]
ShardCount = Annotated[int, Field(gt=0, le=limits.MAX_SHARDS_PER_CLIENT), _NoBool]
MessageBytes = Annotated[int, Field(gt=0, le=limits.MAX_MESSAGE_BYTES), _NoBool]
ThreadCount = Annotated[int, Field(gt=0, le=limits.MAX_TORCH_THREADS), _NoBool]
AggregatorCount = Annotated[int, Field(ge=0, le=limits.MAX_AGGREGATORS), _NoBool]
Seed = Annotated[int, Field(ge=0, le=limits.MAX_SEED), _NoBool]


class Strict(BaseModel):
    """Base of every scenario section: immutable, unknown keys rejected."""

    model_config = ConfigDict(frozen=True, extra="forbid", validate_default=True)


class _Distribution(Strict):
    """Base of the distributions; each defines ``sample(rng) -> float`` (finite, >= 0) and
    ``average`` (its mean; not ``mean``, which is a parameter of the exponentials)."""

    if TYPE_CHECKING:  # each subclass defines them (a pydantic model: no abstract methods here)

        def sample(self, rng: np.random.Generator) -> float: ...

        @property
        def average(self) -> float: ...

    def sampler(self) -> Callable[[np.random.Generator], float]:
        """``sample`` as a plain callable, as :class:`~fedsim.transports.link_model.LinkModel`
        takes it."""
        return self.sample

    @property
    def is_zero(self) -> bool:
        return False


class Constant(_Distribution):
    """Always ``value``. A bare number in YAML means this."""

    kind: Literal["constant"] = Field(
        default="constant", description="A constant: every draw is the same value.")
    value: Seconds = Field(description="The value, in virtual seconds (at most 10^9).")

    def sample(self, rng: np.random.Generator) -> float:
        return self.value

    @property
    def average(self) -> float:
        return self.value

    @property
    def is_zero(self) -> bool:
        return self.value == 0.0


class Uniform(_Distribution):
    """Uniform on [low, high]."""

    kind: Literal["uniform"] = Field(description="Uniform between low and high.")
    low: Seconds = Field(description="The smallest value, in virtual seconds.")
    high: Seconds = Field(description="The largest value, in virtual seconds (>= low).")

    @model_validator(mode="after")
    def _ordered(self) -> Uniform:
        if self.high < self.low:
            raise ValueError(f"high ({self.high}) must be >= low ({self.low})")
        return self

    def sample(self, rng: np.random.Generator) -> float:
        return float(rng.uniform(self.low, self.high))

    @property
    def average(self) -> float:
        return 0.5 * (self.low + self.high)

    @property
    def is_zero(self) -> bool:
        return self.high == 0.0


class Exponential(_Distribution):
    """Exponential with the given mean (memoryless waiting times, e.g. crashes)."""

    kind: Literal["exponential"] = Field(
        description="Exponential: memoryless waiting times such as crashes.")
    mean: PositiveSeconds = Field(description="The mean, in virtual seconds.")

    def sample(self, rng: np.random.Generator) -> float:
        return float(rng.exponential(self.mean))

    @property
    def average(self) -> float:
        return self.mean


class LogNormal(_Distribution):
    """exp(N(log(median), sigma^2)): heavy-tailed positive times (stragglers, network jitter)."""

    kind: Literal["lognormal"] = Field(
        description="Log-normal: heavy-tailed positive times such as stragglers and jitter.")
    median: PositiveSeconds = Field(description="The median, in virtual seconds.")
    sigma: Annotated[float, Field(ge=0.0, le=limits.MAX_LOGNORMAL_SIGMA), _NoBool] = Field(
        description="The standard deviation of the logarithm (at most 20, so that every draw "
                    "stays finite).")

    def sample(self, rng: np.random.Generator) -> float:
        return float(min(self.median * math.exp(self.sigma * rng.standard_normal()),
                         limits.MAX_SECONDS))

    @property
    def average(self) -> float:
        return min(self.median * math.exp(0.5 * self.sigma**2), limits.MAX_SECONDS)


class ShiftedExponential(_Distribution):
    """``minimum`` + Exponential(mean): a fixed propagation delay plus queueing jitter."""

    kind: Literal["shifted_exponential"] = Field(
        description="A fixed minimum plus an exponential: propagation delay plus queueing.")
    minimum: Seconds = Field(description="The fixed part, in virtual seconds.")
    mean: PositiveSeconds = Field(description="The mean of the exponential part, in virtual "
                                              "seconds.")

    def sample(self, rng: np.random.Generator) -> float:
        return float(self.minimum + rng.exponential(self.mean))

    @property
    def average(self) -> float:
        return self.minimum + self.mean


def number_is_constant(value: Any) -> Any:
    """A bare number in YAML stands for ``{kind: constant, value: number}``; anything else but
    a mapping (a tagged one) is refused here, saying what is accepted (pydantic's own message
    would ask for "a valid dictionary" only)."""
    if isinstance(value, int | float) and not isinstance(value, bool):
        return {"kind": "constant", "value": value}
    return number_or_mapping(value)


def number_or_mapping(value: Any) -> Any:
    """``value`` if it is a mapping (or an already built model), else a ValueError saying that a
    number or a mapping with a ``kind`` is wanted: for the fields where a bare number is a
    shorthand (a clip, a noise multiplier, a duration)."""
    if isinstance(value, Mapping | BaseModel):
        return value
    raise ValueError("must be a number or a mapping with a 'kind' key")


_TaggedDistribution = Annotated[
    Constant | Uniform | Exponential | LogNormal | ShiftedExponential,
    Field(discriminator="kind"),
]
Distribution = Annotated[
    _TaggedDistribution,
    # the JSON Schema says what is accepted: a bare number (a constant's value) or a tagged one
    BeforeValidator(number_is_constant, json_schema_input_type=Seconds | _TaggedDistribution),
]


def zero_seconds(description: str) -> Any:
    """A :data:`Distribution` field that defaults to the constant 0 (no delay, no compute
    time): a link's or an aggregator's latency, a group's speed."""
    return Field(default_factory=lambda: Constant(value=0.0), description=description)
