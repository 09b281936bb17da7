"""Client and server actors in isolation: interrupt-style overwrite, staleness wait, ledger
before send, de-duplication, server staleness policy, mixing. Fakes live only here."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from dataclasses import replace

import numpy as np
import pytest

from fedsim.aggregation import (
    AcceptedUpdate,
    ConfiguredWeights,
    ConstantStepSize,
    DataSizeWeights,
    InverseTimeStepSize,
    PlateauStepSize,
    UniformWeights,
    mix,
    population_weight,
)
from fedsim.errors import BudgetExhausted, ConfigError
from fedsim.privacy.events import GaussianStep
from fedsim.protocol.messages import ClientStatus, ClientUpdate, GlobalModel, Message, RunFinished
from fedsim.runtime.actors.client import ClientActor, StalenessPolicy
from fedsim.runtime.actors.exposure import is_invited
from fedsim.runtime.actors.server import ClientInfo, ServerActor
from fedsim.runtime.simulated.kernel import VirtualClock, run_virtual
from fedsim.training.rounds import DoneRound, RoundResult
from tests.doubles import RecordingEndpoint

DIM = 3
STEP = GaussianStep("poisson", 0.1, 1.0)


class FakeTrainer:
    """Update = params + 1 (so tests can tell which w a round was computed on)."""

    def __init__(self) -> None:
        self.seen: list[np.ndarray] = []

    def planned_steps(self, round_index: int) -> list[GaussianStep]:
        return [STEP]

    def begin_round(self, params: np.ndarray, round_index: int) -> DoneRound:
        self.seen.append(params.copy())
        return DoneRound(RoundResult(update=(params + 1.0).astype(np.float32), steps=[STEP],
                           batch_sizes=[10], clip=1.0, sigma=1.0, mean_loss=0.0, sample_grads=10))


class FakeLedger:
    def __init__(self, allowed: int, log: list[str]) -> None:
        self.allowed = allowed
        self.spent: list[int] = []
        self.log = log
        self.planned: list[int] = []

    def plan(self, future_rounds: Sequence[Sequence[GaussianStep]]) -> int:
        self.planned.append(len(future_rounds))
        return min(len(future_rounds), self.allowed)

    def can_spend(self, steps: Sequence[GaussianStep]) -> bool:
        return len(self.spent) < self.allowed

    def spend(self, steps: Sequence[GaussianStep], *, time: float, round: int) -> None:
        if len(self.spent) >= self.allowed:
            raise BudgetExhausted("over")
        self.log.append(f"spend {round}")
        self.spent.append(round)


def make_client(clock: VirtualClock, *, allowed: int = 100, policy: StalenessPolicy = StalenessPolicy(),
                max_rounds: int | None = None) -> tuple[ClientActor, RecordingEndpoint, FakeTrainer, FakeLedger]:
    log: list[str] = []
    endpoint, trainer, ledger = RecordingEndpoint(clock, log=log), FakeTrainer(), FakeLedger(allowed, log)
    actor = ClientActor("c1", clock=clock, endpoint=endpoint, trainer=trainer, ledger=ledger,
                        local_lr=0.5, batch_size=10,
                        seconds_per_sample=lambda: 0.1,  # a round costs 10 x 0.1 = 1 s
                        staleness=policy, max_rounds=max_rounds)
    return actor, endpoint, trainer, ledger


def test_global_model_mid_round_overwrites_w_and_the_round_continues() -> None:
    g1, g2 = np.zeros(DIM, np.float32), np.full(DIM, 10.0, np.float32)

    async def main(clock: VirtualClock):
        actor, endpoint, trainer, ledger = make_client(clock, max_rounds=2)
        endpoint.deliver_at(0.0, GlobalModel(1, g1))
        endpoint.deliver_at(0.5, GlobalModel(2, g2))  # in the middle of round 0
        await asyncio.wait_for(actor.run(), timeout=100)
        return actor, endpoint, trainer, ledger

    actor, endpoint, trainer, ledger = run_virtual(main)
    sent = endpoint.updates()
    assert [(t, m.round, m.base_version) for t, m in sent] == [(1.0, 0, 1), (2.0, 1, 2)]
    # With a round limit the actor registered its 2 remaining rounds with the ledger once.
    assert ledger.planned == [2]
    # Round 0 was computed on g1 and was not restarted: it finished at t = 1 as scheduled.
    np.testing.assert_array_equal(trainer.seen[0], g1)
    np.testing.assert_array_equal(sent[0][1].delta, g1 + 1)
    # Its update was applied on top of the new global model g2, and round 1 started from there.
    expected_w1 = (g2 - 0.5 * (g1 + 1)).astype(np.float32)
    np.testing.assert_allclose(trainer.seen[1], expected_w1)
    assert actor.held_version == 2 and actor.state == "done"


def test_older_or_equal_global_models_are_ignored() -> None:
    async def main(clock: VirtualClock):
        actor, endpoint, _, _ = make_client(clock, max_rounds=1)
        assert actor.accept_global(GlobalModel(3, np.ones(DIM, np.float32)))
        assert not actor.accept_global(GlobalModel(2, np.zeros(DIM, np.float32)))
        assert not actor.accept_global(GlobalModel(3, np.zeros(DIM, np.float32)))
        return actor

    actor = run_virtual(main)
    assert actor.held_version == 3 and actor.ignored_globals == 2
    np.testing.assert_array_equal(actor.w, np.ones(DIM))


def test_staleness_wait_for_a_fresh_global_model() -> None:
    async def main(clock: VirtualClock):
        actor, endpoint, trainer, _ = make_client(
            clock, policy=StalenessPolicy(max_versions_behind=2), max_rounds=3)
        endpoint.deliver_at(0.0, GlobalModel(1, np.zeros(DIM, np.float32)))
        endpoint.deliver_at(7.5, GlobalModel(2, np.ones(DIM, np.float32)))
        await asyncio.wait_for(actor.run(), timeout=100)
        return endpoint, trainer

    endpoint, trainer = run_virtual(main)
    # Two rounds on version 1 (t = 1, 2), then a wait until version 2 arrives at 7.5.
    assert [(t, m.round, m.base_version) for t, m in endpoint.updates()] == [
        (1.0, 0, 1), (2.0, 1, 1), (8.5, 2, 2)]
    np.testing.assert_array_equal(trainer.seen[2], np.ones(DIM))


def test_the_step_before_a_staleness_wait_is_not_made_and_nothing_reads_it() -> None:
    """The round that brings a client to its count of local rounds does not move ``w``: the
    client trains no more until a newer global model overwrites ``w``. Every round trains on
    the model the plain step would give it (rounds 1 and 3 on round 0's and round 2's steps),
    and while the client waits ``w`` holds round 0's step, where the plain path would have
    moved it by round 1's too (a model nothing reads)."""
    g1, g2 = np.zeros(DIM, np.float32), np.full(DIM, 3.0, np.float32)
    held: list[np.ndarray] = []

    async def main(clock: VirtualClock):
        actor, endpoint, trainer, _ = make_client(
            clock, policy=StalenessPolicy(max_versions_behind=2), max_rounds=4)
        endpoint.deliver_at(0.0, GlobalModel(1, g1))
        endpoint.deliver_at(7.5, GlobalModel(2, g2))

        async def watch() -> None:  # w while the client waits for version 2
            await clock.sleep(5.0)
            assert actor.w is not None
            held.append(actor.w.copy())

        watcher = asyncio.ensure_future(watch())
        await asyncio.wait_for(actor.run(), timeout=100)
        await watcher
        return endpoint, trainer

    endpoint, trainer = run_virtual(main)
    assert [(t, m.round, m.base_version) for t, m in endpoint.updates()] == [
        (1.0, 0, 1), (2.0, 1, 1), (8.5, 2, 2), (9.5, 3, 2)]
    w1 = (g1 - np.float32(0.5) * (g1 + 1)).astype(np.float32)  # round 0's step
    np.testing.assert_array_equal(trainer.seen[1], w1)
    np.testing.assert_array_equal(trainer.seen[2], g2)  # version 2 overwrote w
    np.testing.assert_array_equal(trainer.seen[3], (g2 - np.float32(0.5) * (g2 + 1)))
    # While it waited, w held round 0's step: round 1's was never made.
    np.testing.assert_array_equal(held[0], w1)


