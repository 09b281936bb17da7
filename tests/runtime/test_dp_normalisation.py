"""DP data normalisation from YAML: the release is charged to the client's ledger as its own
event (q = 1, its own sigma, the client's neighbouring relation), composed with the DP-SGD steps
by the same accountant (checked against dp_accounting and the closed-form mu-GDP of the Gaussian
mechanism), calibrated for, refused when it alone exceeds a budget, applied to the client's
features, and kept across a restart."""

from __future__ import annotations

import math
import os
import threading
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from dp_accounting.pld import privacy_loss_distribution as dp_pld
from scipy.optimize import brentq
from scipy.stats import norm

from fedsim.config import LoadedScenario, load_scenario, parse_scenario
from fedsim.errors import ConfigError, LedgerError
from fedsim.privacy import calibration
from fedsim.privacy.ledger import NORMALISATION_ROUND, PrivacyLedger, read_ledger_steps
from fedsim.privacy.pld import PLDAccountant
from fedsim.runtime.assembly import open_ledger
from fedsim.runtime.normalisation import moments_file, normalisation_generator
from fedsim.runtime.population import build_population, plan_of
from fedsim.runtime.simulated.simulation import run_scenario
from fedsim.training.dp_stats import dp_feature_moments

REPO = Path(__file__).resolve().parents[2]
SCENARIO = REPO / "scenarios" / "dp-normalisation.yaml"
DELTA = 1e-5


def _gdp_epsilon(mu: float, delta: float) -> float:
    """eps of mu-GDP at delta (Dong, Roth & Su Cor. 2.13), solved here independently."""
    def excess(eps: float) -> float:
        return norm.cdf(-eps / mu + mu / 2) - math.exp(eps) * norm.cdf(-eps / mu - mu / 2) - delta
    return brentq(excess, 0.0, 100.0, xtol=1e-12)


@pytest.mark.parametrize("sampling", ["poisson", "fixed"])
def test_the_release_alone_is_the_gaussian_mechanism(sampling: str, tmp_path: Path) -> None:
    """The release's event is q = 1 at its sigma under the client's relation; the ledger's eps
    is that of 1/sigma-GDP (the exact Gaussian mechanism), never below it, within 1%."""
    features = torch.randn(300, 5, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    _, step = dp_feature_moments(features, sampling=sampling, noise_multiplier=2.5, bound=6.0,
                                 generator=torch.Generator().manual_seed(2))
    assert (step.sampling, step.q, step.sigma, step.count) == (sampling, 1.0, 2.5, 1)
    ledger = PrivacyLedger.open(tmp_path / "l.jsonl", client_id="c", sampling=sampling,
                                budget=None)
    ledger.spend([step], time=0.0, round=NORMALISATION_ROUND)
    exact = _gdp_epsilon(1 / 2.5, DELTA)
    assert exact * (1 - 1e-9) <= ledger.epsilon(DELTA) <= exact * 1.01
    assert ledger.rounds == frozenset()  # the release is not a training round
    ledger.close()


def test_the_release_noise_matches_its_sensitivity() -> None:
    """Poisson: the released vector (sums, B n) moves by at most sqrt(2) B when a record is
    added or removed, and gets noise std sqrt(2) B sigma; fixed: the sums move by at most 2 B
    under replace-one and get 2 B sigma. With all-zero records the released sum of x is pure
    noise (n times the mean; Poisson: up to the noisy count, n +- sqrt(2) sigma): its std over
    400 draws matches the sensitivity times sigma."""
    features = torch.zeros(50, 1, dtype=torch.float64)
    bound, sigma = 2.0, 1.5
    poisson, fixed = [], []
    for seed in range(400):
        for sampling, out in (("poisson", poisson), ("fixed", fixed)):
            moments, _ = dp_feature_moments(features, sampling=sampling, noise_multiplier=sigma,
                                            bound=bound,
                                            generator=torch.Generator().manual_seed(seed))
            out.append(float(moments.mean) * 50)
    assert np.std(fixed) == pytest.approx(2 * bound * sigma, rel=0.12)
    assert np.std(poisson) == pytest.approx(math.sqrt(2) * bound * sigma, rel=0.12)


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory):
    out = tmp_path_factory.mktemp("dpn") / "run"
    loaded = load_scenario(SCENARIO, ["stop.virtual_seconds=20", "stop.all_budgets_spent=false"])
    return loaded, run_scenario(loaded, out), out


