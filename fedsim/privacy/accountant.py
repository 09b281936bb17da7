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
import math
from abc import ABC, abstractmethod
from collections.abc import Iterable
from typing import Any, ClassVar, Self

import numpy as np

from fedsim.config import limits
from fedsim.errors import AccountantOutOfRange, ConfigError, UnsupportedEventError
from fedsim.privacy.events import GaussianStep, PrivacyEvent, Sampling, TunedSelection

ACCOUNTANTS: dict[str, type[Accountant]] = {}
DEFAULT_ACCOUNTANT = "pld"
# Modules that define accountants; imported on first lookup so that `import fedsim.privacy`
# stays cheap.
_ACCOUNTANT_MODULES = ("fedsim.privacy.pld", "fedsim.privacy.rdp", "fedsim.privacy.gdp")


class Accountant(ABC):
    """Composes :class:`GaussianStep` s and answers (eps, delta) and trade-off questions."""

    name: ClassVar[str]
    is_guarantee: ClassVar[bool] = True
    holds_selections: ClassVar[bool] = False
    """Whether it can compose a :class:`TunedSelection` (whose bound is an RDP curve)."""

    def __init__(self, steps: Iterable[GaussianStep] = ()) -> None:
        # The history as counts per kind (insertion order); `steps` sorts it on demand.
        self._counts: dict[tuple[Sampling, float, float], int] = {}
        self._sorted: tuple[GaussianStep, ...] | None = ()
        self._total = 0
        self.compose(steps)

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if "name" in cls.__dict__:
            ACCOUNTANTS[cls.name] = cls

    # -- state ---------------------------------------------------------------------------
    @property
    def steps(self) -> tuple[GaussianStep, ...]:
        """The composed history, identical steps merged and sorted (see :func:`group_steps`)."""
        if self._sorted is None:
            self._sorted = tuple(GaussianStep(s, q, sigma, n)
                                 for (s, q, sigma), n in sorted(self._counts.items()))
        return self._sorted

    @property
    def selections(self) -> tuple[TunedSelection, ...]:
        """Tuned selections composed with the steps (only where :attr:`holds_selections`)."""
        return ()

    @property
    def kinds(self) -> int:
        """How many distinct kinds of step the history holds."""
        return len(self._counts)

    @property
    def sampling(self) -> Sampling | None:
        return next(iter(self._counts))[0] if self._counts else None

    @property
    def total_steps(self) -> int:
        return self._total

    def check(self, steps: Iterable[GaussianStep]) -> None:
        """Raise :class:`UnsupportedEventError` if ``steps`` cannot be composed. Never mutates."""
        held = self.sampling
        schemes = {s.sampling for s in steps} | ({held} if held is not None else set())
        if len(schemes) > 1:
            raise UnsupportedEventError(
                "one accountant analyses one neighbouring relation; got both poisson "
                "(add/remove) and fixed (replace-one) steps"
            )

    def compose(self, steps: Iterable[GaussianStep]) -> None:
        """Add ``steps`` to the history: O(1) per step (the history is kept as counts), plus
        whatever incremental state a subclass extends in :meth:`_extend`."""
        steps = tuple(steps)
        self.check(steps)
        if len(steps) > 1:  # one call per kind (a preview of a long plan repeats kinds)
            grouped: dict[tuple[Sampling, float, float], int] = {}
            for step in steps:
                grouped[step.key] = grouped.get(step.key, 0) + step.count
            steps = tuple(GaussianStep(s, q, sigma, n) for (s, q, sigma), n in grouped.items())
        for step in steps:
            key = step.key
            held = self._counts.get(key)
            self._counts[key] = step.count if held is None else held + step.count
            self._total += step.count
            self._sorted = None
            self._extend(step, new_kind=held is None)

    def preview(self, steps: Iterable[GaussianStep]) -> Self:
        """A copy with ``steps`` composed; ``self`` is left unchanged (the dry run of a
        ledger: nothing composed into the copy reaches ``self``)."""
        twin = copy.copy(self)
        twin._counts = dict(self._counts)
        twin._copy_caches_from(self)
        twin.compose(steps)
        return twin

    def _extend(self, step: GaussianStep, *, new_kind: bool) -> None:
        """Hook: ``step`` was just added to the counts. Subclasses with caches that depend on
        the history extend or drop them here; the default drops them."""
        del step, new_kind
        self._invalidate()

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

    def delta_curve(self, epsilons: np.ndarray) -> np.ndarray:
        """delta(eps) at many eps at once (the privacy profile; upper bounds for guarantees).
        This default asks :meth:`delta` once per eps; accountants with a vectorised profile
        override it."""
        return np.asarray([self.delta(float(e)) for e in np.asarray(epsilons, dtype=float)],
                          dtype=float)

    @abstractmethod
    def tradeoff(self, alpha: np.ndarray) -> np.ndarray:
        """beta(alpha): the type II error lower bound at type I errors ``alpha`` in [0, 1]
        (a lower bound on the true trade-off curve for guarantees)."""

    # -- persistence ---------------------------------------------------------------------
    def settings(self) -> dict[str, Any]:
        """Numerical settings that ``__init__`` takes as keywords (for the JSON round trip)."""
        return {}

    def to_json(self) -> dict[str, Any]:
        state: dict[str, Any] = {
            "accountant": self.name,
            "settings": self.settings(),
            "steps": [s.to_json() for s in self.steps],
        }
        if self.selections:
            state["selections"] = [s.to_json() for s in self.selections]
        return state

    @classmethod
    def from_json(cls, obj: dict[str, Any]) -> Accountant:
        try:
            events: list[PrivacyEvent] = [GaussianStep.from_json(s) for s in obj["steps"]]
            events += [TunedSelection.from_json(s) for s in obj.get("selections", [])]
            return make_accountant(obj["accountant"], events, **obj.get("settings", {}))
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


