"""Privacy events: immutable descriptions of what a client released.

fedsim's unit of release is the *subsampled Gaussian step* (one DP-SGD round, one noised
quantile estimate, one DP normalisation release). Its ``sigma`` is the noise multiplier: the
Gaussian's standard deviation divided by the sensitivity of the released sum under the step's
neighbouring relation. The sampling scheme fixes that relation (docs/DESIGN.md; van Dijk &
Nguyen):

* ``"poisson"``: every record is included independently with probability ``q``; neighbouring
  data sets differ by adding or removing one record (add/remove); the sum's sensitivity is the
  clipping norm ``C`` and DP-SGD adds ``N(0, (C sigma)^2 I)``.
* ``"fixed"``: a batch of exactly ``m`` records drawn without replacement from ``N``
  (``q = m/N``); neighbouring data sets differ by replacing one record (replace-one); the
  sensitivity is ``2C`` and DP-SGD adds ``N(0, (2 C sigma)^2 I)``. The exact f-DP of T such
  steps is ``C_q(G_{1/sigma})^{(x)T}`` (Dong, Roth & Su, Thm 5.1).

The two schemes measure different quantities; no accountant may compare or mix their numbers
without saying so. ``q == 1`` is an unsampled Gaussian release under the same relation.

A history is a sequence of steps; ``count`` lets a step stand for ``count`` identical releases
(self-composition), which is how accountants stay fast on long runs.

There is deliberately no mapping onto ``dp_accounting``'s event classes: for a replace-one
Gaussian its PLD accountant assumes sensitivity 2 and its RDP accountant sensitivity 1
(measured with dp-accounting 0.6.0: eps 4.38 vs 2.17 for the same event at sigma 2), so a
mapped event would silently mean different mechanisms. fedsim's accountants build their
privacy-loss distributions and RDP curves from these steps directly.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Literal

from fedsim.errors import ConfigError

Sampling = Literal["poisson", "fixed"]
SAMPLING_SCHEMES: tuple[Sampling, ...] = ("poisson", "fixed")
NEIGHBOURING_RELATION: dict[Sampling, str] = {"poisson": "add/remove", "fixed": "replace-one"}


def sensitivity(sampling: Sampling, clip: float) -> float:
    """L2 sensitivity of a sum of per-record vectors each clipped to norm ``clip``.

    Under ``"poisson"`` (add/remove neighbours) one record's presence moves the sum by at most
    ``C``; under ``"fixed"`` (replace-one neighbours) one record is swapped for another, moving
    the sum by at most ``2C`` (Dong, Roth & Su 2022, sec. 5 and Alg. 1; van Dijk & Nguyen, sec.
    "probabilistic mini-batch"). A step's noise std is ``sensitivity * sigma``. The one
    definition: DP-SGD's noise and the server's honest-update bound both call it.
    """
    if sampling not in SAMPLING_SCHEMES:
        raise ConfigError(f"sampling must be one of {SAMPLING_SCHEMES}, got {sampling!r}")
    return clip if sampling == "poisson" else 2.0 * clip


@dataclass(frozen=True, slots=True)
class GaussianStep:
    """``count`` identical subsampled Gaussian releases.

    Attributes:
        sampling: ``"poisson"`` (add/remove neighbours) or ``"fixed"`` (replace-one).
        q: sampling probability (Poisson) or batch fraction m/N (fixed size), in (0, 1].
        sigma: noise multiplier, noise std / sensitivity, > 0.
        count: number of identical releases, >= 1.
    """

    sampling: Sampling
    q: float
    sigma: float
    count: int = 1

    def __post_init__(self) -> None:
        if self.sampling not in SAMPLING_SCHEMES:
            raise ConfigError(f"sampling must be one of {SAMPLING_SCHEMES}, got {self.sampling!r}")
        if isinstance(self.q, bool) or not (isinstance(self.q, int | float)
                                            and math.isfinite(self.q) and 0.0 < self.q <= 1.0):
            raise ConfigError(f"q must be in (0, 1], got {self.q!r}")
        if isinstance(self.sigma, bool) or not (isinstance(self.sigma, int | float)
                                                and math.isfinite(self.sigma) and self.sigma > 0):
            raise ConfigError(f"sigma must be a finite number > 0, got {self.sigma!r}")
        if isinstance(self.count, bool) or not isinstance(self.count, int) or self.count < 1:
            raise ConfigError(f"count must be an integer >= 1, got {self.count!r}")
        object.__setattr__(self, "q", float(self.q))
        object.__setattr__(self, "sigma", float(self.sigma))

    @property
    def key(self) -> tuple[Sampling, float, float]:
        """What makes two steps identical (everything but ``count``)."""
        return (self.sampling, self.q, self.sigma)

    def times(self, count: int) -> GaussianStep:
        return GaussianStep(self.sampling, self.q, self.sigma, count)

    def to_json(self) -> dict[str, Any]:
        return {"sampling": self.sampling, "q": self.q, "sigma": self.sigma, "count": self.count}

    @classmethod
    def from_json(cls, obj: Mapping[str, Any]) -> GaussianStep:
        if not isinstance(obj, Mapping):
            raise ConfigError(f"a step must be an object, got {type(obj).__name__}")
        unknown = set(obj) - {"sampling", "q", "sigma", "count"}
        if unknown:
            raise ConfigError(f"unknown keys in step: {sorted(unknown)}")
        missing = {"sampling", "q", "sigma"} - set(obj)
        if missing:
            raise ConfigError(f"step is missing {sorted(missing)}")
        return cls(obj["sampling"], obj["q"], obj["sigma"], obj.get("count", 1))


def group_steps(steps: Iterable[GaussianStep]) -> tuple[GaussianStep, ...]:
    """Merge identical steps (same sampling, q, sigma) into one step with summed count.

    Composition is commutative, so the result describes the same mechanism; it is sorted so
    that equal multisets give equal tuples.
    """
    if isinstance(steps, tuple | list) and len(steps) == 1:
        return (steps[0],)  # the common case (one step per round): nothing to merge
    counts: Counter[tuple[Sampling, float, float]] = Counter()
    for step in steps:
        counts[step.key] += step.count
    return tuple(GaussianStep(s, q, sig, n) for (s, q, sig), n in sorted(counts.items()))
