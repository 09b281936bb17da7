"""Does a simulation's memory grow with its length? A long message-only run, its size sampled.

``python benchmarks/run_length.py [--clients 200] [--virtual-seconds 1200] [--label L]``

hetero-100 scaled to ``--clients`` clients (``benchmarks/scale.py``'s ``scaled``: batch sizes
1/2/4, IID, without budgets and round limits so that every client trains to the end), its
training replaced by its duration (``message_only``), run for ``--virtual-seconds``. At each
window's end the run records the updates received so far and the process's resident size;
the figure is the slope of resident size against updates over the run's second half (the first
is the start's burst and the allocator's warm-up), in bytes an update. A run's state that grows
with its length shows as a slope; before session 55 every ledger held each of its records and
every client each of its released rounds in memory (about 250 bytes a round).

Run it for another tree side by side with ``FEDSIM_BENCH_TREE=/path/to/tree`` (a
``git worktree`` of an older commit). Appends a row to ``benchmarks/results/run_length.json``.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import commit, rss_mb, write_json  # noqa: E402
from scale import _scratch_dir, scaled  # noqa: E402

from fedsim.config import LoadedScenario, parse_scenario  # noqa: E402
from fedsim.runtime.simulated.simulation import run_scenario  # noqa: E402

RESULT = Path(__file__).resolve().parent / "results" / "run_length.json"


def unbounded(loaded: LoadedScenario) -> LoadedScenario:
    """``loaded`` with no budget and no round limit: every client trains until the stop."""
    tree = loaded.scenario.model_dump(mode="json")
    for group in tree["clients"]["groups"]:
        group["budget"] = None
        group["rounds"] = None
        group.pop("availability", None)
    return LoadedScenario(parse_scenario(tree), loaded.source)


def slope(samples: list[tuple[int, float]]) -> float:
    """Least-squares bytes an update of the second half of ``(updates, rss_mb)`` samples."""
    half = samples[len(samples) // 2:]
    n = len(half)
    mean_x = sum(x for x, _ in half) / n
    mean_y = sum(y for _, y in half) / n
    var = sum((x - mean_x) ** 2 for x, _ in half)
    cov = sum((x - mean_x) * (y - mean_y) for x, y in half)
    return cov / var * 2**20 if var else float("nan")


def measure(clients: int, virtual_seconds: float) -> dict[str, Any]:
    loaded = unbounded(scaled(clients, virtual_seconds, cross_device=False))
    samples: list[tuple[int, float]] = []
    received = 0

    def on_window(line: dict[str, Any]) -> None:
        nonlocal received
        received += int(line["received"])
        samples.append((received, rss_mb()))

    started = time.perf_counter()
    with _scratch_dir() as scratch:
        result = run_scenario(loaded, Path(scratch) / "run", message_only=True,
                              on_window=on_window)
    half = samples[len(samples) // 2]
    return {
        "commit": commit(),
        "clients": clients,
        "virtual_seconds": virtual_seconds,
        "windows": len(samples),
        "updates_received": received,
        "wall_seconds": round(time.perf_counter() - started, 1),
        "cpu_seconds": round(result.cpu_seconds, 1),
        "rss_mb_at_half": round(half[1], 1),
        "rss_mb_at_end": round(samples[-1][1], 1),
        "bytes_per_update_second_half": round(slope(samples), 1),
        "rss_mb_every_tenth": [(x, round(y, 1)) for x, y in samples[:: max(1, len(samples) // 10)]],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--clients", type=int, default=200)
    parser.add_argument("--virtual-seconds", type=float, default=1200.0)
    parser.add_argument("--label", default="")
    args = parser.parse_args()
    row = measure(args.clients, args.virtual_seconds)
    row["label"] = args.label
    print(json.dumps(row))
    rows = json.loads(RESULT.read_text()) if RESULT.exists() else []
    write_json(RESULT, [*rows, row])


if __name__ == "__main__":
    main()
