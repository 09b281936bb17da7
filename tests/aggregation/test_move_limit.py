"""The server's move limit under every server optimizer: each optimizer's bound on how far one
step can move the model (fedsim.aggregation.optimizers' module docstring) against a hand
computation, against the worst directions a hostile client can choose within its norm bound,
and enforced by the server (a step beyond it is refused)."""

from __future__ import annotations

import math

import numpy as np
import pytest

from fedsim.aggregation import ConstantStepSize, UniformWeights
from fedsim.aggregation.optimizers import Adaptive, Momentum, Sgd
from fedsim.clock import WallClock
from fedsim.protocol.messages import ClientUpdate
from fedsim.runtime.actors.integrity import ClientLimits
from fedsim.runtime.actors.server import ClientInfo, ServerActor
from tests.doubles import RecordingEndpoint

DIM = 4
LIMITS = ClientLimits(sampling="poisson", batch_size=32, num_samples=500, dim=DIM,
                      clip=lambda r: 1.0, sigma=lambda r: 1.0, max_rounds=50)
BOUND = LIMITS.norm_bound(0)


def _optimizers() -> dict[str, object]:
    return {"sgd": Sgd(), "momentum": Momentum(0.9), "adam": Adaptive("adam", 0.9, 0.99, 1e-3),
            "yogi": Adaptive("yogi", 0.9, 0.99, 1e-3)}


def _move(optimizer, x: np.ndarray, d: np.ndarray, lr: float) -> float:
    new = optimizer.step(x.astype(np.float32), d, lr)
    return float(np.linalg.norm(new.astype(np.float64) - x.astype(np.float32)))


def test_move_bounds_by_hand() -> None:
    """SGD: lr D. Momentum 0.5 after one step with d = (-3, -4) (m = (3, 4), |m| = 5):
    0.1 (0.5 5 + 2) = 0.45. Fresh Adam (m = 0, v = tau^2 = 1e-4), beta 0.9/0.99, D = 1, one
    coordinate: s = sqrt(0.99) 0.01, k = 0.1, kink s/k; g(a) = 0.1 a / (max(s, 0.1 a) + 0.01):
    g(kink) = 0.1 (s / 0.1) / (2 s... ) and g(1) = 0.1 / 0.11; the bound is their max.
    Fresh Yogi (c = min(0.99, 0.01) = 0.01): the same numbers."""
    assert Sgd().move_bound(3, 2.0, 0.1) == pytest.approx(0.2)
    momentum = Momentum(0.5)
    momentum.step(np.zeros(2, np.float32), np.array([-3.0, -4.0]), 1.0)
    assert momentum.move_bound(2, 2.0, 0.1) == pytest.approx(0.45)
    s = math.sqrt(0.99) * 0.01
    kink = s / 0.1
    want = max(0.1 * kink / (s + 0.01), 0.1 * 1.0 / (0.1 * 1.0 + 0.01))
    for kind in ("adam", "yogi"):
        assert Adaptive(kind, 0.9, 0.99, 0.01).move_bound(1, 1.0, 0.5) == pytest.approx(0.5 * want)
    # The real worst step stays below: Delta = 1 in one coordinate moves lr m'/(sqrt v' + tau)
    # with m' = 0.1, v' = 0.99e-4 + 0.01 (Adam).
    adam_step = 0.5 * 0.1 / (math.sqrt(0.99e-4 + 0.01) + 0.01)
    assert adam_step <= 0.5 * want and adam_step > 0.99 * 0.5 * want


@pytest.mark.parametrize("kind", ["sgd", "momentum", "adam", "yogi"])
def test_no_direction_within_the_bound_moves_the_model_further(kind: str) -> None:
    """From a state built by honest steps, the hostile directions of norm D (all in one
    coordinate, spread evenly, against the momentum, random) never move the model further
    than the optimizer's bound, and the worst of them comes within a factor 2 of it."""
    rng = np.random.default_rng(7)
    optimizer = _optimizers()[kind]
    x = np.zeros(DIM, np.float32)
    for _ in range(5):
        x = optimizer.step(x, rng.normal(0.0, 0.05, DIM), 0.1)
    D, lr = 3.0, 0.1
    state = optimizer.state()
    bound = optimizer.move_bound(DIM, D, lr)
    directions = [np.eye(DIM)[j] * D * sign for j in range(DIM) for sign in (1, -1)]
    directions.append(np.full(DIM, D / math.sqrt(DIM)))
    if "m" in state:
        directions.append(-state["m"] / np.linalg.norm(state["m"]) * D)
    directions += [(v := rng.normal(size=DIM)) / np.linalg.norm(v) * D * rng.uniform()
                   for _ in range(200)]
    moves = []
    for d in directions:
        trial = _optimizers()[kind]
        trial.load_state(state)
        moves.append(_move(trial, x, d, lr))
    assert max(moves) <= bound * (1 + 1e-6)
    assert max(moves) >= 0.5 * bound


