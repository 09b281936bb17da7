"""Contract properties every accountant must satisfy (hypothesis)."""

from __future__ import annotations

import json

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fedsim.errors import UnsupportedEventError
from fedsim.privacy.accountant import Accountant, make_accountant
from fedsim.privacy.events import GaussianStep, group_steps

# The rdp accountant has its own property tests (tests/privacy/test_rdp_*.py).
NAMES = ["pld", "gdp-clt"]
DELTA = 1e-5
FAST = settings(max_examples=12, deadline=None,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])

qs = st.floats(0.001, 0.2)
sigmas = st.floats(0.6, 5.0)
counts = st.integers(1, 2000)
samplings = st.sampled_from(["poisson", "fixed"])


def eps(name: str, steps: list[GaussianStep]) -> float:
    return make_accountant(name, steps).epsilon(DELTA)


@pytest.mark.parametrize("name", NAMES)
@FAST
@given(sampling=samplings, q=qs, sigma=sigmas, count=counts, factor=st.floats(1.01, 2.0))
def test_eps_decreases_with_sigma(name: str, sampling: str, q: float, sigma: float, count: int,
                                  factor: float) -> None:
    assert eps(name, [GaussianStep(sampling, q, sigma * factor, count)]) <= \
        eps(name, [GaussianStep(sampling, q, sigma, count)])


@pytest.mark.parametrize("name", NAMES)
@FAST
@given(sampling=samplings, q=qs, sigma=sigmas, count=counts, extra=st.integers(1, 2000))
def test_eps_increases_with_steps(name: str, sampling: str, q: float, sigma: float, count: int,
                                  extra: int) -> None:
    assert eps(name, [GaussianStep(sampling, q, sigma, count)]) <= \
        eps(name, [GaussianStep(sampling, q, sigma, count + extra)])


@pytest.mark.parametrize("name", NAMES)
@FAST
@given(sampling=samplings, q=qs, sigma=sigmas, count=counts, factor=st.floats(1.01, 3.0))
def test_eps_increases_with_q(name: str, sampling: str, q: float, sigma: float, count: int,
                              factor: float) -> None:
    assert eps(name, [GaussianStep(sampling, q, sigma, count)]) <= \
        eps(name, [GaussianStep(sampling, min(1.0, q * factor), sigma, count)])


step_lists = st.lists(st.builds(lambda q, s, n: GaussianStep("poisson", q, s, n), qs, sigmas,
                                st.integers(1, 300)), min_size=1, max_size=4)


@pytest.mark.parametrize("name", NAMES)
@FAST
@given(steps=step_lists, cut=st.integers(0, 4))
def test_order_does_not_matter(name: str, steps: list[GaussianStep], cut: int) -> None:
    forward = make_accountant(name, steps)
    backward = make_accountant(name)
    backward.compose(steps[cut:])
    backward.compose(list(reversed(steps[:cut])))
    assert forward.steps == backward.steps
    assert forward.epsilon(DELTA) == backward.epsilon(DELTA)


@pytest.mark.parametrize("name", NAMES)
@FAST
@given(kinds=step_lists, picks=st.lists(st.integers(0, 3), min_size=1, max_size=30))
def test_one_step_at_a_time_equals_the_grouped_history(name: str, kinds: list[GaussianStep],
                                                       picks: list[int]) -> None:
    # A round at a time, kinds recurring (the count-bumping path of compose), against
    # group_steps of the whole history and an accountant built from it in one go.
    history = [kinds[i % len(kinds)] for i in picks]
    stepwise = make_accountant(name)
    for step in history:
        stepwise.compose([step])
    assert stepwise.steps == group_steps(history)
    assert stepwise.epsilon(DELTA) == make_accountant(name, history).epsilon(DELTA)


@pytest.mark.parametrize("name", NAMES)
@FAST
@given(steps=step_lists)
def test_json_round_trip_is_exact(name: str, steps: list[GaussianStep]) -> None:
    original = make_accountant(name, steps)
    restored = Accountant.from_json(json.loads(json.dumps(original.to_json())))
    assert type(restored) is type(original)
    assert restored.steps == original.steps and restored.settings() == original.settings()
    assert restored.epsilon(DELTA) == original.epsilon(DELTA)


@pytest.mark.parametrize("name", NAMES)
@FAST
@given(steps=step_lists)
def test_rejected_event_leaves_state_unchanged(name: str, steps: list[GaussianStep]) -> None:
    accountant = make_accountant(name, steps)
    before = (accountant.steps, accountant.epsilon(DELTA))
    with pytest.raises(UnsupportedEventError):
        accountant.compose([GaussianStep("poisson", 0.1, 1.0), GaussianStep("fixed", 0.1, 1.0)])
    with pytest.raises(UnsupportedEventError):
        accountant.compose([GaussianStep("fixed", 0.1, 1.0)])
    assert (accountant.steps, accountant.epsilon(DELTA)) == before


@pytest.mark.parametrize("name", NAMES)
def test_preview_does_not_touch_the_accountant(name: str) -> None:
    accountant = make_accountant(name, [GaussianStep("poisson", 0.01, 1.0, 100)])
    before = accountant.epsilon(DELTA)
    twin = accountant.preview([GaussianStep("poisson", 0.01, 1.0, 100)])
    assert twin.epsilon(DELTA) > before == accountant.epsilon(DELTA)
    assert accountant.total_steps == 100
