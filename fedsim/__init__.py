"""fedsim: asynchronous federated learning with per-client DP-SGD and f-DP privacy ledgers.

The Python API (docs/API.md): :func:`load_scenario`, :func:`simulate` (returns a
:class:`RunResult`) and :func:`account`, defined in :mod:`fedsim.api` and imported from there
on first use, so ``import fedsim`` stays cheap (no torch until one of them is used).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"

_API = ("ClientPrivacy", "RunResult", "account", "load_scenario", "simulate")
__all__ = ["ClientPrivacy", "RunResult", "__version__", "account", "load_scenario", "simulate"]

if TYPE_CHECKING:
    from fedsim.api import ClientPrivacy, RunResult, account, load_scenario, simulate


def __getattr__(name: str) -> Any:
    if name in _API:
        from fedsim import api

        return getattr(api, name)
    raise AttributeError(f"module 'fedsim' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted([*globals(), *_API])
