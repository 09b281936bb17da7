"""The server's (and the broker's) seat, below the messages: while a deployed client computes
a round, its event loop keeps running its connection (PUBACKs of received models, keepalive
pings, resends, receipts). If the compute blocked the loop, each of those would leave at the
end of the compute, whose length is speed x the *realised* Poisson batch size: the release
padding would hide the batch in the update's send time and reveal it in every other packet.
"""

from __future__ import annotations

import asyncio
import threading
import time
from typing import Any

import numpy as np
import pytest

from fedsim.clock import ScaledClock
from fedsim.protocol.messages import ClientUpdate, GlobalModel
from fedsim.runtime.actors.client import ClientActor
from fedsim.runtime.actors.exposure import ClientExposure
from tests.doubles import FreeLedger, RecordingEndpoint

COMPUTE_SECONDS = 0.6  # the blocking compute of the one round (a real round holds the CPU)


def client_exposure_is_threaded() -> bool:
    """What the deployed client process uses (fedsim.runtime.deployed.client_process)."""
    from fedsim.config import parse_scenario
    from fedsim.runtime.actors.exposure import client_exposure

    scenario = parse_scenario({
        "name": "t", "seed": 1, "stop": {"windows": 1},
        "dataset": {"name": "synthetic", "num_samples": 100, "num_test_samples": 10,
                    "num_features": 4, "num_classes": 2},
        "model": {"name": "logreg"},
        "clients": {"groups": [{"name": "p", "count": 1, "data_share": 1.0, "batch_size": 5, "clip": 1.0,
                                "noise": 1.0, "rounds": 1}]},
        "server": {"window": 1.0}})
    exposure = client_exposure(scenario, ["p-000"], "p-000", deployed=True)
    return exposure.pad_release and exposure.compute_in_thread


class _BlockingRound:
    sample_grads = 10

    def __init__(self, log: dict[str, float]) -> None:
        self.log = log

    def result(self) -> Any:
        from fedsim.training.rounds import RoundResult

        time.sleep(COMPUTE_SECONDS)  # holds its thread, as torch's compute does
        self.log["computed"] = time.monotonic()
        return RoundResult(np.zeros(3, np.float32), [], [10], 1.0, 1.0, 0.0, 10)

    def keep_sums(self) -> int:  # no global model arrives mid-round here
        return 0

    def cancel(self) -> None:
        pass


class _Trainer:
    def __init__(self, log: dict[str, float]) -> None:
        self.log = log

    def planned_steps(self, round_index: int) -> list:
        return []

    def begin_round(self, params: np.ndarray, round_index: int) -> _BlockingRound:
        self.log["begun"] = time.monotonic()
        return _BlockingRound(self.log)


def test_a_deployed_round_does_not_block_the_event_loop() -> None:
    assert client_exposure_is_threaded()
    log: dict[str, float] = {}
    ticks: list[float] = []

    async def connection_housekeeping() -> None:  # stands for paho's network loop
        while "computed" not in log:
            ticks.append(time.monotonic())
            await asyncio.sleep(0.02)

    async def main() -> list[ClientUpdate]:
        endpoint = RecordingEndpoint()
        actor = ClientActor(
            "c1", clock=ScaledClock(1.0), endpoint=endpoint, trainer=_Trainer(log),
            ledger=FreeLedger(), local_lr=0.1, batch_size=10,
            seconds_per_sample=lambda: 2 * COMPUTE_SECONDS / 10, max_rounds=1,
            exposure=ClientExposure(pad_release=True, compute_in_thread=True), status_epsilon=lambda: (0.0, 1e-5))
        endpoint.inbox.put_nowait(GlobalModel(1, np.zeros(3, np.float32)))
        housekeeping = asyncio.create_task(connection_housekeeping())
        await asyncio.wait_for(actor.run(), 30)
        housekeeping.cancel()
        return [m for _, m in endpoint.updates()]

    updates = asyncio.run(main())
    assert len(updates) == 1
    during = [t for t in ticks if log["begun"] < t < log["computed"]]
    # Ticks every 20 ms during a 600 ms compute: on main none ran (the loop was blocked).
    assert len(during) >= 3, f"{len(during)} event-loop turns during the compute"


class _SwitchableRound:
    """A round computed in a worker thread that a w-hat may split: the split must wait until
    the thread is done reading the round, then the round is computed again."""

    sample_grads = 10

    def __init__(self) -> None:
        self.computing = False
        self.splits: list[tuple[float, float]] = []  # (fraction, w-hat's first value)
        self.computed: list[int] = []  # the splits each computation saw
        self.split_while_computing = False
        self.started = threading.Event()  # set once the (first) computation is under way

    def result(self) -> Any:
        from fedsim.training.rounds import RoundResult

        self.computing = True
        self.started.set()
        time.sleep(COMPUTE_SECONDS / 2)
        seen = len(self.splits)
        time.sleep(COMPUTE_SECONDS / 2)
        self.computing = False
        self.computed.append(seen)
        return RoundResult(np.full(3, float(seen), np.float32), [], [10], 1.0, 1.0, 0.0, 10)

    def switch(self, fraction: float, params: np.ndarray) -> None:
        self.split_while_computing |= self.computing
        self.splits.append((fraction, float(params[0])))

    def keep_sums(self) -> int:  # none kept: a split moves the release a slot on
        return 0

    def cancel(self) -> None:
        pass


@pytest.mark.slow
def test_a_w_hat_during_a_threaded_compute_splits_the_round_after_it() -> None:
    """interrupt = switch on a deployed client: a global model arriving while the worker
    thread computes is applied when the thread returns (never under it), the round is
    computed again at once with the split, and that result is what leaves."""
    round_ = _SwitchableRound()

    class Trainer(_Trainer):
        def begin_round(self, params: np.ndarray, round_index: int) -> _SwitchableRound:
            return round_

    async def main() -> list[ClientUpdate]:
        endpoint = RecordingEndpoint()
        actor = ClientActor(
            "c1", clock=ScaledClock(1.0), endpoint=endpoint, trainer=Trainer({}),
            ledger=FreeLedger(), local_lr=0.1, batch_size=10,
            seconds_per_sample=lambda: 4 * COMPUTE_SECONDS / 10, max_rounds=1,
            exposure=ClientExposure(pad_release=True, compute_in_thread=True),
            status_epsilon=lambda: (0.0, 1e-5))
        assert actor.interrupt == "switch"
        endpoint.inbox.put_nowait(GlobalModel(1, np.zeros(3, np.float32)))
        running = asyncio.create_task(actor.run())
        # inside the first computation (its thread holds it for COMPUTE_SECONDS)
        assert await asyncio.to_thread(round_.started.wait, 30)
        assert round_.computing
        endpoint.inbox.put_nowait(GlobalModel(2, np.full(3, 7.0, np.float32)))
        await asyncio.wait_for(running, 30)
        return [m for _, m in endpoint.updates()]

    updates = asyncio.run(main())
    assert not round_.split_while_computing
    assert len(round_.splits) == 1 and round_.splits[0][1] == 7.0
    assert 0.0 < round_.splits[0][0] < 1.0  # the arrival's fraction of the round's slot
    assert round_.computed == [0, 1]  # computed again with the split
    assert len(updates) == 1 and updates[0].delta[0] == 1.0  # the second result left
