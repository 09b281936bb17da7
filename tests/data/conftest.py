"""Shared fixtures for the data tests: one torch thread, and an isolated data environment."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch


@pytest.fixture(autouse=True)
def _one_thread() -> None:
    torch.set_num_threads(1)


@pytest.fixture(autouse=True)
def _isolated(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """An empty user cache (the path returned), no $FEDSIM_DATA_DIR, online unless a test
    says otherwise."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    monkeypatch.delenv("FEDSIM_DATA_DIR", raising=False)
    monkeypatch.delenv("FEDSIM_OFFLINE", raising=False)
    return tmp_path / "cache" / "fedsim"
