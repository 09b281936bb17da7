"""Per-client pacing and published versions (runtime/admission.py; findings R4a-c)."""

from __future__ import annotations

import asyncio
import math

import numpy as np
import pytest

from fedsim.aggregation import ConstantStepSize, UniformWeights
from fedsim.aggregation.policies import FedAsync
from fedsim.clock import WallClock
from fedsim.config.distributions import (
    Constant,
    Exponential,
    LogNormal,
    ShiftedExponential,
    Uniform,
)
from fedsim.protocol.messages import ClientUpdate
from fedsim.runtime.actors.admission import (
    BURST,
    EXPONENTIAL_PACE,
    MAX_DEFERRED,
    REALISED_PACE,
    Pacer,
    RateSlot,
    public_round_seconds,
)
from fedsim.runtime.actors.client_book import PUBLISHED_RUNS, PublishedVersions
from fedsim.runtime.actors.server import ClientInfo, ServerActor
from fedsim.runtime.simulated.kernel import VirtualClock, run_virtual
from tests.doubles import RecordingEndpoint


def _update(client: str, round_: int, base: int = 0) -> ClientUpdate:
    return ClientUpdate(client, round_, base, np.zeros(2, np.float32), 1.0)


def test_public_round_seconds_is_the_speed_models_minimum_times_the_expected_gradients() -> None:
    assert public_round_seconds(Constant(value=0.01), 32.0, "public") == pytest.approx(0.32)
    assert public_round_seconds(Uniform(kind="uniform", low=0.002, high=0.1), 10.0,
                                "public") == pytest.approx(0.02)
    assert public_round_seconds(ShiftedExponential(kind="shifted_exponential", minimum=0.5,
                                                   mean=1.0), 2.0, "public") == pytest.approx(1.0)
    # Log-normal: the 1e-12 lower quantile, z = 7.034 (standard normal tables).
    lognormal = public_round_seconds(LogNormal(kind="lognormal", median=0.003, sigma=0.5), 10.0,
                                     "public")
    assert lognormal == pytest.approx(0.03 * math.exp(-7.0344 * 0.5), rel=1e-4)
    # Exponential: no minimum, a quarter of the mean (see the next test).
    assert public_round_seconds(Exponential(kind="exponential", mean=1.0), 10.0,
                                "public") == pytest.approx(10.0 / EXPONENTIAL_PACE)
    # A realised-batch timing: a fixed-size batch is the expected one; a Poisson batch is paced
    # at a quarter of its expected cost (see the next tests), not with an exponential speed.
    assert public_round_seconds(Constant(value=0.01), 32.0, "realised",
                                "fixed") == pytest.approx(0.32)
    assert public_round_seconds(Constant(value=0.01), 32.0, "realised",
                                "poisson") == pytest.approx(0.32 / REALISED_PACE)
    assert public_round_seconds(Exponential(kind="exponential", mean=1.0), 10.0, "realised",
                                "poisson") is None
    assert public_round_seconds(Constant(value=0.0), 32.0, "public") is None


