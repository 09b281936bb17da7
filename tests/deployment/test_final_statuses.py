"""The clients' final statuses after the server ended a deployed run, over a real mosquitto.

A stranger's ``server.json`` kept every client at its last state before the end ("stopped 0"
for a run whose clients had all stopped), and only the clients' own reports listed the
released (charged) updates the server never acknowledged. Now a client that sees the end sends
a final status (its state, rounds, eps and that count) and the server waits a bounded time for
those of the clients still running: a launch's ``server.json``, its ``summary.json`` and the
server's view say the clients stopped and how many updates went unacknowledged; a client that
never answers keeps its last status and cannot hold the server past the bound, however many
statuses it sends; a hostile final status is refused and counted.
"""

from __future__ import annotations

import asyncio
import json
import signal
import struct
import time
from pathlib import Path
from typing import Any

import aiomqtt
import pytest
import torch

from fedsim.config import load_scenario
from fedsim.protocol import codec
from fedsim.protocol.messages import ClientStatus, RunFinished
from fedsim.reporting.server_view import server_rows_and_summary
from fedsim.runtime.deployed.options import DeploymentOptions
from fedsim.runtime.deployed.server_process import serve
from fedsim.runtime.run_outputs import STOPPED_STATES
from fedsim.runtime.run_record import RELEASED_UNACKNOWLEDGED, released_unacknowledged
from fedsim.transports.broker import MOSQUITTO_MISSING, LocalMosquitto, find_mosquitto
from fedsim.transports.mqtt_settings import parse_broker_url
from fedsim.transports.topics import Topics

pytestmark = [
    pytest.mark.mqtt,
    pytest.mark.skipif(find_mosquitto() is None, reason=MOSQUITTO_MISSING),
]
torch.set_num_threads(1)

SCENARIO = Path(__file__).with_name("four_clients.yaml")
IDS = [f"c-{i:03d}" for i in range(4)]


def _lines(path: Path) -> list[dict[str, Any]]:
    return [json.loads(t) for t in path.read_text().splitlines() if t.strip()]


def test_a_launched_runs_clients_are_reported_stopped_with_their_unacknowledged(
        tmp_path: Path) -> None:
    from fedsim.cli import main

    out = tmp_path / "run"
    assert main(["launch", str(SCENARIO), "--out", str(out), "--time-scale", "0.1",
                 "--set", "stop.windows=8", "--no-plots", "-q", "--timeout", "120"]) == 0
    server = json.loads((out / "server.json").read_text())
    summary = json.loads((out / "summary.json").read_text())
    counts = {}
    for client_id in IDS:
        report = json.loads((out / "state" / client_id / f"client-{client_id}.json").read_text())
        status = server["statuses"][client_id]
        assert status["state"] in STOPPED_STATES and status["state"] == report["state"], status
        assert status["detail"] == report["stop_reason"]
        assert status["unacknowledged"] == len(report["unacknowledged"]), (status, report)
        counts[client_id] = len(report["unacknowledged"])
    waited = server["final_statuses"]
    assert waited["missing"] == [] and waited["received"] == waited["awaited"] > 0, waited
    assert waited["waited_seconds"] < waited["bound_seconds"]  # every one answered
    assert server[RELEASED_UNACKNOWLEDGED] == summary[RELEASED_UNACKNOWLEDGED] \
        == released_unacknowledged(counts)
    rows, view = server_rows_and_summary(out, tuple(_lines(out / "metrics.jsonl")))
    assert all(row["stop_kind"] == "server_finished" for row in rows), rows
    assert "had not reported a stop" not in view["explanation"]
    assert f"{len(IDS)} stopped because" in view["explanation"]


def _patched(payload: bytes, old: bytes, new: bytes) -> bytes:
    (length,) = struct.unpack_from("<I", payload, 6)
    header = payload[10:10 + length].replace(old, new)
    return payload[:6] + struct.pack("<I", len(header)) + header + payload[10 + length:]


BOUND = 3.0  # wall seconds the server waits for final statuses here


