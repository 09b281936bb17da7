"""DP-PCA (issue 29, item 3): the projection's quality against non-private PCA, and the
dp-pca scenario against the same scenario on raw features.

**Projection.** The clients of the shipped ``scenarios/dp-pca.yaml`` (10 clients, 5 Poisson
and 5 fixed-size, the MNIST training set split between them) each release ``sum x x^T + E``
(records clipped to norm 10; Analyze Gauss, :func:`fedsim.training.dp_pca.dp_second_moment`)
with their group's noise multiplier times a factor (``--scales``, 1 = the scenario's); the
released matrices are summed and their top 50 eigenvectors ``V`` are compared with the exact
top 50 eigenvectors ``U`` of the clipped records' ``sum x x^T`` ``M`` (numpy's SVD through
:func:`fedsim.training.dp_pca.top_components` of the noiseless matrix):

* ``energy_ratio``: ``tr(V^T M V) / tr(U^T M U)``, the share of the best 50-dimensional
  subspace's energy the DP subspace keeps (1 = as good as exact PCA);
* ``test_energy`` / ``test_energy_exact``: the share of the held-out images' squared norm
  within ``V`` and within ``U`` (unseen data);
* ``overlap``: ``|U^T V|_F^2 / 50``, the mean squared cosine of the principal angles;
* ``release_eps_poisson`` / ``release_eps_fixed``: one release's eps at delta 1e-5 (pld) for
  each group: what the projection costs a client.

The row ``run seed 0`` is the projection the scenario's own run used (its ``dp-pca.npz``).

**Runs.** ``dp_pca`` is the scenario as shipped; ``raw`` the same scenario with ``dp_pca``
removed (every client trains on the 784 raw features; the Poisson group's noise target then
calibrates its rounds alone, so both variants end at the same budget, eps 4). ``--seeds``
(default 2) seeds each.

    python benchmarks/papers/dp_pca_study.py          # ~2 min projection, 2 x 2 runs (~10 min)
    python benchmarks/papers/dp_pca_study.py --runs DIR --collect-only COMMIT   # no runs

Writes benchmarks/results/papers/dp_pca_study.json and docs/img/dp_pca_study.png, then
regenerates docs/RESULTS.md; run directories go to runs/papers/dp_pca_study/.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from vandijk_async import Variant, aggregate, collect, run_variant  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from _common import provenance, pyplot  # noqa: E402
from _study import add_output_arguments, plot_field, publish, save_figure  # noqa: E402

from fedsim.config.loading import load_scenario  # noqa: E402
from fedsim.privacy.accountant import make_accountant  # noqa: E402
from fedsim.privacy.events import GaussianStep  # noqa: E402
from fedsim.privacy.group_schedules import pca_sigma  # noqa: E402
from fedsim.runtime.dp_pca import PCA_FILE  # noqa: E402
from fedsim.runtime.population import build_population  # noqa: E402
from fedsim.training.dp_pca import Projection, dp_second_moment, second_moment, top_components  # noqa: E402

REPO = Path(__file__).resolve().parents[2]
SCENARIO = REPO / "scenarios" / "dp-pca.yaml"
RESULTS = REPO / "benchmarks" / "results" / "papers"
RUNS = REPO / "runs" / "papers" / "dp_pca_study"
PLOT = REPO / "docs" / "img" / "dp_pca_study.png"
DELTA = 1e-5
SCALES = (0.25, 0.5, 1.0, 2.0, 4.0, 8.0)

VARIANTS = (
    Variant("dp_pca", "50 DP principal components (shipped)", ()),
    Variant("raw", "raw 784 features, no dp_pca",
            ("clients.groups[0].dp_pca=null", "clients.groups[1].dp_pca=null")),
)


def _quality(basis: torch.Tensor, exact: torch.Tensor, moment: torch.Tensor,
             test: torch.Tensor) -> dict[str, float]:
    kept = float(torch.trace(basis.T @ moment @ basis) / torch.trace(exact.T @ moment @ exact))
    test_total = float((test * test).sum())
    return {
        "energy_ratio": round(kept, 4),
        "test_energy": round(float(((test @ basis) ** 2).sum()) / test_total, 4),
        "test_energy_exact": round(float(((test @ exact) ** 2).sum()) / test_total, 4),
        "overlap": round(float((exact.T @ basis).pow(2).sum()) / basis.shape[1], 4),
    }


def projection_rows(scales: Sequence[float], run_dir: Path | None) -> list[dict[str, Any]]:
    """One row per noise scale (and one for the run's own projection)."""
    loaded = load_scenario(SCENARIO)
    population = build_population(loaded)
    groups = loaded.scenario.clients.groups
    config = groups[0].dp_pca
    assert config is not None
    components, clip = config.components, config.clip
    features = {plan.client_id: population.train_x.index_select(
        0, torch.from_numpy(np.asarray(plan.indices, dtype=np.int64)))
        for plan in population.plans}
    moment = sum((second_moment(x, clip) for x in features.values()),
                 torch.zeros(784, 784, dtype=torch.float64))
    exact = top_components(moment, components).basis.to(torch.float64)
    test = population.test_x.reshape(len(population.test_x), -1).to(torch.float64)
    sigmas = {g.name: pca_sigma(g) for g in groups}
    rows = []
    for scale in scales:
        total = torch.zeros_like(moment)
        for index, plan in enumerate(population.plans):
            sigma = sigmas[plan.group.name]
            assert sigma is not None
            matrix, _ = dp_second_moment(features[plan.client_id], sampling=plan.group.sampling,
                                         noise_multiplier=scale * sigma, clip=clip,
                                         generator=torch.Generator().manual_seed(index))
            total += matrix
        basis = top_components(total, components).basis.to(torch.float64)
        row: dict[str, Any] = {"part": "projection", "projection": f"noise x {scale:g}"}
        for group in groups:
            sigma = sigmas[group.name]
            assert sigma is not None
            row[f"sigma_{group.name}"] = round(scale * sigma, 4)
            row[f"release_eps_{group.name}"] = round(make_accountant(
                "pld", [GaussianStep(group.sampling, 1.0, scale * sigma)]).epsilon(DELTA), 4)
        rows.append({**row, **_quality(basis, exact, moment, test)})
        print(json.dumps(rows[-1]), flush=True)
    if run_dir is not None:
        with np.load(run_dir / "ledgers" / PCA_FILE) as saved:
            basis = Projection(torch.from_numpy(saved["basis"])).basis.to(torch.float64)
        rows.append({"part": "projection", "projection": "run seed 0 (the scenario's own)",
                     **_quality(basis, exact, moment, test)})
    return rows


def run_rows(seeds: Sequence[int], runs: Path,
             collect_only: bool = False) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    rows, curves = [], {}
    for variant in VARIANTS:
        dirs = [runs / variant.name / f"seed{seed}" if collect_only else
                run_variant(variant, scenario=SCENARIO, quick=(),
                            out=runs / variant.name / f"seed{seed}", seed=seed) for seed in seeds]
        results = [collect(variant, d) for d in dirs]
        aggregated = aggregate(variant, seeds, results)
        row = {"part": "runs", **{k: v for k, v in aggregated["row"].items()
                                  if k not in ("best_accuracy", "mu_clt_median")}}
        for name, group in results[0]["groups"].items():
            row[f"sigma_{name}"] = round(group["sigma"], 4)
        rows.append(row)
        curves[variant.name] = aggregated["curve"]
    return rows, curves


def findings(rows: Sequence[dict[str, Any]]) -> list[str]:
    scenario = next((r for r in rows if r.get("projection") == "noise x 1"), None)
    runs = {r["variant"]: r for r in rows if r["part"] == "runs"}
    out = []
    if scenario is not None:
        out.append(f"At the scenario's noise a release costs eps {scenario['release_eps_poisson']:.3g} "
                   f"(Poisson group) and {scenario['release_eps_fixed']:.3g} (fixed-size group) "
                   f"on its own, and the summed releases' 50 components keep "
                   f"{100 * scenario['energy_ratio']:.1f} % of exact PCA's energy (held-out "
                   f"images: {100 * scenario['test_energy']:.1f} % vs "
                   f"{100 * scenario['test_energy_exact']:.1f} % within the exact components).")
    if "dp_pca" in runs and "raw" in runs:
        pca, raw = runs["dp_pca"], runs["raw"]
        diff = pca["final_accuracy"] - raw["final_accuracy"]
        spread = max(pca["final_accuracy_sd"] or 0.0, raw["final_accuracy_sd"] or 0.0)
        verdict = "within the seed spread" if abs(diff) <= spread else "beyond the seed spread"
        out.append(f"dp-pca against raw features at the same budget: final accuracy "
                   f"{100 * pca['final_accuracy']:.2f} % vs {100 * raw['final_accuracy']:.2f} % "
                   f"({100 * diff:+.2f} points, {verdict}); eps max {pca['eps_max']:.4g} vs "
                   f"{raw['eps_max']:.4g} (the release included). The release's share of the "
                   f"budget is paid in DP-SGD: the Poisson group's target gives it sigma "
                   f"{pca['sigma_poisson']:.4g} against {raw['sigma_poisson']:.4g}, the fixed "
                   f"group's budget fewer rounds ({pca['applied_updates']:g} updates applied "
                   f"against {raw['applied_updates']:g}, the run ending at "
                   f"{pca['virtual_time']:g} virtual s against {raw['virtual_time']:g}).")
    return out


def plot(rows: Sequence[dict[str, Any]], curves: dict[str, Any], path: Path) -> None:
    plt = pyplot()
    fig, (left, right) = plt.subplots(1, 2, figsize=(10, 4))
    swept = [r for r in rows if r["part"] == "projection" and "release_eps_poisson" in r]
    eps = [r["release_eps_poisson"] for r in swept]
    left.plot(eps, [r["energy_ratio"] for r in swept], "o-",
              label="training records' energy (clipped)")
    left.plot(eps, [r["test_energy"] / r["test_energy_exact"] for r in swept], "s-",
              label="held-out images' energy")
    scenario = next((r for r in swept if r["projection"] == "noise x 1"), None)
    if scenario is not None:
        left.axvline(scenario["release_eps_poisson"], color="grey", ls=":", lw=0.8)
        left.annotate("scenario", (scenario["release_eps_poisson"], scenario["energy_ratio"]),
                      textcoords="offset points", xytext=(5, -12), fontsize=8)
    left.set_xscale("log")
    left.set_xlabel("a Poisson client's release eps at delta 1e-5 (log); fixed-size "
                    "clients' noise scaled alike", fontsize=8)
    left.set_ylabel("kept by the DP top 50 / by exact PCA's")
    left.set_title("DP projection against non-private PCA", fontsize=9)
    left.legend(fontsize=8)
    for name, curve in curves.items():
        right.plot(curve["time"], [100 * a for a in curve["accuracy"]], label=name)
    right.set_xlabel("virtual time (s)")
    right.set_ylabel("held-out accuracy (%), mean over seeds")
    right.set_title("dp-pca scenario: eps 4 per client, release included", fontsize=9)
    right.legend(fontsize=8)
    save_figure(fig, path)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=2)
    parser.add_argument("--scales", type=float, nargs="+", default=list(SCALES))
    add_output_arguments(parser, results=RESULTS, plot=PLOT, runs=RUNS)
    parser.add_argument("--collect-only", metavar="COMMIT", default=None,
                        help="do not run: collect the run directories in --runs, made by "
                             "COMMIT (named in the notes); the projection rows are recomputed")
    args = parser.parse_args(argv)
    if args.seeds < 1:
        parser.error("--seeds must be >= 1")
    run_part, curves = run_rows(list(range(args.seeds)), args.runs, args.collect_only is not None)
    rows = projection_rows(args.scales, args.runs / "dp_pca" / "seed0") + run_part
    plot(rows, curves, args.plot)
    document = {
        "command": "python benchmarks/papers/dp_pca_study.py",
        "commit": provenance(),
        "notes": ["scenarios/dp-pca.yaml as shipped (MNIST, 10 clients, 50 components, records "
                  "clipped to norm 10, every client's budget eps 4 at delta 1e-5); the "
                  f"projection rows draw each client's release noise from seed = its index; "
                  f"{args.seeds} seed(s) per run variant."]
        + ([f"The runs were made at {args.collect_only} and collected by the commit above "
            "(--collect-only)."] if args.collect_only else [])
        + findings(rows),
        "group_by": "part",
        "rows": rows,
        "plot": plot_field(args.plot),
    }
    publish(document, args.results / "dp_pca_study.json", page=not args.no_page)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
