"""What a scenario's author probably meant: the hints that follow a refused key or value.

Read from the scenario's pydantic models (their fields and ``Literal`` choices), never from
pydantic's error text, so a hint names exactly what the schema accepts:

* an unknown key close to an accepted one: `` - did you mean 'clip'?``; a key accepted
  elsewhere: `` - it belongs under 'privacy'`` (a section just below) or `` - it is a key of
  clients.groups[*]`` (deeper);
* a refused choice (``sampling: poison``, ``kind: fedbuf``) close to an accepted one:
  `` - did you mean 'poisson'?``;
* a key of another member of a tagged union (``{kind: windows, buffer_size: 4}``, every
  mapping chosen by its ``kind``: aggregations, noises, clips, distributions, step sizes,
  compressions), or of another kind of a section that holds every kind's keys
  (``{kind: sgd, beta2: 0.9}``, :mod:`fedsim.config.kind_keys`): `` - 'buffer_size' is a key
  of kind 'fedbuff', not of kind 'windows'``, with the fix that fits where the mismatch came
  from (:data:`KindFix`): the file (remove the key or change the kind), an override that
  changed the kind or one that added the key (replace the whole value:
  ``--set 'server.aggregation={kind: windows}'``); a mapping without its ``kind``: the kinds
  its keys fit.
"""

from __future__ import annotations

import difflib
import shlex
import typing
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

import yaml
from pydantic import BaseModel

from fedsim.config.kind_keys import KeysOfKind, kind_field, kinds_text
from fedsim.config.overrides import format_path
from fedsim.config.schema import Scenario

__all__ = ["KindFix", "did_you_mean", "first_unknown_key", "key_of_another_kind", "kind_for_a_mapping",
           "kinds_fitting", "meant_choice"]

_CUTOFF = 0.6
"""difflib's similarity a suggestion needs (its default)."""
_SEARCH_DEPTH = 4
"""How deep below the refused key's mapping a key accepted elsewhere is looked for."""
_SHOWN_PLACES = 3
"""How many of the sections that accept a misplaced key a hint names."""


