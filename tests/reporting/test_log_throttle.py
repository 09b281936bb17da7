"""Issue 25 finding 3: a client whose messages, updates and statuses are refused made the
server log one warning each (1.2-1.6 GB an hour). The first per sender and kind is a warning,
the rest are counted into an info summary every minute (and written at debug only)."""

from __future__ import annotations

import io
import json
from contextlib import redirect_stderr

import pytest
import structlog

from fedsim.logging import SUMMARY_EVERY, Throttle, configure_logging, get_logger


def _flood(level: str, count: int) -> list[dict]:
    stream = io.StringIO()
    with redirect_stderr(stream):
        configure_logging(json=True, level=level)
        log = get_logger("fedsim.server")
        for r in range(count):
            log.warning("update rejected", client="mallory", round=r, kind="norm",
                        reason="norm 12.0 above the bound 1.0")
            log.warning("message rejected", topic="fedsim/r/updates/mallory", kind="malformed",
                        reason="bad magic")
        log.warning("update rejected", client="alice", round=0, kind="norm", reason="x")
        log.info("window closed", window=1)
    configure_logging(json=False, level="info")
    return [json.loads(line) for line in stream.getvalue().splitlines()]


def test_a_flood_of_rejections_is_warned_once_per_sender_and_kind() -> None:
    lines = _flood("info", 10_000)
    warnings = [line for line in lines if line["level"] == "warning"]
    # the first of each (event, sender, kind) is a warning: mallory's two kinds, alice's one
    assert [(w["event"], w.get("client", w.get("topic"))) for w in warnings] == [
        ("update rejected", "mallory"), ("message rejected", "fedsim/r/updates/mallory"),
        ("update rejected", "alice")]
    assert all("summarised" in w["further"] for w in warnings)
    assert [line["event"] for line in lines if line["level"] == "info"] == ["window closed"]
    assert len(lines) == 4  # 20,001 warnings before


def test_each_rejection_is_written_at_debug_level() -> None:
    lines = _flood("debug", 100)
    assert sum(line["level"] == "warning" for line in lines) == 3
    assert sum(line["level"] == "debug" for line in lines) == 2 * 99


def test_the_throttled_rejections_are_summarised_by_kind_every_period() -> None:
    now = [0.0]
    throttle = Throttle(threshold=20, clock=lambda: now[0])  # info
    event = {"event": "update rejected", "client": "mallory", "kind": "norm"}
    assert throttle(None, "warning", dict(event))["event"] == "update rejected"
    for _ in range(5):
        with pytest.raises(structlog.DropEvent):
            throttle(None, "warning", dict(event))
    status = {**event, "event": "status rejected", "kind": "claims"}
    assert throttle(None, "warning", dict(status))["event"] == "status rejected"
    with pytest.raises(structlog.DropEvent):
        throttle(None, "warning", dict(status))
    now[0] = SUMMARY_EVERY
    summary = throttle(None, "warning", dict(event))
    assert summary["event"] == "rejections summarised" and summary["level"] == "info"
    assert summary["counts"] == {"update rejected: norm": 6, "status rejected: claims": 1}
    with pytest.raises(structlog.DropEvent):  # a new period starts from zero
        throttle(None, "warning", dict(event))
    assert throttle.counts == {"update rejected: norm": 1}
    # other warnings pass untouched
    other = {"event": "connection lost; reconnecting"}
    assert throttle(None, "warning", dict(other)) == other


def test_an_aggregators_implausible_counts_are_warned_once_per_aggregator() -> None:
    """A hostile aggregation node can send made-up counts in every partial: the first of each
    aggregator's is a warning, the rest are summarised."""
    throttle = Throttle(threshold=20)  # info
    event = "partial's rejection counts implausible: left out"
    warned = []
    for aggregator in ("g0", "g0", "g1", "g0"):
        try:
            warned.append(throttle(None, "warning", {"event": event, "aggregator": aggregator}))
        except structlog.DropEvent:
            pass
    assert [w["aggregator"] for w in warned] == ["g0", "g1"]
