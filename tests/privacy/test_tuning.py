"""The Renyi DP of private hyperparameter tuning (fedsim.privacy.tuning, Papernot & Steinke).

Independent checks: the truncated negative binomial's mean against a brute-force sum of its
probabilities; Theorem 2 against dp_accounting's separate implementation; both theorems against
the exact Renyi divergence of the tuned mechanism built by brute force from a tiny base
mechanism (a noisy score on 4 values); and the tuned eps never below one trial's own eps.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from dp_accounting.rdp import rdp_privacy_accountant as dpa

from fedsim.errors import ConfigError
from fedsim.privacy.rdp import poisson_rdp
from fedsim.privacy.rdp_conversion import epsilon_optimal
from fedsim.privacy.tuning import (
    PoissonTrials,
    TruncatedNegativeBinomial,
    base_rdp,
    tuned_epsilon,
    tuned_rdp,
)

ORDERS = np.array([1.25, 1.5, 1.75, 2, 2.5, 3, 4, 5, 6, 8, 10, 12, 16, 20, 32, 48, 64])


@pytest.mark.parametrize("eta", [-0.5, 0.0, 0.5, 1.0, 3.0])
@pytest.mark.parametrize("gamma", [0.05, 0.3])
def test_truncated_negative_binomial_mean_is_the_sum_of_its_probabilities(eta: float,
                                                                          gamma: float) -> None:
    d = TruncatedNegativeBinomial(eta, gamma)
    k = np.arange(1, 20_000)
    p = d.pmf(k)
    assert p.sum() == pytest.approx(1.0, abs=1e-12)
    assert (k * p).sum() == pytest.approx(d.mean, rel=1e-10)
    assert TruncatedNegativeBinomial.with_mean(eta, d.mean).gamma == pytest.approx(gamma, rel=1e-9)


@pytest.mark.parametrize("eta", [0.0, 0.5, 1.0, 2.0])
def test_theorem_2_matches_dp_accounting(eta: float) -> None:
    base = poisson_rdp(0.01, 1.0, ORDERS) * 1000
    trials = TruncatedNegativeBinomial.with_mean(eta, 10.0)
    theirs = dpa._compute_rdp_repeat_and_select(ORDERS, base, 10.0, eta)  # noqa: SLF001
    assert tuned_rdp(ORDERS, base, trials) == pytest.approx(theirs, rel=1e-7)


def test_theorem_6_is_at_most_dp_accounting_classic_delta_hat() -> None:
    """The same formula; fedsim's delta_hat comes from the optimal conversion, never larger."""
    base = poisson_rdp(0.01, 1.0, ORDERS) * 1000
    ours = tuned_rdp(ORDERS, base, PoissonTrials(10.0))
    theirs = dpa._compute_rdp_repeat_and_select(ORDERS, base, 10.0, math.inf)  # noqa: SLF001
    assert np.all(ours <= theirs * (1 + 1e-9))
    assert np.all(ours >= base)


def _renyi(p: np.ndarray, q: np.ndarray, order: float) -> float:
    used = (p > 0) | (q > 0)  # outcomes impossible under both carry no mass
    return float(math.log(np.sum(p[used] ** order * q[used] ** (1 - order))) / (order - 1))


def _best_of(p: np.ndarray, weights: dict[int, float]) -> np.ndarray:
    """Output law of "run K times, release the best score" (scores 0..n-1; K = 0 releases a
    symbol of its own, the last entry)."""
    cdf = np.cumsum(p)
    below = np.concatenate([[0.0], cdf[:-1]])
    out = np.zeros(p.size + 1)
    for k, w in weights.items():
        if k == 0:
            out[-1] += w
        else:
            out[:-1] += w * (cdf ** k - below ** k)
    return out


BASES = [  # (P, Q): a tiny mechanism's score laws on two neighbouring data sets
    (np.array([0.4, 0.3, 0.2, 0.1]), np.array([0.3, 0.3, 0.2, 0.2])),
    (np.array([0.7, 0.1, 0.1, 0.1]), np.array([0.5, 0.2, 0.1, 0.2])),
    (np.array([0.25, 0.25, 0.25, 0.25]), np.array([0.1, 0.2, 0.3, 0.4])),
]


@pytest.mark.parametrize(("p", "q"), BASES)
@pytest.mark.parametrize("trials", [TruncatedNegativeBinomial(1.0, 0.2),
                                    TruncatedNegativeBinomial(0.0, 0.05),
                                    TruncatedNegativeBinomial(-0.5, 0.1),
                                    PoissonTrials(3.0), PoissonTrials(10.0)])
def test_theorems_bound_the_exact_renyi_divergence_of_the_tuned_mechanism(
        p: np.ndarray, q: np.ndarray, trials: object) -> None:
    base = np.array([max(_renyi(p, q, a), _renyi(q, p, a)) for a in ORDERS])
    if isinstance(trials, PoissonTrials):
        ks = np.arange(0, 200)
        w = np.exp(ks * math.log(trials.mu) - trials.mu - np.array(
            [math.lgamma(k + 1) for k in ks]))
    else:
        assert isinstance(trials, TruncatedNegativeBinomial)
        ks = np.arange(1, 3000)
        w = trials.pmf(ks)
    weights = dict(zip(ks.tolist(), w.tolist(), strict=True))
    tuned_p, tuned_q = _best_of(p, weights), _best_of(q, weights)
    exact = np.array([max(_renyi(tuned_p, tuned_q, a), _renyi(tuned_q, tuned_p, a))
                      for a in ORDERS])
    bound = tuned_rdp(ORDERS, base, trials)  # type: ignore[arg-type]
    assert np.all(exact <= bound + 1e-12)
    assert np.all(exact > 0) and np.all(np.isfinite(bound))


@pytest.mark.parametrize("trials", [TruncatedNegativeBinomial.with_mean(0.0, 5.0),
                                    TruncatedNegativeBinomial.with_mean(1.0, 20.0),
                                    PoissonTrials(1.0), PoissonTrials(30.0)])
@pytest.mark.parametrize(("q", "sigma", "steps"), [(0.01, 1.0, 500), (0.05, 2.0, 100)])
def test_tuned_epsilon_is_never_below_one_trials_own(trials: object, q: float, sigma: float,
                                                     steps: int) -> None:
    candidates = [poisson_rdp(q, sigma, ORDERS) * steps,
                  poisson_rdp(q, sigma * 1.2, ORDERS) * steps]
    curve = base_rdp(candidates)
    trial_eps = epsilon_optimal(ORDERS, curve, 1e-5)[0]
    total = tuned_epsilon(ORDERS, curve, trials, 1e-5)  # type: ignore[arg-type]
    assert total >= trial_eps
    for candidate in candidates:
        assert total >= epsilon_optimal(ORDERS, candidate, 1e-5)[0]


def test_bad_input_is_refused() -> None:
    with pytest.raises(ConfigError):
        TruncatedNegativeBinomial(-1.0, 0.5)
    with pytest.raises(ConfigError):
        TruncatedNegativeBinomial(1.0, 1.0)
    with pytest.raises(ConfigError):
        PoissonTrials(0.5)
    with pytest.raises(ConfigError):
        tuned_rdp([0.5, 2.0], [0.1, 0.2], PoissonTrials(2.0))
    with pytest.raises(ConfigError):
        base_rdp([])
