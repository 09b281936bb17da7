"""Cost of PrivacyLedger.can_spend (issue 24 item 1) and of unplanned spending with a drifting
sigma (issue 23 part 3), this tree against an older commit (run by hand).

    python benchmarks/ledger_checks.py [--old-commit REV] [--out benchmarks/results/ledger_checks.json]

Rows, per tree: ``typical``: a client at a constant posture (Poisson q = 0.01, sigma = 1.0, two
local steps a round, budget eps 8 at delta 1e-5) with 1000 rounds recorded, then 1000 more
rounds of can_spend + spend; the can_spend calls are timed apart and pld eps evaluations are
counted. ``drifting_N``: N unplanned rounds whose sigma changes every round (the schedule of
benchmarks/accounting.py's ledger case), budget eps 1000; seconds without fsync and pld
evaluations. The older tree runs in a subprocess from ``git archive``.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, os.environ.get("FEDSIM_BENCH_TREE", str(Path(__file__).resolve().parents[1])))

import _common  # noqa: E402, F401 - checks that this fedsim is the one measured

from fedsim.privacy.events import GaussianStep  # noqa: E402
from fedsim.privacy.ledger import Budget, PrivacyLedger  # noqa: E402
from fedsim.privacy.pld import PLDAccountant  # noqa: E402

DELTA = 1e-5
ROOT = Path(__file__).resolve().parents[1]


class Counter:
    def __init__(self) -> None:
        self.evaluations = 0
        self.fsync_seconds = 0.0
        real_eps, real_fsync = PLDAccountant.epsilon, os.fsync

        def eps(accountant: PLDAccountant, delta: float) -> float:
            self.evaluations += 1
            return real_eps(accountant, delta)

        def fsync(fd: int) -> None:
            begin = time.perf_counter()
            real_fsync(fd)
            self.fsync_seconds += time.perf_counter() - begin

        PLDAccountant.epsilon = eps  # type: ignore[method-assign]
        os.fsync = fsync


def typical(directory: Path) -> dict[str, Any]:
    step = GaussianStep("poisson", 0.01, 1.0, 2)
    counter = Counter()
    path = directory / "typical.jsonl"
    with PrivacyLedger.open(path, client_id="c", sampling="poisson",
                            budget=Budget(8.0, DELTA)) as ledger:
        for r in range(1000):
            ledger.spend(step, time=float(r), round=r)
    with PrivacyLedger.open(path, client_id="c", sampling="poisson",
                            budget=Budget(8.0, DELTA)) as ledger:
        counter.evaluations, checks = 0, 0.0
        for r in range(1000, 2000):
            begin = time.perf_counter()
            allowed = ledger.can_spend(step)
            checks += time.perf_counter() - begin
            assert allowed
            ledger.spend(step, time=float(r), round=r)
        return {"rounds_recorded_before": 1000, "checks": 1000,
                "can_spend_us_per_call": round(checks / 1000 * 1e6, 1),
                "pld_evaluations": counter.evaluations}


def drifting(count: int, directory: Path) -> dict[str, Any]:
    sigmas = [1.5 * (0.8 / 1.5) ** (t / count) for t in range(count)]
    counter = Counter()
    begin = time.perf_counter()
    with PrivacyLedger.open(directory / f"drift-{count}.jsonl", client_id="c",
                            sampling="poisson", budget=Budget(1000.0, DELTA)) as ledger:
        for r, sigma in enumerate(sigmas):
            step = GaussianStep("poisson", 256 / 60000, sigma)
            assert ledger.can_spend(step)
            ledger.spend(step, time=float(r), round=r)
        eps = ledger.epsilon()
    total = time.perf_counter() - begin
    return {"spends": count, "seconds_without_fsync": round(total - counter.fsync_seconds, 2),
            "fsync_seconds": round(counter.fsync_seconds, 2),
            "pld_evaluations": counter.evaluations, "epsilon": eps}


def measure(drifts: list[int]) -> dict[str, Any]:
    with tempfile.TemporaryDirectory() as where:
        out: dict[str, Any] = {"typical": typical(Path(where))}
        for count in drifts:
            out[f"drifting_{count}"] = drifting(count, Path(where))
    return out


def commit_of(rev: str) -> str:
    return subprocess.run(["git", "-C", str(ROOT), "rev-parse", rev], check=True,
                          capture_output=True, text=True).stdout.strip()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--old-commit")
    parser.add_argument("--drifts", default="1000,3000,10000")
    parser.add_argument("--old-drifts", default="1000,3000")
    parser.add_argument("--out", default=str(ROOT / "benchmarks/results/ledger_checks.json"))
    parser.add_argument("--case", help=argparse.SUPPRESS)  # child: print one tree's JSON
    args = parser.parse_args()
    if args.case is not None:
        print(json.dumps(measure([int(n) for n in args.case.split(",") if n])))
        return
    results: dict[str, Any] = {"commit": commit_of("HEAD"), "delta": DELTA,
                               "new": measure([int(n) for n in args.drifts.split(",")])}
    if args.old_commit:
        with tempfile.TemporaryDirectory() as tree:
            archive = subprocess.run(["git", "-C", str(ROOT), "archive", args.old_commit,
                                      "fedsim"], check=True, capture_output=True).stdout
            subprocess.run(["tar", "-x", "-C", tree], input=archive, check=True)
            child = subprocess.run([sys.executable, __file__, "--case", args.old_drifts],
                                   env={**os.environ, "FEDSIM_BENCH_TREE": tree}, check=True,
                                   capture_output=True, text=True)
        results["old"] = {"commit": commit_of(args.old_commit),
                          **json.loads(child.stdout.splitlines()[-1])}
    Path(args.out).write_text(json.dumps(results, indent=2) + "\n")
    print(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
