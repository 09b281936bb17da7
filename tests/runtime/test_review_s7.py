"""Session 7 attacker's review of issue 16's features against docs/SECURITY.md (simulated).

Each test states an attack and what the threat model promises, and pins down that the
promise holds (the findings of that review, R1-R5, were fixed; docs/SECURITY.md names them).
"""

from __future__ import annotations

import asyncio
import math
import time
from typing import Any

import numpy as np
import pytest
import torch

from fedsim.aggregation import ConstantStepSize, UniformWeights
from fedsim.aggregation.policies import FedAsync, FedBuff, PolynomialStaleness, TimeWindows
from fedsim.clock import ScaledClock, WallClock
from fedsim.protocol.messages import ClientUpdate, GlobalModel
from fedsim.runtime.actors.client import ClientActor
from fedsim.runtime.actors.exposure import ClientExposure
from fedsim.runtime.actors.integrity import ClientLimits
from fedsim.runtime.actors.server import ClientInfo, ServerActor
from fedsim.training.rounds import RoundResult
from tests.doubles import FreeLedger, RecordingEndpoint

DIM = 3
LIMITS = ClientLimits(sampling="poisson", batch_size=32, num_samples=500, dim=DIM,
                      clip=lambda r: 1.0, sigma=lambda r: 1.0, max_rounds=200)
BOUND = LIMITS.norm_bound(0)


def _server(policy: Any = None, **kwargs: Any) -> ServerActor:
    # Each client's public compute slot is the window: an honest client releases at most one
    # round per window (plus the pacer's burst after idle time).
    clients = {c: ClientInfo(500, 1.0, limits=LIMITS, slot=1.0) for c in ("mallory", "h1", "h2")}
    return ServerActor(clock=WallClock(), endpoint=RecordingEndpoint(), initial_params=np.zeros(DIM),
                       clients=clients, window=1.0, strategy=UniformWeights(),
                       step_size=ConstantStepSize(1.0), policy=policy, **kwargs)


def _update(client: str, round_: int, values: Any, base: int = 0) -> ClientUpdate:
    return ClientUpdate(client, round_, base, np.asarray(values, np.float32).reshape(DIM), 32.0)


# ---------------------------------------------------------------------------------------------
# 4. One malicious client under on-arrival aggregation

FLOOD = 60  # rounds one client sends within one window (all within its round limit)


def _one_window_of_flooding(policy: Any, **kwargs: Any) -> float:
    """Mallory sends FLOOD rounds in one window, each a legal update of norm just under its
    bound pointing along -e1 (the model moves along +e1), and claims the server's current
    version as its base every time (what it sees on the global topic: fresh). h1 and h2 send
    one honest (zero) update each. Returns how far the model moved along e1 in that window."""
    server = _server(policy, **kwargs)
    push = np.array([-0.999 * BOUND, 0.0, 0.0])
    honest = [_update("h1", 0, np.zeros(DIM)), _update("h2", 0, np.zeros(DIM))]

    async def arrive() -> None:
        for r in range(FLOOD):
            message = _update("mallory", r, push, base=server.version)
            if server.policy.on_arrival:
                await server._arrived(message)
            else:
                server._inbox.append(message)
        for message in honest:
            if server.policy.on_arrival:
                await server._arrived(message)
            else:
                server._inbox.append(message)

    asyncio.run(arrive())
    server.close_window()
    return float(server.params[0])


def test_under_windows_one_clients_flood_moves_the_model_at_most_one_bound_per_window() -> None:
    """Time windows normalised over the window: the mix is convex, so however many rounds
    Mallory sends, one window moves the model by at most s_t eta bound (SECURITY.md). With the
    pacer (runtime/admission.py) only one of her rounds is judged in this window (one token at
    the start, slot = window), a third of the mix: before it, 60 of 62 updates, 0.97 bounds."""
    moved = _one_window_of_flooding(TimeWindows())
    assert moved <= BOUND * (1 + 1e-6)
    assert moved == pytest.approx(0.999 * BOUND / 3, rel=1e-5)


@pytest.mark.parametrize("policy", [FedAsync(alpha=0.5), FedBuff(buffer_size=2)],
                         ids=["fedasync", "fedbuff"])
def test_on_arrival_one_clients_flood_moves_the_model_at_most_one_bound_per_window(
        policy: Any) -> None:
    moved = _one_window_of_flooding(policy)
    assert moved <= BOUND * (1 + 1e-6), f"moved {moved / BOUND:.1f} bounds in one window"


