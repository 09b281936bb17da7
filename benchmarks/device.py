"""The simulator on a GPU: per-sample gradients per second of a whole simulation against a
plain (non-private) training loop on the same device.

* ``simulation``: a federated scenario (synthetic 784-feature, 10-class data, so nothing is
  downloaded; an MLP 784-256-10; 40 clients in two groups with Poisson batches of 64 and 128,
  clip 1, sigma 1.1; overlapping rounds computed together by the batched pass) run by
  :func:`fedsim.runtime.simulated.simulation.run_scenario` with ``device`` set; the rate is the run's
  released sample gradients over its wall time (actors, ledgers, codec, evaluation included).
* ``plain``: the same model on the same device, mean cross-entropy, ``backward()`` and an SGD
  step on batches of the simulation's mean batch size, data already on the device, one torch
  thread (as the simulation's ``torch_threads``); timed after a warm-up, with the device
  synchronised before each clock read.

``ratio`` = simulation rate / plain rate. ``--profile DIR`` instead profiles the simulation
(8 virtual seconds after a 1-second warm-up) and writes ``cprofile_<device>.txt`` (Python's
cProfile, by own and by cumulative time) and ``torchprof_<device>.txt`` (torch.profiler's
operators and runtime calls of a 2-second run) into DIR: the profiles in
``benchmarks/results/device_profile/`` were made so. Where no GPU is present (``--device auto`` finds
neither CUDA nor MPS), nothing is measured: the result says so, unless the output file already
holds a measurement, which is kept (a run on a machine without a GPU does not erase the figures
a GPU gave). ``--device cpu`` measures the
CPU path the same way (for comparison; the result names the device).

    python benchmarks/device.py [--device auto|cuda|mps|cpu] [--quick] [--out FILE]
    python benchmarks/device.py --device cuda --profile DIR

writes ``benchmarks/results/device.json`` (default).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import provenance, write_json  # noqa: E402

RESULTS = REPO / "benchmarks" / "results" / "device.json"


def scenario(device: str, virtual_seconds: float) -> dict[str, Any]:
    def group(name: str, count: int, batch: int, speed: float) -> dict[str, Any]:
        return {"name": name, "count": count, "data_share": 0.5, "batch_size": batch,
                "sampling": "poisson", "clip": 1.0, "noise": {"sigma": 1.1}, "local_lr": 0.5,
                "speed": speed, "staleness": {"max_versions_behind": 8}}

    return {
        "name": "device-benchmark", "seed": 0, "device": device,
        "stop": {"virtual_seconds": virtual_seconds},
        "dataset": {"name": "synthetic", "num_samples": 40_000, "num_test_samples": 2000,
                    "num_features": 784, "num_classes": 10},
        "model": {"name": "mlp", "options": {"hidden": [256]}},
        "clients": {"groups": [group("small", 20, 64, 0.002), group("large", 20, 128, 0.001)]},
        "server": {"window": 0.5, "mixing": "data_size", "eval_every": 20},
    }


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    elif device.type == "mps":
        torch.mps.synchronize()


def simulate(device: str, virtual_seconds: float) -> Any:
    """The benchmark's scenario run on ``device`` for ``virtual_seconds`` (its run directory
    a temporary one): the simulation's result."""
    from fedsim.config import LoadedScenario, parse_scenario
    from fedsim.runtime.simulated.simulation import run_scenario

    loaded = LoadedScenario(parse_scenario(scenario(device, virtual_seconds)), None)
    with tempfile.TemporaryDirectory(prefix="fedsim-device-") as out:
        return run_scenario(loaded, Path(out) / "run")


def simulation_rate(device: str, virtual_seconds: float) -> dict[str, Any]:
    result = simulate(device, virtual_seconds)
    return {"sample_grads": result.sample_grads, "wall_seconds": result.wall_seconds,
            "sample_grads_per_s": result.sample_grads / result.wall_seconds,
            "final_accuracy": result.summary["final_accuracy"]}


