"""A library call changes no process-wide setting: ``fedsim.simulate`` leaves the caller's
allocator as it is (every ``fedsim`` command sets it; tests/runtime/test_allocator.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

import fedsim
from fedsim.runtime import allocator

from .conftest import TINY


def test_simulate_leaves_the_callers_allocator_alone(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls: list[object] = []

    def recorded(*args: object) -> bool:
        calls.append(args)
        return True

    monkeypatch.setattr(allocator, "keep_freed_memory", recorded)
    monkeypatch.setattr(allocator, "_MALLOPT", None)  # and nothing reaches mallopt directly
    result = fedsim.simulate(TINY, out=tmp_path / "run", progress=False, plots=False)
    assert result.summary["windows"] > 0
    assert calls == []
