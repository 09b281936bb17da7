"""DP principal components: "Analyze Gauss" (Dwork, Talwar, Thakurta & Zhang, "Analyze Gauss:
Optimal Bounds for Privacy-Preserving Principal Component Analysis", STOC 2014, Algorithm 1).

Each record's flattened feature vector is clipped to L2 norm ``c`` (``clip``); the released
matrix is the sum of the records' outer products ``A = sum_i x_i x_i^T`` plus a symmetric
Gaussian ``E`` whose upper triangle (the diagonal included) is iid ``N(0, (s sigma)^2)`` and
whose lower triangle mirrors it. The release is the Gaussian mechanism on the upper triangle
of ``A`` (Dong, Roth & Su, Thm 2.7: noise std = sensitivity x sigma gives ``G_{1/sigma}``),
recorded as one :class:`GaussianStep` with ``q = 1`` under the client's own neighbouring
relation (docs/DESIGN.md: the sampling scheme fixes it). The sensitivity ``s``
(:func:`pca_sensitivity`), with ``|x|, |y| <= c``:

* ``"poisson"`` (add/remove one record): ``A`` moves by ``x x^T``, whose Frobenius norm is
  ``|x|^2 <= c^2``; the upper triangle's L2 norm is at most the Frobenius norm, so
  ``s = c^2`` (Dwork et al.'s setting, with ``c = 1``).
* ``"fixed"`` (replace one record, the count public): ``A`` moves by ``D = x x^T - y y^T`` and
  ``|D|_F^2 = tr(D^2) = |x|^4 + |y|^4 - 2 (x.y)^2 <= 2 c^4``, so ``s = sqrt(2) c^2``; it is
  attained on the upper triangle by orthogonal ``x``, ``y`` of norm ``c`` (two diagonal
  entries ``+-c^2``), so the bound is tight. (The triangle inequality would give ``2 c^2``;
  the outer products' structure halves the variance.)

The count is not released: the top-``k`` eigenvectors of ``A + E`` (the projection,
:func:`top_components`) do not depend on the matrix's scale, and everything computed from the
noisy matrix is post-processing. Several clients' released matrices may be summed (each one is
its own client's DP release) before the eigenvectors are taken.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from fedsim.errors import ConfigError
from fedsim.privacy.events import GaussianStep, Sampling
from fedsim.training.dpsgd import check_sampling
from fedsim.training.gaussian import gaussian_noise

__all__ = ["Projection", "dp_second_moment", "pca_sensitivity", "second_moment",
           "top_components"]


def pca_sensitivity(sampling: Sampling, clip: float) -> float:
    """The L2 sensitivity of the upper triangle of ``sum_i x_i x_i^T`` with every ``|x_i| <=
    clip``: ``clip^2`` under add/remove (``"poisson"``), ``sqrt(2) clip^2`` under replace-one
    (``"fixed"``) (module docstring)."""
    check_sampling(sampling)
    if not (math.isfinite(clip) and clip > 0):
        raise ConfigError(f"clip must be finite and > 0, got {clip!r}")
    return clip * clip * (1.0 if sampling == "poisson" else math.sqrt(2.0))


def second_moment(features: torch.Tensor, clip: float | None = None) -> torch.Tensor:
    """``sum_i x_i x_i^T`` (float64) of the flattened records of ``features`` (N, ...), each
    clipped to L2 norm ``clip`` first when given."""
    x = features.reshape(len(features), -1).to(torch.float64)
    if clip is not None:
        x = x * (clip / x.norm(dim=1, keepdim=True).clamp_min(clip))
    return x.T @ x


def dp_second_moment(
    features: torch.Tensor,
    *,
    sampling: Sampling,
    noise_multiplier: float,
    clip: float,
    generator: torch.Generator,
) -> tuple[torch.Tensor, GaussianStep]:
    """Release ``sum_i clip(x_i) clip(x_i)^T + E`` (d x d, float64, symmetric) of the records
    of ``features`` (N, ...) and the step it costs: ``E``'s upper triangle iid ``N(0,
    (pca_sensitivity(sampling, clip) noise_multiplier)^2)``, mirrored (Analyze Gauss)."""
    sensitivity = pca_sensitivity(sampling, clip)
    if not (math.isfinite(noise_multiplier) and noise_multiplier > 0):
        raise ConfigError(f"noise_multiplier must be finite and > 0, got {noise_multiplier!r}")
    if len(features) == 0:
        raise ConfigError("cannot release the second moment of an empty data set")
    matrix = second_moment(features, clip)
    dims = matrix.shape[0]
    rows, cols = torch.triu_indices(dims, dims)
    noise = gaussian_noise(len(rows), sensitivity * noise_multiplier, generator, matrix)
    upper = torch.zeros_like(matrix)
    upper[rows, cols] = noise
    symmetric = upper + upper.triu(1).T
    return matrix + symmetric, GaussianStep(sampling, 1.0, noise_multiplier)


@dataclass(frozen=True)
class Projection:
    """A (d, k) matrix with orthonormal columns; :meth:`apply` maps records (N, ...) with
    ``d`` values each to their ``k`` coordinates (N, k)."""

    basis: torch.Tensor

    def apply(self, features: torch.Tensor) -> torch.Tensor:
        flat = features.reshape(len(features), -1)
        if flat.shape[1] != self.basis.shape[0]:
            raise ConfigError(f"a projection of {self.basis.shape[0]} features cannot apply to "
                              f"records of {flat.shape[1]}")
        return flat @ self.basis.to(flat.dtype)


def top_components(matrix: torch.Tensor, components: int) -> Projection:
    """The eigenvectors of the ``components`` largest eigenvalues of the symmetric ``matrix``
    (d x d), each signed so that its largest-magnitude entry is positive (a deterministic
    choice among ``+-v``)."""
    dims = matrix.shape[0]
    if matrix.shape != (dims, dims) or not 1 <= components <= dims:
        raise ConfigError(f"cannot take {components} components of a matrix of shape "
                          f"{tuple(matrix.shape)}")
    if not bool(torch.isfinite(matrix).all()):
        raise ConfigError("the matrix to decompose has non-finite entries")
    values, vectors = torch.linalg.eigh(matrix.to(torch.float64))  # ascending eigenvalues
    basis = vectors[:, values.argsort(descending=True)[:components]]
    peaks = basis.abs().argmax(dim=0)
    signs = torch.sign(basis[peaks, torch.arange(components)])
    return Projection(basis * torch.where(signs == 0, 1.0, signs))
