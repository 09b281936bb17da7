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


def test_a_kinds_name_where_its_mapping_goes_is_offered_the_mapping(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A stranger's ``--set server.aggregation=fedbuff`` was told only that it must be a
    mapping: the hint writes the mapping of that kind (or of the kind its name is close to),
    with '...' for what the kind requires, and nothing for a name no kind is close to."""
    file = _file(tmp_path, MINIMAL)
    for given, whole in (("fedbuff", "{kind: fedbuff, buffer_size: ...}"),
                         ("fedbuf", "{kind: fedbuff, buffer_size: ...}"),
                         ("windows", "{kind: windows}")):
        assert main(["validate", str(file), "--set", f"server.aggregation={given}"]) == 2
        err = capsys.readouterr().err
        assert (f'must be a mapping: its keys indented under it, or {{key: value}} (got '
                f'"{given}") - a kind is chosen inside its mapping: --set '
                f"'server.aggregation={whole}'") in err, err
    assert main(["validate", str(file), "--set", "server.aggregation=banana"]) == 2
    assert "a kind is chosen" not in capsys.readouterr().err
    # Where a number stands for a constant (a speed, a clip), a kind's name is a word too.
    assert main(["validate", str(file), "--set", "clients.groups[0].speed=lognormal"]) == 2
    assert ("(got \"lognormal\") - a kind is chosen inside its mapping: --set "
            "'clients.groups[0].speed={kind: lognormal, median: ..., sigma: ...}'"
            ) in capsys.readouterr().err
    assert main(["validate", str(file), "--set", "clients.groups[0].speed=fast"]) == 2
    assert "a kind is chosen" not in capsys.readouterr().err
    # The suggestion with its required value filled in is valid.
    assert main(["validate", str(file), "--set",
                 "server.aggregation={kind: fedbuff, buffer_size: 3}"]) == 0


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
# read: {kind: sgd, beta2: 0.9} ran as plain SGD, the key accepted and ignored. The refusal is
# placed at the key and completed with the tagged unions' hint (key_of_another_kind): it was
# placed at the section and always said "remove it, or change the kind", which a
# ``--set server.optimizer.kind=sgd`` over a file holding beta2 cannot do.
_UNREAD = [
    (("server", "optimizer"), {"kind": "sgd", "beta2": 0.9}, "beta2", "s 'adam' or 'yogi'",
     "one of those"),
    (("server", "optimizer"), {"kind": "momentum", "tau": 0.01}, "tau", "s 'adam' or 'yogi'",
     "one of those"),
    (("server", "staleness_weight"), {"kind": "polynomial", "b": 2}, "b", " 'hinge'",
     "'hinge'"),
    (("server", "staleness_weight"), {"kind": "constant", "a": 2}, "a",
     "s 'polynomial' or 'hinge'", "one of those"),
    (("clients", "groups", 0, "step_sequence"), {"kind": "exponential", "decay": 0.1},
     "decay", " 'inverse_time'", "'inverse_time'"),
    (("clients", "groups", 0, "partition"), {"scheme": "iid", "alpha": 0.1}, "alpha",
     " 'dirichlet'", "'dirichlet'"),
]


@pytest.mark.parametrize(("path", "section", "key", "readers", "change"), _UNREAD,
                         ids=[format_path((*case[0], case[2])) for case in _UNREAD])
def test_a_key_its_kind_does_not_read_is_refused_at_the_key(
        path: tuple, section: dict, key: str, readers: str, change: str) -> None:
    data = copy.deepcopy(MINIMAL)
    place = data
    for part in path[:-1]:
        place = place[part]
    place[path[-1]] = section
    errors = _errors(data)
    where = format_path((*path, key))
    assert list(errors) == [where], errors  # the key's path, not the section's
    field = "scheme" if "scheme" in section else "kind"
    kind = section[field]
    # (readers: " 'a'" for one kind, "s 'a' or 'b'" for several, as kinds_text writes them)
    assert errors[where] == (
        f"{where}: not read by {field} {kind!r} - {key!r} is a key of {field}{readers}, not "
        f"of {field} {kind!r}: remove it, or change the {field} to {change}")
    # the same section with only its kind's own keys is accepted
    place[path[-1]] = {k: v for k, v in section.items() if k != key}
    parse_scenario(data)


def test_each_key_its_kind_does_not_read_is_its_own_problem_with_its_line(
        tmp_path: Path) -> None:
    data = copy.deepcopy(MINIMAL)
    data["server"]["optimizer"] = {"kind": "sgd", "beta2": 0.9, "tau": 0.01}
    file = tmp_path / "my.yaml"
    file.write_text(yaml.safe_dump(data, sort_keys=False, default_flow_style=False),
                    encoding="utf-8")
    lines = file.read_text(encoding="utf-8").splitlines()
    with pytest.raises(ScenarioError) as caught:
        load_scenario(file)
    assert [line.split(": not read by")[0] for line in caught.value.errors] == [
        f"server.optimizer.{key} (line {lines.index(f'    {key}: {value}') + 1})"
        for key, value in (("beta2", 0.9), ("tau", 0.01))], caught.value.errors
    # Without 'kind', the default kind chose: the hint says so, as a tagged union's does.
    data["server"]["optimizer"] = {"beta2": 0.9}
    assert _errors(data)["server.optimizer.beta2"].endswith(
        "not of kind 'sgd', which a mapping without 'kind' stands for: remove it, or give one "
        "of those kinds")


# Each section: (path, the kind the file writes with its key, the key and its value, another
# kind that does not read the key, the kinds that read it as the hint names them).
KIND_KEY_CASES = [
    ("server.optimizer", "adam", "beta2", "0.9", "sgd", "kinds 'adam' or 'yogi'"),
    ("server.staleness_weight", "hinge", "b", "2", "polynomial", "kind 'hinge'"),
    ("clients.groups[0].step_sequence", "exponential", "factor", "0.9", "inverse_time",
     "kind 'exponential'"),
    ("clients.groups[0].partition", "dirichlet", "alpha", "0.1", "iid", "scheme 'dirichlet'"),
]


def _suggested(err: str) -> list[str]:
    """The ``--set`` an error suggests, as a shell would pass it."""
    return shlex.split(err.rsplit("e.g. ", 1)[1].strip().splitlines()[0])


@pytest.mark.parametrize(("where", "owner", "key", "value", "other", "owners"),
                         KIND_KEY_CASES, ids=[case[0] for case in KIND_KEY_CASES])
def test_each_fix_fits_where_the_mismatch_came_from_and_the_whole_value_validates(
        tmp_path: Path, capsys: pytest.CaptureFixture[str],
        where: str, owner: str, key: str, value: str, other: str, owners: str) -> None:
    field = "scheme" if where.endswith("partition") else "kind"
    head = (f"{where}.{key}: not read by {field} '{other}' - '{key}' is a key of {owners}, "
            f"not of {field} '{other}'")
    # An override changed the kind, over a file holding the other kind's key: the whole
    # value of the kind it chose (a key cannot be removed on the command line).
    written = apply_override(copy.deepcopy(MINIMAL), f"{where}={{{field}: {owner}, {key}: {value}}}")
    file = _file(tmp_path, written)
    assert main(["validate", str(file)]) == 0, capsys.readouterr().err
    assert main(["validate", str(file), "--set", f"{where}.{field}={other}"]) == 2
    err = capsys.readouterr().err
    assert (f"  {head}, the {field} --set chose: replace the whole value, e.g. "
            f"--set '{where}={{{field}: {other}}}'") in err, err
    assert "remove it" not in err
    assert main(["validate", str(file), *_suggested(err)]) == 0, capsys.readouterr().err
    # An override added the key: the whole value of the key's kind.
    written = apply_override(copy.deepcopy(MINIMAL), f"{where}={{{field}: {other}}}")
    file = _file(tmp_path, written)
    assert main(["validate", str(file), "--set", f"{where}.{key}={value}"]) == 2
    err = capsys.readouterr().err
    assert (f"  {head}: set the whole value with its {field}, e.g. "
            f"--set '{where}={{{field}: {owner}, {key}: {value}}}'") in err, err
    assert main(["validate", str(file), *_suggested(err)]) == 0, capsys.readouterr().err
    # The same mismatch written in the file: remove the key or change the kind.
    file = _file(tmp_path, apply_override(written, f"{where}.{key}={value}"))
    assert main(["validate", str(file)]) == 2
    err = capsys.readouterr().err
    change = f"'{owner}'" if owners.startswith(field + " ") else "one of those"
    assert f"{where}.{key} (line " in err, err
    assert head.split(": ", 1)[1] + f": remove it, or change the {field} to {change}" in err, err


# Values each key may take that differ from its default (a key at its default is let be).
_NOT_DEFAULT = {"beta1": 0.5, "beta2": 0.9, "tau": 0.01, "a": 2, "b": 2, "decay": 0.1,
                "power": 2, "factor": 0.9, "minimum": 0.1, "alpha": 0.1,
                "shards_per_client": 3, "size_sigma": 0.5}
_KIND_SECTIONS = {"server.optimizer": ("aggregation", "ServerOptimizerConfig"),
                  "server.staleness_weight": ("aggregation", "StalenessWeighting"),
                  "clients.groups[0].step_sequence": ("aggregation", "LocalStepSequence"),
                  "clients.groups[0].partition": ("schema", "Partition")}


@pytest.mark.parametrize("where", list(_KIND_SECTIONS))
def test_every_kind_section_says_whose_key_it_is(where: str) -> None:
    """Each kind against each key it does not read, from the file and from an override that
    changed the kind; the whole value offered, applied, validates that section."""
    import importlib

    module, name = _KIND_SECTIONS[where]
    section = getattr(importlib.import_module(f"fedsim.config.{module}"), name)
    field = "scheme" if "scheme" in section.model_fields else "kind"
    table = section.KEYS_OF_KIND
    assert set().union(*table.values()) <= set(_NOT_DEFAULT)
    for chosen, reads in table.items():
        for key in sorted(set().union(*table.values()) - reads):
            owner = next(kind for kind, keys in table.items() if key in keys)
            value = _NOT_DEFAULT[key]
            data = apply_override(copy.deepcopy(MINIMAL),
                                  f"{where}={{{field}: {chosen}, {key}: {value}}}")
            line = _errors(data).get(f"{where}.{key}", "")
            assert f": not read by {field} '{chosen}' - '{key}' is a key of" in line, line
            assert f"not of {field} '{chosen}': remove it, or change the {field} to" in line
            written = apply_override(copy.deepcopy(MINIMAL),
                                     f"{where}={{{field}: {owner}, {key}: {value}}}")
            changed = apply_override(copy.deepcopy(written), f"{where}.{field}={chosen}")
            with pytest.raises(ScenarioError) as caught:
                parse_scenario(changed, written=written)
            line = next((line for line in caught.value.errors
                         if line.startswith(f"{where}.{key}:")), caught.value.errors)
            assert (f"not of {field} '{chosen}', the {field} --set chose: replace the whole "
                    f"value, e.g. --set '{where}={{{field}: {chosen}}}'") in line, line
            (_, assignment) = shlex.split(line.rsplit("e.g. ", 1)[1])
            parse_scenario(apply_override(copy.deepcopy(written), assignment))


def test_python_overrides_of_a_kind_name_themselves() -> None:
    import fedsim

    data = apply_override(copy.deepcopy(MINIMAL), "server.optimizer={kind: adam, beta2: 0.9}")
    with pytest.raises(ScenarioError) as caught:
        fedsim.load_scenario(data, {"server.optimizer.kind": "momentum"})
    (line,) = caught.value.errors
    assert line.endswith("not of kind 'momentum', the kind overrides chose: replace the whole "
                         "value, e.g. overrides entry 'server.optimizer={kind: momentum}'")


def test_a_kinds_key_refused_beside_another_error_in_its_section_keeps_its_fix(
        tmp_path: Path) -> None:
    """pydantic skips the section's rule above a field's error; cross_field judges it, and
    its hint still knows the override."""
    file = _file(tmp_path, apply_override(copy.deepcopy(MINIMAL),
                                          "clients.groups[0].step_sequence={kind: exponential}"))
    with pytest.raises(ScenarioError) as caught:
        load_scenario(file, ["clients.groups[0].step_sequence.decay=0.1",
                             "clients.groups[0].step_sequence.factor=2"])
    assert caught.value.errors[0].startswith("clients.groups[0].step_sequence.factor: must be")
    assert caught.value.errors[1] == (
        "clients.groups[0].step_sequence.decay: not read by kind 'exponential' - 'decay' is a "
        "key of kind 'inverse_time', not of kind 'exponential': set the whole value with its "
        "kind, e.g. --set 'clients.groups[0].step_sequence={kind: inverse_time, decay: 0.1}'")


def test_a_section_validated_alone_says_its_own_problem() -> None:
    """Outside a scenario file (a section validated from Python), the error's own text names
    the keys and their kinds."""
    from pydantic import ValidationError

    from fedsim.config.aggregation import ServerOptimizerConfig

    with pytest.raises(ValidationError, match=r"kind 'sgd' does not read 'beta2', 'tau' "
                       r"\('beta2' is read by kinds 'adam' or 'yogi'; 'tau' is read by kinds "
                       r"'adam' or 'yogi'\)"):
        ServerOptimizerConfig.model_validate({"kind": "sgd", "beta2": 0.9, "tau": 0.01})


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
