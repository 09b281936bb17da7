"""van Dijk et al. (paper 000): the asynchronous design with 100 heterogeneous clients.

Runs ``fedsim run scenarios/papers/vandijk_async.yaml`` once per variant with ``--set``
overrides and collects accuracy over virtual time and per-client eps (PLD, delta = 1e-5):

* ``poisson`` (the base): Poisson batches, add/remove neighbours, noise N(0, (C sigma)^2);
* ``fixed``: fixed-size batches, replace-one neighbours, noise N(0, (2 C sigma)^2) - at the
  SAME per-client eps, since every group's sigma is calibrated to eps = 2 for the scheme it
  runs (``noise: {kind: target}``), so the comparison isolates the factor 2 of paper 000;
* ``no_staleness_wait``: clients never wait for a fresh global model;
* ``broadcast_every_4``: the server broadcasts every 4th window instead of every window;
* ``drop_10`` / ``drop_30``: 10 % / 30 % of messages lost on both links (a dropped update
  still costs its client one privacy event);
* ``batch_a2``: the batch-size thought experiment with a = 2: m -> 2 m, E -> 2 E (same number
  of rounds), sigma -> 2 sigma with sigma the base's calibrated value (``noise: {sigma: ...}``).
  Its mu is reported two ways: the asymptotic rule mu ~ sqrt(E m / N) / sigma of paper 000
  sec. 2 (unchanged by a), and the Poisson GDP CLT q sqrt(T (e^{sigma^-2} - 1)) (Bu et al.
  2020), next to the PLD eps.

    python benchmarks/papers/vandijk_async.py                 # all variants (CPU minutes)
    python benchmarks/papers/vandijk_async.py --variants poisson fixed
    python benchmarks/papers/vandijk_async.py --quick         # smoke run: 10 clients, 40 s

Writes benchmarks/results/papers/vandijk_async.json and docs/img/vandijk_async.png; the run
directories go to runs/papers/vandijk_async/ (not committed).
"""

from __future__ import annotations

import argparse
import csv
import json
import math
import shutil
import subprocess
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from statistics import median
from typing import Any

from fedsim.config import load_scenario

REPO = Path(__file__).resolve().parents[2]
SCENARIO = REPO / "scenarios" / "papers" / "vandijk_async.yaml"
RESULTS = REPO / "benchmarks" / "results" / "papers"
RUNS = REPO / "runs" / "papers" / "vandijk_async"
PLOT = REPO / "docs" / "img" / "vandijk_async.png"
THOUGHT_EXPERIMENT_FACTOR = 2


@dataclass(frozen=True)
class Variant:
    name: str
    description: str
    overrides: tuple[str, ...]


def _each_group(count: int, setting: str) -> tuple[str, ...]:
    return tuple(f"clients.groups[{i}].{setting}" for i in range(count))


THOUGHT = f"batch_a{THOUGHT_EXPERIMENT_FACTOR}"


def variants(scenario_path: Path, quick_overrides: Sequence[str]) -> list[Variant]:
    """The comparisons, as --set overrides of the base scenario (the thought experiment's
    overrides need the base run's sigmas: :func:`thought_experiment`)."""
    n = len(load_scenario(scenario_path, list(quick_overrides)).scenario.clients.groups)
    return [
        Variant("poisson", "Poisson batches, noise C sigma (base)", ()),
        Variant("fixed", "fixed-size batches, noise 2 C sigma, same eps",
                tuple(f"{s}=fixed" for s in _each_group(n, "sampling"))),
        Variant("no_staleness_wait", "no staleness wait",
                tuple(f"{s}={{}}" for s in _each_group(n, "staleness"))),
        Variant("broadcast_every_4", "broadcast every 4 windows", ("server.broadcast_every=4",)),
        Variant("drop_10", "10 % messages dropped",
                ("network.uplink.drop=0.1", "network.downlink.drop=0.1")),
        Variant("drop_30", "30 % messages dropped",
                ("network.uplink.drop=0.3", "network.downlink.drop=0.3")),
        Variant(THOUGHT, f"m x{THOUGHT_EXPERIMENT_FACTOR}, E x{THOUGHT_EXPERIMENT_FACTOR}, "
                f"sigma x{THOUGHT_EXPERIMENT_FACTOR}", ()),
        # the same two settings with another seed: the seed-to-seed spread of one run
        Variant("poisson_seed1", "Poisson (base), seed 1", ("seed=1",)),
        Variant("fixed_seed1", "fixed-size, seed 1",
                (*(f"{s}=fixed" for s in _each_group(n, "sampling")), "seed=1")),
    ]


