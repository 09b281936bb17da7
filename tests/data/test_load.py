"""Synthetic data, partitions, a scenario's groups (named data sets: test_datasets.py)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from fedsim.config import load_scenario
from fedsim.data import load_dataset, partition, split_groups
from fedsim.errors import ConfigError


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


def test_split_groups_cuts_shares_then_partitions_each_group() -> None:
    """The shipped quickstart's groups (0.3, 0.4, 0.3 of the records; 4, 4, 2 clients; the
    phones ``unequal``): disjoint clients, each group its share, seeded by name."""
    groups = load_scenario("scenarios/quickstart.yaml").scenario.clients.groups
    labels = np.repeat(np.arange(10), 200)

    def rng(name: str) -> np.random.Generator:
        return np.random.default_rng(sum(map(ord, name)))

    split = split_groups(labels, groups, rng)
    assert [len(parts) for parts in split] == [4, 4, 2]
    assert [sum(len(p) for p in parts) for parts in split] == [600, 800, 600]
    every = np.concatenate([p for parts in split for p in parts])
    assert len(np.unique(every)) == len(every) == 2000
    again = split_groups(labels, groups, rng)
    assert all(np.array_equal(p, q) for a, b in zip(split, again, strict=True)
               for p, q in zip(a, b, strict=True))
    with pytest.raises(ConfigError, match=r"clients.groups\[0\]: data_share 0.3 gives 3 records"):
        split_groups(labels[:10], groups, rng)


def test_split_groups_keeps_each_writer_in_one_group() -> None:
    groups = load_scenario("scenarios/quickstart.yaml").scenario.clients.groups
    labels = np.repeat(np.arange(10), 200)
    writers = np.repeat(np.arange(100), 20)
    split = split_groups(labels, groups, lambda name: np.random.default_rng(len(name)), writers)
    owner: dict[int, int] = {}
    for g, parts in enumerate(split):
        for w in np.unique(writers[np.concatenate(parts)]):
            assert owner.setdefault(int(w), g) == g
    assert len(owner) == 100  # 0.3, 0.4, 0.3 of 100 writers of 20 records: all placed
