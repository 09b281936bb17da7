"""Reading scenario files: YAML -> ``--set`` overrides -> :class:`Scenario`, with errors that
name the YAML path (and line) of what is wrong.

Every problem in a file is reported at once (``fedsim validate`` lists them all): the fields'
errors, then the checks that tie fields together wherever every field they read is valid
(:mod:`fedsim.config.cross_field`; pydantic runs them only on valid fields); loading raises
:class:`ScenarioError`, a :class:`~fedsim.errors.ConfigError` (exit status 2) whose ``errors``
holds one line per problem, e.g. ``clients.groups[1].batch_size (line 23): must be > 0``.

A path inside a scenario (``dataset.path``) is kept as written; :class:`LoadedScenario` records
the scenario file's directory, against which :mod:`fedsim.data.locate` resolves it (then
against the working directory) when the data is read, so a scenario works from any working
directory. A named data set needs no path at all.
"""

from __future__ import annotations

import copy
import json
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import Any

import yaml
from pydantic import ValidationError
from pydantic.json_schema import GenerateJsonSchema, JsonSchemaValue
from pydantic_core import core_schema

from fedsim.atomic import read_regular
from fedsim.config import limits
from fedsim.config.cross_field import cross_field_problems
from fedsim.config.kind_keys import KeysOfOtherKinds, kinds_text
from fedsim.config.overrides import assign_path
from fedsim.config.schema import FieldProblem, Scenario
from fedsim.config.suggestions import (
    KindFix,
    did_you_mean,
    first_unknown_key,
    key_of_another_kind,
    kind_for_a_mapping,
    kinds_fitting,
    meant_choice,
)
from fedsim.errors import ConfigError

__all__ = [
    "LoadedScenario",
    "ScenarioError",
    "apply_override",
    "dump_scenario",
    "load_scenario",
    "parse_scenario",
    "scenario_json_schema",
]


_MAX_SHOWN_ERRORS = 50  # a file with thousands of bad values lists the first ones


class ScenarioError(ConfigError):
    """A scenario file has one or more problems; ``errors`` lists each with its YAML path."""

    def __init__(self, source: str, errors: Sequence[str]) -> None:
        self.source = source
        self.errors = list(errors)
        count = len(self.errors)
        head = f"{source}: {count} problem{'s' if count != 1 else ''}"
        shown = self.errors[:_MAX_SHOWN_ERRORS]
        if count > len(shown):
            shown.append(f"... and {count - len(shown)} more")
        super().__init__("\n  ".join([head, *shown]))


YamlPath = tuple[str | int, ...]
"""A place in a scenario's tree: keys and list indices from its root."""


@dataclass(frozen=True)
class LoadedScenario:
    """A validated scenario and where it came from (for resolving relative paths).

    ``allow_factories``: the user opted in to running the factories it names
    (:func:`fedsim.config.factories.require_allowed`); without it a run that would import one
    is refused. ``described``: what its errors call it (the file as given, with its
    overrides); ``lines``: the 1-based line of each place written in the file, kept at load
    time (empty where overrides changed the tree, or it came from no file), so a problem
    found later, with the data set, is reported as loading reports one
    (:meth:`problems_error`)."""

    scenario: Scenario
    source: Path | None
    allow_factories: bool = False
    described: str | None = None
    lines: Mapping[YamlPath, int] = field(
        default_factory=lambda: MappingProxyType({}), compare=False, repr=False)

    @property
    def base_dir(self) -> Path:
        return self.source.parent if self.source is not None else Path.cwd()

    def problems_error(self, problems: Sequence[FieldProblem]) -> ScenarioError:
        """A :class:`ScenarioError` listing ``problems`` as loading lists a file's: each at its
        path, with its line where the file wrote it, under the ``<file>: N problems`` header
        (the checks that need the data set: :func:`fedsim.training.preflight.batch_problem`)."""
        name = self.described or (str(self.source) if self.source is not None else "<scenario>")
        return ScenarioError(name, [_problem_line(problem.path, problem.message, self.lines)
                                    for problem in problems])


