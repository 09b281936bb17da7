"""A section that chooses a kind with one field (a server optimizer's ``kind``, a partition's
``scheme``) and holds every kind's keys side by side: the keys the chosen kind does not read
are refused, as a tagged union's other kinds' keys are (:mod:`fedsim.config.suggestions`)."""

from __future__ import annotations

from collections.abc import Mapping

from pydantic import BaseModel

__all__ = ["refuse_other_kinds_keys"]


def refuse_other_kinds_keys(section: BaseModel, kind: str,
                            keys_of: Mapping[str, frozenset[str]], *,
                            field: str = "kind") -> None:
    """Refuse a key written in a section whose ``field`` (``kind``, a partition's ``scheme``)
    chose ``kind`` and which that kind does not read (``keys_of``: each kind's keys):
    ``{kind: sgd, beta2: 0.9}`` ran as plain SGD, the
    key accepted and ignored, where a tagged union's other kinds' keys are refused. A key at
    its default is let be: it changes nothing whatever the kind, and a resolved scenario
    (``scenario.resolved.yaml``) writes every key."""
    fields = type(section).model_fields
    unread = sorted(key for key in section.model_fields_set - {field} - keys_of[kind]
                    if getattr(section, key) != fields[key].default)
    if not unread:
        return
    readers = {key: [k for k, keys in keys_of.items() if key in keys] for key in unread}
    said = "; ".join(f"{key!r} is read by {field} {' or '.join(map(repr, owners))}"
                     for key, owners in readers.items())
    raise ValueError(f"{field} {kind!r} does not read {', '.join(map(repr, unread))} ({said}): "
                     f"remove it, or change the {field}")
