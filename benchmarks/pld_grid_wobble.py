"""How far the PLD accountant's eps can fall when one step is appended (fedsim.privacy.pld,
"When the grid changes"): random histories of 2-4 kinds of step, both schemes, and the largest
relative fall at each delta.

    python benchmarks/pld_grid_wobble.py --seeds 1,2 --trials 150

Each seed runs in its own process (a core each). A history takes 2-9 steps drawn from its
kinds (q in 0.003, 0.02, 0.1, 128/3890; sigma uniform in 0.8-4 with probability 0.6, else
100-10000: near-free steps; counts 1-299); after each step eps is read at 1e-5, 1e-8 and 1e-10
and compared with the largest answer before it. Results: benchmarks/results/pld_grid_wobble.json
(tests/privacy/test_pld_grid_change.py holds the fall below 1e-3).
"""

from __future__ import annotations

import argparse
import json
import math
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import provenance, write_json  # noqa: E402  (before fedsim: the tree measured)

DELTAS = (1e-5, 1e-8, 1e-10)
RESULT = Path(__file__).resolve().parent / "results" / "pld_grid_wobble.json"


def worst_falls(seed: int, trials: int) -> dict[str, object]:
    """The largest relative fall of eps at each of :data:`DELTAS` over ``trials`` histories."""
    import numpy as np

    from fedsim.privacy.events import GaussianStep, Sampling
    from fedsim.privacy.pld import PLDAccountant

    rng = np.random.default_rng(seed)
    worst: dict[float, dict[str, object]] = {d: {"fall": 0.0} for d in DELTAS}
    falls = dict.fromkeys(DELTAS, 0)
    for _ in range(trials):
        sampling: Sampling = "poisson" if rng.integers(2) == 0 else "fixed"
        kinds = [GaussianStep(sampling, float(rng.choice([0.003, 0.02, 0.1, 128 / 3890])),
                              float(rng.uniform(0.8, 4.0) if rng.random() < 0.6
                                    else rng.uniform(100, 10000)),
                              int(rng.integers(1, 300)))
                 for _ in range(int(rng.integers(2, 5)))]
        accountant = PLDAccountant()
        held = dict.fromkeys(DELTAS, 0.0)
        history: list[GaussianStep] = []
        for index in rng.integers(0, len(kinds), int(rng.integers(2, 10))):
            step = kinds[int(index)]
            accountant.compose([step])
            history.append(step)
            for delta in DELTAS:
                now = accountant.epsilon(delta)
                if math.isfinite(now) and held[delta] > 0 and now < held[delta]:
                    falls[delta] += 1
                    fall = (held[delta] - now) / held[delta]
                    if fall > float(worst[delta]["fall"]):  # type: ignore[arg-type]
                        worst[delta] = {"fall": fall, "before": held[delta], "after": now,
                                        "history": [[s.sampling, s.q, s.sigma, s.count]
                                                    for s in history]}
                held[delta] = max(held[delta], now)
    return {"seed": seed, "trials": trials,
            "falls": {str(d): n for d, n in falls.items()},
            "worst": {str(d): w for d, w in worst.items()}}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", default="1,2")
    parser.add_argument("--trials", type=int, default=150, help="histories a seed")
    parser.add_argument("--one", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.one is not None:
        print(json.dumps(worst_falls(args.one, args.trials)))
        return
    seeds = [int(s) for s in args.seeds.split(",")]
    runs = [subprocess.Popen([sys.executable, __file__, "--one", str(s), "--trials",
                              str(args.trials)], stdout=subprocess.PIPE, text=True)
            for s in seeds]
    rows = [json.loads(run.communicate()[0]) for run in runs]
    largest = {str(d): max(float(r["worst"][str(d)]["fall"]) for r in rows) for d in DELTAS}
    write_json(RESULT, {"provenance": provenance(), "rows": rows, "largest_fall": largest})
    print(json.dumps({"largest_fall": largest}))


if __name__ == "__main__":
    main()
