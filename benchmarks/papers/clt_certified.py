"""The certified error of the GDP CLT on Dong, Roth & Su's MNIST settings (issue 29, item 4).

For each of DRS's runs A, B and C (m = 256 of n = 60000, sigma 1.3 / 1.1 / 0.7, 15 / 60 / 45
epochs: T = 3516 / 14062 / 10547 steps), under fixed-size batches (replace-one, DRS's
mechanism) and Poisson sampling (add/remove), this computes

* ``mu_clt``: the CLT mu fedsim reports (an approximation);
* ``gamma``: the certified Berry-Esseen half-width around ``G_mu`` (Dong-Roth-Su Thm 3.5 /
  Cor. 5.6; :func:`fedsim.privacy.clt_error.clt_band`): the true curve lies in
  ``[G_mu(a + gamma) - gamma, G_mu(a - gamma) + gamma]``;
* the PLD accountant's trade-off curve (a numerical guarantee, independent of the CLT) on a
  grid of 2001 type I errors, and how it sits in the band: ``inside`` (every grid point within
  the band) and ``clt_error``: the largest vertical distance between ``G_mu`` and the PLD curve - the CLT's
  actual error, which gamma bounds;
* eps at delta = 1e-5 from the CLT mu and from the PLD accountant.

    python benchmarks/papers/clt_certified.py        # a few seconds

Writes benchmarks/results/papers/clt_certified.json and docs/img/clt_certified.png (the PLD
curve inside the band, and its distance from G_mu inside +-gamma), then regenerates
docs/RESULTS.md.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from _common import provenance, pyplot  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _study import add_output_arguments, plot_field, publish, save_figure  # noqa: E402

from fedsim.privacy.accountant import make_accountant  # noqa: E402
from fedsim.privacy.clt_error import clt_band  # noqa: E402
from fedsim.privacy.events import GaussianStep, Sampling  # noqa: E402
from fedsim.privacy.gdp import gdp_epsilon, gdp_tradeoff  # noqa: E402

REPO = Path(__file__).resolve().parents[2]
RESULTS = REPO / "benchmarks" / "results" / "papers"
PLOT = REPO / "docs" / "img" / "clt_certified.png"
NUM_TRAIN, BATCH = 60000, 256
DELTA = 1e-5
# DRS's runs: (name, sigma, epochs)
RUNS: tuple[tuple[str, float, int], ...] = (("A", 1.3, 15), ("B", 1.1, 60), ("C", 0.7, 45))
GRID = 2001


def history(sampling: Sampling, sigma: float, epochs: int) -> list[GaussianStep]:
    steps = round(epochs * NUM_TRAIN / BATCH)
    return [GaussianStep(sampling, BATCH / NUM_TRAIN, sigma, steps)]


def measure(run: str, sampling: Sampling, sigma: float,
            epochs: int) -> tuple[dict[str, Any], dict[str, Any]]:
    """One row and its curves (alpha, PLD curve, G_mu, band edges)."""
    steps = history(sampling, sigma, epochs)
    band = clt_band(steps)
    alphas = np.linspace(0.0, 1.0, GRID)
    accountant = make_accountant("pld", steps)
    curve = np.asarray(accountant.tradeoff(alphas), dtype=float)
    lower, upper = band.lower(alphas), band.upper(alphas)
    gdp = gdp_tradeoff(alphas, band.mu)
    row = {
        "run": run,
        "sampling": sampling,
        "sigma": sigma,
        "steps": steps[0].count,
        "mu_clt": round(band.mu, 4),
        "mu_berry_esseen": round(band.mu_berry_esseen, 4),
        "gamma": round(band.gamma, 4),
        "gamma_p": round(band.gamma_p, 4),
        "gamma_q": round(band.gamma_q, 4),
        "clt_error": round(float(np.max(np.abs(gdp - curve))), 5),
        "inside": bool(np.all(lower <= curve + 1e-12) and np.all(curve <= upper + 1e-12)),
        "eps_gdp_clt": round(gdp_epsilon(DELTA, band.mu), 4),
        "eps_pld": round(accountant.epsilon(DELTA), 4),
    }
    curves = {"alpha": alphas, "pld": curve, "gdp": gdp, "lower": lower, "upper": upper}
    return row, curves


def findings(rows: Sequence[dict[str, Any]]) -> list[str]:
    inside = sum(r["inside"] for r in rows)
    widest = max(rows, key=lambda r: r["gamma"])
    narrowest = min(rows, key=lambda r: r["gamma"])
    ratio = max(r["clt_error"] / r["gamma"] for r in rows)
    return [
        f"The PLD curve lies inside the certified band in {inside} of {len(rows)} settings.",
        f"gamma ranges from {narrowest['gamma']:.3g} (run {narrowest['run']}, "
        f"{narrowest['sampling']}, T = {narrowest['steps']}) to {widest['gamma']:.3g} (run "
        f"{widest['run']}, {widest['sampling']}); the CLT's actual error (largest vertical "
        f"distance of G_mu from the PLD curve) is at most {100 * ratio:.0f} % of gamma: gamma "
        f"is a certificate (at least {1 / ratio:.1f} times the error here), not an estimate of it.",
    ]


def plot(panels: Sequence[tuple[dict[str, Any], dict[str, Any]]], path: Path) -> None:
    plt = pyplot()
    fig, axes = plt.subplots(2, len(panels), figsize=(4 * len(panels), 7.5), squeeze=False)
    for column, (row, c) in enumerate(panels):
        top, bottom = axes[0][column], axes[1][column]
        label = f"run {row['run']} ({row['sampling']}): mu = {row['mu_clt']:.3g}"
        top.fill_between(c["alpha"], c["lower"], c["upper"], color="tab:blue", alpha=0.2,
                         label=f"certified band (gamma = {row['gamma']:.3g})")
        top.plot(c["alpha"], c["gdp"], color="tab:blue", lw=1, ls="--", label="CLT G_mu")
        top.plot(c["alpha"], c["pld"], color="black", lw=1.2, label="PLD curve (guarantee)")
        top.plot([0, 1], [1, 0], color="grey", lw=0.6, ls=":")
        top.set_xlim(0, 1)
        top.set_ylim(0, 1)
        top.set_title(label, fontsize=9)
        top.set_xlabel("type I error alpha")
        top.set_ylabel("type II error beta")
        top.legend(fontsize=7, loc="upper right")
        bottom.fill_between(c["alpha"], c["lower"] - c["gdp"], c["upper"] - c["gdp"],
                            color="tab:blue", alpha=0.2, label="band - G_mu")
        bottom.plot(c["alpha"], c["pld"] - c["gdp"], color="black", lw=1.2,
                    label="PLD curve - G_mu")
        bottom.axhline(0.0, color="tab:blue", lw=0.8, ls="--")
        bottom.set_xlim(0, 1)
        bottom.set_xlabel("type I error alpha")
        bottom.set_ylabel("distance from G_mu")
        bottom.legend(fontsize=7, loc="lower right")
    fig.suptitle("Dong-Roth-Su MNIST settings: the PLD trade-off curve inside the CLT's "
                 "certified Berry-Esseen band", fontsize=10)
    save_figure(fig, path)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_output_arguments(parser, results=RESULTS, plot=PLOT)
    args = parser.parse_args(argv)
    rows: list[dict[str, Any]] = []
    panels = []
    for run, sigma, epochs in RUNS:
        for sampling in ("fixed", "poisson"):
            row, curves = measure(run, sampling, sigma, epochs)
            rows.append(row)
            if sampling == "fixed":
                panels.append((row, curves))
            print(json.dumps(row), flush=True)
    plot(panels, args.plot)
    document = {
        "command": "python benchmarks/papers/clt_certified.py",
        "commit": provenance(),
        "notes": [f"m = {BATCH} of n = {NUM_TRAIN}, delta = {DELTA:g}; the curve on "
                  f"{GRID} type I errors; gamma_p / gamma_q are the Berry-Esseen errors of the "
                  "privacy loss's law under each distribution of the pair, gamma the band's "
                  "half-width for the reported mu."] + findings(rows),
        "rows": rows,
        "plot": plot_field(args.plot),
    }
    publish(document, args.results / "clt_certified.json", page=not args.no_page)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
