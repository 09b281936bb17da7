"""A client's budget, and what fits in it: the ledger's one budget test and the pure
answers behind its O(1) ``can_spend`` (:mod:`fedsim.privacy.ledger` keeps the state).

Neighbouring relations: those of the steps composed (Poisson subsampling: add/remove one
record; fixed-size: replace one record; :mod:`fedsim.privacy.events`). Every answer here rests
on two facts about them, both under either relation:

* eps never falls as steps are composed (a composition is a post-processing of its prefix);
* a Gaussian step with a smaller rate q and a larger noise multiplier sigma is a garbling of
  the other (:func:`envelope` cites the results), so a history with each step replaced by one
  that dominates it costs at least as much under every accountant fedsim has.
"""

from __future__ import annotations

import math
import threading
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from fedsim.errors import ConfigError, LedgerError, PrivacyError
from fedsim.privacy.accountant import Accountant, smallest_epsilon
from fedsim.privacy.events import GaussianStep


@dataclass(frozen=True, slots=True)
class Budget:
    """A per-client (eps, delta) budget."""

    epsilon: float
    delta: float

    def __post_init__(self) -> None:
        if not (isinstance(self.epsilon, int | float) and math.isfinite(self.epsilon)
                and self.epsilon > 0):
            raise ConfigError(f"budget epsilon must be a finite number > 0, got {self.epsilon!r}")
        if not (isinstance(self.delta, int | float) and 0 < self.delta < 1):
            raise ConfigError(f"budget delta must be in (0, 1), got {self.delta!r}")

    def to_json(self) -> dict[str, float]:
        return {"epsilon": float(self.epsilon), "delta": float(self.delta)}

    @classmethod
    def from_json(cls, obj: Any) -> Budget | None:
        if obj is None:
            return None
        if not isinstance(obj, Mapping) or set(obj) != {"epsilon", "delta"}:
            raise LedgerError(f"budget must be {{epsilon, delta}} or null, got {obj!r}")
        return cls(obj["epsilon"], obj["delta"])


_ENVELOPE_MARGIN = 1.0 / 16.0


SHARED_RATE_GRID = 8
""":func:`shared_unit` rounds a rate up to the next power of ``2^(1/SHARED_RATE_GRID)``."""
SHARED_MIN_GAP = 1e-3
"""The least relative amount by which :func:`shared_unit` raises a rate: the accountant's eps
is monotone in q only up to its floating-point rounding (about 1e-8 relative, where two rates
differ by under 4e-8: an attacker's review found such pairs whose larger rate read the
smaller eps), so a dominating step must dominate by a margin far above that."""
SHARED_SLACK = 1e-6
"""A shared answer grants only if the shared steps fit ``(1 - SHARED_SLACK)`` of the budget."""


def dominated_by_margin(step: GaussianStep, by: GaussianStep) -> bool:
    """Whether ``by`` dominates ``step`` (a rate q at least ``step``'s, a noise multiplier
    sigma at most its) so that the accountant's eps shows it: in each of q and sigma the two
    are equal, or ``by`` is ahead by at least :data:`SHARED_MIN_GAP` (relative). Domination
    alone is exact (see :func:`envelope`), but the accountant's eps follows it only up to its
    rounding: a step of q 1e-11 below another's read a larger eps in a composition, and a
    ledger counting it against the other's allowance granted a step at the budget's edge
    that a fresh accountant refuses."""
    return _rate_covered(step.q, by.q) and _noise_covered(step.sigma, by.sigma)


def _rate_covered(q: float, by: float) -> bool:
    """``q`` is the rate ``by`` or below it by :data:`SHARED_MIN_GAP` (relative)."""
    return q == by or q * (1.0 + SHARED_MIN_GAP) <= by


def _noise_covered(sigma: float, by: float) -> bool:
    """``sigma`` is the noise multiplier ``by`` or above it by :data:`SHARED_MIN_GAP`."""
    return sigma == by or sigma >= by * (1.0 + SHARED_MIN_GAP)