def test_distance_rule_waits_when_the_local_model_drifted() -> None:
    async def main(clock: VirtualClock):
        # One local step moves w by 0.5 * ||0 + 1|| = 0.5 * sqrt(3) ~ 0.87 > 0.5.
        actor, endpoint, _, _ = make_client(clock, policy=StalenessPolicy(max_distance=0.5),
                                            max_rounds=2)
        endpoint.deliver_at(0.0, GlobalModel(1, np.zeros(DIM, np.float32)))
        endpoint.deliver_at(4.0, GlobalModel(2, np.zeros(DIM, np.float32)))
        await asyncio.wait_for(actor.run(), timeout=100)
        return endpoint

    assert [t for t, _ in run_virtual(main).updates()] == [1.0, 5.0]


def test_a_crash_mid_round_cancels_the_round_and_charges_nothing() -> None:
    class RecordingRound:
        sample_grads = 10

        def __init__(self) -> None:
            self.cancelled = self.taken = False

        def result(self) -> RoundResult:
            self.taken = True
            raise AssertionError("a crashed round's update must not be taken")

        def cancel(self) -> None:
            self.cancelled = True

    began: list[RecordingRound] = []

    async def main(clock: VirtualClock):
        actor, endpoint, trainer, ledger = make_client(clock, max_rounds=2)
        trainer.begin_round = lambda params, round_index: began.append(RecordingRound()) or began[-1]
        endpoint.deliver_at(0.0, GlobalModel(1, np.zeros(DIM, np.float32)))
        task = asyncio.create_task(actor.run())
        await clock.sleep(0.5)  # the round's compute time (1.0) is passing: crash now
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        return endpoint, ledger

    endpoint, ledger = run_virtual(main)
    assert len(began) == 1 and began[0].cancelled and not began[0].taken
    assert ledger.spent == [] and endpoint.updates() == []


