"""Whole runs under virtual time: determinism, equivalence with the plain DP-SGD loop,
protocol invariants under drop/duplicate/reorder (hypothesis), budgets, crash and rejoin."""

from __future__ import annotations

import copy
import csv
import importlib.util
import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fedsim.cli import main
from fedsim.config import LoadedScenario, parse_scenario
from fedsim.errors import ConfigError
from fedsim.privacy.accountant import make_accountant
from fedsim.privacy.events import group_steps
from fedsim.privacy.ledger import Budget, PrivacyLedger
from fedsim.runtime.population import build_population
from fedsim.runtime.rng import SeedTree
from fedsim.runtime.simulated.simulation import run_scenario

torch.set_num_threads(1)

OUTPUT_FILES = ("metrics.jsonl", "clients.csv", "summary.json", "scenario.resolved.yaml")


def scenario(**changes: Any) -> dict[str, Any]:
    base: dict[str, Any] = {
        "name": "tiny",
        "seed": 3,
        "stop": {"virtual_seconds": 30.0},
        "dataset": {"name": "synthetic", "num_samples": 600, "num_test_samples": 200,
                    "num_features": 8, "num_classes": 3},
        "model": {"name": "logreg"},
        "clients": {"groups": [
            {"name": "p", "count": 2, "data_share": 0.5, "batch_size": 16, "sampling": "poisson",
             "clip": 1.0, "noise": 1.0, "local_lr": 0.5,
             "speed": {"kind": "uniform", "low": 0.01, "high": 0.03},
             "staleness": {"max_versions_behind": 3},
             "budget": {"epsilon": 2.0, "delta": 1e-5}},
            {"name": "f", "count": 2, "data_share": 0.5, "batch_size": 20, "sampling": "fixed",
             "clip": 1.0, "noise": 1.5, "local_lr": 0.5, "rounds": 12, "speed": 0.05},
        ]},
        "server": {"window": 1.0, "max_staleness": 3},
        "network": {"uplink": {"latency": {"kind": "exponential", "mean": 0.3}, "drop": 0.1,
                               "duplicate": 0.2, "reorder": 0.3},
                    "downlink": {"latency": 0.1}},
    }
    for path, value in changes.items():
        node = base
        *parents, leaf = path.split(".")
        for part in parents:
            node = node[int(part)] if part.isdigit() else node[part]
        node[int(leaf) if leaf.isdigit() else leaf] = value
    return base


def run(data: dict[str, Any], out: Path, **kwargs: Any):
    kwargs.setdefault("keep_history", True)
    return run_scenario(LoadedScenario(parse_scenario(data), None), out, **kwargs)


def test_same_seed_same_files_different_seed_different(tmp_path: Path) -> None:
    data = scenario()
    first = run(data, tmp_path / "a")
    run(data, tmp_path / "b")
    run(scenario(seed=4), tmp_path / "c")
    for name in OUTPUT_FILES:
        assert (tmp_path / "a" / name).read_bytes() == (tmp_path / "b" / name).read_bytes(), name
    for ledger in (tmp_path / "a" / "ledgers").iterdir():
        assert ledger.read_bytes() == (tmp_path / "b" / "ledgers" / ledger.name).read_bytes()
    assert (tmp_path / "a" / "metrics.jsonl").read_bytes() != (tmp_path / "c" / "metrics.jsonl").read_bytes()
    assert first.summary["updates"]["applied"] > 0
    assert first.summary["final_accuracy"] is not None
    # the outputs above came from rounds computed together (fedsim.training.batched)
    timing = json.loads((tmp_path / "a" / "timing.json").read_text())
    assert timing["rounds_batched"] > 0 and timing["batched_passes"] > 0


def test_batched_rounds_change_only_floating_point_rounding(tmp_path: Path) -> None:
    # The same scenario with every round computed alone: the same privacy events at the same
    # times (ledgers byte for byte) and the same model up to summation order.
    data = scenario()
    batched = run(data, tmp_path / "batched")
    alone = run(data, tmp_path / "alone", batch_rounds=False)
    timing = json.loads((tmp_path / "alone" / "timing.json").read_text())
    assert timing["rounds_batched"] == 0
    ledgers = sorted((tmp_path / "batched" / "ledgers").iterdir())
    assert ledgers
    for ledger in ledgers:
        assert ledger.read_bytes() == (tmp_path / "alone" / "ledgers" / ledger.name).read_bytes()
    assert batched.summary["updates"] == alone.summary["updates"]
    np.testing.assert_allclose(batched.final_params, alone.final_params, rtol=1e-3, atol=1e-4)
    assert not np.array_equal(batched.final_params, alone.final_params)


