"""The server's seat (issue 15): what a client sends must not depend on its exact data set
size N beyond the mechanism's output, its timing must follow public values, and a client the
server did not invite neither trains nor spends.

Every message is taken as the server gets it: encoded and decoded by the wire codec.
"""

from __future__ import annotations

import asyncio
import dataclasses
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from fedsim.config import LoadedScenario, parse_scenario
from fedsim.protocol.messages import ClientStatus, ClientUpdate, GlobalModel
from fedsim.runtime.actors.client import ClientActor
from fedsim.runtime.actors.exposure import (
    ClientExposure,
    client_exposure,
    invitation_bits,
    is_invited,
    release_time,
)
from fedsim.runtime.assembly import make_client_actor, open_ledger
from fedsim.runtime.population import build_population, client_ids
from fedsim.runtime.rng import SeedTree
from fedsim.runtime.simulated.kernel import VirtualClock, run_virtual
from fedsim.runtime.simulated.simulation import run_scenario
from tests.doubles import FreeLedger, RecordingEndpoint

torch.set_num_threads(1)


def _scenario(**privacy: Any) -> dict[str, Any]:
    return {
        "name": "exposure", "seed": 11, "stop": {"windows": 40},
        "dataset": {"name": "synthetic", "num_samples": 800, "num_test_samples": 100,
                    "num_features": 6, "num_classes": 3},
        "model": {"name": "logreg"},
        "clients": {"groups": [
            {"name": "p", "count": 1, "data_share": 0.5, "batch_size": 12, "sampling": "poisson",
             "clip": 1.0, "noise": 1.0, "local_lr": 0.5, "rounds": 8, "local_steps": 2,
             "speed": {"kind": "uniform", "low": 0.01, "high": 0.03},
             "budget": {"epsilon": 50.0, "delta": 1e-5}},
        ]},
        "server": {"window": 1.0},
        "privacy": privacy,
    }


def _wire_messages(tmp_path: Path, data: dict[str, Any], *, extra_records: int) -> list:
    """Run the scenario's one client holding its declared records plus ``extra_records``
    more (a neighbouring data set) and return what the server received."""
    loaded = LoadedScenario(parse_scenario(data), None)
    population = build_population(loaded)
    plan = population.plans[0]
    unused = np.setdiff1d(np.arange(len(population.train_y)), plan.indices)
    held = dataclasses.replace(
        plan, indices=np.sort(np.concatenate([plan.indices, unused[:extra_records]])),
        declared_samples=plan.num_samples)
    assert held.num_samples == plan.num_samples + extra_records
    trainer = population.trainer(held)
    ledger = open_ledger(held, tmp_path / f"ledger-{extra_records}.jsonl")

    async def main(clock: VirtualClock) -> RecordingEndpoint:
        endpoint = RecordingEndpoint(clock, wire=True)
        actor = make_client_actor(
            held, clock=clock, endpoint=endpoint, trainer=trainer, ledger=ledger,
            speed_rng=population.tree.numpy("client", held.client_id, "speed"),
            delta=1e-5,
            exposure=client_exposure(loaded.scenario, client_ids(loaded.scenario),
                                     held.client_id))
        endpoint.inbox.put_nowait(GlobalModel(1, population.initial_params.copy(), 0.0, 1))
        await asyncio.wait_for(actor.run(), timeout=1000)
        return endpoint

    endpoint = run_virtual(main)
    ledger.close()
    return endpoint.published


def _differences(a: list, b: list) -> list[str]:
    """Every field in which the two runs' wire messages differ, the noised delta excepted."""
    if len(a) != len(b):
        return [f"{len(a)} messages against {len(b)}"]
    found = []
    for index, ((time_a, first), (time_b, second)) in enumerate(zip(a, b, strict=True)):
        if type(first) is not type(second):
            found.append(f"message {index}: {type(first).__name__} / {type(second).__name__}")
            continue
        if time_a != time_b:
            found.append(f"message {index}: left at {time_a} / {time_b}")
        for field in dataclasses.fields(first):
            # The noised delta, and its norm (computed from it by the decoder, not sent).
            if isinstance(first, ClientUpdate) and field.name in ("delta", "norm"):
                assert first.delta.shape == second.delta.shape
                continue
            if getattr(first, field.name) != getattr(second, field.name):
                found.append(f"message {index} {field.name}: {getattr(first, field.name)!r} / "
                             f"{getattr(second, field.name)!r}")
    return found