def test_ledger_is_charged_before_each_send_and_the_client_stops_at_its_budget() -> None:
    async def main(clock: VirtualClock):
        actor, endpoint, _, ledger = make_client(clock, allowed=3)
        endpoint.deliver_at(0.0, GlobalModel(1, np.zeros(DIM, np.float32)))
        await asyncio.wait_for(actor.run(), timeout=100)
        return actor, endpoint, ledger

    actor, endpoint, ledger = run_virtual(main)
    assert ledger.log == ["spend 0", "publish ClientUpdate", "spend 1", "publish ClientUpdate",
                          "spend 2", "publish ClientUpdate", "publish ClientStatus"]
    status = endpoint.published[-1][1]
    assert isinstance(status, ClientStatus) and status.state == "budget_exhausted"
    assert actor.state == "budget_exhausted" and actor.stopped_at == 3.0


class RecordingRound:
    """A begun round that says whether it was cancelled or its update taken."""

    sample_grads = 10

    def __init__(self, params: np.ndarray) -> None:
        self.params = params
        self.cancelled = self.taken = False

    def result(self) -> RoundResult:
        self.taken = True
        return RoundResult(update=(self.params + 1.0).astype(np.float32), steps=[STEP],
                           batch_sizes=[10], clip=1.0, sigma=1.0, mean_loss=0.0, sample_grads=10)

    def cancel(self) -> None:
        self.cancelled = True


def test_the_end_of_the_run_mid_round_cancels_it_uncharged_and_unreleased() -> None:
    """Round 0 is released at t = 1; round 1 begins at t = 1 and the server's end of the run
    arrives at t = 1.5, in its compute time: nothing more is charged or released."""
    began: list[RecordingRound] = []

    async def main(clock: VirtualClock):
        actor, endpoint, trainer, ledger = make_client(clock)  # no round limit, a large budget
        trainer.begin_round = lambda params, r: began.append(RecordingRound(params)) or began[-1]
        endpoint.deliver_at(0.0, GlobalModel(1, np.zeros(DIM, np.float32)))
        endpoint.deliver_at(1.5, RunFinished(1, "stop.windows reached", 1.5))
        await asyncio.wait_for(actor.run(), timeout=100)  # returns: the end is not a crash
        return actor, endpoint, ledger

    actor, endpoint, ledger = run_virtual(main)
    assert ledger.spent == [0] and [m.round for _, m in endpoint.updates()] == [0]
    assert len(began) == 2 and began[0].taken and not began[0].cancelled
    assert began[1].cancelled and not began[1].taken
    assert ledger.log == ["spend 0", "publish ClientUpdate", "publish ClientStatus"]
    when, status = endpoint.published[-1]
    assert isinstance(status, ClientStatus) and status.state == "done" and status.rounds == 1
    assert "server finished the run" in status.detail and "stop.windows reached" in status.detail
    assert actor.state == "done" and actor.stopped_at == when == 1.5
    assert actor.stop_reason == status.detail and actor.next_round == 1


