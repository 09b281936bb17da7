"""Write ``tests/privacy/data/pld_reference.json``: the independent reference eps of every
subsampled case in ``test_pld_upper_tail`` (issue 23 part 2), computed by ``pld_reference``.

The reference (mpmath masses at 40 digits on two uniform grids, composed by dp_accounting)
takes minutes for all cases (and one minute for the cheapest), too long for every CI run; its values are committed here
with the inputs that produced them (the grid h is fedsim's default discretisation of the
case, recorded so that a change of it shows), and ``test_pld_upper_tail`` recomputes the
cheapest case on every run to show that the file follows from this script. Run it again
(``python -m tests.privacy.make_pld_reference``, from the repository root) when the
accountant's default grid, the cases or the budget decision change; the tests say when.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

from tests.privacy import pld_reference as ref

FILE = Path(__file__).parent / "data" / "pld_reference.json"
DRS_Q, DRS_SIGMA, DRS_T = 256 / 60000, 1.3, 3516

# (name, sampling, q, sigma, count, deltas); the budget case's count is the ledger's decision.
CASES: list[tuple[str, str, float, float, int, tuple[float, ...]]] = [
    ("cheap", "fixed", 1e-3, 2.0, 50, (1e-5,)),
    ("drs-fixed", "fixed", DRS_Q, DRS_SIGMA, DRS_T, (1e-8, 1e-9, 1e-10, 1e-11)),
    ("drs-poisson", "poisson", DRS_Q, DRS_SIGMA, DRS_T, (1e-8, 1e-9, 1e-10, 1e-11)),
    ("tiny-fixed-1e-4", "fixed", 1e-4, 2.0, 100_000, (1e-5,)),
    ("tiny-fixed-1e-3", "fixed", 1e-3, 2.0, 100_000, (1e-5,)),
    ("tiny-poisson-1e-4", "poisson", 1e-4, 10.0, 100_000, (1e-5,)),
    ("two-deltas", "fixed", 1e-3, 2.0, 2000, (1e-5, 1e-10)),
]


def grid(sampling: str, q: float, sigma: float, count: int) -> float:
    """fedsim's default discretisation of the case (the grid the reference is refined from)."""
    from fedsim.privacy.events import GaussianStep
    from fedsim.privacy.pld import PLDAccountant

    return float(PLDAccountant([GaussianStep(sampling, q, sigma, count)]).discretisation())


def bracket(sampling: str, q: float, sigma: float, count: int, deltas: tuple[float, ...],
            h: float) -> list[list[float]]:
    """[[delta, lower, upper], ...]: each composition computed once for every delta."""
    composed = {}
    for grid_h in (h, h / 2):
        composed[grid_h] = [p.self_compose(count, tail_mass_truncation=1e-18)
                            for p in ref.step_pmfs(sampling, q, sigma, grid_h)]
    rows = []
    for delta in deltas:
        coarse, fine = (max(p.get_epsilon_for_delta(delta) for p in composed[g])
                        for g in (h, h / 2))
        rows.append([delta, fine - abs(coarse - fine), fine])
    return rows


def case_entry(name: str, sampling: str, q: float, sigma: float, count: int,
               deltas: tuple[float, ...]) -> dict[str, Any]:
    h = grid(sampling, q, sigma, count)
    return {"name": name, "sampling": sampling, "q": q, "sigma": sigma, "count": count, "h": h,
            "brackets": bracket(sampling, q, sigma, count, deltas, h)}


def budget_entry(tmp: Path) -> dict[str, Any]:
    """The budget case: the steps a ledger with budget (1.70, 1e-10) accepts, and their
    reference eps at 1e-10."""
    from tests.privacy.test_pld_upper_tail import accepted_steps

    spent = accepted_steps(tmp)
    entry = case_entry("budget", "fixed", DRS_Q, DRS_SIGMA, spent, (1e-10,))
    return entry


def main() -> None:
    import tempfile

    entries = []
    for case in CASES:
        entries.append(case_entry(*case))
        print(entries[-1], file=sys.stderr, flush=True)
    with tempfile.TemporaryDirectory() as tmp:
        entries.append(budget_entry(Path(tmp)))
    print(entries[-1], file=sys.stderr, flush=True)
    FILE.parent.mkdir(exist_ok=True)
    FILE.write_text(json.dumps({"cases": entries}, indent=1) + "\n", encoding="utf-8")


if __name__ == "__main__":
    main()