def thought_experiment(variant: Variant, scenario_path: Path, quick_overrides: Sequence[str],
                       base_groups: dict[str, dict[str, Any]]) -> Variant:
    """m -> a m and sigma -> a sigma per group, sigma being the base run's calibrated median;
    the number of rounds stays, which is E -> a E epochs (paper 000 sec. 2)."""
    a = THOUGHT_EXPERIMENT_FACTOR
    groups = load_scenario(scenario_path, list(quick_overrides)).scenario.clients.groups
    overrides: list[str] = []
    for i, group in enumerate(groups):
        sigma = base_groups[group.name]["sigma"]
        overrides += [f"clients.groups[{i}].batch_size={a * group.batch_size}",
                      f"clients.groups[{i}].noise={{sigma: {a * sigma:.6f}}}"]
    return Variant(variant.name, variant.description, tuple(overrides))


def run_variant(variant: Variant, *, scenario: Path, quick: Sequence[str], out: Path,
                seed: int) -> Path:
    if out.exists():
        shutil.rmtree(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    command = [sys.executable, "-m", "fedsim", "run", str(scenario), "--out", str(out),
               "--no-plots"]
    if not any(o.startswith("seed=") for o in variant.overrides):
        command += ["--seed", str(seed)]
    for assignment in (*quick, *variant.overrides):
        command += ["--set", assignment]
    print(" ".join(command[1:]), flush=True)
    subprocess.run(command, check=True, cwd=REPO)
    return out


def collect(variant: Variant, run_dir: Path) -> dict[str, Any]:
    summary = json.loads((run_dir / "summary.json").read_text())
    metrics = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()
               if line.strip()]
    curve = [(m["time"], m["accuracy"]) for m in metrics if m.get("accuracy") is not None]
    with open(run_dir / "clients.csv", encoding="utf-8") as handle:
        clients = list(csv.DictReader(handle))
    epsilons = [float(c["epsilon"]) for c in clients]
    mus = [float(c["mu_clt"]) for c in clients]
    by_group: dict[str, list[dict[str, str]]] = {}
    for c in clients:
        by_group.setdefault(c["group"], []).append(c)
    groups = {}
    for name, members in by_group.items():
        first = members[0]
        q = median(float(c["q"]) for c in members)
        sigma = median(float(c["sigma"]) for c in members)
        rounds = median(int(c["rounds"]) for c in members)
        groups[name] = {
            "batch_size": int(first["batch_size"]), "sampling": first["sampling"],
            "sigma": sigma, "q_median": round(q, 5), "rounds_median": rounds,
            "eps_median": round(median(float(c["epsilon"]) for c in members), 4),
            "mu_clt_median": round(median(float(c["mu_clt"]) for c in members), 4),
            # paper 000 sec. 2: mu ~ sqrt(E m / N) / sigma = q sqrt(T) / sigma for large sigma
            "mu_asymptotic": round(q * math.sqrt(rounds) / sigma, 4),
        }
    return {
        "row": {
            "variant": variant.name,
            "description": variant.description,
            "final_accuracy": summary["final_accuracy"],
            "best_accuracy": summary["best_accuracy"],
            "virtual_time": summary["virtual_time"],
            "windows": summary["windows"],
            "applied_updates": summary["updates"]["applied"],
            "eps_min": round(min(epsilons), 4),
            "eps_median": round(median(epsilons), 4),
            "eps_max": round(max(epsilons), 4),
            "mu_clt_median": round(median(mus), 4),
        },
        "groups": groups,
        "curve": {"time": [t for t, _ in curve], "accuracy": [a for _, a in curve]},
        "epsilons": epsilons,
    }


