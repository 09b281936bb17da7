"""A hostile, authenticated client during a real mosquitto run (deploy-generated passwords and
ACL): it sends huge, NaN, infinite, 10x-too-large, future, far-ahead, replayed and forged
messages. The run finishes, its accuracy stays within the clean run's spread, and every
rejection is logged and counted by kind in metrics.jsonl.

Scenario: ``four_clients.yaml`` with a fifth client ``c-004`` whose credentials the attacker
holds (the launcher starts the four honest clients and the server; the test plays c-004).
"""

from __future__ import annotations

import asyncio
import json
import math
import struct
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import Any

import aiomqtt
import numpy as np
import pytest
import torch

from fedsim.config import load_scenario
from fedsim.protocol import codec
from fedsim.protocol.messages import ClientStatus, ClientUpdate, GlobalModel
from fedsim.runtime.actors.integrity import client_limits
from fedsim.runtime.deployed.launcher import Launcher
from fedsim.runtime.deployed.options import LAUNCH_WAIT_FOR_CLIENTS, DeploymentOptions
from fedsim.runtime.population import build_population
from fedsim.transports.broker import find_mosquitto
from fedsim.transports.topics import Topics

pytestmark = [
    pytest.mark.mqtt,
    pytest.mark.slow,
    pytest.mark.skipif(find_mosquitto() is None, reason="mosquitto is not installed"),
]
torch.set_num_threads(1)

SCENARIO = Path(__file__).with_name("four_clients.yaml")
OVERRIDES = ["clients.groups[0].count=5", "stop.windows=16"]
HOSTILE = "c-004"
# Three clean runs of this configuration (c-004 connected and silent; OS-entropy noise, so runs
# differ) ended at 0.735, 0.757 and 0.752 (spread 0.022), an attacked one at 0.760. The tolerance
# is the deployed runs' 0.06 (test_deployed_run.py): the spread of three runs plus the scheduling
# variance of which updates share a window.
TOLERANCE = 0.06
ACCURACY_FLOOR = 0.70


def _lines(path: Path) -> list[dict[str, Any]]:
    return [json.loads(t) for t in path.read_text().splitlines() if t.strip()]


def _rewrite_header(payload: bytes, old: bytes, new: bytes) -> bytes:
    (length,) = struct.unpack_from("<I", payload, 6)
    header = payload[10 : 10 + length].replace(old, new)
    return payload[:6] + struct.pack("<I", len(header)) + header + payload[10 + length :]


