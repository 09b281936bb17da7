"""When the server applies updates and how much a stale one counts: aggregation policies and
staleness weightings, as small replaceable strategies (after Flower's ``Strategy``: pure
objects, the server actor calls them).

An update ``u_i = Ubar_i / m_i`` computed on version ``tau_i`` and applied when the server is at
version ``t`` has *staleness* ``s_i = t - tau_i``. The server's descent direction for a batch
of applied updates is::

    d = sum_i lambda_i * S(s_i) * eta_i * u_i

with ``lambda_i`` the mixing weights (:mod:`fedsim.aggregation.mixing`, normalised over the
batch or the population) and ``S`` a staleness weighting; the server optimizer
(:mod:`fedsim.aggregation.optimizers`) turns ``-d`` (the pseudo-gradient) into the new model.

Staleness weightings (Xie, Koyejo, Gupta, "Asynchronous Federated Optimization", 2019, sec. 5):

* ``constant``: ``S(s) = 1``;
* ``polynomial``: ``S_a(s) = (s + 1)^(-a)``;
* ``hinge``: ``S_{a,b}(s) = 1`` if ``s <= b``, else ``1 / (a (s - b) + 1)``.

Policies (which updates form a batch, and when it is applied):

* :class:`TimeWindows` (van Dijk & Nguyen, sec. 3; the default): every update that arrived in a
  window ``((k-1) W, k W]``, applied at the window's end.
* :class:`FedBuff` (Nguyen et al., "Federated Learning with Buffered Asynchronous
  Aggregation", AISTATS 2022): updates enter a buffer as they arrive; when it holds ``K`` the
  server applies ``(1/K) sum_i S(s_i) Delta_i`` (uniform mixing; other mixings weigh the
  buffer by ``lambda_i``) and publishes the new model at once.
* :class:`FedAsync` (Xie et al., Alg. 1): every update is applied on arrival with weight
  ``alpha_t = alpha * S(s_i)``: ``x_t = x_{t-1} + alpha_t * Delta_i``, ``Delta_i = -eta_i u_i``
  the client's model change (the delta form; Xie et al.'s ``(1 - alpha_t) x_{t-1} + alpha_t
  x_new`` is the same when the update was computed on ``x_{t-1}``), and the model is published
  at once.

Everything here post-processes released updates: no policy changes any client's privacy.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

import numpy as np

from fedsim.errors import ConfigError

__all__ = [
    "AggregationPolicy",
    "ConstantStaleness",
    "FedAsync",
    "FedBuff",
    "HingeStaleness",
    "PolynomialStaleness",
    "StalenessWeight",
    "TimeWindows",
]


class StalenessWeight(Protocol):
    """``S(s)``: how much an update of staleness ``s`` (versions) counts, in (0, 1]."""

    name: str

    def __call__(self, staleness: np.ndarray) -> np.ndarray: ...


def _staleness(values: np.ndarray) -> np.ndarray:
    s = np.asarray(values, dtype=np.float64)
    if np.any(s < 0) or not np.all(np.isfinite(s)):
        raise ConfigError(f"staleness must be finite and >= 0, got {s!r}")
    return s


@dataclass(frozen=True)
class ConstantStaleness:
    """``S(s) = 1``: staleness does not matter."""

    name = "constant"

    def __call__(self, staleness: np.ndarray) -> np.ndarray:
        return np.ones_like(_staleness(staleness))


@dataclass(frozen=True)
class PolynomialStaleness:
    """``S_a(s) = (s + 1)^(-a)``, ``a > 0`` (Xie et al.)."""

    a: float
    name = "polynomial"

    def __post_init__(self) -> None:
        if not (math.isfinite(self.a) and self.a > 0):
            raise ConfigError(f"polynomial staleness needs a > 0, got {self.a!r}")

    def __call__(self, staleness: np.ndarray) -> np.ndarray:
        return (_staleness(staleness) + 1.0) ** (-self.a)


@dataclass(frozen=True)
class HingeStaleness:
    """``S_{a,b}(s) = 1`` for ``s <= b``, else ``1 / (a (s - b) + 1)``; ``a > 0, b >= 0``
    (Xie et al.)."""

    a: float
    b: float
    name = "hinge"

    def __post_init__(self) -> None:
        if not (math.isfinite(self.a) and self.a > 0 and math.isfinite(self.b) and self.b >= 0):
            raise ConfigError(f"hinge staleness needs a > 0 and b >= 0, got a={self.a!r}, "
                              f"b={self.b!r}")

    def __call__(self, staleness: np.ndarray) -> np.ndarray:
        s = _staleness(staleness)
        return 1.0 / (self.a * np.maximum(s - self.b, 0.0) + 1.0)  # 1 for s <= b


class AggregationPolicy(Protocol):
    """When the server applies updates, and the factor each applied update gets on top of its
    mixing weight."""

    name: str
    on_arrival: bool
    """True: updates are applied as they arrive (:meth:`ready` says when); False: at the end
    of each time window."""

    def ready(self, buffered: int) -> bool:
        """With ``buffered`` accepted updates waiting, apply them now (on-arrival policies)."""
        ...

    def factors(self, lambdas: np.ndarray, staleness: np.ndarray) -> np.ndarray:
        """The coefficients on ``eta_i u_i`` in the direction ``d``, from the normalised mixing
        weights and the updates' staleness."""
        ...


