"""How an epsilon is written for people: one rule for every output (the run's headline and
its explanation, ``fedsim report``, the tables, a ledger's refusal).
"""

from __future__ import annotations

from collections.abc import Mapping

__all__ = ["by_relation_text", "epsilon_alike", "epsilon_range", "epsilon_text",
           "epsilons_apart"]


DIGITS = 4
"""The significant digits an epsilon is written with."""


def epsilon_text(value: float, digits: int = DIGITS) -> str:
    """An epsilon to four significant digits (or ``digits``) with its trailing zeros
    (``3.000``, not ``3``, beside ``2.995``: a bare ``3`` reads as a rounder number than it
    is)."""
    return f"{value:#.{digits}g}"


def epsilons_apart(first: float, second: float) -> tuple[str, str]:
    """Two epsilons that differ, written with as many more digits than
    :func:`epsilon_text`'s as it takes to tell them apart (a ledger a repair took to eps
    2.50015 read "eps 2.500 spent, above its budget's eps 2.500"; now "2.5002" and
    "2.5000"); equal ones as :func:`epsilon_text` writes them."""
    digits = DIGITS
    while (first != second and digits < 17
           and epsilon_text(first, digits) == epsilon_text(second, digits)):
        digits += 1
    return epsilon_text(first, digits), epsilon_text(second, digits)


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


def by_relation_text(texts: Mapping[str, str]) -> str:
    """Epsilons of clients under more than one neighbouring relation, ``texts`` (each
    relation's, already written), said apart: add/remove and replace-one guarantees are
    about different neighbours and are never pooled or compared."""
    return ("by neighbouring relation, guarantees about different neighbours that are not to "
            "be compared: " + "; ".join(f"{relation} clients {text}"
                                        for relation, text in texts.items()))
