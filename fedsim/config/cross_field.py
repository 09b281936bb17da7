"""The checks that tie fields together, judged on what validated of a scenario with errors.

pydantic runs a section's ``model_validator(mode="after")`` s (unique group names, data shares
that sum to at most 1, a run that can stop, ...) only once every field of the section, and of
every section inside it, validated: a scenario with one negative number listed none of them,
and a stranger who fixed it was shown a new problem on the next run. After a failed
validation :func:`cross_field_problems` walks the data again as pydantic did, keeping what
validated:

* a section (a sub-model, a list item) with no error inside it is validated again, as pydantic
  built it;
* a section with an error inside or at it is built from its valid fields alone, every invalid
  field left out (reading it raises ``AttributeError``), and each of its after-validators runs
  on it, on its own (pydantic stops at the first that fails). A check that reads an invalid
  field, or that fails in any other way than with a ``ValueError``, is not judged: its problem
  could be only the field's. A check that raises a ``ValueError`` (a
  :class:`~fedsim.config.schema.FieldProblem` included) is a problem at the section's path,
  where pydantic places it;
* a section that breaks one of its own rules counts as invalid in the section around it, whose
  checks then do not read it;
* a value that is not a section (a number, a tagged union such as ``noise``, a list of
  numbers) is valid or not, as pydantic said.

So a check is judged exactly when every field it reads is valid (a check that goes through
the groups reads each until its first invalid one, and so is not judged past it: the file
fixed may show more), and a section's rules must each hold on their own (none may assume that an earlier one passed). The problems come back
as pydantic's error dicts, which :mod:`fedsim.config.loading` formats with their YAML paths,
leaving out those already listed.
"""

from __future__ import annotations

import types
import typing
from collections.abc import Iterable, Mapping, Sequence
from functools import cache
from typing import Any, TypeGuard

from pydantic import BaseModel, ValidationError, create_model
from pydantic.fields import FieldInfo

__all__ = ["cross_field_problems"]

Loc = tuple[str | int, ...]


class _Invalid:
    """Stands for a value that did not validate (a list item: reading it raises)."""

    def __getattr__(self, name: str) -> Any:
        raise AttributeError(name)


_INVALID = _Invalid()


