"""The compiled sum of squares behind an update's integrity norm (fedsim.protocol.norms): numpy's
norm to float64 rounding, non-finite exactly when a value is, checked before use, and numpy's
path where it does not apply or the user opts out."""

from __future__ import annotations

import math
import shutil
from collections.abc import Callable

import numpy as np
import pytest

from fedsim.protocol import norms
from fedsim.protocol.codec import CodecError, decode, encode
from fedsim.protocol.messages import ClientUpdate


def _plain(values: np.ndarray) -> float:
    """The definition: a float64 copy, then a float64 sum of squares (math.fsum: exact)."""
    as64 = np.asarray(values, dtype=np.float64).ravel()
    return math.sqrt(math.fsum(as64 * as64))


@pytest.fixture
def kernel() -> Callable[[int, int], float]:
    if shutil.which("cc") is None and shutil.which("gcc") is None:
        pytest.skip("no C compiler: the numpy norm is the only one")
    loaded = norms._kernel()
    assert loaded is not None  # with a compiler the kernel builds and passes its probes
    return loaded


@pytest.mark.parametrize("seed", range(3))
def test_the_kernel_norm_is_the_exact_norm_to_float64_rounding(
        kernel: Callable[[int, int], float], seed: int) -> None:
    rng = np.random.default_rng(seed)
    for size in (0, 1, 15, 16, 17, 31, 32, 33, 4095, 101_770, 250_001):
        scale = 10.0 ** rng.uniform(-30, 30)
        values = (rng.standard_normal(size) * scale).astype(np.float32)
        # unaligned starts too: a decoded update is a view into its frame at any byte offset
        misaligned = np.frombuffer(b"\0" + values.tobytes(), dtype=np.float32, offset=1)
        for vector in (values, values[1:], values[3:], misaligned):
            assert math.isclose(norms.vector_norm(vector), _plain(vector), rel_tol=1e-13)
            assert norms.vector_norm(vector) == norms.vector_norm(vector.copy())  # reproducible


def test_every_float32_layout_goes_through_the_kernel_as_its_c_order_copy(
        kernel: Callable[[int, int], float], monkeypatch: pytest.MonkeyPatch) -> None:
    """A vector's norm does not depend on its layout (a strided update and the contiguous frame
    it travels as must agree to the bit); other dtypes take numpy's path."""
    calls: list[int] = []

    def counted(address: int, size: int) -> float:
        calls.append(size)
        return kernel(address, size)

    monkeypatch.setattr(norms, "_kernel", lambda: counted)
    rng = np.random.default_rng(1)
    values = rng.standard_normal(2000).astype(np.float32)
    contiguous = norms.vector_norm(values[::2].copy())
    assert norms.vector_norm(values[::2]) == contiguous
    matrix = values.reshape(40, 50)
    assert norms.vector_norm(matrix.T) == norms.vector_norm(matrix.T.copy().reshape(-1))
    assert calls == [1000, 1000, 2000, 2000]
    for other in (values.astype(np.float64), values.astype(np.float16)):
        assert norms.vector_norm(other) == norms.numpy_vector_norm(other)
    assert len(calls) == 4


@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
def test_a_non_finite_value_anywhere_gives_a_non_finite_norm(
        kernel: Callable[[int, int], float], bad: float) -> None:
    values = np.ones(1037, dtype=np.float32)
    for at in (0, 1, 15, 16, 500, 1020, 1021, 1036):  # in the lanes and in the tail
        spoiled = values.copy()
        spoiled[at] = bad
        assert not math.isfinite(norms.vector_norm(spoiled))
    # the largest finite float32 squared overflows float32, not float64: finite
    huge = np.full(10_000, np.finfo(np.float32).max, dtype=np.float32)
    assert math.isfinite(norms.vector_norm(huge))
    assert math.isclose(norms.vector_norm(huge), _plain(huge), rel_tol=1e-13)


def test_the_codec_refuses_a_non_finite_update_through_the_kernel(
        kernel: Callable[[int, int], float]) -> None:
    delta = np.ones(100, dtype=np.float32)
    frame = bytearray(encode(ClientUpdate("c-1", 0, 0, delta, 4.0)))
    assert decode(bytes(frame)).norm == pytest.approx(10.0, rel=1e-15)  # type: ignore[union-attr]
    frame[-4:] = np.array([np.nan], dtype=np.float32).tobytes()  # the last value, on the wire
    with pytest.raises(CodecError) as caught:
        decode(bytes(frame))
    assert caught.value.kind == "non_finite"


@pytest.mark.parametrize("wrong", ["float32 sums", "NaN dropped", "tail dropped"])
def test_a_kernel_that_disagrees_is_refused(wrong: str) -> None:
    """The probes catch a kernel that sums in float32 (overflows on huge finite values), one
    that skips NaN, and one that forgets the values past its last full block of lanes."""
    import ctypes

    def kernel(address: int, size: int) -> float:
        values = np.ctypeslib.as_array(ctypes.cast(address, ctypes.POINTER(ctypes.c_float)),
                                       shape=(size,)) if size else np.zeros(0, np.float32)
        if wrong == "float32 sums":
            with np.errstate(over="ignore"):
                return float(np.sum(values * values, dtype=np.float32))
        as64 = values.astype(np.float64)
        if wrong == "NaN dropped":
            return float(np.nansum(as64 * as64))
        kept = as64[: size - size % 16]
        return float(np.sum(kept * kept))

    assert not norms._agrees(kernel)
