"""How many rounds deployed clients release under ``interrupt: switch`` against the simulation.

    python benchmarks/deployed_switch.py [--time-scale 1.0] [--label NAME]

Runs ``benchmarks/scenarios/fedasync-five.yaml`` (four fast clients, one slow one, FedAsync:
a model about every 40 ms) with ``fedsim run`` and with ``fedsim launch`` (a private mosquitto
broker on 127.0.0.1: mosquitto must be installed), and records each client's released rounds,
the final accuracy, the rounds a model's arrival moved a slot on (``split_delays``), the
overruns and the launch's CPU seconds in ``benchmarks/results/deployed_switch.json`` under
``--label`` with the commit (docs/DEPLOYMENT.md's table). ``FEDSIM_BENCH_TREE=DIR`` measures
another checkout's fedsim (its runs import it).
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import FEDSIM_TREE, commit  # noqa: E402

HERE = Path(__file__).resolve().parent
SCENARIO = HERE / "scenarios" / "fedasync-five.yaml"
RESULTS = HERE / "results" / "deployed_switch.json"


def _outcome(out: Path) -> dict[str, Any]:
    summary = json.loads((out / "summary.json").read_text())
    with (out / "clients.csv").open(newline="") as handle:
        rounds = {row["client_id"]: int(row["rounds"]) for row in csv.DictReader(handle)}
    result: dict[str, Any] = {"final_accuracy": summary["final_accuracy"], "rounds": rounds}
    reports = sorted((out / "state").glob("*/client-*.json")) if (out / "state").exists() else []
    if reports:
        parsed = [json.loads(r.read_text()) for r in reports]
        result["split_delays"] = sum(int(r.get("split_delays", 0)) for r in parsed)
        result["timing_overruns"] = sum(int(r.get("timing_overruns", 0)) for r in parsed)
        result["cpu_seconds"] = json.loads((out / "timing.json").read_text())["cpu_seconds"]
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--time-scale", type=float, default=1.0)
    parser.add_argument("--label", default="this tree")
    args = parser.parse_args()
    # The runs import the measured tree's fedsim (FEDSIM_BENCH_TREE, as _common does).
    env = {**os.environ, "PYTHONPATH": str(FEDSIM_TREE)}
    with tempfile.TemporaryDirectory() as scratch:
        simulated, launched = Path(scratch) / "run", Path(scratch) / "launch"
        subprocess.run([sys.executable, "-m", "fedsim", "run", str(SCENARIO), "--out",
                        str(simulated), "-q", "--no-plots"], check=True, env=env,
                       cwd=FEDSIM_TREE, stdout=subprocess.DEVNULL)
        subprocess.run([sys.executable, "-m", "fedsim", "launch", str(SCENARIO), "--out",
                        str(launched), "-q", "--no-plots", "--time-scale",
                        str(args.time_scale)], check=True, timeout=600, env=env,
                       cwd=FEDSIM_TREE, stdout=subprocess.DEVNULL)
        row = {"label": args.label, "commit": commit(), "time_scale": args.time_scale,
               "simulated": _outcome(simulated), "launched": _outcome(launched)}
    print(json.dumps(row))
    rows = json.loads(RESULTS.read_text())["rows"] if RESULTS.exists() else []
    RESULTS.write_text(json.dumps({"scenario": str(SCENARIO.relative_to(HERE.parent)),
                                   "rows": [*rows, row]}, indent=2) + "\n")


if __name__ == "__main__":
    main()