def test_the_end_of_the_run_while_waiting_or_releasing_starts_no_round() -> None:
    """Arriving while the client waits for a model, the end stops it there; arriving while a
    charged round is being published, that release completes and no round follows."""

    async def waiting(clock: VirtualClock):
        actor, endpoint, _, ledger = make_client(clock)
        endpoint.deliver_at(2.0, RunFinished(0, "all clients finished"))  # no model yet
        await asyncio.wait_for(actor.run(), timeout=100)
        return actor, endpoint, ledger

    actor, endpoint, ledger = run_virtual(waiting)
    assert ledger.spent == [] and endpoint.updates() == [] and actor.stopped_at == 2.0
    assert actor.state == "done" and "server finished" in actor.stop_reason

    class SlowEndpoint(RecordingEndpoint):
        async def publish(self, message: Message) -> None:
            if isinstance(message, ClientUpdate):
                assert self.clock is not None
                await self.clock.sleep(0.5)  # the broker takes its time
            await super().publish(message)

    async def releasing(clock: VirtualClock):
        actor, _, _, ledger = make_client(clock)
        endpoint = SlowEndpoint(clock, log=ledger.log)
        actor.endpoint = endpoint
        endpoint.deliver_at(0.0, GlobalModel(1, np.zeros(DIM, np.float32)))
        endpoint.deliver_at(1.2, RunFinished(1, "done"))  # round 0 charged at t = 1
        await asyncio.wait_for(actor.run(), timeout=100)
        return actor, endpoint, ledger

    actor, endpoint, ledger = run_virtual(releasing)
    assert ledger.log == ["spend 0", "publish ClientUpdate", "publish ClientStatus"]
    assert [(t, m.round) for t, m in endpoint.updates()] == [(1.5, 0)]
    assert actor.stopped_at == 1.5 and actor.state == "done"


def test_a_crash_after_the_end_of_the_run_is_still_a_crash() -> None:
    """The actor swallows only its own cancellation: an outside one (a crash) propagates."""

    async def main(clock: VirtualClock):
        actor, endpoint, trainer, ledger = make_client(clock)
        trainer.begin_round = lambda params, r: RecordingRound(params)
        endpoint.deliver_at(0.0, GlobalModel(1, np.zeros(DIM, np.float32)))
        task = asyncio.create_task(actor.run())
        await clock.sleep(0.5)
        actor.accept_finished(RunFinished(1, "done"))  # the actor cancels its own round...
        task.cancel()  # ...and a crash comes at the same moment
        with pytest.raises(asyncio.CancelledError):
            await task
        return ledger, endpoint

    ledger, endpoint = run_virtual(main)
    assert ledger.spent == [] and endpoint.published == []


# ---------------------------------------------------------------------------------------------
# Server


def update(client: str, round_: int, base: int, value: float) -> ClientUpdate:
    return ClientUpdate(client, round_, base, np.full(DIM, value, np.float32), 10.0)


def make_server(clock: VirtualClock, endpoint: RecordingEndpoint, **kwargs) -> ServerActor:
    clients = {"a": ClientInfo(100, 0.5, 1.0), "b": ClientInfo(300, 0.5, 3.0)}
    return ServerActor(clock=clock, endpoint=endpoint, initial_params=np.zeros(DIM, np.float32),
                       clients=clients, window=1.0, strategy=DataSizeWeights(),
                       step_size=ConstantStepSize(1.0), **kwargs)


