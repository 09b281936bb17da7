"""The default run directory (``runs/<scenario>-seed<N>``) is claimed when it is chosen: two
``fedsim run`` of one scenario started together take two directories (a stranger's second
run chose the first's ``runs/quickstart-seed0`` and failed on its ledger locks), and a run
that fails before it is one gives its directory back."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

import fedsim
from fedsim.cli import main
from fedsim.runtime.run_outputs import default_run_dir
from tests.cli.test_ray_flags import TINY as RAY_FLAGS_TINY

REPO = Path(fedsim.__file__).resolve().parents[1]
TINY = {**RAY_FLAGS_TINY, "name": "claimed", "seed": 3, "stop": {"windows": 3}}


def test_a_claimed_name_is_made_and_never_given_twice(tmp_path: Path) -> None:
    first = default_run_dir("q-seed0", tmp_path, claim=True)
    second = default_run_dir("q-seed0", tmp_path, claim=True)
    assert (first, second) == (tmp_path / "q-seed0", tmp_path / "q-seed0-1")
    assert first.is_dir() and second.is_dir()
    assert default_run_dir("q-seed0", tmp_path) == tmp_path / "q-seed0-2"  # unclaimed: unmade
    assert not (tmp_path / "q-seed0-2").exists()


def test_a_run_that_fails_before_it_is_one_gives_its_default_directory_back(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    scenario = tmp_path / "tiny.yaml"
    scenario.write_text(yaml.safe_dump(TINY), encoding="utf-8")
    monkeypatch.chdir(tmp_path)
    # refused after the directory is claimed, before anything is built
    assert main(["run", str(scenario), "--quiet", "--ray-workers", "3"]) == 2
    assert "--ray-workers applies only with --executor ray" in capsys.readouterr().err
    assert not (tmp_path / "runs" / "claimed-seed3").exists()
    assert main(["run", str(scenario), "--quiet", "--no-plots"]) == 0
    assert (tmp_path / "runs" / "claimed-seed3" / "summary.json").is_file()
    assert sorted(p.name for p in (tmp_path / "runs").iterdir()) == ["claimed-seed3"]


@pytest.mark.slow
def test_two_runs_started_together_take_two_directories(tmp_path: Path) -> None:
    scenario = tmp_path / "tiny.yaml"
    scenario.write_text(yaml.safe_dump(TINY), encoding="utf-8")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        [str(REPO), *filter(None, [os.environ.get("PYTHONPATH")])])}
    argv = [sys.executable, "-m", "fedsim", "run", str(scenario), "--quiet", "--no-plots"]
    runs = [subprocess.Popen(argv, cwd=tmp_path, env=env, stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True) for _ in range(2)]
    said = [run.communicate(timeout=300) for run in runs]
    assert [run.returncode for run in runs] == [0, 0], said
    made = sorted(p.name for p in (tmp_path / "runs").iterdir())
    assert made == ["claimed-seed3", "claimed-seed3-1"]
    summaries = [json.loads((tmp_path / "runs" / name / "summary.json").read_text())
                 for name in made]
    assert summaries[0]["final_accuracy"] == summaries[1]["final_accuracy"]  # the same run
    assert all(s["windows"] == 3 for s in summaries)


def test_a_sweeps_default_directory_is_claimed_before_its_runs_are_planned(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Two sweeps of one scenario started together both chose ``runs/<name>-sweep``: it was
    made only after planning. Now it is made (claimed) when chosen, and given back when the
    sweep fails before any run."""
    from fedsim.commands import sweep

    scenario = tmp_path / "tiny.yaml"
    scenario.write_text(yaml.safe_dump(TINY), encoding="utf-8")
    monkeypatch.chdir(tmp_path)
    seen: list[bool] = []

    def failing_plan(*args: object) -> None:
        seen.append((tmp_path / "runs" / "claimed-sweep").is_dir())
        raise fedsim.errors.ConfigError("planned to fail")

    monkeypatch.setattr(sweep, "plan_runs", failing_plan)
    assert main(["sweep", str(scenario), "--grid", "seed=1,2", "-q"]) == 2
    assert seen == [True]  # claimed when chosen
    assert not (tmp_path / "runs" / "claimed-sweep").exists()  # given back: no run in it


def test_a_launchs_default_directory_is_claimed_and_given_back_if_it_fails_first(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from fedsim.runtime.deployed import launcher

    scenario = tmp_path / "tiny.yaml"
    scenario.write_text(yaml.safe_dump(TINY), encoding="utf-8")
    monkeypatch.chdir(tmp_path)
    seen: list[Path] = []

    class FailingLauncher:
        def __init__(self, scenario: Path, out: Path, **kwargs: object) -> None:
            seen.append(out)
            assert out.is_dir()  # claimed when chosen, before anything starts
            raise fedsim.errors.ConfigError("failed before it started")

    monkeypatch.setattr(launcher, "Launcher", FailingLauncher)
    (tmp_path / "runs" / "claimed-launch").mkdir(parents=True)  # another launch's
    assert main(["launch", str(scenario), "-q"]) == 2
    assert seen == [Path("runs") / "claimed-launch-1"]
    assert sorted(p.name for p in (tmp_path / "runs").iterdir()) == ["claimed-launch"]


def test_a_claimed_directory_that_holds_a_spend_is_kept(tmp_path: Path) -> None:
    from fedsim.runtime.run_outputs import claimed_run_dir

    with pytest.raises(RuntimeError), claimed_run_dir("x-launch", tmp_path) as out:
        ledger = out / "state" / "c-000" / "ledgers" / "c-000.jsonl"
        ledger.parent.mkdir(parents=True)
        ledger.write_text('{"header": 1}\n{"kind": "spend"}\n')
        raise RuntimeError("after a spend")
    assert ledger.is_file()  # a privacy record is never removed
    with pytest.raises(RuntimeError), claimed_run_dir("y-sweep", tmp_path) as empty:
        raise RuntimeError("before any run")
    assert not empty.exists()