def test_a_poisson_client_with_n_and_n_plus_1_records_sends_the_same_messages(
    tmp_path: Path,
) -> None:
    """Add/remove neighbours: N and N+1 records. Same seed, so any field that differs (the
    size itself, the eps of q = m/N, a send time that follows the realised batch) is a
    release outside the mechanism."""
    data = _scenario()
    with_n = _wire_messages(tmp_path / "n", data, extra_records=0)
    with_n1 = _wire_messages(tmp_path / "n1", data, extra_records=1)
    updates = [m for _, m in with_n if isinstance(m, ClientUpdate)]
    assert len(updates) == 8 and isinstance(with_n[-1][1], ClientStatus)
    assert _differences(with_n, with_n1) == []
    # The deltas do differ (another data set, another batch): only the mechanism shows it.
    assert any(not np.array_equal(u.delta, v.delta) for u, v in zip(
        updates, [m for _, m in with_n1 if isinstance(m, ClientUpdate)], strict=True))
    # The statuses' eps comes from public parameters only: the declared N's q.
    assert with_n[-1][1].epsilon == with_n1[-1][1].epsilon > 0


def test_realised_timing_reveals_the_batch_size_and_is_marked(tmp_path: Path) -> None:
    """The explicit realistic-timing option: the send times now follow the realised batch,
    which is why it is not the default (and the attack above has teeth)."""
    data = _scenario(timing="realised")
    differences = _differences(_wire_messages(tmp_path / "n", data, extra_records=0),
                               _wire_messages(tmp_path / "n1", data, extra_records=1))
    assert differences and all("left at" in d or "sent_at" in d for d in differences)
    run = run_scenario(LoadedScenario(parse_scenario(data), None), tmp_path / "run")
    assert any("NOT COVERED BY THE ACCOUNTANT" in c for c in run.summary["privacy"]["caveats"])
    # The explanation every command prints (run, launch, report) counts and states them.
    assert "1 privacy caveat(s) qualify these eps values: (1) " in run.summary["explanation"]
    public = run_scenario(LoadedScenario(parse_scenario(_scenario()), None), tmp_path / "public")
    assert public.summary["privacy"]["caveats"] == []
    assert "caveat" not in public.summary["explanation"]


class _ComputeTakesTime:
    """A wall clock stand-in: a round's compute (its ``result()``) advances time by 1 ms per
    example of the realised batch, as real compute does."""

    def __init__(self, clock: VirtualClock) -> None:
        self.clock = clock
        self.offset = 0.0

    def now(self) -> float:
        return self.clock.now() + self.offset

    async def sleep(self, seconds: float) -> None:
        await self.clock.sleep(seconds)


class _SlowRound:
    def __init__(self, clock: _ComputeTakesTime, size: int) -> None:
        self.clock, self.sample_grads = clock, size

    def result(self) -> Any:
        from fedsim.training.rounds import RoundResult

        self.clock.offset += 0.001 * self.sample_grads
        return RoundResult(np.zeros(3, np.float32), [], [self.sample_grads], 1.0, 1.0, 0.0,
                           self.sample_grads)

    def keep_sums(self) -> int:  # no global model arrives mid-round here
        return 0

    def cancel(self) -> None:
        pass


