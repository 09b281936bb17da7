"""DP-PCA in a run: each client's release is charged to its ledger before its first round as
its own event (q = 1, its sigma, its neighbouring relation), composed with its DP-SGD steps by
the same accountant (checked against dp_accounting), calibrated for, refused when it alone
exceeds a budget; the clients' releases make one projection the model trains on; deployment
refuses it."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from dp_accounting.pld import privacy_loss_distribution as dp_pld
from scipy.optimize import brentq
from scipy.stats import norm

from fedsim.config import LoadedScenario, load_scenario, parse_scenario
from fedsim.config.loading import ScenarioError
from fedsim.errors import ConfigError
from fedsim.privacy import calibration
from fedsim.privacy.events import GaussianStep
from fedsim.privacy.ledger import NORMALISATION_ROUND, read_ledger_steps
from fedsim.privacy.pld import PLDAccountant
from fedsim.runtime.assembly import open_ledger
from fedsim.runtime.deployed.guarantees import group_guarantees, require_public_slots
from fedsim.runtime.dp_pca import PCA_FILE
from fedsim.runtime.population import build_population, plan_of
from fedsim.runtime.simulated.simulation import run_scenario

REPO = Path(__file__).resolve().parents[2]
SCENARIO = REPO / "scenarios" / "dp-pca.yaml"
DELTA = 1e-5


def _gdp_epsilon(mu: float, delta: float) -> float:
    """eps of mu-GDP at delta (Dong, Roth & Su Cor. 2.13), solved here independently."""
    def excess(eps: float) -> float:
        return norm.cdf(-eps / mu + mu / 2) - math.exp(eps) * norm.cdf(-eps / mu - mu / 2) - delta
    return brentq(excess, 0.0, 100.0, xtol=1e-12)


def _small(**changes: Any) -> dict[str, Any]:
    """A small synthetic dp_pca scenario (2 groups of 2 clients, 12 features, 4 components)."""
    group = {"count": 2, "data_share": 0.5, "batch_size": 16, "clip": 1.0, "noise": 1.0,
             "rounds": 5, "speed": 0.01,
             "dp_pca": {"components": 4, "clip": 5.0, "noise": 2.0}}
    scenario: dict[str, Any] = {
        "stop": {"virtual_seconds": 5.0}, "model": {"name": "logreg"}, "server": {"window": 0.5},
        "dataset": {"name": "synthetic", "num_samples": 800, "num_test_samples": 200,
                    "num_features": 12, "num_classes": 3},
        "clients": {"groups": [{"name": "a", "sampling": "poisson", **group},
                               {"name": "b", "sampling": "fixed", **group}]},
    }
    scenario.update(changes)
    return scenario


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory):
    """The shipped scenario, shortened (the poisson group's 120 rounds and the fixed group's
    budget as shipped; stopped at 20 virtual seconds)."""
    out = tmp_path_factory.mktemp("dppca") / "run"
    loaded = load_scenario(SCENARIO, ["stop.virtual_seconds=20", "stop.all_budgets_spent=false",
                                      "server.eval_every=1000"])
    return loaded, run_scenario(loaded, out), out


@pytest.mark.slow
def test_the_release_is_charged_first_and_composed_with_the_steps(run) -> None:
    """Poisson client: its ledger's first record is the release (round -1, q = 1, sigma 2, at
    time 0, before its first round); its eps is dp_accounting's PLD of the Gaussian release
    composed with its Poisson-subsampled steps (ours pessimistic, within 1%), and above the
    steps' alone. The release is not a round (clients.csv: steps = rounds + 1)."""
    _, result, out = run
    ledger = result.clients["poisson-000"].ledger
    first, second = ledger.records[0], ledger.records[1]
    assert (first.round, first.time) == (NORMALISATION_ROUND, 0.0)
    assert (first.step.sampling, first.step.q, first.step.sigma) == ("poisson", 1.0, 2.0)
    assert second.round == 0 and second.time >= first.time
    steps = list(read_ledger_steps(out / "ledgers" / "poisson-000.jsonl"))
    rounds = steps[1:]
    assert len({(s.q, s.sigma) for s in rounds}) == 1 and len(rounds) == len(ledger.rounds)
    q, sigma, count = rounds[0].q, rounds[0].sigma, len(rounds)
    h = 1e-4
    reference = dp_pld.from_gaussian_mechanism(2.0, value_discretization_interval=h).compose(
        dp_pld.from_gaussian_mechanism(sigma, sampling_prob=q, value_discretization_interval=h)
        .self_compose(count)).get_epsilon_for_delta(DELTA)
    ours = ledger.epsilon(DELTA)
    assert reference * (1 - 1e-9) <= ours <= reference * 1.01
    assert ours > PLDAccountant(rounds).epsilon(DELTA)
    rows = (out / "clients.csv").read_text().splitlines()
    header = rows[0].split(",")
    line = next(dict(zip(header, row.split(","), strict=True)) for row in rows[1:]
                if row.startswith("poisson-000,"))
    assert int(line["steps"]) == int(line["rounds"]) + 1 == count + 1


