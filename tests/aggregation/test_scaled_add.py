"""The server's d += s u through the compiled kernel (fedsim.aggregation.scaled_add): numpy's
three-pass result to the bit, for every scale, length and value (NaN and inf too), numpy's path
for what the kernel does not take, a wrong kernel refused, and the user's opt-out."""

from __future__ import annotations

import ctypes
import shutil

import numpy as np
import pytest

from fedsim.aggregation import scaled_add
from fedsim.aggregation.mixing import AcceptedUpdate, descent_direction


def _numpy(total: np.ndarray, update: np.ndarray, scale: float) -> np.ndarray:
    widened = update.astype(np.float64).reshape(total.shape)
    with np.errstate(invalid="ignore", over="ignore"):  # inf * 0 and huge values on purpose
        widened *= scale
        return total + widened


@pytest.fixture
def kernel_loaded() -> None:
    if shutil.which("cc") is None and shutil.which("gcc") is None:
        pytest.skip("no C compiler: numpy's path is the only one")
    assert scaled_add._kernel() is not None  # builds and passes its probes here


@pytest.mark.parametrize("seed", range(3))
def test_the_kernel_adds_as_numpy_to_the_bit(kernel_loaded: None, seed: int) -> None:
    rng = np.random.default_rng(seed)
    for size in (0, 1, 7, 8, 9, 31, 32, 33, 4097, 101_770):
        total = rng.standard_normal(size) * 10.0 ** rng.uniform(-5, 5)
        update = (rng.standard_normal(size) * 10.0 ** rng.uniform(-30, 30)).astype(np.float32)
        if size > 40:
            update[rng.integers(size, size=3)] = [np.nan, np.inf, -np.inf]
            update[rng.integers(size)] = np.finfo(np.float32).max
        for scale in (rng.uniform(-3, 3), 1e-300, -7.0 / 3.0, 0.0):
            expected = _numpy(total, update, scale)
            held = total.copy()
            scaled_add.add_scaled(held, update, scale)
            assert held.tobytes() == expected.tobytes()


def test_strided_and_float64_updates_take_numpys_path_with_the_same_result(
        kernel_loaded: None, monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[int] = []
    real = scaled_add._kernel()
    assert real is not None

    def counted(*args: object) -> None:
        calls.append(1)
        real(*args)

    monkeypatch.setattr(scaled_add, "_kernel", lambda: counted)
    rng = np.random.default_rng(5)
    update = rng.standard_normal(2000).astype(np.float32)
    total = rng.standard_normal(1000)
    unaligned = np.frombuffer(b"\0" + update[:1000].tobytes(), dtype=np.float32, offset=1)
    for other in (update[::2], update[:1000].astype(np.float64)):
        held = total.copy()
        scaled_add.add_scaled(held, other, 0.3)
        assert held.tobytes() == _numpy(total, other, 0.3).tobytes()
    assert calls == []
    for contiguous in (update[:1000], unaligned):  # a decoded update is a view at any offset
        held = total.copy()
        scaled_add.add_scaled(held, contiguous, 0.3)
        assert held.tobytes() == _numpy(total, contiguous, 0.3).tobytes()
    assert calls == [1, 1]


def test_the_window_direction_is_the_same_with_and_without_the_kernel(
        kernel_loaded: None, monkeypatch: pytest.MonkeyPatch) -> None:
    rng = np.random.default_rng(9)
    updates = [AcceptedUpdate(f"c-{k}", 0, rng.standard_normal(5000).astype(np.float32), 10,
                              float(rng.uniform(0.01, 1))) for k in range(20)]
    coefficients = rng.uniform(0, 1, 20)
    with_kernel = descent_direction(updates, coefficients)
    monkeypatch.setattr(scaled_add, "_kernel", lambda: None)
    assert descent_direction(updates, coefficients).tobytes() == with_kernel.tobytes()


@pytest.mark.parametrize("wrong", ["fused", "float32", "ignores NaN"])
def test_a_kernel_that_disagrees_is_refused(wrong: str) -> None:
    """A fused multiply-add (one rounding, not two), a float32 product, or a kernel that skips
    NaN: each differs from numpy somewhere on the probes."""

    def add(total_at: int, update_at: int, scale: float, size: int) -> None:
        if not size:
            return
        total = np.ctypeslib.as_array(ctypes.cast(total_at, ctypes.POINTER(ctypes.c_double)),
                                      shape=(size,))
        update = np.ctypeslib.as_array(ctypes.cast(update_at, ctypes.POINTER(ctypes.c_float)),
                                       shape=(size,))
        if wrong == "fused":  # exact product and sum, rounded once
            from fractions import Fraction

            total[:] = [float(Fraction(t) + Fraction(float(u)) * Fraction(scale))
                        if np.isfinite(u) else t + float(u) * scale
                        for t, u in zip(total, update, strict=True)]
        elif wrong == "float32":
            total += (update * np.float32(scale)).astype(np.float64)
        else:
            total += np.nan_to_num(update.astype(np.float64), nan=0.0) * scale

    assert not scaled_add._agrees(add)


def test_a_read_only_or_overlapping_total_is_never_written_by_the_kernel(
        kernel_loaded: None) -> None:
    """The kernel writes through a raw pointer: a read-only ``total`` gets numpy's refusal, and
    a ``total`` sharing memory with ``update`` (undefined for the kernel's restrict pointers)
    numpy's result, computed from the update as it was."""
    total = np.ones(64)
    total.flags.writeable = False
    with pytest.raises(ValueError, match="read-only"):
        scaled_add.add_scaled(total, np.ones(64, dtype=np.float32), 0.5)
    assert total.tolist() == [1.0] * 64
    memory = np.arange(64, dtype=np.float64)
    shared_update = memory[16:32].view(np.float32)  # 32 float32 values
    overlapping_total = memory[16:48]  # 32 float64 values over the update's bytes
    expected = _numpy(overlapping_total.copy(), shared_update.copy(), 0.25)
    scaled_add.add_scaled(overlapping_total, shared_update, 0.25)
    assert overlapping_total.tobytes() == expected.tobytes()


def test_the_mix_is_built_without_fast_math(monkeypatch: pytest.MonkeyPatch) -> None:
    from fedsim.training import native

    asked: list[bool] = []

    def recorded(source: object, **options: object) -> None:
        asked.append(bool(options.get("fast_math", True)))

    monkeypatch.setattr(native, "load_library", recorded)
    scaled_add._kernel.cache_clear()
    try:
        assert scaled_add._kernel() is None and asked == [False]
    finally:
        scaled_add._kernel.cache_clear()
    assert all("-ffast-math" not in flags and "-ffp-contract=off" in flags
               for flags, _ in native.recipes(fast_math=False))
    assert native.recipes() == native.RECIPES
    assert any("-ffast-math" in flags for flags, _ in native.RECIPES)


@pytest.mark.parametrize("offset", [1, 2, 3])
def test_the_probes_misaligned_copy_is_off_alignment_with_the_same_values(offset: int) -> None:
    """What every kernel's probe feeds it as a decoded update's view into its frame."""
    from fedsim.training.native import misaligned

    values = np.arange(37, dtype=np.float32) / 7
    copy = misaligned(values, offset)
    assert copy.ctypes.data % values.itemsize != 0
    assert copy.tobytes() == values.tobytes() and copy.dtype == values.dtype
    assert not copy.flags.writeable
