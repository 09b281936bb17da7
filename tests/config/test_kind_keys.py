"""A key of another kind of a tagged union (``{kind: windows, buffer_size: 4}``): the error says
whose key it is and offers the fix that fits where it came from.

A new user's report: ``--set server.aggregation.kind=windows`` on a FedBuff scenario read
``server.aggregation.buffer_size: unknown key - 'buffer_size' is a key of
server.aggregation``, a key refused and said to be accepted at the same place."""

from __future__ import annotations

import copy
import shlex
import typing
from pathlib import Path

import pytest
import yaml

from fedsim.cli import main
from fedsim.config import ScenarioError, apply_override, load_scenario, parse_scenario
from fedsim.config.overrides import format_path
from fedsim.config.suggestions import _members, _models_at, _models_in
from tests.config.test_scenario_files import MINIMAL as BASE

MINIMAL = {**BASE, "server": {"window": 1.0,
                              "aggregation": {"kind": "fedbuff", "buffer_size": 4}}}


@pytest.fixture(autouse=True)
def _only_scenario_commands(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("fedsim.cli.COMMANDS", ("run", "validate", "schema"))


def _errors(data: dict) -> dict[str, str]:
    with pytest.raises(ScenarioError) as caught:
        parse_scenario(data)
    return {line.split(":")[0].split(" (")[0]: line for line in caught.value.errors}


def _file(tmp_path: Path, data: dict) -> Path:
    file = tmp_path / "my.yaml"
    file.write_text(yaml.safe_dump(data, sort_keys=False), encoding="utf-8")
    return file


def test_the_reported_override_names_the_kinds_and_the_whole_value(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    file = _file(tmp_path, MINIMAL)
    for command in (["validate"], ["run", "--out", str(tmp_path / "out")]):
        assert main([*command, str(file), "--set", "server.aggregation.kind=windows"]) == 2
        err = capsys.readouterr().err
        assert ("server.aggregation.buffer_size: unknown key - 'buffer_size' is a key of kind "
                "'fedbuff', not of kind 'windows', the kind --set chose: replace the whole "
                "value, e.g. --set 'server.aggregation={kind: windows}'") in err, err
        assert "is a key of server.aggregation" not in err
    # The suggestion, run as written, is valid.
    suggested = shlex.split(err.rsplit("e.g. ", 1)[1].strip())
    assert main(["validate", str(file), *suggested]) == 0, capsys.readouterr().err


def test_a_file_that_names_another_kinds_key_is_told_to_remove_it_or_change_the_kind() -> None:
    data = copy.deepcopy(MINIMAL)
    data["server"]["aggregation"] = {"kind": "windows", "buffer_size": 4}
    data["clients"]["groups"][0]["noise"] = {"sigma": 1.0, "epsilon": 2.0}
    data["clients"]["groups"][0]["clip"] = {"kind": "constant", "value": 1.0,
                                            "final_ratio": 0.5}
    errors = _errors(data)
    assert errors["server.aggregation.buffer_size"].endswith(
        "unknown key - 'buffer_size' is a key of kind 'fedbuff', not of kind 'windows': "
        "remove it, or change the kind to 'fedbuff'")
    # A shorthand without its kind (a constant noise) says so; several kinds take epsilon.
    assert errors["clients.groups[0].noise.epsilon"].endswith(
        "unknown key - 'epsilon' is a key of kinds 'target', 'growing_mu' or 'clip_tied', not "
        "of kind 'constant', which a mapping without 'kind' stands for: remove it, or give one "
        "of those kinds")
    assert errors["clients.groups[0].clip.final_ratio"].endswith(
        "'final_ratio' is a key of kind 'decay', not of kind 'constant': remove it, or change "
        "the kind to 'decay'")


def test_a_key_added_by_an_override_is_offered_the_whole_value_of_its_kind(
        tmp_path: Path) -> None:
    data = copy.deepcopy(MINIMAL)
    data["clients"]["groups"][0]["noise"] = {"sigma": 1.0}
    file = _file(tmp_path, data)
    with pytest.raises(ScenarioError) as caught:
        load_scenario(file, ["clients.groups[0].noise.epsilon=3"])
    (line,) = caught.value.errors
    assert line.endswith(
        "'epsilon' is a key of kinds 'target', 'growing_mu' or 'clip_tied', not of kind "
        "'constant', which a mapping without 'kind' stands for: set the whole value with its "
        "kind, e.g. --set 'clients.groups[0].noise={kind: target, epsilon: 3, delta: ...}'")
    # A required key the value lacks is shown as "...": the kind's own error names it too.
    with pytest.raises(ScenarioError) as caught:
        load_scenario(file, ["clients.groups[0].speed={kind: lognormal, median: 1, sigma: 1}",
                             "clients.groups[0].speed.kind=exponential"])
    assert any(line.endswith("the kind --set chose: replace the whole value, e.g. --set "
                             "'clients.groups[0].speed={kind: exponential, mean: ...}'")
               for line in caught.value.errors), caught.value.errors


def test_python_overrides_name_themselves() -> None:
    import fedsim

    with pytest.raises(ScenarioError) as caught:
        fedsim.load_scenario(MINIMAL, {"server.aggregation.kind": "fedasync"})
    (line,) = caught.value.errors
    assert line.endswith("not of kind 'fedasync', the kind overrides chose: replace the whole "
                         "value, e.g. overrides entry 'server.aggregation={kind: fedasync}'")


def test_a_typo_close_to_another_kinds_key_says_whose_it_is() -> None:
    data = copy.deepcopy(MINIMAL)
    data["server"]["aggregation"] = {"kind": "windows", "buffer_sise": 4}
    assert _errors(data)["server.aggregation.buffer_sise"].endswith(
        "did you mean 'buffer_size'? (a key of kind 'fedbuff', not of 'windows')")


def test_a_mapping_without_its_kind_is_told_the_kinds_its_keys_fit() -> None:
    data = copy.deepcopy(MINIMAL)
    data["server"]["aggregation"] = {"buffer_size": 4}
    data["clients"]["groups"][0]["noise"] = {"epsilon": 2.0, "delta": 1e-5}
    errors = _errors(data)
    assert errors["server.aggregation"].endswith(
        "needs a 'kind' key - its keys fit kind 'fedbuff' (add 'kind: fedbuff')")
    assert errors["clients.groups[0].noise"].endswith(
        "needs a 'kind' key - its keys fit kinds 'target', 'growing_mu' or 'clip_tied' (add "
        "'kind: target')")


def _tagged_unions() -> list[tuple[str | int, ...]]:
    """Every place the scenario holds a mapping chosen by its ``kind``."""
    found: list[tuple[str | int, ...]] = []

    def walk(path: list[str | int]) -> None:
        for model in _models_at(path):
            for name, field in model.model_fields.items():
                if not _models_in(field.annotation):
                    continue
                listed = any(typing.get_origin(a) is list
                             for a in (field.annotation, *typing.get_args(field.annotation)))
                child = [*path, name, 0] if listed else [*path, name]
                if _members(child) and tuple(child) not in found:
                    found.append(tuple(child))
                walk(child)

    walk([])
    return found


UNIONS = _tagged_unions()


def test_every_tagged_union_is_found() -> None:
    shown = {format_path(path) for path in UNIONS}
    assert {"server.aggregation", "server.step_size", "clients.groups[0].noise",
            "clients.groups[0].clip", "clients.groups[0].speed", "clients.groups[0].compression",
            "network.uplink.latency", "clients.groups[0].availability.online"} <= shown, shown


@pytest.mark.parametrize("path", UNIONS, ids=[format_path(p) for p in UNIONS])
def test_every_tagged_union_says_whose_key_it_is(path: tuple[str | int, ...]) -> None:
    """Each kind against each other kind with a key of its own, from the file and from an
    override that changed the kind."""
    members = _members(path)
    assert len(members) > 1
    where = format_path(path)
    for chosen, model in members.items():
        for owner, other in members.items():
            key = next((k for k in other.model_fields if k not in model.model_fields), None)
            if key is None:
                continue
            data = apply_override(copy.deepcopy(MINIMAL), f"{where}={{kind: {chosen}, {key}: 1}}")
            assert f"'{key}' is a key of" in _errors(data)[f"{where}.{key}"]
            line = _errors(data)[f"{where}.{key}"]
            assert f"not of kind '{chosen}': remove it, or change the kind to" in line, line
            written = apply_override(copy.deepcopy(MINIMAL), f"{where}={{kind: {owner}, {key}: 1}}")
            changed = apply_override(copy.deepcopy(written), f"{where}.kind={chosen}")
            with pytest.raises(ScenarioError) as caught:
                parse_scenario(changed, written=written)
            line = next(line for line in caught.value.errors
                        if line.startswith(f"{where}.{key}:"))
            assert (f"not of kind '{chosen}', the kind --set chose: replace the whole value, "
                    f"e.g. --set '{where}={{kind: {chosen}") in line, line



# Sections with one ``kind`` field (not a union of models) refuse a key their kind does not
# read: {kind: sgd, beta2: 0.9} ran as plain SGD, the key accepted and ignored.
@pytest.mark.parametrize(("path", "section", "key", "readers"), [
    (("server", "optimizer"), {"kind": "sgd", "beta2": 0.9}, "beta2", "s 'adam' or 'yogi'"),
    (("server", "optimizer"), {"kind": "momentum", "tau": 0.01}, "tau", "s 'adam' or 'yogi'"),
    (("server", "staleness_weight"), {"kind": "polynomial", "b": 2}, "b", " 'hinge'"),
    (("server", "staleness_weight"), {"kind": "constant", "a": 2}, "a",
     "s 'polynomial' or 'hinge'"),
    (("clients", "groups", 0, "step_sequence"), {"kind": "exponential", "decay": 0.1},
     "decay", " 'inverse_time'"),
    (("clients", "groups", 0, "partition"), {"scheme": "iid", "alpha": 0.1}, "alpha",
     " 'dirichlet'"),
])
def test_a_key_its_kind_does_not_read_is_refused(path: tuple, section: dict, key: str,
                                                 readers: str) -> None:
    data = copy.deepcopy(MINIMAL)
    place = data
    for part in path[:-1]:
        place = place[part]
    place[path[-1]] = section
    errors = _errors(data)
    where = format_path(path)
    assert where in errors, errors
    field = "scheme" if "scheme" in section else "kind"
    # (readers: " 'a'" for one kind, "s 'a' or 'b'" for several, as kinds_text writes them)
    assert (f"{field} {section[field]!r} does not read {key!r} ({key!r} is read by {field}"
            f"{readers}): remove it, or change the {field}") in errors[where]
    # the same section with only its kind's own keys is accepted
    place[path[-1]] = {k: v for k, v in section.items() if k != key}
    parse_scenario(data)


def test_a_key_at_its_default_is_let_be_as_a_resolved_scenario_writes_it() -> None:
    data = copy.deepcopy(MINIMAL)
    data["server"]["optimizer"] = {"kind": "sgd", "beta1": 0.9, "beta2": 0.99, "tau": 1e-3}
    assert parse_scenario(data).server.optimizer.kind == "sgd"


def _sections_with_kind_tables() -> list[tuple[type, str]]:
    """Every section of the schema that declares its kinds' keys, and its kind field."""
    from pydantic import BaseModel

    from fedsim.config import aggregation, schema

    found = {}
    for module in (aggregation, schema):
        for value in vars(module).values():
            if isinstance(value, type) and issubclass(value, BaseModel) \
                    and "KEYS_OF_KIND" in vars(value):
                field = "scheme" if "scheme" in value.model_fields else "kind"
                found[value.__name__] = (value, field)
    return sorted(found.values(), key=lambda item: item[0].__name__)


@pytest.mark.parametrize(("section", "field"), _sections_with_kind_tables(),
                         ids=lambda v: getattr(v, "__name__", v))
def test_each_kind_table_names_every_kind_and_every_key(section: type, field: str) -> None:
    """A kind added without a row raised KeyError (a traceback) in the validator; a key in no
    row was refused for every kind."""
    table = section.KEYS_OF_KIND
    assert set(table) == set(typing.get_args(section.model_fields[field].annotation))
    assert set().union(*table.values()) == set(section.model_fields) - {field}


def test_the_kind_tables_are_found() -> None:
    assert {s.__name__ for s, _ in _sections_with_kind_tables()} == {
        "LocalStepSequence", "Partition", "ServerOptimizerConfig", "StalenessWeighting"}