def test_one_clients_flood_cannot_make_the_honest_updates_stale() -> None:
    server = _server(FedAsync(alpha=0.5), max_staleness=5)
    push = np.array([-0.5 * BOUND, 0.0, 0.0])

    async def arrive() -> None:
        for r in range(FLOOD):
            await server._arrived(_update("mallory", r, push, base=server.version))
        await server._arrived(_update("h1", 0, [0.0, -0.5, 0.0], base=0))

    asyncio.run(arrive())
    report = server.close_window()
    assert ("h1", 0, 0) in report.applied_updates, (report.stale, server.version)


def test_under_population_weights_one_clients_flood_moves_the_model_at_most_its_share() -> None:
    moved = _one_window_of_flooding(TimeWindows(), normalize="population")
    assert moved <= BOUND / 3 * (1 + 1e-6), f"moved {moved / BOUND:.1f} bounds in one window"


def test_a_client_cannot_claim_a_base_version_ahead_of_the_server() -> None:
    server = _server(FedAsync(alpha=1.0))

    async def arrive() -> None:
        await server._arrived(_update("mallory", 0, [0.1, 0, 0], base=server.version + 1))

    asyncio.run(arrive())
    report = server.close_window()
    assert report.rejections == {"future_version": 1} and server.version == 0


def test_a_client_cannot_claim_freshness_of_a_version_never_published() -> None:
    server = _server(TimeWindows(PolynomialStaleness(1.0)), broadcast_every=2)

    async def main() -> None:
        await server.broadcast()  # version 0 is published
        server._inbox = [_update("h1", 0, [0.1, 0, 0])]
        server.close_window()  # version 1, not broadcast (broadcast_every = 2)
    asyncio.run(main())
    assert server.version == 1
    published = {m.version for _, m in server.endpoint.published}  # type: ignore[attr-defined]
    assert published == {0}
    before = server.params.copy()
    # Mallory claims version 1, which nobody was ever sent; h2 honestly says 0.
    server._inbox = [_update("mallory", 0, [-1.0, 0, 0], base=1),
                     _update("h2", 0, [0, -1.0, 0], base=0)]
    report = server.close_window()
    moved = server.params - before
    # Finding R4c (fixed): the claim of a version never published is refused (an honest client
    # can only have trained on a published model), so it gains no weight: only h2 is applied,
    # judged on version 0 (staleness 1).
    assert report.rejections == {"unpublished_version": 1}
    assert [u[0] for u in report.applied_updates] == ["h2"]
    assert moved[0] == 0.0 and moved[1] > 0, moved


def test_published_versions_survive_a_checkpoint(tmp_path: Any) -> None:
    """A restarted server keeps refusing the unpublished version (R4c): the snapshot, through
    the checkpoint file, carries the versions published (the current one included: it may be
    broadcast right after the snapshot)."""
    from fedsim.runtime.deployed.checkpoint import ServerCheckpoint

    server = _server(TimeWindows(), broadcast_every=3)
    server.pacer.slots = {"h1": None}  # h1 not paced: four rounds in no time
    for _ in range(4):
        server._inbox = [_update("h1", server.windows_closed, [0.1, 0, 0])]
        server.close_window()
    assert server.version == 4 and [v for v in range(6) if v in server.book.published] == [0]
    checkpoint = ServerCheckpoint(tmp_path, {"run": "r4c"})
    checkpoint.save(server.snapshot())
    restored = _server(TimeWindows(), broadcast_every=3)
    loaded = checkpoint.load()
    assert loaded is not None
    restored.restore(loaded)
    assert [v for v in range(6) if v in restored.book.published] == [0, 4]
    restored._inbox = [_update("mallory", 0, [-0.1, 0, 0], base=2),
                       _update("h2", 0, [0, -0.1, 0], base=4)]
    report = restored.close_window()
    assert report.rejections == {"unpublished_version": 1} and report.applied == 1


# ---------------------------------------------------------------------------------------------
# 1. Timing of a deployed Poisson client under interrupt = switch

SLOT = 1.0  # public: seconds_per_sample 0.1 x expected batch 10
PER_RECORD = 0.02  # the real compute: 20 ms per realised record (5 records: 0.1 s, 25: 0.5 s)
SPLIT_AT = 0.7  # when the server's next model arrives, as a fraction of the slot