# ---------------------------------------------------------------------------------------------
# YAML with duplicate keys rejected, bounded depth and size, and line numbers kept


class _StrictLoader(yaml.SafeLoader):  # type: ignore[misc]  # PyYAML ships no types
    """A SafeLoader that refuses duplicate mapping keys (PyYAML silently keeps the last) and
    nesting deeper than :data:`~fedsim.config.limits.MAX_YAML_DEPTH` (the composer recurses
    once per level, so a deep file would otherwise exhaust Python's recursion limit)."""

    def __init__(self, stream: str) -> None:
        super().__init__(stream)
        self._depth = 0
        self._nodes = 0

    def compose_node(self, parent: yaml.Node | None, index: Any) -> yaml.Node | None:
        self._depth += 1
        self._nodes += 1
        try:
            if self._depth > limits.MAX_YAML_DEPTH:
                raise yaml.composer.ComposerError(
                    None, None, f"nested deeper than {limits.MAX_YAML_DEPTH} levels",
                    self.peek_event().start_mark)
            if self._nodes > limits.MAX_YAML_VALUES:  # stop early: each node costs time and memory
                raise yaml.composer.ComposerError(
                    None, None, f"holds more than {limits.MAX_YAML_VALUES} values",
                    self.peek_event().start_mark)
            return super().compose_node(parent, index)
        finally:
            self._depth -= 1


_MERGE_TAG = "tag:yaml.org,2002:merge"


def _construct_mapping(
    loader: _StrictLoader, node: yaml.MappingNode, deep: bool = False
) -> dict[Any, Any]:
    # Keys written in this mapping must be unique; keys it takes from a merge (``<<: *base``)
    # may be overridden by a written key (YAML merge-key semantics: the written key wins).
    seen: set[Any] = set()
    for key_node, _ in node.value:
        if key_node.tag == _MERGE_TAG:
            continue
        key = loader.construct_object(key_node, deep=deep)
        try:
            duplicate = key in seen
            seen.add(key)
        except TypeError:  # an unhashable key (a list or mapping): the constructor refuses it
            continue
        if duplicate:
            raise yaml.constructor.ConstructorError(
                None, None, f"duplicate key {key!r}", key_node.start_mark
            )
    return loader.construct_mapping(node, deep=deep)


_StrictLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _construct_mapping)
# A number with an exponent is a number (YAML 1.2): PyYAML follows YAML 1.1, which reads
# ``1e-3`` and ``1.0e3`` as text; the plain float fields took that text, the shorthand fields
# (``speed: 2e-3``, ``clip``, ``noise``) refused it (a stranger's review).
_StrictLoader.add_implicit_resolver(
    "tag:yaml.org,2002:float",
    re.compile(r"^[-+]?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)[eE][-+]?[0-9]+$"),
    list("-+.0123456789"))


def _expanded_size(root: yaml.Node) -> None:
    """Refuse a document whose tree, aliases expanded, is deeper than MAX_YAML_DEPTH or has
    more than MAX_YAML_VALUES values (each anchored node is measured once)."""
    sizes: dict[int, int] = {}
    open_nodes: set[int] = set()

    def measure(node: yaml.Node, depth: int) -> int:
        if depth > limits.MAX_YAML_DEPTH:
            raise yaml.composer.ComposerError(
                None, None, f"nested deeper than {limits.MAX_YAML_DEPTH} levels once its "
                "aliases are expanded", node.start_mark)
        key = id(node)
        if key in sizes:
            return sizes[key]
        if key in open_nodes:
            raise yaml.composer.ComposerError(
                None, None, "an alias refers to a node that contains it (a recursive "
                "structure)", node.start_mark)
        open_nodes.add(key)
        if isinstance(node, yaml.MappingNode):
            size = 1 + sum(measure(k, depth + 1) + measure(v, depth + 1) for k, v in node.value)
        elif isinstance(node, yaml.SequenceNode):
            size = 1 + sum(measure(item, depth + 1) for item in node.value)
        else:
            size = 1
        open_nodes.discard(key)
        if size > limits.MAX_YAML_VALUES:
            raise yaml.composer.ComposerError(
                None, None, f"stands for more than {limits.MAX_YAML_VALUES} values once its "
                "aliases are expanded", node.start_mark)
        sizes[key] = size
        return size

    measure(root, 1)