class _Hostile:
    """c-004 with its own credentials, speaking the wire protocol by hand."""

    def __init__(self, launcher: Launcher, bound: float) -> None:
        broker = launcher.local_broker
        assert broker is not None
        self.broker = broker
        self.topics = Topics(launcher.run)
        self.password = broker.secrets.for_client(HOSTILE).password
        self.bound = bound
        self.incarnation = ""
        self.version = -1
        self.dim = 0

    async def run(self, *, attack: bool) -> None:
        async with aiomqtt.Client(self.broker.host, self.broker.port, username=HOSTILE,
                                  password=self.password) as mqtt:
            await mqtt.subscribe(self.topics.acks(HOSTILE), qos=1)
            await mqtt.subscribe(self.topics.global_model, qos=1)
            listener = asyncio.create_task(self._listen(mqtt))
            try:
                async with asyncio.timeout(60):
                    while not self.incarnation:  # until the server is up and welcomes us
                        await mqtt.publish(self.topics.hello(HOSTILE), b"", qos=0)
                        await asyncio.sleep(0.3)
                await self._status(mqtt, ClientStatus(HOSTILE, "waiting", 0, 0.0, 1e-5, "connected"))
                await self._until(lambda: self.version >= 1)
                if attack:
                    await self._attack(mqtt)
            finally:
                listener.cancel()

    async def _listen(self, mqtt: aiomqtt.Client) -> None:
        async for message in mqtt.messages:
            payload = bytes(message.payload)  # type: ignore[arg-type]
            if str(message.topic) == self.topics.acks(HOSTILE):
                self.incarnation = json.loads(payload)["incarnation"]
                continue
            frame = codec.decode_frame(payload)
            if isinstance(frame.message, GlobalModel) and frame.incarnation == self.incarnation:
                self.version = frame.message.version
                self.dim = frame.message.params.size

    async def _until(self, condition: Any, timeout: float = 60.0) -> None:
        async with asyncio.timeout(timeout):
            while not condition():
                await asyncio.sleep(0.02)

    async def _update(self, mqtt: aiomqtt.Client, round_: int, values: np.ndarray, *,
                      base: int | None = None, poison: float | None = None) -> bytes:
        """Publish an update (``base=-1``: only build it)."""
        delta = np.asarray(values, np.float32)
        update = ClientUpdate(HOSTILE, round_, self.version if base in (None, -1) else base,
                              delta, 32.0)
        payload = codec.encode(update, incarnation=self.incarnation)
        if poison is not None:  # codec.encode refuses non-finite values: patch the bytes
            payload = payload[:-4] + np.array([poison], "<f4").tobytes()
        if base != -1:
            await mqtt.publish(self.topics.updates(HOSTILE), payload, qos=1)
        return payload

    async def _status(self, mqtt: aiomqtt.Client, status: ClientStatus, *,
                      topic_client: str = HOSTILE) -> None:
        payload = codec.encode(status, incarnation=self.incarnation)
        await mqtt.publish(self.topics.status(topic_client), payload, qos=1)

    async def _attack(self, mqtt: aiomqtt.Client) -> None:
        d = self.dim
        for round_ in range(10):  # ten updates of float32's largest finite values
            await self._update(mqtt, round_, np.full(d, 3.4e38))
        await self._update(mqtt, 10, np.zeros(d), poison=math.nan)
        await self._update(mqtt, 11, np.zeros(d), poison=math.inf)
        await self._update(mqtt, 12, np.full(d, 10 * self.bound / math.sqrt(d)))  # 10x the bound
        await self._update(mqtt, 13, np.zeros(d), base=10**12)  # a version from the future
        await self._update(mqtt, 10**12, np.zeros(d))  # a round implausibly far ahead
        astronomic = await self._update(mqtt, 15, np.zeros(d), base=-1)  # base -1: not sent
        await mqtt.publish(self.topics.updates(HOSTILE), _rewrite_header(
            astronomic, b'"round":15', b'"round":' + b"1" * 31), qos=1)  # round ~ 10**30
        valid = await self._update(mqtt, 14, np.full(d, 0.01))  # within the bound: accepted
        await asyncio.sleep(1.0)  # a few windows later ...
        await mqtt.publish(self.topics.updates(HOSTILE), valid, qos=1)  # ... replayed
        done = ClientStatus("c-000", "done", 16, 1.0, 1e-5)
        await self._status(mqtt, done, topic_client="c-000")  # the ACL drops it
        await self._status(mqtt, done)  # c-000's id on c-004's topic: denied
        await self._status(mqtt, ClientStatus(HOSTILE, "done", 10**6, 1.0, 1e-5))
        await self._status(mqtt, ClientStatus(HOSTILE, "budget_exhausted", 0, 8.0, 1e-5))
        await asyncio.sleep(1.0)


def _run(out: Path, *, attack: bool) -> dict[str, Any]:
    loaded = load_scenario(SCENARIO, OVERRIDES)
    population = build_population(loaded)
    plan = next(p for p in population.plans if p.client_id == HOSTILE)
    bound = client_limits(plan.group, plan.num_samples, plan.schedule,
                          population.initial_params.size).norm_bound(0)
    return launch_beside(out, OVERRIDES, lambda launcher: _Hostile(launcher, bound).run(
        attack=attack))


