"""Each numpy-defined C kernel steps aside when its environment variable says so, and its
function then gives numpy's result (the kernels' own files test them when loaded)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

from fedsim.aggregation import scaled_add
from fedsim.protocol import norms
from fedsim.training import local_step

UPDATE = np.random.default_rng(2).standard_normal(999).astype(np.float32)


def _norm() -> float:
    return norms.vector_norm(UPDATE)


def _mix() -> np.ndarray:
    total = np.ones(UPDATE.size)
    scaled_add.add_scaled(total, UPDATE, 0.5)
    return total


def _step() -> np.ndarray:
    return local_step.apply_local_step(np.ones(UPDATE.size, dtype=np.float32), UPDATE, 0.3,
                                       in_place=True)


def _norm_in_numpy() -> float:
    return norms.numpy_vector_norm(UPDATE)


def _mix_in_numpy() -> np.ndarray:
    return np.ones(UPDATE.size) + UPDATE.astype(np.float64) * 0.5


def _step_in_numpy() -> np.ndarray:
    return np.ones(UPDATE.size, dtype=np.float32) + UPDATE * np.float32(-0.3)


@pytest.mark.parametrize(("loader", "variable", "computed", "numpy_result"), [
    (norms._kernel, "FEDSIM_PURE_NUMPY_NORM", _norm, _norm_in_numpy),
    (scaled_add._kernel, "FEDSIM_PURE_NUMPY_ADD", _mix, _mix_in_numpy),
    (local_step._kernel, "FEDSIM_PURE_NUMPY_STEP", _step, _step_in_numpy),
], ids=["norm", "mix", "local step"])
def test_a_kernel_opted_out_is_not_loaded_and_numpy_computes(
        loader: Any, variable: str, computed: Callable[[], Any],
        numpy_result: Callable[[], Any], monkeypatch: pytest.MonkeyPatch) -> None:
    loader.cache_clear()
    try:
        monkeypatch.setenv(variable, "1")
        assert loader() is None
        assert np.array_equal(computed(), numpy_result())
    finally:
        loader.cache_clear()  # the next test loads the kernel again