def test_the_exponential_pace_holds_honest_rounds_with_the_stated_probability() -> None:
    """k consecutive honest rounds take Gamma(k) mean seconds; an update waits only if some
    run of k takes less than (k - B) slots of mean / EXPONENTIAL_PACE. The bound the docstring
    states, from scipy's Gamma CDF, and a Monte Carlo of the pacer itself."""
    from scipy.stats import gamma

    def bound(burst: int) -> float:
        return float(sum(gamma.cdf((k - burst) / EXPONENTIAL_PACE, k)
                         for k in range(burst + 1, 4000)))

    assert bound(int(BURST)) == pytest.approx(4.0e-17, rel=0.05)
    assert bound(int(BURST) // 2) == pytest.approx(5.3e-9, rel=0.05)
    rng = np.random.default_rng(1)
    mean = 0.2
    slot = public_round_seconds(Exponential(kind="exponential", mean=mean), 1.0, "public")
    assert slot is not None
    for client in range(20):  # 20 honest clients of 2,000 rounds each, network jitter too
        releases = np.cumsum(rng.exponential(mean, 2000))
        arrivals = releases + rng.uniform(0.0, 0.5 * BURST * slot, releases.size)
        pacer = Pacer({"h": slot}, start=0.0)
        order = sorted(zip(arrivals, range(releases.size), strict=True))
        assert all(pacer.offer(_update("h", r), t) == "pass" for t, r in order), client
    # A rate slot: the bucket starts full (the first rounds may come close together).
    assert isinstance(slot, RateSlot)
    # A flood of the same client: four times its honest mean rate, plus the burst.
    pacer = Pacer({"m": slot}, start=0.0)
    passed = sum(pacer.offer(_update("m", r), 0.0) == "pass" for r in range(200))
    assert passed == BURST
    for step in range(1, 41):  # the server looks at every arrival: here once a slot
        passed += len(list(iter(lambda t=step * slot: pacer.next_due(t), None)))
    assert passed == BURST + 40  # in 10 mean round times: a burst + 40 slots' worth, not 200


def test_the_realised_poisson_pace_holds_honest_rounds_with_the_stated_probability() -> None:
    """Under ``timing: realised`` k Poisson rounds draw about Poisson(k g) gradients in all; an
    update waits only if they are fewer than (k - B) g / 4. The docstring's bound from scipy,
    and the pacer against honest clients whose rounds take their realised batch's time."""
    from scipy.stats import poisson

    def bound(g: int, burst: int = int(BURST)) -> float:
        return float(sum(poisson.cdf(math.ceil((k - burst) * g / REALISED_PACE) - 1, k * g)
                         for k in range(burst + 1, 6000)))

    assert bound(1) == pytest.approx(1.0e-7, rel=0.05)
    assert bound(2) == pytest.approx(4.3e-15, rel=0.05)
    assert bound(1) > math.exp(-17)  # 17 empty rounds in a row take no time: not pace-able
    rng = np.random.default_rng(2)
    speed, records, batch = 0.01, 400, 2.0
    slot = public_round_seconds(Constant(value=speed), batch, "realised", "poisson")
    assert isinstance(slot, RateSlot)
    assert not isinstance(public_round_seconds(Constant(value=speed), batch, "public"), RateSlot)
    for client in range(20):  # 20 honest clients of 2,000 rounds, each as long as its batch
        sizes = rng.binomial(records, batch / records, 2000)
        releases = np.cumsum(speed * sizes)
        pacer = Pacer({"h": slot}, start=0.0)
        assert all(pacer.offer(_update("h", r), t) == "pass"
                   for r, t in enumerate(releases)), client


def test_an_honest_client_with_bunched_arrivals_never_waits() -> None:
    """Releases one slot apart (each round takes its slot), then arrivals delayed by a jitter
    of up to BURST - 1 slots (an outage that delivers them together): every one passes."""
    rng = np.random.default_rng(0)
    slot = 0.5
    releases = slot * np.arange(1, 201)
    jitter = rng.uniform(0.0, (BURST - 1) * slot, releases.size)
    jitter[50:65] = (BURST - 1) * slot - slot * np.arange(15)  # 15 bunched at one instant
    arrivals = sorted(zip(releases + jitter, range(200), strict=True))
    pacer = Pacer({"h": slot}, start=0.0)
    verdicts = [pacer.offer(_update("h", r), t) for t, r in arrivals]
    assert verdicts == ["pass"] * 200 and pacer.deferred == 0


def test_a_flood_waits_for_its_slots_and_is_refused_only_beyond_the_queue() -> None:
    pacer = Pacer({"m": 1.0, "free": None}, start=0.0)
    flood = MAX_DEFERRED + 10
    verdicts = [pacer.offer(_update("m", r), 0.0) for r in range(flood)]
    assert verdicts == ["pass"] + ["wait"] * MAX_DEFERRED + ["refuse"] * (flood - 1 - MAX_DEFERRED)
    assert pacer.offer(_update("free", 0), 0.0) == "pass"  # unpaced clients pass
    assert pacer.next_due(0.5) is None  # half a token
    # After 10 slots, 10 tokens: the next 10 rounds in order, then nothing.
    due = list(iter(lambda: pacer.next_due(10.0), None))
    assert [u.round for u in due] == list(range(1, 11))
    # Idle time fills the bucket only up to BURST.
    due = list(iter(lambda: pacer.next_due(1000.0), None))
    assert len(due) == BURST and pacer.waiting() == MAX_DEFERRED - 10 - BURST


def test_a_restarted_servers_buckets_start_full() -> None:
    pacer = Pacer({"h": 1.0}, start=0.0)
    pacer.restart(5.0, full=True)
    assert [pacer.offer(_update("h", r), 5.0) for r in range(int(BURST) + 1)] == \
        ["pass"] * int(BURST) + ["wait"]


def test_published_versions_are_kept_as_bounded_runs() -> None:
    published = PublishedVersions([])
    for v in (0, 1, 2, 5, 8, 7):
        published.add(v)
    assert published.runs() == [[0, 2], [5, 5], [7, 8]]
    published.add(6)
    assert published.runs() == [[0, 2], [5, 8]]
    assert [v for v in range(12) if v in published] == [0, 1, 2, 5, 6, 7, 8]
    # broadcast_every = 2 for a long run: only the newest PUBLISHED_RUNS runs are kept.
    for v in range(10, 10 + 2 * (PUBLISHED_RUNS + 5), 2):
        published.add(v)
    assert len(published.runs()) == PUBLISHED_RUNS and 0 not in published
    assert published.oldest() == 10 + 2 * 5 and published.oldest() in published  # (7 dropped)


def test_a_flooding_clients_deferred_rounds_are_applied_at_its_pace_not_dropped() -> None:
    """FedAsync in virtual time, slot 1 s: Mallory sends 10 rounds at t = 0; one is applied at
    once, the rest one per slot as tokens accrue (judged at the next arrival or window end),
    none is refused; the honest client, one round per slot, is never deferred."""

    async def main(clock: VirtualClock) -> tuple[list[tuple[str, int, float]], int]:
        clients = {c: ClientInfo(1, 1.0, slot=1.0) for c in ("mallory", "h")}
        server = ServerActor(clock=clock, endpoint=RecordingEndpoint(), initial_params=np.zeros(2),
                             clients=clients, window=2.0, strategy=UniformWeights(),
                             step_size=ConstantStepSize(1.0), policy=FedAsync(alpha=0.5))
        applied: list[tuple[str, int, float]] = []
        for r in range(10):
            await server._arrived(_update("mallory", r, base=server.version))
        for second in range(1, 13):
            await clock.sleep(1.0)
            before = len(server._open.applied_updates) if server._open else 0
            await server._arrived(_update("h", second - 1, base=server.version))
            report = server._open
            assert report is not None
            applied += [(c, r, clock.now()) for c, r, _ in report.applied_updates[before:]]
            if second % 2 == 0:
                server.close_window()
        return applied, server.pacer.deferred

    applied, deferred = run_virtual(main)
    mallory = [(r, t) for c, r, t in applied if c == "mallory"]
    honest = [r for c, r, _ in applied if c == "h"]
    assert honest == list(range(12)) and deferred == 9
    # Round r > 0 of Mallory's waits until r tokens have accrued: t = r seconds.
    assert [r for r, _ in mallory] == list(range(1, 10))
    assert [t for _, t in mallory] == pytest.approx([float(r) for r in range(1, 10)])


def test_an_unknown_version_claim_is_refused_and_counted() -> None:
    server = ServerActor(clock=WallClock(), endpoint=RecordingEndpoint(), initial_params=np.zeros(2),
                         clients={"a": ClientInfo(1, 1.0)}, window=1.0, strategy=UniformWeights(),
                         step_size=ConstantStepSize(1.0))
    server.version = 3  # versions 1-3 made but never published
    server._inbox = [_update("a", 0, base=2), _update("a", 1, base=0)]
    report = server.close_window()
    assert report.rejections == {"unpublished_version": 1} and report.applied == 1
    asyncio.run(server.broadcast())
    assert [v for v in range(6) if v in server.book.published] == [0, 4]


class _PassedInOrder:
    """The pacer's former memory of passed rounds: a set of the newest PASSED_KEPT rounds to
    pass, in the order they passed (it grew to PASSED_KEPT entries a client)."""

    def __init__(self) -> None:
        from collections import deque

        self.passed: set[int] = set()
        self.order: deque[int] = deque()

    def has_passed(self, round_index: int) -> bool:
        return round_index in self.passed

    def pass_round(self, round_index: int) -> None:
        from fedsim.runtime.actors.admission import PASSED_KEPT

        if round_index in self.passed:
            return
        self.passed.add(round_index)
        self.order.append(round_index)
        if len(self.order) > PASSED_KEPT:
            self.passed.discard(self.order.popleft())


@pytest.mark.parametrize("seed", range(4))
def test_passed_rounds_bitmask_decides_as_the_set_for_honest_orders(seed: int) -> None:
    """For an honest client's arrivals (its rounds in order, bunched and reordered by the
    network within its 256 unacknowledged ones, duplicated and resent) the bounded memory of
    passed rounds answers every question as the former set of the newest PASSED_KEPT did,
    over several times PASSED_KEPT rounds, and holds at most PASSED_KEPT bits."""
    from fedsim.runtime.actors.admission import PASSED_KEPT, _Bucket

    rng = np.random.default_rng(seed)
    bucket, reference = _Bucket(1.0, 0.0), _PassedInOrder()
    rounds = np.arange(4 * PASSED_KEPT)
    for start in range(0, rounds.size, 200):  # reordered within blocks of up to 200
        rng.shuffle(rounds[start:start + int(rng.integers(1, 200))])
    for round_index in rounds.tolist():
        if rng.random() < 0.3:  # skipped (never sent, or waiting): never passes
            continue
        for asked in {round_index, round_index - int(rng.integers(0, 300)),
                      round_index + int(rng.integers(0, 300))}:
            assert bucket.has_passed(asked) == reference.has_passed(asked)
        bucket.pass_round(round_index)
        reference.pass_round(round_index)
        if rng.random() < 0.2:  # a duplicate or a resend of a recent round
            again = round_index - int(rng.integers(0, 256))
            assert bucket.has_passed(again) == reference.has_passed(again)
    assert bucket.passed.bit_length() <= PASSED_KEPT
    top = int(rounds.max())
    for asked in range(top - PASSED_KEPT + 1, top + 5):
        assert bucket.has_passed(asked) == reference.has_passed(asked), asked
    # Further back the set (1,024 rounds that passed, spread over more indices where rounds
    # were skipped) remembered more: a repeat of a round over 1,024 rounds old, which an
    # honest client (256 unacknowledged) never sends, now costs a token.
    assert not any(bucket.has_passed(r) for r in range(top - 2 * PASSED_KEPT, top - PASSED_KEPT))


def test_passed_rounds_forget_a_round_far_below_the_newest() -> None:
    """A round more than PASSED_KEPT below the highest that passed is not remembered (its
    repeat costs a token), and a jump far ahead clears the memory without a huge shift."""
    from fedsim.runtime.actors.admission import PASSED_KEPT, _Bucket

    bucket = _Bucket(1.0, 0.0)
    bucket.pass_round(5)
    assert bucket.has_passed(5) and not bucket.has_passed(4) and not bucket.has_passed(6)
    bucket.pass_round(5 + PASSED_KEPT - 1)
    assert bucket.has_passed(5)
    bucket.pass_round(5 + PASSED_KEPT)
    assert not bucket.has_passed(5) and bucket.has_passed(5 + PASSED_KEPT)
    bucket.pass_round(10**18)
    assert bucket.has_passed(10**18) and not bucket.has_passed(5 + PASSED_KEPT)
    assert bucket.passed == 1
    bucket.pass_round(3)  # far below: not kept
    assert not bucket.has_passed(3)


def test_updates_that_reach_a_restarted_server_during_its_first_broadcast_are_judged() -> None:
    """A stranger's deployment: a server SIGKILLed and restarted logged "update deferred" for
    its clients' resends while it broadcast its first model, then restarted its pacer, which
    dropped them from its queues: 12 paid-for updates were never judged nor acknowledged.
    The pacer now starts before anything is received."""

    class SlowBroadcast(RecordingEndpoint):
        """Delivers the clients' resends while the server publishes its first model."""

        async def publish(self, message: object) -> None:
            for r in range(3):
                self.inbox.put_nowait(_update("c", r, base=0))
            await asyncio.sleep(0.05)  # the receiver takes them now
            await super().publish(message)

    async def main(clock: VirtualClock) -> list[tuple[str, int]]:
        clients = {"c": ClientInfo(1, 1.0, slot=1.0)}
        server = ServerActor(clock=clock, endpoint=SlowBroadcast(), initial_params=np.zeros(2),
                             clients=clients, window=1.0, strategy=UniformWeights(),
                             step_size=ConstantStepSize(1.0))
        server.windows_closed = 4  # restored: its buckets start full (BURST)
        reports = []

        def on_window(report: object) -> bool:
            reports.append(report)
            return True

        await server.run(on_window)
        return [(c, r) for report in reports for c, r, _ in report.applied_updates]

    assert run_virtual(main) == [("c", 0), ("c", 1), ("c", 2)]