def _yaml_error(exc: yaml.YAMLError, text: str) -> str:
    mark = getattr(exc, "problem_mark", None)
    if isinstance(exc, yaml.reader.ReaderError):  # a character YAML does not allow
        line = text.count("\n", 0, exc.position) + 1
        column = exc.position - (text.rfind("\n", 0, exc.position) + 1) + 1
        code = exc.character if isinstance(exc.character, int) else ord(exc.character)
        return (f"not valid YAML (line {line}, column {column}): the control character "
                f"U+{code:04X} is not allowed in YAML")
    where = f" (line {mark.line + 1}, column {mark.column + 1})" if mark is not None else ""
    problem = getattr(exc, "problem", None) or str(exc)
    return f"not valid YAML{where}: {problem}"


def _load_yaml(text: str) -> tuple[Any, yaml.Node | None]:
    """(plain tree, node tree) of one YAML document, bounded in depth and expanded size."""
    loader = _StrictLoader(text)
    try:
        node = loader.get_single_node()
        if node is not None:
            _expanded_size(node)
        return (loader.construct_document(node) if node is not None else None), node
    finally:
        loader.dispose()


def _read_yaml(text: str, source: str) -> tuple[Any, yaml.Node | None]:
    try:
        return _load_yaml(text)
    except yaml.YAMLError as exc:
        raise ScenarioError(source, [_yaml_error(exc, text)]) from None


def _read_text(path: str | Path) -> str:
    """The file's text: a regular file (a FIFO would block the reader: a run directory's
    ``scenario.resolved.yaml`` is read by ``fedsim report``) of at most MAX_SCENARIO_BYTES
    (refused before parsing), UTF-8."""
    limit = limits.MAX_SCENARIO_BYTES
    try:
        raw = read_regular(path, limit + 1)
    except FileNotFoundError:
        raise ConfigError(f"{path}: no such scenario file") from None
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read the scenario file: {exc.strerror or exc}") from None
    if len(raw) > limit:
        raise ScenarioError(str(path), [
            f"the file is larger than {limit / 2**20:g} MiB, the limit for scenario files "
            "(scenarios are a few KiB; generate a smaller one)"])
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = raw.count(b"\n", 0, exc.start) + 1
        column = exc.start - (raw.rfind(b"\n", 0, exc.start) + 1) + 1
        raise ScenarioError(str(path), [
            f"not UTF-8 text (line {line}, column {column}: byte 0x{raw[exc.start]:02x}); "
            "save the file as UTF-8"]) from None


def _positions(node: yaml.Node | None) -> Mapping[YamlPath, int]:
    """The 1-based line of every place in a YAML node tree (as constructed: merge keys
    expanded, a key written beside a merge winning): a mapping's entry by its key's line (a
    key whose value is a block mapping starts a line above its value, and blank lines may
    come between: a stranger's mistyped ``netwrok:`` was reported at its value's line), a
    list's item by its own, ``()`` the document's. Aliases are expanded (bounded by
    :func:`_expanded_size`)."""
    lines: dict[YamlPath, int] = {}

    def walk(at: yaml.Node, path: YamlPath, line: int) -> None:
        lines[path] = line
        if isinstance(at, yaml.MappingNode):
            entries = {key.value: (key, value) for key, value in at.value
                       if isinstance(key, yaml.ScalarNode)}  # the last of a key wins
            for name, (key, value) in entries.items():
                walk(value, (*path, name), key.start_mark.line + 1)
        elif isinstance(at, yaml.SequenceNode):
            for index, item in enumerate(at.value):
                walk(item, (*path, index), item.start_mark.line + 1)

    if node is not None:
        walk(node, (), node.start_mark.line + 1)
    return MappingProxyType(lines)


