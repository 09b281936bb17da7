"""A ledger's memory is bounded however long the run: its records are on disk, memory holds
their tally (fedsim.privacy.ledger_tally). A run may last for days, and a ledger is spent every
round."""

from __future__ import annotations

import gc
import random
import tracemalloc
from pathlib import Path

import pytest

from fedsim.errors import LedgerError
from fedsim.privacy.events import GaussianStep
from fedsim.privacy.ledger import NORMALISATION_ROUND, Budget, PrivacyLedger
from fedsim.privacy.ledger_tally import RoundSet

STEP = GaussianStep("poisson", 0.001, 2.0)


def _open(path: Path, budget: Budget | None = None) -> PrivacyLedger:
    return PrivacyLedger.open(path, client_id="c1", sampling="poisson", budget=budget,
                              accountant="pld", fsync=False)


@pytest.mark.parametrize("seed", range(6))
def test_a_round_set_holds_what_a_set_holds(seed: int) -> None:
    rng = random.Random(seed)
    kept, plain = RoundSet(), set()
    # runs of consecutive rounds with gaps, repeats, and values added out of order
    for _ in range(400):
        value = rng.choice([max(plain, default=-1) + 1, rng.randrange(-5, 300),
                            rng.choice(sorted(plain)) if plain else 0])
        kept.add(value)
        plain.add(value)
        assert len(kept) == len(plain)
    assert kept == plain and frozenset(plain) == kept
    assert list(kept) == sorted(plain)
    assert kept.highest == max(plain)
    assert all((v in kept) == (v in plain) for v in range(-10, 310))
    assert "7" not in kept
    # disjoint, sorted, not touching: as few ranges as the gaps allow
    ranges = kept.ranges
    assert all(a.stop < b.start for a, b in zip(ranges, ranges[1:], strict=False))
    assert sum(len(r) for r in ranges) == len(plain)
    copied = kept.copy()
    copied.add(10_000)
    assert 10_000 not in kept


def test_consecutive_rounds_are_one_range() -> None:
    rounds = RoundSet(range(100_000))
    assert rounds.ranges == (range(100_000),) and len(rounds) == 100_000
    assert RoundSet().highest is None and len(RoundSet()) == 0


def _retained(spends: int, path: Path) -> int:
    """Bytes the process holds after a ledger spent ``spends`` rounds (its records included if
    it kept them), the ledger still open."""
    gc.collect()
    tracemalloc.start()
    before = tracemalloc.get_traced_memory()[0]
    ledger = _open(path, Budget(1e6, 1e-5))
    for r in range(spends):
        ledger.spend(STEP, time=float(r), round=r)
    gc.collect()
    held = tracemalloc.get_traced_memory()[0] - before
    tracemalloc.stop()
    assert len(ledger.rounds) == spends and ledger.next_round == spends
    ledger.close()
    return held


def test_a_ledger_holds_no_record_a_round_in_memory(tmp_path: Path) -> None:
    _retained(4_500, tmp_path / "warm.jsonl")  # the accountant's caches, at this length
    short = _retained(500, tmp_path / "short.jsonl")
    long = _retained(4_500, tmp_path / "long.jsonl")
    # Before, each of the 4,000 more records stayed in memory: 481 KB more (~120 B each).
    assert long - short < 40_000, (short, long)


def test_the_tally_answers_what_the_records_say(tmp_path: Path) -> None:
    path = tmp_path / "c1.jsonl"
    with _open(path) as ledger:
        ledger.spend(STEP, time=0.0, round=NORMALISATION_ROUND)
        for r in [0, 1, 2, 5, 6, 9]:  # gaps: a crash's, a repair's numbering
            ledger.spend([STEP, STEP], time=1.5 * r, round=r)
        assert ledger.record_count == 13 and len(ledger.records) == 13
        assert ledger.rounds == {0, 1, 2, 5, 6, 9} and ledger.next_round == 10
        assert ledger.recorded(NORMALISATION_ROUND) and not ledger.recorded(3)
        assert ledger.last_time == 13.5
        spent = [(r.time, r.round) for r in ledger.records]
    with _open(path) as again:  # what memory held is what the file reads as
        assert [(r.time, r.round) for r in again.records] == spent
        assert (again.record_count, again.rounds, again.next_round, again.last_time) == (
            13, {0, 1, 2, 5, 6, 9}, 10, 13.5)
        assert again.recorded(NORMALISATION_ROUND)


def test_records_read_back_refuse_a_file_cut_under_the_ledger(tmp_path: Path) -> None:
    path = tmp_path / "c1.jsonl"
    with _open(path) as ledger:
        for r in range(4):
            ledger.spend(STEP, time=float(r), round=r)
        lines = path.read_bytes().splitlines(keepends=True)
        path.write_bytes(b"".join(lines[:-2]))  # two records cut while it is open
        with pytest.raises(LedgerError, match="holds 2 records, but 4 were recorded"):
            ledger.records  # noqa: B018 - the property reads the file


def test_a_round_set_built_from_rounds_in_any_order_is_their_set() -> None:
    """(A damaged file's rounds in reverse order are sorted first: one append each, where an
    insert at the front each was quadratic.)"""
    values = list(range(10_000, 0, -3)) + [5, 5, 7, 8]
    built = RoundSet(values)
    assert built == set(values) and list(built) == sorted(set(values))
    assert len(built.ranges) == len(RoundSet(sorted(values)).ranges)


def test_records_read_back_refuse_a_file_replaced_under_the_ledger(tmp_path: Path) -> None:
    """(An attacker's review: as many records, cheaper ones, read back without an error.)"""
    costly, cheap = GaussianStep("poisson", 1.0, 1.0), GaussianStep("poisson", 1e-4, 50.0)
    with _open(tmp_path / "a" / "c1.jsonl") as live:
        for r in range(3):
            live.spend(costly, time=float(r), round=r)
        with _open(tmp_path / "b" / "c1.jsonl") as other:
            for r in range(3):
                other.spend(cheap, time=float(r), round=r)
        (tmp_path / "b" / "c1.jsonl").replace(tmp_path / "a" / "c1.jsonl")
        with pytest.raises(LedgerError, match="not the ones this ledger recorded"):
            live.records  # noqa: B018 - the property reads the file