def test_the_scenario_charges_the_release_and_composes_it_with_the_steps(run) -> None:
    """Poisson client: its ledger holds the release (round -1, q = 1, sigma 3) and its 40
    rounds' steps; its eps is dp_accounting's PLD of the Gaussian release composed with the
    40 Poisson-subsampled steps (ours pessimistic, within 1%), and the noise target (eps 3)
    was calibrated for the composition: met, and a larger sigma than the rounds alone need."""
    loaded, result, out = run
    steps = list(read_ledger_steps(out / "ledgers" / "poisson-000.jsonl"))
    release, rounds = steps[0], steps[1:]
    assert (release.sampling, release.q, release.sigma) == ("poisson", 1.0, 3.0)
    assert len(rounds) == 40 and len({(s.q, s.sigma) for s in rounds}) == 1
    q, sigma = rounds[0].q, rounds[0].sigma
    h = 1e-4
    reference = dp_pld.from_gaussian_mechanism(3.0, value_discretization_interval=h).compose(
        dp_pld.from_gaussian_mechanism(sigma, sampling_prob=q, value_discretization_interval=h)
        .self_compose(40)).get_epsilon_for_delta(DELTA)
    ours = result.clients["poisson-000"].ledger.epsilon(DELTA)
    assert reference * (1 - 1e-9) <= ours <= reference * 1.01
    assert ours <= 3.0 and ours > 2.95
    alone = calibration.calibrate_sigma("pld", "poisson", q, 40, 3.0, DELTA)
    assert sigma > alone * 1.01
    # The release is not a round: 40 rounds, 41 events.
    rows = (out / "clients.csv").read_text().splitlines()
    header = rows[0].split(",")
    first = dict(zip(header, rows[1].split(","), strict=True))
    assert (first["client_id"], first["rounds"], first["steps"]) == ("poisson-000", "40", "41")


def test_the_fixed_size_group_releases_under_replace_one_and_learns(run) -> None:
    """Fixed-size clients: the release is a replace-one event, composed with their fixed-size
    steps; the run learns on the standardised records (chance is 1/4)."""
    _, result, out = run
    steps = list(read_ledger_steps(out / "ledgers" / "fixed-000.jsonl"))
    assert (steps[0].sampling, steps[0].q, steps[0].sigma) == ("fixed", 1.0, 3.0)
    ledger = result.clients["fixed-000"].ledger
    assert ledger.epsilon(DELTA) == pytest.approx(PLDAccountant(steps).epsilon(DELTA), rel=1e-9)
    assert ledger.epsilon(DELTA) > PLDAccountant(steps[1:]).epsilon(DELTA)
    assert result.summary["final_accuracy"] > 0.5


def test_clients_train_on_standardised_features_and_keep_them_across_a_restart(
        tmp_path: Path) -> None:
    """The trainer's features have mean ~0 and std ~1 per feature (up to the release's noise);
    a restarted client loads the kept moments (the same features, nothing charged again); with
    the moments file lost it releases again and pays again. A message-only trainer is charged
    the same release."""
    loaded = load_scenario(SCENARIO)
    population = build_population(loaded)
    plan = plan_of(population, "poisson-000")
    path = tmp_path / "ledgers" / "poisson-000.jsonl"
    ledger = open_ledger(plan, path)
    first = population.trainer(plan, ledger=ledger)
    x = first.features
    assert torch.allclose(x.mean(0), torch.zeros(16, dtype=x.dtype), atol=0.35)
    assert torch.allclose(x.std(0), torch.ones(16, dtype=x.dtype), atol=0.35)
    assert moments_file(path).exists() and len(ledger.records) == 1
    again = population.trainer(plan, ledger=ledger, normalisation_generator=normalisation_generator(
        population.tree, plan.client_id, "os_entropy"))
    assert torch.equal(again.features, x)
    assert len(ledger.records) == 1
    moments_file(path).unlink()
    population.trainer(plan, ledger=ledger)
    assert [r.round for r in ledger.records] == [NORMALISATION_ROUND, NORMALISATION_ROUND]
    ledger.close()
    other = open_ledger(plan_of(population, "fixed-000"), tmp_path / "m.jsonl")
    population.trainer(plan_of(population, "fixed-000"), ledger=other, message_only=True)
    assert [(r.round, r.step.q) for r in other.records] == [(NORMALISATION_ROUND, 1.0)]
    other.close()
    with pytest.raises(ConfigError, match="needs its ledger"):
        population.trainer(plan)


def _stored_moments(tmp_path: Path) -> tuple[Any, Any, Any, Path]:
    """A client of the scenario whose first trainer released and stored its moments: its
    population, plan, ledger and moments file."""
    population = build_population(load_scenario(SCENARIO))
    plan = plan_of(population, "poisson-000")
    path = tmp_path / "ledgers" / "poisson-000.jsonl"
    ledger = open_ledger(plan, path)
    population.trainer(plan, ledger=ledger)
    return population, plan, ledger, moments_file(path)


