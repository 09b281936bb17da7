"""``fedsim validate`` lists every problem in one run: the fields' errors and the checks that tie
fields together (pydantic's after-validators, which it skips above a field's error) wherever
every field they read is valid (:mod:`fedsim.config.cross_field`). A stranger fixing a scenario
was shown the field errors only, and a new problem after each fix."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest

from fedsim.cli import main
from fedsim.config import ScenarioError, load_scenario, parse_scenario
from fedsim.errors import ConfigError
from tests.config.test_bad_input import MINIMAL

REPO = Path(__file__).resolve().parents[2]
SHIPPED = sorted((REPO / "scenarios").rglob("*.yaml"))

# Line numbers below are this text's.
MIXED = """\
name: mixed
stop:
  virtual_seconds: 100000
dataset: {name: synthetic, num_samples: 400, num_test_samples: 100}
model: {name: mlp, options: {hidden: [8]}}
clients:
  groups:
    - name: a
      count: 2
      data_share: 0.5
      batch_size: -8
      clip: 1.0
      noise: 1.0
      speed: 0.01
    - name: b
      count: 2
      data_share: 0.5
      batch_size: 8
      clip: 1.0
      noise: 1.0
      speed: 0.01
server:
  window: 0.001
"""
FIELD_ERROR = "clients.groups[0].batch_size (line 11): must be > 0 (got -8)"
TOO_MANY_WINDOWS = ("stop.virtual_seconds (line 3): stop.virtual_seconds / server.window is "
                    "1e+08 windows, more than 10000000; lengthen server.window")

@pytest.fixture(autouse=True)
def _only_scenario_commands(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("fedsim.cli.COMMANDS", ("run", "validate", "schema"))


def _write(tmp_path: Path, text: str) -> Path:
    file = tmp_path / "s.yaml"
    file.write_text(text, encoding="utf-8")
    return file


def _problems(text: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> list[str]:
    """``fedsim validate``'s problem lines (asserted: exit 2, no traceback)."""
    status = main(["validate", str(_write(tmp_path, text)), "--schema-only"])
    captured = capsys.readouterr()
    assert status == 2, captured
    assert "Traceback" not in captured.err
    return [line.strip() for line in captured.err.splitlines()[1:]]


def _errors(data: dict[str, Any]) -> list[str]:
    with pytest.raises(ScenarioError) as raised:
        parse_scenario(data)
    return raised.value.errors


def _changed(**groups: Any) -> dict[str, Any]:
    data = copy.deepcopy(MINIMAL)
    data["clients"]["groups"][0].update(groups)
    return data


