"""DP principal components (Analyze Gauss): the release's sensitivity against a brute-force
search, its noise against that sensitivity, and its projection's quality against non-private
PCA computed independently with numpy's SVD."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from fedsim.errors import ConfigError
from fedsim.training.dp_pca import (
    Projection,
    dp_second_moment,
    pca_sensitivity,
    second_moment,
    top_components,
)


def _upper(matrix: np.ndarray) -> np.ndarray:
    return matrix[np.triu_indices(len(matrix))]


def _clipped(rng: np.random.Generator, clip: float, dims: int) -> np.ndarray:
    """A random vector of norm at most ``clip`` (often exactly ``clip``)."""
    x = rng.standard_normal(dims) * rng.exponential()
    return x * min(1.0, clip / np.linalg.norm(x))


def test_the_sensitivity_bounds_every_neighbour_and_is_attained() -> None:
    """The released upper triangle moves by at most pca_sensitivity: over 5000 random records
    (add/remove: x x^T) and pairs (replace-one: x x^T - y y^T), never more; attained by
    x = c e_1 (add/remove) and orthogonal x = c e_1, y = c e_2 (replace-one), so the stated
    sensitivities are the smallest valid ones."""
    clip, dims = 3.0, 5
    rng = np.random.default_rng(0)
    add, replace = 0.0, 0.0
    for _ in range(5000):
        x, y = _clipped(rng, clip, dims), _clipped(rng, clip, dims)
        add = max(add, float(np.linalg.norm(_upper(np.outer(x, x)))))
        replace = max(replace, float(np.linalg.norm(_upper(np.outer(x, x) - np.outer(y, y)))))
    assert add <= pca_sensitivity("poisson", clip) * (1 + 1e-12)
    assert replace <= pca_sensitivity("fixed", clip) * (1 + 1e-12)
    e1, e2 = np.eye(dims)[0] * clip, np.eye(dims)[1] * clip
    assert np.linalg.norm(_upper(np.outer(e1, e1))) == pytest.approx(
        pca_sensitivity("poisson", clip), rel=1e-12)
    assert np.linalg.norm(_upper(np.outer(e1, e1) - np.outer(e2, e2))) == pytest.approx(
        pca_sensitivity("fixed", clip), rel=1e-12)
    assert pca_sensitivity("fixed", clip) == pytest.approx(math.sqrt(2) * clip**2)


@pytest.mark.parametrize("sampling", ["poisson", "fixed"])
def test_the_noise_is_symmetric_with_the_sensitivity_times_sigma(sampling: str) -> None:
    """All-zero records: the release is pure noise, exactly symmetric, its upper triangle's
    entries with std sensitivity x sigma (within 4% over 300 draws of 21 entries); the step
    is the unsampled release at sigma under the client's relation."""
    features = torch.zeros(40, 6, dtype=torch.float64)
    clip, sigma = 2.0, 1.5
    values = []
    for seed in range(300):
        released, step = dp_second_moment(features, sampling=sampling, noise_multiplier=sigma,
                                          clip=clip, generator=torch.Generator().manual_seed(seed))
        assert torch.equal(released, released.T)
        values.append(_upper(released.numpy()))
    assert (step.sampling, step.q, step.sigma, step.count) == (sampling, 1.0, sigma, 1)
    expected = (clip**2 if sampling == "poisson" else math.sqrt(2) * clip**2) * sigma
    assert np.std(np.concatenate(values)) == pytest.approx(expected, rel=0.04)


def _data(seed: int, n: int = 1000, dims: int = 30, rank: int = 4) -> np.ndarray:
    """Records near a rank-4 subspace with a decaying spectrum, plus isotropic noise."""
    rng = np.random.default_rng(seed)
    basis = np.linalg.qr(rng.standard_normal((dims, rank)))[0]
    scales = np.array([3.0, 2.0, 1.5, 1.0])
    return (rng.standard_normal((n, rank)) * scales) @ basis.T + 0.3 * rng.standard_normal((n, dims))


def _exact_top(x: np.ndarray, k: int) -> np.ndarray:
    """Non-private PCA, independently: the top-k right singular vectors of the data matrix."""
    return np.linalg.svd(x, full_matrices=False)[2][:k].T