def _line_at(lines: Mapping[YamlPath, int], path: Sequence[str | int]) -> int | None:
    """The line of ``path`` in :func:`_positions`'s map: of its deepest ancestor the file
    wrote (a default's place is its section's line), None without a file."""
    for end in range(len(path), -1, -1):
        line = lines.get(tuple(path[:end]))
        if line is not None:
            return line
    return None


def _problem_line(path: Sequence[str | int], message: str,
                  lines: Mapping[YamlPath, int]) -> str:
    """A problem as :class:`ScenarioError` lists it: ``path (line L): message``."""
    line = _line_at(lines, path)
    at = f" (line {line})" if line is not None else ""
    return f"{_format_path(path) or 'scenario'}{at}: {message}"


# ---------------------------------------------------------------------------------------------
# --set overrides

def apply_override(data: Any, assignment: str, label: str = "--set") -> Any:
    """Apply one ``path=value`` (value parsed as YAML) to a plain scenario tree, returning it.

    ``path`` may select list items: ``[0]``, ``[*]`` (all), ``[name]`` (the item with that
    ``name``); see :mod:`fedsim.config.overrides`. Errors begin with ``label``: ``--set`` on
    the command line, ``overrides`` from Python.
    """
    path, sep, raw_value = assignment.partition("=")
    if not sep:
        raise ConfigError(f"{label} {assignment!r}: expected path=value")
    try:
        value = _load_yaml(raw_value)[0] if raw_value.strip() else None
    except yaml.YAMLError as exc:
        raise ConfigError(f"{label} {path.strip()}: {_yaml_error(exc, raw_value)}") from None
    return assign_path(data, path.strip(), value, hint=first_unknown_key, label=label)


def apply_overrides(data: Any, assignments: Sequence[str],
                    label: str = "--set") -> tuple[Any, Any | None]:
    """``data`` with each of ``assignments`` applied in order (:func:`apply_override`), and
    ``data`` as written before them (a copy; None without any): what an error's fix reads to
    tell a problem the overrides made from one the file had."""
    written = (copy.deepcopy(data) if data is not None else {}) if assignments else None
    for assignment in assignments:
        data = apply_override(data, assignment, label)
    return data, written


# ---------------------------------------------------------------------------------------------
# Error formatting

_MESSAGES = {
    "greater_than": "must be > {gt}",
    "greater_than_equal": "must be >= {ge}",
    "less_than": "must be < {lt}",
    "less_than_equal": "must be <= {le}",
    "missing": "is required",
    "extra_forbidden": "unknown key",
    "too_short": "must have at least {min_length} item(s)",
    "string_too_short": "must not be empty",
    "finite_number": "must be a finite number",
}

_NOT_A_MAPPING = frozenset({"model_type", "model_attributes_type", "dict_type"})
"""Error types of a section given something other than a mapping (a key with nothing after it
reads null)."""


def _format_path(parts: Iterable[str | int]) -> str:
    text = ""
    for part in parts:
        text += f"[{part}]" if isinstance(part, int) else (f".{part}" if text else str(part))
    return text


def _data_path(data: Any, loc: Sequence[str | int]) -> list[str | int]:
    """``loc`` without the discriminator tags pydantic inserts for tagged unions."""
    path: list[str | int] = []
    node = data
    for at, part in enumerate(loc):
        if isinstance(node, Mapping) and part not in node and node.get("kind") == part:
            continue  # the union member chosen by "kind", not a key of the file
        if (isinstance(node, Mapping) and part not in node and "kind" not in node
                and at + 1 < len(loc) and loc[at + 1] in node):
            continue  # a member a shorthand chose (``noise: {sigma: ..}``: "constant")
        if isinstance(part, str) and not isinstance(node, Mapping):
            continue  # a union member's tag (``int``, ``list[int]``) under a list or a value
        path.append(part)
        if isinstance(node, Mapping):
            node = node.get(part)
        elif isinstance(node, list) and isinstance(part, int) and 0 <= part < len(node):
            node = node[part]
        else:
            node = None
    return path


