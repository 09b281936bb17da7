"""Reduced variants of the paper studies, for the check that their figures still follow from the code.

Each study in benchmarks/papers/ has a reduced variant here: the study's own script, run with
its quick settings (fewer clients, records, seeds, epochs or targets) into a temporary folder.
Its results JSON is committed as ``benchmarks/results/papers/reduced/<study>.json``;
tests/papers/test_results_current.py reruns every variant and fails when the code no longer
reproduces the committed file - and then the full figures on docs/RESULTS.md are stale too.

    python benchmarks/papers/reduced_studies.py                  # regenerate every reduced file
    python benchmarks/papers/reduced_studies.py du_dynamic        # only these

The commands (``{tmp}`` is the temporary folder):

* ``vandijk_async``: ``--quick --seeds 1 --variants poisson fixed`` (10 clients, 40 virtual s);
* ``du_dynamic``: ``--quick`` (centralized: 1024 records, 2 epochs, seed 0), then
  ``--part federated --quick`` (3 clients, 10 rounds);
* ``drs_mnist``: ``--runs A --epochs 0.05 --poisson-runs ''`` (run A trained for 12 steps; the
  privacy columns of A, B and C for their full schedules);
* ``asoodeh_rounds``: ``--quick`` (eps in {1, 2}, one sigma per mechanism);
* ``async_policies``: ``--seeds 1 --variants windows fedbuff``;
* ``clt_certified``: the study itself (pure accounting, ~10 s).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import shutil
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
REDUCED = REPO / "benchmarks" / "results" / "papers" / "reduced"

_OUT = ["--results", "{tmp}", "--plot", "{tmp}/plot.png"]
# study -> the runs of its script, in order, each (script stem, arguments)
STUDIES: dict[str, tuple[tuple[str, tuple[str, ...]], ...]] = {
    "vandijk_async": (
        ("vandijk_async", ("--quick", "--seeds", "1", "--variants", "poisson", "fixed",
                           "--runs", "{tmp}/runs", *_OUT)),
    ),
    "du_dynamic": (
        ("du_dynamic", ("--quick", *_OUT)),
        ("du_dynamic", ("--part", "federated", "--quick", "--runs", "{tmp}/runs", *_OUT)),
    ),
    "drs_mnist": (
        ("drs_mnist", ("--runs", "A", "--epochs", "0.05", "--poisson-runs", "", *_OUT)),
    ),
    "asoodeh_rounds": (
        ("asoodeh_rounds", ("--quick", "--out", "{tmp}/asoodeh_rounds.json",
                            "--plot", "{tmp}/plot.png", "--no-page")),
    ),
    "async_policies": (
        ("async_policies", ("--seeds", "1", "--variants", "windows", "fedbuff",
                            "--runs", "{tmp}/runs", "--no-page", *_OUT)),
    ),
    "clt_certified": (
        ("clt_certified", ("--no-page", *_OUT)),
    ),
}


def _script(stem: str) -> Any:
    """The study script as a module (loaded from its file: benchmarks/ is not a package)."""
    name = f"papers_{stem}_reduced"
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, HERE / f"{stem}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def command(study: str) -> str:
    """The reduced variant as shell commands (for messages and the results file)."""
    return " && ".join(
        "python benchmarks/papers/" + stem + ".py " + " ".join(a if a else "''" for a in argv)
        for stem, argv in STUDIES[study])


def run(study: str, folder: Path) -> dict[str, Any]:
    """Run ``study``'s reduced variant in ``folder`` and return the results JSON it wrote."""
    for stem, argv in STUDIES[study]:
        status = _script(stem).main([a.replace("{tmp}", str(folder)) for a in argv])
        if status != 0:
            raise RuntimeError(f"{stem} {' '.join(argv)} exited with {status}")
    document: dict[str, Any] = json.loads((folder / f"{study}.json").read_text())
    return document


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("studies", nargs="*", help=f"default: all of {', '.join(STUDIES)}")
    args = parser.parse_args(argv)
    unknown = sorted(set(args.studies) - set(STUDIES))
    if unknown:
        parser.error(f"unknown studies {unknown}; known: {list(STUDIES)}")
    REDUCED.mkdir(parents=True, exist_ok=True)
    for study in args.studies or list(STUDIES):
        with tempfile.TemporaryDirectory() as tmp:
            run(study, Path(tmp))
            shutil.copyfile(Path(tmp) / f"{study}.json", REDUCED / f"{study}.json")
        print(f"wrote {REDUCED / f'{study}.json'} ({command(study)})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
