"""The server optimizer: how a batch's pseudo-gradient moves the global model.

The policies (:mod:`fedsim.aggregation.policies`) give the descent direction
``d = sum_i c_i eta_i u_i``; the pseudo-gradient is ``Delta = -d`` (the model change the batch
asks for). With the server step size ``eta_t`` of the window (``server.step_size``: constant,
plateau or inverse-time, so every optimizer keeps van Dijk & Nguyen's diminishing steps), following
Reddi et al., "Adaptive Federated Optimization" (ICLR 2021), Alg. 2, element-wise:

* ``sgd`` (today's rule, FedAvg's server): ``x <- x + eta_t Delta``;
* ``momentum`` (FedAvgM, Hsu et al. 2019): ``m <- beta1 m + Delta``, ``x <- x + eta_t m``;
* ``adam`` (FedAdam): ``m <- beta1 m + (1 - beta1) Delta``,
  ``v <- beta2 v + (1 - beta2) Delta^2``, ``x <- x + eta_t m / (sqrt(v) + tau)``;
* ``yogi`` (FedYogi): ``m`` as Adam, ``v <- v - (1 - beta2) Delta^2 sign(v - Delta^2)``,
  ``x <- x + eta_t m / (sqrt(v) + tau)``.

``m`` starts at 0 and ``v`` at ``tau^2`` (Reddi et al.: ``v_{-1} >= tau^2``); no bias
correction (as in Alg. 2). Arithmetic in float64, the model rounded to float32 once per step.
The state (``m``, ``v``) is checkpointed with the server (:meth:`ServerOptimizer.state`).
Post-processing of released updates: no optimizer changes any client's privacy.

**The move bound** (:meth:`ServerOptimizer.move_bound`, the server's move limit,
:func:`fedsim.runtime.actors.integrity.check_model`). Every accepted update passed its client's norm
bound, so the pseudo-gradient of a step is bounded, ``||Delta|| <= D`` (``D = sum_i |c_i| eta_i
b_i``). From ``D`` and the optimizer's state *before* the step, each optimizer bounds how far
its step can move the model, whatever direction a hostile client chose within its bound:

* ``sgd``: ``||x' - x|| = lr ||Delta|| <= lr D``;
* ``momentum``: ``||m'|| <= beta1 ||m|| + ||Delta||``, so ``lr (beta1 ||m|| + D)`` (unrolled,
  the geometric sum ``lr sum_k beta1^k D_{t-k}`` of the past steps' bounds);
* ``adam`` / ``yogi``, per coordinate, with ``a = |Delta_j| <= D``:
  ``|m'_j| <= beta1 |m_j| + (1 - beta1) a`` and ``v'_j >= max(beta2 v_j, c a^2)`` (Adam:
  ``c = 1 - beta2``; Yogi: ``v' = v + (1 - beta2) a^2 >= max(v, (1 - beta2) a^2)`` when
  ``a^2 > v``, else ``v' = v - (1 - beta2) a^2 >= beta2 max(v, a^2)``, so
  ``c = min(beta2, 1 - beta2)``). The step's coordinate is then at most
  ``g(a) = (P + Q a) / (max(s, k a) + tau)`` with ``P = beta1 |m_j|``, ``Q = 1 - beta1``,
  ``s = sqrt(beta2 v_j)``, ``k = sqrt(c)``: increasing for ``a <= s / k`` (constant
  denominator), monotone beyond (a ratio of linear functions), so its supremum over
  ``[0, D]`` is ``F_j = max(g(min(D, s / k)), g(D))``, and ``||x' - x|| <= lr ||F||``.
  Adam's per-coordinate normalisation lets even a small pseudo-gradient move every coordinate
  by about ``lr (1 - beta1) / sqrt(1 - beta2)``: the bound says so, and the server step size
  is what limits an adaptive optimizer's move.
"""

from __future__ import annotations

import math
from typing import Protocol

import numpy as np

from fedsim.errors import ConfigError

__all__ = ["Adaptive", "Momentum", "ServerOptimizer", "Sgd"]


class ServerOptimizer(Protocol):
    name: str

    def step(self, params: np.ndarray, direction: np.ndarray, lr: float) -> np.ndarray:
        """The new float32 model from ``params``, the descent direction ``d`` (float64) and
        the server step size ``lr``."""
        ...

    def state(self) -> dict[str, np.ndarray]:
        """The evolving state (arrays), for a checkpoint."""
        ...

    def load_state(self, state: dict[str, np.ndarray]) -> None:
        """Continue from :meth:`state` of an optimizer of the same configuration."""
        ...

    def move_bound(self, size: int, direction_bound: float, lr: float) -> float:
        """The largest ``||x' - x||`` the next :meth:`step` (from the current state, for a
        model of ``size`` parameters) can make when ``||d|| <= direction_bound``: see the
        module docstring."""
        ...


def _check_unit(name: str, value: float, *, closed: bool = False) -> None:
    ok = math.isfinite(value) and 0 <= value and (value <= 1 if closed else value < 1)
    if not ok:
        raise ConfigError(f"{name} must be in [0, {'1]' if closed else '1)'}, got {value!r}")


