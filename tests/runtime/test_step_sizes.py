"""Server step sizes carried by every global model and followed by clients (or not), and the
per-client a-priori round step-size sequences, applied alike by the client and the server."""

from __future__ import annotations

import asyncio
import math
from pathlib import Path

import numpy as np
import pytest

from fedsim.aggregation import ConstantStepSize, InverseTimeStepSize, UniformWeights
from fedsim.config import LoadedScenario, parse_scenario
from fedsim.errors import ConfigError
from fedsim.protocol import codec
from fedsim.protocol.messages import ClientUpdate, GlobalModel
from fedsim.runtime.actors.client import ClientActor
from fedsim.runtime.actors.server import ClientInfo, ServerActor
from fedsim.runtime.simulated.kernel import VirtualClock, run_virtual
from fedsim.runtime.simulated.simulation import run_scenario
from fedsim.training.rounds import DoneRound, RoundResult
from fedsim.training.step_sequence import StepSequence
from tests.doubles import FreeLedger, RecordingEndpoint


def test_step_sequences_by_hand() -> None:
    inverse = StepSequence(0.8, "inverse_time", decay=0.5, power=2.0)
    assert [inverse(r) for r in (0, 1, 4)] == pytest.approx([0.8, 0.8 / 1.5 ** 2, 0.8 / 3 ** 2])
    exponential = StepSequence(1.0, "exponential", factor=0.5, minimum=0.2)
    assert [exponential(r) for r in (0, 1, 2, 3)] == pytest.approx([1.0, 0.5, 0.25, 0.2])
    assert StepSequence(0.3)(99) == 0.3
    with pytest.raises(ConfigError):
        StepSequence(0.3, "exponential", factor=1.5)


def test_the_global_model_carries_its_step_size_on_the_wire() -> None:
    message = GlobalModel(3, np.zeros(4, np.float32), 1.0, 2, None, 0.35)
    assert codec.decode(codec.encode(message)).step_size == 0.35
    assert codec.decode(codec.encode(GlobalModel(1, np.zeros(2, np.float32)))).step_size == 1.0


class _Trainer:
    def planned_steps(self, round_index: int) -> list:
        return []

    def begin_round(self, params: np.ndarray, round_index: int) -> DoneRound:
        return DoneRound(RoundResult(np.ones(2, np.float32), [], [1], 1.0, 1.0, 0.0, 1))


@pytest.mark.parametrize("follow", [True, False])
def test_a_client_steps_by_its_sequence_times_the_carried_server_step(follow: bool) -> None:
    """eta(r) = 0.4 / (1 + r); the global model carries s = 0.5: after rounds 0 and 1 (update 1
    each) w = -(0.4 + 0.2) s when following, -(0.4 + 0.2) when not."""
    async def main(clock: VirtualClock) -> np.ndarray:
        endpoint = RecordingEndpoint(clock)
        actor = ClientActor("c1", clock=clock, endpoint=endpoint, trainer=_Trainer(),
                            ledger=FreeLedger(), local_lr=StepSequence(0.4, "inverse_time", 1.0),
                            batch_size=1, seconds_per_sample=lambda: 0.1, max_rounds=2,
                            first_server_step=1.0 if follow else None, status_epsilon=lambda: (0.0, 1e-5))
        endpoint.inbox.put_nowait(GlobalModel(1, np.zeros(2, np.float32), step_size=0.5))
        await actor.run()
        assert actor.server_step == (0.5 if follow else 1.0)
        return actor.w

    w = run_virtual(main)
    np.testing.assert_allclose(w, -(0.4 + 0.2) * (0.5 if follow else 1.0), rtol=1e-6)


def test_the_server_applies_the_agreed_sequence_and_broadcasts_its_step_size() -> None:
    """Client a: eta(r) = 1 / (1 + r); rounds 0 and 3 in one window, uniform mixing over it:
    d = 1/2 (1 . 1) + 1/2 (1/4 . 1) = 0.625. Server step 1 / (1 + 1 (k - 1)) in window k:
    window 1 applies s = 1; the model opening window 2 carries s = 1/2."""
    async def main(clock: VirtualClock):
        endpoint = RecordingEndpoint(clock)
        server = ServerActor(
            clock=clock, endpoint=endpoint, initial_params=np.zeros(2, np.float32),
            clients={"a": ClientInfo(10, 1.0, 1.0, sequence=StepSequence(1.0, "inverse_time", 1.0))},
            window=1.0, strategy=UniformWeights(), step_size=InverseTimeStepSize(1.0, 1.0))
        loop = asyncio.get_running_loop()
        for t, r in ((0.2, 0), (0.4, 3)):
            loop.call_later(t, endpoint.inbox.put_nowait,
                            ClientUpdate("a", r, 0, np.ones(2, np.float32), 1.0))
        await server.run(lambda report: report.window >= 1)
        return [(m.version, float(m.params[0]), m.step_size) for _, m in endpoint.published]

    assert run_virtual(main) == [(0, 0.0, 1.0), (1, pytest.approx(-0.625), 0.5)]