def _describe(error: Mapping[str, Any]) -> str:
    kind = error["type"]
    template = _MESSAGES.get(kind)
    if template is not None:
        try:
            return template.format(**error.get("ctx", {}))
        except KeyError:
            pass
    if kind == "union_tag_invalid":
        ctx = error.get("ctx", {})
        return f"kind must be one of {ctx.get('expected_tags')}, got {ctx.get('tag')!r}"
    if kind == "union_tag_not_found":
        return "needs a 'kind' key"
    if kind in _NOT_A_MAPPING:  # pydantic's text names fedsim's class ("instance of Stop")
        if error.get("input") is None:
            return "is empty: write its keys indented under it, or {key: value}"
        return "must be a mapping: its keys indented under it, or {key: value}"
    message = str(error["msg"])
    return message.removeprefix("Value error, ")


MAX_HINTED_ERRORS = 50
"""A scenario's first this many problems get a did-you-mean hint (:mod:`fedsim.config.suggestions`)."""

_ABSENT = object()


def _at(tree: Any, path: Sequence[str | int]) -> Any:
    """The value at ``path`` in a plain tree, or :data:`_ABSENT`."""
    for part in path:
        if isinstance(tree, Mapping) and part in tree:
            tree = tree[part]
        elif isinstance(tree, list) and isinstance(part, int) and 0 <= part < len(tree):
            tree = tree[part]
        else:
            return _ABSENT
    return tree


@dataclass(frozen=True)
class _Overridden:
    """The tree as written before the overrides were applied, and what errors call them."""

    written: Any
    label: str


def _kind_fix(path: Sequence[str | int], mapping: Mapping[str, Any],
              overridden: _Overridden | None, field: str = "kind") -> KindFix:
    """Where the key at ``path``, refused by the kind that its ``mapping`` chose with its
    ``field`` (a tagged union's member, or a :mod:`~fedsim.config.kind_keys` section's kind),
    came from: the kind changed by an override, the key added by one, or both as the file
    wrote them."""
    if overridden is None:
        return "file"
    before = _at(overridden.written, path[:-1])
    if not isinstance(before, Mapping) or before.get(field) != mapping.get(field):
        return "kind"  # (a mapping an override set whole chose its kind with it)
    return "key" if path[-1] not in before else "file"


def _member_tag(loc: Sequence[str | int], path: Sequence[str | int]) -> str | None:
    """The tagged union member pydantic chose for the mapping holding ``path``'s last key: the
    tag its ``loc`` names just before that key, which the path (the file's keys) leaves out."""
    if len(loc) < 2 or not isinstance(loc[-2], str):
        return None
    return loc[-2] if len(path) < 2 or loc[-2] != path[-2] else None


_KEY_OF_ANOTHER_KIND = "key_of_another_kind"
"""The type of the error :func:`_each_key` makes of each key of a
:class:`~fedsim.config.kind_keys.KeysOfOtherKinds`."""


def _each_key(errors: Sequence[Mapping[str, Any]]) -> list[Mapping[str, Any]]:
    """``errors``, a section's keys that its kind does not read (pydantic places the
    :class:`~fedsim.config.kind_keys.KeysOfOtherKinds` at the section) made one error per
    key, at the key, as a tagged union's unknown keys are."""
    each: list[Mapping[str, Any]] = []
    for error in errors:
        found = error.get("ctx", {}).get("error")
        if not isinstance(found, KeysOfOtherKinds):
            each.append(error)
            continue
        each += [{**error, "type": _KEY_OF_ANOTHER_KIND, "loc": (*error["loc"], key),
                  "msg": f"not read by {kinds_text([found.kind], found.field)}"}
                 for key in found.owners]
    return each


