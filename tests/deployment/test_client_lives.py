"""A deployed client's emulated crashes and rejoins (:mod:`fedsim.runtime.deployed.client_lives`):
the simulation's rule (up and down times from the client's crash stream), each crash losing
the incarnation's actor, each rejoin reopening the ledger and continuing its rounds, a crash
for good ending the client; run here under virtual time with a real actor, trainer and
ledger."""

from __future__ import annotations

import asyncio
from pathlib import Path

import numpy as np
import pytest

from fedsim.config import load_scenario
from fedsim.privacy.ledger import PrivacyLedger
from fedsim.protocol.messages import GlobalModel, RunFinished
from fedsim.runtime.actors.client import ClientActor
from fedsim.runtime.actors.exposure import client_exposure
from fedsim.runtime.actors.releases import Releases
from fedsim.runtime.actors.stops import ClientStopKind
from fedsim.runtime.assembly import make_client_actor, open_ledger
from fedsim.runtime.deployed.client_lives import FIRST_MODEL_POLL, ClientLives, crash_stop
from fedsim.runtime.population import build_population
from fedsim.runtime.simulated.kernel import VirtualClock, run_virtual
from fedsim.transports.base import Endpoint
from fedsim.transports.incarnation import ClientIncarnation
from tests.doubles import RecordingEndpoint

SCENARIO = Path(__file__).with_name("four_clients.yaml")
RUN_FOR = 30.0  # virtual seconds


def _run(tmp_path: Path, crashes: str, seed: int = 4,
         arrivals: list[tuple[float, object]] | None = None) -> tuple[
        ClientLives, list[int], int, list[tuple[float, float]]]:
    """One client of four_clients.yaml with ``crashes`` as its group's, for RUN_FOR virtual
    seconds, a global model every second: its lives, the rounds its ledger holds at the end,
    how often its ledger was reopened, and the (crash, rejoin) times the rule draws
    (independently; no rejoin: inf)."""
    loaded = load_scenario(SCENARIO, [f"clients.groups[c].availability={{crashes: {crashes}}}"])
    population = build_population(loaded)
    plan = population.plans[0]
    path = tmp_path / "c.jsonl"
    ledger = open_ledger(plan, path)
    reopened = [0]

    def reopen() -> PrivacyLedger:
        reopened[0] += 1
        return open_ledger(plan, path)

    async def main(clock: VirtualClock) -> ClientLives:
        endpoint = RecordingEndpoint(clock)
        trainer = population.trainer(plan)
        exposure = client_exposure(loaded.scenario, [p.client_id for p in population.plans],
                                   plan.client_id)

        def make_actor(opened: PrivacyLedger, releases: Releases, through: Endpoint
                       ) -> ClientActor:
            return make_client_actor(plan, clock=clock, endpoint=through, trainer=trainer,
                                     ledger=opened, speed_rng=np.random.default_rng(0),
                                     delta=1e-5, exposure=exposure, releases=releases)

        lives = ClientLives(plan, trainer, ledger, clock=clock, endpoint=endpoint,
                            make_actor=make_actor, reopen=reopen,
                            crash_rng=np.random.default_rng(seed))
        schedule = arrivals if arrivals is not None else [
            (float(t), GlobalModel(t, population.initial_params.copy(), float(t)))
            for t in range(int(RUN_FOR))]
        feeder = asyncio.get_running_loop().create_task(endpoint.feed(schedule))
        try:
            await asyncio.wait_for(lives.run(), RUN_FOR)
        except TimeoutError:
            pass
        feeder.cancel()
        return lives

    lives = run_virtual(main)
    rounds = sorted(lives.record.ledger.rounds)
    lives.record.ledger.close()
    # The rule, drawn again: up, (down, up)*, from the same stream.
    spec = loaded.scenario.clients.groups[0].availability.crashes
    assert spec is not None
    # The crash clock starts once the first model is held (looked for every FIRST_MODEL_POLL).
    rng, at, times = np.random.default_rng(seed), FIRST_MODEL_POLL, []
    while True:
        at += spec.every.sample(rng)
        if at >= RUN_FOR:
            break
        if spec.rejoin_after is None:
            times.append((at, float("inf")))
            break
        down = spec.rejoin_after.sample(rng)
        times.append((at, at + down))
        at += down
    return lives, rounds, reopened[0], times


