"""The server's integrity checks (fedsim.runtime.actors.integrity, ServerActor validation): the norm
bound holds for honest updates and refuses hostile ones; future versions, far-ahead rounds,
forged statuses and bad mixes are refused, logged and counted; clients skip bad models."""

from __future__ import annotations

import asyncio
import dataclasses
import math
import struct

import numpy as np
import pytest
import torch
from scipy import stats
from structlog.testing import capture_logs

from fedsim.aggregation import ConstantStepSize, UniformWeights
from fedsim.aggregation.optimizers import Momentum
from fedsim.aggregation.policies import FedAsync, FedBuff
from fedsim.clock import WallClock
from fedsim.config import load_scenario
from fedsim.errors import CodecError
from fedsim.protocol import codec
from fedsim.protocol.messages import ClientStatus, ClientUpdate, GlobalModel
from fedsim.runtime.actors import integrity
from fedsim.runtime.actors.client import ClientActor
from fedsim.runtime.actors.integrity import (
    MAX_PARAMETER,
    MAX_ROUND_GAP,
    ClientLimits,
    bad_model,
    batch_size_bound,
    noise_norm_bound,
    update_norm,
    update_norm_bound,
)
from fedsim.runtime.actors.server import ClientInfo, ServerActor
from fedsim.runtime.population import build_population
from tests.doubles import RecordingEndpoint
from tests.runtime.test_actors import FakeLedger, FakeTrainer

SCENARIO = "tests/deployment/four_clients.yaml"


@pytest.mark.parametrize(("dim", "p"), [(1, 1e-12), (33, 1e-12), (26_010, 1e-12), (33, 1e-3)])
def test_noise_bound_is_a_valid_and_tight_chi_square_tail(dim: int, p: float) -> None:
    """Laurent-Massart's bound against scipy's exact chi-square quantile: above it (valid), and
    within a factor 1.6 in norm (useful)."""
    exact = math.sqrt(stats.chi2.isf(p, dim))
    bound = noise_norm_bound(dim, 1.0, p)
    assert exact <= bound <= 1.6 * exact


@pytest.mark.parametrize(("m", "n", "k"), [(1, 100, 1), (32, 500, 1), (32, 500, 4), (256, 60_000, 1)])
def test_poisson_batch_bound_is_above_the_exact_binomial_quantile(m: int, n: int, k: int) -> None:
    p = 5e-13
    exact = stats.binom.isf(p, k * (n + 1), m / n)  # the real size may be N + 1
    bound = batch_size_bound("poisson", m, n, k, p)
    assert exact <= bound <= max(3.5 * exact, k * m + 40)
    assert batch_size_bound("fixed", m, n, k, p) == k * m


def test_worst_case_honest_updates_never_exceed_the_bound() -> None:
    """200,000 worst-case honest Poisson rounds (every clipped gradient of norm C in the same
    direction, the batch size and the noise drawn as in DP-SGD): none exceeds the bound, and
    the bound is within a small factor of the largest seen (it is not vacuous)."""
    rng = np.random.default_rng(7)
    dim, m, n, clip, sigma = 33, 8, 200, 1.0, 0.6
    bound = update_norm_bound(sampling="poisson", clip=clip, sigma=sigma, batch_size=m,
                              num_samples=n, dim=dim)
    rounds = 200_000
    sizes = rng.binomial(n, m / n, size=rounds)
    noise = rng.standard_normal((rounds, dim)) * clip * sigma
    noise[:, 0] += sizes * clip  # the aligned signal, along the first axis
    norms = np.linalg.norm(noise, axis=1) / m
    assert norms.max() <= bound < 4 * norms.max()
    print(f"largest worst-case honest norm {norms.max():.3f}, bound {bound:.3f}")


def test_real_training_rounds_stay_below_their_bound() -> None:
    """Every client of the deployment scenario trains 300 real DP-SGD rounds: no update exceeds
    its client's bound; ten times the largest one exceeds it."""
    population = build_population(load_scenario(SCENARIO))
    dim = population.initial_params.size
    largest = 0.0
    for plan in population.plans[:2]:
        trainer = population.trainer(plan, generator=torch.Generator().manual_seed(3))
        limits = ClientLimits(sampling=plan.group.sampling, batch_size=plan.group.batch_size,
                              num_samples=plan.num_samples, dim=dim, clip=plan.schedule.clip,
                              sigma=plan.schedule.sigma)
        params = population.initial_params.copy()
        for r in range(300):
            result = trainer.begin_round(params, r).result()
            norm = update_norm(result.update)
            assert norm <= limits.norm_bound(r), (plan.client_id, r, norm)
            largest = max(largest, norm / limits.norm_bound(r))
            params = params - plan.group.local_lr * result.update
    assert 10 * largest > 1.0
    print(f"largest honest norm / bound: {largest:.3f}")


