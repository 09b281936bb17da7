"""Edges of the Python API a first-time user found (review stranger 61): the progress bar's
total is the run's horizon (as ``fedsim run``'s), and bad arguments are clear errors."""

from __future__ import annotations

import copy
import subprocess
import sys
from typing import Any

import numpy as np
import pytest

import fedsim
from fedsim.config import parse_scenario
from fedsim.config.loading import LoadedScenario
from fedsim.errors import ConfigError
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


def test_overrides_take_path_value_pairs_and_name_the_forms_otherwise() -> None:
    loaded = fedsim.load_scenario(TINY, [("stop.windows", 3), "seed=4"])
    assert (loaded.scenario.stop.windows, loaded.scenario.seed) == (3, 4)
    assert fedsim.load_scenario(TINY, {"stop.windows": np.int64(5)}).scenario.stop.windows == 5
    for bad in ([5], [("stop.windows",)], 5, [(3, 4)]):
        with pytest.raises(ConfigError, match=r"overrides.*(path, value)|path must be a string"):
            fedsim.load_scenario(TINY, bad)  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="must be a YAML value"):
        fedsim.load_scenario(TINY, {"stop.windows": object()})


@pytest.mark.parametrize(("seed", "message"), [
    ("abc", "seed: .*integer"),
    (1.7, "seed: .*fractional"),
    (True, "seed: must be a number, not a boolean"),
    (-1, "seed: must be >= 0"),
])
def test_simulates_seed_is_checked_as_the_scenario_field(seed: object, message: str) -> None:
    with pytest.raises(fedsim.ScenarioError, match=message):
        fedsim.simulate(TINY, seed=seed, progress=False)  # type: ignore[arg-type]
    # The same value in the scenario is refused the same way (one definition).
    with pytest.raises(fedsim.ScenarioError, match=message):
        fedsim.load_scenario({**TINY, "seed": seed})


def test_simulate_takes_a_numpy_seed() -> None:
    assert fedsim.simulate(_tiny(windows=1), seed=np.int64(3), progress=False).summary["seed"] == 3


@pytest.mark.parametrize(("arguments", "name"), [
    ({"q": "0.01", "sigma": 1.0, "steps": 10}, "q"),
    ({"q": 0.01, "sigma": "1", "steps": 10}, "sigma"),
    ({"q": 0.01, "sigma": 1.0, "steps": "10"}, "steps"),
    ({"q": 0.01, "sigma": 1.0, "steps": 10.5}, "steps"),
    ({"q": 0.01, "sigma": 1.0, "steps": True}, "steps"),
    ({"q": 0.01, "sigma": 1.0, "steps": 10, "delta": "1e-5"}, "delta"),
])
def test_account_names_an_argument_of_the_wrong_type(arguments: dict[str, Any], name: str) -> None:
    with pytest.raises(ConfigError, match=f"^{name}: expected a"):
        fedsim.account(**arguments)
    assert fedsim.account(q=0.01, sigma=1.0, steps=np.int64(10))["epsilon"] > 0


def test_the_errors_are_importable_from_fedsim_without_torch() -> None:
    code = ("import sys, fedsim\n"
            "from fedsim import ConfigError, DataError, FedsimError, ModelError, ScenarioError\n"
            "import fedsim.config.loading as loading, fedsim.errors as errors\n"
            "assert ScenarioError is loading.ScenarioError and ModelError is errors.ModelError\n"
            "assert issubclass(ScenarioError, ConfigError) and issubclass(DataError, FedsimError)\n"
            "assert 'torch' not in sys.modules\n")
    subprocess.run([sys.executable, "-c", code], check=True)
