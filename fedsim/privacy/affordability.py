"""Whether a ledger's next round fits its budget, answered mostly without an accountant
evaluation: the allowance and the plan of :mod:`fedsim.privacy.ledger`'s module docstring
("Speed"). One :class:`Affordability` per ledger with a budget; the ledger asks it before each
spend and tells it what each spend took.

Neighbouring relation: the ledger's (its steps' sampling scheme). The answers rest on
:mod:`fedsim.privacy.budget`'s: a round dominated by its envelope's steps fits if as many
envelope steps do (a garbling argument), and eps grows with every step composed (so a prefix
of a fitting history fits). "Does not fit" is only ever the exact count of the round's own
kind, or a dry run of the round: the decisions are a fresh accountant's.
"""

from __future__ import annotations

from collections.abc import Callable

from fedsim.privacy.accountant import Accountant
from fedsim.privacy.budget import (
    SHARED_SLACK,
    Allowance,
    Budget,
    RoundAllowance,
    envelope,
    fits_after,
    largest_fitting_prefix,
    shared_unit,
    within,
)
from fedsim.privacy.calibration import bisect_fitting, doubling_bracket
from fedsim.privacy.events import GaussianStep


class Affordability:
    """A ledger's answers to "does this round fit?" for ``budget``; ``history`` gives the
    accountant holding the ledger's recorded steps (composed when read)."""

    def __init__(self, budget: Budget, history: Callable[[], Accountant]) -> None:
        self._budget = budget
        self._history = history
        self._allowance: Allowance | None = None
        self._rounds: RoundAllowance | None = None  # for a round of several kinds
        self._seen_round: tuple[GaussianStep, ...] | None = None  # the last such round asked
        self._previous_envelope: GaussianStep | None = None
        self._last_check: tuple[tuple[tuple[GaussianStep, ...], int], bool] | None = None
        self._plan: list[tuple[GaussianStep, ...]] | None = None
        self._plan_cursor = 0  # planned rounds spent since plan()
        self._plan_fit = 0  # planned rounds that fit in the budget, counted from plan()

    def plan(self, rounds: list[tuple[GaussianStep, ...]]) -> int:
        """Register the (grouped) rounds the client plans to release next, in order; return
        how many of them fit from the current state (:meth:`PrivacyLedger.plan`)."""
        # dry run, then commit: a search that raised left the new plan answering with the old
        # count (an attacker's review: every planned round refused)
        fit = largest_fitting_prefix(self._history(), rounds, self._budget)
        self._plan, self._plan_cursor, self._plan_fit = rounds, 0, fit
        return fit

    def fits(self, steps: tuple[GaussianStep, ...], kinds: tuple[GaussianStep, ...],
             recorded: int) -> bool:
        """Whether releasing the validated, non-empty ``steps`` (``kinds``: grouped) keeps the
        ledger within budget; ``recorded``: the ledger's record count (an answer is kept
        until it changes)."""
        planned = self._planned_answer(kinds)
        if planned is not None:
            return planned
        memo = (kinds, recorded)
        if self._last_check is not None and self._last_check[0] == memo:
            return self._last_check[1]  # asked again before anything changed (spend asks)
        answer = self._check(kinds, steps)
        self._last_check = (memo, answer)
        return answer

    def spent(self, kinds: tuple[GaussianStep, ...]) -> None:
        """A spend's side in the plan and the allowance (inside the spend's commit: an
        interrupt between would leave them answering for a budget already spent)."""
        if self._planned_answer(kinds) is None:
            self._plan = None  # off the plan: its counts no longer describe the state
        else:
            self._plan_cursor += 1
        allowance = self._allowance
        if allowance is not None and not allowance.spend(kinds):
            self._allowance, self._previous_envelope = None, allowance.kind
        if self._rounds is not None and not self._rounds.spend(kinds):
            self._rounds = None

    def forget(self) -> None:
        """Drop every count: the history changed otherwise than by counted steps (a tuned
        selection), so the allowance and the plan no longer describe it."""
        self._allowance = self._previous_envelope = self._plan = self._last_check = None
        self._rounds = None

    def _planned_answer(self, kinds: tuple[GaussianStep, ...]) -> bool | None:
        """Whether the next planned round fits, if ``kinds`` is that round; else None."""
        plan = self._plan
        if plan is None or self._plan_cursor >= len(plan) or plan[self._plan_cursor] != kinds:
            return None
        return self._plan_cursor < self._plan_fit

    def _check(self, kinds: tuple[GaussianStep, ...], steps: tuple[GaussianStep, ...]) -> bool:
        budget = self._budget
        several = len(kinds) > 1
        if several and self._rounds is not None and self._rounds.kinds == kinds:
            return self._round_answer(kinds, budget)  # an unchanged round of several kinds
        count = sum(kind.count for kind in kinds)
        held = self._allowance
        if held is None or not held.covers(kinds):
            previous = held.kind if held is not None else self._previous_envelope
            held = self._new_allowance(envelope(kinds, previous), held, count, budget)
            covered = held.covers(kinds)
        else:
            covered = True
            if held.capped and count > held.fits:  # far from the budget: look further
                held = self._new_allowance(held.kind, held, count, budget)  # the same kind
        # (a fresh allowance of a round of several kinds is their envelope, which may
        # dominate the smaller ones by less than the margin: then it does not answer)
        answer = self._answer(held, kinds, count, budget) if covered else None
        if answer is None:  # a widened envelope ran out, or a round of several kinds
            exact = envelope(kinds, None)
            if exact.key != held.kind.key:
                held = self._new_allowance(exact, held, count, budget)
                if held.covers(kinds):
                    answer = self._answer(held, kinds, count, budget)
        if answer is None and several and self._seen_round == kinds:
            # the same round of several kinds again (a posture, not a drift): counted from now
            answer = self._round_answer(kinds, budget)
        if several:
            self._seen_round = kinds
        return within(self._history().preview(steps), budget) if answer is None else answer

    def _round_answer(self, kinds: tuple[GaussianStep, ...], budget: Budget) -> bool:
        """Whether one more round of exactly ``kinds`` (several kinds) fits, from its
        :class:`~fedsim.privacy.budget.RoundAllowance` (found once for an unchanged posture, by
        doubling from the last grant; the boundary round bisected to the exact count, so "does
        not fit" is a fresh accountant's answer for this very round)."""
        held = self._rounds
        if held is None or held.kinds != kinds or (held.capped and held.fits < 1):
            # (a capped grant spent: the search stopped there, so look again from here)
            history = self._history()
            per_round = sum(kind.count for kind in kinds)
            limit = max(64, 2 * (history.total_steps // per_round + 64))
            start = min(limit, 64 if held is None or held.kinds != kinds
                        else max(1, held.granted))
            low, high = doubling_bracket(self._round_fits(kinds, budget), start=start,
                                         limit=limit)
            capped = high == limit + 1
            held = self._rounds = RoundAllowance(
                kinds, low, None if capped or high - low <= 1 else high, capped, low)
        if held.fits < 1 and held.above is not None:
            held.fits = bisect_fitting(self._round_fits(kinds, budget), held.fits, held.above)
            held.above = None
        return held.fits >= 1

    def _round_fits(self, kinds: tuple[GaussianStep, ...],
                    budget: Budget) -> Callable[[int], bool]:
        """Whether ``rounds`` more rounds of ``kinds`` fit after the current state (each
        count evaluated at most once per search)."""
        answers: dict[int, bool] = {}

        def fits(rounds: int) -> bool:
            answer = answers.get(rounds)
            if answer is None:
                steps = [kind.times(kind.count * rounds) for kind in kinds]
                answer = answers[rounds] = within(self._history().preview(steps), budget)
            return answer
        return fits

    def _answer(self, held: Allowance, kinds: tuple[GaussianStep, ...], count: int,
                budget: Budget) -> bool | None:
        """True if ``held`` (which covers ``kinds``: :meth:`Allowance.covers`) shows that
        ``count`` steps of ``kinds`` fit, False if it shows they do not (``kinds`` are
        ``held``'s own kind), None if it cannot tell."""
        if count <= held.fits:
            return True
        if held.above is not None and count < held.above and self._refine(held, budget) >= count:
            return True
        if not held.capped and len(kinds) == 1 and kinds[0].key == held.kind.key:
            return False  # more than the largest count of this kind that fits
        return None

    def _new_allowance(self, unit: GaussianStep, previous: Allowance | None, count: int,
                       budget: Budget) -> Allowance:
        """The allowance of ``unit`` from the current state, kept as the ledger's: a lower
        bound on how many of its steps fit, found by doubling from the previous allowance's
        grant (a posture change rarely moves it far). The search looks no further than twice
        the steps recorded (and twice ``count``): a client far from its budget is granted
        that many, and once it has spent them, twice as many again (O(log T) evaluations over
        a history of T steps, each of a history no longer than about 3T steps).

        Without a previous grant (a ledger's first allowance) the limit is tried first: a
        client far from its budget, the common case, is granted it in one evaluation instead
        of two (the doubling's ``start``, then the limit). The bracket is the doubling's
        either way (eps grows with every step composed: if the limit fits, every count below
        it does, and the doubling ends at the limit too); when the limit does not fit, the
        doubling runs as before, its answer for the limit taken from the probe. From an
        empty history the limit of :func:`~fedsim.privacy.budget.shared_unit` (``unit`` with its rate rounded up to
        a grid) is asked before ``unit``'s own: it dominates ``unit``, so if it fits, so does
        ``unit``'s, and its answer is shared by every ledger whose rate rounds to the same
        point (a population's clients differ in q = m / N: 125 postures of 1,000 clients ask
        32 questions)."""
        limit = max(64, 2 * (self._history().total_steps + 64), 2 * count)
        start = min(limit, 64 if previous is None else max(1, previous.granted))
        fits = self._fits_of(unit, budget)
        if previous is None and start < limit and (self._shared_limit_fits(unit, limit, budget)
                                                   or fits(limit)):
            low, high = limit, limit + 1
        else:
            low, high = doubling_bracket(fits, start=start, limit=limit)
        capped = high == limit + 1
        held = Allowance(unit, low, None if capped or high - low <= 1 else high, capped, low)
        self._allowance = held
        return held

    def _shared_limit_fits(self, unit: GaussianStep, limit: int, budget: Budget) -> bool:
        """Whether ``limit`` steps of :func:`~fedsim.privacy.budget.shared_unit` of ``unit`` fit an empty history
        within all but :data:`~fedsim.privacy.budget.SHARED_SLACK` of the budget (False when the history is not
        empty, or the shared unit is ``unit`` itself: then the caller's own question is the
        same one)."""
        accountant = self._history()
        if accountant.total_steps or accountant.selections:
            return False
        shared = shared_unit(unit)
        if shared.q == unit.q:
            return False
        # Room to spare as well: the shared answer grants only with the budget's last
        # millionth unused (the same key for every ledger of the budget: still shared).
        spare = Budget(budget.epsilon * (1.0 - SHARED_SLACK), budget.delta)
        return fits_after(accountant, shared.times(limit), spare)

    def _refine(self, allowance: Allowance, budget: Budget) -> int:
        """Bisect ``allowance``'s bracket to the exact count; return it."""
        assert allowance.above is not None
        allowance.fits = bisect_fitting(self._fits_of(allowance.kind, budget), allowance.fits,
                                        allowance.above)
        allowance.above = None
        return allowance.fits

    def _fits_of(self, unit: GaussianStep, budget: Budget) -> Callable[[int], bool]:
        """Whether ``count`` steps of ``unit`` fit after the current state; each count is
        evaluated at most once per search (a long history is not in :func:`~fedsim.privacy.budget.fits_after`'s
        memory)."""
        answers: dict[int, bool] = {}

        def fits(count: int) -> bool:
            answer = answers.get(count)
            if answer is None:
                answer = answers[count] = fits_after(self._history(), unit.times(count), budget)
            return answer
        return fits
