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
