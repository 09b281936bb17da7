"""Per-sample fast paths against the torch.func fallback, side by side on the same model.

For each model the same :class:`~fedsim.training.persample.PerSampleEngine` computation (one
physical batch: per-example norms, clipping, the clipped sum) runs twice in one process: with
the layers' fast rules (``fast``) and with every parameter sent through the ``torch.func``
fallback (``functional_call`` + ``vmap`` + ``grad``, ``fallback``). Blocks of the two
alternate and ``fallback_over_fast`` is the median ratio of adjacent blocks (the machine is
shared: adjacent blocks see the same load), so it is a ratio, not a bare time. Both paths'
norms and clipped sums are compared first (``max_rel_diff``): a benchmark of a wrong result
is worthless.

Models (one per fast rule, plus one where a layer has no fast rule):

* ``mlp``: Linear 784-256-10 (203k parameters);
* ``dp_mnist_cnn``: Conv2d x2 + Linear x2 (26k);
* ``groupnorm_cnn``: Conv2d + GroupNorm x3 + Linear on 3x32x32 (width 16);
* ``text``: Embedding 5000x64 + LayerNorm + Linear on 32 tokens;
* ``cnn_prelu``: the DP MNIST CNN with PReLU activations, whose parameters only the fallback
  handles: ``fast`` is then fast rules plus the fallback for the PReLUs alone.

Writes benchmarks/results/persample_paths.json: {batch, threads, device, torch, rows: [{model,
params, fast_ms, fallback_ms, fallback_over_fast, max_rel_diff}]}.

    python benchmarks/persample_paths.py            # batch 128, ~4 s per model
    python benchmarks/persample_paths.py --quick    # short blocks, not written
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import _common  # noqa: F401 - first: this checkout's fedsim on sys.path (see _common)
import torch
from torch import nn

from fedsim.training.models import build_model
from fedsim.training.persample import PerSampleEngine

ROOT = Path(__file__).resolve().parents[1]
CLIP = 1.0


def _cnn_prelu() -> nn.Module:
    return nn.Sequential(
        nn.Conv2d(1, 16, 8, stride=2, padding=3),
        nn.PReLU(16),
        nn.MaxPool2d(2, 1),
        nn.Conv2d(16, 32, 4, stride=2),
        nn.PReLU(32),
        nn.MaxPool2d(2, 1),
        nn.Flatten(),
        nn.Linear(32 * 4 * 4, 32),
        nn.PReLU(),
        nn.Linear(32, 10),
    )


class _Text(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embedding = nn.Embedding(5000, 64)
        self.norm = nn.LayerNorm(64)
        self.head = nn.Linear(64, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(torch.tanh(self.norm(self.embedding(x))).mean(1))


MODELS: dict[str, tuple[Callable[[], nn.Module], Callable[[int], torch.Tensor]]] = {
    "mlp": (lambda: build_model("mlp", hidden=(256,)), lambda b: torch.rand(b, 1, 28, 28)),
    "dp_mnist_cnn": (lambda: build_model("dp_mnist_cnn"), lambda b: torch.rand(b, 1, 28, 28)),
    "groupnorm_cnn": (
        lambda: build_model("groupnorm_cnn", width=16, groups=4),
        lambda b: torch.rand(b, 3, 32, 32),
    ),
    "text": (_Text, lambda b: torch.randint(0, 5000, (b, 32))),
    "cnn_prelu": (_cnn_prelu, lambda b: torch.rand(b, 1, 28, 28)),
}


def _block_time(step: Callable[[], Any], block: int) -> float:
    started = time.perf_counter()
    for _ in range(block):
        step()
    return (time.perf_counter() - started) / block


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def measure(name: str, batch: int, seconds: float, device: torch.device) -> dict[str, Any]:
    """Both paths on one model and one batch; the median ratio of adjacent blocks."""
    make, draw = MODELS[name]
    torch.manual_seed(0)
    model = make().to(device)
    x, y = draw(batch).to(device), torch.randint(0, 10, (batch,), device=device)
    fast, fallback = PerSampleEngine(model), PerSampleEngine(model, fast_paths=False)
    a, b = fast.clipped_sum(x, y, CLIP), fallback.clipped_sum(x, y, CLIP)  # also warms up
    diff = max(
        float((a.norms - b.norms).abs().max() / b.norms.abs().max()),
        float((a.flat_sum - b.flat_sum).norm() / b.flat_sum.norm()),
    )

    def run(engine: PerSampleEngine) -> Callable[[], None]:
        def step() -> None:
            engine.clipped_sum(x, y, CLIP)
            _sync(device)

        return step

    steps = {"fast": run(fast), "fallback": run(fallback)}
    blocks = {k: max(1, min(50, int(0.3 / max(_block_time(s, 1), 1e-6)))) for k, s in steps.items()}
    times: dict[str, list[float]] = {"fast": [], "fallback": []}
    ratios: list[float] = []
    deadline = time.perf_counter() + seconds
    while len(ratios) < 3 or (time.perf_counter() < deadline and len(ratios) < 30):
        for key, step in steps.items():
            times[key].append(_block_time(step, blocks[key]))
        ratios.append(times["fallback"][-1] / times["fast"][-1])
    return {
        "model": name,
        "params": fast.num_params,
        "fallback_parameters_in_fast": len(fast.fallback_parameters),
        "fast_ms": round(1e3 * statistics.median(times["fast"]), 3),
        "fallback_ms": round(1e3 * statistics.median(times["fallback"]), 3),
        "fallback_over_fast": round(statistics.median(ratios), 2),
        "ratio_min_max": [round(min(ratios), 2), round(max(ratios), 2)],
        "max_rel_diff": float(f"{diff:.2e}"),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="short timing, nothing written")
    parser.add_argument("--batch", type=int, default=128)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--seconds", type=float, default=4.0, help="timing budget per model")
    parser.add_argument("--models", default=",".join(MODELS))
    parser.add_argument("--device", default="cpu")
    parser.add_argument(
        "--out", default=str(ROOT / "benchmarks" / "results" / "persample_paths.json")
    )
    args = parser.parse_args(argv)
    if args.quick:
        args.seconds = 0.5
    torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    rows = []
    for name in args.models.split(","):
        row = measure(name, args.batch, args.seconds, device)
        rows.append(row)
        print(json.dumps(row), flush=True)
    result = {
        "batch": args.batch,
        "threads": args.threads,
        "device": str(device),
        "torch": torch.__version__,
        "rows": rows,
    }
    if not args.quick:
        Path(args.out).write_text(json.dumps(result, indent=2) + "\n")
        print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
