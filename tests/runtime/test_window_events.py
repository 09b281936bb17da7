"""Per-message events are counted, not logged one by one (issue 24, item 4): a window's
duplicates, stale updates and rejections are in its report (metrics.jsonl) and in one line
per window (at info where one was stale or refused); each duplicate is logged at debug only."""

from __future__ import annotations

import numpy as np
from structlog.testing import capture_logs

from fedsim.protocol.messages import ClientUpdate
from tests.runtime.test_integrity import _server


def _update(client: str, round_: int, values: list[float], base: int = 0) -> ClientUpdate:
    return ClientUpdate(client, round_, base, np.asarray(values, np.float32), 32.0)


def test_duplicates_are_counted_per_window_and_logged_once() -> None:
    server, _ = _server()
    first = _update("a", 0, [0.1, 0.0, 0.0])
    server._inbox = [first, first, first, _update("b", 0, [0.0, 0.1, 0.0]), first]
    with capture_logs() as logs:
        report = server.close_window()
    assert report.applied == 2 and report.duplicate == 3 and report.rejected == 0
    # Duplicates alone (a lossy network's, which the scenario asks for): one line, at debug.
    assert [e for e in logs if e["log_level"] != "debug"] == []
    [summary] = [e for e in logs if e["event"] == "window events"]
    assert summary["duplicate"] == 3 and summary["window"] == 1 and summary["rejected"] == 0
    duplicates = [e for e in logs if e["event"].startswith("duplicate update ignored")]
    assert len(duplicates) == 3 and all(e["log_level"] == "debug" for e in duplicates)
    line = report.metrics_line(rejected=report.rejected, dropped_in_flight=0, active_clients=2,
                               min_remaining_epsilon=None)
    assert line["duplicate"] == 3


def test_a_quiet_window_logs_nothing_and_rejections_are_in_the_line() -> None:
    server, _ = _server()
    server._inbox = [_update("a", 0, [0.1, 0.0, 0.0])]
    with capture_logs() as logs:
        server.close_window()
    assert logs == []
    server._inbox = [_update("b", 0, [np.nan, 0.0, 0.0]), _update("mallory", 0, [0.0, 0.0, 0.0])]
    with capture_logs() as logs:
        report = server.close_window()
    summary = [e for e in logs if e["event"] == "window events"]
    assert len(summary) == 1 and summary[0]["rejected"] == 2 == report.rejected
    assert summary[0]["log_level"] == "info"  # a refusal is worth a line
    assert summary[0]["rejections"] == {"non_finite": 1, "unknown_client": 1}
