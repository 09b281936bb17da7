"""van Dijk & Nguyen ("Considerations on the Theory of Training Models with Differential Privacy"): the asynchronous design with 100 heterogeneous clients.

Runs ``fedsim run scenarios/papers/vandijk_async.yaml`` per variant with ``--set`` overrides,
once per seed (``--seeds``, default 3: partition, sampling, noise, speeds and network draws all
change with the seed), and collects accuracy over virtual time and per-client eps (PLD,
delta = 1e-5). A row reports the mean over seeds, the per-seed values and their spread; a
comparison also says in how many seeds it holds (runs with the same seed share the partition,
so they pair up):

* ``poisson`` (the base): Poisson batches, add/remove neighbours, noise N(0, (C sigma)^2);
* ``fixed``: fixed-size batches, replace-one neighbours, noise N(0, (2 C sigma)^2) - at the
  SAME per-client eps, since every group's sigma is calibrated to eps = 2 for the scheme it
  runs (``noise: {kind: target}``), so the comparison isolates the factor 2 of van Dijk & Nguyen;
* ``no_staleness_wait``: clients never wait for a fresh global model;
* ``broadcast_every_4``: the server broadcasts every 4th window instead of every window;
* ``drop_10`` / ``drop_30``: 10 % / 30 % of messages lost on both links (a dropped update
  still costs its client one privacy event);
* ``batch_a2``: the batch-size thought experiment with a = 2: m -> 2 m, E -> 2 E (same number
  of rounds), sigma -> 2 sigma with sigma the base's calibrated value (``noise: {sigma: ...}``).
  Its mu is reported two ways: the asymptotic rule mu ~ sqrt(E m / N) / sigma of van Dijk & Nguyen
  sec. 2 (unchanged by a), and the Poisson GDP CLT q sqrt(T (e^{sigma^-2} - 1)) (Bu et al.
  2020), next to the PLD eps.

    python benchmarks/papers/vandijk_async.py                 # all variants, 3 seeds (CPU minutes)
    python benchmarks/papers/vandijk_async.py --variants poisson fixed --seeds 5
    python benchmarks/papers/vandijk_async.py --quick         # smoke run: 10 clients, 40 s

Writes benchmarks/results/papers/vandijk_async.json and docs/img/vandijk_async.png; the run
directories go to runs/papers/vandijk_async/VARIANT/seedN/ (not committed).
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
from statistics import mean, median, stdev
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from _common import provenance, pyplot  # first: this checkout's fedsim (see _common)

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
    ]


def thought_experiment(variant: Variant, scenario_path: Path, quick_overrides: Sequence[str],
                       base_groups: dict[str, dict[str, Any]]) -> Variant:
    """m -> a m and sigma -> a sigma per group, sigma being the base run's calibrated median;
    the number of rounds stays, which is E -> a E epochs (van Dijk & Nguyen sec. 2)."""
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
               "--no-plots", "--seed", str(seed)]
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
            # van Dijk & Nguyen sec. 2: mu ~ sqrt(E m / N) / sigma = q sqrt(T) / sigma for large sigma
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
        "mus": mus,
    }


def aggregate(variant: Variant, seeds: Sequence[int],
              results: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """One row and one curve for a variant from its per-seed results (in ``seeds`` order):
    accuracy as the mean over seeds with the per-seed values and their standard deviation,
    eps pooled over every client of every seed, the accuracy curve averaged over seeds on
    the evaluation times they share."""
    rows = [r["row"] for r in results]
    finals = [r["final_accuracy"] for r in rows]
    epsilons = [e for r in results for e in r["epsilons"]]
    mus = [m for r in results for m in r["mus"]]
    shared = min(len(r["curve"]["time"]) for r in results)
    curve = {
        "time": results[0]["curve"]["time"][:shared],
        "accuracy": [mean(r["curve"]["accuracy"][i] for r in results) for i in range(shared)],
    }
    row = {
        "variant": variant.name,
        "description": variant.description,
        "seeds": len(results),
        "final_accuracy": round(mean(finals), 4),
        "final_accuracy_sd": round(stdev(finals), 4) if len(finals) > 1 else None,
        "final_accuracy_per_seed": finals,
        "best_accuracy": round(mean(r["best_accuracy"] for r in rows), 4),
        "virtual_time": round(mean(r["virtual_time"] for r in rows), 1),
        "applied_updates": round(mean(r["applied_updates"] for r in rows), 1),
        "eps_min": round(min(epsilons), 4),
        "eps_median": round(median(epsilons), 4),
        "eps_max": round(max(epsilons), 4),
        "mu_clt_median": round(median(mus), 4),
    }
    # The thought experiment scales the base's sigmas: the first seed's group medians.
    return {"row": row, "curve": curve, "epsilons": epsilons, "groups": results[0]["groups"],
            "per_seed": dict(zip(map(str, seeds), finals, strict=True))}


def paper_claims(rows: dict[str, dict[str, Any]], base: dict[str, Any] | None,
                 thought: dict[str, Any] | None) -> list[dict[str, str]]:
    """van Dijk & Nguyen's claims next to what the runs show."""
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


