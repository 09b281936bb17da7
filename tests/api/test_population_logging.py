"""Per-client log events ("client stopped") at info for a few clients and at debug for a
population, whichever entry point runs the simulation (``fedsim.simulate`` included, not only
``fedsim run``: a 10^6-client run through ``run_scenario`` logged 643,444 lines at info), and
then one info line that sums the stops up."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from pathlib import Path

import pytest

import fedsim
from fedsim.logging import PER_CLIENT_INFO_LIMIT, client_event_level, set_population
from tests.api.conftest import TINY


@pytest.fixture(autouse=True)
def _restore_level() -> Iterator[None]:
    yield
    set_population(0)  # the level is process-wide: leave the default for later tests


@pytest.mark.parametrize("count", [2, PER_CLIENT_INFO_LIMIT])
def test_simulate_logs_each_stop_for_a_few_clients_and_a_summary_for_many(
    tmp_path: Path, count: int, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    result = fedsim.simulate(TINY, seed=1, out=tmp_path / "run", plots=False,
                             overrides={"clients.groups[*].count": count, "stop.windows": 2,
                                        "clients.groups[*].batch_size": 4,
                                        "clients.groups[*].budget.epsilon": 0.05})
    clients = 2 * count
    expected = logging.DEBUG if clients > PER_CLIENT_INFO_LIMIT else logging.INFO
    assert client_event_level() == expected
    stops = [r for r in caplog.records if "client stopped" in r.getMessage()]
    stopped = sum(c.state == "budget_exhausted" for c in result.clients)
    assert stopped > 0 and len(stops) == stopped
    assert {r.levelno for r in stops} == {expected}
    (summary,) = [r for r in caplog.records if f"{stopped} clients stopped" in r.getMessage()]
    assert summary.levelno == logging.INFO


def test_simulate_warns_of_clients_that_cannot_afford_a_round(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """As `fedsim run` does, before anything trains (a researcher's review found simulate
    silent: the group's clients just ended with no rounds)."""
    caplog.set_level(logging.WARNING)
    result = fedsim.simulate(TINY, seed=1, plots=False,
                             overrides={"stop.windows": 2,
                                        "clients.groups[*].budget.epsilon": 0.0001})
    assert all(c.rounds == 0 for c in result.clients)
    warnings = [r for r in caplog.records if "cannot afford a single round" in r.getMessage()]
    assert warnings and {r.levelno for r in warnings} == {logging.WARNING}
