"""A simulated run's ledgers on a disk: fsynced at every spend against written through and
synced once (fedsim.privacy.ledger, "Durability rule"), side by side.

    python benchmarks/ledger_sync.py --base /path/to/older/checkout [--clients 1000]
        [--mode train|message] [--virtual-seconds 4] [--repeats 3] [--disk DIR]
        [--places disk,shm]

Runs hetero-100 scaled to ``--clients`` clients (benchmarks/scale.py's scenario: training
clients, or with ``--mode message`` its cross-device message-only form; the simulation alone,
no single loop) from the older checkout and from this one, alternating, each with its run
directory on a disk (``--disk``, default a temporary directory under the system's, which must
not be a tmpfs) and on /dev/shm, and writes each run's seconds with both commits to
``benchmarks/results/ledger_sync.json``: ``cpu_seconds``, the process's CPU during the
simulation (``RunResult.cpu_seconds``); ``run_cpu_seconds`` and ``run_wall_seconds``, the
process's user and system CPU and the wall time of the whole ``run_scenario`` (set-up, the
final sync, the outputs); ``wall_seconds``, the subprocess's (with the population's build).
``updates`` counts the updates the server received.
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
import json, resource, sys, time
from pathlib import Path
sys.path.insert(0, str(Path("benchmarks").resolve()))
import torch
import scale
scale.SCRATCH = Path(sys.argv[1])
clients, seconds, message = int(sys.argv[2]), float(sys.argv[3]), sys.argv[4] == "message"
torch.set_num_threads(1)
loaded = scale.scaled(clients, seconds, cross_device=message)
population = scale.build_population(loaded)
with scale._scratch_dir() as scratch:
    before, started = resource.getrusage(resource.RUSAGE_SELF), time.perf_counter()
    result = scale.run_scenario(loaded, Path(scratch) / "run", population=population,
                                message_only=message)
    wall, after = time.perf_counter() - started, resource.getrusage(resource.RUSAGE_SELF)
cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
print(json.dumps({"clients": clients, "virtual_seconds": seconds,
                  "mode": "message" if message else "train",
                  "cpu_seconds": round(result.cpu_seconds, 3),
                  "run_cpu_seconds": round(cpu, 3), "run_wall_seconds": round(wall, 3),
                  "updates": result.summary["updates"]["received"]}))
"""


def _commit(tree: Path) -> str:
    return subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=tree, check=True,
                          capture_output=True, text=True).stdout.strip()


def _file_system(path: Path) -> str:
    done = subprocess.run(["stat", "-f", "-c", "%T", str(path)], capture_output=True,
                          text=True, check=False)
    return done.stdout.strip() or "unknown"


def _one(tree: Path, scratch: Path, clients: int, seconds: float, mode: str) -> dict[str, Any]:
    started = time.perf_counter()
    done = subprocess.run([sys.executable, "-c", _DRIVER, str(scratch), str(clients),
                           str(seconds), mode], cwd=tree, capture_output=True, text=True,
                          env={**os.environ, "PYTHONPATH": str(tree)}, timeout=3600,
                          check=True)
    row: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    row["wall_seconds"] = round(time.perf_counter() - started, 2)
    row["ms_an_update_cpu"] = round(1e3 * row["run_cpu_seconds"] / row["updates"], 4)
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--base", type=Path, required=True, help="an older checkout")
    parser.add_argument("--clients", type=int, default=1000)
    parser.add_argument("--mode", choices=("train", "message"), default="train")
    parser.add_argument("--places", default="disk,shm")
    parser.add_argument("--virtual-seconds", type=float, default=4.0)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--disk", type=Path, default=None)
    args = parser.parse_args()
    here = HERE.parent
    trees = {"base": args.base.resolve(), "this": here}
    with tempfile.TemporaryDirectory(dir=args.disk) as disk:
        places = {name: path for name, path in
                  (("disk", Path(disk)), ("shm", Path("/dev/shm")))
                  if name in args.places.split(",")}
        kinds = {name: _file_system(path) for name, path in places.items()}
        if kinds.get("disk") == "tmpfs":
            raise SystemExit(f"{disk} is a tmpfs: give --disk a directory on a disk")
        runs: list[dict[str, Any]] = []
        for repeat in range(args.repeats):
            for place, scratch in places.items():
                order = ("base", "this") if repeat % 2 == 0 else ("this", "base")
                for name in order:
                    row = _one(trees[name], scratch, args.clients, args.virtual_seconds,
                               args.mode)
                    row.update(tree=name, place=place, repeat=repeat)
                    runs.append(row)
                    print(json.dumps(row), flush=True)
    summary: dict[str, Any] = {}
    for place in places:
        for name in trees:
            mine = [r for r in runs if r["place"] == place and r["tree"] == name]
            summary[f"{place}/{name}"] = {
                key: sorted(r[key] for r in mine)
                for key in ("cpu_seconds", "run_cpu_seconds", "run_wall_seconds",
                            "wall_seconds", "ms_an_update_cpu")}
    entry = {"base": _commit(trees["base"]), "this": _commit(here),
             "clients": args.clients, "mode": args.mode,
             "virtual_seconds": args.virtual_seconds,
             "file_systems": kinds, "summary": summary, "runs": runs,
             "date": time.strftime("%Y-%m-%d")}
    history: list[dict[str, Any]] = (json.loads(RESULTS.read_text(encoding="utf-8"))
                                     if RESULTS.exists() else [])
    history.append(entry)
    RESULTS.write_text(json.dumps(history, indent=1) + "\n", encoding="utf-8")
    print(json.dumps(summary, indent=1))


if __name__ == "__main__":
    main()
