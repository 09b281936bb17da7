"""A run's epsilon figures by neighbouring relation (a stranger: summary.json's median pooled
add/remove and replace-one clients, whose guarantees are about different neighbours)."""

from __future__ import annotations

import statistics

import fedsim
from fedsim.runtime.run_summary import epsilon_by_relation

GROUP = {"count": 2, "data_share": 0.5, "batch_size": 8, "clip": 1.0, "noise": 1.0,
         "speed": 0.01, "budget": {"epsilon": 8.0, "delta": 1e-5}}


def _scenario(samplings: list[str]) -> dict:
    return {
        "name": "relations", "seed": 3, "stop": {"windows": 4},
        "dataset": {"name": "synthetic", "num_samples": 400, "num_test_samples": 100,
                    "num_features": 6, "num_classes": 2},
        "model": {"name": "logreg"},
        "clients": {"groups": [{**GROUP, "name": f"g{k}", "sampling": sampling,
                                "data_share": 1.0 / len(samplings)}
                               for k, sampling in enumerate(samplings)]},
        "server": {"window": 1.0},
    }


def test_rows_are_grouped_by_relation_each_with_its_own_median() -> None:
    rows = [{"sampling": "poisson", "epsilon": e} for e in (1.0, 3.0, 2.0)] + \
        [{"sampling": "fixed", "epsilon": e} for e in (5.0, 7.0)]
    by = epsilon_by_relation(rows)
    assert list(by) == ["add/remove", "replace-one"]
    assert by["add/remove"] == {"clients": 3, "epsilon_min": 1.0, "epsilon_median": 2.0,
                                "epsilon_max": 3.0}
    assert by["replace-one"]["epsilon_median"] == statistics.median([5.0, 7.0])


def test_a_mixed_runs_summary_says_each_relation_and_a_single_ones_is_unchanged() -> None:
    mixed = fedsim.simulate(_scenario(["poisson", "fixed"]), plots=False)
    privacy = mixed.summary["privacy"]
    by = privacy["by_relation"]
    assert {r: v["clients"] for r, v in by.items()} == {"add/remove": 2, "replace-one": 2}
    fixed = sorted(e for c, e in mixed.epsilons.items() if c.startswith("g1"))
    assert by["replace-one"]["epsilon_min"] == fixed[0]
    assert "not to be compared" in mixed.summary["explanation"]
    single = fedsim.simulate(_scenario(["poisson", "poisson"]), plots=False)
    assert "by_relation" not in single.summary["privacy"]
    # one relation: its range, or one value where every client's eps reads alike (four
    # significant digits)
    low, high = (f"{e:#.4g}" for e in (min(single.epsilons.values()),
                                       max(single.epsilons.values())))
    expected = f"(pld) is {low}." if low == high else f"(pld) ranges from {low} to {high}."
    assert expected in single.summary["explanation"]
    assert "not to be compared" not in single.summary["explanation"]