def _check_state(optimizer: object, state: dict[str, np.ndarray], keys: set[str]) -> None:
    if set(state) != keys:
        raise ConfigError(f"server optimizer state {sorted(state)} does not fit "
                          f"{type(optimizer).__name__} (expected {sorted(keys)}): was "
                          "server.optimizer changed between restarts?")


class Sgd:
    """``x <- x - lr d``: the server step of van Dijk & Nguyen (and FedAvg)."""

    name = "sgd"

    def step(self, params: np.ndarray, direction: np.ndarray, lr: float) -> np.ndarray:
        out = np.multiply(direction, -lr, dtype=np.float64)
        out += params
        return out.astype(np.float32)

    def state(self) -> dict[str, np.ndarray]:
        return {}

    def load_state(self, state: dict[str, np.ndarray]) -> None:
        _check_state(self, state, set())

    def move_bound(self, size: int, direction_bound: float, lr: float) -> float:
        return abs(lr) * direction_bound


class Momentum:
    """FedAvgM: ``m <- beta1 m + Delta``, ``x <- x + lr m``."""

    name = "momentum"

    def __init__(self, beta1: float = 0.9) -> None:
        _check_unit("momentum beta1", beta1)
        self.beta1 = beta1
        self.m: np.ndarray | None = None

    def step(self, params: np.ndarray, direction: np.ndarray, lr: float) -> np.ndarray:
        if self.m is None:
            self.m = np.zeros(params.shape, np.float64)
        self.m *= self.beta1
        self.m -= direction
        return (params + lr * self.m).astype(np.float32)

    def state(self) -> dict[str, np.ndarray]:
        return {} if self.m is None else {"m": self.m.copy()}

    def load_state(self, state: dict[str, np.ndarray]) -> None:
        if state:
            _check_state(self, state, {"m"})
            self.m = np.asarray(state["m"], np.float64).copy()

    def move_bound(self, size: int, direction_bound: float, lr: float) -> float:
        carried = 0.0 if self.m is None else math.sqrt(float(np.dot(self.m, self.m)))
        return abs(lr) * (self.beta1 * carried + direction_bound)


class Adaptive:
    """FedAdam (``kind = "adam"``) or FedYogi (``kind = "yogi"``) of Reddi et al."""

    def __init__(self, kind: str, beta1: float = 0.9, beta2: float = 0.99,
                 tau: float = 1e-3) -> None:
        if kind not in ("adam", "yogi"):
            raise ConfigError(f"adaptive server optimizer is 'adam' or 'yogi', got {kind!r}")
        _check_unit(f"{kind} beta1", beta1)
        _check_unit(f"{kind} beta2", beta2)
        if not (math.isfinite(tau) and tau > 0):
            raise ConfigError(f"{kind} tau must be > 0, got {tau!r}")
        self.name = kind
        self.beta1, self.beta2, self.tau = beta1, beta2, tau
        self.m: np.ndarray | None = None
        self.v: np.ndarray | None = None

    def step(self, params: np.ndarray, direction: np.ndarray, lr: float) -> np.ndarray:
        if self.m is None or self.v is None:
            self.m = np.zeros(params.shape, np.float64)
            self.v = np.full(params.shape, self.tau ** 2, np.float64)
        delta = -np.asarray(direction, np.float64)
        self.m *= self.beta1
        self.m += (1 - self.beta1) * delta
        square = delta * delta
        if self.name == "adam":
            self.v *= self.beta2
            self.v += (1 - self.beta2) * square
        else:
            self.v -= (1 - self.beta2) * square * np.sign(self.v - square)
        return (params + lr * self.m / (np.sqrt(self.v) + self.tau)).astype(np.float32)

    def state(self) -> dict[str, np.ndarray]:
        if self.m is None or self.v is None:
            return {}
        return {"m": self.m.copy(), "v": self.v.copy()}

    def load_state(self, state: dict[str, np.ndarray]) -> None:
        if state:
            _check_state(self, state, {"m", "v"})
            self.m = np.asarray(state["m"], np.float64).copy()
            self.v = np.asarray(state["v"], np.float64).copy()

    def move_bound(self, size: int, direction_bound: float, lr: float) -> float:
        if self.m is None or self.v is None:
            m, v = np.zeros(size, np.float64), np.full(size, self.tau ** 2, np.float64)
        else:
            m, v = self.m, self.v
        c = 1 - self.beta2 if self.name == "adam" else min(self.beta2, 1 - self.beta2)
        carried, gain = self.beta1 * np.abs(m), 1 - self.beta1
        floor, k = np.sqrt(self.beta2 * v), math.sqrt(c)

        def g(a: np.ndarray | float) -> np.ndarray:
            return (carried + gain * a) / (np.maximum(floor, k * a) + self.tau)

        bound = float(direction_bound)
        kink = np.minimum(bound, floor / k) if k > 0 else np.full(size, bound)
        per_coordinate = np.maximum(g(kink), g(bound))
        return abs(lr) * math.sqrt(float(np.dot(per_coordinate, per_coordinate)))
