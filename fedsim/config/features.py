"""A client group's ``dp_pca`` section: DP principal components before the first round
(:mod:`fedsim.training.dp_pca` has the math, :mod:`fedsim.runtime.dp_pca` the run).

A separate module of :mod:`fedsim.config.schema` (which imports it into ``ClientGroup``).
"""

from __future__ import annotations

from pydantic import Field

from fedsim.config import limits
from fedsim.config.distributions import Delta, Epsilon, PositiveInt, Scale, Strict

__all__ = ["DpPca", "PcaTarget", "too_many_components"]


class PcaTarget(Strict):
    """Calibrate the release's noise at start: the smallest sigma whose one release alone is
    (epsilon, delta)-DP under the group's accountant."""

    epsilon: Epsilon = Field(description="The epsilon the release alone must meet.")
    delta: Delta = Field(description="The delta at which epsilon is met.")


class DpPca(Strict):
    """DP principal components ("Analyze Gauss", Dwork, Talwar, Thakurta & Zhang 2014): before
    its first round each client releases the sum of its records' outer products ``x x^T``
    (each record's features clipped to L2 norm ``clip``) plus symmetric Gaussian noise, one
    unsampled Gaussian event (q = 1) on its ledger composed with its DP-SGD steps; sensitivity
    ``clip^2`` under Poisson sampling (add/remove), ``sqrt(2) clip^2`` under fixed-size batches
    (replace-one). The clients' released matrices are summed (post-processing) and the top
    ``components`` eigenvectors are one shared projection: every client trains, and the server
    evaluates, on the projected features (the model's input size is ``components``)."""

    components: PositiveInt = Field(
        le=limits.MAX_FEATURES, description="k: the number of principal components kept (the "
        "model's input size).")
    clip: Scale = Field(description="c: the L2 norm each record's feature vector is clipped "
                                    "to in the release.")
    noise: Scale | PcaTarget = Field(
        description="The release's noise multiplier sigma (noise std / sensitivity), or "
        "{epsilon, delta}: the smallest sigma whose release alone meets them.")


def too_many_components(components: int, features: int, where: str = "") -> str | None:
    """Why ``components`` principal components cannot be taken of records with ``features``
    features (None: they can). The one rule of the schema (where a synthetic data set's
    features are known before any data: ``fedsim validate``) and of the population (any data,
    when loaded, before a release is charged); ``where``: what says ``features``."""
    if components <= features:
        return None
    return (f"dp_pca.components: {components} components of records with {features} "
            f"features{where}; at most {features}")
