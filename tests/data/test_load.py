"""Synthetic data, partitions, DP moments (named data sets: test_datasets.py)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from fedsim.data.load import load_dataset, partition
from fedsim.errors import ConfigError
from fedsim.training.dp_stats import dp_feature_moments


def test_synthetic_data_is_seeded_and_learnable() -> None:
    a = load_dataset("synthetic", seed=3, num_train=200, num_test=50)
    b = load_dataset("synthetic", seed=3, num_train=200, num_test=50)
    assert all(torch.equal(u, v) for u, v in zip(a, b, strict=True))
    assert not torch.equal(a[0], load_dataset("synthetic", seed=4, num_train=200, num_test=50)[0])
    with pytest.raises(ConfigError, match="unknown dataset"):
        load_dataset("cifar100")


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
