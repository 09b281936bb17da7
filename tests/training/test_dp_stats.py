"""DP feature moments: accurate, and noised at the stated scale."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from fedsim.training.dp_stats import dp_feature_moments


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
