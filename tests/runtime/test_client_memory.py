"""What a client holds, made smaller without changing what it draws or decides (issue 24
item 5): the shared integrity limits, the parked speed stream, the status callable."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest

from fedsim.config import LoadedScenario, parse_scenario
from fedsim.runtime.actors.integrity import client_limits
from fedsim.runtime.assembly import client_infos, make_client_actor, open_ledger
from fedsim.runtime.population import build_population
from tests.runtime.test_simulation import scenario


def _population(**changes: object):  # type: ignore[no-untyped-def]
    return build_population(LoadedScenario(parse_scenario(scenario(**changes)), None))


def test_clients_alike_share_what_the_server_knows_and_it_bounds_what_their_own_would() -> None:
    data = scenario()
    data["clients"]["groups"][0]["count"] = 5  # five clients of one group, equal shares
    data["clients"]["groups"][0]["partition"] = {"scheme": "iid"}
    population = build_population(LoadedScenario(parse_scenario(data), None))
    infos = client_infos(population)
    dim = population.initial_params.size
    for plan in population.plans:
        shared = infos[plan.client_id].limits
        own = client_limits(plan.group, plan.public_samples, plan.schedule, dim)
        assert shared is not None
        for r in (0, 1, 5, 11):
            assert shared.norm_bound(r) == own.norm_bound(r)
        assert (shared.max_rounds, shared.num_samples, shared.batch_size) == (
            own.max_rounds, own.num_samples, own.batch_size)
        known = infos[plan.client_id]
        assert (known.num_samples, known.step_size, known.weight) == (
            plan.public_samples, plan.group.local_lr, plan.group.weight)
        assert [known.step_at(r) for r in (0, 3, 9)] == [plan.group.local_lr] * 3
    by_group: dict[str, set[int]] = {}
    for plan in population.plans:
        key = f"{plan.group.name}/{plan.public_samples}"
        by_group.setdefault(key, set()).add(id(infos[plan.client_id]))
    assert all(len(ids) == 1 for ids in by_group.values())
    assert len({id(i) for i in infos.values()}) == len(by_group) < len(infos)


class _Clock:
    def now(self) -> float:
        return 0.0

    async def sleep(self, seconds: float) -> None: ...


class _Endpoint:
    async def publish(self, message: object) -> None: ...

    async def receive(self) -> object: ...

    async def close(self) -> None: ...


@pytest.mark.parametrize("parked", [True, False])
def test_an_actor_draws_its_speed_and_reports_its_epsilon_as_the_plain_closures_did(
        tmp_path: Path, parked: bool) -> None:
    """Its speed stream parked (populations of millions) or its own generator: the draws of
    the stream itself, in order, either way."""
    population = _population()
    plan = population.plans[0]  # a uniform speed
    ledger = open_ledger(plan, tmp_path / "c.jsonl")
    try:
        actor = make_client_actor(
            plan, clock=_Clock(), endpoint=_Endpoint(),  # type: ignore[arg-type]
            trainer=population.trainer(plan, message_only=True), ledger=ledger,
            speed_rng=population.tree.numpy("client", plan.client_id, "speed", 0), delta=1e-5,
            park_speed_stream=parked)
        plain = population.tree.numpy("client", plan.client_id, "speed", 0)
        expected = [plan.group.speed.sample(plain) for _ in range(40)]
        assert [actor.seconds_per_sample() for _ in range(40)] == expected
        assert len(set(expected)) == 40  # drawn, not a constant
        assert (type(actor.seconds_per_sample._stream).__name__ == "ParkedStream") is parked
        assert actor.status_epsilon is not None
        epsilon, delta = actor.status_epsilon()
        assert (epsilon, delta) == (ledger.epsilon(1e-5), 1e-5)
        assert not math.isnan(epsilon)
    finally:
        ledger.close()
    assert np.isfinite(population.initial_params).all()


def test_equal_postures_share_one_step_and_a_bad_one_is_refused_every_time() -> None:
    from fedsim.errors import ConfigError
    from fedsim.privacy.events import GaussianStep
    from fedsim.training.dpsgd import step_for

    step = step_for("poisson", 60, 4, 1.25, 2)
    assert step is step_for("poisson", 60, 4, 1.25, 2)
    assert step == GaussianStep("poisson", 4 / 60, 1.25, 2)
    assert step_for("poisson", 60, 4, np.float64(1.25), 2) == step  # typed: its own entry
    assert step_for("fixed", 60, 4, 1.25, 2) != step
    for _ in range(2):
        with pytest.raises(ConfigError, match="sigma"):
            step_for("poisson", 60, 4, -1.0, 1)
        with pytest.raises(ConfigError, match="count"):
            step_for("poisson", 60, 4, 1.0, True)  # type: ignore[arg-type]


def test_counter_seeded_draws_are_their_own_whatever_is_drawn_between() -> None:
    """A message-only client's batch-size draws (one shared generator, reseeded per draw) do
    not depend on other streams' draws between them, and a bad counter is refused."""
    import torch

    from fedsim.runtime.rng import CounterSeededTorch, counter_seed

    def uniforms(generator: torch.Generator) -> list[float]:
        return torch.rand(3, generator=generator, dtype=torch.float64).tolist()

    one, other = CounterSeededTorch(5), CounterSeededTorch(6)
    alone = [one.draw(c, uniforms) for c in range(6)]
    mixed = []
    for c in range(6):
        other.draw(c, uniforms)
        mixed.append(one.draw(c, uniforms))
    assert mixed == alone
    assert alone[0] == uniforms(torch.Generator().manual_seed(counter_seed(5, 0)))
    assert len({tuple(a) for a in alone}) == 6
    assert alone != [other.draw(c, uniforms) for c in range(6)]
    with pytest.raises(ValueError, match="counter"):
        counter_seed(5, -1)


def test_clients_share_their_exposure_where_it_is_equal() -> None:
    from fedsim.runtime.actors.exposure import ClientExposure, client_exposure

    loaded = parse_scenario(scenario())
    ids = [f"c{i}" for i in range(4)]
    shared = [client_exposure(loaded, ids, client_id) for client_id in ids]
    assert all(e is shared[0] for e in shared)
    assert shared[0] == ClientExposure(timing=loaded.privacy.timing)
    inviting = parse_scenario(scenario(**{"server.participation": 0.5}))
    own = [client_exposure(inviting, ids, client_id) for client_id in ids]
    assert [e.invitation_index for e in own] == [0, 1, 2, 3]
    assert client_exposure(inviting, ids, "c2") is own[2]



def test_a_simulation_draws_the_same_speeds_with_its_streams_parked(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Populations above LIVE_SPEED_STREAMS_UP_TO park their clients' speed streams: a run
    with them parked writes the same files as one with each client's own generator."""
    from fedsim.runtime.simulated import memory, simulation
    from fedsim.runtime.simulated.simulation import run_scenario

    assert not memory.speed_streams_parked(memory.LIVE_SPEED_STREAMS_UP_TO)
    assert memory.speed_streams_parked(memory.LIVE_SPEED_STREAMS_UP_TO + 1)
    outputs = {}
    for parked in (False, True):
        monkeypatch.setattr(simulation, "speed_streams_parked", lambda clients, p=parked: p)
        out = tmp_path / f"parked-{parked}"
        run_scenario(LoadedScenario(parse_scenario(scenario()), None), out)
        outputs[parked] = {name: (out / name).read_bytes()
                           for name in ("clients.csv", "metrics.jsonl", "summary.json")}
    assert outputs[True] == outputs[False]
    assert outputs[False]["clients.csv"].count(b"\n") == 5  # a header and four clients
