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
    CLIENTS_FILE,
    SUMMARY_FILE,
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


SCHEDULED = {
    "name": "tiny-schedule", "seed": 0, "stop": {"virtual_seconds": 200},
    "dataset": {"name": "synthetic", "num_samples": 300, "num_test_samples": 60,
                "num_features": 5, "num_classes": 3},
    "model": {"name": "logreg"},
    "clients": {"groups": [
        {"name": "dyn", "count": 2, "data_share": 0.5, "batch_size": 16, "sampling": "poisson",
         "clip": {"kind": "decay", "initial": 2.0, "final_ratio": 0.3},
         "noise": {"kind": "growing_mu", "epsilon": 2.0, "delta": 1e-5, "growth": 3.0},
         "rounds": 8, "speed": 0.01},
        {"name": "flat", "count": 1, "data_share": 0.5, "batch_size": 16, "clip": 1.0,
         "noise": {"sigma": 1.5}, "rounds": 8, "speed": 0.01},
    ]},
    "server": {"window": 1.0},
}


def test_a_scheduled_clients_row_gives_its_first_and_last_rounds_sigma_and_clip(
        tmp_path: Path) -> None:
    """clients.csv's sigma and clip are the last released round's; a client whose schedule
    changes them also has sigma_first/clip_first (its ledger's first record) and schedule
    'varies' (a stranger's `fedsim account --sigma <last>` gave another eps than the row's)."""
    import csv

    import yaml

    from fedsim.cli import main
    from fedsim.privacy.ledger import read_ledger_steps

    scenario = tmp_path / "dyn.yaml"
    scenario.write_text(yaml.safe_dump(SCHEDULED), encoding="utf-8")
    out = tmp_path / "run"
    assert main(["run", str(scenario), "--out", str(out), "--no-plots", "--quiet"]) == 0
    header = (out / CLIENTS_FILE).read_text(encoding="utf-8").splitlines()[0].split(",")
    assert header[-3:] == ["sigma_first", "clip_first", "schedule"]
    rows = {r["client_id"]: r for r in csv.DictReader((out / CLIENTS_FILE).open())}
    for client, row in rows.items():
        steps = list(read_ledger_steps(out / "ledgers" / f"{client}.jsonl"))
        assert float(row["sigma_first"]) == steps[0].sigma
        assert float(row["sigma"]) == steps[-1].sigma
        if row["group"] == "dyn":
            assert row["schedule"] == "varies"
            assert steps[0].sigma > steps[-1].sigma
            assert float(row["clip_first"]) == pytest.approx(2.0)
            assert float(row["clip"]) < float(row["clip_first"])
        else:
            assert row["schedule"] == "constant"
            assert row["sigma_first"] == row["sigma"] and row["clip_first"] == row["clip"]
    summary = json.loads((out / SUMMARY_FILE).read_text(encoding="utf-8"))
    assert "2 client(s) changed their noise sigma or clip" in summary["explanation"]
