"""``fedsim sweep --private-tuning``: a tiny private search end to end. The tuned total of every
client is never below any trial's own eps and equals an independent recomputation (the
client's per-trial steps rebuilt here from its group's rounds, or from the largest round count
its budget admits, and fed to fedsim.privacy.tuning); K and the candidates come from the
operating system's entropy, not the scenario seed."""

from __future__ import annotations

import json
import random
from pathlib import Path

import numpy as np
import pytest
import yaml

from fedsim.cli import main
from fedsim.commands import private_tuning
from fedsim.privacy.accountant import make_accountant
from fedsim.privacy.events import GaussianStep
from fedsim.privacy.ledger import read_ledger_steps
from fedsim.privacy.rdp import DEFAULT_ORDERS, history_rdp
from fedsim.privacy.tuning import PoissonTrials, base_rdp, tuned_epsilon

SCENARIO = {
    "name": "tiny-tune", "seed": 1, "stop": {"windows": 4},
    "dataset": {"name": "synthetic", "num_samples": 400, "num_test_samples": 100,
                "num_features": 6, "num_classes": 3},
    "model": {"name": "logreg"},
    "clients": {"groups": [
        {"name": "phone", "count": 2, "data_share": 0.5, "batch_size": 16, "clip": 1.0,
         "noise": {"sigma": 1.0}, "speed": 0.01, "rounds": 12},
        {"name": "laptop", "count": 2, "data_share": 0.5, "batch_size": 16, "sampling": "fixed",
         "clip": 1.0, "noise": {"sigma": 1.0}, "speed": 0.02,
         "budget": {"epsilon": 3.0, "delta": 1e-5}},
    ]},
    "server": {"window": 1.0},
}
SIGMAS = ("1.0", "2.0")
GRID = f"clients.groups[*].noise.sigma={','.join(SIGMAS)}"


class Entropy:
    """Stands in for the OS entropy source: a fixed uniform for K, then the given candidates."""

    def __init__(self, uniform: float, candidates: list[int]) -> None:
        self.uniform, self.candidates, self.calls = uniform, list(candidates), 0

    def random(self) -> float:
        self.calls += 1
        return self.uniform

    def randrange(self, count: int) -> int:
        self.calls += 1
        return self.candidates.pop(0) % count


def _budget_rounds(step: GaussianStep, epsilon: float, delta: float) -> int:
    """Largest n with n steps within (epsilon, delta) by the pld accountant, by bisection."""
    low, high = 0, 1
    while make_accountant("pld", [step.times(high)]).epsilon(delta) <= epsilon:
        low, high = high, 2 * high
    while high - low > 1:
        middle = (low + high) // 2
        ok = make_accountant("pld", [step.times(middle)]).epsilon(delta) <= epsilon
        low, high = (middle, high) if ok else (low, middle)
    return low


def test_the_entropy_source_is_the_operating_system() -> None:
    assert isinstance(private_tuning._ENTROPY, random.SystemRandom)