def test_server_never_applies_an_update_twice_and_drops_stale_ones() -> None:
    async def main(clock: VirtualClock):
        endpoint = RecordingEndpoint(clock)
        server = make_server(clock, endpoint, max_staleness=1)
        reports = []
        for t, message in [(0.2, update("a", 0, 0, 1.0)), (0.3, update("a", 0, 0, 1.0)),
                           (0.4, update("b", 0, 0, 2.0)), (1.5, update("a", 0, 0, 1.0)),
                           (2.5, update("a", 1, 0, 1.0)), (3.5, update("a", 2, 0, 1.0)),
                           (3.6, update("zz", 0, 0, 1.0))]:
            endpoint.deliver_at(t, message)
        await server.run(lambda r: reports.append(r) or r.window >= 4)
        return server, reports, endpoint

    server, reports, endpoint = run_virtual(main)
    assert [(r.received, r.applied, r.duplicate, r.stale, r.rejected) for r in reports] == [
        (3, 2, 1, 0, 0),  # (a,0) twice in window 1: applied once
        (1, 0, 1, 0, 0),  # (a,0) redelivered a window later: still a duplicate
        (1, 1, 0, 0, 0),  # (a,1) on base 0 at version 1: staleness 1 <= 1
        (2, 0, 0, 1, 1),  # (a,2) on base 0 at version 2: too stale; unknown client rejected
    ]
    # Window 1 mixes a (N=100) and b (N=300): w = -(0.25*0.5*1 + 0.75*0.5*2); window 3 adds a.
    expected = -(0.25 * 0.5 * 1.0 + 0.75 * 0.5 * 2.0) - 0.5 * 1.0
    np.testing.assert_allclose(server.params, np.full(DIM, expected), rtol=1e-6)
    versions = [m.version for _, m in endpoint.published if isinstance(m, GlobalModel)]
    assert versions == [0, 1, 1, 2, 2]


async def _windows(server: ServerActor, endpoint: RecordingEndpoint,
                   arrivals: list[tuple[float, ClientUpdate]], windows: int) -> list:
    """The server's first ``windows`` reports, with ``arrivals`` delivered at their times."""
    for t, message in arrivals:
        endpoint.deliver_at(t, message)
    reports: list = []
    await server.run(lambda r: reports.append(r) or r.window >= windows)
    return reports


def test_replays_junk_and_stale_updates_do_not_hold_off_the_stop_on_spent_budgets() -> None:
    """Once no client can train, the run stops at the first window in which nothing arrived
    that could change the model. A window of replays (duplicates), stale updates and
    rejections alone is as quiet as an empty one: a hostile client sending them every window
    (or an aggregator counting them) kept ``stop.all_budgets_spent`` from ever ending the run,
    which waited for a window with no arrival at all. An accepted arrival still holds it off."""
    from fedsim.config.schema import Stop
    from fedsim.runtime.actors.stops import RunStopKind

    stop = Stop(windows=20)  # all_budgets_spent is on by default

    async def main(clock: VirtualClock):
        endpoint = RecordingEndpoint(clock)
        server = make_server(clock, endpoint, max_staleness=1)
        arrivals = [(0.2, update("a", 0, 0, 1.0)), (0.4, update("b", 0, 0, 1.0))]
        for window in range(1, 6):  # every later window: a replay and an unknown sender
            arrivals += [(window + 0.3, update("a", 0, 0, 1.0)),
                         (window + 0.5, update("zz", 0, 0, 1.0))]
        arrivals += [(3.6, update("b", 0, 0, 1.0)),  # a duplicate more in window 4
                     (4.4, update("a", 1, 0, 1.0)),  # accepted (staleness 1): window 5
                     (5.7, update("b", 1, 0, 1.0))]  # too stale at version 2: window 6
        return await _windows(server, endpoint, arrivals, 7)

    reports = run_virtual(main)
    verdicts = [r.stop_reason(stop, active_clients=0) for r in reports]
    kinds = [None if v is None else v.kind for v in verdicts]
    assert [(r.received, r.applied, r.duplicate, r.stale, r.rejected) for r in reports[:6]] == [
        (2, 2, 0, 0, 0), (2, 0, 1, 0, 1), (2, 0, 1, 0, 1), (3, 0, 2, 0, 1), (3, 1, 1, 0, 1),
        (3, 0, 1, 1, 1)]
    budgets = RunStopKind.BUDGETS_SPENT
    assert kinds == [None, budgets, budgets, budgets, None, budgets, budgets]
    # (a client still active holds it off whatever arrived)
    assert all(r.stop_reason(stop, active_clients=1) is None for r in reports)


