"""The duration stop is exact: the run ends with the first window whose end is at or after
``stop.virtual_seconds``, and the stop reason says where that end was."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pytest

from fedsim.config import LoadedScenario, parse_scenario
from fedsim.config.schema import Stop
from fedsim.runtime.actors.server import WindowReport, duration_stop
from fedsim.runtime.simulated.simulation import run_scenario


def tiny(window: float, seconds: float) -> dict[str, Any]:
    return {
        "name": "tiny-stop",
        "seed": 1,
        "stop": {"virtual_seconds": seconds},
        "dataset": {"name": "synthetic", "num_samples": 300, "num_test_samples": 60,
                    "num_features": 4, "num_classes": 2},
        "model": {"name": "logreg"},
        "clients": {"groups": [
            {"name": "p", "count": 2, "data_share": 1.0, "batch_size": 10, "clip": 1.0,
             "noise": 1.0, "speed": 0.01},
        ]},
        "server": {"window": window},
    }


@pytest.mark.parametrize(("window", "seconds"), [(0.1, 30.0), (0.3, 30.0), (0.7, 30.0),
                                                  (1.1, 30.0), (1.0, 30.0), (0.25, 7.3)])
def test_run_ends_with_the_first_window_end_at_or_after_the_limit(
        window: float, seconds: float, tmp_path: Path) -> None:
    result = run_scenario(LoadedScenario(parse_scenario(tiny(window, seconds)), None),
                          tmp_path / "run", message_only=True)
    # The first k with k * window >= seconds, computed in exact decimal arithmetic.
    from fractions import Fraction

    expected_windows = math.ceil(Fraction(str(seconds)) / Fraction(str(window)))
    summary = result.summary
    assert summary["windows"] == expected_windows
    end = float(expected_windows * Fraction(str(window)))
    assert summary["virtual_time"] == pytest.approx(end, rel=1e-12)
    if end == seconds:
        assert summary["stop_reason"] == f"it reached its limit of {seconds:g} virtual seconds"
    else:
        assert summary["stop_reason"] == (
            f"window {expected_windows} ended at {end:.6g} virtual seconds, the first window end "
            f"at or after its limit of {seconds:g} s")
    assert f"because {summary['stop_reason']}" in summary["explanation"]


def test_duration_stop_tolerates_float_rounding_only() -> None:
    assert duration_stop(30.0, 300, 29.99999999999996) == "it reached its limit of 30 virtual seconds"
    assert duration_stop(30.0, 299, 29.9) == ""
    assert duration_stop(30.0, 300, 29.9999) == ""  # a real shortfall is not rounding
    stop = Stop(virtual_seconds=30.0)
    # The scheduled end decides, not the (later, wall-clock) time the window was closed at.
    late = WindowReport(window=30, time=30.4, version=30, end=30.0)
    assert late.stop_reason(stop, active_clients=1, seconds="scenario") == (
        "it reached its limit of 30 scenario seconds")
    early = WindowReport(window=29, time=30.2, version=29, end=29.0)
    assert early.stop_reason(stop, active_clients=1) == ""


@pytest.mark.parametrize(("server_reason", "client_reason"), [
    ("it reached 1200 windows", None),
    ("no client can train any more and every update has arrived", None),
    (None, "finished its 12 rounds"),
])
def test_the_explanation_names_who_ended_a_clients_run(server_reason: str | None,
                                                       client_reason: str | None) -> None:
    """A client stopped by the server's end of the run is not said to have finished its
    rounds (a deployed run's clients: issue 27, finding 12)."""
    from types import SimpleNamespace

    from fedsim.protocol.messages import RunFinished
    from fedsim.runtime.actors.client import ClientActor
    from fedsim.runtime.run_outputs import _reason_kind

    if server_reason is not None:  # the reason a client records, as the client words it
        reason = ClientActor._finished_reason(  # type: ignore[arg-type]
            SimpleNamespace(finished=RunFinished(version=856, reason=server_reason)))
        assert _reason_kind(reason) == "the server finished the run"
    else:
        assert client_reason is not None
        assert _reason_kind(client_reason) == "they finished their configured rounds"
