"""Events of a test broker, read from mosquitto's own debug log: what it forwarded to the
server and what the server acknowledged, so that a test waits for the event it needs instead of
sleeping for a guessed time (issue 28, item 8)."""

from __future__ import annotations

import re
import time
from pathlib import Path

from fedsim.transports.broker import LocalMosquitto

DEFAULT_TIMEOUT = 60.0


def log_debug(broker: LocalMosquitto) -> None:
    """Make ``broker`` (not started yet) log every packet (``log_type debug``) to its log."""
    with Path(broker.files.config).open("a", encoding="utf-8") as config:
        config.write("log_type debug\n")


def log_offset(broker: LocalMosquitto) -> int:
    """Where the broker's log ends now: events from here on are the ones to wait for."""
    return broker.log_path.stat().st_size if broker.log_path.exists() else 0


def _lines_since(broker: LocalMosquitto, offset: int) -> list[str]:
    with broker.log_path.open("rb") as log:
        log.seek(offset)
        return log.read().decode(errors="replace").splitlines()


def _wait(condition: object, what: str, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():  # type: ignore[operator]
            return
        time.sleep(0.02)  # polling a file for an event, up to the deadline
    raise AssertionError(f"{what} within {timeout} s")


def server_acknowledged(broker: LocalMosquitto, clients: set[str], offset: int) -> set[str]:
    """The clients (of ``clients``) an update of whom the broker forwarded to the server after
    ``offset`` and the server acknowledged (its PUBACK: the server's process has it)."""
    server = re.escape(broker.secrets.server.username)
    sent = re.compile(rf"Sending PUBLISH to {server} \(d\d, q1, r\d, m(\d+), '[^']*/updates/([^']+)'")
    acked = re.compile(rf"Received PUBACK from {server} \(Mid: (\d+)")
    in_flight: dict[str, str] = {}
    done: set[str] = set()
    for line in _lines_since(broker, offset):
        if (match := sent.search(line)) is not None:
            in_flight[match[1]] = match[2]
        elif (match := acked.search(line)) is not None and match[1] in in_flight:
            done.add(in_flight.pop(match[1]))
    return done & clients


def wait_for_server_receipt(broker: LocalMosquitto, clients: set[str], offset: int,
                            timeout: float = DEFAULT_TIMEOUT) -> None:
    """Wait until the server has acknowledged to the broker an update of every client in
    ``clients`` forwarded after ``offset``."""
    _wait(lambda: server_acknowledged(broker, clients, offset) == clients,
          f"the server acknowledged no update of each of {sorted(clients)}", timeout)


def wait_for_client_update(broker: LocalMosquitto, offset: int,
                           timeout: float = DEFAULT_TIMEOUT) -> None:
    """Wait until a client has published an update after ``offset`` (with the server away,
    it waits in the server's persistent session)."""
    published = re.compile(r"Received PUBLISH from \S+ \(d\d, q1, r\d, m\d+, '[^']*/updates/")
    _wait(lambda: any(published.search(line) for line in _lines_since(broker, offset)),
          "no client published an update", timeout)
