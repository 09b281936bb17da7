"""Pure torch: models and the DP-SGD step, on arrays or tensors (getting them is
:mod:`fedsim.data`'s). No clocks, no transports.

The runtime's contract is :class:`LocalTrainer` (one client's DP rounds: begun with their
randomness drawn, computed when their update is taken, :class:`PendingRound` of
:mod:`fedsim.training.rounds`), :class:`RoundBatcher` (the pending rounds of many clients
computed together; it and the trainer see each other only through the protocols of
``rounds``), :class:`RoundResult`, :func:`flat_params` / :func:`load_flat_params`,
and :func:`evaluate`.
"""

from fedsim.training.batched import RoundBatcher
from fedsim.training.dpsgd import ClipSchedule, NoiseSchedule, secure_generator
from fedsim.training.local import (
    AdaptiveClipConfig,
    LocalTrainer,
    evaluate,
    flat_params,
    load_flat_params,
)
from fedsim.training.models import build_model, build_scenario_model, check_dp_compatible
from fedsim.training.rounds import PendingRound, RoundResult

__all__ = [
    "AdaptiveClipConfig",
    "ClipSchedule",
    "LocalTrainer",
    "NoiseSchedule",
    "PendingRound",
    "RoundBatcher",
    "RoundResult",
    "build_model",
    "build_scenario_model",
    "check_dp_compatible",
    "evaluate",
    "flat_params",
    "load_flat_params",
    "secure_generator",
]