@pytest.mark.parametrize("damage", ["truncated", "infinite-std"])
def test_damaged_stored_moments_are_refused_with_a_message(tmp_path: Path, damage: str) -> None:
    """An attacker's review: a truncated moments file raised zipfile.BadZipFile at the client's
    start, and one with an infinite deviation was accepted (every feature divided to zero)."""
    population, plan, ledger, stored = _stored_moments(tmp_path)
    if damage == "truncated":
        stored.write_bytes(stored.read_bytes()[:40])
    else:
        with np.load(stored) as kept:
            mean, std = kept["mean"], kept["std"].copy()
        std[0] = np.inf
        with stored.open("wb") as handle:
            np.savez(handle, mean=mean, std=std)
    with pytest.raises(LedgerError, match="moments"):
        population.trainer(plan, ledger=ledger)
    assert len(ledger.records) == 1  # nothing charged again
    ledger.close()


@pytest.mark.parametrize("damage", ["fifo", "giant"])
def test_stored_moments_that_are_no_file_are_refused_not_waited_on(
        tmp_path: Path, damage: str) -> None:
    """An attacker's review (session 66b): a FIFO in place of the moments file hung the
    client's start for ever (``np.load`` opened it and waited for a writer), and a sparse
    giant there was read whole; both are refused now, with a message, nothing charged again."""
    population, plan, ledger, stored = _stored_moments(tmp_path)
    stored.unlink()
    if damage == "fifo":
        os.mkfifo(stored)
    else:
        with stored.open("wb") as handle:
            handle.truncate(1 << 30)
    outcome: list[BaseException | None] = []

    def start() -> None:
        try:
            population.trainer(plan, ledger=ledger)
            outcome.append(None)
        except BaseException as exc:  # (handed to the test's thread)
            outcome.append(exc)

    thread = threading.Thread(target=start, daemon=True)
    thread.start()
    thread.join(30)
    if thread.is_alive() and damage == "fifo":  # unblock the hung reader before failing
        with open(stored, "wb"):
            pass
        thread.join(5)
        pytest.fail("the client's start waited on a FIFO in place of its moments")
    assert len(outcome) == 1 and isinstance(outcome[0], LedgerError), outcome
    assert "moments" in str(outcome[0])
    assert len(ledger.records) == 1  # nothing charged again
    ledger.close()


def test_the_budget_check_refuses_a_release_that_alone_exceeds_the_budget() -> None:
    """sigma 0.5 (mu = 2: eps ~ 10 at 1e-5) against a budget of eps 1, and against a noise
    target of eps 1: refused before anything runs, naming the option."""
    base = parse_scenario({
        "stop": {"windows": 3}, "dataset": {"name": "synthetic", "num_samples": 400},
        "model": {"name": "logreg"}, "server": {"window": 1.0},
        "clients": {"groups": [{"name": "a", "count": 2, "data_share": 1.0, "batch_size": 8,
                                "clip": 1.0, "noise": 1.0, "budget": {"epsilon": 1.0,
                                                                      "delta": DELTA},
                                "speed": 0.01,
                                "dp_normalisation": {"noise_multiplier": 0.5, "bound": 5.0}}]},
    }).model_dump(mode="json", exclude_none=True)
    assert _gdp_epsilon(2.0, DELTA) > 1.0
    with pytest.raises(ConfigError, match=r"dp_normalisation: its release alone costs eps=9\.9"):
        build_population(LoadedScenario(parse_scenario(base), None))
    group = base["clients"]["groups"][0]
    del group["budget"]
    group.update(noise={"kind": "target", "epsilon": 1.0, "delta": DELTA}, rounds=10)
    with pytest.raises(ConfigError, match="more than the noise target's eps=1"):
        build_population(LoadedScenario(parse_scenario(base), None))
    group["dp_normalisation"]["noise_multiplier"] = 8.0  # mu = 1/8: room for the rounds
    assert build_population(LoadedScenario(parse_scenario(base), None)).plans


def test_the_progress_horizon_counts_the_release() -> None:
    """The fixed group (sigma 1.5, budget eps 3) affords n rounds: the release and n steps fit
    the budget, the release and n + 1 do not; fewer than without the release."""
    from fedsim.privacy.events import GaussianStep
    from fedsim.reporting.horizon import affordable_rounds

    group = load_scenario(SCENARIO).scenario.clients.groups[1]
    n = affordable_rounds(group, 500, limit=10**6)
    release = GaussianStep("fixed", 1.0, 3.0)

    def eps(count: int) -> float:
        return PLDAccountant([release, GaussianStep("fixed", 32 / 500, 1.5, count)]).epsilon(DELTA)

    assert eps(n) <= 3.0 < eps(n + 1)
    assert n < affordable_rounds(group.model_copy(update={"dp_normalisation": None}), 500,
                                 limit=10**6)
