"""The TunedSelection privacy event: its RDP is Papernot & Steinke's bound over the candidates'
per-trial curves (checked against fedsim.privacy.tuning on curves built here from the
per-step formulas), the rdp accountant composes it with steps, the pld accountant and a pld
ledger refuse it, and smallest_epsilon never answers below the selection's bound."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from fedsim.errors import BudgetExhausted, ConfigError, LedgerError, UnsupportedEventError
from fedsim.privacy.accountant import Accountant, make_accountant, smallest_epsilon
from fedsim.privacy.events import GaussianStep, TunedSelection
from fedsim.privacy.ledger import Budget, PrivacyLedger, read_ledger_steps
from fedsim.privacy.rdp import DEFAULT_ORDERS, fixed_size_rdp, poisson_rdp, selection_rdp
from fedsim.privacy.rdp_conversion import epsilon_optimal
from fedsim.privacy.tuning import PoissonTrials, TruncatedNegativeBinomial, base_rdp, tuned_rdp

ORDERS = np.asarray(DEFAULT_ORDERS)
A = (GaussianStep("poisson", 0.05, 1.0, 40), GaussianStep("poisson", 1.0, 3.0))
B = (GaussianStep("poisson", 0.08, 1.5, 30),)


def _curve(steps: tuple[GaussianStep, ...]) -> np.ndarray:
    compute = {"poisson": poisson_rdp, "fixed": fixed_size_rdp}
    return sum((s.count * compute[s.sampling](s.q, s.sigma, ORDERS) for s in steps),
               np.zeros_like(ORDERS))


@pytest.mark.parametrize("trials", [TruncatedNegativeBinomial.with_mean(0.0, 5.0),
                                    TruncatedNegativeBinomial.with_mean(1.0, 3.0),
                                    pytest.param(PoissonTrials(4.0), marks=pytest.mark.slow)])
def test_selection_rdp_is_the_tuning_bound_of_the_candidates(trials: object) -> None:
    if isinstance(trials, TruncatedNegativeBinomial):
        event = TunedSelection("negative_binomial", (trials.eta, trials.gamma), (A, B, ()))
    else:
        assert isinstance(trials, PoissonTrials)
        event = TunedSelection("poisson", (trials.mu,), (A, B, ()))
    expected = tuned_rdp(ORDERS, base_rdp([_curve(A), _curve(B), np.zeros_like(ORDERS)]),
                         trials)  # type: ignore[arg-type]
    assert np.allclose(selection_rdp(event, ORDERS), expected, rtol=1e-12, atol=0)
    # orders in any order give the same values
    shuffled = np.random.default_rng(0).permutation(ORDERS)
    assert np.allclose(selection_rdp(event, shuffled), tuned_rdp(
        ORDERS, base_rdp([_curve(A), _curve(B)]), trials)[  # type: ignore[arg-type]
        np.searchsorted(ORDERS, shuffled)], rtol=1e-12)
    # composed with steps: the curves add, and eps is their optimal conversion
    extra = GaussianStep("poisson", 0.05, 1.0, 10)
    held = make_accountant("rdp", [extra, event])
    total = expected + 10 * poisson_rdp(0.05, 1.0, ORDERS)
    assert np.allclose(held.rdp(), total, rtol=1e-12)
    assert held.epsilon(1e-5) == pytest.approx(epsilon_optimal(ORDERS, total, 1e-5)[0], rel=1e-12)
    # never below one trial's own eps, nor below the steps alone
    for candidate in (A, B):
        assert held.epsilon(1e-5) > make_accountant("rdp", [*candidate, extra]).epsilon(1e-5)
    again = Accountant.from_json(json.loads(json.dumps(held.to_json())))
    assert again.epsilon(1e-5) == held.epsilon(1e-5) and again.selections == (event,)
    assert TunedSelection.from_json(event.to_json()) == event


def test_pld_refuses_a_selection_and_smallest_epsilon_never_drops_it() -> None:
    event = TunedSelection("negative_binomial", (0.0, 0.2), (A, B))
    with pytest.raises(UnsupportedEventError, match="rdp accountant"):
        make_accountant("pld", [event])
    with pytest.raises(UnsupportedEventError):
        make_accountant("gdp-clt", [A[0], event])
    held = make_accountant("rdp", [*B, event])
    eps, source = smallest_epsilon(held, 1e-5)
    assert (eps, source) == (held.epsilon(1e-5), "rdp")
    # what asking pld about the steps alone would have said: far below the selection's bound
    assert make_accountant("pld", B).epsilon(1e-5) < eps / 2


def test_bad_selections_are_refused() -> None:
    with pytest.raises(ConfigError, match="one sampling scheme"):
        TunedSelection("poisson", (3.0,), (A, (GaussianStep("fixed", 0.1, 1.0),)))
    with pytest.raises(ConfigError, match="distribution"):
        TunedSelection("geometric", (3.0,), (A,))  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="finite"):
        TunedSelection("negative_binomial", (0.0,), (A,))
    with pytest.raises(ConfigError, match="at least one candidate"):
        TunedSelection("poisson", (3.0,), ())
    with pytest.raises(ConfigError, match="mu"):
        selection_rdp(TunedSelection("poisson", (0.5,), (A,)))


def test_a_ledger_records_a_selection_under_rdp_only(tmp_path: Path) -> None:
    event = TunedSelection("negative_binomial", (0.0, 0.2), (A, B))
    alone = make_accountant("rdp", [event]).epsilon(1e-5)
    path = tmp_path / "c.jsonl"
    with PrivacyLedger.open(path, client_id="c", sampling="poisson", budget=Budget(50.0, 1e-5),
                            accountant="rdp") as ledger:
        ledger.spend_selection(event, time=0.0, round=-1)
        assert ledger.epsilon() == pytest.approx(alone, rel=1e-12)
        step = GaussianStep("poisson", 0.05, 1.0, 5)
        ledger.spend(step, time=1.0, round=0)  # later releases compose with it
        both = make_accountant("rdp", [event, step]).epsilon(1e-5)
        assert ledger.epsilon() == pytest.approx(both, rel=1e-12) and both > alone
    with PrivacyLedger.open(path, client_id="c", sampling="poisson", budget=Budget(50.0, 1e-5),
                            accountant="rdp", read_only=True) as again:
        assert again.epsilon() == pytest.approx(both, rel=1e-12)
        assert again.accountant.selections == (event,)
    with pytest.raises(LedgerError, match="tuned selection"):
        read_ledger_steps(path)  # a plain step list would leave the selection out

    pld = tmp_path / "p.jsonl"
    with PrivacyLedger.open(pld, client_id="p", sampling="poisson", budget=None) as ledger:
        before = pld.read_bytes()
        with pytest.raises(LedgerError, match="cannot hold a tuned selection"):
            ledger.spend_selection(event, time=0.0, round=-1)
        assert pld.read_bytes() == before and ledger.epsilon(1e-5) == 0.0

    tight = tmp_path / "t.jsonl"
    with PrivacyLedger.open(tight, client_id="t", sampling="poisson", budget=Budget(1.0, 1e-5),
                            accountant="rdp") as ledger:
        with pytest.raises(BudgetExhausted, match="tuned selection"):
            ledger.spend_selection(event, time=0.0, round=-1)
        assert ledger.records == () and ledger.epsilon() == 0.0
