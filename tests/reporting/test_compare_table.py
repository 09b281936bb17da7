"""The compare/sweep table's cells: epsilons keep their significant digits side by side."""

from __future__ import annotations

from fedsim.reporting.compare import format_table


def test_epsilons_keep_four_significant_digits_with_trailing_zeros() -> None:
    rows = [{"eps_min": 3.0, "eps_median": 2.995, "eps_max": 0.5, "final_accuracy": 0.9}]
    header, _, row = format_table(rows, columns=("eps_min", "eps_median", "eps_max",
                                              "final_accuracy"))
    cells = row.split()
    # "3" beside "2.995" read as a rounder number than it is (a stranger's review)
    assert cells == ["3.000", "2.995", "0.5000", "0.9000"]
    assert header.split()[:2] == ["eps", "min"]


def test_a_missing_value_is_a_dash() -> None:
    _, _, row = format_table([{"eps_max": None}], columns=("eps_max",))
    assert row.strip() == "-"