def test_crashes_and_rejoins_follow_the_rule_and_keep_the_rounds_going(tmp_path: Path) -> None:
    lives, rounds, reopened, times = _run(tmp_path, "{every: {kind: uniform, low: 3.0, "
                                                    "high: 6.0}, rejoin_after: 1.5}")
    assert len(times) >= 3
    assert lives.crashes == len(times) == reopened  # a rejoin after each crash
    assert not lives.crashed_for_good
    # Every incarnation's releases are in the one list, in order, and each round is in the
    # ledger: numbered on after the last committed one, never twice.
    released = [r.round for r in lives.kept]
    assert released == sorted(set(released)) and len(released) > 10
    assert set(released) <= set(rounds)
    assert rounds == list(range(len(rounds)))  # a crash loses a begun round, charges nothing
    # Down means down: nothing is released between a crash and its rejoin, and the first
    # release after a rejoin comes from a new incarnation (a round's slot after it).
    for crash, rejoin in times:
        assert not [r for r in lives.kept if crash + 1e-9 < r.time < rejoin - 1e-9], (
            crash, rejoin)
        assert any(r.time > rejoin for r in lives.kept) or rejoin > RUN_FOR - 1


def test_a_crash_for_good_ends_the_client(tmp_path: Path) -> None:
    lives, rounds, reopened, times = _run(tmp_path, "{every: 7.5}")
    assert times == [(7.51, float("inf"))]
    assert lives.crashed_for_good and lives.crashes == 1 and reopened == 0
    state, kind, at = crash_stop(lives)
    assert (state, kind) == ("crashed", ClientStopKind.CRASHED)
    assert at == pytest.approx(7.51)
    assert lives.stopped[0]["reason"] == "crashed and did not rejoin"
    assert all(r.time <= 7.51 for r in lives.kept) and rounds == [r.round for r in lives.kept]


def test_the_crash_clock_starts_with_the_first_model(tmp_path: Path) -> None:
    """A deployed client connects before the server's first window: its up-time counts from
    the first model, as a simulated client's from the run's start (an attacker's review: crashes
    came 3-4 scenario seconds early)."""
    population = build_population(load_scenario(SCENARIO))
    first = [(4.0, GlobalModel(0, population.initial_params.copy(), 4.0))]
    lives, _, _, _ = _run(tmp_path, "{every: 7.5}", arrivals=first)
    assert lives.crashed_for_good
    assert crash_stop(lives)[2] == pytest.approx(4.0 + 7.5, abs=0.02)


def test_a_rejoin_takes_the_model_that_came_while_down_and_the_runs_end_ends_a_down_client(
        tmp_path: Path) -> None:
    """Models that arrive while the client is down: the newest is its next incarnation's
    first (a restarted process gets the broker's retained model at once). The run's end
    while it is down ends the client (its process had lingered until its rejoin time)."""
    population = build_population(load_scenario(SCENARIO))
    params = population.initial_params

    def model(version: int, at: float) -> tuple[float, GlobalModel]:
        return at, GlobalModel(version, params.copy(), at)

    # Up 3.01 s, down 2 s: models 1 and 2 come while down; nothing after.
    lives, _, _, _ = _run(tmp_path, "{every: 3.0, rejoin_after: 2.0}",
                          arrivals=[model(0, 0.0), model(1, 3.5), model(2, 4.0)])
    after = [r for r in lives.kept if r.time > 5.01]
    assert after and all(r.base_version == 2 for r in after)
    # Down for good-ish (100 s) when the server finishes at 6 s: the client ends then.
    (tmp_path / "end").mkdir()
    lives, _, _, _ = _run(tmp_path / "end", "{every: 3.0, rejoin_after: 100.0}",
                          arrivals=[model(0, 0.0), (6.0, RunFinished(0, "it reached 6 windows",
                                                                            6.0))])
    assert lives.down and lives.finished is not None and not lives.crashed_for_good


def test_a_client_down_at_the_end_is_not_taken_for_onestopped_for_good() -> None:
    """A report's "crashed" means for good only with its stop kind: a client down when the
    run ended, then resumed, keeps its new stop (a review: a resumed client's budget stop
    was overwritten by the earlier report's "crashed")."""
    from fedsim.runtime.deployed.client_process import _keep_first_stop
    from fedsim.runtime.deployed.state_owner import stopped_for_good

    down = {"state": "crashed", "stop_kind": None, "stop_reason": "", "stopped_at": None}
    for_good = {"state": "crashed", "stop_kind": "crashed", "stop_reason": "crashed and did "
                "not rejoin", "stopped_at": 7.5}
    assert not stopped_for_good(down) and stopped_for_good(for_good)
    assert stopped_for_good({"state": "done"}) and stopped_for_good(
        {"state": "budget_exhausted", "stop_kind": ClientStopKind.BUDGET})
    now = {"state": "budget_exhausted", "stop_kind": ClientStopKind.BUDGET,
           "stop_reason": "budget", "stopped_at": 40.0}
    kept = dict(now)
    _keep_first_stop(kept, down, released_here=False)
    assert kept == now
    _keep_first_stop(kept, for_good, released_here=False)
    assert kept["stop_kind"] == "crashed" and kept["stopped_at"] == 7.5