def make_accountant(name: str = DEFAULT_ACCOUNTANT, steps: Iterable[PrivacyEvent] = (),
                    **settings: Any) -> Accountant:
    """An accountant by registry name (``"pld"``, ``"rdp"``, ``"gdp-clt"``) over ``steps``,
    which may hold :class:`TunedSelection` s: only an accountant that :attr:`holds_selections`
    (``rdp``) takes them; the others raise :class:`UnsupportedEventError` (a selection's bound
    is an RDP curve, which has no exact privacy-loss distribution or GDP form)."""
    kind = make_accountant_class(name)
    events = tuple(steps)
    selections = tuple(e for e in events if isinstance(e, TunedSelection))
    gaussian = [e for e in events if isinstance(e, GaussianStep)]
    if len(gaussian) + len(selections) != len(events):
        odd = next(e for e in events if not isinstance(e, GaussianStep | TunedSelection))
        raise ConfigError(f"expected GaussianStep or TunedSelection, got {type(odd).__name__}")
    if not selections:
        return kind(gaussian, **settings)
    if not kind.holds_selections:
        raise UnsupportedEventError(
            f"the {name} accountant cannot hold a tuned selection: its bound (Papernot & "
            f"Steinke) is an RDP curve with no exact {name} form; use the rdp accountant")
    return kind(gaussian, **settings, selections=selections)  # type: ignore[call-arg]


GUARANTEES = ("pld", "rdp")
"""The registered accountants whose answers are upper bounds (``is_guarantee``)."""


def smallest_epsilon(accountant: Accountant, delta: float, *,
                     only_if_infinite: bool = False) -> tuple[float, str]:
    """(eps, name): the smallest eps(delta) among ``accountant`` and the other
    :data:`GUARANTEES` for the same history, and the accountant that gave it.

    Every guarantee's eps is an upper bound on the history's true eps, so the smallest is one
    too; they fail in different places (the PLD grid cannot resolve some long histories of tiny
    per-step loss and answers ``inf`` where RDP is finite). With ``only_if_infinite`` the others
    are asked only when ``accountant``'s own answer is infinite (a ledger, which asks often and
    whose RDP would cost one quadrature per new kind of step). A history holding a
    :class:`TunedSelection` is answered by ``accountant`` alone (no other can hold it).
    ``accountant`` must be a guarantee; it is never changed.
    """
    if not accountant.is_guarantee:
        raise ConfigError(f"{accountant.name} is not a guarantee; its eps bounds nothing")
    best, source = _epsilon_or_inf(accountant, delta), accountant.name
    if (only_if_infinite and math.isfinite(best)) or accountant.selections:
        # a history with a tuned selection has one accountant (rdp): the others' eps of its
        # Gaussian steps alone would leave the selection out, below a valid bound
        return best, source
    steps = accountant.steps
    for name in GUARANTEES:
        if name != accountant.name and steps:
            other = _epsilon_or_inf(make_accountant(name, steps), delta)
            if other < best:
                best, source = other, name
    return best, source


def _epsilon_or_inf(accountant: Accountant, delta: float) -> float:
    """``accountant``'s eps(delta), ``inf`` where it cannot represent the history
    (:class:`AccountantOutOfRange`: then another guarantee is asked; an attacker's fixed-size
    history, RDP eps 3.37 against a budget of 5, made the PLD raise and the ledger with it),
    or the delta (the PLD below :data:`fedsim.config.limits.MIN_DELTA`: there its eps follows
    its grid's noise in the far tail and is not monotone in the steps, 11.4, 12.9, 14.0, 17.1,
    17.1, 14.7 for 1 to 6 rounds of an attacker's posture at delta 1e-14, so a ledger's count
    of the rounds that fit granted rounds a fresh accountant refused; RDP's grows with every
    step)."""
    if accountant.name == "pld" and delta < limits.MIN_DELTA and accountant.total_steps:
        return math.inf
    try:
        return accountant.epsilon(delta)
    except AccountantOutOfRange:
        return math.inf
