"""Privacy-accounting benchmark: fedsim's pld accountant next to its peers (run by hand).

    python benchmarks/accounting.py [--quick] [--out benchmarks/results/accounting.json]
    python benchmarks/accounting.py --only ledger_spends [--old-commit REV]

``--only ledger_spends`` measures only the ledger case of issue 18 (plan + can_spend + spend
with sigma changing every step, 10^4 and 10^5 spends) and merges it into the results file;
``--old-commit`` also runs the same case, at smaller sizes, on the fedsim of an older commit
(extracted with ``git archive``) for a side-by-side row.

Cases (issue 2): DRS run B (Poisson, q = 256/60000, sigma = 1.1, T = 14063); the same for
T = 10^5; a 10^4-step ledger whose sigma changes every step; 1000 client ledgers; and the
full accuracy grid (q in {0.001, 0.01, 0.05}, sigma in {0.6, 1, 2, 4}, T in {100, 1000, 10000},
both schemes) against dp_accounting at an 8x finer grid. Peers run in the same process:
Google's dp_accounting PLD used directly (value discretisation 1e-4, connect-the-dots) and
Opacus' PRV accountant (eps_error 0.01). Each entry records seconds and eps. Poisson only for
the peers: neither analyses fixed-size batches with replace-one neighbours as C_q(G)^{(x)T}.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

# FEDSIM_BENCH_TREE: run against another fedsim tree (the --old-commit side-by-side rows).
sys.path.insert(0, os.environ.get("FEDSIM_BENCH_TREE", str(Path(__file__).resolve().parents[1])))

import _common  # noqa: E402, F401 - checks that this fedsim is the one measured
from dp_accounting.pld import pld_pmf, privacy_loss_mechanism  # noqa: E402
from dp_accounting.pld import privacy_loss_distribution as dp_pld  # noqa: E402

from fedsim.privacy import pld as fedsim_pld  # noqa: E402
from fedsim.privacy.events import GaussianStep  # noqa: E402
from fedsim.privacy.ledger import Budget, PrivacyLedger  # noqa: E402
from fedsim.privacy.pld import PLDAccountant  # noqa: E402

DELTA = 1e-5
Q_B = 256 / 60000


def timed(fn: Callable[[], float]) -> dict[str, float]:
    start = time.perf_counter()
    eps = fn()
    return {"seconds": round(time.perf_counter() - start, 4), "epsilon": float(eps)}


def clear_caches() -> None:
    """Forget every cached one-step PMF, composition and answer (a cold start)."""
    for name in ("step_pmfs", "factor_summaries", "factor_spectrum"):
        if hasattr(fedsim_pld, name):
            getattr(fedsim_pld, name).cache_clear()
    for name in ("_COMPOSED", "_EPSILONS"):  # the older tree has _COMPOSED
        if hasattr(fedsim_pld, name):
            getattr(fedsim_pld, name).clear()


def fedsim_eps(steps: list[GaussianStep], **settings: Any) -> float:
    clear_caches()
    return PLDAccountant(steps, **settings).epsilon(DELTA)


def dp_accounting_eps(sigma: float, q: float, count: int, h: float = 1e-4) -> float:
    pld = dp_pld.from_gaussian_mechanism(sigma, sampling_prob=q, value_discretization_interval=h)
    return pld.self_compose(count).get_epsilon_for_delta(DELTA)


def dp_accounting_heterogeneous(history: list[tuple[float, float]], h: float = 1e-3) -> float:
    composed = None
    for sigma, q in history:
        one = dp_pld.from_gaussian_mechanism(
            sigma, sampling_prob=q, value_discretization_interval=h
        )
        composed = one if composed is None else composed.compose(one)
    return composed.get_epsilon_for_delta(DELTA)


def opacus_eps(history: list[tuple[float, float, int]]) -> float:
    from opacus.accountants import PRVAccountant

    accountant = PRVAccountant()
    accountant.history = list(history)
    return accountant.get_epsilon(delta=DELTA, eps_error=0.01)


def homogeneous_case(sigma: float, q: float, count: int) -> dict[str, Any]:
    step = GaussianStep("poisson", q, sigma, count)
    return {
        "mechanism": {"sampling": "poisson", "q": q, "sigma": sigma, "steps": count},
        "fedsim_pld": timed(lambda: fedsim_eps([step])),
        "dp_accounting_pld_1e-4": timed(lambda: dp_accounting_eps(sigma, q, count)),
        "opacus_prv": timed(lambda: opacus_eps([(sigma, q, count)])),
    }


def changing_sigma_case(count: int, peer_prefix: int) -> dict[str, Any]:
    sigmas = 1.5 * (0.8 / 1.5) ** (np.arange(count) / count)
    steps = [GaussianStep("poisson", Q_B, float(s)) for s in sigmas]
    fast = timed(lambda: fedsim_eps(steps))
    clear_caches()
    h = PLDAccountant(steps).discretisation()
    exact = timed(lambda: fedsim_eps(steps, bucket_above=10**9, value_discretization=h / 4))
    # The peers compose distinct steps one by one (minutes per few hundred steps here), so
    # they run on a prefix; fedsim runs the same prefix for comparison.
    prefix = [(float(s), Q_B) for s in sigmas[:peer_prefix]]
    prefix_steps = steps[:peer_prefix]
    return {
        "mechanism": {
            "sampling": "poisson",
            "q": Q_B,
            "steps": count,
            "sigma": "1.5 * (0.8/1.5)^(t/T), a different value every step",
        },
        "fedsim_pld": fast,
        "fedsim_pld_exact_reference": {**exact, "note": "no bucketing, grid h/4"},
        "relative_error_vs_exact": fast["epsilon"] / exact["epsilon"] - 1.0,
        f"opacus_prv_first_{peer_prefix}_steps": timed(
            lambda: opacus_eps([(sigma, q, 1) for sigma, q in prefix])),
        f"dp_accounting_pld_1e-3_first_{peer_prefix}_steps": timed(
            lambda: dp_accounting_heterogeneous(prefix)),
        f"fedsim_pld_first_{peer_prefix}_steps": timed(lambda: fedsim_eps(prefix_steps)),
    }


def client_ledgers_case(clients: int, rounds: int, directory: Path) -> dict[str, Any]:
    """Every client checks and spends one step per round, as the runtime does."""
    rng = np.random.default_rng(0)
    configs = [
        (float(q), float(s))
        for q, s in zip(
            rng.choice([0.005, 0.01, 0.02], clients),
            rng.choice([0.8, 1.0, 1.2, 1.5], clients),
            strict=True,
        )
    ]
    clear_caches()
    start = time.perf_counter()
    spent, refused = [], 0
    for client, (q, sigma) in enumerate(configs):
        path = directory / f"client-{client}.jsonl"
        with PrivacyLedger.open(
            path, client_id=str(client), sampling="poisson", budget=Budget(3.0, DELTA)
        ) as ledger:
            step = GaussianStep("poisson", q, sigma)
            for r in range(rounds):
                if ledger.can_spend(step):
                    ledger.spend(step, time=float(r), round=r)
                else:
                    refused += 1
            spent.append(ledger.epsilon())
    fedsim_seconds = time.perf_counter() - start

    # The peers take seconds per client here, so they run on the first 100 clients only;
    # fedsim's mean over the same clients is given next to them.
    sample = configs[:100]

    def peers(fn: Callable[[float, float, int], float]) -> dict[str, float]:
        start = time.perf_counter()
        values = [fn(sigma, q, rounds) for q, sigma in sample]
        return {
            "clients": len(sample),
            "seconds": round(time.perf_counter() - start, 4),
            "mean_epsilon": float(np.mean(values)),
            "fedsim_mean_epsilon_same_clients": float(np.mean(spent[: len(sample)])),
        }

    return {
        "mechanism": {
            "clients": clients,
            "rounds": rounds,
            "budget_epsilon": 3.0,
            "q in": [0.005, 0.01, 0.02],
            "sigma in": [0.8, 1.0, 1.2, 1.5],
        },
        "fedsim_ledgers": {
            "seconds": round(fedsim_seconds, 4),
            "mean_epsilon": float(np.mean(spent)),
            "refused_releases": refused,
            "note": "can_spend + fsync'ed spend every round, eps at the end",
        },
        "dp_accounting_pld_1e-4_final_only": peers(dp_accounting_eps),
        "opacus_prv_final_only": peers(lambda s, q, n: opacus_eps([(s, q, n)])),
    }


def ledger_spends_case(count: int, directory: Path) -> dict[str, Any]:
    """One client ledger: plan ``count`` rounds whose sigma changes every round, then
    can_spend + spend each (fsync'ed), then eps; the time inside os.fsync is measured apart
    (it is the disk's, and the ledger fsyncs its records and then its high-water mark)."""
    sigmas = 1.5 * (0.8 / 1.5) ** (np.arange(count) / count)
    steps = [GaussianStep("poisson", Q_B, float(s)) for s in sigmas]
    clear_caches()
    real_fsync, fsync_time, fsyncs = os.fsync, [0.0], [0]

    def timed_fsync(fd: int) -> None:
        begin = time.perf_counter()
        real_fsync(fd)
        fsync_time[0] += time.perf_counter() - begin
        fsyncs[0] += 1

    os.fsync = timed_fsync
    try:
        start = time.perf_counter()
        with PrivacyLedger.open(directory / f"ledger-{count}.jsonl", client_id="c",
                                sampling="poisson", budget=Budget(1000.0, DELTA)) as ledger:
            ledger.plan([[s] for s in steps])
            planned = time.perf_counter()
            for r, step in enumerate(steps):
                if not ledger.can_spend([step]):
                    raise AssertionError("the plan fits the budget")
                ledger.spend([step], time=float(r), round=r)
            spent = time.perf_counter()
            eps = ledger.epsilon()
        total = time.perf_counter() - start
    finally:
        os.fsync = real_fsync
    clear_caches()
    begin = time.perf_counter()
    one_shot = PLDAccountant(steps).epsilon(DELTA)
    one_shot_seconds = time.perf_counter() - begin
    return {
        "spends": count,
        "seconds": round(total, 3),
        "plan_seconds": round(planned - start, 3),
        "spend_loop_seconds": round(spent - planned, 3),
        "fsync_seconds": round(fsync_time[0], 3),
        "fsyncs": fsyncs[0],
        "seconds_without_fsync": round(total - fsync_time[0], 3),
        "epsilon": eps,
        "one_shot_epsilon": one_shot,
        "one_shot_seconds": round(one_shot_seconds, 3),
        "relative_deviation_from_one_shot": eps / one_shot - 1.0,
    }


def ledger_spends(sizes: list[int], old_commit: str | None, old_sizes: list[int],
                  where: str | None) -> dict[str, Any]:
    out: dict[str, Any] = {
        "mechanism": {"sampling": "poisson", "q": Q_B, "budget_epsilon": 1000.0,
                      "sigma": "1.5 * (0.8/1.5)^(t/T), a different value every step",
                      "path": "plan(all rounds) + can_spend + spend per round + epsilon"},
        "goals": {"10^4 spends": "<= 5 s", "10^5 spends": "<= 60 s",
                  "eps": "within 0.5% of the one-shot composition, never below"},
    }
    out["ledger_directory"] = where or tempfile.gettempdir()
    with tempfile.TemporaryDirectory(dir=where) as directory:
        for count in sizes:
            out[f"new_{count}"] = ledger_spends_case(count, Path(directory))
            print(count, out[f"new_{count}"], flush=True)
    if old_commit is None:
        return out
    root = Path(__file__).resolve().parents[1]
    with tempfile.TemporaryDirectory() as tree:
        archive = subprocess.run(["git", "-C", str(root), "archive", old_commit, "fedsim"],
                                 check=True, capture_output=True).stdout
        subprocess.run(["tar", "-x", "-C", tree], input=archive, check=True)
        for count in old_sizes:
            for label in ("old", "new"):
                env = {**os.environ, "FEDSIM_BENCH_TREE": tree if label == "old" else str(root)}
                result = subprocess.run(
                    [sys.executable, __file__, "--case-ledger-spends", str(count),
                     *(["--ledger-dir", where] if where else [])], env=env,
                    check=True, capture_output=True, text=True)
                out[f"{label}_{count}"] = json.loads(result.stdout.splitlines()[-1])
                if label == "old":
                    out[f"old_{count}"]["commit"] = old_commit
                print(label, count, out[f"{label}_{count}"], flush=True)
    return out


def reference_eps(step: GaussianStep, h: float) -> float:
    """dp_accounting at grid h (fixed-size: its delta functions, max per step, its composition)."""
    if step.sampling == "poisson":
        return dp_accounting_eps(step.sigma, step.q, step.count, h)
    losses = [
        privacy_loss_mechanism.GaussianPrivacyLoss(
            step.sigma, sampling_prob=step.q, adjacency_type=a
        )
        for a in (
            privacy_loss_mechanism.AdjacencyType.REMOVE,
            privacy_loss_mechanism.AdjacencyType.ADD,
        )
    ]
    k = math.ceil(losses[0].connect_dots_bounds().epsilon_upper / h)
    grid = np.arange(-k, k + 1) * h
    deltas = np.maximum(*(loss.get_delta_for_epsilon(grid) for loss in losses))
    pmf = pld_pmf.create_pmf_pessimistic_connect_dots_fixed_gap(h, -k, k, deltas)
    return pmf.self_compose(step.count).get_epsilon_for_delta(DELTA)


def accuracy_grid(quick: bool) -> list[dict[str, Any]]:
    rows = []
    for sampling in ("poisson", "fixed"):
        for q in (0.001, 0.01, 0.05):
            for sigma in (0.6, 1.0, 2.0, 4.0):
                for count in (100, 10_000) if quick else (100, 1000, 10_000):
                    step = GaussianStep(sampling, q, sigma, count)
                    clear_caches()
                    start = time.perf_counter()
                    accountant = PLDAccountant([step])
                    ours = accountant.epsilon(DELTA)
                    seconds = time.perf_counter() - start
                    h = accountant.discretisation()
                    start = time.perf_counter()
                    ref = reference_eps(step, h / 8)
                    rows.append(
                        {
                            "sampling": sampling,
                            "q": q,
                            "sigma": sigma,
                            "steps": count,
                            "fedsim_epsilon": ours,
                            "fedsim_seconds": round(seconds, 4),
                            "fedsim_grid": h,
                            "reference_epsilon": ref,
                            "reference_seconds": round(time.perf_counter() - start, 4),
                            "relative_difference": ours / ref - 1.0,
                            "within_1_percent_and_not_lower": bool(
                                ref * (1 - 1e-9) <= ours <= ref * 1.01
                            ),
                        }
                    )
                    print(rows[-1], flush=True)
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="smaller cases (smoke run)")
    parser.add_argument("--out", default=str(Path(__file__).parent / "results" / "accounting.json"))
    parser.add_argument("--only", choices=["ledger_spends"], help="run one case and merge it")
    parser.add_argument("--old-commit", help="also run ledger_spends on this commit's fedsim")
    parser.add_argument("--ledger-dir", help="where ledger_spends writes (default: the temp "
                                               "dir); a RAM disk leaves out the disk's fsync")
    parser.add_argument("--sizes", type=int, nargs="*", help="ledger_spends sizes")
    parser.add_argument("--old-sizes", type=int, nargs="*", help="sizes for --old-commit")
    parser.add_argument("--case-ledger-spends", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.case_ledger_spends is not None:  # one case in a fresh process (side by side)
        with tempfile.TemporaryDirectory(dir=args.ledger_dir) as directory:
            print(json.dumps(ledger_spends_case(args.case_ledger_spends, Path(directory))))
        return
    if args.only == "ledger_spends":
        path = Path(args.out)
        results = json.loads(path.read_text()) if path.exists() else {}
        key = "ledger_spends_changing_sigma" + ("_ramdisk" if args.ledger_dir else "")
        results[key] = ledger_spends(
            args.sizes or ([1000] if args.quick else [10_000, 100_000]), args.old_commit,
            args.old_sizes or ([500] if args.quick else [1000, 2000]), args.ledger_dir)
        results[key]["machine"] = {
            "python": platform.python_version(), "platform": platform.platform(),
            "cpus": os.cpu_count(), "load_average_1min": os.getloadavg()[0]}
        path.write_text(json.dumps(results, indent=2) + "\n")
        print(f"wrote {path}")
        return

    results: dict[str, Any] = {
        "machine": {"python": platform.python_version(), "platform": platform.platform()},
        "delta": DELTA,
    }
    results["run_B"] = homogeneous_case(1.1, Q_B, 14063)
    print("run_B", results["run_B"], flush=True)
    results["T_1e5"] = homogeneous_case(1.1, Q_B, 10**3 if args.quick else 10**5)
    print("T_1e5", results["T_1e5"], flush=True)
    results["ledger_10k_changing_sigma"] = changing_sigma_case(
        1000 if args.quick else 10_000, 50 if args.quick else 200
    )
    print("ledger", results["ledger_10k_changing_sigma"], flush=True)
    with tempfile.TemporaryDirectory() as directory:
        results["client_ledgers_1000"] = client_ledgers_case(
            100 if args.quick else 1000, 20 if args.quick else 50, Path(directory)
        )
    print("clients", results["client_ledgers_1000"], flush=True)
    grid = accuracy_grid(args.quick)
    results["accuracy_grid"] = {
        "reference": "dp_accounting at the fedsim grid / 8 (see reference_eps)",
        "all_within_1_percent_and_not_lower": all(
            r["within_1_percent_and_not_lower"] for r in grid
        ),
        "max_relative_difference": max(r["relative_difference"] for r in grid),
        "cases": grid,
    }
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(results, indent=2) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
