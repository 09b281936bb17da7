"""Aggregation policies, staleness weightings and server optimizers against hand computations
(the papers' formulas written out in plain Python/numpy here, independently of the code)."""

from __future__ import annotations

import asyncio
import math

import numpy as np
import pytest

from fedsim.aggregation import ConstantStepSize, DataSizeWeights, UniformWeights
from fedsim.aggregation.build import make_optimizer, make_policy
from fedsim.aggregation.optimizers import Adaptive, Momentum, Sgd
from fedsim.aggregation.policies import (
    ConstantStaleness,
    FedAsync,
    FedBuff,
    HingeStaleness,
    PolynomialStaleness,
    TimeWindows,
)
from fedsim.config.schema import Server
from fedsim.errors import ConfigError
from fedsim.protocol.messages import ClientUpdate, GlobalModel
from fedsim.runtime.actors.server import ClientInfo, ServerActor
from fedsim.runtime.simulated.kernel import VirtualClock, run_virtual
from tests.doubles import RecordingEndpoint

DIM = 3


def test_staleness_weightings_follow_xie_et_al() -> None:
    s = np.array([0, 1, 3, 7, 12])
    assert ConstantStaleness()(s).tolist() == [1.0] * 5
    np.testing.assert_allclose(PolynomialStaleness(0.5)(s),
                               [1.0, 2 ** -0.5, 4 ** -0.5, 8 ** -0.5, 13 ** -0.5])
    # hinge a = 10, b = 4: 1 up to 4 versions, then 1 / (10 (s - 4) + 1)
    np.testing.assert_allclose(HingeStaleness(10, 4)(s), [1, 1, 1, 1 / 31, 1 / 81])
    with pytest.raises(ConfigError):
        PolynomialStaleness(0.0)
    with pytest.raises(ConfigError):
        HingeStaleness(1.0, -1.0)


def test_policies_factors_and_triggers() -> None:
    lambdas, s = np.array([0.25, 0.75]), np.array([0, 3])
    np.testing.assert_allclose(TimeWindows(PolynomialStaleness(1.0)).factors(lambdas, s),
                               [0.25, 0.75 / 4])
    buffer = FedBuff(3, HingeStaleness(1.0, 1.0))
    assert [buffer.ready(k) for k in (1, 2, 3)] == [False, False, True]
    np.testing.assert_allclose(buffer.factors(lambdas, s), [0.25, 0.75 / 3])
    single = FedAsync(0.6, PolynomialStaleness(0.5))
    assert single.ready(1) and single.on_arrival and not TimeWindows().on_arrival
    np.testing.assert_allclose(single.factors(np.array([1.0]), np.array([3])), [0.6 * 0.5])
    with pytest.raises(ConfigError):
        FedAsync(1.5)
    with pytest.raises(ConfigError):
        FedBuff(0)


def _reddi(kind: str, x0: list[float], directions: list[list[float]], lr: float, beta1: float,
           beta2: float, tau: float) -> list[float]:
    """Reddi et al. Alg. 2 (and FedAvgM), coordinate by coordinate in plain floats."""
    x = list(x0)
    m = [0.0] * len(x)
    v = [tau * tau] * len(x)
    for d in directions:
        for j in range(len(x)):
            delta = -d[j]
            if kind == "sgd":
                x[j] += lr * delta
                continue
            if kind == "momentum":
                m[j] = beta1 * m[j] + delta
                x[j] += lr * m[j]
                continue
            m[j] = beta1 * m[j] + (1 - beta1) * delta
            if kind == "adam":
                v[j] = beta2 * v[j] + (1 - beta2) * delta * delta
            else:
                sign = (v[j] > delta * delta) - (v[j] < delta * delta)
                v[j] = v[j] - (1 - beta2) * delta * delta * sign
            x[j] += lr * m[j] / (math.sqrt(v[j]) + tau)
    return x


