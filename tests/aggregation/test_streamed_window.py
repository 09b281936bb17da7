"""The streamed time-window mix (issue 18): past ``stream_above`` waiting updates the server
checks and folds them in as they arrive. Normalised over the population it is the buffered
mix bit for bit; normalised over the window it differs by float64 rounding only. Every check
(norm bound, finiteness, duplicates, staleness, the mixed model's check) still runs."""

from __future__ import annotations

import asyncio
import math
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from fedsim.aggregation import ConstantStepSize
from fedsim.aggregation.mixing import ConfiguredWeights, DataSizeWeights, UniformWeights
from fedsim.aggregation.optimizers import Momentum
from fedsim.aggregation.policies import PolynomialStaleness, TimeWindows
from fedsim.clock import WallClock
from fedsim.config import LoadedScenario, parse_scenario
from fedsim.protocol.messages import ClientUpdate
from fedsim.runtime.actors.integrity import ClientLimits
from fedsim.runtime.actors.server import ClientInfo, ServerActor, WindowReport
from fedsim.runtime.simulated.simulation import run_scenario
from tests.doubles import RecordingEndpoint

DIM = 40
CLIENTS = [f"c{k:02d}" for k in range(12)]
LIMITS = ClientLimits(sampling="poisson", batch_size=8, num_samples=200, dim=DIM,
                      clip=lambda r: 1.0, sigma=lambda r: 1.0, max_rounds=40)


def _server(strategy: Any, normalize: str, stream_above: int, **kw: Any) -> ServerActor:
    clients = {c: ClientInfo(50 + 13 * k, 0.1 + 0.05 * k, weight=1.0 + k % 3, limits=LIMITS)
               for k, c in enumerate(CLIENTS)}
    server = ServerActor(clock=WallClock(), endpoint=RecordingEndpoint(), initial_params=np.zeros(DIM),
                         clients=clients, window=1.0, strategy=strategy,
                         step_size=ConstantStepSize(0.7), max_staleness=1,
                         normalize=normalize, **kw)  # type: ignore[arg-type]
    server.stream_above = stream_above
    return server


def _windows(seed: int) -> list[list[ClientUpdate]]:
    """Three windows of honest updates on recent (some stale) versions, with replays and
    hostile ones mixed in."""
    rng = np.random.default_rng(seed)
    rounds = dict.fromkeys(CLIENTS, 0)
    windows = []
    for window in range(3):
        messages: list[ClientUpdate] = []
        for _ in range(45):
            client = CLIENTS[int(rng.integers(len(CLIENTS)))]
            base = max(0, window - int(rng.integers(0, 3)))  # staleness up to 2 (> max 1)
            delta = (rng.standard_normal(DIM) * 0.05).astype(np.float32)
            messages.append(ClientUpdate(client, rounds[client], base, delta, 8.0))
            rounds[client] += 1
            if rng.random() < 0.15:
                messages.append(messages[-1])  # a replay
        messages += [
            ClientUpdate("c01", 39, window, np.full(DIM, 5.0, np.float32), 8.0),  # norm
            ClientUpdate("c02", 38, window, np.full(DIM, math.nan, np.float32), 8.0),
            ClientUpdate("mallory", 0, window, np.zeros(DIM, np.float32), 8.0),
            ClientUpdate("c03", 37, window + 5, np.zeros(DIM, np.float32), 8.0),  # future
        ]
        rng.shuffle(messages)  # type: ignore[arg-type]
        windows.append(messages)
    return windows


def _drive(server: ServerActor, windows: list[list[ClientUpdate]]) -> list[WindowReport]:
    """The messages through the server's own receive loop, a window at a time; the inbox
    never holds more than ``stream_above`` updates."""

    async def main() -> list[WindowReport]:
        endpoint = server.endpoint
        assert isinstance(endpoint, RecordingEndpoint)
        receiver = asyncio.create_task(server._receive_forever())
        reports = []
        for messages in windows:
            for message in messages:
                endpoint.inbox.put_nowait(message)
                for _ in range(3):
                    await asyncio.sleep(0)
                assert len(server._inbox) <= server.stream_above
            reports.append(server.close_window())
            await server.broadcast()  # as run() does: the updates name published versions
        receiver.cancel()
        return reports

    return asyncio.run(main())