def profile(device: str, folder: Path) -> None:
    """cProfile of a simulation and torch.profiler's table of a shorter one, into ``folder``."""
    import cProfile
    import io
    import pstats

    from torch.profiler import ProfilerActivity
    from torch.profiler import profile as torch_profile

    folder.mkdir(parents=True, exist_ok=True)
    simulate(device, 1.0)  # warm-up: kernels loaded, caches made
    profiler = cProfile.Profile()
    started = time.perf_counter()
    profiler.enable()
    result = simulate(device, 8.0)
    profiler.disable()
    wall = time.perf_counter() - started
    text = io.StringIO()
    stats = pstats.Stats(profiler, stream=text)
    stats.sort_stats("tottime").print_stats(45)
    stats.sort_stats("cumulative").print_stats(60)
    (folder / f"cprofile_{device}.txt").write_text(
        f"wall {wall:.2f} grads {result.sample_grads}\n" + text.getvalue())
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device == "cuda" else [])
    with torch_profile(activities=activities) as traced:
        simulate(device, 2.0)
    (folder / f"torchprof_{device}.txt").write_text(
        traced.key_averages().table(sort_by="self_cpu_time_total", row_limit=50))
    print(f"wrote {folder}/cprofile_{device}.txt and torchprof_{device}.txt")


def plain_rate(device: torch.device, batch: int, seconds: float) -> dict[str, Any]:
    from fedsim.training import build_model

    torch.set_num_threads(1)  # as the simulation (the scenario's torch_threads: 1)
    torch.manual_seed(0)
    model = build_model("mlp", in_features=784, hidden=[256], num_classes=10).to(device)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    x = torch.rand(batch, 784, device=device)
    y = torch.randint(0, 10, (batch,), device=device)

    def step() -> None:
        optimizer.zero_grad(set_to_none=True)
        torch.nn.functional.cross_entropy(model(x), y).backward()
        optimizer.step()

    for _ in range(20):
        step()
    _sync(device)
    steps, started = 0, time.perf_counter()
    while time.perf_counter() - started < seconds:
        for _ in range(20):
            step()
        steps += 20
        _sync(device)
    wall = time.perf_counter() - started
    return {"batch": batch, "steps": steps, "wall_seconds": wall,
            "sample_grads_per_s": steps * batch / wall}


def _holds_a_measurement(path: Path) -> bool:
    """Whether ``path`` holds this benchmark's result of a measured run."""
    try:
        return bool(json.loads(path.read_text(encoding="utf-8")).get("measured"))
    except (OSError, ValueError, AttributeError):
        return False


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="auto", choices=("auto", "cuda", "mps", "cpu"))
    parser.add_argument("--quick", action="store_true", help="a short run (plumbing check)")
    parser.add_argument("--out", type=Path, default=RESULTS)
    parser.add_argument("--profile", type=Path, default=None, metavar="DIR",
                        help="profile the simulation into DIR instead of measuring rates")
    args = parser.parse_args(argv)
    from fedsim.training.devices import Accelerators, resolve_device

    present = Accelerators.detect()
    device = resolve_device(args.device, present=present)
    base: dict[str, Any] = {
        "benchmark": "device", "commit": provenance(), "loadavg_start": list(os.getloadavg()),
        "torch": torch.__version__, "torch_cuda": torch.version.cuda,
        "machine": platform.machine(), "requested": args.device,
        "cuda_available": present.cuda, "mps_available": present.mps,
    }
    if device.type == "cpu" and args.device == "auto":
        reason = (f"no GPU here: torch {torch.__version__} (CUDA build: {torch.version.cuda}) "
                  "finds neither CUDA nor MPS; nothing measured")
        print(reason)
        if _holds_a_measurement(args.out):
            print(f"kept {args.out}: it holds a measurement (a run without a GPU does not "
                  "erase one made with a GPU)")
        else:
            write_json(args.out, {**base, "device": None, "measured": False, "reason": reason})
        return 0
    if args.profile is not None:
        profile(device.type, args.profile)
        return 0
    name = (torch.cuda.get_device_name(device) if device.type == "cuda" else device.type)
    virtual = 4.0 if args.quick else 40.0
    sim = simulation_rate(device.type, virtual)
    plain = plain_rate(device, batch=96, seconds=2.0 if args.quick else 10.0)
    ratio = sim["sample_grads_per_s"] / plain["sample_grads_per_s"]
    document = {**base, "device": device.type, "device_name": name, "measured": True,
                "quick": args.quick, "simulation": sim, "plain": plain, "ratio": ratio,
                "loadavg_end": list(os.getloadavg())}
    print(json.dumps({"device": name, "ratio": round(ratio, 4),
                      "simulation_per_s": round(sim["sample_grads_per_s"]),
                      "plain_per_s": round(plain["sample_grads_per_s"])}))
    write_json(args.out, document)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
