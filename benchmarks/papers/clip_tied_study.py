"""Du et al.'s clip-tied noise allocation against a constant noise schedule (issue 29, item 5).

Runs the shipped ``scenarios/du-allocation.yaml`` (5 clients, 300 rounds, clip decaying
``C_t = 2.0 * 0.3^{t/T}``, every client's budget (eps, delta) = (2, 1e-5) under the pld
accountant) per variant with ``--set`` overrides, once per seed (``--seeds``, default 2):

* ``clip_tied`` (as shipped): ``mu_t`` proportional to ``sqrt(C_t)`` (noise std
  ``C_t sigma_t`` proportional to ``sqrt(C_t)``), the common factor solved for the budget;
* ``constant_sigma``: the same clip decay with one sigma for every round (noise ``target``,
  calibrated for the same (eps, delta) over the same rounds);
* ``growing_mu``: Du et al.'s sensitivity decay with the growing-mu schedule of
  ``scenarios/dynamic-dpsgd.yaml`` (growth 3, the same budget);
* ``constant``: no decay at all: constant clip 1.0 and one sigma for the budget.

Every variant is calibrated for the same (eps, delta) over the same rounds, so the rows'
eps columns should agree (each at most 2); what differs is how the noise is spread over the
rounds (the plot's left panel) and the accuracy that buys.

    python benchmarks/papers/clip_tied_study.py        # 4 variants x 2 seeds (~10 min)
    python benchmarks/papers/clip_tied_study.py --runs DIR --collect-only COMMIT   # no runs

Writes benchmarks/results/papers/clip_tied_study.json and docs/img/clip_tied_study.png, then
regenerates docs/RESULTS.md; run directories go to runs/papers/clip_tied_study/.
"""

from __future__ import annotations

import argparse
import csv
import sys
from collections.abc import Sequence
from pathlib import Path
from statistics import mean, median
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from vandijk_async import Variant, aggregate, collect, run_variant  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from _common import provenance, pyplot  # noqa: E402
from _study import add_output_arguments, plot_field, publish, save_figure  # noqa: E402

from fedsim.config.loading import load_scenario  # noqa: E402
from fedsim.privacy.group_schedules import make_schedule  # noqa: E402

REPO = Path(__file__).resolve().parents[2]
SCENARIO = REPO / "scenarios" / "du-allocation.yaml"
RESULTS = REPO / "benchmarks" / "results" / "papers"
RUNS = REPO / "runs" / "papers" / "clip_tied_study"
PLOT = REPO / "docs" / "img" / "clip_tied_study.png"
_NOISE = "clients.groups[0].noise"

VARIANTS = (
    Variant("clip_tied", "Du et al.: mu_t proportional to sqrt(C_t), clip decaying (shipped)", ()),
    Variant("constant_sigma", "one sigma for every round, clip decaying",
            (f"{_NOISE}={{kind: target, epsilon: 2.0, delta: 1.0e-5}}",)),
    Variant("growing_mu", "growing mu (growth 3), clip decaying",
            (f"{_NOISE}={{kind: growing_mu, epsilon: 2.0, delta: 1.0e-5, growth: 3.0}}",)),
    Variant("constant", "constant clip 1.0 and one sigma",
            (f"{_NOISE}={{kind: target, epsilon: 2.0, delta: 1.0e-5}}",
             "clients.groups[0].clip=1.0")),
)


def noise_schedule(variant: Variant, run_dir: Path) -> dict[str, list[float]]:
    """The clip C_t, sigma_t and noise std C_t sigma_t of the run's first client, rebuilt
    from the scenario and the client's q (clients.csv) by the trainer's own schedule."""
    scenario = load_scenario(SCENARIO, variant.overrides).scenario
    with open(run_dir / "clients.csv", encoding="utf-8") as handle:
        q = float(next(csv.DictReader(handle))["q"])
    schedule = make_schedule(scenario.clients.groups[0], q=q, where="clients.groups[0]")
    clips, sigmas = schedule.clips(), schedule.sigmas()
    return {"clip": clips, "sigma": sigmas,
            "noise_std": [c * s for c, s in zip(clips, sigmas, strict=True)]}


def early_accuracy(curve: dict[str, list[float]], fraction: float = 0.25) -> tuple[float, float]:
    """The evaluation time nearest ``fraction`` of the curve's last one, and the accuracy
    there."""
    times = curve["time"]
    index = min(range(len(times)), key=lambda i: abs(times[i] - fraction * times[-1]))
    return times[index], curve["accuracy"][index]