@pytest.mark.parametrize("kind", ["sgd", "momentum", "adam", "yogi"])
def test_server_optimizers_match_reddi_et_al(kind: str) -> None:
    x0 = [1.0, -2.0, 0.5]
    directions = [[0.5, -1.0, 0.0], [0.2, 0.3, -0.4], [-0.1, 0.05, 2.0]]
    optimizer = {"sgd": Sgd(), "momentum": Momentum(0.8)}.get(kind) or Adaptive(kind, 0.9, 0.99,
                                                                               0.01)
    x = np.array(x0, np.float32)
    for d in directions:
        x = optimizer.step(x, np.array(d, np.float64), 0.1)
    want = _reddi(kind, x0, directions, 0.1, 0.8 if kind == "momentum" else 0.9, 0.99, 0.01)
    np.testing.assert_allclose(x, want, rtol=1e-6, atol=1e-6)
    # The state round-trips (a restarted server continues the same sequence).
    keys = {"sgd": {}, "momentum": {"beta1": 0.8}}.get(kind, {"beta1": 0.9, "tau": 0.01})
    again = make_optimizer(Server(window=1.0, optimizer={"kind": kind, **keys}).optimizer)
    again.load_state(optimizer.state())
    d = np.array([0.3, -0.2, 0.1])
    np.testing.assert_array_equal(again.step(x, d, 0.1), optimizer.step(x, d, 0.1))


def test_the_schema_builds_each_policy_and_rejects_bad_values() -> None:
    fedbuff = Server(window=1.0, aggregation={"kind": "fedbuff", "buffer_size": 4},
                     staleness_weight={"kind": "hinge", "a": 10, "b": 4})
    assert make_policy(fedbuff) == FedBuff(4, HingeStaleness(10, 4))
    fedasync = Server(window=1.0, aggregation={"kind": "fedasync", "alpha": 0.3},
                      staleness_weight={"kind": "polynomial", "a": 0.5})
    assert make_policy(fedasync) == FedAsync(0.3, PolynomialStaleness(0.5))
    assert make_policy(Server(window=1.0)) == TimeWindows(ConstantStaleness())
    for bad in ({"aggregation": {"kind": "fedbuff"}},
                {"aggregation": {"kind": "fedasync", "alpha": 0}},
                {"aggregation": {"kind": "bulk"}},
                {"staleness_weight": {"kind": "hinge", "b": -1}},
                {"optimizer": {"kind": "adam", "beta2": 1.0}},
                {"optimizer": {"kind": "yogi", "tau": 0}}):
        with pytest.raises(ValueError):
            Server(window=1.0, **bad)


# ---------------------------------------------------------------------------------------------
# The server actor with each policy


def _update(client: str, round_: int, base: int, value: float) -> ClientUpdate:
    return ClientUpdate(client, round_, base, np.full(DIM, value, np.float32), 10.0)


def _serve(policy, arrivals, *, strategy=None, windows: int = 2, optimizer=None):
    async def main(clock: VirtualClock):
        endpoint = RecordingEndpoint(clock)
        server = ServerActor(
            clock=clock, endpoint=endpoint, initial_params=np.zeros(DIM, np.float32),
            clients={"a": ClientInfo(100, 0.5), "b": ClientInfo(300, 0.5)}, window=1.0,
            strategy=strategy or DataSizeWeights(), step_size=ConstantStepSize(1.0),
            policy=policy, optimizer=optimizer)
        loop = asyncio.get_running_loop()
        for t, message in arrivals:
            loop.call_later(t, endpoint.inbox.put_nowait, message)
        reports = []
        await server.run(lambda r: reports.append(r) or r.window >= windows)
        models = [(t, m.version, float(m.params[0])) for t, m in endpoint.published
                  if isinstance(m, GlobalModel)]
        return server, reports, models

    return run_virtual(main)


