"""A section that chooses a kind with one field (a server optimizer's ``kind``, a partition's
``scheme``) and holds every kind's keys side by side: the keys the chosen kind does not read
are refused, as a tagged union's other kinds' keys are, and with the same hint
(:mod:`fedsim.config.suggestions`): :class:`KeysOfOtherKinds` names each key, which
:mod:`fedsim.config.loading` places at the key's own path."""

from __future__ import annotations

import typing
from collections.abc import Mapping, Sequence
from typing import Literal

from pydantic import BaseModel

__all__ = ["KeysOfKind", "KeysOfOtherKinds", "kind_field", "kinds_text",
           "refuse_other_kinds_keys"]

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


def kind_field(section: type[BaseModel], keys_of: KeysOfKind) -> str:
    """The field that chooses the kind of ``section`` (``kind``, a partition's ``scheme``):
    the one whose choices are the kinds of its table ``keys_of``."""
    return next(name for name, field in section.model_fields.items()
                if typing.get_origin(field.annotation) is Literal
                and set(typing.get_args(field.annotation)) == set(keys_of))


class KeysOfOtherKinds(ValueError):
    """Keys written in a section that the kind its ``field`` chose (``kind``) does not read,
    each with the kinds that read it (``owners``, in the table's order). Its text is complete
    on its own (a section's error, where pydantic places it); :mod:`fedsim.config.loading`
    says instead one problem per key, at the key, with the fix that fits where the mismatch
    came from (:func:`fedsim.config.suggestions.key_of_another_kind`)."""

    def __init__(self, field: str, kind: str, owners: Mapping[str, Sequence[str]]) -> None:
        said = "; ".join(f"{key!r} is read by {kinds_text(kinds, field)}"
                         for key, kinds in owners.items())
        super().__init__(f"{field} {kind!r} does not read {', '.join(map(repr, owners))} "
                         f"({said})")
        self.field = field
        self.kind = kind
        self.owners = {key: list(kinds) for key, kinds in owners.items()}


def refuse_other_kinds_keys(section: BaseModel, keys_of: KeysOfKind) -> None:
    """Refuse a key written in a section whose kind (chosen by :func:`kind_field`) does not
    read it (``keys_of``: each kind's keys): ``{kind: sgd, beta2: 0.9}`` ran as plain SGD, the
    key accepted and ignored, where a tagged union's other kinds' keys are refused. A key at
    its default is let be: it changes nothing whatever the kind, and a resolved scenario
    (``scenario.resolved.yaml``) writes every key."""
    fields = type(section).model_fields
    field = kind_field(type(section), keys_of)
    kind = getattr(section, field)
    unread = sorted(key for key in section.model_fields_set - {field} - keys_of[kind]
                    if getattr(section, key) != fields[key].default)
    if unread:
        raise KeysOfOtherKinds(field, kind, {key: [k for k, keys in keys_of.items() if key in keys]
                                             for key in unread})
