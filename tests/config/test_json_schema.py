"""``fedsim schema`` describes what ``fedsim validate`` accepts: every shipped scenario passes
a JSON Schema validator (jsonschema) against the command's output, and each shorthand and each
refusal below gets the same answer from both."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml

from fedsim.cli import main
from fedsim.config import ScenarioError, load_scenario, parse_scenario

REPO = Path(__file__).resolve().parents[2]
SHIPPED = sorted((REPO / "scenarios").rglob("*.yaml")) + [
    REPO / "tests" / "deployment" / "four_clients.yaml"]
QUICKSTART = REPO / "scenarios" / "quickstart.yaml"


@pytest.fixture(scope="module")
def validator() -> jsonschema.protocols.Validator:
    """A validator for the schema exactly as ``fedsim schema`` prints it."""
    import contextlib
    import io

    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert main(["schema"]) == 0
    schema = json.loads(out.getvalue())
    cls = jsonschema.validators.validator_for(schema)
    cls.check_schema(schema)
    return cls(schema)


def _schema_accepts(validator: jsonschema.protocols.Validator, tree: Any) -> bool:
    return not list(validator.iter_errors(tree))


def _validate_accepts(tree: Any) -> bool:
    try:
        parse_scenario(tree)
    except ScenarioError:
        return False
    return True


def test_there_are_shipped_scenarios_in_folders() -> None:
    assert len(SHIPPED) >= 12 and any(p.parent.name == "papers" for p in SHIPPED)


@pytest.mark.parametrize("path", SHIPPED, ids=[p.stem for p in SHIPPED])
def test_every_shipped_scenario_passes_the_schema(
        path: Path, validator: jsonschema.protocols.Validator) -> None:
    load_scenario(path)  # validate accepts it ...
    tree = yaml.safe_load(path.read_text(encoding="utf-8"))
    errors = [f"{'/'.join(map(str, e.absolute_path))}: {e.message}"
              for e in validator.iter_errors(tree)]
    assert errors == []  # ... and so does the schema


def _quickstart_with(path: tuple[str | int, ...], value: Any) -> dict[str, Any]:
    tree = copy.deepcopy(yaml.safe_load(QUICKSTART.read_text(encoding="utf-8")))
    node = tree
    for part in path[:-1]:
        node = node[part]
    node[path[-1]] = value
    return tree


GROUP = ("clients", "groups", 0)
ACCEPTED = [
    (GROUP + ("clip",), 2),
    (GROUP + ("clip",), {"kind": "constant", "value": 0.5}),
    (GROUP + ("noise",), 1.3),
    (GROUP + ("noise",), {"sigma": 1.3}),  # a constant sigma without its kind
    (GROUP + ("noise",), {"kind": "constant", "sigma": 0.8}),
    (GROUP + ("speed",), 0),
    (GROUP + ("speed",), {"kind": "lognormal", "median": 0.01, "sigma": 0.5}),
]
REFUSED = [
    (GROUP + ("clip",), True),  # a boolean is not a number
    (GROUP + ("clip",), 0.0),  # the clip must be > 0
    (GROUP + ("clip",), {"value": 1.0}),  # a mapping needs its kind
    (GROUP + ("clip",), "1.0"),
    (GROUP + ("noise",), {"epsilon": 3.0, "delta": 1e-5}),  # a target needs its kind
    (GROUP + ("noise",), {}),
    (GROUP + ("speed",), -1),
    (GROUP + ("speed",), {"kind": "gamma", "mean": 1.0}),
    (GROUP + ("speed",), {"mean": 1.0}),
    (GROUP + ("speed",), [1.0]),
    (GROUP + ("batch_size",), 0),
    (GROUP + ("clipping",), 1.0),  # an unknown key
]


@pytest.mark.parametrize(("path", "value"), ACCEPTED, ids=[repr(v) for _, v in ACCEPTED])
def test_shorthands_are_accepted_by_both(path: tuple[str | int, ...], value: Any,
                                         validator: jsonschema.protocols.Validator) -> None:
    tree = _quickstart_with(path, value)
    assert _validate_accepts(tree)
    assert _schema_accepts(validator, tree)


@pytest.mark.parametrize(("path", "value"), REFUSED, ids=[repr(v) for _, v in REFUSED])
def test_bad_values_are_refused_by_both(path: tuple[str | int, ...], value: Any,
                                        validator: jsonschema.protocols.Validator) -> None:
    tree = _quickstart_with(path, value)
    assert not _validate_accepts(tree)
    assert not _schema_accepts(validator, tree)
