"""The durable per-client ledger: resume, crash safety, budget enforcement."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from fedsim.errors import BudgetExhausted, ConfigError, LedgerError
from fedsim.privacy.accountant import make_accountant
from fedsim.privacy.events import GaussianStep
from fedsim.privacy.ledger import Budget, PrivacyLedger
from fedsim.privacy.ledger_mark import mark_path

STEP = GaussianStep("poisson", 0.01, 1.0)
BUDGET = Budget(1.0, 1e-5)


def open_ledger(path: Path, budget: Budget | None = BUDGET, **kw: str) -> PrivacyLedger:
    return PrivacyLedger.open(path, client_id=kw.get("client_id", "c7"), sampling="poisson",
                              budget=budget, accountant=kw.get("accountant", "pld"))


def test_reopen_resumes_and_never_resets(tmp_path: Path) -> None:
    path = tmp_path / "c7.jsonl"
    with open_ledger(path) as ledger:
        for r in range(5):
            ledger.spend(STEP, time=float(r), round=r)
        spent = ledger.epsilon()
    with open_ledger(path) as again:
        assert [rec.round for rec in again.records] == [0, 1, 2, 3, 4]
        assert again.epsilon() == spent
        assert again.steps == (STEP.times(5),)
    header = json.loads(path.read_text().splitlines()[0])
    assert header["format"] == "fedsim-ledger/2" and header["client_id"] == "c7"


def test_spending_stops_exactly_at_the_budget(tmp_path: Path) -> None:
    with open_ledger(tmp_path / "l.jsonl") as ledger:
        released = 0
        while ledger.can_spend(STEP):
            ledger.spend(STEP, time=float(released), round=released)
            released += 1
        with pytest.raises(BudgetExhausted):
            ledger.spend(STEP, time=float(released), round=released)
        assert released > 100 and ledger.epsilon() <= BUDGET.epsilon
        # the headroom answer agrees with a direct computation at the boundary
        direct = make_accountant("pld", [STEP.times(released + 1)]).epsilon(BUDGET.delta)
        assert direct > BUDGET.epsilon
        assert not ledger.can_spend(STEP)


def test_cached_headroom_answers_like_the_accountant(tmp_path: Path) -> None:
    """The headroom cache (a lower bound first, bisected to the exact count on demand) gives
    the answer of a direct accountant check for every request, across kinds and counts."""
    import random

    rng = random.Random(3)
    kinds = [GaussianStep("poisson", 0.01, 1.0), GaussianStep("poisson", 0.02, 1.5)]
    budget = Budget(0.8, 1e-5)
    with open_ledger(tmp_path / "l.jsonl", budget=budget) as ledger:
        answers = set()
        for round_index in range(60):
            request = rng.choice(kinds).times(rng.choice([1, 1, 1, 7, 40, 300]))
            direct = make_accountant("pld", [*ledger.steps, request]).epsilon(budget.delta)
            allowed = ledger.can_spend(request)
            assert allowed == (direct <= budget.epsilon), (round_index, request)
            answers.add(allowed)
            if allowed and rng.random() < 0.8:
                ledger.spend(request, time=float(round_index), round=round_index)
        assert answers == {True, False}  # the sequence reached the budget's edge


def test_budget_exhausted_writes_nothing(tmp_path: Path) -> None:
    path = tmp_path / "l.jsonl"
    with open_ledger(path, budget=Budget(0.5, 1e-5)) as ledger:
        big = GaussianStep("poisson", 0.01, 1.0, 10_000)
        size = path.stat().st_size
        before = ledger.steps
        with pytest.raises(BudgetExhausted):
            ledger.spend(big, time=0.0, round=0)
        assert path.stat().st_size == size and ledger.steps == before
        assert not ledger.can_spend([STEP, big])


def test_can_spend_is_a_dry_run(tmp_path: Path) -> None:
    with open_ledger(tmp_path / "l.jsonl") as ledger:
        ledger.spend(STEP, time=0.0, round=0)
        before = (ledger.steps, ledger.epsilon(), ledger.records)
        assert ledger.can_spend([STEP, GaussianStep("poisson", 0.01, 2.0)])
        assert (ledger.steps, ledger.epsilon(), ledger.records) == before


def _spend_then_crash_in_third(path: Path) -> None:
    """Two acknowledged spends, then a crash while the third record was being written: its
    line is cut and the high-water mark never moved past the second."""
    with open_ledger(path) as ledger:
        for r in range(2):
            ledger.spend(STEP, time=float(r), round=r)
        mark = mark_path(path).read_bytes()
        ledger.spend(STEP, time=2.0, round=2)
    path.write_bytes(path.read_bytes()[:-20])
    mark_path(path).write_bytes(mark)


def test_crash_mid_write_is_ignored_and_cut(tmp_path: Path) -> None:
    path = tmp_path / "l.jsonl"
    _spend_then_crash_in_third(path)
    with open_ledger(path) as ledger:
        assert len(ledger.records) == 2  # never acknowledged, never released
        assert path.read_bytes().endswith(b"\n")
        ledger.spend(STEP, time=9.0, round=9)
    with open_ledger(path) as ledger:
        assert [r.round for r in ledger.records] == [0, 1, 9]


def test_read_only_open_changes_nothing_and_refuses_to_spend(tmp_path: Path) -> None:
    path = tmp_path / "l.jsonl"
    _spend_then_crash_in_third(path)
    cut = path.read_bytes()
    with PrivacyLedger.open(path, client_id="c7", sampling="poisson", budget=BUDGET,
                            read_only=True) as ledger:
        assert [r.round for r in ledger.records] == [0, 1]
        assert ledger.epsilon() == make_accountant("pld", [STEP.times(2)]).epsilon(1e-5)
        with pytest.raises(LedgerError, match="read-only"):
            ledger.spend(STEP, time=5.0, round=5)
    assert path.read_bytes() == cut  # a reader never repairs or appends
    with pytest.raises(LedgerError, match="no such ledger"):
        PrivacyLedger.open(tmp_path / "missing.jsonl", client_id="c7", sampling="poisson",
                           budget=BUDGET, read_only=True)


def test_damaged_complete_line_raises(tmp_path: Path) -> None:
    path = tmp_path / "l.jsonl"
    with open_ledger(path) as ledger:
        ledger.spend(STEP, time=0.0, round=0)
    lines = path.read_text().splitlines()
    path.write_text(lines[0] + "\n" + '{"time": 0.0, "round": 0, "step": {"sampl\n')
    with pytest.raises(LedgerError, match="line 2"):
        open_ledger(path)


def test_header_mismatch_raises(tmp_path: Path) -> None:
    path = tmp_path / "l.jsonl"
    open_ledger(path).close()
    with pytest.raises(LedgerError, match="client_id"):
        open_ledger(path, client_id="somebody-else")
    with pytest.raises(LedgerError, match="budget"):
        open_ledger(path, budget=Budget(2.0, 1e-5))
    path.write_text("not json\n")
    with pytest.raises(LedgerError, match="header"):
        open_ledger(path)


def test_gdp_clt_ledger_is_enforced_by_pld(tmp_path: Path) -> None:
    with open_ledger(tmp_path / "l.jsonl", accountant="gdp-clt") as ledger:
        assert ledger.accountant.name == "pld" and ledger.accountant.is_guarantee


def test_unbudgeted_ledgers(tmp_path: Path) -> None:
    with open_ledger(tmp_path / "l.jsonl", budget=None) as ledger:
        for r in range(4):
            ledger.spend(STEP, time=10.0 * r, round=r)
        assert ledger.remaining_epsilon is None and ledger.can_spend(STEP.times(10**6))
        with pytest.raises(ConfigError):
            ledger.epsilon()
        assert ledger.epsilon(1e-5) == make_accountant("pld", [STEP.times(4)]).epsilon(1e-5)


def test_wrong_scheme_is_rejected(tmp_path: Path) -> None:
    with open_ledger(tmp_path / "l.jsonl") as ledger, pytest.raises(ConfigError):
        ledger.spend(GaussianStep("fixed", 0.01, 1.0), time=0.0, round=0)