def test_fedbuff_applies_each_full_buffer_at_once_and_publishes_it() -> None:
    """K = 2, data-size mixing (N_a = 100, N_b = 300: lambda = 1/4, 3/4 over the buffer), eta = 0.5,
    polynomial a = 1 (S(s) = 1/(s+1)); server step 1:
    buffer 1 = a0 (1.0, base 0), b0 (2.0, base 0): d = 1/4 .5 1 + 3/4 .5 2 = 0.875, x1 = -0.875;
    buffer 2 = a1 (1.0, base 0, staleness 1: S = 1/2), b1 (2.0, base 1, staleness 0):
    d = 1/4 .5 .5 1 + 3/4 .5 2 = 0.8125, x2 = -1.6875. a2 alone waits in the buffer."""
    server, reports, models = _serve(
        FedBuff(2, PolynomialStaleness(1.0)),
        [(0.2, _update("a", 0, 0, 1.0)), (0.3, _update("a", 0, 0, 1.0)),
         (0.4, _update("b", 0, 0, 2.0)), (0.6, _update("a", 1, 0, 1.0)),
         (0.7, _update("b", 1, 1, 2.0)), (1.2, _update("a", 2, 2, 5.0))])
    assert models[:3] == [(0.0, 0, 0.0), (0.4, 1, -0.875), (0.7, 2, -1.6875)]
    assert [(r.received, r.applied, r.duplicate, r.version) for r in reports] == [
        (5, 4, 1, 2), (1, 0, 0, 2)]
    assert reports[0].applied_to == [0, 0, 1, 1]
    assert ("a", 2) not in server.book  # buffered, not judged: a deployed server won't ack it


def test_fedasync_mixes_every_update_on_arrival() -> None:
    """alpha = 0.5, hinge a = 1, b = 0 (S(0) = 1, S(1) = 1/2), eta = 0.5:
    a0 (1.0, base 0): x1 = -(0.5 . 1 . 0.5 . 1) = -0.25;
    b0 (2.0, base 0, staleness 1): x2 = -0.25 - 0.5 . 0.5 . 0.5 . 2 = -0.5."""
    _, reports, models = _serve(FedAsync(0.5, HingeStaleness(1.0, 0.0)),
                                [(0.2, _update("a", 0, 0, 1.0)), (0.3, _update("b", 0, 0, 2.0))],
                                windows=1)
    assert models == [(0.0, 0, 0.0), (0.2, 1, -0.25), (0.3, 2, -0.5), (1.0, 2, -0.5)]
    assert reports[0].applied == 2


def test_time_windows_with_staleness_and_an_adaptive_optimizer() -> None:
    """Windows (uniform mixing over the window, polynomial a = 1) through FedAdam: window 1
    d = 1/2 .5 1 + 1/2 .5 3 = 1.0 at version 0; the optimizer's first step from 0 with
    Delta = -1: m = -0.1, v = 0.99 tau^2 + 0.01, x = 1.0 m / (sqrt v + tau)."""
    tau = 0.01
    _, reports, models = _serve(TimeWindows(PolynomialStaleness(1.0)),
                                [(0.2, _update("a", 0, 0, 1.0)), (0.3, _update("b", 0, 0, 3.0))],
                                strategy=UniformWeights(), windows=1,
                                optimizer=Adaptive("adam", 0.9, 0.99, tau))
    m, v = -0.1, 0.99 * tau * tau + 0.01
    assert models[-1][1] == 1
    assert models[-1][2] == pytest.approx(1.0 * m / (math.sqrt(v) + tau), rel=1e-6)


def test_the_optimizer_moments_survive_a_server_checkpoint(tmp_path) -> None:
    """A restarted server continues FedAdam from the checkpointed m and v."""
    from fedsim.runtime.deployed.checkpoint import ServerCheckpoint

    def server(clock: VirtualClock) -> ServerActor:
        return ServerActor(clock=clock, endpoint=RecordingEndpoint(clock),
                           initial_params=np.zeros(DIM, np.float32),
                           clients={"a": ClientInfo(100, 0.5)}, window=1.0,
                           strategy=UniformWeights(), step_size=ConstantStepSize(1.0),
                           optimizer=Adaptive("adam", 0.9, 0.99, 0.01))

    async def main(clock: VirtualClock) -> tuple[np.ndarray, np.ndarray]:
        first = server(clock)
        first.optimizer.step(first.params, np.ones(DIM), 0.1)
        checkpoint = ServerCheckpoint(tmp_path, {"run": "t"})
        checkpoint.save(first.snapshot())
        second = server(clock)
        second.restore(checkpoint.load())
        d = np.array([0.5, -0.5, 2.0])
        return first.optimizer.step(first.params, d, 0.1), second.optimizer.step(second.params, d, 0.1)

    a, b = run_virtual(main)
    np.testing.assert_array_equal(a, b)
