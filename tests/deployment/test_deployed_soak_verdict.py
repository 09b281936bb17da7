"""The deployed soak's verdict (benchmarks/deployed_soak.py): it calls a flat run flat, and a
growing resident set, a stalled window rate or a checkpoint that slows down not flat; the
committed result's verdict is the one its own series gives."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import numpy as np

REPO = Path(__file__).resolve().parents[2]
RESULT = REPO / "benchmarks" / "results" / "deployed_soak.json"


sys.path.insert(0, str(REPO / "benchmarks"))  # as the benchmarks import each other

import deployed_soak as soak  # noqa: E402


def _series(minutes: int = 30, **change: Any) -> list[dict[str, Any]]:
    """A flat run with a little noise; ``change`` maps a field to a per-minute function."""
    rng = np.random.default_rng(1)
    series = []
    for m in range(minutes):
        sample = {
            "server_rss_mb": 320 + rng.normal(0, 0.5),
            "broker_rss_mb": 10 + rng.normal(0, 0.05),
            "windows": int(60 + rng.integers(-1, 2)),
            "applied": int(120_000 + rng.normal(0, 3_000)),
            "checkpoint_max_s": 0.03 + abs(rng.normal(0, 0.005)),
        }
        for key, f in change.items():
            sample[key] = f(m, sample[key])
        series.append(sample)
    return series


def test_a_flat_run_is_flat() -> None:
    verdict = soak.verdict(_series())
    assert verdict["flat"], verdict
    assert verdict["samples_judged"] == 20  # the last two thirds of 30 minutes


def test_a_resident_set_growing_one_mib_a_minute_is_not_flat() -> None:
    # 20 MiB over the last 20 minutes of ~330 MiB: a 6 % drift, above the 5 % tolerance.
    verdict = soak.verdict(_series(server_rss_mb=lambda m, v: v + m))
    assert not verdict["checks"]["server_rss_flat"]
    assert verdict["server_rss_drift_over_tail"] > 0.05
    assert not verdict["flat"]


def test_a_stalled_minute_and_a_slowing_checkpoint_are_caught() -> None:
    stalled = soak.verdict(_series(windows=lambda m, v: 40 if m == 25 else v))
    assert not stalled["checks"]["window_rate_stable"] and not stalled["flat"]
    slowing = soak.verdict(_series(checkpoint_max_s=lambda m, v: v * (1 + m / 3)))
    assert not slowing["checks"]["checkpoint_time_flat"] and not slowing["flat"]


def test_the_committed_result_is_its_own_series_verdict() -> None:
    result = json.loads(RESULT.read_text(encoding="utf-8"))
    assert result["commit"]
    assert result["minutes"] >= 30 and len(result["series"]) >= 30
    assert result["verdict"] == soak.verdict(result["series"])