LIMITS = ClientLimits(sampling="poisson", batch_size=32, num_samples=500, dim=3,
                      clip=lambda r: 1.0, sigma=lambda r: 1.0, max_rounds=50)
BOUND = LIMITS.norm_bound(0)


def _server(**kwargs: object) -> tuple[ServerActor, WallClock]:
    clock = WallClock()
    clients = {c: ClientInfo(500, 1.0, limits=LIMITS) for c in ("a", "b")}
    server = ServerActor(clock=clock, endpoint=RecordingEndpoint(), initial_params=np.zeros(3),
                         clients=clients, window=1.0, strategy=UniformWeights(),
                         step_size=ConstantStepSize(1.0), **kwargs)  # type: ignore[arg-type]
    return server, clock


def _update(client: str, round_: int, values: object, base: int = 0) -> ClientUpdate:
    return ClientUpdate(client, round_, base, np.asarray(values, np.float32).reshape(3), 32.0)


def test_hostile_updates_are_rejected_logged_and_counted_by_kind() -> None:
    server, _ = _server()
    honest = _update("a", 0, [0.5, -0.2, 0.1])
    hostile = [
        _update("b", 0, np.full(3, 3.4e38)),
        _update("b", 1, [math.nan, 0, 0]),
        _update("b", 2, [math.inf, 0, 0]),
        _update("b", 3, np.full(3, 10 * BOUND / math.sqrt(3))),
        _update("b", 4, [0.1, 0.1, 0.1], base=10**12),
        _update("b", 10**12, [0.1, 0.1, 0.1]),
        _update("b", 49 + MAX_ROUND_GAP, [0.1, 0.1, 0.1]),
        _update("mallory", 0, [0.1, 0.1, 0.1]),
    ]
    server._inbox = [honest, *hostile, honest]
    with capture_logs() as logs:
        report = server.close_window()
    assert report.applied == 1 and report.duplicate == 1 and report.rejected == len(hostile)
    assert report.rejections == {"future_version": 1, "non_finite": 2, "norm": 2,
                                 "round_ahead": 2, "unknown_client": 1}
    rejected = [e for e in logs if e["event"] == "update rejected"]
    assert len(rejected) == len(hostile) and all(e["reason"] for e in rejected)
    assert any(e["event"].startswith("duplicate update ignored") for e in logs)
    # No hostile round entered the client book: one round judged, none beyond it.
    assert ("a", 0) in server.book and server.book.judged_count("a") == 1
    assert server.book.known_rounds("a") == 1
    assert np.allclose(server.params, -honest.delta) and server.version == 1
    line = report.metrics_line(rejected=report.rejected, dropped_in_flight=0, active_clients=2,
                               min_remaining_epsilon=None, refused={"non_finite": 1})
    assert line["rejections"]["non_finite"] == 3


def test_the_codec_refuses_astronomic_counters() -> None:
    update = _update("b", 2**53, [0.0, 0.0, 0.0])
    with pytest.raises(CodecError):
        codec.encode(update)
    data = codec.encode(_update("b", 7, [0.0, 0.0, 0.0]))
    (length,) = struct.unpack_from("<I", data, 6)
    header = data[10 : 10 + length].replace(b'"round":7', b'"round":' + b"1" * 31)
    forged = data[:6] + struct.pack("<I", len(header)) + header + data[10 + length :]
    with pytest.raises(CodecError, match="round"):
        codec.decode(forged)


def test_a_mix_that_is_not_finite_is_never_applied() -> None:
    """Without known limits the norm check cannot run; the mixed model's check still refuses an
    overflowing mix (float32 max + float32 max) and the model stays as it was."""
    clock = WallClock()
    server = ServerActor(clock=clock, endpoint=RecordingEndpoint(), initial_params=np.zeros(3),
                         clients={"a": ClientInfo(1, 1.0), "b": ClientInfo(1, 1.0)}, window=1.0,
                         strategy=UniformWeights(), step_size=ConstantStepSize(2.0))
    server._inbox = [_update("a", 0, np.full(3, -3.4e38)), _update("b", 0, np.full(3, -3.4e38))]
    with capture_logs() as logs:
        report = server.close_window()
    assert report.applied == 0 and report.rejections == {"bad_mix": 2}
    assert server.version == 0 and np.array_equal(server.params, np.zeros(3))
    assert any(e["event"].startswith("mixed model refused") for e in logs)