class _ByHand:
    """A client played by hand on the wire: it says it is connected, then waits for the end."""

    def __init__(self, broker: LocalMosquitto, topics: Topics, client_id: str) -> None:
        self.broker, self.topics, self.client_id = broker, topics, client_id
        self.incarnation = ""
        self.ended = asyncio.Event()

    async def status(self, mqtt: aiomqtt.Client, status: ClientStatus | bytes) -> None:
        payload = status if isinstance(status, bytes) else \
            codec.encode(status, incarnation=self.incarnation)
        await mqtt.publish(self.topics.status(self.client_id), payload, qos=1)

    def final(self, **changes: Any) -> ClientStatus:
        fields: dict[str, Any] = {"client_id": self.client_id, "state": "done", "rounds": 2,
                                  "epsilon": 0.5, "delta": 1e-5, "detail": "by hand",
                                  "unacknowledged": 2}
        return ClientStatus(**(fields | changes))

    async def until_the_end(self, mqtt: aiomqtt.Client) -> None:
        await mqtt.subscribe(self.topics.acks(self.client_id), qos=1)
        await mqtt.subscribe(self.topics.global_model, qos=1)
        listener = asyncio.create_task(self._listen(mqtt))
        try:
            async with asyncio.timeout(60):
                while not self.incarnation:  # until the server is up and welcomes it
                    await mqtt.publish(self.topics.hello(self.client_id), b"", qos=0)
                    await asyncio.sleep(0.2)
                await self.status(mqtt, ClientStatus(self.client_id, "waiting", 0, 0.0, 1e-5,
                                                     "connected"))
                await self.ended.wait()
        finally:
            listener.cancel()

    async def _listen(self, mqtt: aiomqtt.Client) -> None:
        async for message in mqtt.messages:
            payload = bytes(message.payload)  # type: ignore[arg-type]
            if str(message.topic) == self.topics.acks(self.client_id):
                self.incarnation = json.loads(payload)["incarnation"]
                continue
            frame = codec.decode_frame(payload)
            if isinstance(frame.message, RunFinished) and frame.incarnation == self.incarnation:
                self.ended.set()

    def connect(self) -> aiomqtt.Client:
        return aiomqtt.Client(self.broker.host, self.broker.port, username=self.client_id,
                              password=self.broker.secrets.for_client(self.client_id).password)


async def _silent(client: _ByHand, served: asyncio.Event) -> None:
    """Never sends a final status; floods plain ones until the server has written its outcome."""
    async with client.connect() as mqtt:
        await client.until_the_end(mqtt)
        while not served.is_set():
            await client.status(mqtt, ClientStatus(client.client_id, "training", 0, 0.0, 1e-5))
            await asyncio.sleep(0.005)


async def _hostile_then_final(client: _ByHand) -> None:
    """Sends hostile final statuses, then an honest one."""
    async with client.connect() as mqtt:
        await client.until_the_end(mqtt)
        good = codec.encode(client.final(), incarnation=client.incarnation)
        for payload in (
            _patched(good, b'"unacknowledged":2', b'"unacknowledged":-2'),
            _patched(good, b'"epsilon":0.5', b'"epsilon":NaN'),
            _patched(good, b'"detail":"by hand"', b'"detail":"' + b"x" * 5000 + b'"'),
            codec.encode(client.final(client_id="c-000"), incarnation=client.incarnation),
            client.final(unacknowledged=3),  # more than it released: the book refuses it
        ):
            await client.status(mqtt, payload)
        await client.status(mqtt, client.final())