def verdict(difference: float, spread: float, ahead: int, seeds: int) -> str:
    """The page's rule for a paired comparison over seeds: a finding only when the mean
    difference exceeds ``spread`` (the larger of the two seed standard deviations) and one
    side is ahead in every seed."""
    if seeds < 2:
        return "one seed: not a finding"
    if abs(difference) <= spread or ahead not in (0, seeds):
        return "within the seed spread: not a finding"
    return "holds in every seed, beyond the spread"


def findings(rows: dict[str, dict[str, Any]],
             per_seed: dict[str, dict[str, float]]) -> list[str]:
    """One line per comparison, generated from the rows: mean final accuracy (sd) over seeds,
    the mean difference, and in how many seeds the left setting is ahead (same seed, same
    partition and draws: a paired comparison)."""
    def acc(name: str) -> str:
        r = rows[name]
        sd = r.get("final_accuracy_sd")
        spread = f" +- {100 * sd:.1f}" if sd is not None else ""
        return f"{100 * r['final_accuracy']:.1f}{spread} %"

    pairs = [("poisson", "fixed", "Sampling at equal per-client eps: Poisson (noise C sigma)"),
             ("poisson", "no_staleness_wait", "Staleness wait on"),
             ("poisson", "broadcast_every_4", "Broadcast every window"),
             ("poisson", "drop_10", "No message loss"),
             ("poisson", "drop_30", "No message loss"),
             ("poisson", THOUGHT, "Thought experiment: base")]
    out = []
    for left, right, label in pairs:
        if left not in rows or right not in rows:
            continue
        difference = rows[left]["final_accuracy"] - rows[right]["final_accuracy"]
        line = (f"{label} {acc(left)} against {rows[right]['description']}: {acc(right)} "
                f"(difference {100 * difference:+.1f} points")
        common = sorted(set(per_seed.get(left, {})) & set(per_seed.get(right, {})))
        if common:
            ahead = sum(per_seed[left][k] > per_seed[right][k] for k in common)
            spread = max(rows[left].get("final_accuracy_sd") or 0.0,
                         rows[right].get("final_accuracy_sd") or 0.0)
            line += (f"; ahead in {ahead} of {len(common)} seeds; "
                     f"{verdict(difference, spread, ahead, len(common))}")
        out.append(f"{line}); median client eps {rows[left]['eps_median']:.3g} vs "
                   f"{rows[right]['eps_median']:.3g}.")
    base = rows.get("poisson")
    if base and base.get("final_accuracy_sd") is not None:
        out.append(f"Seed-to-seed standard deviation of the base: {100 * base['final_accuracy_sd']:.1f} "
                   "points; a difference of a similar size, or one that does not hold in every "
                   "seed, is not a finding.")
    return out