def _models_in(annotation: Any) -> list[type[BaseModel]]:
    """The pydantic models an annotation may hold (through unions, lists, dicts, Annotated)."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return [annotation]
    found: list[type[BaseModel]] = []
    for arg in typing.get_args(annotation):
        found.extend(_models_in(arg))
    return found


def _literals_in(annotation: Any) -> list[str]:
    """The string choices of the ``Literal`` types an annotation may hold (through unions,
    lists, Annotated)."""
    if typing.get_origin(annotation) is Literal:
        return [value for value in typing.get_args(annotation) if isinstance(value, str)]
    found: list[str] = []
    for arg in typing.get_args(annotation):
        found.extend(_literals_in(arg))
    return found


def _models_at(path: Sequence[str | int]) -> list[type[BaseModel]]:
    """The models a scenario may hold at ``path`` (every union member)."""
    models: list[type[BaseModel]] = [Scenario]
    for part in path:
        if isinstance(part, int):
            continue  # a list item: the list's item models were taken with its field
        models = [inner for model in models if part in model.model_fields
                  for inner in _models_in(model.model_fields[part].annotation)]
    return models


def _keys_at(path: Sequence[str | int]) -> set[str]:
    """Every key a scenario accepts at ``path`` (the mapping that holds the unknown key)."""
    return {name for model in _models_at(path) for name in model.model_fields}


def _shown(path: Sequence[str | int]) -> str:
    """``path`` as a scenario's author writes it, a list's items as ``[*]``."""
    text = ""
    for part in path:
        text += "[*]" if isinstance(part, int) else (f".{part}" if text else part)
    return text


def _where_accepted(key: str, path: Sequence[str | int]) -> list[str]:
    """The mappings below ``path`` (at most :data:`_SEARCH_DEPTH` sections down) that accept
    ``key``, nearest first, each as its author writes it (``clients.groups[*].noise``)."""
    found: list[tuple[int, str]] = []
    level: list[list[str | int]] = [list(path)]
    for depth in range(_SEARCH_DEPTH):
        below: list[list[str | int]] = []
        for at in level:
            for model in _models_at(at):
                for name, field in model.model_fields.items():
                    inner = _models_in(field.annotation)
                    if not inner:
                        continue
                    listed = any(typing.get_origin(a) is list
                                 for a in (field.annotation, *typing.get_args(field.annotation)))
                    child = [*at, name, 0] if listed else [*at, name]
                    if any(key in m.model_fields for m in inner):
                        found.append((depth, _shown(child)))
                    below.append(child)
        level = below
    places = sorted(set(found))
    return list(dict.fromkeys(shown for _, shown in places))


KindFix = Literal["file", "kind", "key"]
"""Where a key of another kind than its mapping's came from, which decides the fix offered:
``"file"``, the key and the kind as the scenario wrote them (remove the key or change the
kind); ``"kind"``, an override changed the kind (replace the whole value, of the chosen kind);
``"key"``, an override added the key (replace the whole value, of the key's kind)."""


def _members(path: Sequence[str | int]) -> dict[str, type[BaseModel]]:
    """The members of the tagged union a scenario holds at ``path``, by their ``kind`` ({}
    where the mapping there is not chosen by a ``kind``: one model, whose ``kind`` is a field
    like any other)."""
    members: dict[str, type[BaseModel]] = {}
    for model in _models_at(path):
        field = model.model_fields.get("kind")
        kinds = _literals_in(field.annotation) if field is not None else []
        if len(kinds) == 1:
            members.setdefault(kinds[0], model)
    return members if len(members) > 1 else {}


@dataclass(frozen=True)
class _Kinds:
    """The kinds a mapping chooses among by one ``field`` (``kind``; a partition's
    ``scheme``): a tagged union's members, or the kinds of a section that holds every kind's
    keys (:mod:`fedsim.config.kind_keys`), each with the keys it ``reads`` (in the schema's
    order) and those it ``requires``."""

    field: str
    reads: Mapping[str, tuple[str, ...]]
    requires: Mapping[str, frozenset[str]]

    def owners(self, key: str) -> list[str]:
        """The kinds that read ``key``."""
        return [kind for kind, keys in self.reads.items() if key in keys]


def _kinds_at(path: Sequence[str | int]) -> _Kinds | None:
    """The kinds the mapping a scenario holds at ``path`` chooses among, or None."""
    members = _members(path)
    if members:
        return _Kinds("kind",
                      {kind: tuple(name for name in model.model_fields if name != "kind")
                       for kind, model in members.items()},
                      {kind: frozenset(name for name, field in model.model_fields.items()
                                       if field.is_required())
                       for kind, model in members.items()})
    for model in _models_at(path):
        table: KeysOfKind | None = getattr(model, "KEYS_OF_KIND", None)
        if table:
            fields = model.model_fields
            reads = {kind: tuple(name for name in fields if name in keys)
                     for kind, keys in table.items()}
            return _Kinds(kind_field(model, table), reads,
                          {kind: frozenset(name for name in keys if fields[name].is_required())
                           for kind, keys in reads.items()})
    return None


def _flow(value: Any) -> str:
    """``value`` as one line of YAML (a flow mapping's value)."""
    text = yaml.safe_dump(value, default_flow_style=True, width=2**31 - 1)
    return text.removesuffix("\n...\n").strip()


def _whole_value(path: Sequence[str | int], kinds: _Kinds, kind: str,
                 mapping: Mapping[str, Any], label: str) -> str:
    """An override that sets the mapping at ``path`` whole, of the kind ``kind``: the keys of
    ``mapping`` that kind reads, and ``...`` for each one it requires that ``mapping`` lacks
    (``--set 'clients.groups[0].speed={kind: exponential, mean: ...}'``)."""
    entries = [f"{kinds.field}: {kind}"]
    for name in kinds.reads[kind]:
        if name in mapping:
            entries.append(f"{name}: {_flow(mapping[name])}")
        elif name in kinds.requires[kind]:
            entries.append(f"{name}: ...")
    assignment = f"{format_path(path)}={{{', '.join(entries)}}}"
    if label == "--set":
        return f"--set {shlex.quote(assignment)}"
    return f"{label} entry {assignment!r}"


def key_of_another_kind(path: Sequence[str | int], chosen: str | None,
                        mapping: Mapping[str, Any] | None, fix: KindFix, label: str) -> str:
    """`` - 'buffer_size' is a key of kind 'fedbuff', not of kind 'windows': ...`` for a key
    that the mapping at ``path[:-1]`` (a tagged union, or a section that holds every kind's
    keys) reads only in kinds other than ``chosen``, with the fix ``fix`` names; else ``""``.
    The one hint of both refusals: pydantic's unknown key of a tagged union's member, and
    :class:`~fedsim.config.kind_keys.KeysOfOtherKinds`."""
    key, at = path[-1], path[:-1]
    kinds = _kinds_at(at)
    if (not isinstance(key, str) or kinds is None or chosen is None
            or chosen not in kinds.reads or key in kinds.reads[chosen]):
        return ""
    owners = kinds.owners(key)
    if not owners:
        return ""
    field = kinds.field
    given = mapping is not None and field in mapping
    head = (f" - {key!r} is a key of {kinds_text(owners, field)}, not of {field} {chosen!r}"
            + ("" if given else f", which a mapping without {field!r} stands for"))
    if fix == "file" or mapping is None:
        change = (f"change the {field} to {owners[0]!r}" if len(owners) == 1
                  else f"change the {field} to one of those")
        if not given:
            change = (f"give its {field} ('{field}: {owners[0]}')" if len(owners) == 1
                      else f"give one of those {field}s")
        return f"{head}: remove it, or {change}"
    if fix == "kind":
        whole = _whole_value(at, kinds, chosen, mapping, label)
        return f"{head}, the {field} {label} chose: replace the whole value, e.g. {whole}"
    whole = _whole_value(at, kinds, owners[0], mapping, label)
    return f"{head}: set the whole value with its {field}, e.g. {whole}"


def kinds_fitting(path: Sequence[str | int], mapping: Any) -> str:
    """`` - its keys fit kind 'fedbuff'`` for a mapping at ``path`` that names no ``kind`` of
    the tagged union there, where the keys it has fit some of its members but not all; else
    ``""``."""
    members = _members(path)
    if not members or not isinstance(mapping, Mapping) or not mapping:
        return ""
    fitting = [kind for kind, model in members.items()
               if all(key in model.model_fields for key in mapping)]
    if not fitting or len(fitting) == len(members):
        return ""
    return f" - its keys fit {kinds_text(fitting)} (add 'kind: {fitting[0]}')"


def kind_for_a_mapping(path: Sequence[str | int], given: Any, label: str = "--set") -> str:
    """`` - a kind is chosen inside its mapping: --set 'server.aggregation={kind: fedbuff,
    buffer_size: ...}'`` for a value ``given`` at ``path`` that names one of the kinds the
    mapping there chooses among, where the mapping itself was expected (a stranger's
    ``--set server.aggregation=fedbuff`` was told only that it must be a mapping); else
    ``""``."""
    kinds = _kinds_at(path)
    if kinds is None or not isinstance(given, str):
        return ""
    meant = given.strip()
    if meant not in kinds.reads:
        close = difflib.get_close_matches(meant, sorted(kinds.reads), n=1, cutoff=_CUTOFF)
        if not close:
            return ""
        meant = close[0]
    return (f" - a {kinds.field} is chosen inside its mapping: "
            f"{_whole_value(path, kinds, meant, {}, label)}")


def _whose(path: Sequence[str | int], key: str, chosen: str | None) -> str:
    """`` (a key of kind 'fedbuff', not of 'windows')`` for a key suggested at ``path`` that
    the kind ``chosen`` of the mapping there (:func:`_kinds_at`) does not read, else ``""``."""
    kinds = _kinds_at(path)
    if kinds is None or chosen is None or chosen not in kinds.reads \
            or key in kinds.reads[chosen]:
        return ""
    return f" (a key of {kinds_text(kinds.owners(key), kinds.field)}, not of {chosen!r})"


def did_you_mean(path: Sequence[str | int], *, chosen: str | None = None,
                 mapping: Mapping[str, Any] | None = None, fix: KindFix = "file",
                 label: str = "--set") -> str:
    """`` - did you mean 'clip'?`` for an unknown key close to an accepted one, or where the
    key is accepted instead, else ``""``.

    ``chosen``: the member of the tagged union at ``path[:-1]`` that the mapping there chose
    (its ``kind``, or the one a shorthand stands for), ``mapping`` that mapping and ``fix``
    where the mismatch came from (``label``: what errors call an override): a key of another
    member is said to be one, with the fix (:data:`KindFix`)."""
    key = path[-1] if path else None
    if not isinstance(key, str) or not _models_at(path[:-1]):
        return ""  # (under a free-form mapping, model.options: any key is its own)
    other_kind = key_of_another_kind(path, chosen, mapping, fix, label)
    if other_kind:
        return other_kind
    # A key accepted elsewhere, exactly, says more than a similar one here (server.batch_size:
    # a group's, not step_size); a typo is accepted nowhere.
    places = _where_accepted(key, path[:-1]) or (
        _where_accepted(key, []) if len(path) > 1 else [])  # (privacy.clip: a group's)
    close = difflib.get_close_matches(key, sorted(_keys_at(path[:-1])), n=1, cutoff=_CUTOFF)
    if close and not places:
        return f" - did you mean {close[0]!r}?{_whose(path[:-1], close[0], chosen)}"
    if not places:
        return ""
    children = sorted(field for field in _keys_at(path[:-1])
                      if key in _keys_at([*path[:-1], field]))
    if children:  # a section just below: named as its key
        return f" - it belongs under {' or '.join(map(repr, children))}"
    shown = ", ".join(places[:_SHOWN_PLACES])
    more = len(places) - _SHOWN_PLACES
    return (f" - {key!r} is a key of {shown}"
            + (f" and {more} other section(s)" if more > 0 else ""))


def first_unknown_key(path: Sequence[str | int]) -> str:
    """:func:`did_you_mean` for the first key of ``path`` the scenario does not accept
    (``client.groups``: ``client``); "" when it accepts every one (a review: a valid key was
    suggested as the one meant)."""
    for end, part in enumerate(path):
        if not _models_at(path[:end]):
            return ""  # a free-form mapping (model.options) holds any key
        if isinstance(part, str) and part not in _keys_at(path[:end]):
            return did_you_mean(path[:end + 1])
    return ""


def meant_choice(path: Sequence[str | int], given: Any, *, tag: bool) -> str:
    """`` - did you mean 'poisson'?`` for a refused choice ``given`` at ``path`` close to one
    the schema accepts there (``tag``: ``path`` is a tagged union, whose choices are its
    members' ``kind``), else ``""``."""
    if not isinstance(given, str) or not path or not isinstance(path[-1], str):
        return ""
    if tag:
        choices = [value for model in _models_at(path) if "kind" in model.model_fields
                   for value in _literals_in(model.model_fields["kind"].annotation)]
    else:
        choices = [value for model in _models_at(path[:-1]) if path[-1] in model.model_fields
                   for value in _literals_in(model.model_fields[path[-1]].annotation)]
    meant = _SYNONYMS.get(given.lower())
    if meant in choices:  # a word for the choice, not a misspelling of another
        return f" - did you mean {meant!r}?"
    close = difflib.get_close_matches(given, sorted(set(choices)), n=1, cutoff=_CUTOFF)
    return f" - did you mean {close[0]!r}?" if close and close[0] != given else ""


# Words people use for a choice that spelling alone would not lead to, each suggested only
# where the schema accepts its target there (a stranger's ``device=gpu`` was offered 'cpu').
_SYNONYMS = {"gpu": "cuda", "nvidia": "cuda", "cuda:0": "cuda", "metal": "mps", "apple": "mps",
             "fixed_size": "fixed", "fixed-size": "fixed",
             "bernoulli": "poisson"}
