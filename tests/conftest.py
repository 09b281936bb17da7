"""Fixtures for every test: real MNIST, found the way a scenario finds it.

Tests that need the real data set (its pinned digest, the paper reproductions) get it through
the same search order as ``dataset: {name: mnist}``: ``$FEDSIM_DATA_DIR``, the user cache,
then a verified download into the cache. Offline (``FEDSIM_OFFLINE=1``, or no network) with
no local copy they skip, saying why. Every other test makes its own small data.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import structlog

from fedsim.data import datasets
from fedsim.data.locate import offline
from fedsim.errors import DataError


@pytest.fixture(scope="session")
def real_mnist() -> datasets.Found:
    """MNIST as a scenario would find it (downloaded into the user cache when online)."""
    try:
        return datasets.resolve("mnist")
    except DataError as exc:
        lines = [line.strip() for line in str(exc).splitlines()]
        failed = next((line for line in lines if line.startswith("download:")), lines[0])
        why = ("offline (FEDSIM_OFFLINE=1) and no local copy" if offline()
               else f"no local copy, and {failed}")
        pytest.skip(f"needs real MNIST: {why}; run `fedsim data fetch mnist` once, or set "
                    "FEDSIM_DATA_DIR to a directory holding mnist.npz")


@pytest.fixture(autouse=True)
def _unconfigured_logging() -> Iterator[None]:
    """Each test starts with structlog as a fresh process has it: a test that runs the CLI
    configures it (a level, JSON lines), and that configuration would otherwise decide what a
    later test's ``capture_logs`` sees (its filtering level survives the capture)."""
    yield
    structlog.reset_defaults()