@pytest.mark.slow
def test_private_tuning_sweep_charges_the_tuning_bound(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    scenario = tmp_path / "tune.yaml"
    scenario.write_text(yaml.safe_dump(SCENARIO), encoding="utf-8")
    entropy = Entropy(0.5, [0, 1])  # Poisson(2): P[K <= 1] = 0.406, P[K <= 2] = 0.677: K = 2
    monkeypatch.setattr(private_tuning, "_ENTROPY", entropy)
    out = tmp_path / "sweep"
    # (the tuned total is above laptop's budget of 3: accepted up to 100 with --tuning-budget)
    assert main(["sweep", str(scenario), "--grid", GRID, "--private-tuning", "poisson",
                 "--tuning-mean", "2", "--tuning-budget", "100", "--out", str(out),
                 "--no-plots"]) == 0
    assert entropy.calls == 3  # K, then one candidate per trial
    printed = capsys.readouterr().out
    table = json.loads((out / "sweep.json").read_text())
    tuning = table["private_tuning"]
    assert tuning["trials"] == 2 and len(table["runs"]) == 2
    runs = table["runs"]
    assert [r["clients.groups[*].noise.sigma"] for r in runs] == list(SIGMAS)
    best = max(range(2), key=lambda i: (runs[i]["final_accuracy"], -i))
    assert tuning["selected"] == runs[best]["run"] and runs[best]["selected"]
    assert f"selected: {runs[best]['run']}" in printed
    delta = tuning["delta"]
    trials = PoissonTrials(2.0)
    for client, total in tuning["tuned_epsilon"].items():
        per_candidate = []
        for run, sigma in zip(runs, SIGMAS, strict=True):
            ledger = out / run["run"] / "ledgers" / f"{client}.jsonl"
            spent = list(read_ledger_steps(ledger))
            # never below the trial's own eps (its realised ledger, and the table's max)
            assert total >= make_accountant("pld", spent).epsilon(delta)
            assert tuning["tuned_epsilon_max"] >= run["eps_max"]
            # the bounded per-trial steps, rebuilt from the group's rule at the trial's q
            step = GaussianStep(spent[0].sampling, spent[0].q, float(sigma))
            assert spent[0].sigma == float(sigma)
            count = 12 if client.startswith("phone") else _budget_rounds(step, 3.0, 1e-5)
            assert sum(s.count for s in spent) <= count
            per_candidate.append(history_rdp([step.times(count)], DEFAULT_ORDERS))
        expected = tuned_epsilon(DEFAULT_ORDERS, base_rdp(per_candidate), trials, delta)
        assert total == pytest.approx(expected, rel=1e-9)
        ledger_total = make_accountant("rdp", read_tuning(out, client)).epsilon(delta)
        assert ledger_total == pytest.approx(total, rel=1e-12)
    assert runs[0]["tuned_eps_max"] == tuning["tuned_epsilon_max"] == max(
        tuning["tuned_epsilon"].values())
    assert "tuned_eps_max" in (out / "sweep.csv").read_text().splitlines()[0]

    # the same scenario and seed, another draw of the OS entropy: another K (here none)
    monkeypatch.setattr(private_tuning, "_ENTROPY", Entropy(0.1, []))
    again = tmp_path / "again"
    assert main(["sweep", str(scenario), "--grid", GRID, "--private-tuning", "poisson",
                 "--tuning-mean", "2", "--tuning-budget", "100", "--out", str(again),
                 "--no-plots"]) == 0
    second = json.loads((again / "sweep.json").read_text())["private_tuning"]
    assert second["trials"] == 0 and second["selected"] is None
    # nothing was released, but the selection was charged before K was known
    assert second["tuned_epsilon"] == pytest.approx(tuning["tuned_epsilon"], rel=1e-12)


def read_tuning(out: Path, client: str) -> list[object]:
    from fedsim.privacy.ledger_file import read_verified

    path = out / private_tuning.TUNING_LEDGER_DIR / f"{client}.jsonl"
    return [record.step for record in read_verified(path, path.read_bytes()).records]


def test_private_tuning_refuses_an_unbounded_group_and_a_budget_it_exceeds(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    unbounded = {**SCENARIO, "clients": {"groups": [
        {**SCENARIO["clients"]["groups"][1], "budget": None}]}}  # type: ignore[index]
    path = tmp_path / "unbounded.yaml"
    path.write_text(yaml.safe_dump(unbounded), encoding="utf-8")
    assert main(["sweep", str(path), "--grid", GRID, "--private-tuning", "nb",
                 "--out", str(tmp_path / "a"), "--no-plots"]) == 2
    assert "give the group `rounds` or a budget" in capsys.readouterr().err
    scenario = tmp_path / "tune.yaml"
    scenario.write_text(yaml.safe_dump(SCENARIO), encoding="utf-8")
    assert main(["sweep", str(scenario), "--grid", GRID, "--private-tuning", "nb",
                 "--tuning-budget", "1.0", "--out", str(tmp_path / "b"), "--no-plots"]) == 2
    assert "--tuning-budget 1: the tuned total of 4 client(s) exceeds it" in \
        capsys.readouterr().err
    assert not any((tmp_path / "b").glob("trial-*"))  # refused before any trial


def test_a_tuning_above_the_clients_budgets_says_so(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    """A stranger's tuning of quickstart released a trial whose tuned eps (4.8) was above every
    client's budget (2.5, 3), and nothing said so: the trial's own explanation said that no
    client exceeded its budget. A client's budget is a promise: such a tuning is now refused,
    before anything is charged, unless --tuning-budget says what total is accepted; then the
    sweep runs and says so, in its output and sweep.json's notes, for the clients with a
    budget (laptop here; phone trains its rounds without one)."""
    scenario = tmp_path / "tune.yaml"
    scenario.write_text(yaml.safe_dump(SCENARIO), encoding="utf-8")
    monkeypatch.setattr(private_tuning, "_ENTROPY", Entropy(0.1, []))  # K = 0: no trial runs
    out = tmp_path / "sweep"
    argv = ["sweep", str(scenario), "--grid", GRID, "--private-tuning", "poisson",
            "--tuning-mean", "2", "--out", str(out), "--no-plots"]
    assert main(argv) == 2
    refused = capsys.readouterr().err
    assert "the tuning spends more than the budget of 2 of 2 client(s) with one" in refused
    assert "refused without --tuning-budget EPS" in refused
    assert not (out / private_tuning.TUNING_LEDGER_DIR).exists()  # nothing charged
    assert main([*argv, "--tuning-budget", "100"]) == 0
    printed = capsys.readouterr().out
    table = json.loads((out / "sweep.json").read_text())
    tuned = table["private_tuning"]["tuned_epsilon"]
    assert tuned["laptop-000"] > 3.0
    said = ("warning: the tuning spends more than the budget of 2 of 2 client(s) with one "
            "(largest: laptop-000, tuned eps ")
    assert said in printed and "against its budget 3 at delta 1e-05" in printed
    assert [note for note in table["notes"] if note.startswith(said)]
    # Budgets the tuning keeps to (rounds bound each trial, far below them): no word. (A
    # group bounded by its budget alone always goes over it: a trial may spend all of it.)
    roomy = {**SCENARIO, "clients": {"groups": [
        {**group, "rounds": 12, "budget": {"epsilon": 50.0, "delta": 1e-5}}
        for group in SCENARIO["clients"]["groups"]]}}  # type: ignore[index]
    scenario.write_text(yaml.safe_dump(roomy), encoding="utf-8")
    monkeypatch.setattr(private_tuning, "_ENTROPY", Entropy(0.1, []))
    assert main(["sweep", str(scenario), "--grid", GRID, "--private-tuning", "poisson",
                 "--tuning-mean", "2", "--out", str(tmp_path / "roomy"), "--no-plots"]) == 0
    assert "the tuning spends more than the budget" not in capsys.readouterr().out


def test_private_tuning_of_one_candidate_is_refused(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A stranger's review (session 56): without --grid it trained one candidate K times,
    each trial charged (8x one run's eps), selecting nothing. Refused before any trial."""
    scenario = tmp_path / "tune.yaml"
    scenario.write_text(yaml.safe_dump(SCENARIO), encoding="utf-8")
    for grid in ([], ["--grid", "clients.groups[*].noise.sigma=1.0"]):
        out = tmp_path / f"one-{len(grid)}"
        assert main(["sweep", str(scenario), *grid, "--private-tuning", "nb",
                     "--out", str(out), "--no-plots"]) == 2
        assert "give --grid PATH=V1,V2,... with two values or more" in capsys.readouterr().err
        assert not out.exists() or not any(out.iterdir())


def test_draw_trials_inverts_the_distribution(monkeypatch: pytest.MonkeyPatch) -> None:
    trials = PoissonTrials(2.0)
    from scipy import stats
    for uniform in (0.05, 0.3, 0.5, 0.9, 0.999):
        monkeypatch.setattr(private_tuning, "_ENTROPY", Entropy(uniform, []))
        k = private_tuning.draw_trials(trials)
        assert stats.poisson.cdf(k - 1, 2.0) < uniform <= stats.poisson.cdf(k, 2.0)
    nb = private_tuning.trial_distribution("nb", 3.0)
    monkeypatch.setattr(private_tuning, "_ENTROPY", Entropy(0.0, []))
    assert private_tuning.draw_trials(nb) == 1  # the truncated negative binomial never draws 0
    cdf = np.cumsum(nb.pmf(np.arange(1, 200)))
    monkeypatch.setattr(private_tuning, "_ENTROPY", Entropy(0.7, []))
    assert private_tuning.draw_trials(nb) == 1 + int(np.searchsorted(cdf, 0.7))


@pytest.mark.slow
def test_each_trial_says_whether_it_is_the_release_and_the_release_gives_the_tuned_eps(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    """The selected trial's own summary.json, clients.csv and `fedsim report` give each
    client's tuned eps, equal to what `fedsim ledger check` prints on its tuning ledger (a
    researcher read the release's eps from the trial's report: 2.3x too low); the unselected
    trial says it is no release."""
    import csv

    scenario = tmp_path / "tune.yaml"
    scenario.write_text(yaml.safe_dump(SCENARIO), encoding="utf-8")
    monkeypatch.setattr(private_tuning, "_ENTROPY", Entropy(0.5, [0, 1]))  # K = 2
    out = tmp_path / "sweep"
    assert main(["sweep", str(scenario), "--grid", GRID, "--private-tuning", "poisson",
                 "--tuning-mean", "2", "--tuning-budget", "100", "--out", str(out),
                 "--no-plots", "--quiet"]) == 0
    table = json.loads((out / "sweep.json").read_text())
    runs = table["runs"]
    selected = table["private_tuning"]["selected"]
    other = next(r["run"] for r in runs if r["run"] != selected)
    capsys.readouterr()
    checked = {}
    for ledger in sorted((out / "tuning" / "ledgers").glob("*.jsonl")):
        assert main(["ledger", "check", str(ledger), "--json"]) == 0
        checked[ledger.stem] = json.loads(capsys.readouterr().out)["epsilon"]
    assert len(checked) == 4

    summary = json.loads((out / selected / "summary.json").read_text())
    tuning = summary["private_tuning"]
    assert tuning["release"] is True and tuning["selected_trial"] == selected
    assert tuning["tuned_epsilon"] == pytest.approx(checked, rel=1e-9)
    assert summary["privacy"]["release"]["epsilon_max"] == pytest.approx(
        max(checked.values()), rel=1e-9)
    assert summary["privacy"]["epsilon_max"] < max(checked.values())  # the trial's own
    assert summary["explanation"].startswith("The release of a private hyperparameter tuning")
    rows = list(csv.DictReader((out / selected / "clients.csv").open()))
    assert {r["client_id"]: float(r["tuned_epsilon"]) for r in rows} == pytest.approx(
        checked, rel=1e-9)
    assert main(["report", str(out / selected)]) == 0
    printed = capsys.readouterr().out
    release = next(line for line in printed.splitlines() if line.startswith("release privacy"))
    assert f"max {max(checked.values()):.4g} over 4 clients" in release
    assert "from its sweep's tuning ledgers" in release
    assert "(this trial alone: not the release's privacy)" in printed
    assert "warning: client" not in printed

    unselected = json.loads((out / other / "summary.json").read_text())
    assert unselected["private_tuning"]["release"] is False
    assert unselected["explanation"].startswith("NOT A RELEASE")
    assert "tuned_epsilon" not in (out / other / "clients.csv").read_text()
    assert main(["report", str(out / other)]) == 0
    assert "NOT A RELEASE" in capsys.readouterr().out


def test_trial_names_tell_nothing_of_how_many_ran() -> None:
    """An index in a trial's name (trial-003-...) told whoever saw the released trial that
    at least four ran; K must stay secret. Names are random and never repeat."""
    from fedsim.commands.private_tuning import trial_name

    taken: set[str] = set()
    for _ in range(500):
        name = trial_name("sigma=1.3-seed0", taken)
        assert name not in taken
        taken.add(name)
    prefixes = [name.split("-")[1] for name in taken]
    assert all(len(p) == 8 and int(p, 16) >= 0 for p in prefixes)
    assert len(set(prefixes)) == len(prefixes)
    assert sorted(prefixes) != [f"{i:08x}" for i in range(500)]  # not a counter


@pytest.mark.parametrize("flag", [["--tuning-mean", "3"], ["--tuning-eta", "0.5"],
                                  ["--tuning-budget", "8"]])
def test_a_tuning_option_without_private_tuning_is_refused(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], flag: list[str]) -> None:
    """A stranger's `fedsim sweep S --grid ... --tuning-mean 3` (no --private-tuning) ran an
    ordinary sweep of every combination, no tuning charged, saying nothing of the option."""
    scenario = tmp_path / "tune.yaml"
    scenario.write_text(yaml.safe_dump(SCENARIO), encoding="utf-8")
    out = tmp_path / "sweep"
    assert main(["sweep", str(scenario), "--grid", GRID, *flag, "--out", str(out),
                 "--no-plots"]) == 2
    assert f"{flag[0]} sets a private tuning: give --private-tuning nb or poisson with it" in \
        capsys.readouterr().err
    assert not out.exists()