@dataclass(frozen=True)
class TimeWindows:
    """Everything that arrived in a window, at its end: ``lambda_i S(s_i)``."""

    staleness: StalenessWeight = ConstantStaleness()
    name = "windows"
    on_arrival = False

    def ready(self, buffered: int) -> bool:
        return False

    def factors(self, lambdas: np.ndarray, staleness: np.ndarray) -> np.ndarray:
        return np.asarray(lambdas, dtype=np.float64) * self.staleness(staleness)


@dataclass(frozen=True)
class FedBuff:
    """A buffer of ``buffer_size`` (K) updates applied together: ``lambda_i S(s_i)`` with
    ``lambda_i`` normalised over the buffer (``1/K`` under uniform mixing)."""

    buffer_size: int
    staleness: StalenessWeight = ConstantStaleness()
    name = "fedbuff"
    on_arrival = True

    def __post_init__(self) -> None:
        if isinstance(self.buffer_size, bool) or not isinstance(self.buffer_size, int) \
                or self.buffer_size < 1:
            raise ConfigError(f"fedbuff buffer_size must be an integer >= 1, got "
                              f"{self.buffer_size!r}")

    def ready(self, buffered: int) -> bool:
        return buffered >= self.buffer_size

    def factors(self, lambdas: np.ndarray, staleness: np.ndarray) -> np.ndarray:
        return np.asarray(lambdas, dtype=np.float64) * self.staleness(staleness)


@dataclass(frozen=True)
class FedAsync:
    """Each update on arrival, with ``alpha_t = alpha S(s)`` (Xie et al.); ``0 < alpha <= 1``."""

    alpha: float
    staleness: StalenessWeight = ConstantStaleness()
    name = "fedasync"
    on_arrival = True

    def __post_init__(self) -> None:
        if not (math.isfinite(self.alpha) and 0 < self.alpha <= 1):
            raise ConfigError(f"fedasync alpha must be in (0, 1], got {self.alpha!r}")

    def ready(self, buffered: int) -> bool:
        return buffered >= 1

    def factors(self, lambdas: np.ndarray, staleness: np.ndarray) -> np.ndarray:
        # One update at a time: its own mixing weight is 1 (a convex mix of one).
        return self.alpha * self.staleness(staleness) * np.ones(len(np.atleast_1d(lambdas)))


def staleness_of(server_version: int, base_versions: Sequence[int]) -> np.ndarray:
    """``t - tau_i`` for updates computed on ``base_versions`` (never below 0)."""
    return np.maximum(0, server_version - np.asarray(base_versions, dtype=np.int64)).astype(
        np.float64)
