"""The compare/sweep table's cells: epsilons keep their significant digits side by side."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pytest

from fedsim.privacy.accountant import make_accountant
from fedsim.privacy.events import GaussianStep, group_steps
from fedsim.reporting.compare import _relation_curves, format_table
from fedsim.reporting.ledgers import read_ledgers
from fedsim.reporting.rundir import RunDirectory
from tests.reporting.conftest import DELTA, SyntheticRun


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


def test_compare_epsilon_curves_are_the_clients_median_and_band_at_each_time(
        many_clients_run: SyntheticRun) -> None:
    """compare's epsilon.png drew the client of median *final* eps inside the band of the
    clients of least and most final eps: where one spent its budget early, its "median" line
    left its own band (a stranger's review). Now, as the run's own plot: at each time the
    clients' min, median and max, checked against a fresh accountant per client and time."""
    run = RunDirectory.load(many_clients_run.path)
    [(relation, (times, low, mid, high))] = _relation_curves(run, read_ledgers(run), run.delta).items()
    assert relation == "add/remove"
    expected = np.array([[_eps_until(history, moment) for moment in times]
                         for history in many_clients_run.histories.values()])
    np.testing.assert_allclose(low, expected.min(axis=0), rtol=1e-9)
    np.testing.assert_allclose(mid, np.median(expected, axis=0), rtol=1e-9)
    np.testing.assert_allclose(high, expected.max(axis=0), rtol=1e-9)
    assert np.all(low <= mid) and np.all(mid <= high)


def _eps_until(history: list[tuple[float, GaussianStep]], moment: float) -> float:
    steps = list(group_steps(step for time, step in history if time <= moment))
    return make_accountant("pld", steps).epsilon(DELTA) if steps else 0.0


def test_compare_notes_a_runs_caveats_and_that_it_was_deployed(
        small_run: SyntheticRun, copy_run: Callable[[SyntheticRun], SyntheticRun]) -> None:
    """A stranger compared a launched run with its simulation: equal eps columns, and neither
    its privacy caveat nor that it was deployed said anywhere."""
    import json

    from fedsim.reporting.compare import run_row

    run = copy_run(small_run)
    summary = json.loads((run.path / "summary.json").read_text())
    summary["privacy"]["caveats"] = ["41 deployed round(s) computed longer than their slot"]
    summary["deployed_differences"] = ["not emulated: the simulated network (network.uplink)"]
    (run.path / "summary.json").write_text(json.dumps(summary), encoding="utf-8")
    notes = run_row(RunDirectory.load(run.path))["notes"]
    name = run.path.name
    assert notes[0] == (f"note: {name}: 1 privacy caveat(s) qualify its eps (summary.json "
                        "privacy.caveats), the first: 41 deployed round(s) computed longer "
                        "than their slot")
    assert notes[1].startswith(f"note: {name}: a deployed run;")
    assert run_row(RunDirectory.load(small_run.path))["notes"] == []


def test_the_relations_note_is_one_rule_for_every_table(small_run: SyntheticRun) -> None:
    """eps of add/remove and replace-one clients in one table (fedsim compare's, fedsim
    sweep's): a new user's sweep table mixed them with no word, where compare said so."""
    from fedsim.reporting.compare import relations_note, run_row

    assert run_row(RunDirectory.load(small_run.path))["relations"] == ["add/remove"]
    why = ("guarantees about different neighbours, not comparable as numbers (fedsim report "
           "DIR and the epsilon plots keep the relations apart)")
    both = ["add/remove", "replace-one"]
    assert relations_note([{"run": "a", "relations": ["add/remove"]}]) is None
    assert relations_note([{"run": "a", "relations": both}]) == (
        f"note: a: its eps columns span add/remove and replace-one clients, {why}")
    assert relations_note([{"run": "a", "relations": both}, {"run": "b", "relations": both},
                           {"run": "failed"}]) == (
        f"note: every run's eps columns span add/remove and replace-one clients, {why}")
    # across runs: each of one relation, or some of both (a sweep over sampling)
    runs = [{"run": f"p{i}", "relations": ["add/remove"]} for i in range(7)] + [
        {"run": "f", "relations": ["replace-one"]}, {"run": "m", "relations": both}]
    assert relations_note(runs) == (
        "note: the eps columns hold add/remove and replace-one clients (add/remove only: p0, "
        f"p1, p2, p3, p4 and 2 more; replace-one only: f; both: m), {why}")


def test_seconds_and_eps_ranges_are_written_by_one_rule(
        small_run: SyntheticRun, capsys: pytest.CaptureFixture[str]) -> None:
    """A new user read "59.1738 s" beside "262.888 s" and a headline's "0.4790..1.997" beside
    its explanation's "0.479 to 1.997": every output writes seconds with two decimals and an
    eps range as four significant digits "a to b"."""
    from fedsim.cli import main
    from fedsim.clock import seconds_text
    from fedsim.privacy.epsilon_text import epsilon_range

    assert [seconds_text(t) for t in (59.1738, 262.888, 0.25)] == ["59.17", "262.89", "0.25"]
    assert epsilon_range(0.479, 1.997) == "0.4790 to 1.997"
    assert epsilon_range(2.99804, 2.99811) == "2.998"  # (not "2.998 to 2.998")
    _, _, *cells = format_table([{"virtual_time": 59.1738}, {"virtual_time": 262.888}],
                                columns=("virtual_time",))
    assert [cell.strip() for cell in cells] == ["59.17", "262.89"]
    assert main(["report", str(small_run.path)]) == 0
    first = capsys.readouterr().out.splitlines()[0]
    assert f", {small_run.duration:.2f} s virtual time, " in first, first
