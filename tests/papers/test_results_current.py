"""The committed study figures still follow from the code (issue 27, finding 11).

Every paper study in benchmarks/papers/ has a reduced variant (benchmarks/papers/reduced_studies.py:
its own script with quick settings, 20-60 s each) whose results JSON is committed in
``benchmarks/results/papers/reduced/``. Each test reruns one variant and fails when the code no
longer reproduces the committed file: fedsim runs, the DP-SGD training on CPU and the privacy
accounting are deterministic for a seed, so integers, strings and the generated notes must match
exactly and floats to a relative 1e-6 (float rounding, not a tolerance for change), test
accuracies to 0.1 points (their GEMMs round differently across CPU instruction sets: ``_same``). When one
fails, the full figures on docs/RESULTS.md are stale too: regenerate both (the reduced file with
``python benchmarks/papers/reduced_studies.py STUDY``, the full one with the command on the page).

Also: every results JSON under benchmarks/results/papers/ says which commit and fedsim version
made it (its ``commit`` field, printed on the page).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from fedsim.data import datasets
from tests.scripts import load_script

REPO = Path(__file__).resolve().parents[2]
RESULTS = REPO / "benchmarks" / "results" / "papers"
REDUCED = RESULTS / "reduced"


def _reduced_studies() -> Any:
    return load_script(REPO / "benchmarks" / "papers" / "reduced_studies.py",
                       "papers_reduced_studies")


STUDIES = sorted(_reduced_studies().STUDIES)


def _same(old: Any, new: Any, where: str, accuracy: bool = False) -> None:
    """``new`` reproduces ``old``: floats to a relative 1e-6, everything else exactly; a test
    accuracy (a field named ``*accuracy*``) to 0.001 of its full scale (0.1 points of a
    percentage: 10 test examples of 10,000).

    Why accuracies differ: training runs thousands of steps of float32 GEMMs whose kernels
    round differently on different CPU instruction sets, and a test example near the decision
    boundary may flip (the same commit's reduced drs_mnist: 36.88% on AMD EPYC with AVX2,
    36.89% on Intel Xeon with AVX-512). The privacy figures (epsilon, mu, ledgers) are computed
    in float64 from integers and parameters and stay exact to 1e-6."""
    if isinstance(old, float) and isinstance(new, (int, float)) and not isinstance(new, bool):
        if accuracy:
            assert new == pytest.approx(old, abs=0.1 if abs(old) > 1 else 0.001), where
        else:
            assert new == pytest.approx(old, rel=1e-6, abs=1e-9), where
    elif isinstance(old, dict):
        assert isinstance(new, dict) and sorted(new) == sorted(old), where
        for key in old:
            _same(old[key], new[key], f"{where}.{key}", accuracy or "accuracy" in key)
    elif isinstance(old, list):
        assert isinstance(new, list) and len(new) == len(old), where
        for index, (a, b) in enumerate(zip(old, new, strict=True)):
            _same(a, b, f"{where}[{index}]", accuracy)
    else:
        assert new == old, where


@pytest.mark.slow
@pytest.mark.parametrize("study", STUDIES)
def test_the_reduced_study_is_reproduced(study: str, tmp_path: Path,
                                         real_mnist: datasets.Found) -> None:
    committed = json.loads((REDUCED / f"{study}.json").read_text())
    assert committed["commit"]  # which code made it
    rerun = _reduced_studies().run(study, tmp_path)
    # what the page shows: the rows, and the sentences and comparisons generated from them
    for key in ("rows", "notes", "note", "comparison"):
        assert (key in rerun) == (key in committed), key
        if key in committed:
            _same(committed[key], rerun[key], f"{study}: {key}")


def test_every_reduced_study_has_its_committed_file() -> None:
    assert sorted(p.stem for p in REDUCED.glob("*.json")) == STUDIES


def _results_page() -> Any:
    return load_script(REPO / "benchmarks" / "papers" / "make_results_page.py",
                       "papers_make_results_page")


def test_every_results_file_names_the_commit_that_made_it() -> None:
    """Every JSON under benchmarks/results/papers/ (results, reduced results, training records,
    curves) names the commit and fedsim version that made it, which the page prints; the only
    exceptions are the training records listed as legacy, whose reason the page prints, and a
    legacy record that gained a commit must leave the list."""
    page = _results_page()
    legacy = page.LEGACY_RECORDS
    files = sorted(RESULTS.rglob("*.json"))
    assert len(files) >= 2 * len(STUDIES)
    for path in files:
        name = path.relative_to(RESULTS).as_posix()
        document = json.loads(path.read_text())
        assert isinstance(document, dict), name
        commit = document.get("commit")
        if name in legacy:
            assert commit is None, f"{name} names its commit: drop it from LEGACY_RECORDS"
            continue
        assert isinstance(commit, str) and "(fedsim " in commit, name
        assert "+dirty" not in commit and "unknown" not in commit, (name, commit)
    assert set(legacy) <= {p.relative_to(RESULTS).as_posix() for p in files}
    text = (REPO / "docs" / "RESULTS.md").read_text()
    for name, reason in legacy.items():
        assert f"`{Path(name).name}`" in text and f"made by: not recorded ({reason})." in text
