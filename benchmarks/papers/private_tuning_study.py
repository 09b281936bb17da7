"""Private hyperparameter search (issue 29, item 1): each trial's own eps beside the
selection's total, the candidate chosen and its accuracy.

**Trials.** ``fedsim sweep scenarios/quickstart.yaml --private-tuning nb --tuning-mean M
--tuning-budget 100``
(default M = 3) over a grid of 4 candidates (every group's noise multiplier sigma in {1.3, 2.0}
and local learning rate in {0.25, 0.5}), the horizon shortened to ``--virtual-seconds`` (default
30) so that the trials fit in minutes on 2 shared cores. K and the candidates come from the
operating system's entropy (as the theorems need: a rerun draws another K), so the trials'
rows are one draw, not a reproducible figure; the tuned totals are not: they are charged
before any trial, from each candidate's bounded per-trial releases (every quickstart group has
a budget and no ``rounds``, so a trial is bounded by the rounds its budget admits).

**Bound.** For the first client of each group, from the same bounded per-trial releases
(:func:`fedsim.commands.private_tuning.trial_steps`): the eps of one trial (the worst
candidate, under the rdp accountant that the tuning bound uses and under pld), the tuned total
(Papernot & Steinke Thm 2 for the truncated negative binomial with eta = 0, Thm 6 for Poisson,
converted optimally) for E[K] in {2, 3, 5, 10}, and, beside them, composing E[K] trials of the
worst candidate (what a fixed number of trials would cost) - all at delta 1e-5.

    python benchmarks/papers/private_tuning_study.py      # the bound ~1 min, K trials ~1 min each

Writes benchmarks/results/papers/private_tuning_study.json and docs/img/private_tuning_study.png,
then regenerates docs/RESULTS.md; the sweep goes to runs/papers/private_tuning_study/.
"""

from __future__ import annotations

import argparse
import itertools
import json
import shutil
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from _common import provenance, pyplot  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _study import add_output_arguments, plot_field, publish, save_figure  # noqa: E402

from fedsim.commands.private_tuning import selection_of, trial_distribution, trial_steps  # noqa: E402
from fedsim.privacy.accountant import make_accountant  # noqa: E402

REPO = Path(__file__).resolve().parents[2]
SCENARIO = REPO / "scenarios" / "quickstart.yaml"
RESULTS = REPO / "benchmarks" / "results" / "papers"
RUNS = REPO / "runs" / "papers" / "private_tuning_study"
PLOT = REPO / "docs" / "img" / "private_tuning_study.png"
DELTA = 1e-5
SIGMA_PATH, LR_PATH = "clients.groups[*].noise.sigma", "clients.groups[*].local_lr"
SIGMAS, LRS = ("1.3", "2.0"), ("0.25", "0.5")
MEANS = (2.0, 3.0, 5.0, 10.0)


def candidates(horizon: str) -> list[list[str]]:
    return [[horizon, f"{SIGMA_PATH}={s}", f"{LR_PATH}={lr}"]
            for s, lr in itertools.product(SIGMAS, LRS)]


def bound_rows(horizon: str) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """Per group's first client: one trial's eps, the tuned totals and the fixed-K
    compositions for every E[K] in MEANS (rows and the plot's curves)."""
    bounded = [trial_steps(str(SCENARIO), overrides) for overrides in candidates(horizon)]
    firsts: dict[str, str] = {}
    for client in sorted(bounded[0]):
        firsts.setdefault(client.rsplit("-", 1)[0], client)
    rows, curves = [], {}
    for group, client in firsts.items():
        per_candidate = [b[client] for b in bounded]
        one_rdp = max(make_accountant("rdp", list(s)).epsilon(DELTA) for s in per_candidate)
        one_pld = max(make_accountant("pld", list(s)).epsilon(DELTA) for s in per_candidate)
        worst = max(per_candidate, key=lambda s: make_accountant("rdp", list(s)).epsilon(DELTA))
        curve: dict[str, list[float]] = {"mean": [], "nb": [], "poisson": [], "composed": []}
        for mean in MEANS:
            tuned = {kind: make_accountant("rdp", [selection_of(
                trial_distribution(kind, mean), per_candidate)]).epsilon(DELTA)
                for kind in ("nb", "poisson")}
            composed = make_accountant("rdp", list(worst) * int(mean)).epsilon(DELTA)
            rows.append({"part": "bound", "group": group, "client": client,
                         "rounds_bounded": max(len(s) for s in per_candidate),
                         "one_trial_eps_pld": round(one_pld, 4),
                         "one_trial_eps_rdp": round(one_rdp, 4), "mean_trials": mean,
                         "tuned_eps_nb": round(tuned["nb"], 4),
                         "tuned_eps_poisson": round(tuned["poisson"], 4),
                         "composed_eps_mean_trials": round(composed, 4)})
            for key, value in (("mean", mean), ("nb", tuned["nb"]),
                               ("poisson", tuned["poisson"]), ("composed", composed)):
                curve[key].append(value)
            print(json.dumps(rows[-1]), flush=True)
        curves[group] = {**curve, "one_trial_rdp": one_rdp, "one_trial_pld": one_pld}
    return rows, curves


