"""Simulator throughput: how much of the machine goes into training, and how fast the protocol
alone runs.

1. ``hetero-100`` with training on: per-sample gradients per second over the whole
   simulation (actors, network, codec, ledgers, mixing, evaluation included), against the plain
   single-client DP-SGD loop (:class:`fedsim.training.LocalTrainer`, same model, one thread)
   run over the same number of samples in the same process - group by group, with each
   group's batch size and posture, so that the ratio measures the simulator and not the cost
   of small batches. Target: ratio >= 0.9.
2. A message-only run: ``hetero-100`` scaled to 1000 cross-device clients (a round takes
   minutes; the server closes a window every minute and broadcasts every five), training
   replaced by its virtual duration (zero updates, the same privacy events and ledger writes).
   Target: >= 1000 simulated seconds per wall second.

Run directories go to a temporary directory in memory (/dev/shm when present): the ledgers'
fsyncs measure the disk, not the simulator. Throughputs are given per CPU second of this
process (the headline ratio) and per wall second (``*_wall``): on a machine shared with other
work, wall time mostly measures the neighbours.

    python benchmarks/simulator.py [--quick]

writes ``benchmarks/results/simulator.json``.
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

from fedsim.config import LoadedScenario, load_scenario, parse_scenario
from fedsim.logging import configure_logging
from fedsim.runtime.simulation import build_population, run_scenario

REPO = Path(__file__).resolve().parents[1]
RESULTS = REPO / "benchmarks" / "results" / "simulator.json"


def _scratch() -> tempfile.TemporaryDirectory[str]:
    shm = Path("/dev/shm")
    return tempfile.TemporaryDirectory(dir=shm if shm.is_dir() else None, prefix="fedsim-bench-")


def _with(loaded: LoadedScenario, changes: dict) -> LoadedScenario:
    tree = loaded.scenario.model_dump(mode="json")
    for path, value in changes.items():
        node = tree
        *parents, leaf = path.split(".")
        for part in parents:
            node = node[int(part)] if part.isdigit() else node[part]
        node[int(leaf) if leaf.isdigit() else leaf] = value
    return LoadedScenario(parse_scenario(tree, base_dir=loaded.base_dir), loaded.source)


def training_throughput(virtual_seconds: float) -> dict:
    loaded = _with(
        load_scenario(REPO / "scenarios" / "hetero-100.yaml"),
        {"stop.virtual_seconds": virtual_seconds},
    )
    population = build_population(loaded)
    with _scratch() as scratch:
        result = run_scenario(loaded, Path(scratch) / "run", population=population)
    simulated_wall = result.sample_grads / result.wall_seconds
    simulated_cpu = result.sample_grads / result.cpu_seconds

    # The plain loop: one client at a time, the same model object, each group's own batch
    # size and posture, over as many per-sample gradients as that group computed in the
    # simulation - the same arithmetic without the federation around it.
    per_group: dict[str, int] = {}
    for client in result.clients.values():
        name = client.plan.group.name
        per_group[name] = per_group.get(name, 0) + sum(r.sample_grads for r in client.released_rounds())
    done = 0
    single_wall_seconds = single_cpu_seconds = 0.0
    for name, target in per_group.items():
        plan = next(p for p in population.plans if p.group.name == name)
        trainer = population.trainer(plan)
        params = population.initial_params.copy()
        group_done, round_index = 0, 0
        started, cpu_started = time.perf_counter(), time.process_time()
        while group_done < target:
            update = trainer.run_round(params, round_index)
            params = params - np.float32(plan.group.local_lr) * update.update
            group_done += update.sample_grads
            round_index += 1
        single_wall_seconds += time.perf_counter() - started
        single_cpu_seconds += time.process_time() - cpu_started
        done += group_done
    single_wall = done / single_wall_seconds
    single_cpu = done / single_cpu_seconds
    return {
        "clients": len(population.plans),
        "virtual_seconds": result.summary["virtual_time"],
        "sample_grads": result.sample_grads,
        "wall_seconds": result.wall_seconds,
        "cpu_seconds": result.cpu_seconds,
        # Headline numbers use CPU time: on a shared machine wall time measures the neighbours.
        "sample_grads_per_s": simulated_cpu,
        "single_loop_sample_grads_per_s": single_cpu,
        "ratio": simulated_cpu / single_cpu,
        "sample_grads_per_wall_s": simulated_wall,
        "single_loop_sample_grads_per_wall_s": single_wall,
        "ratio_wall": simulated_wall / single_wall,
        "final_accuracy": result.summary["final_accuracy"],
    }


def message_only_throughput(clients: int, virtual_seconds: float) -> dict:
    """``hetero-100``'s postures, network and model, scaled to ``clients`` cross-device
    clients: a phone-class device computes ~10 s per sample gradient (a round of 16-64
    samples takes minutes), the server closes a window every minute and broadcasts every five.
    Training is replaced by its virtual duration; ledgers, codec and network run for real."""
    base = load_scenario(REPO / "scenarios" / "hetero-100.yaml")
    tree = base.scenario.model_dump(mode="json")
    groups = tree["clients"]["groups"]
    scale = clients / sum(g["count"] for g in groups)
    for group in groups:
        group["count"] = max(1, round(group["count"] * scale))
        group["speed"] = {"kind": "lognormal", "median": 10.0, "sigma": 0.5}
        group.pop("availability", None)
        group["partition"] = {"scheme": "iid"}  # ten times more clients: keep every one >= m
    groups[-1]["count"] += clients - sum(g["count"] for g in groups)
    tree["stop"] = {"virtual_seconds": virtual_seconds}
    tree["server"].update(window=60.0, broadcast_every=5)
    loaded = LoadedScenario(parse_scenario(tree, base_dir=base.base_dir), base.source)
    with _scratch() as scratch:
        result = run_scenario(loaded, Path(scratch) / "run", message_only=True)
    return {
        "message_only_clients": sum(g["count"] for g in groups),
        "message_only_virtual_seconds": result.summary["virtual_time"],
        "message_only_wall_seconds": result.wall_seconds,
        "message_only_cpu_seconds": result.cpu_seconds,
        "message_only_updates": result.summary["updates"]["received"],
        "simulated_s_per_wall_s": result.summary["virtual_time"] / result.wall_seconds,
        "simulated_s_per_cpu_s": result.summary["virtual_time"] / result.cpu_seconds,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="short runs (smoke test)")
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args()
    torch.set_num_threads(1)
    configure_logging(level="warning")
    training = training_throughput(20.0 if args.quick else 60.0)
    print(json.dumps(training, indent=2), file=sys.stderr)
    messages = message_only_throughput(1000, 1800.0 if args.quick else 7200.0)
    result = {
        "clients": training["clients"],
        "sample_grads_per_s": training["sample_grads_per_s"],
        "single_loop_sample_grads_per_s": training["single_loop_sample_grads_per_s"],
        "ratio": training["ratio"],
        "message_only_clients": messages["message_only_clients"],
        "simulated_s_per_wall_s": messages["simulated_s_per_wall_s"],
        "details": {**training, **messages},
        "targets": {"ratio": 0.9, "simulated_s_per_wall_s": 1000.0},
        "quick": args.quick,
        "machine": {
            "python": platform.python_version(),
            "torch": torch.__version__,
            "threads": torch.get_num_threads(),
        },
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n", encoding="utf-8")
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
