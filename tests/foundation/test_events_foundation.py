"""The event layer: validation, grouping, JSON."""

from __future__ import annotations

import math

import pytest

from fedsim.errors import ConfigError
from fedsim.privacy.events import GaussianStep, group_steps


def test_grouping_merges_identical_steps_and_is_order_independent():
    a, b = GaussianStep("poisson", 0.01, 1.0), GaussianStep("poisson", 0.01, 2.0, 5)
    assert group_steps([a, b, a.times(2)]) == group_steps([a.times(3), b])
    assert sum(s.count for s in group_steps([a, b, a])) == 7


@pytest.mark.parametrize("bad", [
    dict(sampling="uniform", q=0.1, sigma=1.0),
    dict(sampling="poisson", q=0.0, sigma=1.0),
    dict(sampling="poisson", q=1.5, sigma=1.0),
    dict(sampling="poisson", q=0.1, sigma=0.0),
    dict(sampling="poisson", q=0.1, sigma=math.nan),
    dict(sampling="fixed", q=0.1, sigma=1.0, count=0),
    dict(sampling="fixed", q=0.1, sigma=1.0, count=True),
])
def test_invalid_steps_are_config_errors(bad):
    with pytest.raises(ConfigError):
        GaussianStep(**bad)


def test_json_round_trip_and_unknown_keys():
    step = GaussianStep("fixed", 256 / 60000, 1.1, 14063)
    assert GaussianStep.from_json(step.to_json()) == step
    with pytest.raises(ConfigError, match="unknown keys"):
        GaussianStep.from_json({**step.to_json(), "eps": 1})