RELATION = {"poisson": "Poisson sampling: add/remove neighbours",
            "fixed": "fixed-size batches: replace-one neighbours"}
LINE_STYLES = ("-", "--", "-.", ":", (0, (5, 1)), (0, (3, 1, 1, 1)), (0, (1, 1)))


def sampling_of(curve: dict[str, Any]) -> str:
    """The variant's sampling scheme (every group of these scenarios uses the same one)."""
    schemes = {g.get("sampling", "poisson") for g in curve.get("groups", {}).values()}
    return schemes.pop() if len(schemes) == 1 else "mixed"


def plot(curves: dict[str, dict[str, Any]], epsilons: dict[str, list[float]],
         path: Path) -> None:
    """Accuracy of every variant, and per-client eps in one panel per neighbouring relation:
    eps under add/remove and under replace-one neighbours are not comparable, so they never
    share an axis (each variant is calibrated to the same eps under its own relation)."""
    plt = pyplot()

    relations: dict[str, list[str]] = {}
    for name in epsilons:
        relations.setdefault(sampling_of(curves.get(name, {})), []).append(name)
    order = sorted(relations, key=lambda r: (r != "poisson", r))
    widths = [2.2] + [max(0.9, 0.45 * len(relations[r])) for r in order]
    fig, axes = plt.subplots(1, 1 + len(order), figsize=(6.5 + 2.2 * sum(widths[1:]), 4.8),
                             gridspec_kw={"width_ratios": widths})
    left = axes[0]
    for index, (name, curve) in enumerate(curves.items()):
        left.plot(curve["time"], [100 * a for a in curve["accuracy"]], label=name,
                  linestyle=LINE_STYLES[index % len(LINE_STYLES)],
                  linewidth=2.6 - 1.4 * index / max(len(curves) - 1, 1))
    left.set_xlabel("virtual time (s)")
    left.set_ylabel("test accuracy (%)")
    left.set_title("accuracy over virtual time (mean over seeds)", fontsize=10)
    left.legend(fontsize=8, loc="upper center", bbox_to_anchor=(0.5, -0.14), ncol=4,
                frameon=False)
    for panel, relation in zip(axes[1:], order, strict=True):
        names = relations[relation]
        panel.boxplot([epsilons[n] for n in names], tick_labels=names)
        panel.set_ylabel("per-client eps (PLD, delta = 1e-5)")
        panel.set_title(RELATION.get(relation, relation).replace(": ", ":\n"), fontsize=9)
        panel.tick_params(axis="x", rotation=30)
        panel.set_ylim(bottom=0.0)
    fig.suptitle("per-client eps: one panel per neighbouring relation (not comparable across "
                 "panels)", x=0.66, fontsize=9)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110, metadata={"Software": None})
    plt.close(fig)


QUICK = ("stop.virtual_seconds=40", "clients.groups[0].count=3", "clients.groups[1].count=4",
         "clients.groups[2].count=3", "clients.groups[0].rounds=5", "clients.groups[1].rounds=5",
         "clients.groups[2].rounds=5", "dataset.test_subset=500")


