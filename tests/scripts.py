"""Benchmark and study scripts loaded by path (they are scripts, not a package), for the tests
that check them (import as ``from tests.scripts import load_script``)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

BENCHMARKS = Path(__file__).resolve().parents[1] / "benchmarks"


def load_script(path: Path, name: str) -> ModuleType:
    """The script at ``path`` as module ``name``, loaded once a process. It is registered in
    ``sys.modules`` before it runs (dataclasses look their module up while it executes), with
    ``benchmarks/`` on ``sys.path`` meanwhile for its ``_common``."""
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    added = str(BENCHMARKS) not in sys.path
    if added:
        sys.path.insert(0, str(BENCHMARKS))
    try:
        spec.loader.exec_module(module)
    except BaseException:
        del sys.modules[name]
        raise
    finally:
        if added:
            sys.path.remove(str(BENCHMARKS))
    return module