def _captured(x: np.ndarray, basis: np.ndarray, k: int) -> float:
    """The energy ``|X V|_F^2`` the basis captures, over the exact top-k subspace's."""
    return float(np.linalg.norm(x @ basis) ** 2 / np.linalg.norm(x @ _exact_top(x, k)) ** 2)


def test_the_no_noise_limit_is_exact_pca() -> None:
    """sigma -> 0 with no record clipped: the projection spans the exact top-4 subspace (all
    principal angles below 1e-6 rad) and captures all of its energy."""
    x = _data(1)
    clip = float(np.linalg.norm(x, axis=1).max()) * 1.01
    released, _ = dp_second_moment(torch.from_numpy(x), sampling="poisson",
                                   noise_multiplier=1e-12, clip=clip,
                                   generator=torch.Generator().manual_seed(0))
    basis = top_components(released, 4).basis.numpy()
    cosines = np.linalg.svd(basis.T @ _exact_top(x, 4), compute_uv=False)
    assert np.arccos(np.clip(cosines.min(), -1, 1)) < 1e-6
    assert _captured(x, basis, 4) == pytest.approx(1.0, abs=1e-12)
    assert np.allclose(basis.T @ basis, np.eye(4), atol=1e-12)


def test_the_projection_improves_as_the_noise_falls() -> None:
    """Captured energy over exact PCA's (10 clients' releases summed, as a run does; averaged
    over 3 seeds): strictly rising as sigma falls through 16, 4, 1, 0.25, above 0.99 at 0.25
    and below 0.9 at 16 (the noise matters at all)."""
    k, clip = 4, 4.0
    ratios = []
    for sigma in (16.0, 4.0, 1.0, 0.25):
        values = []
        for seed in range(3):
            x = _data(10 + seed)
            parts = np.array_split(x, 10)
            total = sum(dp_second_moment(torch.from_numpy(p), sampling="fixed",
                                         noise_multiplier=sigma, clip=clip,
                                         generator=torch.Generator().manual_seed(100 * seed + i))[0]
                        for i, p in enumerate(parts))
            assert isinstance(total, torch.Tensor)
            values.append(_captured(x, top_components(total, k).basis.numpy(), k))
        ratios.append(float(np.mean(values)))
    assert all(a < b for a, b in zip(ratios, ratios[1:], strict=False)), ratios
    assert ratios[-1] > 0.99 and ratios[0] < 0.9


def test_second_moment_clips_each_record() -> None:
    """Records are clipped to the norm before their outer products are summed."""
    x = torch.tensor([[3.0, 4.0], [0.3, 0.4]], dtype=torch.float64)  # norms 5 and 0.5
    expected = np.outer([0.6, 0.8], [0.6, 0.8]) + np.outer([0.3, 0.4], [0.3, 0.4])
    assert np.allclose(second_moment(x, 1.0).numpy(), expected, atol=1e-15)


def test_bad_inputs_are_refused() -> None:
    """A clip or sigma that is not a positive number, an empty data set, more components than
    features, a non-finite matrix, a projection of the wrong width: ConfigErrors."""
    x = torch.ones(4, 3)
    generator = torch.Generator().manual_seed(0)
    with pytest.raises(ConfigError, match="clip"):
        dp_second_moment(x, sampling="poisson", noise_multiplier=1.0, clip=0.0, generator=generator)
    with pytest.raises(ConfigError, match="noise_multiplier"):
        dp_second_moment(x, sampling="fixed", noise_multiplier=math.nan, clip=1.0,
                         generator=generator)
    with pytest.raises(ConfigError, match="empty"):
        dp_second_moment(x[:0], sampling="poisson", noise_multiplier=1.0, clip=1.0,
                         generator=generator)
    with pytest.raises(ConfigError, match="components"):
        top_components(torch.eye(3), 4)
    with pytest.raises(ConfigError, match="non-finite"):
        top_components(torch.full((3, 3), math.inf), 1)
    with pytest.raises(ConfigError, match="cannot apply"):
        Projection(torch.eye(4)[:, :2]).apply(x)
    assert Projection(torch.eye(3, dtype=torch.float64)[:, :2]).apply(x).shape == (4, 2)