def test_a_clients_clock_meets_the_servers_at_its_first_model_never_going_back() -> None:
    """A stranger's resumed launch: each client's clock restarted at its ledger's last record,
    ten seconds behind the server's, so its stops and epsilon curves ended at 21 s of a 30 s
    run. A client's scaled clock now moves forward to its first global model's send time
    (once, and never back: a fresh client, whose clock starts before the server's, keeps it)."""
    from fedsim.clock import ScaledClock
    from fedsim.runtime.deployed.client_lives import _ActorsEndpoint

    behind = ScaledClock(1000.0, start=19.0)  # a second of scenario time is 1000 wall s
    behind.catch_up(23.5)
    assert 23.5 <= behind.now() < 23.6
    behind.catch_up(5.0)  # never back
    behind.catch_up(float("nan"))
    behind.catch_up(float("inf"))
    assert 23.5 <= behind.now() < 23.6

    class Models:
        def __init__(self) -> None:
            self.sent = [GlobalModel(1, np.zeros(2, np.float32), 30.0),
                         GlobalModel(2, np.zeros(2, np.float32), 99.0)]

        async def receive(self) -> GlobalModel:
            return self.sent.pop(0)

    aligned: list[float] = []
    endpoint = _ActorsEndpoint(Models(), aligned.append)  # type: ignore[arg-type]

    async def take_two() -> None:
        await endpoint.receive()
        await endpoint.receive()

    asyncio.run(take_two())
    assert aligned == [30.0]  # the first model's only


def test_a_clients_stop_is_said_on_the_servers_timeline() -> None:
    """A resumed client's clock starts where its ledger ends (19 s), ahead of the resumed
    server's (its checkpoint's window, 12 s) and never goes back; its stop time is said on
    the server's timeline: its own clock less its least lead over the server's send times
    (the fastest delivery), a time past any run's end not being the server's clock."""
    from fedsim.clock import ScaledClock
    from fedsim.runtime.deployed.client_lives import ServerTimeline, _ActorsEndpoint

    ahead = ScaledClock(1000.0, start=19.0)  # a second of scenario time is 1000 wall s
    timeline = ServerTimeline(ahead, latest=1000.0)
    assert timeline.time_of(20.0) == 20.0  # nothing of the server's seen yet: its own

    class Server:
        def __init__(self) -> None:
            self.sent = [GlobalModel(1, np.zeros(2, np.float32), 12.0),
                         RunFinished(2, "its end", 12.5),  # (faster: the least lead)
                         GlobalModel(3, np.zeros(2, np.float32), 1e17)]

        async def receive(self) -> GlobalModel | RunFinished:
            return self.sent.pop(0)

    endpoint = _ActorsEndpoint(Server(), None, timeline)  # type: ignore[arg-type]

    async def take_three() -> None:
        for _ in range(3):
            await endpoint.receive()

    asyncio.run(take_three())
    assert timeline.lead is not None and 6.5 <= timeline.lead < 6.6
    assert 13.4 < timeline.time_of(20.0) <= 13.5
    assert 12.5 <= timeline.time_of(ahead.now()) < 12.6


def test_a_servers_send_time_past_any_runs_end_does_not_move_the_clock() -> None:
    """A review: a global model's sent_at of 1e17 (finite, so the codec takes it) froze the
    client's clock at float's resolution, and its release padding with it."""
    from fedsim.clock import ScaledClock
    from fedsim.config.loading import load_scenario
    from fedsim.runtime.deployed.client_process import _aligner

    scenario = load_scenario(SCENARIO).scenario
    clock = ScaledClock(1000.0, start=2.0)
    align = _aligner(clock, scenario)
    align(1e17)
    assert 2.0 <= clock.now() < 2.1
    align(40.0)
    assert 40.0 <= clock.now() < 40.1


def _models_of(incarnation: ClientIncarnation, start: str, *sent_at: float) -> list[GlobalModel]:
    """Global models of server start ``start`` sent at ``sent_at``, delivered by the client's
    endpoint (each remembered with its stamp, as the MQTT endpoint delivers them)."""
    from fedsim.protocol.codec import Frame

    return [incarnation.delivered(Frame(GlobalModel(1, np.zeros(2, np.float32), t), start))
            for t in sent_at]


