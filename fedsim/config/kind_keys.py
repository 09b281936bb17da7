"""A section that chooses a kind with one field (a server optimizer's ``kind``, a partition's
``scheme``) and holds every kind's keys side by side: the keys the chosen kind does not read
are refused, as a tagged union's other kinds' keys are (:mod:`fedsim.config.suggestions`)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from pydantic import BaseModel

__all__ = ["KeysOfKind", "kinds_text", "refuse_other_kinds_keys"]

KeysOfKind = Mapping[str, frozenset[str]]
"""Each kind's keys, declared beside its section as ``KEYS_OF_KIND`` (a test checks each
table against the section's kinds and fields)."""


def kinds_text(kinds: Sequence[str], field: str = "kind") -> str:
    """``kind 'fedbuff'``, ``kinds 'target', 'growing_mu' or 'clip_tied'`` (``field``: the
    word for a kind, e.g. ``scheme``)."""
    quoted = [repr(kind) for kind in kinds]
    if len(quoted) == 1:
        return f"{field} {quoted[0]}"
    return f"{field}s {', '.join(quoted[:-1])} or {quoted[-1]}"


def refuse_other_kinds_keys(section: BaseModel, kind: str, keys_of: KeysOfKind, *,
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
    said = "; ".join(f"{key!r} is read by {kinds_text(owners, field)}"
                     for key, owners in readers.items())
    raise ValueError(f"{field} {kind!r} does not read {', '.join(map(repr, unread))} ({said}): "
                     f"remove it, or change the {field}")
