"""The interrupt rule in whole runs and in the actor: ``switch`` splits rounds at w-hat's
arrival (deterministically), ``snapshot`` does not, privacy is the same under both."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from fedsim.config import LoadedScenario, parse_scenario
from fedsim.protocol.messages import GlobalModel
from fedsim.runtime.actors.client import ClientActor
from fedsim.runtime.actors.exposure import ClientExposure
from fedsim.runtime.simulated.kernel import VirtualClock, run_virtual
from fedsim.runtime.simulated.simulation import run_scenario
from tests.doubles import FreeLedger, RecordingEndpoint

torch.set_num_threads(1)


def _scenario(interrupt: str | None = None, **server: Any) -> dict[str, Any]:
    groups = [
        {"name": "fast", "count": 3, "data_share": 0.4, "batch_size": 12, "clip": 1.0,
         "noise": 1.2, "local_lr": 0.5, "rounds": 14, "speed": {"kind": "uniform", "low": 0.01,
                                                                "high": 0.02}},
        {"name": "slow", "count": 3, "data_share": 0.6, "batch_size": 16, "clip": 1.0,
         "noise": 1.2, "local_lr": 0.5, "rounds": 5, "local_steps": 2,
         "speed": {"kind": "uniform", "low": 0.04, "high": 0.09}},
    ]
    if interrupt is not None:
        for group in groups:
            group["interrupt"] = interrupt
    return {
        "name": "interrupt", "seed": 2, "stop": {"virtual_seconds": 16.0},
        "dataset": {"name": "synthetic", "num_samples": 900, "num_test_samples": 200,
                    "num_features": 8, "num_classes": 3},
        "model": {"name": "mlp", "options": {"hidden": [8]}},
        "clients": {"groups": groups},
        "server": {"window": 0.5, **server},
        "network": {"downlink": {"latency": {"kind": "uniform", "low": 0.0, "high": 0.2}}},
    }


def _run(data: dict[str, Any], out: Path, **kwargs: Any):
    return run_scenario(LoadedScenario(parse_scenario(data), None), out, **kwargs)


def test_switch_is_the_default_deterministic_and_costs_what_snapshot_costs(tmp_path: Path) -> None:
    default = _run(_scenario(), tmp_path / "default")
    again = _run(_scenario("switch"), tmp_path / "again")
    snapshot = _run(_scenario("snapshot"), tmp_path / "snapshot")
    switched = sum(c.actor.switched_rounds for c in default.clients.values())
    assert switched > 0  # slow rounds span broadcasts
    assert sum(c.actor.switched_rounds for c in snapshot.clients.values()) == 0
    np.testing.assert_array_equal(default.final_params, again.final_params)
    assert (tmp_path / "default" / "metrics.jsonl").read_bytes() == \
        (tmp_path / "again" / "metrics.jsonl").read_bytes()
    assert not np.array_equal(default.final_params, snapshot.final_params)
    # Privacy is unchanged: the same rounds, the same events, the same eps per client.
    assert (tmp_path / "default" / "clients.csv").read_text() == \
        (tmp_path / "snapshot" / "clients.csv").read_text()
    # Under virtual time no computed round is split later (the batcher's horizon holds).
    timing = json.loads((tmp_path / "default" / "timing.json").read_text())
    assert timing["rounds_recomputed"] == 0 and timing["rounds_batched"] > 0


def test_switch_gives_the_same_run_batched_or_alone(tmp_path: Path) -> None:
    """Rounds held back by the horizon and split rounds' segments as jobs of a pass: the same
    run as every round computed alone, up to float summation order."""
    batched = _run(_scenario("switch"), tmp_path / "b")
    alone = _run(_scenario("switch"), tmp_path / "a", batch_rounds=False)
    np.testing.assert_allclose(batched.final_params, alone.final_params, atol=2e-4)
    assert [m["applied"] for m in batched.metrics] == [m["applied"] for m in alone.metrics]


class _Round:
    """A begun round that records the switches it receives."""

    def __init__(self, log: list[tuple[float, float]], clock: VirtualClock,
                 points: int) -> None:
        self.log, self.clock, self.ends_at, self.sample_grads = log, clock, None, 10
        self.computed, self.dirty, self.points = 0, True, points
        self.advanced: list[tuple[float, float]] = []

    def keep_sums(self) -> int:  # like PendingRound: its split points a round
        return self.points

    def advance(self, upto: float) -> None:  # like PendingRound: a part computed, paced
        self.advanced.append((round(self.clock.now(), 9), upto))

    def switch(self, fraction: float, params: np.ndarray) -> None:
        self.log.append((round(fraction, 9), float(params[0])))
        self.dirty = True

    def result(self):  # like PendingRound: computed once, again only after a switch
        from fedsim.training.rounds import RoundResult
        self.computed += self.dirty
        self.dirty = False
        return RoundResult(np.zeros(2, np.float32), [], [10], 1.0, 1.0, 0.0, 10)

    def cancel(self) -> None:
        pass


class _Trainer:
    def __init__(self, log: list[tuple[float, float]], clock: VirtualClock,
                 points: int = 0) -> None:
        self.log, self.clock, self.rounds = log, clock, []
        self.points = points

    def planned_steps(self, round_index: int) -> list:
        return []

    def begin_round(self, params: np.ndarray, round_index: int) -> _Round:
        self.rounds.append(_Round(self.log, self.clock, self.points))
        return self.rounds[-1]


@pytest.mark.parametrize("rule", ["switch", "snapshot"])
@pytest.mark.parametrize("pad_release", [False, True])
@pytest.mark.parametrize("kept", [False, True])
def test_the_actor_splits_a_round_at_the_arrival_fraction(rule: str, pad_release: bool,
                                                          kept: bool) -> None:
    """Rounds of 10 x 0.1 s = 1 s; globals at t = 0, 0.25 (round 0 at 1/4), and at 2/10 and
    6/10 of round 1. With pad_release a round that keeps no sums is computed at once, again
    whole at each split, and released at the first point of the public schedule a whole slot
    after the split (however long its realised batch takes to recompute within that slot):
    round 0 at 2.0, round 1 (from 2.0, split at 2.6) at 4.0. A round that keeps its sums is
    computed paced, an eighth at a time, and takes each w-hat from the first eighth after its
    arrival (1/4 -> 3/8, 2/10 -> 2/8, 6/10 -> 5/8), computed once, on time, as is every
    unpadded round (split at the arrival itself)."""
    import asyncio

    padded_switch = pad_release and rule == "switch" and not kept
    second = 2.0 if padded_switch else 1.0  # when round 1 begins

    async def main(clock: VirtualClock) -> tuple[list, list, list, int]:
        log: list[tuple[float, float]] = []
        trainer = _Trainer(log, clock, 8 if kept else 0)
        arrivals = [(0.0, GlobalModel(1, np.zeros(2, np.float32))),
                    (0.25, GlobalModel(2, np.full(2, 2.0, np.float32))),
                    (second + 0.2, GlobalModel(3, np.full(2, 3.0, np.float32))),
                    (second + 0.6, GlobalModel(4, np.full(2, 4.0, np.float32)))]
        endpoint = RecordingEndpoint(clock)
        actor = ClientActor("c1", clock=clock, endpoint=endpoint, trainer=trainer,
                            ledger=FreeLedger(), local_lr=0.1, batch_size=10,
                            seconds_per_sample=lambda: 0.1, max_rounds=2, interrupt=rule,
                            exposure=ClientExposure(pad_release=pad_release),
                            status_epsilon=lambda: (0.0, 1e-5))
        feeder = asyncio.create_task(endpoint.feed(arrivals))
        await actor.run()
        await feeder
        return (log, [m.sent_at for _, m in endpoint.updates()],
                [r.computed for r in trainer.rounds], actor.split_delays)

    log, sent, computed, split_delays = run_virtual(main)
    assert sent == pytest.approx([2.0, 4.0] if padded_switch else [1.0, 2.0])
    # counted, for the deployed run's summary (the simulation's release is not moved)
    assert split_delays == (2 if padded_switch else 0)
    if rule == "snapshot":
        assert log == [] and computed == [1, 1]
    else:
        assert log == ([(0.375, 2.0), (0.375, 3.0), (0.875, 4.0)] if pad_release and kept
                       else [(0.25, 2.0), (0.2, 3.0), (0.6, 4.0)])
        assert computed == ([2, 3] if padded_switch else [1, 1])


@pytest.mark.parametrize(("arrival", "split"), [(0.3, 0.5), (0.5, 0.75), (0.6, 0.875),
                                              (0.66, None), (0.9, None)])
def test_a_paced_round_takes_a_w_hat_from_the_first_eighth_after_it(
        arrival: float, split: float | None) -> None:
    """A padded round that keeps its sums is computed an eighth at a time, part k (the records
    due before (k+1)/8) at 3/4 * k/8 of the slot: a w-hat splits it from the first part that
    starts after its arrival, which no part computed yet holds (none after the last part's
    start, 21/32: that model is the next round's, counted in ``late_models``). The round is
    computed once and released at the slot's end; nothing is counted as moved or overrun."""
    import asyncio

    async def main(clock: VirtualClock) -> tuple[list[float], list, int, int, _Round]:
        log: list[tuple[float, float]] = []
        trainer = _Trainer(log, clock, 8)
        endpoint = RecordingEndpoint(clock)
        actor = ClientActor("c1", clock=clock, endpoint=endpoint, trainer=trainer,
                            ledger=FreeLedger(), local_lr=0.1, batch_size=10,
                            seconds_per_sample=lambda: 0.1, max_rounds=1, interrupt="switch",
                            exposure=ClientExposure(pad_release=True),
                            status_epsilon=lambda: (0.0, 1e-5))
        feeder = asyncio.create_task(endpoint.feed(
            [(0.0, GlobalModel(1, np.zeros(2, np.float32))),
             (arrival, GlobalModel(2, np.ones(2, np.float32)))]))
        await actor.run()
        await feeder
        return ([m.sent_at for _, m in endpoint.updates()], log, actor.split_delays,
                actor.timing_overruns, trainer.rounds[0], actor.late_models)

    sent, log, split_delays, overruns, begun, late = run_virtual(main)
    assert sent == pytest.approx([1.0])
    assert (split_delays, overruns, begun.computed) == (0, 0, 1)
    # A w-hat after the last part's start (within the slot) is counted: a simulation splits
    # the round at it, a paced deployed round takes it in the next round.
    assert late == (1 if split is None else 0)
    assert begun.advanced == [(round(0.75 * k / 8, 9), (k + 1) / 8) for k in range(8)]
    assert log == ([] if split is None or split >= 1.0 else [(split, 1.0)])


def test_the_runtime_writes_nothing_onto_the_training_rounds(tmp_path: Path) -> None:
    """The batcher's hold on splittable rounds comes from the runtime's own record (its round
    schedule: the actor's split deadline, the client's trainer), not from attributes the
    runtime sets on training objects (issue 28, item 6): a round keeps exactly the attributes
    its trainer gave it, and the hold still works (no round computed twice)."""
    from fedsim.training.rounds import PendingRound

    begun: list[Any] = []

    class Recording:
        def __init__(self, inner: Any) -> None:
            self.inner = inner

        def planned_steps(self, round_index: int) -> Any:
            return self.inner.planned_steps(round_index)

        def begin_round(self, params: Any, round_index: int) -> Any:
            pending = self.inner.begin_round(params, round_index)
            begun.append((pending, set(vars(pending))))
            return pending

    result = _run(_scenario("switch"), tmp_path / "run",
                  wrap_trainer=lambda plan, trainer: Recording(trainer))
    rounds = [(p, names) for p, names in begun if isinstance(p, PendingRound)]
    assert rounds and sum(c.actor.switched_rounds for c in result.clients.values()) > 0
    for pending, names in rounds:
        assert set(vars(pending)) == names
        assert not {"ends_at", "owner"} & set(vars(pending))
    timing = json.loads((tmp_path / "run" / "timing.json").read_text())
    assert timing["rounds_recomputed"] == 0 and timing["rounds_batched"] > 0


def test_a_server_sending_models_cannot_lengthen_a_paced_rounds_compute() -> None:
    """An attacker's review (session 58): when a split had the rest of a deployed round
    computed again, a server sending a model every 20 ms made the compute grow with the
    realised batch, and learnt its size from whether the release overran. Paced, a real
    round under 50 models a slot computes each of its records exactly once, takes the models
    from their next parts, and is released at its slot's end."""
    import asyncio

    from fedsim.training.kept_sums import RoundSums
    from tests.training.test_kept_sums import _models, _trainer

    model, ws = _models(5)
    trainer = _trainer(model, sampling="poisson", local_steps=1, adaptive=False)

    async def main(clock: VirtualClock) -> tuple[list[float], ClientActor, list]:
        begun: list = []

        class Keeping:
            def planned_steps(self, round_index: int) -> list:
                return trainer.planned_steps(round_index)

            def begin_round(self, params: np.ndarray, round_index: int) -> Any:
                begun.append(trainer.begin_round(params, round_index))
                return begun[-1]

        endpoint = RecordingEndpoint(clock)
        actor = ClientActor("c1", clock=clock, endpoint=endpoint, trainer=Keeping(),
                            ledger=FreeLedger(), local_lr=0.1, batch_size=20,
                            seconds_per_sample=lambda: 0.05, max_rounds=1, interrupt="switch",
                            exposure=ClientExposure(pad_release=True),
                            status_epsilon=lambda: (0.0, 1e-5))
        arrivals = [(0.0, GlobalModel(1, ws[0]))] + [
            (0.02 * k, GlobalModel(1 + k, ws[1 + k % 3])) for k in range(1, 50)]
        feeder = asyncio.create_task(endpoint.feed(arrivals))
        await actor.run()
        await feeder
        return [m.sent_at for _, m in endpoint.updates()], actor, begun

    sent, actor, begun = run_virtual(main)
    sums = begun[0].kept
    assert isinstance(sums, RoundSums)
    assert sent == pytest.approx([1.0]) and actor.timing_overruns == 0
    # 32 splits (the models before the last part's start, 21/32), each from a later part
    assert actor.switched_rounds == 32 and len(begun[0].segments) == 8
    assert sums.records_computed == begun[0].sample_grads > 0


def test_a_w_hat_at_a_paced_points_own_instant_reaches_no_computed_part() -> None:
    """An attacker's aim: a model arriving at the very instant a part begins (start + slot *
    3/4 * k/8, which float rounding can put a hair before that part's start: 0.1 + 0.3 *
    0.75/8 reads as 0.9999999999999994 parts) must not split the round at the part already
    computing; it takes effect from the next one, as exact arithmetic says."""
    from fedsim.runtime.actors.round_timing import RoundTiming

    class Begun:
        sample_grads = 10
        splits: list[float] = []

        def switch(self, fraction: float, params: np.ndarray) -> None:
            self.splits.append(fraction)

    begun = Begun()
    timing = RoundTiming(begun, 0.1, 0.3)  # type: ignore[arg-type]
    timing.points = 8
    # at part 1's start itself (records due in [1/8, 2/8)): it has begun, the next is 2/8
    assert timing.split(0.1 + 0.3 * 0.75 * 1 / 8, np.zeros(2, np.float32))
    # a hair before part 2's start: from part 2 on
    assert timing.split(np.nextafter(0.1 + 0.3 * 0.75 * 2 / 8, 0.0), np.zeros(2, np.float32))
    assert begun.splits == [2 / 8, 2 / 8]


@pytest.mark.parametrize(("min_part", "parts"), [(0.0, 8), (0.2, 3), (1.0, 1)])
def test_a_short_slot_is_paced_in_fewer_parts(min_part: float, parts: int) -> None:
    """A deployed client gives each part of a paced round at least MIN_PART_WALL_SECONDS of
    wall time (in scenario seconds, min_part_seconds): a 1 s slot's three quarters make 3
    parts of at least 0.2 s, or one part of at least 1 s (computed at once when the round
    begins; a model arriving in it is the next round's)."""
    import asyncio

    async def main(clock: VirtualClock) -> tuple[list[float], _Round]:
        trainer = _Trainer([], clock, 8)
        endpoint = RecordingEndpoint(clock)
        actor = ClientActor("c1", clock=clock, endpoint=endpoint, trainer=trainer,
                            ledger=FreeLedger(), local_lr=0.1, batch_size=10,
                            seconds_per_sample=lambda: 0.1, max_rounds=1, interrupt="switch",
                            exposure=ClientExposure(pad_release=True, min_part_seconds=min_part),
                            status_epsilon=lambda: (0.0, 1e-5))
        feeder = asyncio.create_task(endpoint.feed(
            [(0.0, GlobalModel(1, np.zeros(2, np.float32))),
             (0.3, GlobalModel(2, np.ones(2, np.float32)))]))
        await actor.run()
        await feeder
        return [m.sent_at for _, m in endpoint.updates()], trainer.rounds[0]

    sent, begun = run_virtual(main)
    assert sent == pytest.approx([1.0])
    assert begun.advanced == [(round(0.75 * k / parts, 9), (k + 1) / parts) for k in range(parts)]
    assert begun.log == ([] if parts == 1 else [(round((1 + 0.3 // (0.75 / parts)) / parts, 9),
                                                  1.0)])


def test_a_cancelled_actor_ends_only_after_its_worker_threads_compute() -> None:
    """A deployed round computes in a worker thread, which a crash or a signal cannot stop:
    the actor's task ends only once that compute has, so a rejoined incarnation never shares
    the trainer with it (its buffers, its generator)."""
    import asyncio
    import threading
    import time

    from fedsim.runtime.actors.round_timing import RoundTiming

    finished = threading.Event()

    def work() -> int:
        time.sleep(0.3)
        finished.set()
        return 1

    async def main() -> bool:
        timing = RoundTiming(None, 0.0, 1.0)  # type: ignore[arg-type]
        task = asyncio.get_running_loop().create_task(timing._in_worker(True, work))
        await asyncio.sleep(0.05)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        return finished.is_set()

    assert asyncio.run(main())


def test_adaptive_clipping_under_crashes_is_the_same_batched_or_alone(tmp_path: Path) -> None:
    """A batcher computes a round when a pass takes it, possibly before its end; a crash then
    cancels it uncharged. The norm its compute moved goes back (PendingRound.cancel), so the
    clips a client releases do not depend on the grouping (a review: 227 of 486 cancelled
    rounds had moved it, and batched runs differed from rounds computed alone)."""
    data = _scenario("switch")
    for group in data["clients"]["groups"]:
        group["adaptive_clip"] = {"count_noise_std": 1.5, "learning_rate": 0.5}
        group["availability"] = {"crashes": {"every": {"kind": "exponential", "mean": 0.6},
                                             "rejoin_after": 0.2}}
    batched = _run(data, tmp_path / "b")
    alone = _run(data, tmp_path / "a", batch_rounds=False)
    assert sum(c.crashes for c in batched.clients.values()) > 20
    for got, want in zip(batched.client_rows, alone.client_rows, strict=True):
        assert got["client_id"] == want["client_id"]
        assert got["clip"] == pytest.approx(want["clip"], rel=1e-5), got["client_id"]
    np.testing.assert_allclose(batched.final_params, alone.final_params, atol=2e-4)