def paper_claims(rows: dict[str, dict[str, Any]], base: dict[str, Any] | None,
                 thought: dict[str, Any] | None) -> list[dict[str, str]]:
    """Paper 000's claims next to what the runs show."""
    claims = []
    if "poisson" in rows and "fixed" in rows:
        claims.append({
            "claim": "Poisson vs fixed-size batches at equal eps",
            "paper": "Poisson needs noise C sigma, fixed size 2 C sigma: Poisson trains better",
            "ours": f"final accuracy {100 * rows['poisson']['final_accuracy']:.1f} % vs "
                    f"{100 * rows['fixed']['final_accuracy']:.1f} %"})
    if base and thought:
        for group, before in base["groups"].items():
            after = thought["groups"][group]
            claims.append({
                "claim": f"m, E, sigma x{THOUGHT_EXPERIMENT_FACTOR}: mu of group {group}",
                "paper": "unchanged for large sigma, N, E (mu ~ sqrt(E m / N) / sigma)",
                "ours": f"asymptotic {before['mu_asymptotic']:.3g} -> {after['mu_asymptotic']:.3g}; "
                        f"CLT {before['mu_clt_median']:.3g} -> {after['mu_clt_median']:.3g}; "
                        f"PLD eps {before['eps_median']:.3g} -> {after['eps_median']:.3g} "
                        f"(sigma {before['sigma']:.3g} -> {after['sigma']:.3g})"})
    if all(k in rows for k in ("poisson", "drop_10", "drop_30")):
        claims.append({
            "claim": "message loss 0 / 10 / 30 %",
            "paper": "tolerated; a dropped update still costs its client privacy",
            "ours": " / ".join(f"{100 * rows[k]['final_accuracy']:.1f} %"
                               for k in ("poisson", "drop_10", "drop_30"))
                    + "; median eps " + " / ".join(f"{rows[k]['eps_median']:.3g}"
                                                    for k in ("poisson", "drop_10", "drop_30"))})
    return claims


def findings(rows: dict[str, dict[str, Any]]) -> list[str]:
    """One line per comparison, generated from the rows (final / best accuracy in %)."""
    def acc(name: str) -> str:
        r = rows[name]
        return f"{100 * r['final_accuracy']:.1f} % (best {100 * r['best_accuracy']:.1f} %)"

    pairs = [("poisson", "fixed", "Sampling at equal per-client eps: Poisson (noise C sigma)"),
             ("poisson_seed1", "fixed_seed1", "The same with seed 1: Poisson"),
             ("poisson", "poisson_seed1", "Seed-to-seed spread of one run: base seed 0"),
             ("poisson", "no_staleness_wait", "Staleness wait on"),
             ("poisson", "broadcast_every_4", "Broadcast every window"),
             ("poisson", "drop_10", "No message loss"),
             ("poisson", "drop_30", "No message loss"),
             ("poisson", THOUGHT, "Thought experiment: base")]
    out = []
    for left, right, label in pairs:
        if left in rows and right in rows:
            out.append(f"{label} {acc(left)} against {rows[right]['description']}: {acc(right)}; "
                       f"median client eps {rows[left]['eps_median']:.3g} vs "
                       f"{rows[right]['eps_median']:.3g}.")
    if "poisson" in rows and "poisson_seed1" in rows:
        spread = 100 * abs(rows["poisson"]["final_accuracy"] - rows["poisson_seed1"]["final_accuracy"])
        line = (f"One run per setting: the base moves {spread:.1f} points between seeds, so "
                "differences of that size are not significant")
        if "fixed" in rows and "fixed_seed1" in rows:
            holds = all(rows[p]["final_accuracy"] > rows[f]["final_accuracy"]
                        for p, f in (("poisson", "fixed"), ("poisson_seed1", "fixed_seed1")))
            line += ("; Poisson beats fixed-size batches with both seeds" if holds
                     else "; Poisson does not beat fixed-size batches with both seeds")
        out.append(line + ".")
    return out