@pytest.mark.parametrize("policy", [FedAsync(alpha=0.5), FedBuff(buffer_size=2)],
                         ids=["fedasync", "fedbuff"])
def test_on_arrival_policies_check_every_update_before_it_is_buffered(policy: object) -> None:
    """The same hostile updates as under time windows, arriving one by one: each is refused
    before it reaches the buffer, so only the honest pair is applied and published."""
    server, _ = _server(policy=policy)
    honest = [_update("a", 0, [0.5, -0.2, 0.1]), _update("a", 1, [0.1, 0.1, 0.1])]
    hostile = [
        _update("b", 0, [math.nan, 0, 0]),
        _update("b", 1, np.full(3, 10 * BOUND / math.sqrt(3))),
        _update("b", 2, [0.1, 0.1, 0.1], base=10**12),
        _update("b", 10**12, [0.1, 0.1, 0.1]),
        _update("mallory", 0, [0.1, 0.1, 0.1]),
    ]

    async def arrive() -> None:
        for update in [honest[0], *hostile, honest[0], honest[1]]:
            await server._arrived(update)

    asyncio.run(arrive())
    report = server.close_window()
    assert report.applied == 2 and report.duplicate == 1 and report.rejected == len(hostile)
    assert report.rejections == {"future_version": 1, "non_finite": 1, "norm": 1,
                                 "round_ahead": 1, "unknown_client": 1}
    assert server.book.judged_count("a") == 2 and server.book.known_rounds("a") == 2
    published = [m for _, m in server.endpoint.published]  # type: ignore[attr-defined]
    assert len(published) == server.version and all(isinstance(m, GlobalModel) for m in published)
    assert np.isfinite(server.params).all() and np.abs(server.params).max() <= 1.0


def test_an_on_arrival_step_that_diverges_is_refused_and_the_optimizer_state_kept() -> None:
    """FedAsync with momentum: a step whose model overflows is never applied nor published,
    and the momentum buffer is the one before it (the refused update leaves no trace)."""
    clock = WallClock()
    server = ServerActor(clock=clock, endpoint=RecordingEndpoint(), initial_params=np.zeros(3),
                         clients={"a": ClientInfo(1, 1.0), "b": ClientInfo(1, 1.0)}, window=1.0,
                         strategy=UniformWeights(), step_size=ConstantStepSize(2.0),
                         policy=FedAsync(alpha=1.0), optimizer=Momentum(0.9))

    async def arrive() -> None:
        await server._arrived(_update("a", 0, [0.5, 0.0, 0.0]))
        await server._arrived(_update("b", 0, np.full(3, -3.4e38)))

    with capture_logs() as logs:
        asyncio.run(arrive())
    momentum = server.optimizer.state()["m"]
    assert np.allclose(momentum, [-0.5, 0.0, 0.0])  # m = -d of the one applied update
    assert server.version == 1 and np.allclose(server.params, [-1.0, 0.0, 0.0])
    assert len(server.endpoint.published) == 1  # type: ignore[attr-defined]
    report = server.close_window()
    assert report.applied == 1 and report.rejections == {"bad_mix": 1}
    assert any(e["event"].startswith("mixed model refused") for e in logs)


def test_statuses_that_contradict_what_the_server_saw_are_rejected() -> None:
    server, _ = _server()
    server._inbox = [_update("a", r, [0.01, 0, 0]) for r in range(3)]
    server.close_window()
    with capture_logs() as logs:
        assert not server.accept_status(ClientStatus("a", "done", 1, 1.0, 1e-5))  # saw 3
        assert not server.accept_status(ClientStatus("a", "done", 10**9, 1.0, 1e-5))
        assert not server.accept_status(ClientStatus("a", "done", 7, 1.0, 1e-5))  # limit 50
        assert not server.accept_status(ClientStatus("mallory", "done", 50, 1.0, 1e-5))
    assert "a" not in server.statuses and len([e for e in logs if e["kind"]]) == 4
    # A consistent "finished" status is kept, and removed again by a later round.
    assert server.accept_status(ClientStatus("a", "budget_exhausted", 3, 1.0, 1e-5))
    assert server.missing_updates() == 0
    server._inbox = [_update("a", 5, [0.01, 0, 0])]
    report = server.close_window()
    assert "a" not in server.statuses
    assert report.rejections == {"status_inconsistent": 3 + 1, "unknown_client": 1}
    # Rounds 3 and 4 were released (round 5 arrived) but never received.
    assert server.missing_updates() == 2