def _same_reports(a: list[WindowReport], b: list[WindowReport]) -> None:
    for x, y in zip(a, b, strict=True):
        for name in ("received", "applied", "rejected", "duplicate", "stale", "rejections",
                     "applied_updates", "applied_to", "version"):
            assert getattr(x, name) == getattr(y, name), name


STRATEGIES = [DataSizeWeights(), ConfiguredWeights(), UniformWeights()]


@pytest.mark.parametrize("strategy", STRATEGIES, ids=lambda s: s.name)
@pytest.mark.parametrize("staleness", [None, PolynomialStaleness(0.5)])
def test_population_normalised_streaming_is_the_buffered_mix_bit_for_bit(
        strategy: Any, staleness: Any) -> None:
    policy = {} if staleness is None else {"policy": TimeWindows(staleness)}
    windows = _windows(7)
    buffered = _server(strategy, "population", 10**9, **policy)
    streamed = _server(strategy, "population", 4, **policy)
    reports = _drive(buffered, windows)
    _same_reports(_drive(streamed, windows), reports)
    assert sum(r.applied for r in reports) > 60 and sum(r.stale for r in reports) > 0
    assert all(r.rejections == {"future_version": 1, "non_finite": 1, "norm": 1,
                                "unknown_client": 1} for r in reports)
    assert buffered.params.tobytes() == streamed.params.tobytes()
    assert np.abs(buffered.params).max() > 1e-3  # the model moved


@pytest.mark.parametrize("strategy", STRATEGIES, ids=lambda s: s.name)
def test_window_normalised_streaming_differs_by_rounding_only(strategy: Any) -> None:
    windows = _windows(11)
    buffered = _server(strategy, "window", 10**9, optimizer=Momentum(0.9))
    streamed = _server(strategy, "window", 3, optimizer=Momentum(0.9))
    _same_reports(_drive(streamed, windows), _drive(buffered, windows))
    # float64 sums divided once instead of weights divided first: a few float64 ulps,
    # at most one float32 ulp in the model.
    spacing = np.spacing(np.abs(buffered.params).astype(np.float32))
    assert np.all(np.abs(streamed.params - buffered.params) <= spacing)
    assert np.abs(buffered.params).max() > 1e-3


def test_a_streamed_mix_that_is_not_finite_is_refused_and_counted() -> None:
    """No limits known: the norm check cannot run, so the mixed model's check refuses the
    overflowing window, folded in or not."""
    for stream_above in (10**9, 1):
        server = ServerActor(clock=WallClock(), endpoint=RecordingEndpoint(),
                             initial_params=np.zeros(3),
                             clients={"a": ClientInfo(1, 1.0), "b": ClientInfo(1, 1.0)},
                             window=1.0, strategy=UniformWeights(),
                             step_size=ConstantStepSize(2.0))
        server.stream_above = stream_above
        huge = np.full(3, -3.4e38, np.float32)
        (report,) = _drive(server, [[ClientUpdate("a", 0, 0, huge, 1.0),
                                     ClientUpdate("b", 0, 0, huge, 1.0)]])
        assert report.applied == 0 and report.rejections == {"bad_mix": 2}
        assert server.version == 0 and not server.params.any()
        assert ("a", 0) in server.book and ("b", 0) in server.book  # refused, never applied later


def _scenario() -> dict[str, Any]:
    group: dict[str, Any] = {"count": 6, "data_share": 0.5, "clip": 1.0, "local_lr": 0.5,
                             "batch_size": 2, "noise": 1.0,
                             "speed": {"kind": "uniform", "low": 0.01, "high": 0.03}}
    return {
        "name": "streamed", "seed": 9, "stop": {"virtual_seconds": 3.0},
        "dataset": {"name": "synthetic", "num_samples": 600, "num_test_samples": 100,
                    "num_features": 8, "num_classes": 3},
        "model": {"name": "mlp", "options": {"hidden": [8]}},
        "clients": {"groups": [{**group, "name": "a", "sampling": "poisson"},
                               {**group, "name": "b", "sampling": "fixed"}]},
        "server": {"window": 1.0, "normalize": "population", "max_staleness": 3},
    }


