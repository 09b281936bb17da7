"""Per-client log events ("client stopped") at info for a few clients and at debug for a
population, whichever entry point runs the simulation (``fedsim.simulate`` included, not only
``fedsim run``): a 10^6-client run through ``run_scenario`` logged 643,444 lines at info."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

import fedsim
from fedsim.logging import PER_CLIENT_INFO_LIMIT, client_event_level
from tests.api.conftest import TINY


@pytest.mark.parametrize("count", [2, PER_CLIENT_INFO_LIMIT])
def test_simulate_sets_the_per_client_level_from_the_population(
    tmp_path: Path, count: int
) -> None:
    fedsim.simulate(TINY, seed=1, out=tmp_path / "run", plots=False,
                    overrides={"clients.groups[*].count": count, "stop.windows": 2,
                               "clients.groups[*].batch_size": 4})
    clients = 2 * count
    expected = logging.DEBUG if clients > PER_CLIENT_INFO_LIMIT else logging.INFO
    assert client_event_level() == expected
