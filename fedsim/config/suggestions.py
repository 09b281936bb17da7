"""What a scenario's author probably meant: the hints that follow a refused key or value.

Read from the scenario's pydantic models (their fields and ``Literal`` choices), never from
pydantic's error text, so a hint names exactly what the schema accepts:

* an unknown key close to an accepted one: `` - did you mean 'clip'?``; a key accepted
  elsewhere: `` - it belongs under 'privacy'`` (a section just below) or `` - it is a key of
  clients.groups[*]`` (deeper);
* a refused choice (``sampling: poison``, ``kind: fedbuf``) close to an accepted one:
  `` - did you mean 'poisson'?``.
"""

from __future__ import annotations

import difflib
import typing
from collections.abc import Sequence
from typing import Any, Literal

from pydantic import BaseModel

from fedsim.config.schema import Scenario

__all__ = ["did_you_mean", "first_unknown_key", "meant_choice"]

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


def did_you_mean(path: Sequence[str | int]) -> str:
    """`` - did you mean 'clip'?`` for an unknown key close to an accepted one, or where the
    key is accepted instead, else ``""``."""
    key = path[-1] if path else None
    if not isinstance(key, str) or not _models_at(path[:-1]):
        return ""  # (under a free-form mapping, model.options: any key is its own)
    # A key accepted elsewhere, exactly, says more than a similar one here (server.batch_size:
    # a group's, not step_size); a typo is accepted nowhere.
    places = _where_accepted(key, path[:-1]) or (
        _where_accepted(key, []) if len(path) > 1 else [])  # (privacy.clip: a group's)
    close = difflib.get_close_matches(key, sorted(_keys_at(path[:-1])), n=1, cutoff=_CUTOFF)
    if close and not places:
        return f" - did you mean {close[0]!r}?"
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
    close = difflib.get_close_matches(given, sorted(set(choices)), n=1, cutoff=_CUTOFF)
    return f" - did you mean {close[0]!r}?" if close and close[0] != given else ""
