"""A real mosquitto on 127.0.0.1 (free port), with fedsim's generated passwords and ACL.

The broker is started with the files ``fedsim deploy`` writes and stopped by its PID; it never
listens on anything but loopback. Tests that need it are skipped where mosquitto is not
installed (CI installs it, see .ci/run).
"""

from __future__ import annotations

import getpass
import os
import shutil
import signal
import socket
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from fedsim.transports.security import BrokerFiles, RunSecrets, load_secrets, write_broker_files

RUN = "test-run"
CLIENT_IDS = ("c1", "c2", "c3")


def mosquitto_binary() -> str | None:
    return shutil.which("mosquitto") or next(
        (p for p in ("/usr/sbin/mosquitto", "/usr/local/sbin/mosquitto") if os.path.exists(p)),
        None,
    )


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


@dataclass
class Broker:
    """One mosquitto process; ``kill``/``start`` simulate a crash and a restart on the same port."""

    binary: str
    port: int
    files: BrokerFiles
    secrets: RunSecrets
    log: Path
    run: str = RUN
    process: subprocess.Popen | None = field(default=None, repr=False)
    host: str = "127.0.0.1"

    def url(self, user: str | None = None, password: str | None = None) -> str:
        credentials = f"{user}:{password}@" if user is not None else ""
        return f"mqtt://{credentials}{self.host}:{self.port}"

    def server_url(self) -> str:
        return self.url(self.secrets.server.username, self.secrets.server.password)

    def client_url(self, client_id: str) -> str:
        creds = self.secrets.for_client(client_id)
        return self.url(creds.username, creds.password)

    def start(self) -> None:
        with self.log.open("ab") as log:
            self.process = subprocess.Popen(
                [self.binary, "-c", str(self.files.config)],
                stdout=log,
                stderr=subprocess.STDOUT,
            )
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"mosquitto exited: {self.log.read_text()[-2000:]}")
            try:
                socket.create_connection((self.host, self.port), timeout=0.2).close()
                return
            except OSError:
                time.sleep(0.02)
        raise RuntimeError("mosquitto did not start listening within 10 s")

    def kill(self, sig: int = signal.SIGKILL) -> None:
        """Stop the broker by PID (SIGKILL by default: a crash, nothing saved)."""
        if self.process is not None and self.process.poll() is None:
            os.kill(self.process.pid, sig)
            self.process.wait(timeout=10)
        self.process = None


@pytest.fixture
def unused_port() -> int:
    return free_port()


@pytest.fixture
def mosquitto(tmp_path: Path) -> Iterator[Broker]:
    binary = mosquitto_binary()
    if binary is None:
        pytest.skip("mosquitto is not installed")
    port = free_port()
    files = write_broker_files(
        tmp_path / "broker",
        RUN,
        CLIENT_IDS,
        port=port,
        bind_address="127.0.0.1",
        # A broker started as root switches to this user; it must read tmp_path.
        run_as_user=getpass.getuser(),
    )
    broker = Broker(
        binary, port, files, load_secrets(files.secrets_file), tmp_path / "mosquitto.log"
    )
    broker.start()
    try:
        yield broker
    finally:
        broker.kill(signal.SIGTERM)