def test_a_field_error_and_a_check_of_another_section_come_in_one_run(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A negative batch size in one group hid that stop.virtual_seconds over server.window makes
    too many windows (a check of the whole scenario, which reads no group)."""
    assert _problems(MIXED, tmp_path, capsys) == [FIELD_ERROR, TOO_MANY_WINDOWS]
    # fedsim run refuses the same file with the same error type, listing the same problems
    status = main(["run", str(_write(tmp_path, MIXED)), "--out", str(tmp_path / "run")])
    err = capsys.readouterr().err
    assert status == 2 and FIELD_ERROR in err and TOO_MANY_WINDOWS in err
    with pytest.raises(ScenarioError) as raised:
        load_scenario(_write(tmp_path, MIXED))
    assert isinstance(raised.value, ConfigError)
    assert raised.value.errors == [FIELD_ERROR, TOO_MANY_WINDOWS]


def test_a_section_s_own_rule_comes_with_a_field_error_elsewhere_in_the_file(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Unique group names are the clients section's rule; the other group's field error, and an
    unknown server key, no longer hide it (nor the windows' check)."""
    text = MIXED.replace("name: b", "name: a").replace("  window: 0.001\n",
                                                       "  window: 0.001\n  windoww: 3\n")
    assert _problems(text, tmp_path, capsys) == [
        FIELD_ERROR,
        "server.windoww (line 24): unknown key - did you mean 'window'?",
        "clients (line 6): group names must be unique, repeated: ['a']",
        TOO_MANY_WINDOWS,
    ]


def test_a_group_s_own_rule_is_judged_beside_its_field_error() -> None:
    data = _changed(batch_size=-1, noise={"kind": "target", "epsilon": 1.0, "delta": 1e-5})
    assert _errors(data) == [
        "clients.groups[0].batch_size: must be > 0 (got -1)",
        "clients.groups[0]: noise kind 'target' is calibrated over a fixed number of rounds: "
        "set rounds",
    ]


def test_a_problem_that_is_only_cross_field_is_listed_as_before(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    fixed = MIXED.replace("batch_size: -8", "batch_size: 8")
    assert _problems(fixed, tmp_path, capsys) == [TOO_MANY_WINDOWS]
    data = copy.deepcopy(MINIMAL)
    data["clients"]["groups"].append(dict(data["clients"]["groups"][0], data_share=0.1))
    assert _errors(data) == ["clients: group names must be unique, repeated: ['a']"]


def test_a_check_that_reads_an_invalid_field_is_not_judged(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The windows' check reads server.window: with the window invalid, only its error."""
    text = MIXED.replace("batch_size: -8", "batch_size: 8").replace("window: 0.001",
                                                                   "window: -1")
    assert _problems(text, tmp_path, capsys) == [
        "server.window (line 23): must be >= 0.001 (got -1)"]
    # A round's time reads the group's batch size: without a speed (0, the default) and with
    # the batch size invalid, the rounds of no time are not judged; with another field
    # invalid they are.
    data = _changed(batch_size=-1)
    del data["clients"]["groups"][0]["speed"]
    assert _errors(data) == ["clients.groups[0].batch_size: must be > 0 (got -1)"]
    data = _changed(local_lr=-1)
    del data["clients"]["groups"][0]["speed"]
    local_lr, speed = _errors(data)
    assert local_lr == "clients.groups[0].local_lr: must be > 0.0 (got -1)"
    assert speed.startswith("clients.groups[0].speed: a round of group 'a' takes 0 virtual s")
    # The noise's own error hides its kind, which the group's rule reads.
    data = _changed(noise={"kind": "target", "epsilon": -1.0, "delta": 1e-5})
    assert _errors(data) == ["clients.groups[0].noise.epsilon: must be > 0.0 (got -1.0)"]


def test_a_section_that_breaks_its_own_rule_is_not_read_by_the_checks_around_it() -> None:
    """Repeated names make the clients section invalid: the scenario's checks that read its
    groups are not judged, those that read other sections are."""
    data = copy.deepcopy(MINIMAL)
    del data["clients"]["groups"][0]["speed"]  # rounds of no time: read from the groups
    data["clients"]["groups"].append(dict(data["clients"]["groups"][0], data_share=0.1))
    data["stop"] = {"all_budgets_spent": False}  # no stop condition: read from stop alone
    data["seed"] = -1
    assert _errors(data) == [
        "seed: must be >= 0 (got -1)",
        "clients: group names must be unique, repeated: ['a']",
        "scenario: stop: no stop condition bounds the run; set virtual_seconds or windows "
        "(target_accuracy alone may never be reached)",
    ]


def test_every_rule_of_a_section_is_listed() -> None:
    """pydantic stops at a section's first broken rule; both of the scenario's are listed."""
    data = copy.deepcopy(MINIMAL)
    del data["clients"]["groups"][0]["speed"]
    data["stop"] = {"virtual_seconds": 1e9}
    speed, windows = _errors(data)
    assert speed.startswith("clients.groups[0].speed: a round of group 'a' takes 0 virtual s")
    assert windows.startswith("stop.virtual_seconds: stop.virtual_seconds / server.window is "
                              "1e+09 windows")


@pytest.mark.parametrize("groups", [5, [7], [None]])
def test_groups_that_are_no_sections_are_not_read(groups: Any) -> None:
    data = copy.deepcopy(MINIMAL)
    data["clients"]["groups"] = (groups if not isinstance(groups, list)
                                 else [*data["clients"]["groups"], *groups])
    data["stop"] = {"virtual_seconds": 1e9}
    errors = _errors(data)
    assert len(errors) == 2 and errors[0].startswith("clients.groups")
    assert errors[1].startswith("stop.virtual_seconds: stop.virtual_seconds / server.window")


def test_thousands_of_field_errors_add_no_check_that_reads_them() -> None:
    # Each group's data_share is invalid (> 1) and, read, would trip the shares' sum check
    # (2,000 > 1): that check reads them, so it is not judged.
    groups = [dict(MINIMAL["clients"]["groups"][0], name=f"g{i}", data_share=2.0)
              for i in range(1000)]
    data = copy.deepcopy(MINIMAL)
    data["clients"]["groups"] = groups
    errors = _errors(data)
    assert len(errors) == 1000 and all(".data_share" in line for line in errors)
    assert not any("sums to" in line for line in errors)


@pytest.mark.parametrize("path", SHIPPED, ids=[p.stem for p in SHIPPED])
def test_shipped_scenarios_validate_clean(path: Path, monkeypatch: pytest.MonkeyPatch,
                                          capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.chdir(REPO)
    assert main(["validate", str(path), "--schema-only"]) == 0
    captured = capsys.readouterr()
    assert ": valid (" in captured.out and "problem" not in captured.err
