"""Synthetic run directories, written file by file per the run-directory contract.

The ledgers are written by the real :class:`fedsim.privacy.ledger.PrivacyLedger`; every other
file is written here, so the reporting code is tested against the contract, not against one
particular run of the simulator.
"""

from __future__ import annotations

import csv
import json
import math
import shutil
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from fedsim.privacy.accountant import make_accountant
from fedsim.privacy.events import GaussianStep, group_steps
from fedsim.privacy.ledger import Budget, PrivacyLedger

DELTA = 1e-5
BUDGET_EPSILON = 3.0
CLIENT_COLUMNS = ("client_id", "group", "num_samples", "batch_size", "sampling", "q", "rounds",
                  "steps", "sigma", "clip", "epsilon", "mu_clt", "budget_epsilon",
                  "remaining_epsilon", "state", "stopped_at", "stop_reason", "stop_kind")
# Three postures (group, q, sigma, seconds between rounds, budget eps); clients of one group
# start at different times, so they share postures but not histories. Only the fast group has
# a budget (and runs into it): a budgeted ledger costs a headroom search when it is written.
GROUPS = (("fast", 0.1, 1.0, 4.0, BUDGET_EPSILON), ("medium", 0.05, 1.5, 6.0, None),
          ("slow", 0.2, 2.0, 9.0, None))


@dataclass(frozen=True)
class SyntheticRun:
    path: Path
    histories: dict[str, list[tuple[float, GaussianStep]]]
    duration: float
    delta: float = DELTA

    def final_epsilon(self, client_id: str) -> float:
        steps = [step for _, step in self.histories[client_id]]
        return make_accountant("pld", steps).epsilon(DELTA) if steps else 0.0


def poisson_clt_mu(steps: list[GaussianStep]) -> float:
    """Bu et al. 2020 / paper 002: mu = q sqrt(sum_t (e^{1/sigma_t^2} - 1)) (one q here)."""
    q = steps[0].q
    return q * math.sqrt(sum(s.count * math.expm1(s.sigma**-2) for s in steps))