def test_a_plateau_run_reaches_clients_that_follow_it(tmp_path: Path) -> None:
    """The server's plateau steps reach every following client; an opted-out group stays at 1."""
    data = {
        "name": "steps", "seed": 1, "stop": {"virtual_seconds": 20.0},
        "dataset": {"name": "synthetic", "num_samples": 400, "num_test_samples": 100,
                    "num_features": 6, "num_classes": 3},
        "model": {"name": "logreg"},
        "clients": {"groups": [
            {"name": "f", "count": 2, "data_share": 0.5, "batch_size": 8, "clip": 1.0,
             "noise": 1.0, "speed": 0.02,
             "step_sequence": {"kind": "exponential", "factor": 0.9, "minimum": 0.01}},
            {"name": "o", "count": 2, "data_share": 0.5, "batch_size": 8, "clip": 1.0,
             "noise": 1.0, "speed": 0.02, "follow_server_step": False},
        ]},
        "server": {"window": 0.5, "eval_every": 1,
                   "step_size": {"kind": "inverse_time", "initial": 1.0, "decay": 0.1}},
    }
    result = run_scenario(LoadedScenario(parse_scenario(data), None), tmp_path / "run")
    last = result.metrics[-1]["window"]
    carried = 1.0 / (1.0 + 0.1 * last)  # the model opening window last + 1
    for client in result.clients.values():
        want = carried if client.plan.group.name == "f" else 1.0
        assert client.actor.server_step == pytest.approx(want, rel=1e-9)
    assert ConstantStepSize(1.0).current(7) == 1.0


def _one_round_w(first_step: float, carried: float, *, follow: bool = True) -> np.ndarray:
    """w after one round (update 1 per coordinate) of a client with local_lr 0.4 whose server
    schedule starts at ``first_step`` and whose global model carries ``carried``."""
    async def main(clock: VirtualClock) -> np.ndarray:
        endpoint = RecordingEndpoint(clock)
        actor = ClientActor("c1", clock=clock, endpoint=endpoint, trainer=_Trainer(),
                            ledger=FreeLedger(), local_lr=0.4, batch_size=1,
                            seconds_per_sample=lambda: 0.1, max_rounds=1,
                            first_server_step=first_step if follow else None, status_epsilon=lambda: (0.0, 1e-5))
        endpoint.inbox.put_nowait(GlobalModel(1, np.zeros(2, np.float32), step_size=carried))
        await actor.run()
        return actor.w

    return run_virtual(main)


def test_a_client_follows_the_server_step_relative_to_its_first_value() -> None:
    """s_0 = 2.0 (a plateau starting at 2): the first model (s = 2.0) gives exactly local_lr
    (w = -0.4), a plateau reduction by 0.9 (s = 1.8) gives 0.9 local_lr (w = -0.36); not
    following, the carried 1.8 changes nothing (w = -0.4)."""
    np.testing.assert_allclose(_one_round_w(2.0, 2.0), -0.4, rtol=1e-6)
    np.testing.assert_allclose(_one_round_w(2.0, 1.8), -0.9 * 0.4, rtol=1e-6)
    np.testing.assert_allclose(_one_round_w(2.0, 1.8, follow=False), -0.4, rtol=1e-6)
    with pytest.raises(ConfigError):
        _one_round_w(0.0, 1.0)


def test_a_simulated_plateau_from_two_gives_clients_their_own_step_times_the_reductions(
        tmp_path: Path) -> None:
    """server.step_size plateau initial 2.0, factor 0.9: every client plan (the simulator's and
    the deployed client's, both built by build_population and make_client_actor) knows s_0 =
    2.0; after the run a following client steps by local_lr * 0.9^k for the k reductions the
    server made (k >= 1 here), and its applied local step matches by hand."""
    from fedsim.runtime.population import build_population, first_server_step

    data = {
        "name": "plateau", "seed": 2, "stop": {"virtual_seconds": 30.0},
        "dataset": {"name": "synthetic", "num_samples": 400, "num_test_samples": 100,
                    "num_features": 6, "num_classes": 3},
        "model": {"name": "logreg"},
        "clients": {"groups": [
            {"name": "f", "count": 2, "data_share": 1.0, "batch_size": 8, "clip": 1.0, "noise": 1.0,
             "speed": 0.02,
             "local_lr": 0.3}]},
        "server": {"window": 0.5, "eval_every": 1,
                   "step_size": {"kind": "plateau", "initial": 2.0, "factor": 0.9, "patience": 1}},
    }
    loaded = LoadedScenario(parse_scenario(data), None)
    assert first_server_step(loaded.scenario) == 2.0
    assert {p.first_server_step for p in build_population(loaded).plans} == {2.0}
    result = run_scenario(loaded, tmp_path / "run")
    for client in result.clients.values():
        actor = client.actor
        assert actor.first_server_step == 2.0
        reductions = round(math.log(actor.server_step / 2.0) / math.log(0.9))
        assert reductions >= 1
        assert actor.server_step == pytest.approx(2.0 * 0.9 ** reductions, rel=1e-12)
        assert actor.local_step(5) == pytest.approx(0.3 * 0.9 ** reductions, rel=1e-12)