def test_a_restarted_servers_timeline_is_measured_afresh() -> None:
    """A server restarted while its client goes on resumes its clock from its checkpoint, 7 s
    behind the clock it had: the client's lead measured before the restart is 7 s too small,
    and taking the least of both said its stop 7 s past the server's time. The lead is measured
    per server start (the run incarnation the client follows)."""
    from fedsim.clock import ScaledClock
    from fedsim.runtime.deployed.client_lives import ServerTimeline

    client = ScaledClock(1000.0, start=50.0)  # a second of scenario time is 1000 wall s
    following = ClientIncarnation(current="first")
    timeline = ServerTimeline(client, latest=1000.0, incarnation=following)
    (first,) = _models_of(following, "first", 45.0)
    timeline.observe(first)  # the first start's model: a lead of 5 s
    assert 44.9 < timeline.time_of(client.now()) <= 45.1
    assert following.confirm("restarted", ("first",))  # its checkpoint's clock: 38 s at 50 s
    restarted, later = _models_of(following, "restarted", 38.0, 38.5)
    timeline.observe(restarted)
    assert timeline.lead is not None and 11.9 < timeline.lead <= 12.1
    assert 37.9 < timeline.time_of(client.now()) <= 38.1
    timeline.observe(later)  # later models of the same start: the least lead again
    assert 11.4 < timeline.lead <= 11.6


def test_an_earlier_starts_message_taken_up_late_counts_for_its_own_start() -> None:
    """A model of the first server start, delivered while the client followed it but taken up
    after it followed the restarted one (queued, or on an emulated downlink), was measured as
    the restarted start's: its lead (the old clock's, 7 s ahead) became the least, and the
    client's stop was said 7 s late. It counts for the start it is stamped with: before the
    new start is measured it is the first start's; after, it is left out."""
    from fedsim.clock import ScaledClock
    from fedsim.runtime.deployed.client_lives import ServerTimeline

    client = ScaledClock(1000.0, start=50.0)
    following = ClientIncarnation(current="first")
    timeline = ServerTimeline(client, latest=1000.0, incarnation=following)
    early, queued, late = _models_of(following, "first", 45.0, 46.0, 49.9)
    timeline.observe(early)
    assert following.confirm("restarted", ("first",))  # followed before the two are taken up
    timeline.observe(queued)  # the first start's still: its lead of 4 s (none of the new yet)
    assert timeline.lead is not None and 3.9 < timeline.lead <= 4.1
    (restarted,) = _models_of(following, "restarted", 38.0)
    timeline.observe(restarted)
    timeline.observe(late)  # the first start's, after the new one is measured: left out
    assert 11.9 < timeline.lead <= 12.1
    assert 37.9 < timeline.time_of(client.now()) <= 38.1


def test_a_delivered_messages_stamp_is_forgotten_with_the_message() -> None:
    import gc


    following = ClientIncarnation(current="first")
    (model,) = _models_of(following, "first", 1.0)
    assert following.of(model) == "first"
    assert following.of(GlobalModel(1, np.zeros(2, np.float32), 1.0)) is None  # not delivered
    del model
    gc.collect()
    assert following._stamps == {}


def test_the_mqtt_endpoint_remembers_the_start_each_model_was_stamped_with() -> None:
    """The endpoint delivers a first start's model while it follows that start, then a model
    of the restarted one (whose lineage continues it): taken up in the other order (a
    reordering downlink), the first start's model is left out of the restarted start's
    lead."""
    from fedsim.clock import ScaledClock
    from fedsim.protocol import codec
    from fedsim.runtime.deployed.client_lives import ServerTimeline
    from fedsim.transports.mqtt_client import MqttClientEndpoint

    old, new = "0123456789abcdef", "fedcba9876543210"
    client = ScaledClock(1000.0, start=50.0)

    async def main() -> tuple[MqttClientEndpoint, list]:
        endpoint = MqttClientEndpoint("mqtt://127.0.0.1:1", run="r", client_id="c1")
        endpoint.incarnation.current = old
        for model, stamp, lineage in ((GlobalModel(3, np.zeros(2, np.float32), 49.9), old, ()),
                                      (GlobalModel(4, np.zeros(2, np.float32), 38.0), new,
                                       (old,))):
            endpoint._on_message(endpoint.topics.global_model, codec.encode(
                model, incarnation=stamp, lineage=lineage))
        return endpoint, [await endpoint.receive(), await endpoint.receive()]

    endpoint, (first, restarted) = asyncio.run(main())
    assert endpoint.incarnation.current == new
    assert [endpoint.incarnation.of(m) for m in (first, restarted)] == [old, new]
    timeline = ServerTimeline(client, latest=1000.0, incarnation=endpoint.incarnation)
    timeline.observe(restarted)
    timeline.observe(first)
    assert timeline.lead is not None and 11.9 < timeline.lead <= 12.1