class _PoissonRound:
    """A round whose real compute time is its realised batch size times PER_RECORD (as a
    torch round's is), which a w-hat may split."""

    def __init__(self, realised: int) -> None:
        self.sample_grads = realised
        self.ends_at: float | None = None
        self.computed = 0

    def result(self) -> RoundResult:
        time.sleep(PER_RECORD * self.sample_grads)
        self.computed += 1
        return RoundResult(np.zeros(DIM, np.float32), [], [self.sample_grads], 1.0, 1.0, 0.0,
                           self.sample_grads)

    def switch(self, fraction: float, params: np.ndarray) -> None:
        pass

    def cancel(self) -> None:
        pass

    def keep_sums(self) -> int:  # none kept: a split moves the release a slot on
        return 0


class _Trainer:
    def __init__(self, realised: int, endpoint: RecordingEndpoint, split: bool) -> None:
        self.realised = realised
        self.split = split
        self.endpoint = endpoint
        self.begun_at = math.nan
        self.round: _PoissonRound | None = None

    def planned_steps(self, round_index: int) -> list:
        return []

    def begin_round(self, params: np.ndarray, round_index: int) -> _PoissonRound:
        self.begun_at = self.endpoint.clock.now()
        # The server's next model arrives SPLIT_AT into the round's public slot.
        if self.split:
            asyncio.get_running_loop().call_later(
                SPLIT_AT * SLOT, self.endpoint.inbox.put_nowait,
                GlobalModel(2, np.ones(DIM, np.float32)))
        self.round = _PoissonRound(self.realised)
        return self.round


def _release_offset(realised: int, *, split: bool = True) -> tuple[float, int]:
    """When a deployed (padded, threaded) switch client releases a round of ``realised``
    records split by a w-hat at SPLIT_AT of its slot: (seconds after the round began, the
    overruns it counted)."""

    async def main() -> tuple[float, int]:
        clock = ScaledClock(1.0)
        endpoint = RecordingEndpoint(clock)
        trainer = _Trainer(realised, endpoint, split)
        actor = ClientActor(
            "c1", clock=clock, endpoint=endpoint, trainer=trainer, ledger=FreeLedger(),
            local_lr=0.1, batch_size=10, seconds_per_sample=lambda: SLOT / 10, max_rounds=1,
            exposure=ClientExposure(pad_release=True, compute_in_thread=True),
            interrupt="switch", status_epsilon=lambda: (0.0, 1e-5))
        endpoint.inbox.put_nowait(GlobalModel(1, np.zeros(DIM, np.float32)))
        await asyncio.wait_for(actor.run(), 20)
        assert actor.switched_rounds == int(split) and trainer.round is not None
        assert trainer.round.computed == 1 + int(split)  # (split: computed again)
        return endpoint.updates()[0][0] - trainer.begun_at, actor.timing_overruns

    return asyncio.run(main())


def test_an_unsplit_padded_round_is_released_at_its_slot_whatever_its_batch() -> None:
    """Control: both realised batches compute inside the slot (0.1 s and 0.5 s of 1 s) and
    are released at start + slot: the padding hides the batch when nothing splits the round.
    (Padded, threaded: what a deployed client process runs.)"""
    from tests.runtime.test_event_loop_during_compute import client_exposure_is_threaded

    assert client_exposure_is_threaded()
    for realised in (5, 25):
        offset, overruns = _release_offset(realised, split=False)
        assert offset == pytest.approx(SLOT, abs=0.15) and overruns == 0


def test_a_split_padded_round_is_released_at_a_time_that_does_not_depend_on_its_batch() -> None:
    small, small_overruns = _release_offset(5)
    large, large_overruns = _release_offset(25)
    assert small == pytest.approx(large, abs=0.15), (small, large, small_overruns,
                                                       large_overruns)


# ---------------------------------------------------------------------------------------------
# 2. Adaptive clipping and the server's norm bound


def _adaptive_scenario() -> dict[str, Any]:
    """Two honest clients whose adaptive clip starts far below their gradients' norms (0.01):
    Andrew et al.'s rule raises it geometrically towards the 0.9 quantile, as designed."""
    return {
        "name": "adaptive", "seed": 3, "stop": {"windows": 12},
        "dataset": {"name": "synthetic", "num_samples": 400, "num_test_samples": 100,
                    "num_features": 8, "num_classes": 3},
        "model": {"name": "logreg"},
        "clients": {"groups": [
            {"name": "a", "count": 2, "data_share": 1.0, "batch_size": 20, "clip": 0.01,
             "noise": 1.0, "local_lr": 0.2, "rounds": 12, "speed": 0.02,
             "adaptive_clip": {"target_quantile": 0.9, "learning_rate": 0.5,
                               "count_noise_std": 2.0}},
        ]},
        "server": {"window": 0.5},
    }