def shared_unit(unit: GaussianStep) -> GaussianStep:
    """``unit`` (count 1) with its rate q rounded up to the first point of the grid
    ``2^(k / SHARED_RATE_GRID)`` at least ``SHARED_MIN_GAP`` above it, sigma unchanged: a step
    that dominates ``unit`` by a margin (see :func:`envelope`), so that a count of it that
    fits a history proves the same count of ``unit`` fits, and one that the first allowances
    of clients with nearby rates share. ``unit`` itself when no such point is at most 1."""
    floor = unit.q * (1.0 + SHARED_MIN_GAP)
    k = math.ceil(SHARED_RATE_GRID * math.log2(floor))
    q = 2.0 ** (k / SHARED_RATE_GRID)
    if q < floor:  # log2 rounded below an exact grid point
        q = 2.0 ** ((k + 1) / SHARED_RATE_GRID)
    if q > 1.0:
        return GaussianStep(unit.sampling, unit.q, unit.sigma)
    return GaussianStep(unit.sampling, q, unit.sigma)


def envelope(kinds: Sequence[GaussianStep], previous: GaussianStep | None) -> GaussianStep:
    """One step (count 1) that every step of ``kinds`` is dominated by: the largest q and the
    smallest sigma among them, widened by :data:`_ENVELOPE_MARGIN` in each direction in which
    they moved past ``previous`` (the last envelope) or to within :data:`SHARED_MIN_GAP` of it
    (:func:`dominated_by_margin`): a drifting schedule (a new sigma every
    round) is then covered for many rounds by one allowance, and an unchanged posture is
    covered exactly.

    Domination: a Gaussian step with a smaller rate q and a larger noise multiplier sigma is a
    garbling of the larger one's pair for both relations (Poisson: by joint convexity of the
    hockey-stick divergence, ``(1-t) Q + t P`` against Q with t = q'/q; fixed-size:
    ``C_q(G_mu)`` decreases in q and mu, Dong, Roth & Su 2022 Sec. 4), so replacing each step
    of a history by its envelope can only raise every accountant's bound.
    """
    sampling = kinds[0].sampling
    q = max(kind.q for kind in kinds)
    sigma = min(kind.sigma for kind in kinds)
    if previous is not None:
        # (moved past it, or to within the margin by which an allowance covers a kind:
        # dominated_by_margin; else the next drift would need a new allowance at once)
        if not _rate_covered(q, previous.q):
            q = min(1.0, q * (1.0 + _ENVELOPE_MARGIN))
        if not _noise_covered(sigma, previous.sigma):
            sigma = sigma / (1.0 + _ENVELOPE_MARGIN)
    return GaussianStep(sampling, q, sigma)


@dataclass(slots=True)
class Allowance:
    """How many more steps of ``kind`` surely fit in the budget from the current state:
    ``fits``, the exact count unless ``above`` (then a lower bound, and ``above`` the first
    count known not to fit) or ``capped`` (the search stopped at ``fits``; more may fit).
    Spending rounds that ``kind`` dominates uses it up, count by count. ``granted`` is
    ``fits`` when it was computed (where the next search starts)."""

    kind: GaussianStep
    fits: int
    above: int | None
    capped: bool
    granted: int

    def covers(self, kinds: Sequence[GaussianStep]) -> bool:
        """Whether every step of ``kinds`` is this allowance's kind or dominated by it by a
        margin (:func:`dominated_by_margin`)."""
        return all(dominated_by_margin(k, self.kind) for k in kinds)

    def spend(self, kinds: Sequence[GaussianStep]) -> bool:
        """Use the allowance for a spent round; False if it does not cover the round (then
        it no longer describes the state)."""
        count = sum(k.count for k in kinds)
        if not self.covers(kinds) or count > self.fits:
            return False
        self.fits -= count
        if self.above is not None:
            self.above -= count
        return True