@pytest.mark.slow
def test_a_target_release_and_the_rounds_target_are_calibrated_for_it(run) -> None:
    """The fixed group's release noise comes from its target (eps 1.5 at 1e-5): one
    replace-one q = 1 event whose exact eps (1/sigma-GDP, solved independently) is at most 1.5
    and within 0.1% of it. The poisson group's DP-SGD target (eps 4 over 120 rounds) was
    calibrated with its release composed: a larger sigma than the rounds alone need."""
    loaded, _, out = run
    release = next(iter(read_ledger_steps(out / "ledgers" / "fixed-000.jsonl")))
    assert (release.sampling, release.q) == ("fixed", 1.0)
    exact = _gdp_epsilon(1 / release.sigma, DELTA)
    assert 1.5 * (1 - 1e-3) <= exact <= 1.5
    rounds = list(read_ledger_steps(out / "ledgers" / "poisson-000.jsonl"))[1:]
    alone = calibration.calibrate_sigma("pld", "poisson", rounds[0].q, 120, 4.0, DELTA)
    assert rounds[0].sigma > alone * 1.01
    composed = PLDAccountant([GaussianStep("poisson", 1.0, 2.0),
                              rounds[0].times(120)]).epsilon(DELTA)
    assert 4.0 * 0.99 < composed <= 4.0


@pytest.mark.slow
def test_the_model_trains_on_the_shared_projection(run) -> None:
    """The kept projection is 784 x 50 with orthonormal columns; the model's input is 50 wide;
    the run learns (chance is 0.1)."""
    _, result, out = run
    with np.load(out / "ledgers" / PCA_FILE) as stored:
        basis = stored["basis"]
    assert basis.shape == (784, 50)
    assert np.allclose(basis.T @ basis, np.eye(50), atol=1e-9)
    assert result.summary["final_accuracy"] > 0.7


def test_every_client_is_charged_and_the_population_is_projected(tmp_path: Path) -> None:
    """A small run: every ledger starts with its release (its group's relation), the
    population's features are the projection's 4 coordinates, a second run of the same
    population is refused (its ledgers would lack the release), and a message-only run is
    charged the same releases."""
    loaded = LoadedScenario(parse_scenario(_small()), None)
    population = build_population(loaded)
    result = run_scenario(loaded, tmp_path / "one", population=population)
    for client_id, client in result.clients.items():
        first = client.ledger.records[0]
        sampling = "poisson" if client_id.startswith("a-") else "fixed"
        assert (first.round, first.step) == (NORMALISATION_ROUND,
                                             GaussianStep(sampling, 1.0, 2.0))
    assert population.train_x.shape[1:] == (4,) and population.test_x.shape[1:] == (4,)
    with pytest.raises(ConfigError, match="releases were made for another run"):
        run_scenario(loaded, tmp_path / "two", population=population)
    quiet = run_scenario(loaded, tmp_path / "three", message_only=True)
    for client in quiet.clients.values():
        assert client.ledger.records[0].round == NORMALISATION_ROUND
        assert client.ledger.records[0].step.q == 1.0


