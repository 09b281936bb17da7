"""What a password file's PBKDF2 iterations cost: the broker's CPU for each login, right or
wrong, and ``fedsim deploy``'s time to hash a run's passwords.

``python benchmarks/login_cost.py [--iterations 1000,210000] [--logins 1000]``: for each count, a
real mosquitto on 127.0.0.1 (:class:`fedsim.transports.broker.LocalMosquitto`, a password file
of that count) takes ``--logins`` MQTT CONNECTs with a client's right password and as many
with a wrong one (raw MQTT 3.1.1 packets on a socket, each answered by a CONNACK); the
broker's CPU is read from ``/proc/<pid>/stat`` around each batch. Beside it, the time to hash
one password (``mosquitto_password_hash``). Results in ``benchmarks/results/login_cost.json``
with the commit.

Why it matters: a login with a known username and a wrong password makes the broker compute
the hash at the file's iteration count, so whoever can reach the listener can spend that much
of the broker's CPU per CONNECT, without any secret.
"""

from __future__ import annotations

import argparse
import os
import socket
import struct
import tempfile
import time
from pathlib import Path
from typing import Any

import _common  # noqa: F401  (first: puts this checkout's fedsim on sys.path)
from _common import commit, write_json

from fedsim.transports.broker import LocalMosquitto
from fedsim.transports.security import mosquitto_password_hash

RESULTS = Path(__file__).resolve().parent / "results" / "login_cost.json"
CONNACK_ACCEPTED = 0


def _string(text: str) -> bytes:
    data = text.encode()
    return struct.pack("!H", len(data)) + data


def _connect_packet(client_id: str, username: str, password: str) -> bytes:
    """An MQTT 3.1.1 CONNECT (clean session, username and password, keep-alive 10 s)."""
    variable = _string("MQTT") + bytes([4, 0x80 | 0x40 | 0x02]) + struct.pack("!H", 10)
    body = variable + _string(client_id) + _string(username) + _string(password)
    length, encoded = len(body), b""
    while True:
        byte, length = length % 128, length // 128
        encoded += bytes([byte | (0x80 if length else 0)])
        if not length:
            break
    return b"\x10" + encoded + body


def login(port: int, client_id: str, username: str, password: str) -> int:
    """One CONNECT; the CONNACK's return code (0: accepted)."""
    with socket.create_connection(("127.0.0.1", port), timeout=30) as sock:
        sock.sendall(_connect_packet(client_id, username, password))
        reply = b""
        while len(reply) < 4:
            chunk = sock.recv(4 - len(reply))
            if not chunk:
                raise ConnectionError("the broker closed the connection without a CONNACK")
            reply += chunk
    if reply[0] != 0x20:
        raise ConnectionError(f"not a CONNACK: {reply!r}")
    return reply[3]


def broker_cpu_seconds(pid: int) -> float:
    """User + system CPU of process ``pid`` (``/proc/<pid>/stat`` fields 14 and 15)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def measure(iterations: int, logins: int) -> dict[str, Any]:
    started = time.perf_counter()
    for _ in range(5):
        mosquitto_password_hash("x" * 32, iterations=iterations)
    hash_seconds = (time.perf_counter() - started) / 5
    with tempfile.TemporaryDirectory(prefix="fedsim-login-") as directory, \
            LocalMosquitto(directory, "login", ["c1"], iterations=iterations) as broker:
        pid = broker.pid
        assert pid is not None
        creds = broker.secrets.clients["c1"]
        codes: dict[str, list[int]] = {}
        cpu: dict[str, float] = {}
        for kind, password in (("right", creds.password), ("wrong", creds.password[::-1])):
            before = broker_cpu_seconds(pid)
            codes[kind] = [login(broker.port, f"probe-{kind}-{i}", creds.username, password)
                           for i in range(logins)]
            cpu[kind] = (broker_cpu_seconds(pid) - before) / logins
    return {
        "iterations": iterations,
        "logins_each": logins,
        "hash_ms": round(hash_seconds * 1e3, 3),
        "broker_cpu_ms_per_login_right_password": round(cpu["right"] * 1e3, 2),
        "broker_cpu_ms_per_login_wrong_password": round(cpu["wrong"] * 1e3, 2),
        "accepted_right": sum(c == CONNACK_ACCEPTED for c in codes["right"]),
        "accepted_wrong": sum(c == CONNACK_ACCEPTED for c in codes["wrong"]),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--iterations", default="1000,210000",
                        help="comma-separated PBKDF2 iteration counts")
    parser.add_argument("--logins", type=int, default=1000,
                        help="CONNECTs of each kind (the broker's CPU is read in 10 ms ticks: "
                             "about 1,000 resolve 10 us a login)")
    args = parser.parse_args()
    rows = [measure(int(n), args.logins) for n in args.iterations.split(",")]
    for row in rows:
        print(row, flush=True)
    write_json(RESULTS, {"commit": commit(), "loadavg": list(os.getloadavg()), "rows": rows,
                         "clock": "the broker's CPU from /proc/<pid>/stat (10 ms ticks)"})


if __name__ == "__main__":
    main()