def test_honest_adaptive_clipping_clients_are_not_refused_by_the_norm_bound(tmp_path: Any) -> None:
    import json

    from fedsim.config import LoadedScenario, parse_scenario
    from fedsim.runtime.simulated.simulation import run_scenario

    torch.set_num_threads(1)
    run_scenario(LoadedScenario(parse_scenario(_adaptive_scenario()), None), tmp_path)
    lines = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    windows = [line for line in lines if "rejections" in line]
    refused = sum(line["rejections"].get("norm", 0) for line in windows)
    applied = sum(line["applied"] for line in windows)
    assert applied > 0
    assert refused == 0, f"{refused} honest updates refused as 'norm', {applied} applied"


def _adaptive_group(**adaptive: Any) -> Any:
    from fedsim.config import parse_scenario

    data = _adaptive_scenario()
    data["clients"]["groups"][0]["adaptive_clip"].update(adaptive)
    return parse_scenario(data).clients.groups[0]


@pytest.mark.parametrize("max_clip", [None, 0.3])
def test_the_norm_bound_of_adaptive_clipping_is_its_public_ceilings(max_clip: float | None) -> None:
    """Fix of R2: the server bounds an adaptive-clipping client with the public ceiling
    ``max_clip`` (default 10x the start) and the sum's raised noise multiplier. Recomputed by
    hand from the module docstring's formula; an update just under it is applied, one just
    over it refused as 'norm'."""
    from fedsim.privacy.schedules import Schedule
    from fedsim.runtime.actors.integrity import client_limits

    group = _adaptive_group(**({} if max_clip is None else {"max_clip": max_clip}))
    ceiling = 0.1 if max_clip is None else max_clip  # 10 x the start 0.01
    limits = client_limits(group, 200, Schedule(total_steps=None, sigma_0=1.0, clip_0=0.01), DIM)
    # By hand: Poisson, m = 20, N = 200, one step, p = 1e-12 split in two.
    m, n, p = 20.0, 200, 1e-12
    x = math.log(2 / p)
    mean = m * (n + 1) / n
    total = min(mean * (1 + (x + math.sqrt(x * x + 8 * mean * x)) / (2 * mean)), n + 1.0)
    sum_sigma = (1.0 - (0.5 / 2.0) ** 2) ** -0.5  # 1/sigma^2 = 1/s^2 + (1/2 / sigma_b)^2
    noise = ceiling * sum_sigma * math.sqrt(DIM + 2 * math.sqrt(DIM * x) + 2 * x)
    bound = (ceiling * total + noise) / m
    assert limits.norm_bound(0) == pytest.approx(bound, rel=1e-12)
    assert limits.norm_bound(11) == limits.norm_bound(0)  # the ceiling, whatever the round

    server = ServerActor(clock=WallClock(), endpoint=RecordingEndpoint(), initial_params=np.zeros(DIM),
                         clients={"a": ClientInfo(200, 1.0, limits=limits)}, window=1.0,
                         strategy=UniformWeights(), step_size=ConstantStepSize(1.0))
    server._inbox = [_update("a", 0, [0.999 * bound, 0, 0]), _update("a", 1, [0, 1.001 * bound, 0])]
    report = server.close_window()
    assert ("a", 0, 0) in report.applied_updates
    assert report.rejections == {"norm": 1}


def test_adaptive_clipping_never_exceeds_its_ceiling_and_the_ceiling_is_validated() -> None:
    from fedsim.config import LoadedScenario, parse_scenario
    from fedsim.errors import FedsimError
    from fedsim.runtime.population import build_population

    with pytest.raises((FedsimError, ValueError), match="below the starting clip"):
        _adaptive_group(max_clip=0.005)
    with pytest.raises((FedsimError, ValueError), match="max_clip"):
        _adaptive_group(max_clip=0.0)
    data = _adaptive_scenario()
    data["clients"]["groups"][0]["adaptive_clip"]["max_clip"] = 0.05
    population = build_population(LoadedScenario(parse_scenario(data), None))
    trainer = population.trainer(population.plans[0])
    params = population.initial_params
    clips = [trainer.run_round(params, r).clip for r in range(8)]
    assert max(clips) == pytest.approx(0.05) and clips[0] < 0.05  # it grew and stopped at 0.05