def plot(curves: dict[str, dict[str, list[float]]], epsilons: dict[str, list[float]],
         path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (left, right) = plt.subplots(1, 2, figsize=(12, 4.5))
    for name, curve in curves.items():
        left.plot(curve["time"], [100 * a for a in curve["accuracy"]], label=name)
    left.set_xlabel("virtual time (s)")
    left.set_ylabel("test accuracy (%)")
    left.set_title("accuracy over virtual time")
    left.legend(fontsize=8)
    names = list(epsilons)
    right.boxplot([epsilons[n] for n in names], tick_labels=names)
    right.set_ylabel("per-client eps (PLD, delta = 1e-5)")
    right.set_title("per-client privacy spent")
    right.tick_params(axis="x", rotation=30)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)


QUICK = ("stop.virtual_seconds=40", "clients.groups[0].count=3", "clients.groups[1].count=4",
         "clients.groups[2].count=3", "clients.groups[0].rounds=5", "clients.groups[1].rounds=5",
         "clients.groups[2].rounds=5", "dataset.test_subset=500")


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--variants", nargs="*", default=None, help="default: all")
    parser.add_argument("--quick", action="store_true", help="smoke run: 10 clients, 5 rounds")
    parser.add_argument("--collect-only", action="store_true",
                        help="rebuild the JSON and plot from the existing run directories")
    parser.add_argument("--scenario", type=Path, default=SCENARIO)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--runs", type=Path, default=RUNS)
    parser.add_argument("--results", type=Path, default=RESULTS)
    parser.add_argument("--plot", type=Path, default=PLOT)
    args = parser.parse_args(argv)
    quick = QUICK if args.quick else ()
    chosen = variants(args.scenario, quick)
    if args.variants:
        unknown = set(args.variants) - {v.name for v in chosen}
        if unknown:
            parser.error(f"unknown variants {sorted(unknown)}; known: {[v.name for v in chosen]}")
        chosen = [v for v in chosen if v.name in args.variants]
    out = args.results / "vandijk_async.json"
    document = json.loads(out.read_text()) if out.is_file() else {"rows": []}
    rows = {r["variant"]: r for r in document.get("rows", [])}
    curves = document.get("curves", {})
    for variant in chosen:
        if variant.name == THOUGHT:
            if "poisson" not in curves:
                parser.error(f"{THOUGHT} needs the poisson (base) run first")
            variant = thought_experiment(variant, args.scenario, quick, curves["poisson"]["groups"])
        run_dir = args.runs / variant.name
        if not args.collect_only:
            run_variant(variant, scenario=args.scenario, quick=quick, out=run_dir, seed=args.seed)
        elif not (run_dir / "summary.json").is_file():
            continue
        result = collect(variant, run_dir)
        rows[variant.name] = result["row"] | {"quick": args.quick}
        curves[variant.name] = {**result["curve"], "epsilons": result["epsilons"],
                                "groups": result["groups"]}
    order = [v.name for v in variants(args.scenario, quick)]
    document["rows"] = [rows[n] for n in order if n in rows]
    document["curves"] = {n: curves[n] for n in order if n in curves}
    base, thought = curves.get("poisson"), curves.get(THOUGHT)
    document["comparison"] = paper_claims(rows, base, thought)
    document["command"] = "python benchmarks/papers/vandijk_async.py"
    document["plot"] = "docs/img/vandijk_async.png"
    document["notes"] = [
        "Every row is one `fedsim run scenarios/papers/vandijk_async.yaml --set ...` (100 "
        "clients in 3 groups of different speed and batch size, Dirichlet(1) label skew, MLP "
        "784-64-10). Every group's sigma is calibrated (noise kind target) so that its smallest "
        "client spends exactly eps = 2 at delta = 1e-5 in its 40 rounds under the scheme it "
        "runs; clients with more data (smaller q) spend less, the same in every variant. eps "
        "columns are the PLD guarantee each client's ledger reports.",
        f"Thought experiment (a = {THOUGHT_EXPERIMENT_FACTOR}): per group, mu by the asymptotic "
        "rule q sqrt(T) / sigma, by the Poisson GDP CLT, and the PLD eps, before -> after.",
    ]
    document["notes"] += findings(rows)
    args.results.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(document, indent=1) + "\n")
    plot({n: c for n, c in document["curves"].items()},
         {n: c["epsilons"] for n, c in document["curves"].items()}, args.plot)
    for row in document["rows"]:
        print(json.dumps(row))
    return 0


if __name__ == "__main__":
    sys.exit(main())
