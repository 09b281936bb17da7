"""The server's mixing policy for one time window, as a small replaceable strategy object,
and its step-size schedules."""

from fedsim.aggregation.mixing import (
    AcceptedUpdate,
    ConfiguredWeights,
    DataSizeWeights,
    MixingStrategy,
    UniformWeights,
    make_strategy,
    mix,
    population_weight,
)
from fedsim.aggregation.step_size import (
    ConstantStepSize,
    InverseTimeStepSize,
    PlateauStepSize,
    StepSizeSchedule,
    make_step_size,
)

__all__ = [
    "AcceptedUpdate",
    "ConfiguredWeights",
    "ConstantStepSize",
    "DataSizeWeights",
    "InverseTimeStepSize",
    "MixingStrategy",
    "PlateauStepSize",
    "StepSizeSchedule",
    "UniformWeights",
    "make_step_size",
    "make_strategy",
    "mix",
    "population_weight",
]