def test_the_stop_on_spent_budgets_waits_for_a_deferred_update_not_for_a_flood() -> None:
    """An attacker's review: an update the pacer deferred (its client ahead of its public
    slot) was lost when the window it waited through looked quiet (a duplicate judged then
    cancelled its arrival in the count). The stop waits for deferred updates of rounds their
    clients say they released and the book has not judged; a client flooding replays and
    rounds it never released, which keeps its queue full, does not hold it off."""
    from fedsim.config.schema import Stop
    from fedsim.runtime.actors.stops import RunStopKind

    stop = Stop(windows=30)

    async def main(clock: VirtualClock):
        endpoint = RecordingEndpoint(clock)
        clients = {"a": ClientInfo(100, 0.5, 1.0, slot=1.5), "b": ClientInfo(300, 0.5, 3.0, slot=2.5),
                   "h": ClientInfo(100, 0.5, 1.0, slot=1.5)}
        server = ServerActor(clock=clock, endpoint=endpoint,
                             initial_params=np.zeros(DIM, np.float32), clients=clients,
                             window=1.0, strategy=DataSizeWeights(),
                             step_size=ConstantStepSize(1.0), max_staleness=5)
        for client, rounds in (("a", 1), ("b", 2), ("h", 1)):  # every client done
            server.accept_status(ClientStatus(client, "done", rounds, 1.0, 1e-5))
        arrivals = [(0.2, update("a", 0, 0, 1.0)), (0.3, update("a", 0, 0, 1.0)),
                    (0.5, update("b", 0, 0, 1.0)),
                    (1.2, update("b", 1, 0, 1.0)),  # ahead of b's slot: deferred to window 3
                    (0.1, update("h", 0, 0, 1.0))]
        # h floods: replays of its one round and rounds it never released, all through the run
        arrivals += [(0.15 + 0.1 * k, update("h", 0 if k % 2 else 5000 + k, 0, 1.0))
                     for k in range(120)]
        return await _windows(server, endpoint, arrivals, 12)

    reports = run_virtual(main)
    kinds = [None if (v := r.stop_reason(stop, active_clients=0)) is None else v.kind
             for r in reports]
    applied = [(c, r) for report in reports for c, r, _ in report.applied_updates]
    # Window 2 judged nothing that passed, but b's round 1 waited through it: no stop until
    # it is applied (window 3) ...
    assert (reports[1].accepted, reports[1].waiting) == (0, 1)
    assert reports[2].applied_updates[0][:2] == ("b", 1)
    first_stop = kinds.index(RunStopKind.BUDGETS_SPENT)
    assert first_stop == 3
    assert sorted(applied) == [("a", 0), ("b", 0), ("b", 1), ("h", 0)]
    # ... and the flood, its queue still full, does not keep the run from stopping
    assert reports[first_stop].received == 10


def test_participation_invites_each_window_and_applies_every_invited_round() -> None:
    """The server names each window's participants in the model that opens it; every update
    of an invited round is applied (also one that arrives a window late), and an update naming
    a window its client was not invited to is rejected."""
    ids = ["a", "b"]

    async def main(clock: VirtualClock):
        endpoint = RecordingEndpoint(clock)
        server = make_server(clock, endpoint, participation=0.5, rng=np.random.default_rng(3))
        reports: list = []
        invited: dict[int, str] = {}

        async def clients() -> None:
            for k in range(1, 7):
                await clock.sleep(k - 0.5 - clock.now())
                opening = [m for _, m in endpoint.published if isinstance(m, GlobalModel)][-1]
                assert opening.window == k
                guest = next(c for i, c in enumerate(ids) if is_invited(opening.invited, i))
                other = next(c for c in ids if c != guest)
                invited[k] = guest
                endpoint.inbox.put_nowait(replace(update(guest, k, 0, 1.0), window=k))
                endpoint.inbox.put_nowait(replace(update(other, k, 0, 1.0), window=k))
            # A late update of window 1's invited round, arriving in window 7: applied.
            await clock.sleep(6.5 - clock.now())
            endpoint.inbox.put_nowait(replace(update(invited[1], 100, 0, 1.0), window=1))

        task = asyncio.create_task(clients())
        await server.run(lambda r: reports.append(r) or r.window >= 7)
        await task
        return reports, invited, endpoint

    reports, invited, endpoint = run_virtual(main)
    assert [(r.applied, r.rejected) for r in reports[:6]] == [(1, 1)] * 6
    assert (reports[6].applied, reports[6].rejected) == (1, 0)
    assert set(invited.values()) == {"a", "b"}  # the server's draws vary
    opened = [m.window for _, m in endpoint.published if isinstance(m, GlobalModel)]
    assert opened == list(range(1, 9))  # every window opens with its invitation


