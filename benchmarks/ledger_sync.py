"""A simulated run's ledgers on a disk: fsynced at every spend against written through and
synced once (fedsim.privacy.ledger, "Durability rule"), side by side.

    python benchmarks/ledger_sync.py --base /path/to/older/checkout [--clients 1000]
        [--virtual-seconds 4] [--repeats 3] [--disk DIR]

Runs hetero-100 scaled to ``--clients`` training clients (benchmarks/scale.py's scenario,
``spy_parts.py run``: the simulation alone, no single loop) from the older checkout and from
this one, alternating, each with its run directory on a disk (``--disk``, default a
temporary directory under the system's, which must not be a tmpfs) and on /dev/shm, and
writes each run's CPU and wall seconds with both commits to
``benchmarks/results/ledger_sync.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
RESULTS = HERE / "results" / "ledger_sync.json"

_DRIVER = """
import sys
from pathlib import Path
sys.path.insert(0, str(Path("benchmarks").resolve()))
import scale
scale.SCRATCH = Path(sys.argv[1])
import spy_parts
spy_parts._run(int(sys.argv[2]), float(sys.argv[3]))
"""


def _commit(tree: Path) -> str:
    return subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=tree, check=True,
                          capture_output=True, text=True).stdout.strip()


def _file_system(path: Path) -> str:
    done = subprocess.run(["stat", "-f", "-c", "%T", str(path)], capture_output=True,
                          text=True, check=False)
    return done.stdout.strip() or "unknown"


def _one(tree: Path, scratch: Path, clients: int, seconds: float) -> dict[str, Any]:
    started = time.perf_counter()
    done = subprocess.run([sys.executable, "-c", _DRIVER, str(scratch), str(clients),
                           str(seconds)], cwd=tree, capture_output=True, text=True,
                          env={**os.environ, "PYTHONPATH": str(tree)}, timeout=3600,
                          check=True)
    row: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    row["wall_seconds"] = round(time.perf_counter() - started, 2)
    row["ms_a_round_cpu"] = round(1e3 * row["cpu_seconds"] / row["rounds"], 4)
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--base", type=Path, required=True, help="an older checkout")
    parser.add_argument("--clients", type=int, default=1000)
    parser.add_argument("--virtual-seconds", type=float, default=4.0)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--disk", type=Path, default=None)
    args = parser.parse_args()
    here = HERE.parent
    trees = {"base": args.base.resolve(), "this": here}
    with tempfile.TemporaryDirectory(dir=args.disk) as disk:
        places = {"disk": Path(disk), "shm": Path("/dev/shm")}
        kinds = {name: _file_system(path) for name, path in places.items()}
        if kinds["disk"] == "tmpfs":
            raise SystemExit(f"{disk} is a tmpfs: give --disk a directory on a disk")
        runs: list[dict[str, Any]] = []
        for repeat in range(args.repeats):
            for place, scratch in places.items():
                order = ("base", "this") if repeat % 2 == 0 else ("this", "base")
                for name in order:
                    row = _one(trees[name], scratch, args.clients, args.virtual_seconds)
                    row.update(tree=name, place=place, repeat=repeat)
                    runs.append(row)
                    print(json.dumps(row), flush=True)
    summary: dict[str, Any] = {}
    for place in places:
        for name in trees:
            mine = [r for r in runs if r["place"] == place and r["tree"] == name]
            summary[f"{place}/{name}"] = {
                "cpu_s": sorted(r["cpu_seconds"] for r in mine),
                "wall_s": sorted(r["wall_seconds"] for r in mine),
                "ms_a_round_cpu": sorted(r["ms_a_round_cpu"] for r in mine)}
    entry = {"base": _commit(trees["base"]), "this": _commit(here),
             "clients": args.clients, "virtual_seconds": args.virtual_seconds,
             "file_systems": kinds, "summary": summary, "runs": runs,
             "date": time.strftime("%Y-%m-%d")}
    history: list[dict[str, Any]] = (json.loads(RESULTS.read_text(encoding="utf-8"))
                                     if RESULTS.exists() else [])
    history.append(entry)
    RESULTS.write_text(json.dumps(history, indent=1) + "\n", encoding="utf-8")
    print(json.dumps(summary, indent=1))


if __name__ == "__main__":
    main()
