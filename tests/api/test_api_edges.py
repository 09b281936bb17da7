"""Edges of the Python API a first-time user found (review stranger 61): the progress bar's
total is the run's horizon (as ``fedsim run``'s), and bad arguments are clear errors."""

from __future__ import annotations

import copy
from typing import Any

import pytest

import fedsim
from fedsim.config import parse_scenario
from fedsim.config.loading import LoadedScenario
from fedsim.reporting import progress as progress_module
from fedsim.reporting.horizon import run_horizon
from fedsim.runtime.population import build_population

from .conftest import TINY


def _tiny(**stop: Any) -> dict[str, Any]:
    data = copy.deepcopy(TINY)
    data["stop"] = stop
    data["server"] = {"window": 0.5}  # seconds differ from windows
    return data


def _bar_totals(monkeypatch: pytest.MonkeyPatch) -> list[list[float | None]]:
    """Every bar's totals in order: the one it starts with, then each set_total."""
    bars: list[list[float | None]] = []
    real = progress_module.RunProgress

    class Recording(real):  # type: ignore[misc,valid-type]
        def __init__(self, total: float | None, **kwargs: Any) -> None:
            bars.append([total])
            super().__init__(total, **kwargs)

        def set_total(self, total: float | None) -> None:
            bars[-1].append(total)
            super().set_total(total)

    monkeypatch.setattr(progress_module, "RunProgress", Recording)
    return bars


@pytest.mark.parametrize(("stop", "source"), [
    ({"windows": 5}, "windows"),  # budgets far away: the windows end it
    ({"all_budgets_spent": True}, "budgets"),  # no hard stop: the budgets' estimated end
])
def test_simulates_bar_total_is_the_run_horizon(monkeypatch: pytest.MonkeyPatch,
                                                stop: dict[str, Any], source: str) -> None:
    data = _tiny(**stop)
    if source == "budgets":
        for group in data["clients"]["groups"]:
            group["budget"]["epsilon"] = 1.0
    else:
        for group in data["clients"]["groups"]:
            group["budget"]["epsilon"] = 100.0
    scenario = parse_scenario(data)
    population = build_population(LoadedScenario(scenario, None))
    horizon = run_horizon(scenario, [(p.group, p.num_samples) for p in population.plans])
    assert horizon.source == source and horizon.seconds is not None

    bars = _bar_totals(monkeypatch)
    result = fedsim.simulate(data, progress=False)
    assert len(bars) == 1
    assert bars[0][0] == pytest.approx(horizon.seconds)  # not 1200 nor the window count
    assert bars[0][-1] == pytest.approx(result.virtual_time)  # and it ends at the real end