def test_mixing_weights_and_step_sizes() -> None:
    params = np.array([1.0, 2.0], np.float32)
    ups = [AcceptedUpdate("a", 0, np.array([1.0, 0.0], np.float32), 100, 0.1, 2.0),
           AcceptedUpdate("b", 0, np.array([0.0, 1.0], np.float32), 300, 0.2, 1.0)]
    np.testing.assert_allclose(mix(params, ups, DataSizeWeights(), 2.0),
                               [1.0 - 2.0 * 0.25 * 0.1, 2.0 - 2.0 * 0.75 * 0.2])
    np.testing.assert_allclose(mix(params, ups, ConfiguredWeights(), 1.0),
                               [1.0 - 2 / 3 * 0.1, 2.0 - 1 / 3 * 0.2])
    np.testing.assert_allclose(mix(params, ups, UniformWeights(), 1.0),
                               [1.0 - 0.5 * 0.1, 2.0 - 0.5 * 0.2])
    np.testing.assert_array_equal(mix(params, [], UniformWeights(), 1.0), params)
    # Population normalisation: a lone update moves the model by its share of all weight.
    population = [("a", 100, 2.0), ("b", 300, 1.0)]
    assert population_weight(DataSizeWeights(), population) == 400.0
    assert population_weight(ConfiguredWeights(), population) == 3.0
    np.testing.assert_allclose(
        mix(params, ups[:1], DataSizeWeights(), 1.0, total_weight=400.0), [1.0 - 0.25 * 0.1, 2.0])


def test_step_size_schedules() -> None:
    plateau = PlateauStepSize(1.0, factor=0.9, patience=2, minimum=0.7)
    for accuracy in [0.5, 0.6, 0.6, 0.55, 0.61, 0.6, 0.6, 0.6, 0.6, 0.6, 0.6]:
        plateau.observe(accuracy)
    # Improvements at 0.5, 0.6, 0.61; then 6 non-improvements -> 3 cuts, floored at 0.7.
    assert plateau.current(1) == pytest.approx(max(0.7, 0.9**4))
    law = InverseTimeStepSize(1.0, decay=0.5, power=1.0)
    assert [law.current(w) for w in (1, 2, 3)] == [1.0, 1 / 1.5, 1 / 2.0]



def test_a_step_size_continues_from_its_state_dict() -> None:
    """What a checkpoint stores of the step size: a restored schedule behaves like the original
    from then on, and a state of another kind of schedule is refused."""
    original = PlateauStepSize(1.0, factor=0.5, patience=2)
    for accuracy in [0.5, 0.4]:  # best 0.5, one evaluation without improvement
        original.observe(accuracy)
    restored = PlateauStepSize(1.0, factor=0.5, patience=2)
    restored.load_state_dict(original.state_dict())
    for schedule in (original, restored):
        schedule.observe(0.45)  # the second without improvement: the step halves
    assert original.current(9) == restored.current(9) == 0.5
    assert original.state_dict() == restored.state_dict() == {
        "value": 0.5, "best": 0.5, "since_best": 0}
    law = InverseTimeStepSize(1.0, decay=0.5)
    assert law.state_dict() == {}
    with pytest.raises(ConfigError, match="does not fit InverseTimeStepSize"):
        law.load_state_dict(original.state_dict())
    with pytest.raises(ConfigError, match="does not fit PlateauStepSize"):
        restored.load_state_dict({})

