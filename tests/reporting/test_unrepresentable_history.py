"""A history the PLD grid cannot represent (an attacker's fixed-size posture change: 7 rounds
of sigma 9.3, then 100 of sigma 0.38) is answered by RDP's bound everywhere a run's outputs
and reports read it: ``clients.csv``'s row raised AccountantOutOfRange (the run lost its
outputs), and so did ``fedsim report``'s epsilon history and trade-off plot."""

from __future__ import annotations

import functools
import shutil
from pathlib import Path
from typing import Any

import pytest

from fedsim.config import LoadedScenario, parse_scenario
from fedsim.errors import AccountantOutOfRange
from fedsim.privacy.accountant import make_accountant
from fedsim.privacy.events import GaussianStep
from fedsim.privacy.ledger import PrivacyLedger
from fedsim.reporting.epsilon_history import EpsilonCache
from fedsim.reporting.plots import draw_all
from fedsim.runtime.actors.releases import Releases
from fedsim.runtime.population import build_population
from fedsim.runtime.run_outputs import _client_row, _clt_figures
from fedsim.runtime.run_record import ClientOutcome
from tests.runtime.test_simulation import scenario

DELTA = 1e-5
FIRST = GaussianStep("fixed", 0.00019105573454994174, 9.312663317530415)
LATER = GaussianStep("fixed", 0.00012561914337854606, 0.38326428052608313)
HISTORY = [FIRST.times(7), LATER.times(100)]


def _spend_history(path: Path, client_id: str) -> PrivacyLedger:
    ledger = PrivacyLedger.open(path, client_id=client_id, sampling="fixed", budget=None,
                                fsync=False)
    for r in range(107):
        ledger.spend([FIRST if r < 7 else LATER], time=float(r), round=r)
    return ledger


def test_the_history_is_beyond_the_pld_and_bounded_by_rdp() -> None:
    with pytest.raises(AccountantOutOfRange):
        make_accountant("pld", HISTORY).epsilon(DELTA)
    assert EpsilonCache(DELTA).epsilon(make_accountant("pld", []), HISTORY) == pytest.approx(
        make_accountant("rdp", HISTORY).epsilon(DELTA), rel=1e-12)


def test_a_clients_row_reads_rdps_bound(tmp_path: Path) -> None:
    population = build_population(LoadedScenario(parse_scenario(scenario()), None))
    plan = next(p for p in population.plans if p.group.sampling == "fixed")
    with _spend_history(tmp_path / "c.jsonl", plan.client_id) as ledger:
        row = _client_row(ClientOutcome(plan, ledger, "done", Releases(), True), DELTA, None,
                          functools.cache(_clt_figures))
    assert row["epsilon"] == pytest.approx(make_accountant("rdp", HISTORY).epsilon(DELTA),
                                           rel=1e-12)


def test_the_report_plots_it(small_run: Any, tmp_path: Path) -> None:
    run = tmp_path / "run"
    shutil.copytree(small_run.path, run)
    target = next((run / "ledgers").glob("*.jsonl"))
    client_id = target.stem
    for path in run.joinpath("ledgers").glob(f"{client_id}.jsonl*"):
        path.unlink()
    _spend_history(target, client_id).close()
    paths = draw_all(run)
    assert [p.name for p in paths] == ["accuracy.png", "epsilon.png", "tradeoff.png"]