def test_one_client_one_update_per_window_equals_the_plain_dp_sgd_loop(tmp_path: Path) -> None:
    rounds, lr = 6, 0.5
    data = scenario(**{
        "stop": {"windows": 50},
        "clients.groups": [{"name": "solo", "count": 1, "data_share": 1.0, "batch_size": 32,
                            "sampling": "poisson", "clip": 1.0, "noise": 1.0, "local_lr": lr,
                            "rounds": rounds, "speed": 0.0,
                            "staleness": {"max_versions_behind": 1}}],
        "network": {}, "server": {"window": 1.0},
    })
    loaded = LoadedScenario(parse_scenario(data), None)
    result = run_scenario(loaded, tmp_path / "run")
    assert result.summary["updates"]["applied"] == rounds
    assert [m["applied"] for m in result.metrics if m["applied"]] == [1] * rounds

    # The plain loop: the same data, model initialisation and generator stream.
    population = build_population(loaded)
    plan = population.plans[0]
    trainer = population.trainer(plan)
    w = population.initial_params.copy()
    for r in range(rounds):
        update = trainer.run_round(w, r).update
        w = (w.astype(np.float64) - lr * update.astype(np.float64)).astype(np.float32)
    np.testing.assert_array_equal(result.final_params, w)
    assert not np.array_equal(w, population.initial_params)


def _ledger(out: Path, result: Any, client_id: str) -> PrivacyLedger:
    """Re-open a client's ledger file from disk, as a restarted client would."""
    group = result.clients[client_id].plan.group
    budget = Budget(group.budget.epsilon, group.budget.delta) if group.budget else None
    return PrivacyLedger.open(out / "ledgers" / f"{client_id}.jsonl", client_id=client_id,
                              sampling=group.sampling, budget=budget, accountant=group.accountant)


