"""benchmarks/papers/asoodeh_rounds.py: its exact Gaussian answer, and its saved results."""

from __future__ import annotations

import json
from pathlib import Path
from types import ModuleType

import mpmath
import pytest

from tests.scripts import load_script

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "benchmarks" / "papers" / "asoodeh_rounds.py"
RESULT = REPO / "benchmarks" / "results" / "papers" / "asoodeh_rounds.json"


def _load() -> ModuleType:
    return load_script(SCRIPT, "asoodeh_rounds")


rounds = _load()


def _gdp_delta_mp(epsilon: float, mu: mpmath.mpf) -> mpmath.mpf:
    """delta(eps) of mu-GDP at 40 digits, independent of scipy."""
    with mpmath.workdps(40):
        eps = mpmath.mpf(epsilon)
        return mpmath.ncdf(-eps / mu + mu / 2) - mpmath.exp(eps) * mpmath.ncdf(-eps / mu - mu / 2)


@pytest.mark.parametrize(("sigma", "epsilon"), [(10.0, 1.0), (50.0, 1.0), (100.0, 2.0)])
def test_exact_gaussian_steps_is_the_largest_admissible_count(sigma: float, epsilon: float) -> None:
    steps = rounds.gaussian_exact_max_steps(sigma, epsilon, 1e-5)
    with mpmath.workdps(40):
        at = _gdp_delta_mp(epsilon, mpmath.sqrt(steps) / sigma)
        beyond = _gdp_delta_mp(epsilon, mpmath.sqrt(steps + 1) / sigma)
    assert at <= 1e-5 < beyond


@pytest.mark.skipif(not RESULT.is_file(), reason="asoodeh_rounds.json not generated")
def test_saved_results_are_ordered_and_reproduce() -> None:
    document = json.loads(RESULT.read_text(encoding="utf-8"))
    rows = document["rows"]
    assert rows
    for row in rows:
        # Optimal conversion never worse than classic; the tight answer never below either.
        assert row["steps_rdp_classic"] <= row["steps_rdp_optimal"] <= row["steps_tight"], row
        if row["mechanism"] == "gaussian":
            # The pld accountant is an upper bound on eps, so it never allows more than exact,
            # and it is tight to within 1% here.
            assert 0.99 * row["steps_tight"] <= row["steps_pld"] <= row["steps_tight"], row
    # Recompute the cheapest row of each mechanism from scratch: the file is not stale. RDP and
    # exact-GDP counts must match exactly; pld counts within 2% (its discretisation may be
    # retuned without changing what it guarantees).
    pld_keys = {"steps_pld", "steps_tight", "extra_tight_vs_optimal", "extra_tight_vs_classic",
                "epochs_tight"}
    for mechanism in ("gaussian", "dpsgd-mnist"):
        row = min((r for r in rows if r["mechanism"] == mechanism),
                  key=lambda r: (r["steps_tight"], r["sigma"]))
        again = rounds.answer(mechanism, row["q"], row["sigma"], row["epsilon"], row["delta"])
        assert again.keys() == row.keys()
        if mechanism == "gaussian":
            pld_keys = {"steps_pld"}
        for key, value in row.items():
            if key in pld_keys:
                assert again[key] == pytest.approx(value, rel=0.02, abs=1), key
            else:
                assert again[key] == value, key