def test_window_stop_reason_checks_the_conditions_in_order() -> None:
    """The simulator and the deployed server share one stop rule (WindowReport.stop_reason)."""
    from fedsim.config.schema import Stop
    from fedsim.runtime.actors.server import WindowReport
    from fedsim.runtime.actors.stops import RunStop, RunStopKind

    stop = Stop(windows=10, virtual_seconds=5.0, target_accuracy=0.9)
    report = WindowReport(window=3, time=2.0, version=3, accuracy=0.5, received=4)
    assert report.stop_reason(stop, active_clients=2) is None
    assert WindowReport(window=10, time=9.0, version=9).stop_reason(
        stop, active_clients=2) == RunStop(RunStopKind.WINDOWS, "it reached 10 windows")
    assert WindowReport(window=6, time=6.0, version=6).stop_reason(
        stop, active_clients=2, seconds="scenario") == RunStop(RunStopKind.DURATION,
        "window 6 ended at 6.00 scenario seconds, the first window end at or after its limit of 5 s")
    assert WindowReport(window=3, time=2.0, version=3, accuracy=0.95).stop_reason(
        stop, active_clients=2) == RunStop(RunStopKind.TARGET_ACCURACY,
                                           "it reached the target accuracy 0.9")
    # all budgets spent: nobody active, nothing received this window and nothing in flight
    idle = WindowReport(window=3, time=2.0, version=3)
    assert idle.stop_reason(stop, active_clients=0, in_flight=1) is None
    assert idle.stop_reason(stop, active_clients=1) is None
    assert idle.stop_reason(stop, active_clients=0) == RunStop(
        RunStopKind.BUDGETS_SPENT, "no client can train any more and every update has arrived")
    assert idle.stop_reason(Stop(windows=10, all_budgets_spent=False), active_clients=0) is None
    # ... nor while the server holds updates unjudged (their clients ahead of their slots),
    # whatever this window's arrivals were
    assert WindowReport(window=3, time=2.0, version=3, waiting=1).stop_reason(
        stop, active_clients=0) is None
    assert WindowReport(window=3, time=2.0, version=3, received=1, stale=2, waiting=1
                        ).stop_reason(stop, active_clients=0) is None


def test_the_local_step_writes_only_the_clients_own_model() -> None:
    """``w <- w - eta u``, rounded as ``(-eta u) + w``: in place on the client's own array (an
    earlier local step's), into a new array after a received model, which is never written;
    every round reads the model as it was when the round began (bit for bit)."""
    rng = np.random.default_rng(3)
    g1 = rng.standard_normal(DIM).astype(np.float32)
    g2 = rng.standard_normal(DIM).astype(np.float32)
    g1_copy, g2_copy = g1.copy(), g2.copy()
    began_on: list[np.ndarray] = []
    updates: list[np.ndarray] = []

    class RandomTrainer(FakeTrainer):
        def begin_round(self, params: np.ndarray, round_index: int) -> DoneRound:
            began_on.append(params)
            self.seen.append(params.copy())
            update = rng.standard_normal(DIM).astype(np.float32)
            updates.append(update.copy())
            return DoneRound(RoundResult(update=update, steps=[STEP], batch_sizes=[10],
                                         clip=1.0, sigma=1.0, mean_loss=0.0, sample_grads=10))

    async def main(clock: VirtualClock):
        actor, endpoint, _, _ = make_client(clock, max_rounds=5)
        actor.trainer = trainer = RandomTrainer()
        endpoint.deliver_at(0.0, GlobalModel(1, g1))
        endpoint.deliver_at(2.5, GlobalModel(2, g2))  # in the middle of round 2
        await asyncio.wait_for(actor.run(), timeout=100)
        return actor, trainer

    actor, trainer = run_virtual(main)
    eta = np.float32(-0.5)
    expected = [g1_copy]
    for r, update in enumerate(updates):
        start = g2_copy if r == 2 else expected[-1]  # g2 arrived while round 2 ran
        expected.append((update * eta) + start)
    for r in range(5):
        np.testing.assert_array_equal(trainer.seen[r], expected[r])
    np.testing.assert_array_equal(actor.w, expected[5])
    np.testing.assert_array_equal(g1, g1_copy)  # received models: never written
    np.testing.assert_array_equal(g2, g2_copy)
    assert began_on[0] is g1
    assert began_on[1] is began_on[2]  # the client's own model, stepped in place
    assert began_on[3] is not began_on[2] and began_on[3] is not g2  # a new array after g2
    assert began_on[4] is began_on[3] and actor.w is began_on[4]


def test_the_distance_rule_measures_the_same_difference_in_its_reused_buffer() -> None:
    from fedsim.runtime.actors.client import _difference

    rng = np.random.default_rng(5)
    w, w0 = (rng.standard_normal(1001).astype(np.float32) for _ in range(2))
    first = _difference(w, w0)
    np.testing.assert_array_equal(first, w - w0)
    small = _difference(w[:10].copy(), w0[:10].copy())  # the same buffer, a shorter view
    np.testing.assert_array_equal(small, w[:10] - w0[:10])
    assert np.shares_memory(first, small)
    wide = _difference(w.astype(np.float64), w0)  # not two float32 vectors: numpy's own
    np.testing.assert_array_equal(wide, w.astype(np.float64) - w0)
    assert not np.shares_memory(wide, first)
