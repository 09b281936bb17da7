"""DP feature normalisation: per-feature mean and standard deviation released once.

Each record contributes ``r_i = clip((x_i, x_i * x_i), B)``: its features and their squares
(flattened, concatenated), clipped *jointly* to L2 norm ``B`` (``bound``). The release is the
Gaussian mechanism on the sums (Dong, Roth & Su, Thm 2.7: noise std = sensitivity x sigma
gives ``G_{1/sigma}``), recorded as one :class:`GaussianStep` with ``q = 1`` under the
client's own neighbouring relation:

* ``"poisson"`` (add/remove): the record count is private too, so the released vector is
  ``sum_i (r_i, B)`` (count scaled by ``B``); one record moves it by at most ``sqrt(2) B``,
  and every coordinate gets ``N(0, (sqrt(2) B sigma)^2)``;
* ``"fixed"`` (replace-one): ``N`` is the same for neighbours and public; the sum moves by at
  most ``2B`` and gets ``N(0, (2 B sigma)^2)``.

mean = S1 / n and var = S2 / n - mean^2 (floored at ``min_std^2``): post-processing.

:func:`exact_moments` is the same standardisation without noise, for data that needs no
privacy (the server's own held-out set, standardised like the clients' records).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from fedsim.errors import ConfigError
from fedsim.privacy.events import GaussianStep, Sampling
from fedsim.training.dpsgd import check_sampling
from fedsim.training.gaussian import gaussian_noise


@dataclass(frozen=True)
class FeatureMoments:
    """Per-feature mean and std (shape of one record); :meth:`apply` standardises."""

    mean: torch.Tensor
    std: torch.Tensor

    def apply(self, features: torch.Tensor) -> torch.Tensor:
        return (features - self.mean) / self.std


def dp_feature_moments(
    features: torch.Tensor,
    *,
    sampling: Sampling,
    noise_multiplier: float,
    bound: float,
    generator: torch.Generator,
    min_std: float = 1e-3,
) -> tuple[FeatureMoments, GaussianStep]:
    """Release DP per-feature moments of ``features`` (N, ...) and the step it costs."""
    check_sampling(sampling)
    if not (math.isfinite(bound) and bound > 0):
        raise ConfigError(f"bound must be finite and > 0, got {bound!r}")
    if not (math.isfinite(noise_multiplier) and noise_multiplier > 0):
        raise ConfigError(f"noise_multiplier must be finite and > 0, got {noise_multiplier!r}")
    if len(features) == 0:
        raise ConfigError("cannot release moments of an empty data set")
    x = features.reshape(len(features), -1).to(torch.float64)
    dims = x.shape[1]
    rows = torch.cat([x, x * x], 1)
    norms = rows.norm(dim=1, keepdim=True)
    rows = rows * (bound / norms.clamp_min(bound))  # joint clipping to norm <= bound
    totals = rows.sum(0)
    if sampling == "poisson":
        released = torch.cat([totals, torch.tensor([bound * len(x)], dtype=torch.float64)])
        released = released + gaussian_noise(
            len(released), math.sqrt(2) * bound * noise_multiplier, generator, released
        )
        count = max(float(released[-1]) / bound, 1.0)
        sums = released[:-1]
    else:
        sums = totals + gaussian_noise(len(totals), 2 * bound * noise_multiplier, generator, totals)
        count = float(len(x))
    mean = sums[:dims] / count
    var = (sums[dims:] / count - mean * mean).clamp_min(min_std**2)
    shape = features.shape[1:]
    moments = FeatureMoments(
        mean.reshape(shape).to(features.dtype), var.sqrt().reshape(shape).to(features.dtype)
    )
    return moments, GaussianStep(sampling, 1.0, noise_multiplier)


def exact_moments(features: torch.Tensor, *, min_std: float = 1e-3) -> FeatureMoments:
    """Per-feature mean and std of ``features`` (N, ...), the std floored at ``min_std``: no
    noise, for data that is not private (a server's held-out set)."""
    if len(features) == 0:
        raise ConfigError("cannot compute moments of an empty data set")
    x = features.to(torch.float64)
    mean = x.mean(0)
    std = (x * x).mean(0).sub(mean * mean).clamp_min(min_std**2).sqrt()
    return FeatureMoments(mean.to(features.dtype), std.to(features.dtype))
