"""Asynchronous aggregation policies and the interrupt rule on one heterogeneous population.

Runs ``fedsim run scenarios/papers/async_study.yaml`` per variant with ``--set`` overrides, once
per seed (``--seeds``, default 3), every client at the same per-client eps (2 at delta = 1e-5,
its noise calibrated for its fixed number of rounds), and collects held-out accuracy against
virtual time:

* ``windows`` (the base): van Dijk & Nguyen's time windows, interrupt rule ``switch``;
* ``snapshot``: the same with interrupt rule ``snapshot`` (every gradient of a round at the w
  it began on);
* ``fedbuff``: FedBuff, a buffer of K = 5 updates, polynomial staleness weighting a = 0.5;
* ``fedasync``: FedAsync, alpha = 0.6, polynomial staleness weighting a = 0.5;
* ``windows_convex``: time windows normalised over the window (``server.normalize: window``,
  a convex mix of what arrived, as a buffer is normalised over itself) instead of the
  scenario's population normalisation (a window moves the model by the share of the
  population's weight that reported in it) - separates the trigger from the normalisation.

Aggregation is post-processing and the interrupt rule changes no privacy event, so every
variant spends exactly the same eps per client (checked: the rows' eps columns). A comparison
reports the mean difference and in how many seeds it holds (same seed, same partition and
draws: paired); a difference within the seed spread is not a finding.

    python benchmarks/papers/async_policies.py            # 4 variants x 3 seeds (~3 CPU min)
    python benchmarks/papers/async_policies.py --seeds 5
    python benchmarks/papers/async_policies.py --variants windows_convex   # add to the JSON

Writes benchmarks/results/papers/async_policies.json and docs/img/async_policies.png, then
regenerates docs/RESULTS.md; run directories go to runs/papers/async_policies/ (not
committed).
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from pathlib import Path
from statistics import mean
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from _common import provenance  # first: this checkout's fedsim (see _common)

from fedsim.config import load_scenario

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _study import add_output_arguments, plot_field, publish  # noqa: E402
from vandijk_async import Variant, aggregate, collect, plot, run_variant, verdict  # noqa: E402

REPO = Path(__file__).resolve().parents[2]
SCENARIO = REPO / "scenarios" / "papers" / "async_study.yaml"
RESULTS = REPO / "benchmarks" / "results" / "papers"
RUNS = REPO / "runs" / "papers" / "async_policies"
PLOT = REPO / "docs" / "img" / "async_policies.png"
CHECKPOINTS = (10.0, 20.0, 40.0, 60.0)  # virtual seconds at which the rows report accuracy
STALENESS = "server.staleness_weight={kind: polynomial, a: 0.5}"


def variants(scenario: Path) -> list[Variant]:
    groups = len(load_scenario(scenario).scenario.clients.groups)
    return [
        Variant("windows", "time windows, interrupt switch (base)", ()),
        Variant("snapshot", "time windows, interrupt snapshot",
                tuple(f"clients.groups[{i}].interrupt=snapshot" for i in range(groups))),
        Variant("fedbuff", "FedBuff K = 5, polynomial staleness a = 0.5",
                ("server.aggregation={kind: fedbuff, buffer_size: 5}", STALENESS)),
        Variant("fedasync", "FedAsync alpha = 0.6, polynomial staleness a = 0.5",
                ("server.aggregation={kind: fedasync, alpha: 0.6}", STALENESS)),
        Variant("windows_convex", "time windows normalised over the window",
                ("server.normalize=window",)),
    ]


def accuracy_at(curve: dict[str, list[float]], time: float) -> float | None:
    """The last evaluation at or before ``time`` (None before the first)."""
    values = [a for t, a in zip(curve["time"], curve["accuracy"], strict=True) if t <= time]
    return values[-1] if values else None


def findings(rows: dict[str, dict[str, Any]], per_seed: dict[str, dict[str, float]]) -> list[str]:
    """Each comparison against the base, paired by seed, with the page's rule."""
    def acc(name: str) -> str:
        row = rows[name]
        sd = row.get("final_accuracy_sd")
        return f"{100 * row['final_accuracy']:.1f}" + (f" +- {100 * sd:.1f}" if sd else "") + " %"

    out = []
    base = rows.get("windows")
    for other in ("snapshot", "fedbuff", "fedasync", "windows_convex"):
        if base is None or other not in rows:
            continue
        common = sorted(set(per_seed["windows"]) & set(per_seed[other]))
        ahead = sum(per_seed[other][k] > per_seed["windows"][k] for k in common)
        diff = rows[other]["final_accuracy"] - base["final_accuracy"]
        spread = max(base.get("final_accuracy_sd") or 0.0, rows[other].get("final_accuracy_sd") or 0.0)
        out.append(f"{rows[other]['description']}: {acc(other)} against the base's {acc('windows')} "
                   f"(difference {100 * diff:+.1f} points; ahead in {ahead} of {len(common)} "
                   f"seeds; {verdict(diff, spread, ahead, len(common))}); median client eps "
                   f"{rows[other]['eps_median']:.3g} vs "
                   f"{base['eps_median']:.3g}.")
    if base and base.get("final_accuracy_sd") is not None:
        out.append(f"Seed-to-seed standard deviation of the base: "
                   f"{100 * base['final_accuracy_sd']:.1f} points; a difference of a similar size, "
                   "or one that does not hold in every seed, is not a finding.")
    return out


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--seed", type=int, default=0, help="the first seed")
    parser.add_argument("--scenario", type=Path, default=SCENARIO)
    add_output_arguments(parser, results=RESULTS, plot=PLOT, runs=RUNS)
    parser.add_argument("--variants", nargs="*", default=None,
                        help="run only these (the others' rows are kept from the JSON)")
    args = parser.parse_args(argv)
    if args.seeds < 1:
        parser.error("--seeds must be >= 1")
    seeds = list(range(args.seed, args.seed + args.seeds))
    target = args.results / "async_policies.json"
    previous = json.loads(target.read_text()) if target.is_file() and args.variants else {}
    rows = {r["variant"]: r for r in previous.get("rows", [])}
    curves: dict[str, dict[str, list[float]]] = dict(previous.get("curves", {}))
    epsilons: dict[str, list[float]] = dict(previous.get("epsilons", {}))
    per_seed: dict[str, dict[str, float]] = dict(previous.get("per_seed", {}))
    chosen = [v for v in variants(args.scenario) if not args.variants or v.name in args.variants]
    for variant in chosen:
        results = []
        for seed in seeds:
            run_dir = run_variant(variant, scenario=args.scenario, quick=(),
                                  out=args.runs / variant.name / f"seed{seed}", seed=seed)
            results.append(collect(variant, run_dir))
        merged = aggregate(variant, seeds, results)
        row = merged["row"]
        for t in CHECKPOINTS:
            values = [accuracy_at(r["curve"], t) for r in results]
            row[f"accuracy_at_{t:g}s"] = (round(mean(v for v in values if v is not None), 4)
                                          if all(v is not None for v in values) else None)
        rows[variant.name] = row
        curves[variant.name] = merged["curve"]
        epsilons[variant.name] = merged["epsilons"]
        per_seed[variant.name] = merged["per_seed"]
    plot(curves, epsilons, args.plot)
    document = {
        "command": "python benchmarks/papers/async_policies.py",
        "commit": provenance(),
        "notes": findings(rows, per_seed),
        "rows": list(rows.values()),
        "per_seed": per_seed,
        "curves": curves,
        "epsilons": epsilons,
        "plot": plot_field(args.plot),
    }
    args.results.mkdir(parents=True, exist_ok=True)
    order = [v.name for v in variants(args.scenario)]
    document["rows"] = sorted(document["rows"], key=lambda r: order.index(r["variant"]))
    publish(document, target, page=not args.no_page)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
