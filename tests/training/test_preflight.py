"""Checks that save a wasted run: clients that cannot afford a round, partitions that leave
clients below their batch, and a Dirichlet partition that says at once what would work."""

from __future__ import annotations

import json
import math
import re
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from scipy import optimize, stats

from fedsim.cli import main
from fedsim.config import load_scenario, parse_scenario
from fedsim.config.loading import LoadedScenario
from fedsim.data.partition import (
    DIRICHLET_ATTEMPTS,
    dirichlet_success_rate,
    partition,
)
from fedsim.errors import DataError
from fedsim.privacy.accountant import make_accountant
from fedsim.privacy.events import GaussianStep
from fedsim.runtime.simulated.simulation import build_population
from fedsim.training.preflight import first_round_fits, preflight_warnings

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(autouse=True)
def _only_scenario_commands(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("fedsim.cli.COMMANDS", ("run", "validate"))


def _gdp_epsilon(mu: float, delta: float) -> float:
    """eps of mu-GDP at delta (Dong, Roth & Su, "Gaussian Differential Privacy", Cor. 2.13)."""

    def gap(eps: float) -> float:
        return (stats.norm.cdf(-eps / mu + mu / 2)
                - math.exp(eps) * stats.norm.cdf(-eps / mu - mu / 2) - delta)

    return optimize.brentq(gap, 0.0, 100.0, xtol=1e-12)


def _scenario(budget_epsilon: float, sigma: float) -> dict[str, Any]:
    # 400 synthetic records; group "full": 4 clients of 10 records with batch 10 (q = 1), so a
    # round is one Gaussian mechanism, exactly (1/sigma)-GDP under add/remove neighbours.
    group = {"count": 4, "batch_size": 10, "clip": 1.0, "noise": sigma, "sampling": "poisson",
             "speed": 0.01,
             "budget": {"epsilon": budget_epsilon, "delta": 1e-5}}
    return {
        "stop": {"windows": 2},
        "dataset": {"name": "synthetic", "num_samples": 400, "num_test_samples": 50},
        "model": {"name": "logreg"},
        "clients": {"groups": [dict(group, name="full", data_share=0.1)]},
        "server": {"window": 1.0},
    }


@pytest.mark.parametrize("factor", [0.98, 1.02])
def test_a_budget_that_cannot_pay_one_round_is_found_exactly(factor: float, tmp_path: Path,
                                                             capsys: pytest.CaptureFixture[str]
                                                             ) -> None:
    sigma = 0.8
    exact = _gdp_epsilon(1 / sigma, 1e-5)  # independent of the library's accountants
    file = tmp_path / "s.yaml"
    file.write_text(json.dumps(_scenario(exact * factor, sigma)), encoding="utf-8")
    # No client of the only group can pay for a round: validate refuses the file, exit 2.
    assert main(["validate", str(file)]) == (2 if factor < 1 else 0)
    captured = capsys.readouterr()
    if factor < 1:
        assert ("clients.groups[0]: 4 of 4 clients cannot afford a single round "
                "within budget") in captured.err
        assert "no client of the group can" in captured.err
    else:
        assert "warning" not in captured.out
    status = main(["run", str(file), "--out", str(tmp_path / "run"), "--no-plots",
                   "--json-logs"])
    captured = capsys.readouterr()
    assert status == 0
    assert ("clients cannot afford a round" in captured.err) == (factor < 1)


@pytest.mark.parametrize("case", ["every group", "one group", "a group without budget"])
def test_validate_refuses_a_scenario_in_which_no_client_can_afford_a_round(
        case: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Before: "valid" (exit 0) above one warning per group when no client of any group could
    pay for one round, so a run trained nothing and ended at once with the initial model. Now
    that is a problem of the file (exit 2); a scenario where some client can train stays
    valid, with its warnings."""
    data = _scenario(0.5, 0.8)  # one round of q = 1 at sigma 0.8 costs eps 5.2 > 0.5
    full = data["clients"]["groups"][0]
    second = dict(full, name="second", data_share=0.1)
    if case == "one group":
        second["budget"] = {"epsilon": 50.0, "delta": 1e-5}
    elif case == "a group without budget":
        second["budget"] = None
    data["clients"]["groups"].append(second)
    file = tmp_path / "s.yaml"
    file.write_text(json.dumps(data), encoding="utf-8")
    status = main(["validate", str(file)])
    captured = capsys.readouterr()
    if case == "every group":
        assert status == 2
        assert (f"{file}: 1 problem\n  clients.groups (line 1): no client of any group can "
                "afford a single round within its budget, so a run would train nothing") in \
            captured.err
        assert "    clients.groups[0]: 4 of 4 clients cannot afford" in captured.err
        assert "    clients.groups[1]: 4 of 4 clients cannot afford" in captured.err
    else:
        assert status == 0 and f"{file}: valid (8 clients in 2 groups" in captured.out
        assert "warning: clients.groups[0]: 4 of 4 clients cannot afford" in captured.out
        assert "clients.groups[1]" not in captured.out


def test_the_count_of_clients_that_cannot_afford_matches_each_client_alone() -> None:
    data = _scenario(2.0, 1.0)
    data["dataset"]["num_samples"] = 4000
    data["clients"]["groups"][0].update(count=40, data_share=0.9, batch_size=8,
                                        partition={"scheme": "unequal", "size_sigma": 1.0})
    population = build_population(LoadedScenario(parse_scenario(data), None))
    group = population.plans[0].group
    sigma = float(population.plans[0].schedule.sigma(0))

    def affordable(n: int) -> bool:  # the ledger's rule, one client at a time
        step = GaussianStep("poisson", group.batch_size / n, sigma, 1)
        return make_accountant("pld", [step]).epsilon(1e-5) <= 2.0

    broke = [p.num_samples for p in population.plans if not affordable(p.num_samples)]
    assert 0 < len(broke) < 40  # the case exercises the bisection, not an edge
    assert all(first_round_fits(group, p.num_samples, sigma) == affordable(p.num_samples)
               for p in population.plans)
    (line,) = preflight_warnings(population.plans)
    assert f"{len(broke)} of 40 clients cannot afford" in line
    smallest = min(p.num_samples for p in population.plans if affordable(p.num_samples))
    assert f"a client needs at least {smallest} records at batch_size 8" in line


def test_scaled_hetero_100_names_the_clients_below_their_batch(
        capsys: pytest.CaptureFixture[str]) -> None:
    scale = ["clients.groups[0].count=600", "clients.groups[1].count=300",
             "clients.groups[2].count=100", "clients.groups[0].batch_size=4",
             "dataset={name: synthetic, num_samples: 60000, test_subset: 100}"]
    file = str(REPO / "scenarios" / "hetero-100.yaml")
    sizes = build_population(load_scenario(file, [*scale, "clients.groups[1].batch_size=1"]))
    office = [p.num_samples for p in sizes.plans if p.group.name == "office"]
    short = sum(1 for n in office if n < 32)
    assert short > 0
    argv = ["validate", file] + [arg for value in scale for arg in ("--set", value)]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert (f"clients.groups[1].batch_size: 32 exceeds the records of {short} of the group's "
            f"300 clients (the smallest holds {min(office)}") in err
    assert f"use batch_size <= {min(office)}" in err


def test_a_run_in_which_no_client_could_afford_a_round_says_so(tmp_path: Path) -> None:
    """A stranger: such a run (validate refuses its scenario; a run still runs it, as a sweep
    over budgets may) ended with the explanation of any budget stop; it now says that no
    client trained, and only then."""
    from fedsim.api import simulate

    nobody = simulate(_scenario(0.5, 0.8), out=tmp_path / "nobody", plots=False)
    some = simulate(_scenario(50.0, 0.8), out=tmp_path / "some", plots=False)
    said = "No client trained a single round: each one's budget was too small for its first"
    explanations = [json.loads((tmp_path / name / "summary.json").read_text())["explanation"]
                    for name in ("nobody", "some")]
    assert said in explanations[0] and said not in explanations[1]
    assert nobody.final_accuracy is not None and some.final_accuracy is not None


def test_validate_takes_the_seed_a_run_takes(tmp_path: Path,
                                             capsys: pytest.CaptureFixture[str]) -> None:
    """A stranger: the seed decides the partition, and with it each client's records and the
    checks that read them, but ``validate`` had no ``--seed`` (``run`` has): it checks what
    ``fedsim run --seed N`` would run, the same as ``--set seed=N``."""
    data = _scenario(50.0, 0.8)
    data["clients"]["groups"][0]["partition"] = {"scheme": "unequal", "size_sigma": 1.0}
    file = tmp_path / "s.yaml"
    file.write_text(json.dumps(data), encoding="utf-8")
    smallest = {}
    for seed in (0, 6):
        answers = []
        for argv in (["--seed", str(seed)], ["--set", f"seed={seed}"]):
            status = main(["validate", str(file), *argv])
            answers.append((status, capsys.readouterr()))
        assert answers[0] == answers[1] and answers[0][0] == 2
        found = re.search(r"the smallest holds (\d+)", answers[0][1].err)
        assert found is not None
        smallest[seed] = int(found.group(1))
    assert smallest == {0: 5, 6: 1}  # the partition follows the seed
    with pytest.raises(SystemExit):
        main(["validate", str(file), "--seed", "-1"])
    assert "--seed: must be >= 0, got -1" in capsys.readouterr().err


# ---------------------------------------------------------------------------------------------
# Dirichlet


def _reference_dirichlet(y: np.ndarray, k: int, alpha: float, min_size: int,
                         rng: np.random.Generator) -> list[np.ndarray]:
    """The partitioner as it was: a full draw of records each time (for identical results)."""
    for _ in range(DIRICHLET_ATTEMPTS):
        buckets: list[list[np.ndarray]] = [[] for _ in range(k)]
        for cls in np.unique(y):
            members = rng.permutation(np.flatnonzero(y == cls))
            shares = rng.dirichlet(np.full(k, alpha))
            cuts = (np.cumsum(shares)[:-1] * len(members)).astype(int)
            for client, piece in enumerate(np.split(members, cuts)):
                buckets[client].append(piece)
        parts = [np.concatenate(b) for b in buckets]
        if min(len(p) for p in parts) >= min_size:
            return [np.sort(p) for p in parts]
    raise AssertionError("reference found no partition")


@pytest.mark.parametrize(("alpha", "clients", "seed"), [(1.0, 20, 0), (0.3, 60, 1), (0.2, 40, 5)])
def test_dirichlet_gives_the_same_partition_as_before(alpha: float, clients: int,
                                                      seed: int) -> None:
    y = np.random.default_rng(9).integers(0, 10, 3000)
    got = partition(y, clients, "dirichlet", rng=np.random.default_rng(seed), alpha=alpha)
    want = _reference_dirichlet(y, clients, alpha, 1, np.random.default_rng(seed))
    assert all(np.array_equal(a, b) for a, b in zip(got, want, strict=True))


class _CountingGenerator:
    def __init__(self, seed: int) -> None:
        self.rng = np.random.default_rng(seed)
        self.permutations = 0

    def permutation(self, x: Any) -> np.ndarray:
        self.permutations += 1
        return self.rng.permutation(x)

    def dirichlet(self, alpha: Any) -> np.ndarray:
        return self.rng.dirichlet(alpha)


def test_a_hopeless_dirichlet_fails_fast_and_says_what_works() -> None:
    y = np.repeat(np.arange(10), 600)
    rng = _CountingGenerator(0)
    with pytest.raises(DataError) as caught:
        partition(y, 600, "dirichlet", rng=rng, alpha=0.1, min_size=2)  # type: ignore[arg-type]
    assert rng.permutations <= 10 * 10  # ten draws of ten classes, not a thousand
    message = str(caught.value)
    found = re.search(r"alpha >= ([\d.]+) with 600 clients or at most (\d+) clients", message)
    assert found, message
    alpha, clients = float(found.group(1)), int(found.group(2))
    assert dirichlet_success_rate(np.full(10, 600), 600, 0.1, 2) == 0.0
    successes = 0
    for seed in range(4):
        for k, a in ((600, alpha), (clients, 0.1)):
            try:
                partition(y, k, "dirichlet", rng=np.random.default_rng(seed), alpha=a, min_size=2)
                successes += 1
            except DataError:
                pass
    assert successes == 8  # the advice works (each redraws until it fits)


def test_the_success_rate_matches_the_beta_distribution() -> None:
    # Two clients, one class of n records: client 0 gets floor(s n) with s ~ Beta(a, a), so
    # both get >= m exactly when m/n <= s < (n - m + 1)/n.
    n, m, a = 50, 10, 0.5
    beta = stats.beta(a, a)
    exact = beta.cdf((n - m + 1) / n) - beta.cdf(m / n)
    estimate = dirichlet_success_rate(np.array([n]), 2, a, m, trials=20000)
    assert abs(estimate - exact) < 4 * math.sqrt(exact * (1 - exact) / 20000)
