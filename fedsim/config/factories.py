"""The user's own code named in a scenario: ``"package.module:function"``, resolved and called.

One way for every factory (``model.factory``, ``dataset.factory``): :func:`resolve_factory`
imports the callable (also from the working directory, the scenario file's directory and
``$FEDSIM_FACTORY_PATH``, which are not left on ``sys.path``), :func:`call_factory` calls it with its options and the keyword
arguments it takes from the run. Every failure is a :class:`~fedsim.errors.ConfigError` that
names the scenario path and the factory, never a traceback.

A factory named in a scenario is code the scenario makes this machine run (``subprocess:call``
is a callable too), and a scenario file travels: a deployed client reads the server's. So a
scenario that names one runs only with the explicit opt-in (:func:`require_allowed`):
``--allow-factory`` on the command line, ``allow_factories=True`` in Python. Importing the
module already runs its code, so the check comes before any import. The opt-in is the whole
rule: where the module is found (the scenario's directory, ``$FEDSIM_FACTORY_PATH``, an
installed package) is no safety boundary, since an installed module such as ``os`` or
``subprocess`` is as dangerous as any file.
"""

from __future__ import annotations

import importlib
import inspect
import os
import re
import sys
from collections.abc import Callable, Collection, Mapping, Sequence
from pathlib import Path
from typing import Any

from fedsim.config.factory import FACTORY_PATTERN
from fedsim.config.schema import Scenario
from fedsim.errors import ConfigError, FedsimError

ALLOW_FLAG = "--allow-factory"
"""The command-line opt-in to running the factories a scenario names."""


def scenario_factories(scenario: Scenario) -> dict[str, str]:
    """The factories ``scenario`` names, by scenario path (``model.factory``, ``model.loss``,
    ``dataset.factory``): the code building its run would import and call."""
    named = {"model.factory": scenario.model.factory, "model.loss": scenario.model.loss,
             "dataset.factory": scenario.dataset.factory}
    return {where: reference for where, reference in named.items() if reference is not None}


def refusal(factories: Mapping[str, str]) -> str:
    """Why a scenario naming ``factories`` is not run without the opt-in, and how to give it."""
    named = ", ".join(f"{where} {reference!r}" for where, reference in factories.items())
    return (f"{named}: the scenario names Python code to import and call on this machine, which "
            f"is run only when you opt in; read the scenario and its module first, then pass "
            f"{ALLOW_FLAG} (allow_factories=True in Python)")


def require_allowed(scenario: Scenario, allowed: bool, *, unused: Collection[str] = ()) -> None:
    """Refuse (:class:`ConfigError`) a scenario that names a factory unless ``allowed``
    (``unused``: the paths of factories the run replaces from Python, never called)."""
    factories = {k: v for k, v in scenario_factories(scenario).items() if k not in unused}
    if factories and not allowed:
        raise ConfigError(refusal(factories))


def _try_import(name: str, where: str) -> Any:
    """The module ``name``, or None when it is not found (a failure inside it is an error)."""
    try:
        return importlib.import_module(name)
    except ModuleNotFoundError as exc:
        if exc.name is not None and (name == exc.name or name.startswith(exc.name + ".")):
            return None
        raise ConfigError(
            f"{where}: importing module {name!r} failed: {type(exc).__name__}: {exc}"
        ) from exc
    except Exception as exc:
        raise ConfigError(
            f"{where}: importing module {name!r} raised {type(exc).__name__}: {exc}"
        ) from exc


def _import_module(name: str, search: Sequence[Path], where: str) -> Any:
    module = _try_import(name, where)
    # Not on sys.path: also look where the user most likely put it (kept out of sys.path after).
    extra = [str(d) for d in dict.fromkeys(search) if str(d) not in sys.path]
    if module is None and extra:
        sys.path.extend(extra)
        importlib.invalidate_caches()
        try:
            module = _try_import(name, where)
        finally:
            for entry in extra:
                sys.path.remove(entry)
    if module is None:
        places = ", ".join(dict.fromkeys(str(d) for d in search)) or "nothing else"
        raise ConfigError(
            f"{where}: cannot import module {name!r}: it must be installed or on PYTHONPATH "
            f"(also searched: {places})"
        )
    return module


SEARCH_ENV = "FEDSIM_FACTORY_PATH"
"""Further directories (``os.pathsep``-separated) searched for factory modules: ``fedsim
launch`` sets it to the user's scenario directory for its processes, which read the resolved
scenario from the run directory."""


def search_places(base_dir: Path | None) -> list[Path]:
    """Where a scenario's factory module is also looked for: the working directory, the
    scenario file's directory, then the directories in ``$FEDSIM_FACTORY_PATH``."""
    extra = [Path(p) for p in os.environ.get(SEARCH_ENV, "").split(os.pathsep) if p]
    return [Path(os.getcwd())] + ([base_dir] if base_dir is not None else []) + extra


def resolve_factory(
    reference: str, *, where: str = "model.factory", search: Sequence[Path] = ()
) -> Callable[..., Any]:
    """The callable named by ``"package.module:function"``, imported now.

    ``search``: directories also tried when the module is not importable as is (the current
    directory and the scenario file's directory). Raises :class:`ConfigError` naming ``where``.
    """
    if not re.match(FACTORY_PATTERN, reference):
        raise ConfigError(f"{where}: {reference!r} is not of the form 'package.module:function'")
    module_name, _, attribute = reference.partition(":")
    target: Any = _import_module(module_name, search, where)
    for part in attribute.split("."):
        try:
            target = getattr(target, part)
        except AttributeError:
            raise ConfigError(
                f"{where}: module {module_name!r} has no attribute {attribute!r}"
            ) from None
    if not callable(target):
        raise ConfigError(f"{where}: {reference!r} is a {type(target).__name__}, not a callable")
    return target


def _accepts(factory: Callable[..., Any], name: str) -> bool:
    try:
        parameters = inspect.signature(factory).parameters
    except (TypeError, ValueError):
        return False
    param = parameters.get(name)
    return param is not None and param.kind in (param.POSITIONAL_OR_KEYWORD, param.KEYWORD_ONLY)


def call_factory(
    factory: Callable[..., Any],
    options: Mapping[str, Any],
    *,
    where: str,
    data: Mapping[str, Any] | None = None,
) -> tuple[Any, str]:
    """``factory(**options)`` and how it was called (``label(k=v, ...)``, for later errors).

    ``data`` fills in keyword arguments the factory takes by name and ``options`` does not
    give (``num_classes`` and ``input_shape`` for a model, ``seed`` for a data set). Anything
    it raises becomes a :class:`ConfigError` naming ``where`` and the call.
    """
    kwargs = dict(options)
    for key, value in (data or {}).items():
        if key not in kwargs and _accepts(factory, key):
            kwargs[key] = value
    label = getattr(factory, "__qualname__", type(factory).__name__)
    call = f"{label}({', '.join(f'{k}={v!r}' for k, v in kwargs.items())})"
    try:
        return factory(**kwargs), call
    except FedsimError as exc:
        raise ConfigError(f"{where}: {call} failed: {exc}") from exc
    except Exception as exc:
        raise ConfigError(f"{where}: {call} raised {type(exc).__name__}: {exc}") from exc