@dataclass(slots=True)
class RoundAllowance:
    """How many more rounds of exactly ``kinds`` (a round of several kinds of step, grouped:
    each kind with its count) surely fit in the budget from the current state, like
    :class:`Allowance` but counted in whole rounds: ``fits``, exact unless ``above`` (then a
    lower bound, and ``above`` the first count known not to fit) or ``capped``. A round of
    several kinds is not dominated by one step of its own (its envelope of the largest q and
    the smallest sigma prices every step at the worst: a round of q = 0.01, sigma = 1 and
    q = 1, sigma = 20 would be priced as two steps of q = 1, sigma = 1), so its allowance is
    the round itself."""

    kinds: tuple[GaussianStep, ...]
    fits: int
    above: int | None
    capped: bool
    granted: int

    def spend(self, kinds: Sequence[GaussianStep]) -> bool:
        """Use one round for a spent round; False if it is not this allowance's round (then
        the allowance no longer describes the state)."""
        if tuple(kinds) != self.kinds or self.fits < 1:
            return False
        self.fits -= 1
        if self.above is not None:
            self.above -= 1
        return True


def within(accountant: Accountant, budget: Budget) -> bool:
    """The ledger's one budget test: the history's eps (the smallest guarantee's where the
    enforcing accountant has no finite answer) is at most the budget's."""
    try:
        eps, _ = smallest_epsilon(accountant, budget.delta, only_if_infinite=True)
    except PrivacyError:  # a step no accountant can price (a vanishing sigma: no privacy)
        return False      # fits no budget (it raised through a plan and a check: a review)
    return eps <= budget.epsilon


_FITS_KEPT = 1024
_FITS_KINDS = 8
_fits_answers: OrderedDict[tuple[Any, ...], bool] = OrderedDict()
_fits_lock = threading.Lock()


def fits_after(accountant: Accountant, steps: GaussianStep, budget: Budget) -> bool:
    """``within(accountant.preview([steps]), budget)``, remembered across ledgers.

    The answer is a function of the accountant's kind, settings and history (the multiset
    of its steps: :mod:`fedsim.privacy.pld_state`, bit for bit however they were fed), of
    ``steps`` and of the budget, which together are the key: the clients of one group open
    their ledgers with the same budget and posture, so the first allowance of each of them
    (the same searches over an empty history) is computed once, not once a client. Only
    short histories (at most :data:`_FITS_KINDS` kinds) are remembered, the last
    :data:`_FITS_KEPT` answers: memory stays bounded, and a long history (which no other
    ledger holds) is not copied into a key.
    """
    if accountant.kinds > _FITS_KINDS or accountant.selections:
        return within(accountant.preview([steps]), budget)
    key = (type(accountant), repr(sorted(accountant.settings().items())), accountant.steps,
           steps, budget)
    with _fits_lock:
        answer = _fits_answers.get(key)
        if answer is not None:
            _fits_answers.move_to_end(key)
            return answer
    answer = within(accountant.preview([steps]), budget)
    with _fits_lock:
        _fits_answers[key] = answer
        if len(_fits_answers) > _FITS_KEPT:
            _fits_answers.popitem(last=False)
    return answer


def largest_fitting_prefix(accountant: Accountant, rounds: Sequence[Sequence[GaussianStep]],
                           budget: Budget) -> int:
    """How many of ``rounds``, taken in order after ``accountant``'s history, fit in ``budget``
    (eps non-decreasing in the steps composed). ``accountant`` is never changed.

    The whole plan is tried first (a schedule calibrated to the budget fits, one evaluation);
    otherwise a galloping search extends one dry-run copy by 1, 2, 4, ... rounds and bisects
    the failing bracket from copies of its lower end, so every planned round is composed a
    bounded number of times and eps is evaluated O(log len(rounds)) times.
    """
    def fits(trial: Accountant) -> bool:
        return within(trial, budget)

    def flat(part: Sequence[Sequence[GaussianStep]]) -> list[GaussianStep]:
        return [step for r in part for step in r]

    if not rounds or fits(accountant.preview(flat(rounds))):
        return len(rounds)
    low, width, base = 0, 1, accountant.preview([])
    while True:  # fits(low) holds for base; the whole plan does not fit
        high = min(low + width, len(rounds))
        trial = base.preview(flat(rounds[low:high]))
        if high == len(rounds) or not fits(trial):
            break
        low, width, base = high, width * 2, trial
    if high == len(rounds) and fits(trial):  # pragma: no cover - excluded by the first try
        return high
    while high - low > 1:
        middle = (low + high) // 2
        trial = base.preview(flat(rounds[low:middle]))
        if fits(trial):
            low, base = middle, trial
        else:
            high = middle
    return low