@pytest.mark.parametrize("sizes", [[3, 30, 12, 0], [25, 1, 40, 7]])
def test_a_deployed_client_releases_on_the_public_schedule_whatever_its_batch(sizes) -> None:
    """pad_release (wall-clock runtimes): the compute runs inside the slot of the expected
    batch and the update leaves at its end, so send times do not depend on the batch."""

    class Trainer:
        def __init__(self, clock: _ComputeTakesTime) -> None:
            self.clock, self.sizes = clock, list(sizes)

        def planned_steps(self, round_index: int) -> list:
            return []

        def begin_round(self, params: np.ndarray, round_index: int) -> _SlowRound:
            return _SlowRound(self.clock, self.sizes[round_index])

    async def main(clock: VirtualClock) -> list[float]:
        wall = _ComputeTakesTime(clock)
        endpoint = RecordingEndpoint(clock, wire=True)
        actor = ClientActor(
            "c1", clock=wall, endpoint=endpoint, trainer=Trainer(wall), ledger=FreeLedger(),
            local_lr=0.1, batch_size=10, seconds_per_sample=lambda: 0.01, max_rounds=len(sizes),
            exposure=ClientExposure(pad_release=True), status_epsilon=lambda: (0.0, 1e-5))
        endpoint.inbox.put_nowait(GlobalModel(1, np.zeros(3, np.float32)))
        await actor.run()
        assert actor.timing_overruns == 0
        return [m.sent_at for _, m in endpoint.published if isinstance(m, ClientUpdate)]

    # Slot: 0.01 s x 10 expected examples; each round ends at 0.1 s, 0.2 s, ... exactly.
    assert run_virtual(main) == pytest.approx([0.1, 0.2, 0.3, 0.4], abs=1e-9)


def test_release_schedule_and_invitation_bitmaps() -> None:
    assert release_time(2.0, 0.5, 2.3) == 2.5
    assert release_time(2.0, 0.5, 2.5) == 2.5
    assert release_time(2.0, 0.5, 2.6) == 3.0  # an overrun waits for the next slot
    assert release_time(2.0, 0.0, 2.6) == 2.6  # no schedule without a cost
    ids = [f"c{i:02d}" for i in range(11)]
    bits = invitation_bits(ids, ["c00", "c09", "c10"])
    assert bits == bytes([0b00000001, 0b00000110])
    assert [i for i in range(11) if is_invited(bits, i)] == [0, 9, 10]
    assert not is_invited(bits, 64) and is_invited(None, 5)


def _invited_run(tmp_path: Path, participation: float):
    data = _scenario()
    data["clients"]["groups"][0].update(count=4, data_share=1.0, rounds=None,
                                        staleness={"max_versions_behind": 1})
    data["server"].update(participation=participation, max_staleness=2)
    data["stop"] = {"windows": 20}
    return run_scenario(LoadedScenario(parse_scenario(data), None), tmp_path, keep_history=True)


def test_uninvited_clients_neither_train_nor_spend(tmp_path: Path) -> None:
    """participation 0.5: every round a client paid for is one it was invited to, and none
    is rejected after release (on main: about half of all spent rounds were rejected)."""
    invited = _invited_run(tmp_path / "half", 0.5)
    everyone = _invited_run(tmp_path / "all", 1.0)
    updates = invited.summary["updates"]
    assert updates["rejected"] == 0 and updates["applied"] > 0
    # The server's draws, replayed from its own generator: window w's invitees.
    ids = sorted(invited.clients)
    rng = SeedTree(11).numpy("server", "participation")
    invitees = {w: {ids[i] for i in rng.choice(4, size=2, replace=False)} for w in range(1, 22)}
    total = 0
    for client_id, client in invited.clients.items():
        released = client.released_rounds()
        with open_ledger(client.plan, tmp_path / "half" / "ledgers" / f"{client_id}.jsonl") as ledger:
            assert sorted({r.round for r in ledger.records}) == [r.round for r in released]
        for record in released:
            assert client_id in invitees[record.window], (client_id, record)
        total += len(released)
    # Half the clients per window train: about half the spending of a full-participation run.
    full = sum(len(c.released_rounds()) for c in everyone.clients.values())
    assert 0.3 * full < total < 0.7 * full