def test_restored_servers_keep_the_round_tables_and_incarnations() -> None:
    server, _ = _server()
    server.incarnations = ("ab", "cd")
    server._inbox = [_update("a", r, [0.01, 0, 0]) for r in (0, 2)]
    server.close_window()
    twin, _ = _server()
    twin.restore(server.snapshot())
    assert twin.incarnations == ("ab", "cd") and twin.missing_updates() == 1


def test_a_client_skips_a_bad_global_model_and_trains_on_the_next_good_one() -> None:
    clock = WallClock()
    actor = ClientActor("a", clock=clock, endpoint=RecordingEndpoint(), trainer=FakeTrainer(),
                        ledger=FakeLedger(5, []), local_lr=0.1, batch_size=10,
                        seconds_per_sample=lambda: 0.0)
    assert actor.accept_global(GlobalModel(1, np.zeros(3, np.float32)))
    with capture_logs() as logs:
        assert not actor.accept_global(GlobalModel(2, np.full(3, -3.4e38, np.float32)))
        assert not actor.accept_global(GlobalModel(3, np.array([0, math.nan, 0], np.float32)))
        assert not actor.accept_global(GlobalModel(4, np.zeros(4, np.float32)))
    assert [e["event"] for e in logs] == ["bad global model skipped"] * 3
    assert actor.held_version == 1 and actor.accept_global(GlobalModel(5, np.ones(3, np.float32)))


def test_bad_model_decides_what_isfinite_and_the_largest_magnitude_decide() -> None:
    """The two-reduction check (max and min) gives the verdict of the plain one (isfinite of
    every value, then max |x| against MAX_PARAMETER), message included, on vectors with NaN,
    +-inf, -0.0, huge finite values and the bound's neighbours at every position."""
    def plain(params: np.ndarray, size: int | None) -> str:
        if size is not None and params.size != size:
            return f"{params.size} parameters, the model has {size}"
        if not np.isfinite(params).all():
            return "not finite"
        largest = float(np.max(np.abs(params))) if params.size else 0.0
        if largest > MAX_PARAMETER:
            return f"a parameter of magnitude {largest:.3g} exceeds {MAX_PARAMETER:g}"
        return ""

    rng = np.random.default_rng(3)
    bound = np.float32(MAX_PARAMETER)
    specials = [np.nan, np.inf, -np.inf, -0.0, 3.4e38, -3.4e38, bound, -bound,
                np.nextafter(bound, np.float32(np.inf)), -np.nextafter(bound, np.float32(np.inf))]
    cases = [np.zeros(0, np.float32), np.full(5, -0.0, np.float32)]
    for special in specials:
        for position in (0, 3, 6):
            vector = rng.standard_normal(7).astype(np.float32)
            vector[position] = special
            cases.append(vector)
    for _ in range(50):
        vector = (rng.standard_normal(9) * 10.0 ** rng.integers(0, 8)).astype(np.float32)
        vector[rng.integers(9)] = rng.choice(np.array(specials, np.float32))
        vector[rng.integers(9)] = rng.choice(np.array(specials, np.float32))
        cases.append(vector)
    verdicts: set[str] = set()
    for vector in cases:
        for size in (None, vector.size, vector.size + 1):
            assert bad_model(vector, size) == plain(vector, size), (vector, size)
            verdicts.add((plain(vector, size).split(" ") + [""])[1])
    assert verdicts == {"", "parameters,", "finite", "parameter"}  # every kind of verdict seen


