"""A client's local step ``w - eta u`` (fedsim.training.local_step): numpy's float32 values to
the bit, compiled or not, in place or into a new array, at any alignment of its inputs."""

from __future__ import annotations

import numpy as np
import pytest

from fedsim.training import local_step as module
from fedsim.training.local_step import apply_local_step


def _numpy_step(w: np.ndarray, update: np.ndarray, eta: float) -> np.ndarray:
    return w + update * np.float32(-eta)  # the definition: product rounded, then the sum


@pytest.mark.parametrize("compiled", [True, False])
def test_the_step_is_numpys_to_the_bit(compiled: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    if compiled and module._kernel() is None:
        pytest.skip("no C compiler here: numpy's path only")
    if not compiled:
        monkeypatch.setattr(module, "_kernel", lambda: None)
    rng = np.random.default_rng(4)
    for size in (1, 15, 101_770):
        for eta in (0.05, 1 / 3, 3e-7):
            w = rng.standard_normal(size).astype(np.float32) * np.float32(rng.uniform(1e-3, 1e3))
            update = rng.standard_normal(size).astype(np.float32)
            expected = _numpy_step(w, update, eta).tobytes()
            received = w.copy()
            received.flags.writeable = False  # a received model: never written
            stepped = apply_local_step(received, update, eta, in_place=False)
            assert stepped is not received and stepped.tobytes() == expected
            assert received.tobytes() == w.tobytes()
            own = w.copy()
            assert apply_local_step(own, update, eta, in_place=True) is own
            assert own.tobytes() == expected
            # a received model is a view into its message at any byte offset
            framed = np.frombuffer(b"\0" * 3 + w.tobytes(), dtype=np.float32, offset=3)
            assert apply_local_step(framed, update, eta, in_place=False).tobytes() == expected


def test_other_layouts_take_numpys_path() -> None:
    w = np.arange(20, dtype=np.float32)[::2]  # strided
    update = np.ones(10, dtype=np.float32)
    expected = _numpy_step(w, update, 0.5)
    assert np.array_equal(apply_local_step(w, update, 0.5, in_place=False), expected)
    double = np.ones(10)
    assert apply_local_step(double, update, 0.5, in_place=True) is double
    assert np.array_equal(double, np.full(10, 0.5))


def test_a_read_only_model_is_never_written_in_place() -> None:
    """An attacker's review: the kernel's path did not check writeability and wrote into an
    immutable bytes object; now numpy's refusal stands."""
    frozen = bytes(np.ones(8, dtype=np.float32).tobytes())
    w = np.frombuffer(frozen, dtype=np.float32)
    with pytest.raises(ValueError, match="read-only"):
        apply_local_step(w, np.ones(8, dtype=np.float32), 0.5, in_place=True)
    assert frozen == np.ones(8, dtype=np.float32).tobytes()
