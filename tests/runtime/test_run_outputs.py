"""The run directory's one writer: strict JSON (non-finite floats as null), atomic writes, and
the refusal to reuse a directory that holds ledgers."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest

from fedsim.errors import ConfigError
from fedsim.runtime.run_outputs import (
    check_unused,
    clean_json,
    default_run_dir,
    json_line,
    ledger_file,
    read_json,
    write_json,
)


def test_non_finite_floats_become_null_at_any_depth() -> None:
    value = {"a": math.nan, "b": [1.0, math.inf, (np.float32(0.5), -math.inf)],
             "c": {"d": np.int64(3), "e": np.float64(math.nan)}}
    assert clean_json(value) == {"a": None, "b": [1.0, None, [0.5, None]],
                                 "c": {"d": 3, "e": None}}
    line = json_line({"loss": math.nan, "n": np.int32(2)})
    assert line == '{"loss": null, "n": 2}\n'
    assert json.loads(line) == {"loss": None, "n": 2}


def test_write_json_is_strict_and_atomic(tmp_path: Path) -> None:
    path = tmp_path / "x.json"
    write_json(path, {"eps": math.inf, "ok": 1.5})
    text = path.read_text()
    assert "Infinity" not in text and json.loads(text) == {"eps": None, "ok": 1.5}
    assert [p.name for p in tmp_path.iterdir()] == ["x.json"]  # no temporary file left
    assert read_json(path) == {"eps": None, "ok": 1.5}
    path.write_text("[1, 2]")  # not an object
    assert read_json(path) == {}
    assert read_json(tmp_path / "missing.json") == {}


def test_a_directory_holding_ledgers_is_refused(tmp_path: Path) -> None:
    check_unused(tmp_path)  # empty: fine
    ledger_file(tmp_path, "c-000").parent.mkdir()
    check_unused(tmp_path)  # an empty ledgers/ too
    ledger_file(tmp_path, "c-000").write_text("{}\n")
    with pytest.raises(ConfigError, match="already holds a run's ledgers"):
        check_unused(tmp_path)
    elsewhere = tmp_path / "other"
    elsewhere.mkdir()
    ledger_file(elsewhere, "c-000").parent.write_text("not a directory")
    with pytest.raises(ConfigError, match="is not a directory"):  # not NotADirectoryError
        check_unused(elsewhere)


def test_default_run_directories_get_a_suffix_instead_of_being_reused(tmp_path: Path) -> None:
    """The one naming rule of run, launch and sweep (issue 27, finding 5)."""
    assert default_run_dir("q-launch", tmp_path) == tmp_path / "q-launch"
    (tmp_path / "q-launch").mkdir()
    assert default_run_dir("q-launch", tmp_path) == tmp_path / "q-launch-1"
    (tmp_path / "q-launch-1").mkdir()
    assert default_run_dir("q-launch", tmp_path) == tmp_path / "q-launch-2"
    assert default_run_dir("other", tmp_path) == tmp_path / "other"


@pytest.mark.parametrize("front_door", ["fedsim.simulate", "fedsim run"])
def test_both_front_doors_refuse_a_used_run_directory_before_any_work(
        tmp_path: Path, front_door: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """One check of a new run directory (require_new_run_dir) for both: fedsim.simulate
    refused a used ``out`` only after building the population (a stranger waited for it)."""
    import fedsim
    from fedsim.cli import main
    from fedsim.runtime import population
    from fedsim.runtime.simulated import simulation

    def no_work(*_args: object, **_kwargs: object) -> None:
        raise AssertionError("the population was built for a used run directory")

    monkeypatch.setattr(population, "build_population", no_work)
    monkeypatch.setattr(simulation, "build_population", no_work)
    ledger_file(tmp_path, "c-000").parent.mkdir()
    ledger_file(tmp_path, "c-000").write_text("{}\n")
    scenario = Path(__file__).parents[2] / "scenarios" / "quickstart.yaml"
    if front_door == "fedsim.simulate":
        with pytest.raises(ConfigError, match="already holds a run's ledgers"):
            fedsim.simulate(scenario, out=tmp_path, progress=False)
    else:
        assert main(["run", str(scenario), "--out", str(tmp_path), "--no-plots"]) == 2