def sweep(horizon: str, mean: float, out: Path) -> dict[str, Any]:
    if out.exists():
        shutil.rmtree(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    command = [sys.executable, "-m", "fedsim", "sweep", str(SCENARIO), "--set", horizon,
               "--grid", f"{SIGMA_PATH}={','.join(SIGMAS)}",
               "--grid", f"{LR_PATH}={','.join(LRS)}",
               "--private-tuning", "nb", "--tuning-mean", f"{mean:g}",
               # (the tuned totals pass quickstart's budgets: accepted, as the study measures)
               "--tuning-budget", "100", "--out", str(out), "--no-plots"]
    print(" ".join(command[1:]), flush=True)
    subprocess.run(command, check=True, cwd=REPO)
    table: dict[str, Any] = json.loads((out / "sweep.json").read_text())
    return table


def trial_rows(table: dict[str, Any]) -> list[dict[str, Any]]:
    tuning = table["private_tuning"]
    return [{"part": "trials", "trial": run["run"].split("-", 2)[1],
             "sigma": float(run[SIGMA_PATH]), "local_lr": float(run[LR_PATH]),
             "final_accuracy": run["final_accuracy"], "trial_eps_max": round(run["eps_max"], 4),
             "tuned_eps_max": round(tuning["tuned_epsilon_max"], 4),
             "selected": run["selected"]} for run in table["runs"]]


def findings(table: dict[str, Any], trials: Sequence[dict[str, Any]],
             bound: Sequence[dict[str, Any]]) -> list[str]:
    tuning = table["private_tuning"]
    chosen = next((t for t in trials if t["selected"]), None)
    out = [f"This draw: K = {tuning['trials']} trial(s) (truncated negative binomial, eta = 0, "
           f"E[K] = {tuning['mean']:g}); "
           + ("none selected" if chosen is None else
              f"selected sigma = {chosen['sigma']:g}, local_lr = {chosen['local_lr']:g} at final "
              f"accuracy {100 * chosen['final_accuracy']:.1f} %")
           + f"; every client charged the tuned total before the first trial, largest "
           f"{tuning['tuned_epsilon_max']:.4g} at delta {tuning['delta']:g}."]
    if trials:
        largest = max(t["trial_eps_max"] for t in trials)
        out.append(f"Largest per-trial eps spent in a trial (pld, the trial's ledgers): "
                   f"{largest:.4g}; the tuned total is {tuning['tuned_epsilon_max'] / largest:.2f} "
                   "times it (it bounds the whole budget a trial may spend, for any K).")
    at3 = [b for b in bound if b["mean_trials"] == 3.0]
    for row in at3:
        out.append(f"group {row['group']}: one trial {row['one_trial_eps_rdp']:.3g} (rdp), "
                   f"E[K] = 3 tuned {row['tuned_eps_nb']:.3g} (nb) / {row['tuned_eps_poisson']:.3g} "
                   f"(poisson) against {row['composed_eps_mean_trials']:.3g} for 3 trials "
                   "composed.")
    return out


def plot(curves: dict[str, Any], path: Path) -> None:
    plt = pyplot()
    fig, axes = plt.subplots(1, len(curves), figsize=(4 * len(curves), 3.8), squeeze=False)
    for ax, (group, c) in zip(axes[0], curves.items(), strict=True):
        ax.plot(c["mean"], c["nb"], "o-", label="tuned, truncated neg. binomial")
        ax.plot(c["mean"], c["poisson"], "s-", label="tuned, Poisson")
        ax.plot(c["mean"], c["composed"], "^--", label="E[K] trials composed")
        ax.axhline(c["one_trial_rdp"], color="grey", ls=":", label="one trial (rdp)")
        ax.set_xscale("log")
        ax.minorticks_off()
        ax.set_xticks(c["mean"], [f"{m:g}" for m in c["mean"]])
        ax.set_ylim(bottom=0)
        ax.set_xlabel("E[K], mean number of trials")
        ax.set_ylabel("eps at delta 1e-5")
        ax.set_title(f"quickstart, group {group}", fontsize=9)
        ax.legend(fontsize=7)
    save_figure(fig, path)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tuning-mean", type=float, default=3.0)
    parser.add_argument("--virtual-seconds", type=float, default=30.0)
    add_output_arguments(parser, results=RESULTS, plot=PLOT, runs=RUNS)
    args = parser.parse_args(argv)
    horizon = f"stop.virtual_seconds={args.virtual_seconds:g}"
    bound, curves = bound_rows(horizon)
    table = sweep(horizon, args.tuning_mean, args.runs)
    trials = trial_rows(table)
    plot(curves, args.plot)
    document = {
        "command": "python benchmarks/papers/private_tuning_study.py",
        "commit": provenance(),
        "notes": [f"scenarios/quickstart.yaml with its horizon shortened to "
                  f"{args.virtual_seconds:g} virtual seconds; grid {SIGMA_PATH} in "
                  f"{{{', '.join(SIGMAS)}}} x {LR_PATH} in {{{', '.join(LRS)}}}; delta "
                  f"{DELTA:g}. The trials table is one draw of K from the operating system "
                  "(not reproducible by design); the bound table is."]
        + findings(table, trials, bound),
        "group_by": "part",
        "rows": trials + bound,
        "plot": plot_field(args.plot),
    }
    publish(document, args.results / "private_tuning_study.json", page=not args.no_page)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
