"""Durable receipts: an update the server received but had not yet checkpointed when it was
SIGKILLed is applied exactly once by the restarted server (real mosquitto on 127.0.0.1, a free
port, stopped by PID).

The server acknowledges an update only after the checkpoint that records it; the clients keep
unacknowledged updates and resend them, and the checkpoint's de-duplication table keeps the
resends from being applied twice. With receipts sent on arrival the killed window's updates are
lost: their clients forget them and nothing ever resends them.
"""

from __future__ import annotations

import asyncio
import json
import signal
import time
from pathlib import Path
from typing import Any

import aiomqtt
import numpy as np
import pytest
import torch

from fedsim.protocol import codec
from fedsim.protocol.messages import ClientUpdate
from fedsim.runtime.deployment import Launcher
from fedsim.transports.broker import LocalMosquitto, find_mosquitto
from fedsim.transports.topics import Topics

pytestmark = [
    pytest.mark.mqtt,
    pytest.mark.slow,
    pytest.mark.skipif(find_mosquitto() is None, reason="mosquitto is not installed"),
]
torch.set_num_threads(1)

SCENARIO = Path(__file__).with_name("four_clients.yaml")
TIME_SCALE = 0.25
WINDOW = 12.0  # scenario seconds: 3 wall seconds, so a kill lands well inside a window
# Longer than the server's receipt batching (0.2 s): a server that acknowledged on arrival
# would have sent its receipts before the kill.
RECEIPT_DELAY = 0.6


def _lines(path: Path) -> list[dict[str, Any]]:
    return [json.loads(t) for t in path.read_text().splitlines() if t.strip()]


def _closed_windows(out: Path) -> int:
    path = out / "metrics.jsonl"
    return max((line["window"] for line in _lines(path)), default=0) if path.exists() else 0


def _checkpoint_state(path: Path) -> dict[str, Any]:
    with np.load(path) as archive:
        return json.loads(archive["state"].tobytes())


async def _next_updates(broker: LocalMosquitto, run: str, count: int) -> set[tuple[str, int]]:
    """The next ``count`` updates the clients publish, seen beside the server (its user may
    read every update topic)."""
    server = broker.secrets.server
    seen: set[tuple[str, int]] = set()
    async with aiomqtt.Client(
        broker.host,
        broker.port,
        username=server.username,
        password=server.password,
        identifier=f"fedsim-{run}-test-tap",
    ) as tap:
        await tap.subscribe(Topics(run).all_updates, qos=1)
        async for message in tap.messages:
            update = codec.decode(bytes(message.payload))  # type: ignore[arg-type]
            assert isinstance(update, ClientUpdate)
            seen.add((update.client_id, update.round))
            if len(seen) == count:
                return seen
    return seen


def test_updates_received_before_a_server_kill_are_applied_exactly_once(tmp_path: Path) -> None:
    out = tmp_path / "run"
    launcher = Launcher(
        SCENARIO,
        out,
        time_scale=TIME_SCALE,
        max_backoff=0.5,
        # Staleness is not the point here: the resent updates must be applied, not judged stale.
        overrides=["stop.windows=7", f"server.window={WINDOW}", "server.max_staleness=50"],
    )
    try:
        launcher.prepare()
        launcher.start_all()
        deadline = time.monotonic() + 90
        while _closed_windows(out) < 2:
            assert time.monotonic() < deadline, "the server did not close window 2"
            time.sleep(0.05)
        broker = launcher.local_broker
        assert broker is not None
        received = asyncio.run(asyncio.wait_for(_next_updates(broker, launcher.run, 2), 60))
        time.sleep(RECEIPT_DELAY)
        launcher.kill("server", signal.SIGKILL)
        before = _checkpoint_state(out / "state" / "server" / "server.ckpt")
        launcher.start("server")
        assert launcher.wait("server", 120) == 0
        launcher.stop_all()
        launcher.collect()
    finally:
        launcher.close()

    checkpointed = {tuple(key) for key in before["seen"]}
    lost_with_the_server = received - checkpointed
    # The kill came after their arrival and before the checkpoint that would record them.
    assert lost_with_the_server, (received, before["windows_closed"])
    applied = [(line["client_id"], line["round"]) for line in _lines(out / "applied.jsonl")]
    assert len(applied) == len(set(applied)), "an update was applied twice"
    for key in lost_with_the_server:
        assert applied.count(key) == 1, f"{key} was not applied after the restart"
    after = _checkpoint_state(out / "state" / "server" / "server.ckpt")
    assert checkpointed | received <= {tuple(key) for key in after["seen"]}
    server = json.loads((out / "server.json").read_text())
    assert server["resumed_from_window"] == before["windows_closed"] and server["finished"]
    # A client may exit before the server's last receipts reach it (its flush timeout races the
    # final acknowledgement), so what it still holds may or may not have been applied; either
    # way it is a round the client released and paid for, and applied at most once (above).
    for client_id in launcher.client_ids:
        report = json.loads((out / "state" / client_id / f"client-{client_id}.json").read_text())
        ledger_rounds = {
            line["round"] for line in _lines(out / "ledgers" / f"{client_id}.jsonl")
            if "round" in line
        }
        assert set(report["unacknowledged"]) <= ledger_rounds, client_id
    resent = sum(
        json.loads((out / "state" / c / f"client-{c}.json").read_text())["mqtt"]["resent"]
        for c in launcher.client_ids
    )
    assert resent >= len(lost_with_the_server)
