"""What computing a deployed round paced costs, against the plain path's compute.

    python benchmarks/round_kept_sums.py [--rounds 200]

A deployed client under ``interrupt: switch`` computes each round paced: an eighth of a local
step at a time as its slot passes, keeping the step's clipped sum
(:mod:`fedsim.training.kept_sums`), so that a model arriving mid-round never has a record
computed again and the release keeps its time. For the quickstart's MNIST MLP (784-64-10) at
its groups' batch sizes (128, 200, 300, Poisson), one thread, this times per round, in turns:

* ``whole``: the plain path's compute (``PendingRound.result``), what a round costs unsplit;
* ``whole_split``: after that, a model arriving half way and the round computed again whole
  (what the rule before paced rounds cost a split round, on top of ``whole``);
* ``paced``: the same round computed in eighths (``keep_sums``, ``advance`` at each point,
  the model arriving half way), then its result;
* ``kept``: the round computed at once keeping its sum (one pass, as a direct caller may).

Medians of the rounds' CPU milliseconds, in ``benchmarks/results/round_kept_sums.json`` with
the commit.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import commit  # noqa: E402

RESULTS = Path(__file__).resolve().parent / "results" / "round_kept_sums.json"


def _trainer(batch: int, seed: int):  # noqa: ANN202 - a LocalTrainer
    from fedsim.privacy import schedules
    from fedsim.training import LocalTrainer, build_model

    torch.manual_seed(0)
    model = build_model("mlp", in_features=784, num_classes=10, hidden=[64])
    records = 6_000
    generator = torch.Generator().manual_seed(seed)
    x = torch.rand(records, 784, generator=generator)
    y = torch.randint(0, 10, (records,), generator=generator)
    return model, LocalTrainer(model, x, y, batch_size=batch, sampling="poisson",
                               clip=schedules.constant(10_000, 1.0, 1.0),
                               noise=schedules.constant(10_000, 1.0, 1.0), local_lr=0.1,
                               generator=generator)


def _cpu(action) -> float:  # noqa: ANN001 - a callable
    start = time.process_time()
    action()
    return time.process_time() - start


def _paced(pending, w1: np.ndarray) -> None:  # noqa: ANN001 - a PendingRound
    """The round as a deployed client computes it: eighths, a model arriving half way."""
    points = pending.keep_sums()
    for point in range(points):
        pending.advance((point + 1) / points)
        if point + 1 == points // 2:
            pending.switch(0.5 + 1 / points, w1)
    pending.result()


def measure(batch: int, rounds: int) -> dict[str, float]:
    from fedsim.training import flat_params

    model, trainer = _trainer(batch, 1)
    w0 = flat_params(model)
    w1 = w0 + np.float32(0.01)
    times: dict[str, list[float]] = {"whole": [], "whole_split": [], "paced": [], "kept": []}
    for round_index in range(rounds):
        plain = trainer.begin_round(w0, round_index)
        times["whole"].append(_cpu(plain.result))
        plain.switch(0.5, w1)
        times["whole_split"].append(_cpu(plain.result))
        paced = trainer.begin_round(w0, round_index)
        times["paced"].append(_cpu(lambda p=paced: _paced(p, w1)))
        kept = trainer.begin_round(w0, round_index)
        kept.keep_sums()
        times["kept"].append(_cpu(kept.result))
    return {name: statistics.median(values) * 1e3 for name, values in times.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=200)
    args = parser.parse_args()
    torch.set_num_threads(1)
    rows = []
    for batch in (128, 200, 300):
        row = {"batch_size": batch, **{f"{k}_ms": round(v, 3)
                                       for k, v in measure(batch, args.rounds).items()}}
        rows.append(row)
        print(json.dumps(row))
    RESULTS.write_text(json.dumps({"commit": commit(), "rounds": args.rounds,
                                   "model": "mlp 784-64-10", "threads": 1, "rows": rows},
                                  indent=2) + "\n")


if __name__ == "__main__":
    main()
