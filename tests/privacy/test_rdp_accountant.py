"""The ``rdp`` accountant: interface contract, JSON state, properties, trade-off curve."""

from __future__ import annotations

import json
import math
import time

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy.stats import norm

from fedsim.errors import ConfigError, UnsupportedEventError
from fedsim.privacy.accountant import Accountant, make_accountant
from fedsim.privacy.events import GaussianStep
from fedsim.privacy.rdp import RDPAccountant

# a coarse grid keeps the property tests fast; every property holds on any grid
FAST_ORDERS = [1.25, 1.5, 1.75, 2.0, 2.5, 3.0, 4.0, 5.0, 6.0, 8.0, 10.0, 12.0, 16.0, 20.0,
               24.0, 32.0, 48.0, 64.0, 128.0, 256.0]
DELTA = 1e-5

sigmas = st.sampled_from([0.7, 0.9, 1.1, 1.5, 2.0, 3.0])
rates = st.sampled_from([0.001, 0.004, 0.01, 0.05, 0.2])
counts = st.integers(min_value=1, max_value=5000)


def _accountant(steps: list[GaussianStep]) -> RDPAccountant:
    return RDPAccountant(steps, orders=FAST_ORDERS)


def test_registered_under_rdp_and_a_guarantee() -> None:
    acc = make_accountant("rdp", [GaussianStep("poisson", 0.01, 1.0, 100)])
    assert isinstance(acc, RDPAccountant)
    assert acc.is_guarantee
    assert acc.epsilon(DELTA) == acc.epsilon_optimal(DELTA) < acc.epsilon_classic(DELTA)
    assert acc.delta(1.0) <= acc.delta_classic(1.0)
    assert acc.best_order(DELTA) in acc.orders


def test_empty_history_is_perfectly_private() -> None:
    acc = RDPAccountant()
    assert acc.epsilon(DELTA) == 0.0 and acc.epsilon_classic(DELTA) == 0.0
    assert acc.delta(0.5) == 0.0
    assert acc.best_order(DELTA) is None
    alpha = np.linspace(0, 1, 5)
    np.testing.assert_array_equal(acc.tradeoff(alpha), 1 - alpha)


@settings(max_examples=10, deadline=None)
@given(q=rates, sigma=sigmas, count=counts, delta=st.sampled_from([1e-3, 1e-6]))
def test_json_round_trip_is_exact(q: float, sigma: float, count: int, delta: float) -> None:
    acc = _accountant([GaussianStep("poisson", q, sigma, count), GaussianStep("poisson", q, 2 * sigma)])
    state = json.loads(json.dumps(acc.to_json()))
    twin = Accountant.from_json(state)
    assert isinstance(twin, RDPAccountant)
    assert twin.to_json() == acc.to_json()
    assert twin.epsilon(delta) == acc.epsilon(delta)
    assert twin.epsilon_classic(delta) == acc.epsilon_classic(delta)


@settings(max_examples=10, deadline=None)
@given(q=rates, sigma=sigmas, count=counts)
def test_epsilon_decreases_with_sigma(q: float, sigma: float, count: int) -> None:
    noisier = _accountant([GaussianStep("poisson", q, sigma * 1.2, count)]).epsilon(DELTA)
    assert noisier <= _accountant([GaussianStep("poisson", q, sigma, count)]).epsilon(DELTA)


@settings(max_examples=10, deadline=None)
@given(q=rates, sigma=sigmas, count=counts)
def test_epsilon_increases_with_steps_and_rate(q: float, sigma: float, count: int) -> None:
    base = _accountant([GaussianStep("poisson", q, sigma, count)]).epsilon(DELTA)
    assert _accountant([GaussianStep("poisson", q, sigma, count + 50)]).epsilon(DELTA) >= base
    assert _accountant([GaussianStep("poisson", min(1.0, 1.5 * q), sigma, count)]).epsilon(DELTA) >= base


