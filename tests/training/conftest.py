"""Shared fixtures for the training tests: one torch thread, the shared MNIST copy."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

MNIST_NPZ = Path(__file__).resolve().parents[2] / ".." / "shared" / "datasets" / "mnist.npz"


@pytest.fixture(autouse=True)
def _one_thread() -> None:
    torch.set_num_threads(1)


@pytest.fixture(scope="session")
def mnist_path() -> Path:
    if not MNIST_NPZ.is_file():
        pytest.skip(f"shared MNIST copy not at {MNIST_NPZ}")
    return MNIST_NPZ