def build_run(root: Path, clients: int = 4, windows: int = 12, window: float = 5.0,
              name: str = "synthetic", id_format: str = "c{:03d}",
              accountant: str = "pld") -> SyntheticRun:
    """A finished run of ``clients`` clients over ``windows`` windows of ``window`` seconds
    (client ``i``'s id ``id_format.format(i)``), whose ledgers enforce with ``accountant``
    (clients.csv and summary.json report eps under pld, as a run writes them)."""
    root.mkdir(parents=True, exist_ok=True)
    duration = windows * window
    (root / "scenario.resolved.yaml").write_text(
        f"name: {name}\nseed: 7\nprivacy:\n  delta: {DELTA}\n", encoding="utf-8")
    metrics = []
    step_size = 1.0
    for index in range(1, windows + 1):
        accuracy = round(0.1 + 0.8 * (1 - math.exp(-index / 4)), 6) if index % 2 == 0 else None
        if index % 5 == 0:
            step_size = round(step_size * 0.9, 6)
        metrics.append({"window": index, "time": index * window, "version": index,
                        "accuracy": accuracy, "loss": None if accuracy is None else 1 - accuracy,
                        "received": 3, "applied": 2, "stale": 1, "duplicate": 0, "rejected": 0,
                        "dropped_in_flight": 0, "step_size": step_size,
                        "active_clients": clients, "min_remaining_epsilon": None})
    (root / "metrics.jsonl").write_text("".join(json.dumps(m) + "\n" for m in metrics),
                                        encoding="utf-8")
    ledger_dir = root / "ledgers"
    ledger_dir.mkdir()
    histories: dict[str, list[tuple[float, GaussianStep]]] = {}
    rows: list[dict[str, Any]] = []
    for index in range(clients):
        group, q, sigma, period, budget = GROUPS[index % len(GROUPS)]
        client_id = id_format.format(index)
        history = []
        start = (index // len(GROUPS)) * 1.5 + 1.0
        time, round_index = start, 0
        with PrivacyLedger.open(ledger_dir / f"{client_id}.jsonl", client_id=client_id,
                                sampling="poisson", accountant=accountant,
                                budget=Budget(budget, DELTA) if budget else None) as ledger:
            while time <= duration:
                step = GaussianStep("poisson", q, sigma)
                if not ledger.can_spend([step]):
                    break
                ledger.spend([step], time=time, round=round_index)
                history.append((time, step))
                time += period
                round_index += 1
        histories[client_id] = history
        steps = list(group_steps(s for _, s in history))
        epsilon = make_accountant("pld", steps).epsilon(DELTA) if steps else 0.0
        stopped = time <= duration  # left the loop because the budget would be exceeded
        rows.append({"client_id": client_id, "group": group, "num_samples": 600,
                     "batch_size": round(q * 600), "sampling": "poisson", "q": q,
                     "rounds": len(history), "steps": len(history), "sigma": sigma, "clip": 1.0,
                     "epsilon": epsilon, "mu_clt": poisson_clt_mu(steps) if steps else 0.0,
                     "budget_epsilon": budget,
                     "remaining_epsilon": budget - epsilon if budget else None,
                     "state": "budget_exhausted" if stopped else "active",
                     "stopped_at": time if stopped else None,
                     "stop_reason": "budget exhausted" if stopped else "",
                     "stop_kind": "budget" if stopped else ""})
    with (root / "clients.csv").open("w", encoding="utf-8", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=CLIENT_COLUMNS)
        writer.writeheader()
        for row in rows:
            writer.writerow({k: "" if v is None else v for k, v in row.items()})
    evaluated = [m["accuracy"] for m in metrics if m["accuracy"] is not None]
    summary = {"scenario": name, "seed": 7, "final_accuracy": evaluated[-1],
               "best_accuracy": max(evaluated), "windows": windows, "virtual_time": duration,
               "updates": {"received": 3 * windows, "applied": 2 * windows, "stale": windows}, "client_states": {},
               "stopped": [{"client_id": r["client_id"], "time": r["stopped_at"],
                            "reason": r["stop_reason"], "kind": r["stop_kind"]}
                           for r in rows if r["stop_reason"]],
               "privacy": {"delta": DELTA, "accountant": "pld"},
               "explanation": f"{name} ran {windows} windows."}
    (root / "summary.json").write_text(json.dumps(summary, indent=1), encoding="utf-8")
    return SyntheticRun(root, histories, duration)


@pytest.fixture(scope="module")
def small_run(tmp_path_factory: pytest.TempPathFactory) -> SyntheticRun:
    """4 clients (drawn one by one); copy it before changing it."""
    return build_run(tmp_path_factory.mktemp("small") / "run", clients=4)


@pytest.fixture
def copy_run(tmp_path: Path) -> Callable[[SyntheticRun], SyntheticRun]:
    """A private copy of a module-wide run, to damage or redraw."""
    counter = iter(range(1000))

    def copy(run: SyntheticRun) -> SyntheticRun:
        target = tmp_path / f"copy{next(counter)}"
        shutil.copytree(run.path, target)
        return SyntheticRun(target, run.histories, run.duration, run.delta)

    return copy


@pytest.fixture(scope="module")
def many_clients_run(tmp_path_factory: pytest.TempPathFactory) -> SyntheticRun:
    """12 clients in 3 postures: enough to switch the epsilon plot to band + representatives."""
    return build_run(tmp_path_factory.mktemp("many") / "run", clients=12)


@pytest.fixture
def build_run_of() -> Callable[..., SyntheticRun]:
    """:func:`build_run` itself, for a test that builds its own run (conftest is not
    importable under --import-mode=importlib)."""
    return build_run


def _edit_summary(run: SyntheticRun, **changes: Any) -> dict[str, Any]:
    summary = json.loads((run.path / "summary.json").read_text())
    for key, value in changes.items():
        if isinstance(value, dict) and isinstance(summary.get(key), dict):
            summary[key].update(value)
        else:
            summary[key] = value
    (run.path / "summary.json").write_text(json.dumps(summary))
    return summary


@pytest.fixture
def edit_summary() -> Callable[..., dict[str, Any]]:
    """``edit_summary(run, key=value, ...)``: set summary.json's keys (a dict value is merged
    into a dict there); returns the summary written."""
    return _edit_summary


def _edit_clients_csv(run: SyntheticRun, row: int, **cells: str) -> Path:
    path = run.path / "clients.csv"
    lines = path.read_text().splitlines()
    header = lines[0].split(",")
    fields = lines[1 + row].split(",")
    for column, value in cells.items():
        fields[header.index(column)] = value
    lines[1 + row] = ",".join(fields)
    path.write_text("\n".join(lines) + "\n")
    return path


@pytest.fixture
def edit_clients_csv() -> Callable[..., Path]:
    """``edit_clients_csv(run, row, column=value, ...)``: set cells of clients.csv's ``row``
    (0: the first client); returns the file's path."""
    return _edit_clients_csv
