"""How the server mixes one time window's accepted updates (paper 000, sec. 3).

Each client sends ``u_i = Ubar_i / m_i`` (its noised, clipped gradient sum already divided by
its own batch size m_i) and, locally, steps ``w <- w - eta_i u_i`` with its agreed step size
``eta_i``. The server applies the same client-specific steps, but as a *mix*: a convex
combination with weights ``lambda_i`` (by data size, by a configured per-client weight, or
uniform) scaled by the window's server step size ``s_t``::

    w <- w - s_t * sum_i lambda_i * eta_i * u_i,      sum_i lambda_i = 1.

With one update per window and ``s_t = 1`` this is exactly the client's own DP-SGD step, so a
single client with window = one update reproduces the plain DP-SGD loop. Mixing only
post-processes released updates, so it costs no privacy.

A strategy is a small replaceable object (after Flower's ``Strategy``): anything with
``weights(updates) -> np.ndarray`` plugs into :func:`mix`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal, Protocol

import numpy as np

from fedsim.errors import ConfigError

MixingName = Literal["data_size", "configured", "uniform"]

__all__ = [
    "AcceptedUpdate",
    "ConfiguredWeights",
    "DataSizeWeights",
    "MixingStrategy",
    "UniformWeights",
    "make_strategy",
    "mix",
]


@dataclass(frozen=True, eq=False)
class AcceptedUpdate:
    """One update the server decided to apply, with what the mix needs to know about it."""

    client_id: str
    round: int
    update: np.ndarray  # Ubar/m, flat float32
    num_samples: int  # N_i, the client's data set size
    step_size: float  # eta_i, the client's agreed step size
    weight: float = 1.0  # the configured per-client weight


class MixingStrategy(Protocol):
    """Chooses the mixing weights lambda of one window (they need not be normalised)."""

    name: str

    def weights(self, updates: Sequence[AcceptedUpdate]) -> np.ndarray: ...


class DataSizeWeights:
    """lambda_i proportional to the client's data set size N_i (FedAvg's choice)."""

    name = "data_size"

    def weights(self, updates: Sequence[AcceptedUpdate]) -> np.ndarray:
        return np.array([u.num_samples for u in updates], dtype=np.float64)


class ConfiguredWeights:
    """lambda_i proportional to a weight the operator assigned (clients with 'better' data)."""

    name = "configured"

    def weights(self, updates: Sequence[AcceptedUpdate]) -> np.ndarray:
        return np.array([u.weight for u in updates], dtype=np.float64)


class UniformWeights:
    """Every accepted update counts the same."""

    name = "uniform"

    def weights(self, updates: Sequence[AcceptedUpdate]) -> np.ndarray:
        return np.ones(len(updates), dtype=np.float64)


_STRATEGIES: dict[str, type[DataSizeWeights | ConfiguredWeights | UniformWeights]] = {
    "data_size": DataSizeWeights,
    "configured": ConfiguredWeights,
    "uniform": UniformWeights,
}


def make_strategy(name: str) -> MixingStrategy:
    try:
        return _STRATEGIES[name]()
    except KeyError:
        raise ConfigError(f"unknown mixing {name!r}; choose one of {sorted(_STRATEGIES)}") from None


def mix(params: np.ndarray, updates: Sequence[AcceptedUpdate], strategy: MixingStrategy,
        server_step: float) -> np.ndarray:
    """The new global model ``params - server_step * sum_i lambda_i eta_i u_i`` (float32).

    Arithmetic is in float64 and rounded once at the end. With no updates the model is
    returned unchanged (a copy).
    """
    if not updates:
        return params.copy()
    raw = np.asarray(strategy.weights(updates), dtype=np.float64)
    if raw.shape != (len(updates),) or not np.all(np.isfinite(raw)) or np.any(raw < 0) or raw.sum() <= 0:
        raise ConfigError(f"mixing strategy {strategy.name!r} gave invalid weights {raw!r}")
    lambdas = raw / raw.sum()
    direction = np.zeros(params.shape, dtype=np.float64)
    for weight, update in zip(lambdas, updates, strict=True):
        direction += (weight * update.step_size) * update.update.astype(np.float64)
    return (params.astype(np.float64) - server_step * direction).astype(np.float32)