NORMALISATION_BOUND = 45.0
"""Above sqrt(|z|^2 + |z|^4) for every projected record z of _small() (|z| <= |x| <= 6.3):
the normalisation release clips nothing."""


def _with_normalisation(noise_multiplier: float) -> dict[str, Any]:
    scenario = _small()
    for group in scenario["clients"]["groups"]:
        group["dp_normalisation"] = {"noise_multiplier": noise_multiplier,
                                     "bound": NORMALISATION_BOUND}
    return scenario


def test_with_dp_normalisation_both_releases_are_charged_and_composed(tmp_path: Path) -> None:
    """dp_pca beside dp_normalisation: a Poisson client's ledger starts with the PCA release and
    then the normalisation release (both round -1, q = 1, their own sigmas), and its eps is
    dp_accounting's PLD of the two Gaussian releases composed with its subsampled steps (ours
    pessimistic, within 1%)."""
    loaded = LoadedScenario(parse_scenario(_with_normalisation(3.0)), None)
    result = run_scenario(loaded, tmp_path / "run")
    ledger = result.clients["a-000"].ledger
    pca, moments = ledger.records[0], ledger.records[1]
    assert (pca.round, pca.step) == (NORMALISATION_ROUND, GaussianStep("poisson", 1.0, 2.0))
    assert (moments.round, moments.step) == (NORMALISATION_ROUND,
                                             GaussianStep("poisson", 1.0, 3.0))
    rounds = list(read_ledger_steps(tmp_path / "run" / "ledgers" / "a-000.jsonl"))[2:]
    assert rounds and all(r.count == 1 and r.sigma == 1.0 for r in rounds)
    q, h = rounds[0].q, 1e-4
    reference = dp_pld.from_gaussian_mechanism(2.0, value_discretization_interval=h).compose(
        dp_pld.from_gaussian_mechanism(3.0, value_discretization_interval=h)).compose(
        dp_pld.from_gaussian_mechanism(1.0, sampling_prob=q, value_discretization_interval=h)
        .self_compose(len(rounds))).get_epsilon_for_delta(DELTA)
    assert reference * (1 - 1e-9) <= ledger.epsilon(DELTA) <= reference * 1.01


@pytest.mark.slow
def test_with_dp_normalisation_clients_and_server_project_then_standardise(
        tmp_path: Path) -> None:
    """The order is project, then standardise, for clients and server alike: a client's
    released moments are (up to their small noise) the exact moments of its records'
    projected coordinates, computed here with numpy from the raw records and the kept
    projection; the server's held-out features are exactly its projected held-out records
    standardised by their own moments."""
    loaded = LoadedScenario(parse_scenario(_with_normalisation(0.01)), None)
    population = build_population(loaded)
    raw_train = population.train_x.numpy().astype(np.float64).copy()
    raw_test = population.test_x.numpy().astype(np.float64).copy()
    run_scenario(loaded, tmp_path / "run", population=population)
    ledgers = tmp_path / "run" / "ledgers"
    with np.load(ledgers / PCA_FILE) as stored:
        basis = stored["basis"]
    assert basis.shape == (12, 4)
    for plan in population.plans:
        coordinates = raw_train[np.asarray(plan.indices)] @ basis
        with np.load(ledgers / f"{plan.client_id}.moments.npz") as stored:
            mean, std = stored["mean"], stored["std"]
        assert mean.shape == std.shape == (4,)
        assert np.abs(coordinates).max() > 0.5  # the projected scale, against the tolerances
        # the released totals' noise std: sqrt(2) * bound * 0.01 = 0.64, over 200 records
        np.testing.assert_allclose(mean, coordinates.mean(0), atol=0.02)
        np.testing.assert_allclose(std, coordinates.std(0), rtol=0.02, atol=0.01)
    projected = raw_test @ basis
    expected = (projected - projected.mean(0)) / projected.std(0)
    np.testing.assert_allclose(population.test_x.numpy(), expected, atol=1e-5)


