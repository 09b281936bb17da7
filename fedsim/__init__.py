"""fedsim: asynchronous federated learning with per-client DP-SGD and f-DP privacy ledgers.

The Python API (docs/API.md): :func:`load_scenario`, :func:`simulate` (returns a
:class:`RunResult`) and :func:`account`, defined in :mod:`fedsim.api` and imported from there
on first use, so ``import fedsim`` stays cheap (no torch until one of them is used). The errors
they raise are importable from here too: :class:`FedsimError` (the root),
:class:`ConfigError`, :class:`DataError`, :class:`ModelError` (a ``ConfigError``), defined in
:mod:`fedsim.errors`, and :class:`ScenarioError` (a ``ConfigError``), defined in
:mod:`fedsim.config.loading`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from fedsim.errors import ConfigError, DataError, FedsimError, ModelError

__version__ = "0.1.0"

_LAZY = {
    "ClientPrivacy": "fedsim.api", "RunResult": "fedsim.api", "account": "fedsim.api",
    "load_scenario": "fedsim.api", "simulate": "fedsim.api",
    "ScenarioError": "fedsim.config.loading",
}
__all__ = ["ClientPrivacy", "ConfigError", "DataError", "FedsimError", "ModelError",
           "RunResult", "ScenarioError", "__version__", "account", "load_scenario", "simulate"]

if TYPE_CHECKING:
    from fedsim.api import ClientPrivacy, RunResult, account, load_scenario, simulate
    from fedsim.config.loading import ScenarioError


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'fedsim' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted([*globals(), *_LAZY])
