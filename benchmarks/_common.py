"""What several benchmarks share: the centralised DP-SGD loop, result files, plotting set-up.

Benchmarks are scripts (``python benchmarks/NAME.py``, ``python benchmarks/papers/NAME.py``)
and are also loaded by path from tests; each imports ``_common`` before any of fedsim (a
script in ``papers/`` first puts this directory on ``sys.path``).

Which fedsim is measured: ``python benchmarks/NAME.py`` puts ``benchmarks/`` on ``sys.path``,
not the checkout, so ``import fedsim`` would find whatever fedsim is installed (an editable
install of another checkout) and its figures would be filed under this checkout's commit.
Importing this module puts this checkout (or ``FEDSIM_BENCH_TREE``, another tree to measure
side by side) first on ``sys.path``, refuses to go on when a fedsim from elsewhere is already
imported, and :func:`commit` / :func:`provenance` name the commit of the tree that holds the
imported fedsim.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable, Collection
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
TREE = Path(os.environ.get("FEDSIM_BENCH_TREE", str(ROOT))).resolve()
if sys.path[:1] != [str(TREE)]:
    sys.path.insert(0, str(TREE))

import fedsim  # after the tree to measure is first on sys.path

FEDSIM_TREE = Path(fedsim.__file__).resolve().parents[1]
"""The tree whose fedsim this process measures (``TREE``, checked below)."""
if FEDSIM_TREE != TREE:
    raise ImportError(f"benchmarks: fedsim was imported from {FEDSIM_TREE}, not {TREE}: import "
                      f"_common before fedsim (or set FEDSIM_BENCH_TREE to the tree to measure)")

if TYPE_CHECKING:
    from fedsim.privacy.events import GaussianStep
    from fedsim.training import LocalTrainer

__all__ = ["ALLOCATORS", "add_allocator_option", "centralized_dp_sgd", "commit", "set_allocator", "epoch_ends", "provenance", "pyplot", "rss_mb",
           "write_json"]


def centralized_dp_sgd(
    trainer: LocalTrainer,
    params: np.ndarray,
    *,
    lr: float,
    steps: int,
    evaluate_at: Collection[int] = (),
    on_evaluate: Callable[[int, np.ndarray], None] | None = None,
) -> tuple[np.ndarray, list[GaussianStep]]:
    """One data holder's NoisySGD (DRS Alg. 1; Abadi et al. 2016): ``steps`` DP steps
    ``w <- w - lr * g~_t`` from ``params``, each step ``t`` the trainer's round ``t`` (its
    ``clip(t)``, ``sigma(t)``, batch and noise). After step ``t + 1`` in ``evaluate_at``,
    ``on_evaluate(t + 1, w)``. Returns the final parameters and the privacy events spent."""
    events: list[GaussianStep] = []
    for t in range(steps):
        result = trainer.run_round(params, t)
        events.extend(result.steps)
        params = params - np.float32(lr) * result.update
        if on_evaluate is not None and t + 1 in evaluate_at:
            on_evaluate(t + 1, params)
    return params, events


def epoch_ends(steps: int, steps_per_epoch: float) -> list[int]:
    """The step counts at which each (possibly fractional) epoch of ``steps`` ends, and the
    last step."""
    ends, next_end = [], steps_per_epoch
    for done in range(1, steps + 1):
        if done >= next_end or done == steps:
            next_end += steps_per_epoch
            ends.append(done)
    return ends


ALLOCATORS = ("keep", "system")


def add_allocator_option(parser: Any) -> None:
    """``--allocator``: how this process's allocator runs (see :func:`set_allocator`)."""
    parser.add_argument(
        "--allocator", choices=ALLOCATORS, default="keep",
        help="keep (default): freed memory kept for reuse, as in every fedsim command's process "
             "(fedsim.runtime.allocator); system: glibc's defaults, as a library caller gets")


def set_allocator(choice: str) -> str:
    """Set this process's allocator as ``choice`` says, before the measured work allocates,
    and ``FEDSIM_ALLOCATOR`` for the processes it starts (rows' subprocesses, Ray's workers);
    return what the results should record. ``keep`` is what ``fedsim run`` does at start (a
    tree from before fedsim.runtime.allocator can only be measured with ``system``); where
    there is no glibc ``mallopt`` nothing can be kept and ``system`` is returned (said on
    stderr)."""
    os.environ["FEDSIM_ALLOCATOR"] = choice
    if choice == "keep":
        from fedsim.runtime.allocator import keep_freed_memory

        if not keep_freed_memory({}):  # {}: the benchmark's choice, not the caller's variables
            print("--allocator keep: no glibc mallopt here; measured with the system allocator",
                  file=sys.stderr)
            os.environ["FEDSIM_ALLOCATOR"] = "system"
            return "system"
    return choice


def commit() -> str:
    """The commit of the tree whose fedsim is imported (with ``+changes`` when its fedsim/
    differs from it)."""
    repo = FEDSIM_TREE
    try:
        head = subprocess.run(["git", "-C", str(repo), "rev-parse", "--short", "HEAD"],
                              capture_output=True, text=True, check=True).stdout.strip()
        dirty = subprocess.run(["git", "-C", str(repo), "status", "--porcelain", "fedsim"],
                               capture_output=True, text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"
    return head + ("+changes" if dirty else "")


def rss_mb() -> float:
    """This process's resident set size now, in MiB (NaN where /proc is missing)."""
    try:
        with open("/proc/self/status", encoding="ascii") as status:
            for line in status:
                if line.startswith("VmRSS"):
                    return int(line.split()[1]) / 1024
    except OSError:
        pass
    return float("nan")


# What the benchmarks write (relative to the repository root); not code, so not "+dirty".
OUTPUTS = ("benchmarks/results", "docs/img", "docs/RESULTS.md")


def provenance() -> str:
    """What made a result: ``"<commit> (fedsim <version>)"``, the commit of the tree whose
    fedsim is imported, suffixed ``+dirty`` when that tree has uncommitted changes to tracked
    files (for every results JSON's ``commit`` field; the results page prints it). Changed
    outputs (:data:`OUTPUTS`: results, plots, the results page) do not count: a study run
    after another has rewritten them is still made by the committed code."""
    repo = FEDSIM_TREE
    try:
        commit = subprocess.run(["git", "rev-parse", "--short=12", "HEAD"], cwd=repo, check=True,
                                capture_output=True, text=True).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no", "--", ".",
                                *(f":(exclude){path}" for path in OUTPUTS)],
                               cwd=repo, check=True, capture_output=True, text=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        commit, dirty = "unknown commit", ""
    return f"{commit}{'+dirty' if dirty else ''} (fedsim {fedsim.__version__})"


def write_json(path: Path, document: Any, *, indent: int = 2) -> None:
    """``document`` as JSON at ``path`` (folders made), then say so."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(document, indent=indent) + "\n", encoding="utf-8")
    print(f"wrote {path}")


def pyplot() -> Any:
    """``matplotlib.pyplot`` on the file-only Agg backend (no display needed)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt
