"""The committed study figures still follow from the code (issue 27, finding 11).

A reduced variant of the van Dijk & Nguyen study (``--quick``: 10 clients, 20 virtual
seconds; one seed; the poisson and fixed variants, about 30 s) is committed beside the full
results (``benchmarks/results/papers/reduced/vandijk_async.json``); this test reruns it and
fails when the code no longer reproduces it: the run is deterministic, so the update counts
must match exactly and accuracy / eps to float rounding. When it fails, the full figures on
docs/RESULTS.md are stale too: regenerate both (the commands are in the file and on the page).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from fedsim.data import datasets

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[2]
REDUCED = REPO / "benchmarks" / "results" / "papers" / "reduced"
COMMAND = ["--quick", "--seeds", "1", "--variants", "poisson", "fixed"]


def _script() -> Any:
    import importlib.util
    import sys

    path = REPO / "benchmarks" / "papers" / "vandijk_async.py"
    spec = importlib.util.spec_from_file_location("papers_vandijk_async_current", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def test_the_reduced_van_dijk_study_is_reproduced(tmp_path: Path,
                                                  real_mnist: datasets.Found) -> None:
    committed = json.loads((REDUCED / "vandijk_async.json").read_text())
    assert committed["commit"]  # which code made it
    assert _script().main([*COMMAND, "--runs", str(tmp_path / "runs"), "--results",
                           str(tmp_path), "--plot", str(tmp_path / "plot.png")]) == 0
    rerun = json.loads((tmp_path / "vandijk_async.json").read_text())
    assert [r["variant"] for r in rerun["rows"]] == [r["variant"] for r in committed["rows"]]
    for old, new in zip(committed["rows"], rerun["rows"], strict=True):
        for key, value in old.items():
            if isinstance(value, float):
                assert new[key] == pytest.approx(value, rel=1e-6, abs=1e-9), (old["variant"], key)
            else:
                assert new[key] == value, (old["variant"], key)
    assert rerun["notes"] == committed["notes"]  # the page's sentences follow from the rows
