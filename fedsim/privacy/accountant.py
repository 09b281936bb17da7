"""The narrow interface every accountant implements (after Opacus / dp_accounting).

An accountant is a pure function of the multiset of steps composed into it (composition is
commutative), plus its numerical settings. ``compose`` checks first (``check``) and changes
nothing when it raises; ``preview`` answers "what if" without touching the accountant, which is
how ledgers do their dry run before a release.

All steps of one accountant share one sampling scheme and hence one neighbouring relation
(see :mod:`fedsim.privacy.events`); mixing schemes raises :class:`UnsupportedEventError`.

Concrete accountants register themselves in :data:`ACCOUNTANTS` by ``name``:
``"pld"`` (default, a guarantee), ``"rdp"`` (a guarantee) and ``"gdp-clt"`` (an
approximation: ``is_guarantee = False``; it never enforces a budget on its own).
"""

from __future__ import annotations

import copy
import importlib
from abc import ABC, abstractmethod
from collections.abc import Iterable
from typing import Any, ClassVar, Self

import numpy as np

from fedsim.errors import ConfigError, UnsupportedEventError
from fedsim.privacy.events import GaussianStep, Sampling, group_steps

ACCOUNTANTS: dict[str, type[Accountant]] = {}
DEFAULT_ACCOUNTANT = "pld"
# Modules that define accountants; imported on first lookup so that `import fedsim.privacy`
# stays cheap.
_ACCOUNTANT_MODULES = ("fedsim.privacy.pld", "fedsim.privacy.rdp", "fedsim.privacy.gdp")


class Accountant(ABC):
    """Composes :class:`GaussianStep` s and answers (eps, delta) and trade-off questions."""

    name: ClassVar[str]
    is_guarantee: ClassVar[bool] = True

    def __init__(self, steps: Iterable[GaussianStep] = ()) -> None:
        self._steps: tuple[GaussianStep, ...] = ()
        self.compose(steps)

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if "name" in cls.__dict__:
            ACCOUNTANTS[cls.name] = cls

    # -- state ---------------------------------------------------------------------------
    @property
    def steps(self) -> tuple[GaussianStep, ...]:
        """The composed history, identical steps merged (see :func:`group_steps`)."""
        return self._steps

    @property
    def sampling(self) -> Sampling | None:
        return self._steps[0].sampling if self._steps else None

    @property
    def total_steps(self) -> int:
        return sum(s.count for s in self._steps)

    def check(self, steps: Iterable[GaussianStep]) -> None:
        """Raise :class:`UnsupportedEventError` if ``steps`` cannot be composed. Never mutates."""
        schemes = {s.sampling for s in (*self._steps, *steps)}
        if len(schemes) > 1:
            raise UnsupportedEventError(
                "one accountant analyses one neighbouring relation; got both poisson "
                "(add/remove) and fixed (replace-one) steps"
            )

    def compose(self, steps: Iterable[GaussianStep]) -> None:
        steps = tuple(steps)
        self.check(steps)
        if not steps:
            return
        if len(steps) == 1:
            # The common case, one more step of a kind already recorded: bump that count
            # (what group_steps would give, without regrouping the whole history).
            step = steps[0]
            for i, held in enumerate(self._steps):
                if held.key == step.key:
                    merged = held.times(held.count + step.count)
                    self._steps = (*self._steps[:i], merged, *self._steps[i + 1:])
                    self._invalidate()
                    return
        self._steps = group_steps((*self._steps, *steps))
        self._invalidate()

    def preview(self, steps: Iterable[GaussianStep]) -> Self:
        """A copy with ``steps`` composed; ``self`` is left unchanged."""
        twin = copy.copy(self)
        twin._steps = self._steps
        twin._copy_caches_from(self)
        twin.compose(steps)
        return twin

    def _invalidate(self) -> None:  # noqa: B027 - optional hook
        """Drop caches that depend on the history. Subclasses with caches override."""

    def _copy_caches_from(self, other: Accountant) -> None:  # noqa: B027 - optional hook
        """Give a preview its own (copied) caches. Subclasses with mutable caches override."""

    # -- answers -------------------------------------------------------------------------
    @abstractmethod
    def epsilon(self, delta: float) -> float:
        """Smallest eps such that the history is (eps, delta)-DP (an upper bound for
        guarantees). 0.0 for an empty history."""

    @abstractmethod
    def delta(self, epsilon: float) -> float:
        """delta(eps) of the history (an upper bound for guarantees)."""

    @abstractmethod
    def tradeoff(self, alpha: np.ndarray) -> np.ndarray:
        """beta(alpha): the type II error lower bound at type I errors ``alpha`` in [0, 1]
        (a lower bound on the true trade-off curve for guarantees)."""

    # -- persistence ---------------------------------------------------------------------
    def settings(self) -> dict[str, Any]:
        """Numerical settings that ``__init__`` takes as keywords (for the JSON round trip)."""
        return {}

    def to_json(self) -> dict[str, Any]:
        return {
            "accountant": self.name,
            "settings": self.settings(),
            "steps": [s.to_json() for s in self._steps],
        }

    @classmethod
    def from_json(cls, obj: dict[str, Any]) -> Accountant:
        try:
            kind = make_accountant_class(obj["accountant"])
            steps = [GaussianStep.from_json(s) for s in obj["steps"]]
            return kind(steps, **obj.get("settings", {}))
        except (KeyError, TypeError) as exc:
            raise ConfigError(f"not an accountant state: {exc}") from exc


def make_accountant_class(name: str) -> type[Accountant]:
    if name not in ACCOUNTANTS:
        for module in _ACCOUNTANT_MODULES:
            try:
                importlib.import_module(module)
            except ModuleNotFoundError as exc:
                if exc.name != module:
                    raise
    try:
        return ACCOUNTANTS[name]
    except KeyError:
        raise ConfigError(
            f"unknown accountant {name!r}; choose one of {sorted(ACCOUNTANTS)}"
        ) from None


def make_accountant(name: str = DEFAULT_ACCOUNTANT, steps: Iterable[GaussianStep] = (),
                    **settings: Any) -> Accountant:
    """An accountant by registry name (``"pld"``, ``"rdp"``, ``"gdp-clt"``)."""
    return make_accountant_class(name)(steps, **settings)
