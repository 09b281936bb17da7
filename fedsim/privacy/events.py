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
from typing import Any, Literal, TypeVar

from fedsim.errors import ConfigError

_T = TypeVar("_T")

Sampling = Literal["poisson", "fixed"]
SAMPLING_SCHEMES: tuple[Sampling, ...] = ("poisson", "fixed")
NEIGHBOURING_RELATION: dict[Sampling, str] = {"poisson": "add/remove", "fixed": "replace-one"}


def by_relation(items: Iterable[tuple[object, _T]]) -> dict[str, list[_T]]:
    """``items`` of ``(sampling, value)`` grouped by the neighbouring relation of their
    sampling (an unknown one as "unknown"), in the relations' order: the one grouping of
    every figure that must not pool add/remove with replace-one guarantees."""
    groups: dict[str, list[_T]] = {}
    for sampling, value in items:
        relation = NEIGHBOURING_RELATION.get(sampling, "unknown")  # type: ignore[call-overload]
        groups.setdefault(relation, []).append(value)
    return dict(sorted(groups.items()))


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


TrialDistributionKind = Literal["negative_binomial", "poisson"]
TRIAL_DISTRIBUTIONS: dict[TrialDistributionKind, tuple[str, ...]] = {
    "negative_binomial": ("eta", "gamma"), "poisson": ("mu",)}
"""Each distribution of the number of trials and the names of its parameters."""


@dataclass(frozen=True, slots=True)
class TunedSelection:
    """Private hyperparameter tuning as one release: K random trials, each a run of a candidate
    drawn uniformly from a public list, and only the best trial released (Papernot & Steinke,
    ICLR 2022; the bound is :func:`fedsim.privacy.rdp.selection_rdp`).

    Attributes:
        distribution: how K is drawn: ``"negative_binomial"`` (truncated, parameters eta and
            gamma: their Thm 2) or ``"poisson"`` (parameter mu: their Thm 6).
        parameters: the distribution's parameters, in :data:`TRIAL_DISTRIBUTIONS` order.
        candidates: per candidate, every step ONE trial of it may release for this client,
            bounded before the run (a candidate under which the client takes no part: ``()``).
            The event covers all K trials: they are not to be composed beside it.

    Neighbouring relation: the steps' (one sampling scheme for all candidates).
    """

    distribution: TrialDistributionKind
    parameters: tuple[float, ...]
    candidates: tuple[tuple[GaussianStep, ...], ...]

    def __post_init__(self) -> None:
        names = TRIAL_DISTRIBUTIONS.get(self.distribution)
        if names is None:
            raise ConfigError(f"distribution must be one of {sorted(TRIAL_DISTRIBUTIONS)}, "
                              f"got {self.distribution!r}")
        parameters = tuple(self.parameters)
        if len(parameters) != len(names) or not all(
                isinstance(p, int | float) and not isinstance(p, bool) and math.isfinite(p)
                for p in parameters):
            raise ConfigError(f"a {self.distribution} selection takes finite {names}, "
                              f"got {self.parameters!r}")
        candidates = tuple(group_steps(c) if c else () for c in self.candidates)
        if not candidates:
            raise ConfigError("a tuned selection needs at least one candidate")
        for candidate in candidates:
            for step in candidate:
                if not isinstance(step, GaussianStep):
                    raise ConfigError(f"a candidate's steps must be GaussianStep, got "
                                      f"{type(step).__name__}")
        if len({s.sampling for c in candidates for s in c}) > 1:
            raise ConfigError("a tuned selection's candidates must share one sampling scheme "
                              "(one neighbouring relation)")
        object.__setattr__(self, "parameters", tuple(float(p) for p in parameters))
        object.__setattr__(self, "candidates", candidates)

    @property
    def sampling(self) -> Sampling | None:
        """The candidates' sampling scheme (None if no candidate releases anything)."""
        return next((s.sampling for c in self.candidates for s in c), None)

    @property
    def named_parameters(self) -> dict[str, float]:
        return dict(zip(TRIAL_DISTRIBUTIONS[self.distribution], self.parameters, strict=True))

    def to_json(self) -> dict[str, Any]:
        return {"distribution": self.distribution, "parameters": self.named_parameters,
                "candidates": [[s.to_json() for s in c] for c in self.candidates]}

    @classmethod
    def from_json(cls, obj: Mapping[str, Any]) -> TunedSelection:
        if not isinstance(obj, Mapping) or set(obj) != {"distribution", "parameters",
                                                        "candidates"}:
            raise ConfigError("a tuned selection is {distribution, parameters, candidates}")
        names = TRIAL_DISTRIBUTIONS.get(obj["distribution"])
        parameters = obj["parameters"]
        if names is None or not isinstance(parameters, Mapping) or set(parameters) != set(names):
            raise ConfigError(f"bad distribution or parameters: {obj['distribution']!r}, "
                              f"{parameters!r}")
        candidates = obj["candidates"]
        if not isinstance(candidates, list) or not all(isinstance(c, list) for c in candidates):
            raise ConfigError("candidates must be a list of lists of steps")
        return cls(obj["distribution"], tuple(parameters[n] for n in names),
                   tuple(tuple(GaussianStep.from_json(s) for s in c) for c in candidates))


PrivacyEvent = GaussianStep | TunedSelection
"""What a ledger records: a (subsampled) Gaussian release, or a tuned selection."""