@pytest.mark.slow
def test_a_simulation_with_streamed_windows_writes_the_same_run(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    loaded = LoadedScenario(parse_scenario(_scenario()), None)
    buffered = run_scenario(loaded, tmp_path / "buffered")
    monkeypatch.setattr("fedsim.aggregation.mixing.STREAM_ABOVE", 2)
    folds = []
    fold = ServerActor._fold_inbox

    def counted(self: ServerActor, *due: tuple[ClientUpdate, ...]) -> None:
        folds.append(len(self._inbox))
        fold(self, *due)

    monkeypatch.setattr(ServerActor, "_fold_inbox", counted)
    streamed = run_scenario(loaded, tmp_path / "streamed")
    assert len(folds) > 20  # the windows really were folded in as they arrived
    assert buffered.summary["updates"]["applied"] > 50
    assert streamed.final_params.tobytes() == buffered.final_params.tobytes()
    for name in ("metrics.jsonl", "clients.csv"):
        assert (tmp_path / "streamed" / name).read_bytes() == \
            (tmp_path / "buffered" / name).read_bytes()


def _plain_direction(updates: list[Any], coefficients: list[float]) -> np.ndarray:
    """d = sum_i c_i eta_i u_i, every update multiplied and added (no skip)."""
    direction = np.zeros(updates[0].update.shape, dtype=np.float64)
    for update, c in zip(updates, coefficients, strict=True):
        direction += np.multiply(update.update, c * update.step_size, dtype=np.float64)
    return direction


@pytest.mark.parametrize("seed", range(6))
def test_a_zero_update_skipped_in_the_fold_changes_no_bit(seed: int) -> None:
    """An update the decoder measured at norm 0 (message-only clients send only those) is not
    multiplied and added: d is the plain sum's bit for bit, signed zeros included, with
    updates of +0 and -0, negative coefficients, NaN and inf entries from other updates, and
    exact cancellation (which leaves +0 entries a -0 product would otherwise test)."""
    from fedsim.aggregation.mixing import AcceptedUpdate, RunningDirection
    from fedsim.protocol.norms import vector_norm

    rng = np.random.default_rng(seed)
    updates, coefficients = [], []
    for k in range(30):
        kind = rng.integers(4)
        if kind == 0:
            values = np.where(rng.random(DIM) < 0.5, -0.0, 0.0).astype(np.float32)
        elif kind == 1:
            values = np.zeros(DIM, dtype=np.float32)
        else:
            values = rng.standard_normal(DIM).astype(np.float32)
            values[rng.random(DIM) < 0.2] = 0.0
            if k == 7:
                values[3] = np.inf
            if k == 11:
                values[5] = np.nan
        updates.append(AcceptedUpdate(f"c{k}", k, values, 10, float(rng.uniform(0.1, 2.0)),
                                      norm=vector_norm(values)))
        coefficients.append(float(rng.choice([-1.0, 1.0]) * rng.uniform(0.0, 1.0)))
    # exact cancellation: the same update with opposite coefficients gives +0 entries
    updates += [updates[2], updates[2]]
    coefficients += [0.5, -0.5]
    running = RunningDirection((DIM,))
    for update, c in zip(updates, coefficients, strict=True):
        running.add(update, c)
    plain = _plain_direction(updates, coefficients)
    assert running.direction.tobytes() == plain.tobytes()
    assert sum(u.norm == 0.0 for u in updates) > 0  # some were skipped


def test_a_zero_update_with_an_infinite_scale_is_added() -> None:
    """0 * inf is NaN: with an infinite coefficient the zero update is multiplied as before,
    so the mix check sees the NaN it would have seen."""
    from fedsim.aggregation.mixing import AcceptedUpdate, RunningDirection

    zero = np.zeros(DIM, dtype=np.float32)
    running = RunningDirection((DIM,))
    running.add(AcceptedUpdate("c", 0, zero, 10, 1.0, norm=0.0), math.inf)
    assert np.isnan(running.direction).all()
