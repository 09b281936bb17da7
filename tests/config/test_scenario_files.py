"""Scenario files: the bad-file corpus, the shipped scenarios, overrides, schema export."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from fedsim.cli import main
from fedsim.config import (
    ScenarioError,
    apply_override,
    dump_scenario,
    load_scenario,
    parse_scenario,
    scenario_json_schema,
)
from fedsim.config.schema import Constant, LogNormal, Scenario
from fedsim.errors import ConfigError

HERE = Path(__file__).parent
REPO = HERE.parents[1]
BAD = sorted((HERE / "bad").glob("*.yaml"))
SHIPPED = sorted((REPO / "scenarios").glob("*.yaml"))

MINIMAL = {
    "stop": {"windows": 3},
    "dataset": {"name": "synthetic"},
    "model": {"name": "logreg"},
    "clients": {"groups": [{"name": "a", "count": 2, "data_share": 0.5, "batch_size": 8,
                            "clip": 1.0, "noise": 1.0, "speed": 0.01}]},
    "server": {"window": 1.0},
}


@pytest.fixture(autouse=True)
def _only_scenario_commands(monkeypatch: pytest.MonkeyPatch) -> None:
    """These tests exercise the scenario commands alone, independent of other sub-commands."""
    monkeypatch.setattr("fedsim.cli.COMMANDS", ("run", "validate", "schema"))


def _expected(path: Path) -> str:
    first = path.read_text(encoding="utf-8").splitlines()[0]
    assert first.startswith("# expect: "), f"{path.name} must start with '# expect: <message>'"
    return first.removeprefix("# expect: ")


def _arguments(path: Path) -> list[str]:
    """Further ``validate`` arguments a corpus file gives on a ``# args:`` line (a factory's
    checks need ``--allow-factory``)."""
    lines = path.read_text(encoding="utf-8").splitlines()
    return next((line.removeprefix("# args: ").split() for line in lines[1:2]
                 if line.startswith("# args: ")), [])


def test_the_corpus_is_large_enough() -> None:
    assert len(BAD) >= 15


@pytest.mark.parametrize("path", BAD, ids=[p.stem for p in BAD])
def test_bad_scenario_gives_a_clear_error(path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    status = main(["validate", str(path), *_arguments(path)])
    captured = capsys.readouterr()
    assert status == 2, captured
    assert "Traceback" not in captured.err
    assert _expected(path) in captured.err, captured.err


def test_validate_lists_every_error_with_path_and_line(tmp_path: Path) -> None:
    data = json.loads(json.dumps(MINIMAL))
    data["clients"]["groups"][0].update(batch_size=0, count=-1, colour="red")
    data["server"]["window"] = -2
    file = tmp_path / "many.yaml"
    file.write_text(yaml.safe_dump(data, sort_keys=False), encoding="utf-8")
    with pytest.raises(ScenarioError) as caught:
        load_scenario(file)
    errors = caught.value.errors
    assert len(errors) == 4, errors
    text = "\n".join(errors)
    assert "clients.groups[0].batch_size (line" in text and "must be > 0" in text
    assert "clients.groups[0].count" in text
    assert "clients.groups[0].colour" in text and "unknown key" in text
    assert "server.window" in text


def _errors_by_key(data: dict[str, Any]) -> dict[str, str]:
    """The problems ``parse_scenario`` refuses ``data`` with, by the key each names."""
    with pytest.raises(ScenarioError) as caught:
        parse_scenario(data)
    return {line.split(":")[0].split(" (")[0]: line for line in caught.value.errors}


def test_unknown_keys_name_the_key_meant(tmp_path: Path) -> None:
    data = json.loads(json.dumps(MINIMAL))
    data["clients"]["groups"][0].update(clipp=1.0, sigma=1.0, colour="red")
    data["server"]["windw"] = 1.0
    data["stop"]["windos"] = 3
    by_key = _errors_by_key(data)
    assert by_key["clients.groups[0].clipp"].endswith("did you mean 'clip'?")
    assert by_key["server.windw"].endswith("did you mean 'window'?")
    assert by_key["stop.windos"].endswith("did you mean 'windows'?")
    # Nothing close at this level, but the key is accepted inside a field of the group.
    assert "it belongs under 'noise'" in by_key["clients.groups[0].sigma"]
    assert by_key["clients.groups[0].colour"].endswith("unknown key")


@pytest.mark.parametrize("path", SHIPPED, ids=[p.stem for p in SHIPPED])
def test_shipped_scenarios_are_valid(path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(REPO)
    scenario = load_scenario(path).scenario
    # The resolved dump is itself a valid scenario with the same content.
    again = parse_scenario(yaml.safe_load(dump_scenario(scenario)))
    assert again == scenario


def test_overrides_use_yaml_values_and_indices() -> None:
    data = json.loads(json.dumps(MINIMAL))
    apply_override(data, "clients.groups[0].batch_size=16")
    apply_override(data, "network.uplink.latency={kind: lognormal, median: 0.1, sigma: 0.5}")
    apply_override(data, "seed=7")
    scenario = parse_scenario(data)
    assert scenario.clients.groups[0].batch_size == 16
    assert scenario.seed == 7
    assert isinstance(scenario.network.uplink.latency, LogNormal)
    with pytest.raises(ConfigError, match="out of range"):
        apply_override(data, "clients.groups[3].count=1")
    with pytest.raises(ConfigError, match="path=value"):
        apply_override(data, "seed")
    # A list stepped into by name or by a dotted number: the error shows the index syntax.
    with pytest.raises(ConfigError, match=r"for example clients\.groups\[2\]\.count$"):
        apply_override(data, "clients.groups.2.count=1")
    with pytest.raises(ConfigError, match=r"for example clients\.groups\[0\]\.count$"):
        apply_override(data, "clients.groups.count=1")


def test_bare_numbers_mean_constants() -> None:
    data = json.loads(json.dumps(MINIMAL))
    data["clients"]["groups"][0]["speed"] = 0.25
    scenario = parse_scenario(data)
    group = scenario.clients.groups[0]
    assert group.speed == Constant(value=0.25)
    assert group.noise.kind == "constant" and group.noise.sigma == 1.0
    assert group.clip.kind == "constant" and group.clip.value == 1.0


def test_exponent_numbers_mean_numbers_in_the_shorthand_fields(tmp_path: Path) -> None:
    """A stranger: ``speed: 2e-3`` was refused ("must be a number or a mapping"), because
    PyYAML reads ``2e-3`` as text (YAML 1.1) while the plain float fields take it."""
    text = yaml.safe_dump(MINIMAL).replace("speed: 0.01", "speed: 2e-3") \
        .replace("clip: 1.0", "clip: 5E-1").replace("noise: 1.0", "noise: 1e0")
    path = tmp_path / "s.yaml"
    path.write_text(text)
    group = load_scenario(path).scenario.clients.groups[0]
    assert group.speed == Constant(value=0.002)
    assert group.clip.value == 0.5 and group.noise.sigma == 1.0
    data = json.loads(json.dumps(MINIMAL))
    data["clients"]["groups"][0]["speed"] = "fast"  # text that is no number: still refused
    with pytest.raises(ScenarioError, match="must be a number or a mapping"):
        parse_scenario(data)


def test_scenario_is_frozen() -> None:
    scenario = parse_scenario(MINIMAL)
    with pytest.raises(Exception, match="frozen"):
        scenario.seed = 3  # type: ignore[misc]


def test_schema_command_prints_the_json_schema(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["schema"]) == 0
    schema = json.loads(capsys.readouterr().out)
    assert schema == json.loads(json.dumps(scenario_json_schema(), sort_keys=True))
    assert schema["additionalProperties"] is False
    assert {"stop", "dataset", "model", "clients", "server"} <= set(schema["required"])
    assert Scenario.model_fields.keys() == schema["properties"].keys()


def test_a_single_group_holds_the_whole_training_set_unless_it_says_otherwise() -> None:
    """A stranger was told ``data_share`` is required with one group; it now defaults to 1
    there (and the resolved scenario says so), and stays required with several groups."""
    data = json.loads(json.dumps(MINIMAL))
    assert len(data["clients"]["groups"]) == 1
    data["clients"]["groups"][0].pop("data_share", None)
    assert parse_scenario(data).clients.groups[0].data_share == 1.0
    data["clients"]["groups"][0]["data_share"] = 0.25
    assert parse_scenario(data).clients.groups[0].data_share == 0.25
    second = {**data["clients"]["groups"][0], "name": "other"}
    del data["clients"]["groups"][0]["data_share"]
    data["clients"]["groups"].append(second)
    with pytest.raises(ConfigError, match=r"groups\[0\]\.data_share.*required"):
        parse_scenario(data)


def test_refused_choices_and_misplaced_keys_name_what_was_meant() -> None:
    """A stranger's review: enum typos had no suggestion, and a key of another section only one
    just below; the hints come from the schema's own fields and choices."""
    data = json.loads(json.dumps(MINIMAL))
    data["clients"]["groups"][0].update(sampling="poison", interrupt="swtich",
                                        noise={"kind": "constnt", "sigma": 1.0})
    data["server"]["batch_size"] = 3  # a group's key, not step_size (which it resembles)
    data["accountant"] = "pld"  # a group's key, two sections down
    data["clients"]["groups"][0]["accountant"] = "xyz"  # nothing like pld or rdp
    by_key = _errors_by_key(data)
    assert by_key["clients.groups[0].sampling"].endswith("(got \"poison\") - did you mean 'poisson'?")
    assert by_key["clients.groups[0].interrupt"].endswith("- did you mean 'switch'?")
    assert by_key["clients.groups[0].noise"].endswith("got 'constnt' - did you mean 'constant'?")
    assert by_key["server.batch_size"].endswith(
        "unknown key - 'batch_size' is a key of clients.groups[*]")
    assert by_key["accountant"].endswith("unknown key - 'accountant' is a key of clients.groups[*]")
    assert by_key["clients.groups[0].accountant"].endswith('(got "xyz")')