def findings(rows: Sequence[dict[str, Any]]) -> list[str]:
    by_name = {r["variant"]: r for r in rows}
    tied = by_name.get("clip_tied")
    if tied is None:
        return []
    finals = [r["final_accuracy"] for r in rows]
    early = ", ".join(f"{r['variant']} {100 * r['early_accuracy']:.1f} %" for r in rows)
    out = [f"Final accuracies span {100 * (max(finals) - min(finals)):.2f} points across the "
           f"variants (a logistic regression near its ceiling at eps 2); they differ early: at "
           f"{tied['early_time']:g} virtual s, {early}."]
    for row in rows:
        if row is tied:
            continue
        diff = tied["final_accuracy"] - row["final_accuracy"]
        out.append(f"clip_tied against {row['variant']} ({row['description']}): final accuracy "
                   f"{100 * tied['final_accuracy']:.2f} % vs {100 * row['final_accuracy']:.2f} % "
                   f"({100 * diff:+.2f} points; seed sd {100 * (tied['final_accuracy_sd'] or 0):.2f}"
                   f" and {100 * (row['final_accuracy_sd'] or 0):.2f} points over {row['seeds']} "
                   f"seeds); eps max {tied['eps_max']:.4g} vs {row['eps_max']:.4g}.")
    return out


def plot(rows: Sequence[dict[str, Any]], curves: dict[str, dict[str, Any]], path: Path) -> None:
    plt = pyplot()
    fig, (left, right) = plt.subplots(1, 2, figsize=(10, 4))
    for row in rows:
        name = row["variant"]
        schedule = curves[name]["schedule"]
        left.plot(range(len(schedule["noise_std"])), schedule["noise_std"], label=name)
        curve = curves[name]["accuracy"]
        right.plot(curve["time"], [100 * a for a in curve["accuracy"]], label=name)
    left.set_xlabel("round t")
    left.set_ylabel("noise std on the clipped sum, C_t sigma_t")
    left.set_title("how each schedule spends the same budget", fontsize=9)
    left.legend(fontsize=8)
    right.set_xlabel("virtual time (s)")
    right.set_ylabel("held-out accuracy (%), mean over seeds")
    right.set_title("du-allocation: 5 clients, eps <= 2 at delta 1e-5", fontsize=9)
    right.legend(fontsize=8)
    save_figure(fig, path)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=2)
    add_output_arguments(parser, results=RESULTS, plot=PLOT, runs=RUNS)
    parser.add_argument("--collect-only", metavar="COMMIT", default=None,
                        help="do not run: collect the run directories in --runs, made by "
                             "COMMIT (named in the notes)")
    args = parser.parse_args(argv)
    if args.seeds < 1:
        parser.error("--seeds must be >= 1")
    seeds = list(range(args.seeds))
    rows: list[dict[str, Any]] = []
    curves: dict[str, dict[str, Any]] = {}
    for variant in VARIANTS:
        dirs = [args.runs / variant.name / f"seed{seed}" if args.collect_only else
                run_variant(variant, scenario=SCENARIO, quick=(),
                            out=args.runs / variant.name / f"seed{seed}", seed=seed)
                for seed in seeds]
        aggregated = aggregate(variant, seeds, [collect(variant, d) for d in dirs])
        schedule = noise_schedule(variant, dirs[0])
        row = {k: v for k, v in aggregated["row"].items()
               if k not in ("best_accuracy", "mu_clt_median")}
        row["sigma_first_last"] = [round(schedule["sigma"][0], 4), round(schedule["sigma"][-1], 4)]
        row["noise_std_first_last"] = [round(schedule["noise_std"][0], 4),
                                       round(schedule["noise_std"][-1], 4)]
        row["noise_std_mean"] = round(mean(schedule["noise_std"]), 4)
        row["noise_std_median"] = round(median(schedule["noise_std"]), 4)
        row["early_time"], early = early_accuracy(aggregated["curve"])
        row["early_accuracy"] = round(early, 4)
        rows.append(row)
        curves[variant.name] = {"schedule": schedule, "accuracy": aggregated["curve"]}
    plot(rows, curves, args.plot)
    document = {
        "command": "python benchmarks/papers/clip_tied_study.py",
        "commit": provenance(),
        "notes": ["scenarios/du-allocation.yaml as shipped (5 clients, 300 rounds, every "
                  "client's budget eps 2 at delta 1e-5, pld accountant); the variants change "
                  f"only the noise (and, for constant, the clip); {args.seeds} seed(s). "
                  "sigma and the noise std are the first client's first and last round."]
        + ([f"The runs were made at {args.collect_only} and collected by the commit above "
            "(--collect-only)."] if args.collect_only else [])
        + findings(rows),
        "rows": rows,
        "plot": plot_field(args.plot),
    }
    publish(document, args.results / "clip_tied_study.json", page=not args.no_page)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