def _hint(error: Mapping[str, Any], path: Sequence[str | int], data: Any,
          overridden: _Overridden | None) -> str:
    """What the author probably meant (:mod:`fedsim.config.suggestions`); a key of another
    kind, refused by a tagged union or by its section (:data:`_KEY_OF_ANOTHER_KIND`), with
    the fix that fits where it came from (``overridden``)."""
    kind = error["type"]
    if kind in ("extra_forbidden", _KEY_OF_ANOTHER_KIND):
        mapping = _at(data, path[:-1])
        if not isinstance(mapping, Mapping):
            return did_you_mean(path) if kind == "extra_forbidden" else ""
        label = overridden.label if overridden is not None else "--set"
        if kind == _KEY_OF_ANOTHER_KIND:
            found: KeysOfOtherKinds = error["ctx"]["error"]
            return key_of_another_kind(path, found.kind, mapping,
                                       _kind_fix(path, mapping, overridden, found.field), label)
        return did_you_mean(path, chosen=_member_tag(error["loc"], path), mapping=mapping,
                            fix=_kind_fix(path, mapping, overridden), label=label)
    if kind == "union_tag_not_found":
        return kinds_fitting(path, _at(data, path))
    return _value_hint(error, path, overridden)


def _value_hint(error: Mapping[str, Any], path: Sequence[str | int],
                overridden: _Overridden | None) -> str:
    """:func:`_hint` for a refused value: a choice close to one accepted, or a kind's name
    given where its mapping goes."""
    kind = error["type"]
    # (a value_error: a field where a number stands for a constant refused a word)
    if kind in _NOT_A_MAPPING or (kind == "value_error" and isinstance(error.get("input"), str)):
        return kind_for_a_mapping(path, error.get("input"),
                                  overridden.label if overridden is not None else "--set")
    if kind not in ("literal_error", "union_tag_invalid"):
        return ""
    given = error.get("input") if kind == "literal_error" else error.get("ctx", {}).get("tag")
    return meant_choice(path, given, tag=kind == "union_tag_invalid")


def _format_errors(errors: Sequence[Mapping[str, Any]], data: Any,
                   node: yaml.Node | None, overridden: _Overridden | None = None) -> list[str]:
    """One line per error (pydantic's error dicts), with its YAML path and line
    (``overridden``: the tree before its overrides, for hints that say which fix fits)."""
    lines: list[str] = []
    positions = _positions(node)
    errors = _each_key(errors)
    # A scenario-wide check's problem with one field is placed at that field (FieldProblem).
    problems = [_field_problem(error) for error in errors]
    paths = [_data_path(data, error["loc"] if problem is None else
                        (*error["loc"], *problem.path))
             for error, problem in zip(errors, problems, strict=True)]
    for error, problem, path in zip(errors, problems, paths, strict=True):
        if len(path) < len(error["loc"]) and any(
            len(other) > len(path) and other[: len(path)] == path for other in paths
        ):
            continue  # a union member that does not fit at all, where another one nearly does
        got = ""
        if error["type"] not in ("missing", "extra_forbidden") and not isinstance(error.get("input"), dict | list):
            got = f" (got {json.dumps(error.get('input'), default=str)})"
        # (a hint searches the schema: 20,000 unknown keys took 18 s with one each)
        hint = _hint(error, path, data, overridden) if len(lines) < MAX_HINTED_ERRORS else ""
        described = _describe(error) if problem is None else problem.message
        lines.append(_problem_line(path, f"{described}{got}{hint}", positions))
    return lines


def _field_problem(error: Mapping[str, Any]) -> FieldProblem | None:
    found = error.get("ctx", {}).get("error")
    return found if isinstance(found, FieldProblem) else None


# ---------------------------------------------------------------------------------------------
# Public entry points


