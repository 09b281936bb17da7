"""A sender's measured norm, taken by the codec instead of a second pass (norms.given_up_norm)."""

from __future__ import annotations

import gc
import math
import threading
import warnings

import numpy as np
import pytest

from fedsim.errors import CodecError
from fedsim.protocol import codec, norms
from fedsim.protocol.messages import ClientUpdate
from tests.doubles import count_norm_reads


def _update(values: np.ndarray) -> ClientUpdate:
    return ClientUpdate("c1", 0, 0, values, 8.0)


def _counting(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Count the codec's own passes over a vector (its vector_norm and isfinite calls)."""
    calls = [0]
    real_norm, real_isfinite = codec.vector_norm, np.isfinite

    def counted_norm(values: np.ndarray) -> float:
        calls[0] += 1
        return real_norm(values)

    class CountedNumpy:
        def __getattr__(self, name: str) -> object:
            return getattr(np, name)

        @staticmethod
        def isfinite(values: np.ndarray) -> np.ndarray:
            calls[0] += 1
            return real_isfinite(values)

    monkeypatch.setattr(codec, "vector_norm", counted_norm)
    monkeypatch.setattr(codec, "np", CountedNumpy())
    return calls


def test_a_given_up_update_is_sealed_and_encoded_without_another_pass(
        monkeypatch: pytest.MonkeyPatch) -> None:
    values = np.random.default_rng(0).standard_normal(1001).astype(np.float32)
    calls = _counting(monkeypatch)
    norm = norms.given_up_norm(values)
    assert not values.flags.writeable
    assert norm == norms.vector_norm(values)
    sealed = codec.seal(_update(values))
    assert calls[0] == 0 and sealed.norm == norm and sealed.body is values
    frame = codec.encode(_update(values))
    assert calls[0] == 0
    decoded = codec.decode(frame)  # the receiver measures the bytes itself, always
    assert isinstance(decoded, ClientUpdate) and decoded.norm == pytest.approx(norm, rel=1e-12)


def test_an_array_not_given_up_is_measured_by_the_codec(monkeypatch: pytest.MonkeyPatch) -> None:
    values = np.ones(64, dtype=np.float32)
    norms.given_up_norm(np.ones(64, dtype=np.float32))  # another array with equal values
    calls = _counting(monkeypatch)
    assert codec.seal(_update(values)).norm == 8.0
    assert calls[0] == 1


def test_every_live_array_of_the_thread_is_remembered_until_it_dies() -> None:
    first, second = np.ones(8, dtype=np.float32), np.full(8, 2.0, dtype=np.float32)
    norms.given_up_norm(first)
    assert norms.known_norm(first) == math.sqrt(8)
    norms.given_up_norm(second)
    assert norms.known_norm(first) == math.sqrt(8) and norms.known_norm(second) == math.sqrt(32)
    seen: list[float | None] = []
    thread = threading.Thread(target=lambda: seen.append(norms.known_norm(second)))
    thread.start()
    thread.join()
    assert seen == [None]  # another thread (another sender) measures for itself
    gc.collect()  # arrays earlier tests left in reference cycles die now, not in the count
    before = len(norms._remembered.norms)
    key = id(first)
    del first
    gc.collect()
    assert len(norms._remembered.norms) == before - 1 and key not in norms._remembered.norms
    # what is remembered is bounded by the live arrays, not by how many were given up
    for _ in range(1000):
        norms.given_up_norm(np.ones(4, dtype=np.float32))
    assert len(norms._remembered.norms) <= before


def test_a_makers_measurement_is_taken_by_one_give_up(monkeypatch: pytest.MonkeyPatch) -> None:
    """The batched pass measures an update as it makes it (measured_for_sender); the client's
    own check of it takes that norm once. Any other give-up reads the array: a sender that
    gives up one array twice (a buffer reused and written through a tensor made before, as
    an attacker's review tried) is measured afresh and its spoiled value refused."""
    import torch

    values = np.random.default_rng(1).standard_normal(333).astype(np.float32)
    reads = count_norm_reads(monkeypatch)
    norm = norms.measured_for_sender(values)
    assert not values.flags.writeable and reads[0] == 1
    assert norms.given_up_norm(values) == norm and reads[0] == 1
    assert norms.known_norm(values) == norm
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # torch: the array is not writable
        alias = torch.from_numpy(values)
    alias[5] = float("nan")  # numpy's flag does not stop a tensor made before
    assert not math.isfinite(norms.given_up_norm(values)) and reads[0] == 2
    with pytest.raises(CodecError, match="non-finite"):
        codec.seal(_update(values))
    plain = np.ones(9, dtype=np.float32)
    norms.given_up_norm(plain)
    norms.given_up_norm(plain)
    assert reads[0] == 4  # a sender's own give-up is read every time


def test_a_view_is_not_remembered() -> None:
    base = np.ones(10, dtype=np.float32)
    view = base[:8]
    assert norms.given_up_norm(view) == math.sqrt(8)
    assert norms.known_norm(view) is None  # its base could still change it


@pytest.mark.parametrize("bad", [np.nan, np.inf])
def test_an_array_made_writeable_again_and_spoiled_is_measured_and_refused(bad: float) -> None:
    """A sender that breaks the contract (writeable again, then a value changed) does not get
    the remembered norm: the codec reads the vector and refuses what is not finite."""
    values = np.ones(100, dtype=np.float32)
    assert norms.given_up_norm(values) == 10.0
    values.flags.writeable = True
    values[37] = bad
    values.flags.writeable = False  # read-only again, but measured before the change...
    assert norms.known_norm(values) == 10.0  # ...which only the contract rules out
    values.flags.writeable = True
    assert norms.known_norm(values) is None
    with pytest.raises(CodecError, match="non-finite"):
        codec.seal(_update(values))
    with pytest.raises(CodecError, match="non-finite"):
        codec.encode(_update(values))