@settings(max_examples=6, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(seed=st.integers(0, 10_000), drop=st.sampled_from([0.0, 0.2, 0.5]),
       duplicate=st.sampled_from([0.0, 0.3, 0.9]), reorder=st.sampled_from([0.0, 0.5, 1.0]),
       max_staleness=st.integers(0, 3), window=st.sampled_from([0.5, 1.0, 2.0]))
def test_protocol_invariants_under_a_lossy_network(tmp_path_factory: pytest.TempPathFactory,
                                                   seed: int, drop: float, duplicate: float,
                                                   reorder: float, max_staleness: int,
                                                   window: float) -> None:
    data = scenario(seed=seed, **{
        "stop": {"virtual_seconds": 15.0},
        "network.uplink.drop": drop, "network.uplink.duplicate": duplicate,
        "network.uplink.reorder": reorder, "server.max_staleness": max_staleness,
        "server.window": window,
    })
    out = tmp_path_factory.mktemp("lossy")
    result = run(data, out)
    applied = [(client, round_) for client, round_, _, _ in result.applied_log]
    # No update is ever applied twice ...
    assert len(applied) == len(set(applied))
    # ... none beyond the server's staleness policy ...
    assert all(version - base <= max_staleness for _, _, base, version in result.applied_log)
    totals = result.summary["updates"]
    assert totals["received"] == (totals["applied"] + totals["stale"] + totals["duplicate"]
                                  + totals["rejected"])
    for client_id, client in result.clients.items():
        released = {r.round for r in client.released_rounds()}
        # ... only updates the client released (and charged) arrive ...
        assert {r for c, r in applied if c == client_id} <= released
        # ... and the ledger on disk is exactly the accountant over the released rounds' events.
        ledger = _ledger(out, result, client_id)
        assert {record.round for record in ledger.records} == released
        planned = [s for r in sorted(released) for s in client.trainer.planned_steps(r)]
        assert tuple(ledger.steps) == group_steps(planned)
        if planned:
            assert ledger.epsilon(1e-5) == pytest.approx(
                make_accountant(client.plan.group.accountant, planned).epsilon(1e-5), rel=1e-9)


def test_budgets_hold_and_clients_csv_matches_fedsim_account(tmp_path: Path,
                                                             capsys: pytest.CaptureFixture[str]) -> None:
    data = scenario(**{"stop": {"virtual_seconds": 200.0}, "network": {}})
    result = run(data, tmp_path)
    rows = list(csv.DictReader(open(tmp_path / "clients.csv", encoding="utf-8")))
    assert {row["state"] for row in rows if row["group"] == "p"} == {"budget_exhausted"}
    assert {row["state"] for row in rows if row["group"] == "f"} == {"done"}
    account_available = importlib.util.find_spec("fedsim.commands.account") is not None
    for row in rows:
        ledger = _ledger(tmp_path, result, row["client_id"])
        steps = group_steps(ledger.steps)
        assert len(steps) == 1 and steps[0].count == int(row["steps"])
        if row["budget_epsilon"]:
            budget = float(row["budget_epsilon"])
            assert make_accountant("pld", steps).epsilon(1e-5) <= budget
            # The next round would have crossed the budget (that is why it stopped).
            assert make_accountant("pld", [steps[0].times(steps[0].count + 1)]).epsilon(1e-5) > budget
        if account_available:
            capsys.readouterr()  # drop the run's own log lines
            assert main(["account", "--sampling", row["sampling"], "--q", row["q"], "--sigma",
                         row["sigma"], "--steps", row["steps"], "--delta", "1e-5", "--json"]) == 0
            answer = json.loads(capsys.readouterr().out)
            assert float(row["epsilon"]) == pytest.approx(answer["epsilon"], rel=1e-6)
        else:
            assert float(row["epsilon"]) == pytest.approx(
                make_accountant("pld", [steps[0]]).epsilon(1e-5), rel=1e-9)
    stopped = {entry["client_id"] for entry in result.summary["stopped"]}
    assert stopped == {row["client_id"] for row in rows}
    assert "privacy budget" in result.summary["explanation"]


def test_a_crashed_client_rejoins_and_its_ledger_continues(tmp_path: Path) -> None:
    data = scenario(**{"stop": {"virtual_seconds": 40.0}, "network": {}})
    group = copy.deepcopy(data["clients"]["groups"][1])
    group.update(name="crashy", count=1, data_share=0.2, rounds=None, budget=None,
                 availability={"crashes": {"every": 3.0, "rejoin_after": 1.0}})
    data["clients"]["groups"][1]["data_share"] = 0.3
    data["clients"]["groups"].append(group)
    result = run(data, tmp_path)
    client = result.clients["crashy-000"]
    assert client.crashes >= 5
    rounds = [r.round for r in client.released_rounds()]
    assert rounds == list(range(len(rounds)))  # numbering continues after every restart
    # the bounded sums over the incarnations are the history's
    history, sums = client.released_rounds(), client.releases()
    assert (sums.count, sums.sample_grads, sums.last) == (
        len(history), sum(r.sample_grads for r in history), history[-1])
    ledger = _ledger(tmp_path, result, "crashy-000")
    assert [record.round for record in ledger.records] == rounds
    # The summary counts them, and says so (a stranger: only the clients' files did)
    assert result.summary["crashes"] == {"crashes": client.crashes, "clients": 1, "for_good": 0}
    assert f"1 client(s) crashed {client.crashes} time(s)" in result.summary["explanation"]


def test_a_crash_at_the_runs_last_instant_does_not_restart_the_client(tmp_path: Path) -> None:
    """Crashes every 2 virtual s and a run of 12: a crash falls on the instant the run ends.
    The crash helper, cancelled as it waited for the crashed actor, swallowed its own cancel,
    restarted the client after its rejoin delay, and that actor trained on for ever with no
    server to end it (a reviewer's probe: 2,821 rounds a client by 641 virtual s, in a run
    that never returned). Run in a subprocess, so that a relapse fails instead of hanging."""
    script = (
        "import json, sys\n"
        "from fedsim.config import LoadedScenario, parse_scenario\n"
        "from fedsim.runtime.simulated.simulation import run_scenario\n"
        "group = {'name': 'a', 'count': 4, 'data_share': 1.0, 'batch_size': 16, 'clip': 1.0,\n"
        "         'noise': 1.0, 'speed': 0.01,\n"
        "         'availability': {'crashes': {'every': 2.0, 'rejoin_after': 0.5}}}\n"
        "data = {'seed': 1, 'stop': {'virtual_seconds': 12.0}, 'model': {'name': 'logreg'},\n"
        "        'server': {'window': 0.5}, 'clients': {'groups': [group]},\n"
        "        'dataset': {'name': 'synthetic', 'num_samples': 800,\n"
        "                    'num_test_samples': 200, 'num_features': 12, 'num_classes': 3}}\n"
        "result = run_scenario(LoadedScenario(parse_scenario(data), None), sys.argv[1])\n"
        "print(json.dumps({'windows': result.summary['windows'],\n"
        "                  'crashes': sum(c.crashes for c in result.clients.values())}))\n")
    import subprocess
    import sys

    done = subprocess.run([sys.executable, "-c", script, str(tmp_path / "run")],
                          cwd=Path(__file__).resolve().parents[2], capture_output=True,
                          text=True, timeout=300, check=False)
    assert done.returncode == 0, done.stderr[-2000:]
    outcome = json.loads(done.stdout.strip().splitlines()[-1])
    assert outcome["windows"] == 24
    assert outcome["crashes"] >= 4 * 4
    for path in (tmp_path / "run" / "ledgers").glob("*.jsonl"):
        times = [json.loads(line)["time"] for line in path.read_text().splitlines()[1:]]
        assert max(times) <= 12.0 + 1.0  # nothing trained past the run's end


def test_message_only_runs_charge_the_same_events(tmp_path: Path) -> None:
    result = run(scenario(), tmp_path, message_only=True)
    assert result.summary["final_accuracy"] is None
    assert result.summary["updates"]["applied"] > 0
    assert np.array_equal(result.final_params, build_population(
        LoadedScenario(parse_scenario(scenario()), None)).initial_params)


def test_message_only_batch_sizes_are_the_plain_binomial_draws() -> None:
    """A message-only round's Poisson batch sizes (shared, cached count and rate tensors, one
    shared generator) are the draws of Binomial(N, q) built afresh from a generator of the
    round's own, seeded by SplitMix64 (computed here from its published constants) at the
    round's index; rounds drawn in any order, or again, draw the same."""
    population = build_population(LoadedScenario(parse_scenario(
        scenario(**{"clients.groups.0.local_steps": 3})), None))
    plan = next(p for p in population.plans if p.group.sampling == "poisson")
    trainer = population.trainer(plan, message_only=True,
                                 generator=torch.Generator().manual_seed(11))
    assert population.trainer(plan, message_only=True).draws.seed == \
        population.tree.integer("client", plan.client_id, "train")

    def splitmix64(state: int) -> int:
        mask = 2**64 - 1
        z = (state + 0x9E3779B97F4A7C15) & mask
        z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & mask
        z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & mask
        return z ^ (z >> 31)

    expected: dict[int, list[int]] = {}
    for round_index in range(40):
        plain = torch.Generator().manual_seed(
            splitmix64(11 + round_index * 0x9E3779B97F4A7C15) & (2**63 - 1))
        rate = torch.full((plan.group.local_steps,), plan.q, dtype=torch.float64)
        counts = torch.binomial(torch.full_like(rate, plan.num_samples), rate, generator=plain)
        expected[round_index] = [int(c) for c in counts]
    assert len({tuple(v) for v in expected.values()}) > 5  # drawn, not one constant
    for round_index in [*range(40), 7, 3, 39]:
        result = trainer.begin_round(population.initial_params, round_index).result()
        assert result.batch_sizes == expected[round_index]
        assert result.sample_grads == sum(expected[round_index])


def test_offline_clients_start_no_rounds(tmp_path: Path) -> None:
    speed = 0.01
    data = scenario(**{"stop": {"virtual_seconds": 30.0}, "network": {}})
    data["clients"]["groups"][0].update(
        speed=speed, budget=None, rounds=None,
        availability={"online": {"kind": "exponential", "mean": 2.0}, "offline": 3.0})
    data["clients"]["groups"][1]["rounds"] = 200
    result = run(data, tmp_path)
    for client_id in ("p-000", "p-001"):
        # The same stream the simulation used: online, offline, online, ... periods.
        rng = SeedTree(data["seed"]).numpy("client", client_id, "availability")
        group = parse_scenario(data).clients.groups[0]
        offline, now = [], 0.0
        while now < 30.0:
            now += group.availability.online.sample(rng)
            end = now + group.availability.offline.sample(rng)
            offline.append((now, end))
            now = end
        rounds = result.clients[client_id].released_rounds()
        assert rounds
        for record in rounds:
            # A round lasts the cost of its expected batch (public timing), not the realised one.
            started = record.time - speed * group.local_steps * group.batch_size
            assert not any(low < started < high for low, high in offline), (client_id, started)


def test_a_run_keeps_its_clients_sums_not_a_record_a_round(tmp_path: Path) -> None:
    result = run(scenario(), tmp_path / "run", keep_history=False)
    assert result.applied_log == [] and result.summary["updates"]["applied"] > 0
    total = 0
    for client_id, client in result.clients.items():
        with pytest.raises(ConfigError, match="keep_history=True"):
            client.released_rounds()
        releases = client.releases()
        assert releases.kept is None
        with _ledger(tmp_path / "run", result, client_id) as ledger:
            assert releases.count == len(ledger.rounds)
            if releases.last is not None:
                assert releases.last.round == max(ledger.rounds)
        total += releases.sample_grads
    assert total == result.sample_grads > 0
    # the same run keeping its history writes the same files
    again = run(scenario(), tmp_path / "again")
    for name in OUTPUT_FILES:
        assert (tmp_path / "run" / name).read_bytes() == (tmp_path / "again" / name).read_bytes()
    assert len(again.applied_log) == result.summary["updates"]["applied"]