@settings(max_examples=8, deadline=None)
@given(st.lists(st.tuples(rates, sigmas, st.integers(1, 300)), min_size=1, max_size=4))
def test_composition_order_does_not_matter(spec: list[tuple[float, float, int]]) -> None:
    steps = [GaussianStep("fixed", q, s, n) for q, s, n in spec]
    forward = _accountant(steps)
    backward = _accountant([])
    for step in reversed(steps):
        backward.compose([step])
    np.testing.assert_allclose(backward.rdp(), forward.rdp(), rtol=1e-12)
    assert backward.epsilon(DELTA) == pytest.approx(forward.epsilon(DELTA), rel=1e-12)


def test_preview_and_rejected_events_leave_state_unchanged() -> None:
    acc = _accountant([GaussianStep("poisson", 0.01, 1.0, 100)])
    before = (acc.to_json(), acc.epsilon(DELTA))
    bigger = acc.preview([GaussianStep("poisson", 0.01, 1.0, 900)])
    assert bigger.epsilon(DELTA) > before[1]
    with pytest.raises(UnsupportedEventError):
        acc.compose([GaussianStep("fixed", 0.01, 1.0, 10)])
    assert (acc.to_json(), acc.epsilon(DELTA)) == before


def test_tradeoff_is_a_valid_lower_bound_for_the_gaussian() -> None:
    """q = 1: the true curve is G_mu with mu = sqrt(T)/sigma; the RDP bound must lie below
    it, be a trade-off function (non-increasing, within [0, 1 - alpha]) and not be trivial."""
    sigma, steps = 4.0, 16
    acc = RDPAccountant([GaussianStep("poisson", 1.0, sigma, steps)])
    alpha = np.linspace(0.0, 1.0, 201)
    beta = acc.tradeoff(alpha)
    mu = math.sqrt(steps) / sigma
    exact = norm.cdf(norm.ppf(1 - alpha) - mu)
    assert np.all(beta <= exact + 1e-12)
    assert np.all(beta <= 1 - alpha + 1e-12) and np.all(np.diff(beta) <= 1e-12)
    assert beta[20] > 0.5 * exact[20]  # alpha = 0.1: informative, not the trivial 0


@pytest.mark.parametrize(("sampling", "sigma", "epochs", "tight"), [
    ("poisson", 1.3, 15, 0.8645), ("poisson", 1.1, 60, 2.3817),   # issue 2 (pld, Poisson)
    ("fixed", 1.3, 15, 1.067), ("fixed", 1.1, 60, 3.069),          # Dong-Roth-Su Thm 5.1
])
def test_never_below_the_tight_mnist_values(sampling: str, sigma: float, epochs: int,
                                            tight: float) -> None:
    """RDP is a guarantee: on the Dong-Roth-Su MNIST runs (n=60000, m=256, delta=1e-5) it
    stays above the tight values, and the optimal conversion closes part of the gap."""
    steps = round(epochs * 60000 / 256)
    acc = RDPAccountant([GaussianStep(sampling, 256 / 60000, sigma, steps)])  # type: ignore[arg-type]
    optimal, classic = acc.epsilon(DELTA), acc.epsilon_classic(DELTA)
    assert tight < optimal < classic < 1.5 * tight


def test_orders_setting_round_trips_and_is_validated() -> None:
    acc = RDPAccountant(orders=[1.5, 2.0, 64.0])
    assert acc.settings() == {"orders": [1.5, 2.0, 64.0]}
    with pytest.raises(ConfigError):
        RDPAccountant(orders=[0.5, 2.0])
    with pytest.raises(ConfigError):
        RDPAccountant(orders=[])
    with pytest.raises(ConfigError):
        RDPAccountant().epsilon(0.0)
    with pytest.raises(ConfigError):
        RDPAccountant().tradeoff(np.array([1.5]))


def test_epsilon_of_a_few_distinct_steps_is_fast() -> None:
    """Per-step curves are cached by step key; the conversion itself takes milliseconds."""
    steps = [GaussianStep("poisson", 256 / 60000, s, 1000) for s in (0.8, 1.1, 1.4)]
    RDPAccountant(steps).epsilon(DELTA)  # fills the per-step cache
    start = time.perf_counter()
    acc = RDPAccountant(steps)
    acc.epsilon(DELTA)
    acc.delta(1.0)
    assert time.perf_counter() - start < 1.0
