"""Compressed updates (paper 000, footnote 1): accuracy against bytes on the wire.

Runs the shipped heterogeneous scenario ``scenarios/hetero-100.yaml`` (100 clients in three
groups, lossy network) per variant with ``--set`` overrides, once per seed (``--seeds``,
default 3), every group compressing its updates the same way:

* ``none`` (the base): the full float32 vector;
* ``top_k_10``: the 10 % largest coordinates (indices and values: 8 bytes each);
* ``threshold_0.1``: the coordinates with ``|u_i| >= 0.1`` (about 2 noise standard deviations
  of the groups' updates);
* ``quantise_8`` / ``quantise_4``: unbiased stochastic quantisation, 8 or 4 bits a coordinate.

The horizon is shortened from the scenario's 600 to ``--virtual-seconds`` (default 30) virtual
seconds so that 5 variants x 3 seeds fit in about half an hour on 2 shared cores. Compression
is post-processing of the noisy update, so every variant spends exactly the same eps per client
(the rows' eps columns show it; ``tests/runtime/test_compression_run.py`` checks it exactly).
Bytes are the simulated network's ``uplink.bytes_sent`` (every encoded client message,
statuses included) over the updates sent; the ratio is against the base.

    python benchmarks/papers/compression_study.py          # 5 variants x 3 seeds (~30 min)

Writes benchmarks/results/papers/compression_study.json and docs/img/compression_study.png,
then regenerates docs/RESULTS.md; run directories go to runs/papers/compression_study/.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from pathlib import Path
from statistics import mean, stdev
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from vandijk_async import Variant, collect, run_variant  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from _common import provenance, pyplot  # noqa: E402
from _study import add_output_arguments, plot_field, publish, save_figure  # noqa: E402

REPO = Path(__file__).resolve().parents[2]
SCENARIO = REPO / "scenarios" / "hetero-100.yaml"
RESULTS = REPO / "benchmarks" / "results" / "papers"
RUNS = REPO / "runs" / "papers" / "compression_study"
PLOT = REPO / "docs" / "img" / "compression_study.png"
GROUPS = 3  # hetero-100's groups


def _every_group(setting: str) -> tuple[str, ...]:
    return tuple(f"clients.groups[{i}].compression={setting}" for i in range(GROUPS))


VARIANTS = (
    Variant("none", "full float32 updates (base)", ()),
    Variant("top_k_10", "top-k, 10 % of coordinates", _every_group("{kind: top_k, fraction: 0.1}")),
    Variant("threshold_0.1", "threshold |u_i| >= 0.1",
            _every_group("{kind: threshold, threshold: 0.1}")),
    Variant("quantise_8", "8-bit stochastic quantisation", _every_group("{kind: quantise, bits: 8}")),
    Variant("quantise_4", "4-bit stochastic quantisation", _every_group("{kind: quantise, bits: 4}")),
)


def measure(variant: Variant, run_dir: Path) -> dict[str, Any]:
    result = collect(variant, run_dir)
    summary = json.loads((run_dir / "summary.json").read_text())
    uplink = summary["network"]["uplink"]
    result["bytes"] = uplink["bytes_sent"]
    result["bytes_per_message"] = uplink["bytes_sent"] / max(uplink["sent"], 1)
    result["rejected"] = summary["updates"]["rejected"]
    return result


def row_of(variant: Variant, results: Sequence[dict[str, Any]],
           base_bytes: float | None) -> dict[str, Any]:
    finals = [r["row"]["final_accuracy"] for r in results]
    per_message = mean(r["bytes_per_message"] for r in results)
    epsilons = [e for r in results for e in r["epsilons"]]
    return {
        "variant": variant.name,
        "description": variant.description,
        "seeds": len(results),
        "final_accuracy": round(mean(finals), 4),
        "final_accuracy_sd": round(stdev(finals), 4) if len(finals) > 1 else None,
        "final_accuracy_per_seed": finals,
        "uplink_bytes_per_message": round(per_message, 1),
        "uplink_megabytes": round(mean(r["bytes"] for r in results) / 1e6, 2),
        "bytes_ratio": round(per_message / base_bytes, 4) if base_bytes else 1.0,
        "applied_updates": round(mean(r["row"]["applied_updates"] for r in results), 1),
        "rejected_updates": sum(r["rejected"] for r in results),
        "eps_median": round(sorted(epsilons)[len(epsilons) // 2], 4),
        "eps_max": round(max(epsilons), 4),
    }


def findings(rows: Sequence[dict[str, Any]]) -> list[str]:
    base = next((r for r in rows if r["variant"] == "none"), None)
    if base is None:
        return []
    spread = base["final_accuracy_sd"] or 0.0
    out = []
    for row in rows:
        if row is base:
            continue
        diff = row["final_accuracy"] - base["final_accuracy"]
        verdict = ("within the base's seed spread" if abs(diff) <= max(spread, row["final_accuracy_sd"] or 0.0)
                   else "beyond the seed spread")
        out.append(f"{row['description']}: {100 * row['bytes_ratio']:.1f} % of the base's bytes per "
                   f"uplink message, accuracy {100 * row['final_accuracy']:.1f} % against "
                   f"{100 * base['final_accuracy']:.1f} % ({100 * diff:+.1f} points, {verdict}); "
                   f"median client eps {row['eps_median']:.4g} vs {base['eps_median']:.4g}.")
    return out


def plot(rows: Sequence[dict[str, Any]], path: Path) -> None:
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(6, 4))
    for row in rows:
        ax.errorbar(row["uplink_bytes_per_message"] / 1e3, 100 * row["final_accuracy"],
                    yerr=100 * (row["final_accuracy_sd"] or 0.0), fmt="o", capsize=3)
        ax.annotate(row["variant"], (row["uplink_bytes_per_message"] / 1e3,
                                     100 * row["final_accuracy"]),
                    textcoords="offset points", xytext=(5, 5), fontsize=8)
    ax.set_xscale("log")
    ax.set_xlabel("uplink kB per message (log)")
    ax.set_ylabel("final held-out accuracy (%)")
    ax.set_title("hetero-100: compressed updates at equal eps (3 seeds)")
    save_figure(fig, path)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--virtual-seconds", type=float, default=30.0)
    add_output_arguments(parser, results=RESULTS, plot=PLOT, runs=RUNS)
    args = parser.parse_args(argv)
    if args.seeds < 1:
        parser.error("--seeds must be >= 1")
    horizon = (f"stop.virtual_seconds={args.virtual_seconds:g}",)
    rows: list[dict[str, Any]] = []
    base_bytes: float | None = None
    for variant in VARIANTS:
        results = [measure(variant, run_variant(variant, scenario=SCENARIO, quick=horizon,
                                                out=args.runs / variant.name / f"seed{seed}",
                                                seed=seed))
                   for seed in range(args.seeds)]
        row = row_of(variant, results, base_bytes)
        base_bytes = base_bytes or row["uplink_bytes_per_message"]
        rows.append(row)
    plot(rows, args.plot)
    document = {
        "command": "python benchmarks/papers/compression_study.py",
        "commit": provenance(),
        "notes": [f"scenarios/hetero-100.yaml with its horizon shortened from 600 to "
                  f"{args.virtual_seconds:g} virtual seconds (2 shared cores); every other "
                  "setting as shipped, so each client's noise and budget are the same in every "
                  "variant: equal eps."] + findings(rows),
        "rows": rows,
        "plot": plot_field(args.plot),
    }
    publish(document, args.results / "compression_study.json", page=not args.no_page)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
