"""A mosquitto process on loopback, for tests, benchmarks and local runs without Docker.

It is started with the files :func:`fedsim.transports.security.write_broker_files` writes
(passwords and ACL, anonymous access denied), listens on 127.0.0.1 only, and is stopped by its
PID. ``kill()`` then ``start()`` crash and restart it on the same port.
"""

from __future__ import annotations

import getpass
import os
import shutil
import signal
import socket
import subprocess
import time
from collections.abc import Sequence
from pathlib import Path
from types import TracebackType
from typing import Self

from fedsim.atomic import open_log
from fedsim.errors import TransportError
from fedsim.json_input import parse_json
from fedsim.transports.child_process import bound_argv, bound_env
from fedsim.transports.security import (
    PBKDF2_ITERATIONS,
    BrokerFiles,
    ListenerTls,
    PasswordHashing,
    RunSecrets,
    load_secrets,
    write_broker_files,
)

LOOPBACK = "127.0.0.1"
_SEARCH = ("/usr/sbin/mosquitto", "/usr/local/sbin/mosquitto", "/opt/homebrew/sbin/mosquitto")
MOSQUITTO_MISSING = (
    "mosquitto is not installed (looked in PATH and in "
    + ", ".join(p.rsplit("/", 1)[0] for p in _SEARCH)
    + "): `apt-get install mosquitto` (Debian, Ubuntu) or `brew install mosquitto` (macOS)"
)


def find_mosquitto() -> str | None:
    """The mosquitto binary (``PATH``, then the usual sbin directories), or None."""
    return shutil.which("mosquitto") or next((p for p in _SEARCH if os.path.exists(p)), None)


def free_loopback_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now."""
    with socket.socket() as probe:
        probe.bind((LOOPBACK, 0))
        return probe.getsockname()[1]


class LocalMosquitto:
    """One authenticated mosquitto on 127.0.0.1 for run ``run`` and the given client ids.

    ``iterations``: the PBKDF2 rounds of its password file (:data:`PBKDF2_ITERATIONS`).

    Use as a context manager (``with LocalMosquitto(dir, "run", ["c1"]) as broker``), or call
    :meth:`start` and :meth:`kill`. Credentials are in :attr:`secrets` (and, with
    ``per_process_secrets``, a file a process in :attr:`files`' ``process_secrets_dir``).
    """

    def __init__(
        self,
        directory: str | Path,
        run: str,
        client_ids: Sequence[str],
        *,
        port: int | None = None,
        binary: str | None = None,
        max_packet_bytes: int | None = None,
        tls: ListenerTls | None = None,
        observer: bool = False,
        persistence: bool = False,
        aggregators: Sequence[str] = (),
        iterations: int = PBKDF2_ITERATIONS,
        per_process_secrets: bool = False,
    ) -> None:
        found = binary or find_mosquitto()
        if found is None:
            raise TransportError(MOSQUITTO_MISSING)
        self.binary = found
        self.directory = Path(directory)
        self.port = port or free_loopback_port()
        self.host = LOOPBACK
        self.run = run
        self.tls = tls
        self.files: BrokerFiles = write_broker_files(
            self.directory,
            run,
            client_ids,
            port=self.port,
            bind_address=LOOPBACK,
            max_packet_bytes=max_packet_bytes,
            # Started as root, mosquitto would switch to user "mosquitto", who may not be able
            # to read the directory; stay the current user instead.
            run_as_user=getpass.getuser(),
            tls=tls,
            observer=observer,
            persistence_dir=str((self.directory / "data").resolve()) if persistence else None,
            aggregators=aggregators,
            hashing=PasswordHashing(iterations),
            per_process=per_process_secrets,
        )
        if persistence:
            (self.directory / "data").mkdir(parents=True, exist_ok=True)
        self.secrets: RunSecrets = load_secrets(self.files.secrets_file)
        self.log_path = self.directory / "mosquitto.log"
        self._process: subprocess.Popen[bytes] | None = None

    @property
    def pid(self) -> int | None:
        return self._process.pid if self._process is not None else None

    def url(self, username: str | None = None, password: str | None = None) -> str:
        credentials = f"{username}:{password}@" if username is not None else ""
        scheme = "mqtts" if self.tls is not None else "mqtt"
        return f"{scheme}://{credentials}{self.host}:{self.port}"

    def server_url(self) -> str:
        server = self.secrets.for_server()
        return self.url(server.username, server.password)

    def observer_url(self) -> str:
        """The read-only observer's URL (a broker made with ``observer=True``)."""
        data = parse_json(self.files.secrets_file.read_text())
        return self.url(data["observer"]["username"], data["observer"]["password"])

    def client_url(self, client_id: str) -> str:
        creds = self.secrets.for_client(client_id)
        return self.url(creds.username, creds.password)

    def aggregator_url(self, aggregator_id: str) -> str:
        creds = self.secrets.for_aggregator(aggregator_id)
        return self.url(creds.username, creds.password)

    def start(self, timeout: float = 10.0, *, own_group: bool = False) -> None:
        """Start the broker and wait until it accepts connections. ``own_group``: in a process
        group of its own, bound to this process (:mod:`fedsim.transports.child_process`): a
        terminal's Ctrl-C does not stop it under the processes still using it (its starter
        stops it by PID, last), and it does not outlive a starter that dies first."""
        argv = [self.binary, "-c", str(self.files.config)]
        with open(open_log(self.log_path), "ab") as log:  # (a link: refused, not followed)
            self._process = subprocess.Popen(
                bound_argv(argv) if own_group else argv, stdout=log, stderr=subprocess.STDOUT,
                env=bound_env(os.environ) if own_group else None,
                process_group=0 if own_group else None)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self._process.poll() is not None:
                tail = self.log_path.read_text(errors="replace")[-2000:]
                raise TransportError(f"mosquitto exited with {self._process.returncode}: {tail}")
            try:
                socket.create_connection((self.host, self.port), timeout=0.2).close()
                return
            except OSError:
                time.sleep(0.02)  # noqa: TID251 - a launcher polling a process, not an actor
        self.kill()
        raise TransportError(
            f"mosquitto did not listen on {self.host}:{self.port} within {timeout} s"
        )

    def kill(self, sig: int = signal.SIGKILL, timeout: float = 10.0) -> None:
        """Stop the broker by its PID (SIGKILL by default: a crash that saves nothing)."""
        process, self._process = self._process, None
        if process is not None and process.poll() is None:
            os.kill(process.pid, sig)
            process.wait(timeout=timeout)

    def __enter__(self) -> Self:
        self.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.kill(signal.SIGTERM)
