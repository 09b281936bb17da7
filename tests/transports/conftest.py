"""A real mosquitto on 127.0.0.1 (free port), with fedsim's generated passwords and ACL.

The broker (:class:`fedsim.transports.broker.LocalMosquitto`) uses the files ``fedsim deploy``
writes, listens on loopback only and is stopped by its PID. Tests that need it are skipped
where mosquitto is not installed (CI installs it, see .ci/run).
"""

from __future__ import annotations

import signal
from collections.abc import Iterator
from pathlib import Path

import pytest

from fedsim.transports.broker import (
    MOSQUITTO_MISSING,
    LocalMosquitto,
    find_mosquitto,
    free_loopback_port,
)

RUN = "test-run"
CLIENT_IDS = ("c1", "c2", "c3")


@pytest.fixture
def unused_port() -> int:
    return free_loopback_port()


@pytest.fixture
def mosquitto(tmp_path: Path) -> Iterator[LocalMosquitto]:
    if find_mosquitto() is None:
        pytest.skip(MOSQUITTO_MISSING)
    broker = LocalMosquitto(tmp_path / "broker", RUN, CLIENT_IDS)
    broker.start()
    try:
        yield broker
    finally:
        broker.kill(signal.SIGTERM)
