"""What several benchmarks share: the centralised DP-SGD loop, result files, plotting set-up.

Benchmarks are scripts (``python benchmarks/NAME.py``, ``python benchmarks/papers/NAME.py``)
and are also loaded by path from tests; each puts this directory on ``sys.path`` and imports
``_common``.
"""

from __future__ import annotations

import json
import subprocess
from collections.abc import Callable, Collection
from pathlib import Path
from typing import Any

import numpy as np

from fedsim.privacy.events import GaussianStep
from fedsim.training import LocalTrainer

__all__ = ["centralized_dp_sgd", "commit", "epoch_ends", "provenance", "pyplot", "rss_mb",
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


def commit() -> str:
    """The checkout's commit (with ``+changes`` when the tree differs from it)."""
    repo = Path(__file__).resolve().parents[1]
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
    """What made a result: ``"<commit> (fedsim <version>)"``, the commit suffixed ``+dirty``
    when the working tree has uncommitted changes to tracked files (for every results JSON's
    ``commit`` field; the results page prints it). Changed outputs (:data:`OUTPUTS`: results,
    plots, the results page) do not count: a study run after another has rewritten them is
    still made by the committed code."""
    import subprocess

    import fedsim

    repo = Path(__file__).resolve().parents[1]
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