# ---------------------------------------------------------------------------------------------
# 3. Local-SGD per-example steps: the clip applies to each example's whole a_h


def test_per_example_steps_clip_the_result_of_the_local_steps_not_each_step() -> None:
    """``per_example_steps = 3``: each a_h = (w - w_h) / lr after 3 SGD steps on example h
    alone must be clipped as a whole (one example, one clipped vector: sensitivity C, what the
    accountant charges). Independent computation: plain autograd loops per example. Clipping
    each step's gradient instead gives a sum up to 3 C per example; the clip is chosen so that
    the two differ."""
    from fedsim.training.persample import engine_for, per_example_cross_entropy

    torch.manual_seed(0)
    model = torch.nn.Linear(5, 3)
    x, y = torch.randn(6, 5), torch.randint(0, 3, (6,))
    clip, steps, lr = 0.3, 3, 0.05
    got = engine_for(model).clipped_local_updates(x, y, clip, steps, lr).flat_sum

    start = [p.detach().clone() for p in model.parameters()]
    whole, per_step = torch.zeros(got.numel()), torch.zeros(got.numel())
    for h in range(len(x)):
        current = [p.clone().requires_grad_(True) for p in start]
        step_sum = torch.zeros(got.numel())
        for _ in range(steps):
            out = torch.nn.functional.linear(x[h:h + 1], current[0], current[1])
            loss = per_example_cross_entropy(out, y[h:h + 1]).sum()
            grads = torch.autograd.grad(loss, current)
            flat = torch.cat([g.reshape(-1) for g in grads])
            step_sum += flat * min(1.0, clip / (float(flat.norm()) + 1e-6))
            current = [(c - lr * g).detach().requires_grad_(True) for c, g in zip(current, grads, strict=True)]
        a_h = torch.cat([((s - c) / lr).reshape(-1) for s, c in zip(start, current, strict=True)]).detach()
        whole += a_h * min(1.0, clip / (float(a_h.norm()) + 1e-6))
        per_step += step_sum
    assert float((whole - per_step).norm()) > 0.1 * float(whole.norm())  # the two rules differ
    assert torch.allclose(got.detach().float(), whole, atol=1e-5), (got, whole)
    # Each example contributes at most C: the sum of 6 is within 6 C.
    assert float(got.norm()) <= len(x) * clip + 1e-5


# ---------------------------------------------------------------------------------------------
# 5. The server step size on the wire: post-processing for the client's ledger


def _rounds_under_server_step(step: float, ledger_path: Any) -> tuple[float, list, list]:
    """Three real DP rounds (LocalTrainer, PrivacyLedger file) of a client that follows the
    server step size ``step`` carried by every global model: (eps, ledger steps, updates)."""
    from fedsim.privacy.ledger import PrivacyLedger
    from fedsim.privacy.schedules import Schedule
    from fedsim.runtime.simulated.kernel import VirtualClock, run_virtual
    from fedsim.training.local import LocalTrainer, flat_params

    torch.manual_seed(0)
    model = torch.nn.Linear(4, 2)
    x, y = torch.randn(50, 4), torch.randint(0, 2, (50,))
    schedule = Schedule(total_steps=None, sigma_0=1.0, clip_0=1.0)
    trainer = LocalTrainer(model, x, y, batch_size=10, sampling="poisson", clip=schedule,
                           noise=schedule, generator=torch.Generator().manual_seed(1))
    start = flat_params(model)

    async def main(clock: VirtualClock) -> tuple[float, list, list]:
        endpoint = RecordingEndpoint()
        endpoint.clock = clock
        with PrivacyLedger.open(ledger_path, client_id="c1", sampling="poisson",
                                budget=None) as ledger:
            actor = ClientActor("c1", clock=clock, endpoint=endpoint, trainer=trainer,
                                ledger=ledger, local_lr=0.5, batch_size=10,
                                seconds_per_sample=lambda: 0.1, max_rounds=3)
            endpoint.inbox.put_nowait(GlobalModel(1, start, step_size=step))
            await actor.run()
            steps = [(r.step.sampling, r.step.q, r.step.sigma, r.step.count)
                     for r in ledger.records]
            return ledger.epsilon(1e-5), steps, [m.delta for _, m in endpoint.published
                                                  if isinstance(m, ClientUpdate)]

    return run_virtual(main)