def test_with_dp_normalisation_the_budget_check_counts_both_releases() -> None:
    """Two releases of sigma 2 (each 0.5-GDP, eps about 2.1 at 1e-5, solved independently):
    each alone fits a budget of eps 2.5, the two together (sqrt(0.5)-GDP, eps about 2.9) do
    not, and the refusal names both; a budget just above the pair's eps admits them."""
    scenario = _with_normalisation(2.0)
    group = scenario["clients"]["groups"][0]
    group.update(budget={"epsilon": 2.5, "delta": DELTA})
    alone, both = _gdp_epsilon(0.5, DELTA), _gdp_epsilon(math.sqrt(0.5), DELTA)
    assert alone < 2.5 < both
    with pytest.raises(ConfigError, match=r"groups\[0\]\.dp_pca with its dp_normalisation"):
        build_population(LoadedScenario(parse_scenario(scenario), None))
    group.update(budget={"epsilon": both * 1.01, "delta": DELTA})
    assert build_population(LoadedScenario(parse_scenario(scenario), None)).plans


def test_a_trainer_without_the_release_is_refused(tmp_path: Path) -> None:
    """Outside the simulation's release (a deployed client process) a dp_pca client cannot
    train on unprojected records."""
    population = build_population(LoadedScenario(parse_scenario(_small()), None))
    plan = plan_of(population, "a-000")
    ledger = open_ledger(plan, tmp_path / "a.jsonl")
    with pytest.raises(ConfigError, match="dp_pca needs every client's release"):
        population.trainer(plan, ledger=ledger)
    ledger.close()


def test_the_budget_check_refuses_a_release_that_alone_exceeds_the_budget() -> None:
    """sigma 0.5 (mu = 2: eps ~ 9.9 at 1e-5) against a budget of eps 1: refused before anything
    runs, naming the option; sigma 8 leaves room."""
    scenario = _small()
    group = scenario["clients"]["groups"][0]
    group.update(budget={"epsilon": 1.0, "delta": DELTA})
    group["dp_pca"] = {**group["dp_pca"], "noise": 0.5}
    assert _gdp_epsilon(2.0, DELTA) > 9.8
    with pytest.raises(ConfigError, match=r"groups\[0\]\.dp_pca: its release alone costs eps=9\.9"):
        build_population(LoadedScenario(parse_scenario(scenario), None))
    group["dp_pca"] = {**group["dp_pca"], "noise": 8.0}
    assert build_population(LoadedScenario(parse_scenario(scenario), None)).plans


def test_the_progress_horizon_counts_the_release() -> None:
    """The fixed group (sigma 1.5, budget eps 4) affords n rounds: the release and n steps fit
    the budget, the release and n + 1 do not; fewer than without the release."""
    from fedsim.reporting.horizon import affordable_rounds

    group = load_scenario(SCENARIO).scenario.clients.groups[1]
    n = affordable_rounds(group, 6000, limit=10**6)
    assert n is not None
    sigma = calibration.calibrate_sigma("pld", "fixed", 1.0, 1, 1.5, DELTA)

    def eps(count: int) -> float:
        return PLDAccountant([GaussianStep("fixed", 1.0, sigma),
                        GaussianStep("fixed", 200 / 6000, 1.5, count)]).epsilon(DELTA)

    assert eps(n) <= 4.0 < eps(n + 1)
    without = affordable_rounds(group.model_copy(update={"dp_pca": None}), 6000, limit=10**6)
    assert without is not None and n < without