def test_a_word_for_a_choice_suggests_that_choice_not_a_spelling_neighbour() -> None:
    """A stranger's ``device: gpu`` was offered 'cpu' (closest by spelling); a word people use
    for a choice names that choice, only where the schema accepts it."""
    data = json.loads(json.dumps(MINIMAL))
    data["device"] = "gpu"
    data["clients"]["groups"][0]["sampling"] = "fixed-size"
    data["clients"]["groups"][0]["interrupt"] = "gpu"  # no 'cuda' here: no suggestion
    by_key = _errors_by_key(data)
    assert by_key["device"].endswith("(got \"gpu\") - did you mean 'cuda'?")
    assert by_key["clients.groups[0].sampling"].endswith("- did you mean 'fixed'?")
    assert by_key["clients.groups[0].interrupt"].endswith('(got "gpu")')


def test_validate_warns_of_a_dataset_path_that_holds_nothing(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A stranger's typo in dataset.path was said "valid", and runs silently took MNIST from
    elsewhere (one JSON log line said so): validate now warns, naming where runs look."""
    missing = tmp_path / "nonexist" / "mnist.npz"
    assert main(["validate", str(REPO / "scenarios" / "quickstart.yaml"), "--set",
                 f"dataset.path={missing}"]) == 0
    out = capsys.readouterr().out
    assert f"  warning: dataset.path {missing} holds no mnist (a typo?)" in out
    assert main(["validate", str(REPO / "scenarios" / "quickstart.yaml")]) == 0
    assert "dataset.path" not in capsys.readouterr().out


def test_hints_skip_free_form_mappings_and_stop_after_the_first_problems() -> None:
    """An attacker's review: model.options (any key is the model's) got a hint from elsewhere
    in the schema, and 20,000 unknown keys took 18 s, a schema search each."""
    from fedsim.config.loading import MAX_HINTED_ERRORS

    data = json.loads(json.dumps(MINIMAL))
    data["server"].update({f"windw{i}": 1 for i in range(3 * MAX_HINTED_ERRORS)})
    with pytest.raises(ScenarioError) as caught:
        parse_scenario(data)
    hinted = [line for line in caught.value.errors if line.endswith("did you mean 'window'?")]
    assert len(caught.value.errors) == 3 * MAX_HINTED_ERRORS
    assert len(hinted) == MAX_HINTED_ERRORS
    with pytest.raises(ConfigError) as refused:
        apply_override(json.loads(json.dumps(MINIMAL)), "model.options.a[0]=1")
    assert " - " not in str(refused.value)


def test_a_dataset_path_of_an_unknown_users_home_is_a_clear_error(
        capsys: pytest.CaptureFixture[str]) -> None:
    """``~nouser/x`` raised a RuntimeError traceback from Path.expanduser (an attacker's
    review)."""
    assert main(["validate", str(REPO / "scenarios" / "quickstart.yaml"), "--set",
                 "dataset.path=~no-such-user-fedsim/mnist.npz"]) == 2
    err = capsys.readouterr().err
    assert "~no-such-user-fedsim/mnist.npz: its ~user has no home directory here" in err
    assert "Traceback" not in err


def test_a_scenario_wide_checks_problem_names_its_field_and_line(tmp_path: Path) -> None:
    """A stranger: "scenario (line 1): clients.groups[0].speed: ...", the field inside the
    message and the line the file's first."""
    data = json.loads(json.dumps(MINIMAL))
    del data["clients"]["groups"][0]["speed"]  # 0 s a gradient: rounds take no time
    path = tmp_path / "s.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    with pytest.raises(ScenarioError) as raised:
        load_scenario(path)
    [problem] = raised.value.errors
    group_line = 1 + next(i for i, text in enumerate(path.read_text().splitlines())
                          if "- name: a" in text)
    assert problem.startswith(f"clients.groups[0].speed (line {group_line}): a round of group")
