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
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any, Literal, Protocol

import numpy as np

from fedsim.aggregation.policies import AggregationPolicy, staleness_of
from fedsim.aggregation.scaled_add import add_scaled
from fedsim.errors import ConfigError

MixingName = Literal["data_size", "configured", "uniform"]

__all__ = [
    "AcceptedUpdate",
    "ConfiguredWeights",
    "DataSizeWeights",
    "MixingStrategy",
    "RunningDirection",
    "STREAM_ABOVE",
    "client_weights",
    "StreamedWindow",
    "UniformWeights",
    "descent_direction",
    "make_strategy",
    "mix",
    "normalised_weights",
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
    base_version: int = 0  # the global version the update was computed on
    norm: float | None = None  # ||update||_2 where the decoder measured it (None: unknown)


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


def client_weights(strategy: MixingStrategy,
                   clients: Sequence[tuple[str, int, float]]) -> dict[str, float]:
    """The strategy's raw weight of each client of ``(client_id, num_samples, weight)`` (its
    weights depend on public scenario values only: an aggregator weighs the updates it
    pre-mixes with them, and the server checks its manifests against them)."""
    empty = np.zeros(0, np.float32)
    stand_ins = [AcceptedUpdate(cid, 0, empty, n, 1.0, w) for cid, n, w in clients]
    raw = _raw_weights(strategy, stand_ins) if stand_ins else np.zeros(0)
    return {cid: float(value) for (cid, _, _), value in zip(clients, raw, strict=True)}


def population_weight(strategy: MixingStrategy, clients: Sequence[tuple[str, int, float]]) -> float:
    """The strategy's total weight over a population of ``(client_id, num_samples, weight)``:
    each client counted once, as if every client sent one update."""
    return float(np.sum(list(client_weights(strategy, clients).values()))) if clients else 0.0


def make_strategy(name: str) -> MixingStrategy:
    try:
        return _STRATEGIES[name]()
    except KeyError:
        raise ConfigError(f"unknown mixing {name!r}; choose one of {sorted(_STRATEGIES)}") from None


def normalised_weights(strategy: MixingStrategy, updates: Sequence[AcceptedUpdate],
                       total_weight: float | None = None) -> np.ndarray:
    """``lambda_i = weight_i / total`` (float64): ``total_weight=None``: the updates' own total
    (a convex mix); else the population's (:func:`population_weight`)."""
    raw = np.asarray(strategy.weights(updates), dtype=np.float64)
    if raw.shape != (len(updates),) or not np.all(np.isfinite(raw)) or np.any(raw < 0) or raw.sum() <= 0:
        raise ConfigError(f"mixing strategy {strategy.name!r} gave invalid weights {raw!r}")
    total = raw.sum() if total_weight is None else float(total_weight)
    if not (math.isfinite(total) and total > 0):
        raise ConfigError(f"mixing total weight must be > 0, got {total_weight!r}")
    return raw / total


class RunningDirection:
    """``d = sum_i c_i eta_i u_i`` in float64, accumulated one update at a time (the arithmetic
    of :func:`descent_direction`, which uses it: the same sums in the same order)."""

    def __init__(self, shape: tuple[int, ...]) -> None:
        self.direction = np.zeros(shape, dtype=np.float64)
        self._scaled = np.empty(shape, dtype=np.float64)  # numpy's path only

    def add(self, update: AcceptedUpdate, coefficient: float) -> None:
        scale = coefficient * update.step_size
        if update.norm == 0.0 and math.isfinite(scale):
            # Every value is +0 or -0 (a float32 square cannot underflow in float64), so each
            # product is a signed zero, and adding one changes no entry of d: x + 0 = x for
            # x != 0, NaN and inf stay, and an entry that is zero is +0, which adding -0 or
            # +0 leaves +0 (d starts at +0 and a sum is -0 only when both terms are). A
            # message-only client's update is zero (docs/SCALE.md).
            return
        # One pass of the compiled kernel where it applies; else no allocation: widen into a
        # float64 scratch (exact), scale it there, add (the same float64 products as
        # np.multiply(u, scale, dtype=float64), whose buffered cast made that one call slower
        # than the plain widening copy and the in-place multiply together).
        add_scaled(self.direction, update.update, scale, self._scaled)


def descent_direction(updates: Sequence[AcceptedUpdate], coefficients: np.ndarray) -> np.ndarray:
    """``d = sum_i c_i eta_i u_i`` in float64."""
    running = RunningDirection(updates[0].update.shape)
    for weight, update in zip(coefficients, updates, strict=True):
        running.add(update, weight)
    return running.direction


def _raw_weights(strategy: MixingStrategy, updates: Sequence[AcceptedUpdate]) -> np.ndarray:
    raw = np.asarray(strategy.weights(updates), dtype=np.float64)
    if raw.shape != (len(updates),) or not np.all(np.isfinite(raw)) or np.any(raw < 0):
        raise ConfigError(f"mixing strategy {strategy.name!r} gave invalid weights {raw!r}")
    return raw


STREAM_ABOVE = 1024
"""Waiting updates of a time window beyond which the server folds them into its mix."""


class StreamedWindow:
    """A time window's mix accumulated as its updates are accepted, for windows too large to
    hold (10^5 clients send about 2 x 10^5 updates of 400 KB in one window): each batch of
    accepted updates is added into ``d`` and dropped.

    The coefficients ``c_i`` are the policy's from the mixing weights and the staleness
    against ``version`` (time windows: ``lambda_i S(s_i)``, linear in ``lambda``; the version
    does not change inside a window). With the population's total weight known in
    advance (``normalize: population``) ``lambda_i = w_i / total`` is exact on arrival and
    the direction is the buffered mix's bit for bit (the same products added in the same
    order) when the server's pacer deferred none of the window's updates (a buffered close
    adds the updates released during the window first; a stream adds each in the fold after
    its release: the same updates, summed in another order). Normalised over the window, the
    total is known only at the close: ``d`` is accumulated with ``c_i(w_i)`` and divided by
    the total once, which differs from the buffered ``c_i(w_i / total)`` by float64 rounding
    (a few ulps before the model is rounded to float32; tested). The move limit's sum
    ``sum_i |c_i| eta_i bound_i`` is kept alike (None once an update's bound is unknown)."""

    def __init__(self, shape: tuple[int, ...], strategy: MixingStrategy,
                 total_weight: float | None, policy: AggregationPolicy, version: int) -> None:
        self.strategy = strategy
        self.total_weight = total_weight
        self.policy = policy
        self.version = version
        self._running = RunningDirection(shape)
        self._weight = 0.0
        self._move: float | None = 0.0
        self.keys: set[tuple[str, int]] = set()
        """(client_id, round) of every update accepted so far (de-duplication in the window)."""
        self.accepted: list[tuple[str, int, int]] = []
        """(client_id, round, base_version) of each accepted update, in order."""

    def fold(self, arrived: Iterable[Any],
             admit: Callable[[Any], tuple[AcceptedUpdate, float | None] | None]) -> None:
        """Check each of ``arrived`` in order (``admit``: the accepted update with its norm
        bound, or None; it sees :attr:`keys` grow) and add the accepted ones."""
        batch = []
        for message in arrived:
            accepted = admit(message)
            if accepted is not None:
                batch.append(accepted)
                self.keys.add((accepted[0].client_id, accepted[0].round))
        with np.errstate(over="ignore", invalid="ignore"):  # the mixed model is checked
            self.add(batch)

    def add(self, batch: Sequence[tuple[AcceptedUpdate, float | None]]) -> None:
        """Fold ``batch`` (accepted updates with their norm bounds) into the mix."""
        if not batch:
            return
        updates = [u for u, _ in batch]
        raw = _raw_weights(self.strategy, updates)
        self._weight += float(raw.sum())
        lambdas = raw if self.total_weight is None else raw / float(self.total_weight)
        coefficients = self.policy.factors(
            lambdas, staleness_of(self.version, [u.base_version for u in updates]))
        for c, (update, bound) in zip(coefficients, batch, strict=True):
            self._running.add(update, c)
            if self._move is not None:
                self._move = None if bound is None else (
                    self._move + abs(float(c)) * abs(update.step_size) * bound)
            self.keys.add((update.client_id, update.round))
            self.accepted.append((update.client_id, update.round, update.base_version))

    def finish(self) -> tuple[np.ndarray, float | None]:
        """The window's direction ``d`` and the bound on its norm ``sum_i |c_i| eta_i bound_i``
        (None: a bound unknown), which the server optimizer turns into a move bound."""
        total = self._weight
        if not (math.isfinite(total) and total > 0):
            raise ConfigError(f"mixing strategy {self.strategy.name!r} gave a total weight "
                              f"{total!r} for the window")
        if self.total_weight is not None:
            return self._running.direction, self._move
        direction = self._running.direction
        direction /= total
        return direction, None if self._move is None else self._move / total


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
    direction = descent_direction(updates, normalised_weights(strategy, updates, total_weight))
    direction *= -server_step
    direction += params
    return direction.astype(np.float32)
