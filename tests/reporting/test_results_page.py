"""docs/RESULTS.md is generated from benchmarks/results/papers/*.json and agrees with them."""

from __future__ import annotations

import json
from pathlib import Path
from types import ModuleType

import pytest

from tests.scripts import load_script

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "benchmarks" / "papers" / "make_results_page.py"


def _load() -> ModuleType:
    return load_script(SCRIPT, "make_results_page")


page_module = _load()


def _write(path: Path, data: object) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data), encoding="utf-8")


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    results = tmp_path / "benchmarks" / "results" / "papers"
    _write(results / "drs_mnist.json", [
        {"run": "A", "full": False, "epochs": 3, "accuracy": 0.93871, "paper_accuracy": 0.95,
         "mu_clt": 0.28512, "eps_pld": 1.0671, "eps_gdp_clt": 1.0713, "eps_rdp": 1.2533},
    ])
    _write(results / "asoodeh_rounds.json", {
        "command": "python benchmarks/papers/asoodeh_rounds.py",
        "plot": "docs/img/asoodeh_rounds.png",
        "delta": 1e-05,
        "note": "a note from the data",
        "comparison": [{"claim": "extra rounds", "paper": "hundreds", "ours": "123 to 456"}],
        "rows": [{"mechanism": "gaussian", "sigma": 20.0, "epsilon": 1.0,
                  "steps_rdp_classic": 1711, "steps_rdp_optimal": 1795, "steps_tight": 2087}],
        "curves": [{"epsilon": [1.0], "steps_tight": [2087]}],
    })
    image = tmp_path / "docs" / "img" / "asoodeh_rounds.png"
    image.parent.mkdir(parents=True)
    image.write_bytes(b"\x89PNG")
    return tmp_path


def test_page_shows_the_data_and_names_missing_results(repo: Path) -> None:
    page = page_module.render_page(repo / "benchmarks" / "results" / "papers", repo)
    # drs_mnist: the paper column sits next to ours, numbers come from the file.
    assert "| run | full | epochs | accuracy (paper) | accuracy | mu_clt |" in page
    assert "| A | no | 3 | 0.95 | 0.9387 | 0.2851 | 1.067 | 1.071 | 1.253 |" in page
    # asoodeh_rounds: comparison table, rows, settings, note and plot link from the file.
    assert "| extra rounds | hundreds | 123 to 456 |" in page
    assert "| gaussian | 20.0 | 1.0 | 1711 | 1795 | 2087 |" in page
    assert "delta = 1e-05" in page and "> a note from the data" in page
    assert "![asoodeh_rounds](img/asoodeh_rounds.png)" in page
    assert "Regenerate: `python benchmarks/papers/asoodeh_rounds.py`" in page
    assert "curves" not in page  # plot data is not a table
    # Missing results: one line each with the command that writes them.
    for stem in ("du_dynamic", "vandijk_async"):
        assert f"`python benchmarks/papers/{stem}.py` writes `benchmarks/results/papers/{stem}.json`" in page
    # A plot named by the data but not drawn yet is said to be missing, not linked.
    assert "*Plot `docs/img/drs_mnist_tradeoff.png` not generated yet*" in page


def test_page_follows_the_data(repo: Path) -> None:
    results = repo / "benchmarks" / "results" / "papers"
    before = page_module.render_page(results, repo)
    assert page_module.render_page(results, repo) == before  # a pure function of the files
    data = json.loads((results / "drs_mnist.json").read_text())
    data[0]["accuracy"] = 0.96123
    _write(results / "drs_mnist.json", data)
    after = page_module.render_page(results, repo)
    assert "| 0.95 | 0.9612 |" in after and "0.9387" not in after


def test_check_mode_and_bad_input(repo: Path, tmp_path: Path) -> None:
    results = repo / "benchmarks" / "results" / "papers"
    page = tmp_path / "RESULTS.md"
    assert page_module.main(["--results", str(results), "--page", str(page)]) == 0
    assert page_module.main(["--check", "--results", str(results), "--page", str(page)]) == 0
    page.write_text(page.read_text() + "hand edit\n")
    assert page_module.main(["--check", "--results", str(results), "--page", str(page)]) == 1
    (results / "du_dynamic.json").write_text('"just a string"')
    assert page_module.main(["--results", str(results), "--page", str(page)]) == 2


def test_committed_page_matches_committed_data() -> None:
    """The page in docs/ is exactly what the committed result files generate."""
    committed = REPO / "docs" / "RESULTS.md"
    assert committed.is_file(), "docs/RESULTS.md is missing: run benchmarks/papers/make_results_page.py"
    assert committed.read_text(encoding="utf-8") == page_module.render_page(), (
        "docs/RESULTS.md is out of date: run python benchmarks/papers/make_results_page.py")