def launch_beside(out: Path, overrides: list[str],
                  play: Callable[[Launcher], Coroutine[Any, Any, object]]) -> dict[str, Any]:
    """Launch ``four_clients.yaml`` with ``overrides`` into ``out``, every process but
    :data:`HOSTILE`, whose part ``play`` plays (at most 90 s); the launch's summary once the
    server has ended the run."""
    options = DeploymentOptions(time_scale=0.25, max_backoff=0.5,
                                wait_for_clients=LAUNCH_WAIT_FOR_CLIENTS)
    launcher = Launcher(SCENARIO, out, options=options, overrides=overrides)
    try:
        launcher.prepare()
        for name in launcher.processes:
            if name != HOSTILE:
                launcher.start(name)
        asyncio.run(asyncio.wait_for(play(launcher), 90))
        assert launcher.wait("server", 90) == 0
        launcher.stop_all()
        return launcher.collect()
    finally:
        launcher.close()


def _rejections(out: Path) -> dict[str, int]:
    totals: dict[str, int] = {}
    for line in _lines(out / "metrics.jsonl"):
        for kind, count in line["rejections"].items():
            totals[kind] = totals.get(kind, 0) + count
    return totals


def test_a_hostile_client_cannot_break_the_run(tmp_path: Path) -> None:
    clean = _run(tmp_path / "clean", attack=False)
    attacked = _run(tmp_path / "attacked", attack=True)
    out = tmp_path / "attacked"
    print(f"final accuracy: clean {clean['final_accuracy']:.4f}, "
          f"attacked {attacked['final_accuracy']:.4f}; rejections {_rejections(out)}")
    metrics = _lines(out / "metrics.jsonl")
    assert [m["window"] for m in metrics] == list(range(1, 17))  # the run finished
    assert all(m["active_clients"] == 5 for m in metrics)  # no forged status took effect
    assert attacked["final_accuracy"] >= ACCURACY_FLOOR
    assert abs(attacked["final_accuracy"] - clean["final_accuracy"]) <= TOLERANCE
    assert _rejections(tmp_path / "clean") == {}
    assert _rejections(out) == {
        "norm": 11, "non_finite": 2, "future_version": 1, "round_ahead": 1, "malformed": 1,
        "forged_client_id": 1, "status_inconsistent": 2,
    }
    assert sum(m["duplicate"] for m in metrics) >= 1  # the replay
    server = json.loads((out / "server.json").read_text())
    log = (out / "logs" / "server.log").read_text()
    # Logged, throttled (issue 25, finding 3): the first rejection of each (sender, kind) is a
    # warning; the rest are counted (above, in metrics.jsonl) and written at debug only.
    rejected = [json.loads(line) for line in log.splitlines() if '"update rejected"' in line
                or '"message rejected"' in line or '"status rejected"' in line]
    warned = {(r["event"], r["kind"]) for r in rejected}
    assert len(rejected) == len({(r["event"], r.get("client", r.get("topic")), r["kind"])
                                 for r in rejected}), "a (sender, kind) warned twice"
    assert warned == {("update rejected", "norm"), ("update rejected", "future_version"),
                      ("update rejected", "round_ahead"), ("message rejected", "non_finite"),
                      ("message rejected", "malformed"),
                      ("status rejected", "status_inconsistent")}
    assert "access denied" in log
    # The replay: counted per window (a window of duplicates alone is logged at debug only)
    assert sum(line["duplicate"] for line in metrics) >= 1
    applied = [json.loads(t) for t in (out / "applied.jsonl").read_text().splitlines()]
    assert [(a["client_id"], a["round"]) for a in applied if a["client_id"] == HOSTILE] == [
        (HOSTILE, 14)]
    assert server["finished"] and server["statuses"].get(HOSTILE, {}).get("state") == "waiting"
    # Every honest client trained through the attack and kept running until the end.
    for client_id in ("c-000", "c-001", "c-002", "c-003"):
        state = json.loads((out / "state" / client_id / f"client-{client_id}.json").read_text())
        assert len(state["released"]) >= 8, client_id
