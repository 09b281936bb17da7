"""How the server mixes one time window's accepted updates (van Dijk & Nguyen, sec. 3).

Each client sends ``u_i = Ubar_i / m_i`` (its noised, clipped gradient sum already divided by
its own batch size m_i) and, locally, steps ``w <- w - eta_i u_i`` with its agreed step size
``eta_i``. The server applies the same client-specific steps, but as a *mix*: a convex
combination with weights ``lambda_i`` (by data size, by a configured per-client weight, or
uniform) scaled by the window's server step size ``s_t``::

    w <- w - s_t * sum_i lambda_i * eta_i * u_i,      sum_i lambda_i = 1.

The weights are normalised either over the window (a convex mix of what arrived) or over the
whole population (van Dijk & Nguyen's fixed "weighing vector" over clients: a window in which few
clients report moves the model less; server.normalize). With one client, one update per
window and ``s_t = 1`` both are exactly the client's own DP-SGD step, so a single client
with window = one update reproduces the plain DP-SGD loop. Mixing only
post-processes released updates, so it costs no privacy.

A strategy is a small replaceable object (after Flower's ``Strategy``): anything with
``weights(updates) -> np.ndarray`` plugs into :func:`mix`.
"""

from __future__ import annotations

import math
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
    "population_weight",
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


def population_weight(strategy: MixingStrategy, clients: Sequence[tuple[str, int, float]]) -> float:
    """The strategy's total weight over a population of ``(client_id, num_samples, weight)``:
    each client counted once, as if every client sent one update."""
    empty = np.zeros(0, np.float32)
    stand_ins = [AcceptedUpdate(cid, 0, empty, n, 1.0, w) for cid, n, w in clients]
    return float(np.sum(strategy.weights(stand_ins))) if stand_ins else 0.0


def make_strategy(name: str) -> MixingStrategy:
    try:
        return _STRATEGIES[name]()
    except KeyError:
        raise ConfigError(f"unknown mixing {name!r}; choose one of {sorted(_STRATEGIES)}") from None


def mix(params: np.ndarray, updates: Sequence[AcceptedUpdate], strategy: MixingStrategy,
        server_step: float, *, total_weight: float | None = None) -> np.ndarray:
    """The new global model ``params - server_step * sum_i lambda_i eta_i u_i`` (float32).

    ``lambda_i = weight_i / total``: with ``total_weight=None`` the total is the window's own
    (a convex mix of what arrived); with the population's total weight (every client's weight,
    :func:`population_weight`) a window in which few clients report moves the model less, in
    proportion to the weight that took part. Arithmetic is in float64 and rounded once at the
    end. With no updates the model is returned unchanged (a copy).
    """
    if not updates:
        return params.copy()
    raw = np.asarray(strategy.weights(updates), dtype=np.float64)
    if raw.shape != (len(updates),) or not np.all(np.isfinite(raw)) or np.any(raw < 0) or raw.sum() <= 0:
        raise ConfigError(f"mixing strategy {strategy.name!r} gave invalid weights {raw!r}")
    total = raw.sum() if total_weight is None else float(total_weight)
    if not (math.isfinite(total) and total > 0):
        raise ConfigError(f"mixing total weight must be > 0, got {total_weight!r}")
    lambdas = raw / total
    # Two passes per update and no allocation: scale into a float64 scratch, then accumulate.
    direction = np.zeros(params.shape, dtype=np.float64)
    scaled = np.empty(params.shape, dtype=np.float64)
    for weight, update in zip(lambdas, updates, strict=True):
        np.multiply(update.update, weight * update.step_size, out=scaled, dtype=np.float64)
        direction += scaled
    direction *= -server_step
    direction += params
    return direction.astype(np.float32)
