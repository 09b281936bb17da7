"""``--set`` paths: dotted keys, list indices and list selectors.

A path is keys joined by dots with bracketed list parts::

    stop.windows                       a key
    clients.groups[0].batch_size       the first item of a list
    clients.groups[*].noise.sigma      every item of a list
    clients.groups[phone].batch_size   the item whose ``name`` is ``phone``

Missing mapping keys on the way are created; indices must exist, a ``[*]`` needs a non-empty
list and a ``[name]`` an item of that name (the error names the items there are). Each selected
item gets its own copy of the value.
"""

from __future__ import annotations

import copy
import re
from collections.abc import Callable, Iterable, Sequence
from typing import Any

from fedsim.config.limits import MAX_YAML_DEPTH
from fedsim.errors import ConfigError

__all__ = ["ALL", "Named", "Part", "assign_path", "format_path", "split_path"]


class _All:
    """The ``[*]`` selector (every item of a list)."""

    def __repr__(self) -> str:
        return "[*]"


ALL = _All()


class Named(str):
    """The ``[name]`` selector: the list item whose ``name`` key equals this string."""

    __slots__ = ()


Part = str | int | Named | _All

_TOKEN = re.compile(r"([^.\[\]]+)|\[(\d+)\]|\[(\*)\]|\[([^\[\]]+)\]")


def split_path(path: str, label: str = "--set") -> list[Part]:
    """The parts of a ``--set`` path (see the module docstring); at most
    :data:`~fedsim.config.limits.MAX_YAML_DEPTH` of them, the nesting a scenario file may have
    (assignment recurses once per part). ``label`` names where the path came from in errors
    (``--set``, or ``overrides`` from Python)."""
    parts: list[Part] = []
    position = 0
    for match in _TOKEN.finditer(path):
        if len(parts) == MAX_YAML_DEPTH:
            raise ConfigError(f"{label} {path[:80]!r}...: a path has at most {MAX_YAML_DEPTH} "
                              "parts (the nesting a scenario may have)")
        gap = path[position:match.start()]
        if gap not in ("", ".") or (gap == "." and not parts):
            raise ConfigError(f"{label} {path!r}: cannot parse the path near {gap!r}")
        key, index, star, name = match.groups()
        if key is not None and parts and gap == "":  # "[0]x": a key must follow a dot
            raise ConfigError(f"{label} {path!r}: expected '.' before {key!r}")
        if key is not None:
            parts.append(key)
        elif index is not None:
            parts.append(int(index))
        elif star is not None:
            parts.append(ALL)
        else:
            parts.append(Named(name.strip()))
        position = match.end()
    if not parts or path[position:] != "":
        raise ConfigError(f"{label} {path!r}: expected a dotted path like clients.groups[0].count, "
                          "clients.groups[*].count or clients.groups[NAME].count")
    return parts


def format_path(parts: Iterable[Part]) -> str:
    text = ""
    for part in parts:
        if isinstance(part, _All | Named | int):
            text += f"[{part!s}]" if not isinstance(part, _All) else "[*]"
        else:
            text += f".{part}" if text else str(part)
    return text


def _item_word(parts: list[Part]) -> str:
    parent = next((p for p in reversed(parts) if type(p) is str), "")
    return "group" if parent == "groups" else "item"


Hint = Callable[[Sequence[str | int]], str]
"""What to add to an error about a key the scenario does not hold, given the path to that
key (" - did you mean 'groups'?"; the scenario's schema knows, not this module)."""


def assign_path(data: Any, path: str, value: Any, hint: Hint | None = None,
                label: str = "--set") -> Any:
    """Set ``value`` at ``path`` in the plain tree ``data`` (created if None); returns the tree.

    A key absent from the tree is created, unless a list selector follows it: a list cannot be
    created by selecting its items, so that key is reported (with ``hint``'s suggestion).
    Errors begin with ``label`` and the path (``--set clients.x: ...``)."""
    parts = split_path(path, label)
    if data is None:
        data = {}
    _assign(data, parts, [], value, f"{label} {path}", hint)
    return data


def _positions(node: list[Any], part: int | Named | _All, done: list[Part], where: str) -> list[int]:
    """The indices of ``node`` that ``part`` selects (an error naming what is there if none)."""
    here = format_path(done) or "scenario"
    if isinstance(part, _All):
        if not node:
            raise ConfigError(f"{where}: {here} is an empty list, [*] selects nothing")
        return list(range(len(node)))
    if isinstance(part, Named):
        positions = [i for i, item in enumerate(node)
                     if isinstance(item, dict) and str(item.get("name")) == part]
        if not positions:
            names = [str(i.get("name")) for i in node if isinstance(i, dict) and "name" in i]
            word = _item_word(done)
            raise ConfigError(
                f"{where}: {here} has no {word} named {str(part)!r} ("
                + (f"{word}s: {', '.join(names)}" if names else "its items have no names") + ")")
        return positions
    if not 0 <= part < len(node):
        raise ConfigError(f"{where}: {format_path([*done, part])} is out of range "
                          f"({len(node)} items)")
    return [part]


def _assign(node: Any, parts: list[Part], done: list[Part], value: Any, where: str,
            hint: Hint | None) -> None:
    """Assign below ``node``, reached by the concrete path ``done`` (indices, keys)."""
    depth = len(done)
    part = parts[depth]
    here = format_path(done) or "scenario"
    last = depth == len(parts) - 1
    if isinstance(part, int | _All | Named):
        if not isinstance(node, list):
            raise ConfigError(f"{where}: {here} is not a list")
        for position in _positions(node, part, done, where):
            if last:
                node[position] = copy.deepcopy(value)
            else:
                _assign(node[position], parts, [*done, position], value, where, hint)
        return
    if isinstance(node, list):  # a list stepped into by name or by a dotted number
        index, rest = (int(part), parts[depth + 1:]) if part.isdigit() else (0, parts[depth:])
        raise ConfigError(
            f"{where}: {here} is a list: name an item by its index ([*] for all, [name] "
            f"for a named group), for example {format_path([*done, index, *rest])}")
    if not isinstance(node, dict):
        shown = f"is {node!r}" if isinstance(node, int | float | str | bool) else "is a list"
        raise ConfigError(
            f"{where}: {here} {shown}, not a mapping; set {format_path(parts[:depth])}="
            "VALUE as a whole instead")
    if last:
        node[part] = copy.deepcopy(value)
        return
    if node.get(part) is None:
        if isinstance(parts[depth + 1], int | _All | Named):  # a list to select from: none
            key_path = [p for p in [*done, part] if isinstance(p, str | int)]
            missing = format_path([*done, part])
            suggestion = (hint(key_path) if hint else "") or (
                f" (an absent list is set whole: {missing}=[...])")
            raise ConfigError(f"{where}: {missing} is not in the scenario{suggestion}")
        node[part] = {}
    _assign(node[part], parts, [*done, part], value, where, hint)
