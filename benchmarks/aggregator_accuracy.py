"""Final accuracy of a deployed 10-client run over a real mosquitto, flat against 2 aggregators
(issue 26: "reaches the same final accuracy as flat within the seed spread").

The scenario is the deployment tests' (tests/deployment/four_clients.yaml: logistic regression
on a synthetic problem, 24 windows of 1 scenario second) with 10 clients, launched with
``fedsim launch`` (its own mosquitto on a free loopback port, every client, the server and the
aggregators separate processes) at ``--time-scale 0.25``, for each seed with ``--aggregators 0``
and ``--aggregators 2``, alternating. Reported: each run's final accuracy and applied updates,
and per arm the mean and the sample standard deviation over the seeds.

    python benchmarks/aggregator_accuracy.py [--seeds 1,2,3]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import commit, write_json  # noqa: E402
from _mqtt_tier import child_env  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
SCENARIO = ROOT / "tests" / "deployment" / "four_clients.yaml"
RESULTS = Path(__file__).resolve().parent / "results" / "aggregator_accuracy.json"


def _launch(seed: int, aggregators: int, clients: int, timeout: float) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "run"
        command = [sys.executable, "-m", "fedsim", "launch", str(SCENARIO),
                   "--aggregators", str(aggregators), "--out", str(out),
                   "--time-scale", "0.25", "--max-backoff", "1", "--no-plots",
                   "--timeout", str(timeout), "--log-level", "error",
                   "--set", f"seed={seed}", "--set", f"clients.groups[0].count={clients}",
                   "--set", "name=accuracy"]
        done = subprocess.run(command, env=child_env(), capture_output=True, text=True,
                              timeout=timeout + 120, check=False)
        if done.returncode != 0:
            raise RuntimeError(f"launch failed ({done.returncode}): {done.stderr[-2000:]}")
        summary = json.loads((out / "summary.json").read_text())
    return {"seed": seed, "aggregators": aggregators,
            "final_accuracy": summary["final_accuracy"],
            "applied": summary["updates"]["applied"], "windows": summary["windows"]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", default="1,2,3")
    parser.add_argument("--clients", type=int, default=10)
    parser.add_argument("--timeout", type=float, default=300.0)
    args = parser.parse_args()
    runs: dict[int, list[dict]] = {0: [], 2: []}
    for index, seed in enumerate(int(s) for s in args.seeds.split(",")):
        for k in ((0, 2) if index % 2 == 0 else (2, 0)):
            row = _launch(seed, k, args.clients, args.timeout)
            runs[k].append(row)
            print(json.dumps(row), flush=True)
    arms = {}
    for k, rows in runs.items():
        accuracies = [r["final_accuracy"] for r in rows]
        arms[str(k)] = {"mean": statistics.mean(accuracies),
                        "stdev": statistics.stdev(accuracies) if len(accuracies) > 1 else None,
                        "min": min(accuracies), "max": max(accuracies), "runs": rows}
    gap = abs(arms["2"]["mean"] - arms["0"]["mean"])
    spread = max(s for s in (arms["0"]["stdev"], arms["2"]["stdev"]) if s is not None) \
        if len(runs[0]) > 1 else None
    document = {"benchmark": "aggregator_accuracy", "commit": commit(),
                "scenario": "tests/deployment/four_clients.yaml", "clients": args.clients,
                "time_scale": 0.25, "by_aggregators": arms,
                "mean_gap": gap, "largest_seed_stdev": spread,
                "within_seed_spread": None if spread is None else gap <= spread,
                "machine": {"cpus": os.cpu_count(), "python": platform.python_version(),
                            "loadavg": [round(x, 2) for x in os.getloadavg()]}}
    print(json.dumps({k: v for k, v in document.items() if k != "by_aggregators"}))
    write_json(RESULTS, document)


if __name__ == "__main__":
    main()