def test_deployment_refuses_dp_pca() -> None:
    """The shared projection needs every client's release before round 0: deployment refuses
    the scenario naming each group, and validate's guarantee lines say so."""
    scenario = load_scenario(SCENARIO).scenario
    with pytest.raises(ConfigError, match=r"groups\[0\] \(poisson\): dp_pca needs every"):
        require_public_slots(scenario)
    guarantees = group_guarantees(scenario)
    assert len(guarantees) == len(scenario.clients.groups)
    # each named even without `validate --deployed` (a caveat)
    assert all("NOT DEPLOYABLE: dp_pca" in g.text and g.caveat for g in guarantees)


@pytest.mark.parametrize(("change", "message"), [
    ({"model": {"name": "dp_mnist_cnn"}}, "use a flat-input model"),
    ({"model": {"name": "logreg", "options": {"in_features": 12}}},
     "dp_pca gives the model 4 inputs"),
])
def test_the_schema_refuses_a_model_that_does_not_take_the_projection(
        change: dict[str, Any], message: str) -> None:
    with pytest.raises(ScenarioError, match=message):
        parse_scenario(_small(**change))


def test_the_schema_refuses_inconsistent_groups() -> None:
    """Every group or none, with one components; not with a noise kind whose solver does not
    compose it; a bad clip or a target without delta."""
    scenario = _small()
    del scenario["clients"]["groups"][1]["dp_pca"]
    with pytest.raises(ScenarioError, match="set it for every group or none"):
        parse_scenario(scenario)
    scenario = _small()
    scenario["clients"]["groups"][1]["dp_pca"] = {"components": 3, "clip": 5.0, "noise": 2.0}
    with pytest.raises(ScenarioError, match="same components"):
        parse_scenario(scenario)
    scenario = _small()
    scenario["clients"]["groups"][0]["noise"] = {"kind": "growing_mu", "growth": 2.0,
                                                 "epsilon": 3.0, "delta": DELTA}
    with pytest.raises(ScenarioError, match="dp_pca: calibrate with noise kind target or constant"):
        parse_scenario(scenario)
    for bad in ({"components": 4, "clip": 0.0, "noise": 2.0},
                {"components": 0, "clip": 5.0, "noise": 2.0},
                {"components": 4, "clip": 5.0, "noise": {"epsilon": 1.0}}):
        scenario = _small()
        scenario["clients"]["groups"][0]["dp_pca"] = bad
        with pytest.raises(ScenarioError):
            parse_scenario(scenario)


def test_more_components_than_features_are_refused_before_any_release() -> None:
    """A stranger's 50 components of 20 features passed validation, then the run charged every
    client's release and failed at the projection, leaving a half-written run directory. Now
    the schema refuses it where the features are known (synthetic data: `fedsim validate`
    too), and the population where they are only known from the data (given from Python
    here), before any ledger is written."""
    import torch

    scenario = _small()
    for group in scenario["clients"]["groups"]:
        group["dp_pca"]["components"] = 13  # the synthetic data has 12 features
    with pytest.raises(ConfigError, match=r"dp_pca\.components: 13 components of records "
                                          r"with 12 features \(dataset\.num_features\)"):
        parse_scenario(scenario)
    scenario["dataset"]["num_features"] = 20  # as declared; the data given has 12
    loaded = LoadedScenario(parse_scenario(scenario), None)
    generator = torch.Generator().manual_seed(0)
    data = (torch.randn(800, 12, generator=generator), torch.randint(0, 3, (800,)),
            torch.randn(200, 12, generator=generator), torch.randint(0, 3, (200,)))
    with pytest.raises(ConfigError, match=r"dp_pca\.components: 13 components of records "
                                          r"with 12 features; at most 12"):
        build_population(loaded, data=data)  # (the releases come after the population)