def parse_scenario(data: Any, *, source: str = "<scenario>",
                   node: yaml.Node | None = None, written: Any = None,
                   label: str = "--set") -> Scenario:
    """Validate a plain tree (as read from YAML) into a :class:`Scenario`.

    ``written``: where overrides made ``data``, the tree before them, and ``label`` what
    errors call an override (``--set``, ``overrides``): a hint about a key that another kind
    of a mapping takes then offers the fix that fits (replacing the whole value)."""
    if not isinstance(data, dict):
        kind = "empty" if data is None else f"a {type(data).__name__}"
        raise ScenarioError(source, [f"scenario: must be a mapping of sections, the file is {kind}"])
    try:
        scenario = Scenario.model_validate(data)
    except ValidationError as exc:
        errors = exc.errors(include_url=False)
        overridden = _Overridden(written, label) if written is not None else None
        lines = _format_errors(errors, data, node, overridden)
        # The checks that tie fields together, which pydantic skips above a field's error,
        # wherever every field they read is valid (a stranger fixing a file wants every
        # problem in one run, not a new one after each fix).
        listed = set(lines)
        lines += [line for line in _format_errors(cross_field_problems(Scenario, data, errors),
                                                  data, node, overridden) if line not in listed]
        raise ScenarioError(source, lines) from None
    return scenario


def load_scenario(path: str | Path, overrides: Sequence[str] = (), *,
                  allow_factories: bool = False, label: str = "--set") -> LoadedScenario:
    """Read, override (``--set path=value``, applied in order) and validate a scenario file
    (``allow_factories``: see :class:`LoadedScenario`; ``label``: what errors call an
    override, ``--set`` or ``overrides``)."""
    file = Path(path)
    text = _read_text(file)
    data, node = _read_yaml(text, str(path))
    data, written = apply_overrides(data, overrides, label)
    source = str(path)
    if overrides:
        node = None  # line numbers would point at the file, not at the overridden tree
        source += f" with {label} " + f" {label} ".join(overrides)  # (a problem may be theirs)
    scenario = parse_scenario(data, source=source, node=node, written=written, label=label)
    return LoadedScenario(scenario, file.resolve(), allow_factories, source, _positions(node))


def dump_scenario(scenario: Scenario, *, dataset_path: Path | None = None) -> str:
    """The scenario as YAML with every default filled in (``scenario.resolved.yaml``)."""
    tree = scenario.model_dump(mode="json")
    if dataset_path is not None:
        tree["dataset"]["path"] = str(dataset_path)
    if tree["dataset"].get("name") != "synthetic":
        # The synthetic problem's sizes describe no other data set (a stranger read "6000
        # samples, 20 features" in an MNIST arrays run's file); read back, they default again.
        for key in SYNTHETIC_ONLY:
            tree["dataset"].pop(key, None)
    return yaml.safe_dump(tree, sort_keys=False, default_flow_style=False)


SYNTHETIC_ONLY = ("num_samples", "num_test_samples", "num_features", "num_classes")
"""The dataset fields that only the synthetic problem reads."""


class _ScenarioJsonSchema(GenerateJsonSchema):
    """Pydantic's JSON Schema, with each tagged union's choices requiring their tag: pydantic
    picks a tagged union's member by its ``kind`` and refuses a mapping without one (even where
    the member gives ``kind`` a default), and JSON Schema validators ignore the OpenAPI
    ``discriminator`` keyword, so the requirement is spelled out."""

    def tagged_union_schema(self, schema: core_schema.TaggedUnionSchema) -> JsonSchemaValue:
        generated = super().tagged_union_schema(schema)
        tag = schema["discriminator"]
        choices = generated.get("oneOf")
        if isinstance(tag, str) and isinstance(choices, list):
            generated["oneOf"] = [{"allOf": [choice, {"required": [tag]}]} for choice in choices]
        return generated


def scenario_json_schema() -> dict[str, Any]:
    """The JSON Schema of scenario files (for editor completion): what :func:`parse_scenario`
    accepts, shorthands included, apart from the rules that tie fields together (data shares
    that sum to 1, unique group names, ...), which JSON Schema cannot state."""
    schema = Scenario.model_json_schema(schema_generator=_ScenarioJsonSchema)
    schema["$schema"] = "https://json-schema.org/draft/2020-12/schema"
    schema["title"] = "fedsim scenario"
    return schema