def test_bad_model_keeps_a_verdict_only_for_values_that_cannot_change() -> None:
    """A broadcast's model (a view of immutable bytes, or a read-only array its sender gave
    up) is checked once for every client asking about it; an array whose values can change
    (writeable, a view of a bytearray, a read-only view of a writeable array) is checked at
    every call, so a verdict never outlives the values it judged."""
    good = np.ones(6, np.float32)
    frame = codec.encode(GlobalModel(3, good))
    shared = codec.decode(frame).params  # type: ignore[union-attr]
    assert bad_model(shared, 6) == "" and bad_model(shared, 6) == ""
    kept = integrity._last_verdict
    assert kept is not None and kept[0] is frame and kept[3] == ""  # held by the frame
    assert bad_model(shared, 7) == "6 parameters, the model has 7"  # the size is part of it
    assert bad_model(shared[1:], 5) == ""  # a view of a view of the frame

    # Each client of the simulated network gets its own view of one sealed broadcast: the
    # verdict is the values', asked once for all of them.
    sealed = codec.seal(GlobalModel(4, np.ones(6, np.float32)))
    first, second = (sealed.open().params for _ in range(2))  # type: ignore[union-attr]
    assert first is not second and bad_model(first, 6) == ""
    kept = integrity._last_verdict
    assert bad_model(second, 6) == "" and integrity._last_verdict is kept  # not asked again
    # Other values of the same memory (another offset, stride or dtype) are asked anew.
    mixed = np.array([1, 1, 1, np.inf, 1, 1], np.float32)
    mixed.flags.writeable = False
    assert bad_model(mixed[:3], 3) == "" and bad_model(mixed[3:], 3) == "not finite"
    assert bad_model(mixed[::2], 3) == "" and bad_model(mixed[1::2], 3) == "not finite"
    assert bad_model(mixed[:3], 3) == ""  # (kept) and the same memory as integers:
    assert bad_model(mixed.view(np.int32)[:3], 3).startswith("a parameter of magnitude 1.07e+09")

    owned = np.ones(6, np.float32)
    assert bad_model(owned, 6) == ""
    owned[2] = np.nan
    assert bad_model(owned, 6) == "not finite"
    buffer = bytearray(np.ones(6, np.float32).tobytes())
    view = np.frombuffer(buffer, np.float32)
    assert bad_model(view, 6) == ""
    buffer[0:4] = np.float32(np.inf).tobytes()
    assert bad_model(view, 6) == "not finite"
    readable = np.ones(6, np.float32)
    readonly_view = readable[:]
    readonly_view.setflags(write=False)  # read-only, but its base is not
    assert bad_model(readonly_view, 6) == ""
    readable[0] = 2e6
    assert bad_model(readonly_view, 6).startswith("a parameter of magnitude 2e+06")
    assert integrity._last_verdict is not None
    assert all(integrity._last_verdict[0] is not a for a in (owned, view, readonly_view))

    given_up = np.ones(6, np.float32)  # a sent array: the sender made it read-only
    given_up.setflags(write=False)
    assert bad_model(given_up, 6) == ""
    assert integrity._last_verdict[0] is given_up


def test_a_round_with_a_non_finite_update_is_neither_released_nor_charged() -> None:
    clock = WallClock()
    endpoint = RecordingEndpoint()
    ledger = FakeLedger(5, [])
    actor = ClientActor("a", clock=clock, endpoint=endpoint, trainer=FakeTrainer(), ledger=ledger,
                        local_lr=0.1, batch_size=10,
                        seconds_per_sample=lambda: 0.0, max_rounds=2)
    # Bypass the receive check: a model that overflows in training (params + 1 = inf).
    actor.held_version, actor.w = 0, np.full(3, np.inf, np.float32)
    actor.held_global = actor.w

    async def scenario() -> None:
        task = asyncio.create_task(actor._rounds())
        await asyncio.sleep(0)
        await asyncio.sleep(0)
        assert ledger.spent == [] and endpoint.published == []
        actor.accept_global(GlobalModel(1, np.zeros(3, np.float32)))
        await asyncio.wait_for(task, 5)

    asyncio.run(scenario())
    updates = [m for _, m in endpoint.published if isinstance(m, ClientUpdate)]
    assert [u.round for u in updates] == [0, 1] and len(ledger.spent) == 2


def test_a_status_cannot_claim_rounds_far_beyond_what_the_server_knows() -> None:
    """A budget-limited client (no round limit) claiming 2**53 - 1 released rounds: on main the
    status was kept, ``dropped_in_flight`` reported 2**53 lost updates, and the round-ahead
    check of its updates was void (any round up to 2**53 was 'known')."""
    limits = dataclasses.replace(LIMITS, max_rounds=None)
    clock = WallClock()
    server = ServerActor(clock=clock, endpoint=RecordingEndpoint(), initial_params=np.zeros(3),
                         clients={"a": ClientInfo(500, 1.0, limits=limits)}, window=1.0,
                         strategy=UniformWeights(), step_size=ConstantStepSize(1.0))
    server._inbox = [_update("a", r, [0.01, 0, 0]) for r in range(3)]
    server.close_window()
    with capture_logs() as logs:
        assert not server.accept_status(ClientStatus("a", "training", 2**53 - 1, 1.0, 1e-5))
    assert any(e.get("kind") == "status_inconsistent" for e in logs)
    assert server.missing_updates() == 0
    server._inbox = [_update("a", 10**15, [0.01, 0, 0])]
    report = server.close_window()
    assert report.rejections == {"round_ahead": 1, "status_inconsistent": 1}
    # Within the gap a status is kept (updates in flight, or lost).
    assert server.accept_status(ClientStatus("a", "training", 3 + MAX_ROUND_GAP, 1.0, 1e-5))