def _server(optimizer) -> ServerActor:
    clients = {c: ClientInfo(500, 1.0, limits=LIMITS) for c in ("good", "evil")}
    return ServerActor(clock=WallClock(), endpoint=RecordingEndpoint(), initial_params=np.zeros(DIM),
                       clients=clients, window=1.0, strategy=UniformWeights(),
                       step_size=ConstantStepSize(0.5), optimizer=optimizer)


def _update(client: str, round_: int, values: object) -> ClientUpdate:
    return ClientUpdate(client, round_, 0, np.asarray(values, np.float32).reshape(DIM), 32.0)


@pytest.mark.parametrize("kind", ["sgd", "momentum", "adam", "yogi"])
def test_a_hostile_update_at_its_norm_bound_moves_the_model_within_the_limit(kind: str) -> None:
    """An honest window, then a hostile client's update just under its norm bound, all in one
    coordinate (large but plausible: it passes the norm check). Uniform mixing over the window
    (lambda = 1/2), eta = 1, s = 0.5: D = 1/2 B_good + 1/2 B_evil = B, and the step moves the
    model at most the optimizer's bound from its state before the step (by hand for SGD:
    0.5 * 1/2 * 0.999 B)."""
    server = _server(_optimizers()[kind])
    server._inbox = [_update("good", 0, [0.1, -0.1, 0.05, 0.0]),
                     _update("evil", 0, [0.0, 0.0, 0.0, 0.0])]
    assert server.close_window().applied == 2
    before_params, before = server.params.copy(), server.optimizer.state()
    hostile = np.zeros(DIM)
    hostile[0] = 0.999 * BOUND
    server._inbox = [_update("good", 1, [0.1, -0.1, 0.05, 0.0]), _update("evil", 1, hostile)]
    trial = _optimizers()[kind]
    trial.load_state(before)
    limit = trial.move_bound(DIM, BOUND, 0.5)
    report = server.close_window()
    assert report.applied == 2 and report.rejections == {}
    moved = float(np.linalg.norm(server.params.astype(np.float64) - before_params))
    assert moved <= limit * (1 + 1e-6)
    if kind == "sgd":
        assert moved == pytest.approx(0.5 * np.linalg.norm(
            0.5 * np.array([0.1, -0.1, 0.05, 0.0]) + 0.5 * hostile), rel=1e-5)
        assert limit == pytest.approx(0.5 * BOUND)


class _Overshooting:
    """A server optimizer whose steps go four times as far as the optimizer it wraps (a broken
    or tampered optimizer): the move limit must refuse them."""

    def __init__(self, inner) -> None:
        self.inner, self.name = inner, inner.name

    def step(self, params, direction, lr):
        new = self.inner.step(params, direction, lr)
        return (params + 4.0 * (new.astype(np.float64) - params)).astype(np.float32)

    def state(self):
        return self.inner.state()

    def load_state(self, state) -> None:
        self.inner.load_state(state)

    def move_bound(self, size, direction_bound, lr):
        return self.inner.move_bound(size, direction_bound, lr)


@pytest.mark.parametrize("kind", ["sgd", "momentum", "adam", "yogi"])
def test_a_step_beyond_the_optimizer_bound_is_refused(kind: str) -> None:
    """Every optimizer's step is checked (not only SGD's): a step beyond its bound is refused
    as bad_mix, the model and the optimizer state stay as they were."""
    server = _server(_Overshooting(_optimizers()[kind]))
    hostile = np.zeros(DIM)
    hostile[0] = 0.999 * BOUND
    server._inbox = [_update("good", 0, [0.1, -0.1, 0.05, 0.0]), _update("evil", 0, hostile)]
    report = server.close_window()
    assert report.applied == 0 and report.rejections == {"bad_mix": 2}
    assert server.version == 0 and not server.params.any()
    assert server.optimizer.state() == {}  # the state before the refused step: fresh
