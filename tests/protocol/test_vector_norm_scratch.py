"""The numpy norm (norms.numpy_vector_norm, the path of every vector the compiled kernel does
not take) converts into a reused per-thread float64 buffer instead of a fresh array: the same
norm, bit for bit, as the plain conversion, whatever came before it."""

from __future__ import annotations

import math
import threading

import numpy as np
import pytest

from fedsim.protocol.norms import numpy_vector_norm as vector_norm


def _plain(values: np.ndarray) -> float:
    """The definition before the buffer: a fresh float64 copy, then the same einsum."""
    as64 = np.asarray(values, dtype=np.float64).ravel()
    return math.sqrt(float(np.einsum("i,i->", as64, as64)))


@pytest.mark.parametrize("seed", range(4))
def test_the_norm_is_bit_for_bit_the_plain_one(seed: int) -> None:
    rng = np.random.default_rng(seed)
    # sizes around the SIMD widths and the model's, in an order that grows and shrinks the buffer
    for size in (101_770, 1, 7, 8, 9, 31, 4096, 101_797, 3, 250_000, 17):
        scale = 10.0 ** rng.uniform(-30, 30)
        values = (rng.standard_normal(size) * scale).astype(np.float32)
        assert vector_norm(values).hex() == _plain(values).hex()
        view = values[1:]  # an unaligned view into another buffer
        assert vector_norm(view).hex() == _plain(view).hex()


def test_other_layouts_and_dtypes_are_the_plain_norm() -> None:
    rng = np.random.default_rng(7)
    matrix = rng.standard_normal((30, 11)).astype(np.float32)
    assert vector_norm(matrix).hex() == _plain(matrix).hex()
    strided = matrix.T  # not contiguous: converted in ravel's (C) order
    assert vector_norm(strided).hex() == _plain(strided).hex()
    wide = rng.standard_normal(1000)
    assert vector_norm(wide).hex() == _plain(wide).hex()
    half = rng.standard_normal(100).astype(np.float16)
    assert vector_norm(half).hex() == _plain(half).hex()
    integers = np.arange(50)
    assert vector_norm(integers) == _plain(integers)
    assert vector_norm(np.zeros(0, dtype=np.float32)) == 0.0


@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
def test_a_non_finite_value_still_gives_a_non_finite_norm(bad: float) -> None:
    values = np.ones(5000, dtype=np.float32)
    assert math.isfinite(vector_norm(values))
    values[1234] = bad
    assert not math.isfinite(vector_norm(values))
    assert math.isfinite(vector_norm(np.ones(10, dtype=np.float32)))  # the buffer is reused


def test_threads_each_get_their_own_buffer() -> None:
    rng = np.random.default_rng(3)
    vectors = [(rng.standard_normal(20_000 + 13 * k) * (k + 1)).astype(np.float32)
               for k in range(8)]
    expected = [_plain(v) for v in vectors]
    mismatches: list[int] = []

    def work(k: int) -> None:
        for _ in range(200):
            if vector_norm(vectors[k]) != expected[k]:
                mismatches.append(k)

    threads = [threading.Thread(target=work, args=(k,)) for k in range(len(vectors))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert mismatches == []
