"""``fedsim.simulate`` returns the run's own numbers, not what it reads back from the run
directory (issue 28, item 6): a CSV cell cannot hold an unbounded epsilon, and reading an empty
cell as 0.0 would report a client's privacy loss as nothing. Privacy numbers are never
understated: an epsilon the accountant cannot bound stays ``inf``."""

from __future__ import annotations

import csv
import math
from pathlib import Path
from typing import Any

import pytest

import fedsim
from fedsim.runtime import run_outputs

from .conftest import TINY


def _unbounded(*args: Any, **kwargs: Any) -> tuple[float, str]:
    """No guarantee bounds the history (e.g. a delta below what the mechanism allows): the
    smallest-guarantee rule's answer is infinite."""
    return math.inf, "pld"


def test_an_unbounded_epsilon_is_inf_in_the_results_never_zero(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(run_outputs, "smallest_epsilon", _unbounded)
    result = fedsim.simulate(TINY, out=tmp_path / "run", progress=False, plots=False)
    spent = [c for c in result.clients if c.steps > 0]
    assert spent, "the tiny scenario's clients release rounds"
    assert all(c.epsilon == math.inf for c in spent)
    assert result.epsilon_max == math.inf
    # The run directory cannot say inf in a CSV cell: the cell is empty there.
    with open(tmp_path / "run" / "clients.csv", encoding="utf-8") as handle:
        cells = {r["client_id"]: r["epsilon"] for r in csv.DictReader(handle)}
    assert all(cells[c.client_id] == "" for c in spent)


def test_results_are_the_runs_own_rows_with_typed_stop_kinds(tmp_path: Path) -> None:
    result = fedsim.simulate(TINY, out=None, progress=False)
    assert result.run_dir is None
    for client in result.clients:
        assert isinstance(client.epsilon, float) and client.epsilon >= 0
        if client.stopped_at is not None:
            assert client.stop_kind in {"budget", "done", "server_finished", "crashed"}
            assert client.stop_reason
        else:
            assert client.stop_kind is None
    assert len(result.windows) == result.summary["windows"]
    assert result.summary["stop_kind"] in {"windows", "budgets_spent"}
    assert result.summary["stop_reason"]