def test_the_server_step_size_changes_the_model_and_never_the_ledger(tmp_path: Any) -> None:
    """A client applies the server's step size s_t to its local model (follow_server_step);
    its ledger, its epsilon and what it charges per round do not depend on it (post-processing)."""
    eps_small, steps_small, updates_small = _rounds_under_server_step(1e-3, tmp_path / "a.jsonl")
    eps_large, steps_large, updates_large = _rounds_under_server_step(1e3, tmp_path / "b.jsonl")
    assert len(updates_small) == len(updates_large) == 3
    # The step was applied: the later rounds ran at other local models.
    assert not np.allclose(updates_small[2], updates_large[2])
    assert steps_small == steps_large and len(steps_small) == 3
    assert eps_small == eps_large and eps_small > 0


def _slot_scenario(per_example_steps: int) -> dict[str, Any]:
    return {
        "name": "slot", "seed": 2, "stop": {"virtual_seconds": 20.0},
        "dataset": {"name": "synthetic", "num_samples": 200, "num_test_samples": 50,
                    "num_features": 4, "num_classes": 2},
        "model": {"name": "logreg"},
        "clients": {"groups": [{"name": "g", "count": 1, "data_share": 1.0, "batch_size": 10,
                                "clip": 1.0, "noise": 1.0, "rounds": 4, "speed": 0.05,
                                "per_example_steps": per_example_steps}]},
        "server": {"window": 100.0},  # no model arrives between its rounds
    }


def _round_gaps(per_example_steps: int, out: Any) -> list[float]:
    """Virtual time between a lone client's consecutive releases (its public compute slot)."""
    from fedsim.config import LoadedScenario, parse_scenario
    from fedsim.runtime.simulated.simulation import run_scenario

    torch.set_num_threads(1)
    data = _slot_scenario(per_example_steps)
    result = run_scenario(LoadedScenario(parse_scenario(data), None), out, keep_history=True)
    (client,) = result.clients.values()
    times = [r.time for r in client.released_rounds()]
    return [b - a for a, b in zip(times, times[1:], strict=False)]


def test_the_public_slot_covers_the_compute_of_per_example_local_steps(tmp_path: Any) -> None:
    """per_example_steps = s costs s gradients per example (LocalTrainer: "the compute is s
    times larger"), so the public slot a deployed client pads its release to (speed x
    expected gradients) must be s times longer; a slot sized for one gradient per example is
    overrun every round on hardware the speed model describes, and an overrun's release time
    follows the realised batch (R3, fixed in runtime/exposure.py expected_sample_grads)."""
    one = _round_gaps(1, tmp_path / "one")
    four = _round_gaps(4, tmp_path / "four")
    assert one == pytest.approx([0.05 * 10] * 3)
    assert four == pytest.approx([4 * 0.05 * 10] * 3)


@pytest.mark.parametrize("steps", [1, 4])
def test_the_run_horizon_counts_a_round_as_the_simulator_spends_it(steps: int,
                                                                   tmp_path: Any) -> None:
    """A round's public cost has one definition (exposure.group_sample_grads); the progress
    bar's horizon once wrote its own (batch size x local steps) without per_example_steps, and
    expected a quarter of the round with 4 such steps (issue 28, item 3)."""
    from fedsim.config import parse_scenario
    from fedsim.reporting.horizon import round_seconds

    scenario = parse_scenario(_slot_scenario(steps))
    (group,) = scenario.clients.groups
    expected = round_seconds(group, scenario)
    assert expected == pytest.approx(0.05 * 10 * steps)
    assert _round_gaps(steps, tmp_path / "run") == pytest.approx([expected] * 3)


# ---------------------------------------------------------------------------------------------
# 1b. A release that depends on one record: the non-finite round


def test_one_record_with_a_non_finite_gradient_does_not_withhold_the_round() -> None:
    from fedsim.privacy.schedules import Schedule
    from fedsim.training.local import LocalTrainer, flat_params

    torch.manual_seed(0)
    model = torch.nn.Linear(4, 2)
    x, y = torch.randn(20, 4), torch.randint(0, 2, (20,))
    x[3, 0] = 1e30  # finite (float32 holds 3.4e38), so the data loader accepts it
    schedule = Schedule(total_steps=None, sigma_0=1.0, clip_0=1.0)
    trainer = LocalTrainer(model, x, y, batch_size=20, sampling="fixed", clip=schedule,
                           noise=schedule, generator=torch.Generator().manual_seed(1))
    result = trainer.run_round(flat_params(model), 0)  # every record is in the batch
    assert np.isfinite(result.update).all()
