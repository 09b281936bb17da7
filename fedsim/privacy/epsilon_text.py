"""How an epsilon is written for people: one rule for every output (the run's headline and
its explanation, ``fedsim report``, the tables, a ledger's refusal).
"""

from __future__ import annotations

__all__ = ["epsilon_alike", "epsilon_range", "epsilon_text"]


def epsilon_text(value: float) -> str:
    """An epsilon to four significant digits with its trailing zeros (``3.000``, not ``3``,
    beside ``2.995``: a bare ``3`` reads as a rounder number than it is)."""
    return f"{value:#.4g}"


def epsilon_alike(low: float, high: float) -> bool:
    """Whether two epsilons read alike as written (:func:`epsilon_text`): a range of them is
    then one value."""
    return epsilon_text(low) == epsilon_text(high)


def epsilon_range(low: float, high: float) -> str:
    """``0.4790 to 1.997``: the smallest and the largest of several epsilons (a run's
    headline wrote ``0.4790..1.997`` beside its explanation's ``0.479 to 1.997``); one value
    where both read alike (``2.998``, not ``2.998 to 2.998``)."""
    if epsilon_alike(low, high):
        return epsilon_text(low)
    return f"{epsilon_text(low)} to {epsilon_text(high)}"
