"""benchmarks/noise_lattice.py: the floating-point attack it measures tells a lattice from no
lattice. Its control (float64 normals rounded to float32) reads chance; fedsim's 24-bit
Box-Muller sampler reads the exposure docs/SECURITY.md describes ("Floating-point noise"). When
the sampler is made finer, the second half of this test is the one to change."""

from __future__ import annotations

from typing import Any

from tests.scripts import BENCHMARKS, load_script


def _benchmark() -> Any:
    return load_script(BENCHMARKS / "noise_lattice.py", "noise_lattice_under_test")


def test_the_attack_reads_chance_without_a_lattice_and_finds_the_24_bit_one() -> None:
    attack = _benchmark().attack
    pairs = 1 << 18
    control = attack(pairs, 1.1, 1.0, 256.0, 3.0, 5, sampler="float64")
    for truth in ("in", "out"):
        right = control[f"record_{truth}_decided_right"] * pairs
        wrong = control[f"record_{truth}_decided_wrong"] * pairs
        assert abs(right - wrong) <= 4 * (right + wrong + 1) ** 0.5  # chance: as often wrong
    fedsim = attack(pairs, 1.1, 1.0, 256.0, 3.0, 5, sampler="fedsim")
    for truth in ("in", "out"):
        assert fedsim[f"record_{truth}_decided_right"] * pairs > 100
        assert fedsim[f"record_{truth}_decided_wrong"] == 0.0