def cross_field_problems(model: type[BaseModel], data: Any,
                         errors: Iterable[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """The problems of ``model`` 's after-validators that can be judged on ``data``, given the
    ``errors`` of its failed validation (pydantic's error dicts, with ``loc``)."""
    walk = _Walk([tuple(error["loc"]) for error in errors])
    walk.section(model, data, ())
    return walk.problems


class _Walk:
    def __init__(self, locs: Sequence[Loc]) -> None:
        self.at = set(locs)  # where an error is
        self.within = {loc[:end] for loc in locs for end in range(len(loc) + 1)}  # and above
        self.problems: list[dict[str, Any]] = []

    def value(self, owner: type[BaseModel], name: str, field: FieldInfo, raw: Any,
              loc: Loc) -> Any:
        """A field's value: as validated, a section built from what validated, or _INVALID."""
        if loc not in self.within:
            return _validated(owner, name, raw)
        shape = _shape(field)
        if shape is None:
            return _INVALID
        kind, section = shape
        if kind == "section":
            return self.section(section, raw, loc)
        if loc in self.at or not isinstance(raw, list):
            return _INVALID  # (the list itself is wrong: too short, not a list)
        return [self.item(section, item, (*loc, index)) for index, item in enumerate(raw)]

    def item(self, section: type[BaseModel], raw: Any, loc: Loc) -> Any:
        if loc not in self.within:
            try:
                return section.model_validate(raw)
            except ValidationError:
                return _INVALID
        return self.section(section, raw, loc)

    def section(self, section: type[BaseModel], raw: Any, loc: Loc) -> Any:
        """A section with an error inside or at it: built from its valid fields, every rule
        of it judged; _INVALID where it is not a mapping or breaks a rule."""
        built = self.build(section, raw, loc)
        if built is _INVALID:
            return _INVALID
        rules = [d.func for d in _validators(section) if d.info.mode == "after"]
        kept = [self.judge(rule, built, raw, loc) for rule in rules]  # each, even after one broke
        return built if all(kept) and loc not in self.at else _INVALID

    def build(self, section: type[BaseModel], raw: Any, loc: Loc) -> Any:
        """The section with its valid fields; reading an invalid one raises AttributeError."""
        raw = _before(section, raw)
        if not isinstance(raw, dict):
            return _INVALID
        values: dict[str, Any] = {}
        for name, field in section.model_fields.items():
            if name in raw:
                value = self.value(section, name, field, raw[name], (*loc, name))
            else:  # a required field's absence was listed
                value = _INVALID if field.is_required() else _default(section, name)
            if value is not _INVALID:
                values[name] = value
        built = section.model_construct(
            _fields_set={name for name in raw if name in section.model_fields}, **values)
        for name in section.model_fields.keys() - values.keys():
            built.__dict__.pop(name, None)  # (model_construct gave it its default)
        return built

    def judge(self, rule: Any, built: BaseModel, raw: Any, loc: Loc) -> bool:
        """Run one after-validator: False when it found a problem (recorded)."""
        try:
            rule(built)
        except ValueError as exc:
            self.problems.append({"type": "value_error", "loc": loc, "msg": f"Value error, {exc}",
                                  "input": raw, "ctx": {"error": exc}})
            return False
        except Exception:  # noqa: BLE001 - it read an invalid field (AttributeError): not judged
            # (a rule's own bug, say a TypeError, is silent here too: on a file with errors
            # only; a valid file runs every rule through pydantic, where it raises)
            return True
        return True


def _validators(section: type[BaseModel]) -> list[Any]:
    """The section's model validators, in the order pydantic runs them."""
    return list(section.__pydantic_decorators__.model_validators.values())


def _before(section: type[BaseModel], raw: Any) -> Any:
    """``raw`` as the section's before-validators leave it; _INVALID where one refused it
    (its error was listed) or a wrap-validator would run its rules (none in the schema)."""
    validators = _validators(section)
    if any(d.info.mode == "wrap" for d in validators):
        return _INVALID
    try:
        for decorator in validators:
            if decorator.info.mode == "before":
                raw = decorator.func(raw)
    except Exception:  # noqa: BLE001 - the before-validator's error was listed
        return _INVALID
    return raw


def _shape(field: FieldInfo) -> tuple[str, type[BaseModel]] | None:
    """("section", model) for a model field (or an optional one), ("list", model) for a list
    of models; None for anything else (a value, a tagged union), judged as a whole."""
    annotation = field.annotation
    if field.metadata and typing.get_origin(annotation) is not list:
        return None  # (a before-validator or constraint on a section: taken as a whole)
    origin = typing.get_origin(annotation)
    if origin in (typing.Union, types.UnionType):
        members = [a for a in typing.get_args(annotation) if a is not type(None)]
        if len(members) != 1:
            return None
        annotation, origin = members[0], typing.get_origin(members[0])
    if origin is list:
        (item,) = typing.get_args(annotation)
        return ("list", item) if _is_section(item) else None
    return ("section", annotation) if _is_section(annotation) else None


def _is_section(annotation: Any) -> TypeGuard[type[BaseModel]]:
    return isinstance(annotation, type) and issubclass(annotation, BaseModel)


def _validated(owner: type[BaseModel], name: str, raw: Any) -> Any:
    """``raw`` validated as ``owner`` 's field ``name`` (which pydantic found valid)."""
    try:
        return _field_model(owner, name).model_validate({"value": raw}).value  # type: ignore[attr-defined]
    except ValidationError:  # (a field validator of the section's own: not one of the field's)
        return _INVALID


@cache
def _default(owner: type[BaseModel], name: str) -> Any:
    """The field's default, validated as ``validate_default`` does (``speed``'s 0 is a
    Constant); one value for every section built here, which only reads it."""
    return _validated(owner, name,
                      owner.model_fields[name].get_default(call_default_factory=True))


@cache
def _field_model(owner: type[BaseModel], name: str) -> type[BaseModel]:
    """A model of one field, ``value``, validated as ``owner`` 's field ``name`` is (its
    constraints, before-validators and union tag)."""
    field = owner.model_fields[name]
    return create_model(f"{owner.__name__}_{name}", value=(field.annotation, field))