def main(argv: Sequence[str] | None = None) -> int:  # noqa: C901, PLR0915 - the benchmark's steps in the order they run
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--variants", nargs="*", default=None, help="default: all")
    parser.add_argument("--quick", action="store_true", help="smoke run: 10 clients, 5 rounds")
    parser.add_argument("--collect-only", action="store_true",
                        help="rebuild the JSON and plot from the existing run directories")
    parser.add_argument("--scenario", type=Path, default=SCENARIO)
    parser.add_argument("--seed", type=int, default=0, help="the first seed")
    parser.add_argument("--seeds", type=int, default=3, help="runs per variant (seeds from --seed)")
    parser.add_argument("--runs", type=Path, default=RUNS)
    parser.add_argument("--results", type=Path, default=RESULTS)
    parser.add_argument("--plot", type=Path, default=PLOT)
    parser.add_argument("--plot-only", action="store_true",
                        help="redraw the plot from the results file, run nothing")
    args = parser.parse_args(argv)
    if args.seeds < 1:
        parser.error("--seeds must be >= 1")
    quick = QUICK if args.quick else ()
    chosen = variants(args.scenario, quick)
    if args.variants:
        unknown = set(args.variants) - {v.name for v in chosen}
        if unknown:
            parser.error(f"unknown variants {sorted(unknown)}; known: {[v.name for v in chosen]}")
        chosen = [v for v in chosen if v.name in args.variants]
    out = args.results / "vandijk_async.json"
    document = json.loads(out.read_text()) if out.is_file() else {"rows": []}
    if args.plot_only:
        plot(document.get("curves", {}),
             {n: c["epsilons"] for n, c in document.get("curves", {}).items()}, args.plot)
        return 0
    # rows of single-seed runs (an older format) are not comparable: drop them
    rows = {r["variant"]: r for r in document.get("rows", []) if "seeds" in r}
    curves = {n: c for n, c in document.get("curves", {}).items() if n in rows}
    seeds = list(range(args.seed, args.seed + args.seeds))
    for variant in chosen:
        if variant.name == THOUGHT:
            if "poisson" not in curves:
                parser.error(f"{THOUGHT} needs the poisson (base) run first")
            variant = thought_experiment(variant, args.scenario, quick, curves["poisson"]["groups"])
        results, done = [], []
        for seed in seeds:
            run_dir = args.runs / variant.name / f"seed{seed}"
            if not args.collect_only:
                run_variant(variant, scenario=args.scenario, quick=quick, out=run_dir, seed=seed)
            elif not (run_dir / "summary.json").is_file():
                continue
            results.append(collect(variant, run_dir))
            done.append(seed)
        if not results:
            continue
        result = aggregate(variant, done, results)
        rows[variant.name] = result["row"] | {"quick": args.quick}
        curves[variant.name] = {**result["curve"], "epsilons": result["epsilons"],
                                "groups": result["groups"], "per_seed": result["per_seed"]}
    order = [v.name for v in variants(args.scenario, quick)]
    document["rows"] = [rows[n] for n in order if n in rows]
    document["curves"] = {n: curves[n] for n in order if n in curves}
    base, thought = curves.get("poisson"), curves.get(THOUGHT)
    document["comparison"] = paper_claims(rows, base, thought)
    document["command"] = "python benchmarks/papers/vandijk_async.py"
    document["commit"] = provenance()
    document["plot"] = "docs/img/vandijk_async.png"
    document["notes"] = [
        "Every row is `fedsim run scenarios/papers/vandijk_async.yaml --set ...` once per seed (100 "
        "clients in 3 groups of different speed and batch size, Dirichlet(1) label skew, MLP "
        "784-64-10). Every group's sigma is calibrated (noise kind target) so that its smallest "
        "client spends exactly eps = 2 at delta = 1e-5 in its 40 rounds under the scheme it "
        "runs; clients with more data (smaller q) spend less, the same in every variant. eps "
        "columns are the PLD guarantee each client's ledger reports.",
        f"Thought experiment (a = {THOUGHT_EXPERIMENT_FACTOR}): per group, mu by the asymptotic "
        "rule q sqrt(T) / sigma, by the Poisson GDP CLT, and the PLD eps, before -> after.",
    ]
    document["notes"] += findings(rows, {n: c.get("per_seed", {}) for n, c in curves.items()})
    args.results.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(document, indent=1) + "\n")
    plot({n: c for n, c in document["curves"].items()},
         {n: c["epsilons"] for n, c in document["curves"].items()}, args.plot)
    for row in document["rows"]:
        print(json.dumps(row))
    return 0


if __name__ == "__main__":
    sys.exit(main())
