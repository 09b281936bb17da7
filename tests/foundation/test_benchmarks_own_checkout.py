"""A benchmark measures its own checkout's fedsim, not whichever fedsim is installed.

``python benchmarks/X.py`` puts ``benchmarks/`` on ``sys.path``, not the checkout; another
checkout's fedsim installed ahead of it (simulated here by ``PYTHONPATH``, which comes before
site-packages) would be imported and its figures filed under this checkout's commit.
``benchmarks/_common.py``, imported first by every script, puts the checkout first.
"""

from __future__ import annotations

import ast
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
BENCHMARKS = REPO / "benchmarks"
SCRIPTS = sorted(str(p.relative_to(BENCHMARKS)) for p in [*BENCHMARKS.glob("*.py"),
                                                          *BENCHMARKS.glob("papers/*.py")]
                 if p.name not in {"_common.py", "make_results_page.py", "dp_step.py"})
CHEAP = ["mqtt_load.py", "papers/vandijk_async.py"]


def other_checkout(root: Path, body: str) -> dict[str, str]:
    """An environment whose first fedsim on the path is another checkout's (``body`` is its
    ``fedsim/__init__.py``)."""
    (root / "fedsim").mkdir(parents=True)
    (root / "fedsim" / "__init__.py").write_text(body, encoding="utf-8")
    env = {k: v for k, v in os.environ.items() if k != "FEDSIM_BENCH_TREE"}
    return {**env, "PYTHONPATH": str(root)}


@pytest.fixture
def elsewhere(tmp_path: Path) -> dict[str, str]:
    return other_checkout(tmp_path / "other",
                          "raise SystemExit(\"imported the other checkout's fedsim\")\n")


def python(env: dict[str, str], *argv: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, *argv], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=120, check=False)


def test_the_other_install_wins_without_the_fix(elsewhere: dict[str, str],
                                                tmp_path: Path) -> None:
    # the control: what a script that imports fedsim straight away gets
    probe = tmp_path / "probe.py"
    probe.write_text("import fedsim\n", encoding="utf-8")
    done = python(elsewhere, str(probe), cwd=tmp_path)
    assert done.returncode != 0 and "other checkout's fedsim" in done.stderr


@pytest.mark.parametrize("script", CHEAP)
def test_a_benchmark_imports_its_own_checkout(script: str, elsewhere: dict[str, str],
                                              tmp_path: Path) -> None:
    done = python(elsewhere, str(BENCHMARKS / script), "--help", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert "other checkout's fedsim" not in done.stderr and "usage" in done.stdout


def _first_line(tree: ast.Module, wanted: Callable[[str], bool]) -> int | None:
    """The line of the first top-level import of a module that ``wanted`` accepts."""
    for node in tree.body:
        names = ([a.name for a in node.names] if isinstance(node, ast.Import)
                 else [node.module or ""] if isinstance(node, ast.ImportFrom) else [])
        if any(wanted(n) for n in names):
            return node.lineno
    return None


@pytest.mark.parametrize("script", SCRIPTS)
def test_every_benchmark_imports_common_before_fedsim(script: str) -> None:
    """What the two runs above show, for every script: ``_common`` (which puts the checkout
    first on the path) is imported before anything of fedsim (read from the source, not run:
    running each script's --help costs a minute of CI for no more certainty)."""
    tree = ast.parse((BENCHMARKS / script).read_text(encoding="utf-8"))
    common = _first_line(tree, lambda n: n == "_common")
    fedsim = _first_line(tree, lambda n: n == "fedsim" or n.startswith("fedsim."))
    assert fedsim is None or (common is not None and common < fedsim), (
        f"{script} imports fedsim before _common")


def test_results_name_the_commit_of_the_measured_tree(elsewhere: dict[str, str],
                                                      tmp_path: Path) -> None:
    head = subprocess.run(["git", "-C", str(REPO), "rev-parse", "--short=12", "HEAD"],
                          capture_output=True, text=True, check=False).stdout.strip()
    code = (f"import sys; sys.path.insert(0, {str(BENCHMARKS)!r}); import _common, fedsim; "
            "print(fedsim.__file__); print(_common.provenance())")
    done = python(elsewhere, "-c", code, cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    where, made_by = done.stdout.splitlines()
    assert Path(where).resolve() == REPO / "fedsim" / "__init__.py"
    if head:  # a git checkout (not an exported tree)
        assert made_by.startswith(head)


def test_a_fedsim_imported_from_elsewhere_first_is_refused(tmp_path: Path) -> None:
    env = other_checkout(tmp_path / "other", "__version__ = 'other'\n")
    code = (f"import fedsim; import sys; sys.path.insert(0, {str(BENCHMARKS)!r}); "
            "import _common")
    done = python(env, "-c", code, cwd=tmp_path)
    assert done.returncode != 0
    assert "import _common before fedsim" in done.stderr