def test_a_served_run_waits_for_final_statuses_within_its_bound(tmp_path: Path) -> None:
    loaded = load_scenario(SCENARIO, ["clients.groups[0].count=2", "stop.windows=3"])
    name = loaded.scenario.name
    broker = LocalMosquitto(tmp_path / "broker", name, ["c-000", "c-001"])
    broker.start()
    out = tmp_path / "out"

    async def run() -> tuple[dict[str, Any], float]:
        topics, served = Topics(name), asyncio.Event()
        silent, honest = (_ByHand(broker, topics, c) for c in ("c-000", "c-001"))

        async def server() -> dict[str, Any]:
            try:
                return await serve(loaded, parse_broker_url(broker.server_url()), run=name,
                                   state_dir=tmp_path / "state", out_dir=out,
                                   options=DeploymentOptions(time_scale=0.05,
                                                             wait_for_clients=30.0,
                                                             final_status_wait=BOUND))
            finally:
                served.set()

        outcome, *_ = await asyncio.gather(server(), _silent(silent, served),
                                           _hostile_then_final(honest))
        return outcome, time.monotonic()

    try:
        started = time.monotonic()
        outcome, ended = asyncio.run(run())
    finally:
        broker.kill(signal.SIGTERM)
    assert outcome["finished"] is True
    waited = outcome["final_statuses"]
    # c-000 never answered, and its flood of statuses did not keep the server past the bound
    assert waited["awaited"] == 2 and waited["received"] == 1 and waited["missing"] == ["c-000"]
    assert BOUND - 0.1 <= waited["waited_seconds"] <= BOUND + 1.0, waited
    assert ended - started < 30.0
    statuses = outcome["statuses"]
    assert statuses["c-000"]["state"] == "training"  # its last status, kept as it was
    assert statuses["c-000"].get("unacknowledged") is None
    assert statuses["c-001"]["state"] == "done" and statuses["c-001"]["unacknowledged"] == 2
    assert outcome[RELEASED_UNACKNOWLEDGED] == {"total": 2, "reported": 1,
                                               "clients": {"c-001": 2}}
    # the hostile ones: three the decoder refused, one forged, one the book refused
    refused = outcome["mqtt"]["refused_by_kind"]
    assert outcome["mqtt"]["rejected"] >= 3 and outcome["mqtt"]["denied"] >= 1, outcome["mqtt"]
    assert refused.get("forged_client_id", 0) >= 1, refused
    assert waited["rejected"] >= 1
    written = json.loads((out / "server.json").read_text())
    assert written["final_statuses"] == waited
    _, view = server_rows_and_summary(out, tuple(_lines(out / "metrics.jsonl")))
    assert "2 update(s) released by 1 client(s) were never acknowledged" in view["explanation"]
    assert "1 had not reported a stop" in view["explanation"]


def test_a_client_not_awaited_adds_nothing_after_the_end() -> None:
    """An attacker's review: a client that had stopped (or was never heard from) could send
    a final status after the end, switch its kept state back and add to the unacknowledged
    total. Only the clients still running at the end are heard then."""
    from fedsim.protocol.messages import ClientStatus
    from fedsim.runtime.deployed import server_process

    def status(client: str, state: str, unacknowledged: int | None = None) -> ClientStatus:
        return ClientStatus(client, state, 5, 1.0, 1e-5, "", 1.0,  # type: ignore[arg-type]
                            unacknowledged=unacknowledged)

    class Book:  # the server's side the wait uses: its kept statuses and their judge
        def __init__(self) -> None:
            self.statuses = {"c-000": status("c-000", "done"), "c-001": status("c-001", "training")}

        def accept_status(self, message: ClientStatus) -> bool:
            self.statuses[message.client_id] = message
            return True

        async def take(self, message: object) -> None:
            raise AssertionError("no update is sent here")

    class Inbox:
        def __init__(self, messages: list[ClientStatus]) -> None:
            self.messages = messages

        async def receive(self) -> ClientStatus:
            if not self.messages:
                await asyncio.sleep(3600)
            return self.messages.pop(0)

    book = Book()
    # c-003's actor said "done" on seeing the end, judged before the wait began (a CI run's
    # flake refused its final status then); c-004's final status was judged before it too
    book.statuses["c-003"] = status("c-003", "done")
    book.statuses["c-004"] = status("c-004", "done", 0)
    inbox = Inbox([status("c-000", "training", 200), status("c-002", "done", 100),
                   status("c-001", "done", 1), status("c-003", "done", 2)])
    # running when the end was announced (c-000 had stopped, c-002 was never heard from)
    running = {"c-001", "c-003", "c-004"}
    waited = asyncio.run(server_process._final_statuses(inbox, book, 5.0, None, running))  # type: ignore[arg-type]
    assert waited["awaited"] == 3 and waited["received"] == 3 and waited["rejected"] == 2
    assert waited["waited_seconds"] < 4.0  # every awaited client answered: no wait to the bound
    assert book.statuses["c-000"].state == "done" and book.statuses["c-000"].unacknowledged is None
    assert "c-002" not in book.statuses and book.statuses["c-001"].unacknowledged == 1
    assert book.statuses["c-003"].unacknowledged == 2 and book.statuses["c-004"].unacknowledged == 0
