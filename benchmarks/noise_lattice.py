"""The floating-point attack on fedsim's Gaussian noise: how often an observer who knows the rest
of the data tells whether a record took part from the lattice of the noise's radius.

Box-Muller on 24-bit uniforms (fedsim's sampler and torch's ``normal_``) gives each noise pair
a radius ``r`` with ``2^24 exp(-r^2 / 2 std^2)`` an integer (outside the refined tail, 2^-24
of the pairs). Where the spacing of those radii is wider than float32's rounding of the
release, an observer who knows the other records' clipped sum ``s`` and the record's clipped
gradient ``v`` (DP's worst case) can subtract each hypothesis and see which one leaves the
pair's radius on the lattice (Mironov, CCS 2012; for Gaussian noise Jin et al., IEEE S&P 2022).

The simulation: ``pairs`` noise pairs from fedsim's sampler (std ``sigma C``), the rest's sum
``s`` of each coordinate ~ N(0, rest_std^2) in float32, the record's clipped gradient of norm
``C`` on the pair's first coordinate, the release ``(s [+ v] + noise) / m`` computed in float32
as a DP-SGD step computes it. The observer decides "in" (or "out") when that hypothesis puts
the radius within ``tolerance`` of the lattice and the other one further than ``margin`` from
it, among radii where the lattice is coarse enough (``2^24 exp(-r^2/2) < coarse``). Reported
per pair that holds the record's gradient: the fraction decided correctly and wrongly, under
each truth, for fedsim's sampler and for a control without the lattice at float32's
resolution (torch's float64 normal rounded to float32), which reads chance: as often wrong as
right.

    python benchmarks/noise_lattice.py              # 2^22 pairs, sigma 1.1
    python benchmarks/noise_lattice.py --pairs 1048576 --sigma 0.8

Writes benchmarks/results/noise_lattice.json (with the commit measured).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np
import torch
from _common import ROOT, commit, write_json  # before fedsim: puts this checkout first

from fedsim.training.gaussian import gaussian_noise

RESULTS = ROOT / "benchmarks" / "results" / "noise_lattice.json"


def lattice_distance(x: np.ndarray, y: np.ndarray, std: float) -> tuple[np.ndarray, np.ndarray]:
    """For noise pairs (x, y): how far ``2^24 exp(-r^2 / 2 std^2)`` is from an integer, and
    that value (the lattice's index: small where its radii are far apart)."""
    r = np.hypot(x, y) / std
    index = 2.0**24 * np.exp(-r * r / 2)
    return np.abs(index - np.round(index)), index


def attack(pairs: int, sigma: float, clip: float, batch: float, rest_std: float, seed: int,
           *, sampler: str = "fedsim", tolerance: float = 0.02, margin: float = 0.1,
           coarse: float = 20_000.0) -> dict[str, float]:
    """The observer's decisions on ``pairs`` pairs under each truth (see the module docstring).
    ``sampler="float64"`` is the control: torch's float64 normal (53-bit uniforms) rounded to
    float32, which has no lattice at float32's resolution."""
    std = sigma * clip
    generator = torch.Generator().manual_seed(seed)
    if sampler == "fedsim":
        noise = gaussian_noise(2 * pairs, std, generator, torch.zeros(1))
    else:
        noise = (torch.randn(2 * pairs, generator=generator, dtype=torch.float64) * std).float()
    x, y = noise[:pairs], noise[pairs:]
    rest = torch.Generator().manual_seed(seed + 1)
    s_x = (torch.randn(pairs, generator=rest, dtype=torch.float64) * rest_std).float()
    s_y = (torch.randn(pairs, generator=rest, dtype=torch.float64) * rest_std).float()
    scale = torch.tensor(1.0 / batch, dtype=torch.float32)
    sx, sy = s_x.double().numpy(), s_y.double().numpy()
    out: dict[str, float] = {}
    for present in (True, False):
        released_x = ((s_x + clip if present else s_x) + x) * scale  # float32, as a step adds
        released_y = (s_y + y) * scale
        ox = released_x.double().numpy() * batch
        oy = released_y.double().numpy() * batch
        d_in, index_in = lattice_distance(ox - sx - clip, oy - sy, std)
        d_out, index_out = lattice_distance(ox - sx, oy - sy, std)
        truth, other, index = (d_in, d_out, index_in) if present else (d_out, d_in, index_out)
        coarse_enough = index < coarse
        right = (truth < tolerance) & (other > margin) & coarse_enough
        wrong = (other < tolerance) & (truth > margin) & coarse_enough
        name = "in" if present else "out"
        out[f"record_{name}_decided_right"] = float(right.mean())
        out[f"record_{name}_decided_wrong"] = float(wrong.mean())
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--pairs", type=int, default=1 << 22)
    parser.add_argument("--sigma", type=float, default=1.1, help="noise multiplier")
    parser.add_argument("--clip", type=float, default=1.0)
    parser.add_argument("--batch", type=float, default=256.0, help="the release's divisor m")
    parser.add_argument("--rest-std", type=float, default=3.0,
                        help="std of the other records' sum on a coordinate")
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args(argv)
    rows = []
    for sampler in ("fedsim", "float64"):
        rows.append({
            "sampler": sampler, "pairs": args.pairs, "sigma": args.sigma, "clip": args.clip,
            "batch": args.batch, "rest_std": args.rest_std, "seed": args.seed,
            **attack(args.pairs, args.sigma, args.clip, args.batch, args.rest_std, args.seed,
                     sampler=sampler),
            "commit": commit(),
        })
        print(rows[-1], file=sys.stderr)
    write_json(args.out, rows)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
