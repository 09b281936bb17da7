"""A server step's direction and bound (fedsim.runtime.actors.server_mix), against the
formulas written out by hand: ``d = sum_i S(s_i) lambda_i eta_i u_i`` with ``lambda_i``
normalised over the mix or the population, an aggregation node's group ``S(s) / total`` times
its weighted sum, and ``D = sum_i |c_i| eta_i bound_i``."""

from __future__ import annotations

import numpy as np
import pytest

from fedsim.aggregation import AcceptedUpdate
from fedsim.aggregation.mixing import DataSizeWeights
from fedsim.aggregation.policies import PolynomialStaleness, TimeWindows
from fedsim.runtime.actors.partials import PartialGroup
from fedsim.runtime.actors.server_mix import mix_updates, mix_with_partials

SIZE = 7
VERSION = 5


def _accepted(rng: np.random.Generator) -> list[tuple[AcceptedUpdate, float | None]]:
    return [(AcceptedUpdate(f"c{k}", k, rng.standard_normal(SIZE).astype(np.float32),
                            num_samples=10 * (k + 1), step_size=0.1 * (k + 1),
                            base_version=VERSION - k), 2.0 + k) for k in range(3)]


@pytest.mark.parametrize("total", [None, 200.0])
def test_a_mix_is_the_staleness_weighted_sum_and_its_bound(total: float | None) -> None:
    rng = np.random.default_rng(0)
    accepted = _accepted(rng)
    policy = TimeWindows(PolynomialStaleness(0.5))
    mix = mix_updates(DataSizeWeights(), policy, total, VERSION, accepted)
    samples = [a.num_samples for a, _ in accepted]
    denominator = sum(samples) if total is None else total
    coefficients = [n / denominator * (k + 1.0) ** -0.5 for k, n in enumerate(samples)]
    want = sum(c * a.step_size * a.update.astype(np.float64)
               for c, (a, _) in zip(coefficients, accepted, strict=True))
    np.testing.assert_allclose(mix.direction, want, rtol=1e-12)
    assert mix.bound == pytest.approx(sum(c * a.step_size * b for c, (a, b)
                                          in zip(coefficients, accepted, strict=True)))
    assert mix.entries == [(f"c{k}", k, VERSION - k) for k in range(3)]
    # one client whose posture the server does not know: no bound
    unknown = [*accepted[:2], (accepted[2][0], None)]
    assert mix_updates(DataSizeWeights(), policy, total, VERSION, unknown).bound is None


def test_groups_of_aggregation_nodes_join_the_mix_at_their_share_of_the_total() -> None:
    rng = np.random.default_rng(1)
    accepted = _accepted(rng)
    policy = TimeWindows(PolynomialStaleness(1.0))
    summed = rng.standard_normal(SIZE).astype(np.float32)
    group = PartialGroup(VERSION - 3, summed, 40.0, 1.5, [])
    mix = mix_with_partials(DataSizeWeights(), policy, None, VERSION, SIZE, accepted, [group])
    total = sum(a.num_samples for a, _ in accepted) + 40.0  # the direct and the group's weights
    direct = mix_updates(DataSizeWeights(), policy, total, VERSION, accepted)
    factor = 1.0 / total / 4.0  # S(3) = 1/4
    np.testing.assert_allclose(mix.direction, direct.direction + factor * summed.astype(np.float64),
                               rtol=1e-12)
    assert direct.bound is not None
    assert mix.bound == pytest.approx(direct.bound + factor * 1.5)
    # a group alone (no direct update), and a group whose bound is not known
    alone = mix_with_partials(DataSizeWeights(), policy, None, VERSION, SIZE, [],
                              [group._replace(bound=None)])
    np.testing.assert_allclose(alone.direction, summed / 40.0 / 4.0, rtol=1e-6)
    assert alone.bound is None and alone.entries == []
