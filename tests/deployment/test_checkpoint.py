"""Server checkpoints (atomic, identity-checked, exact round trip), the scaled clock, broker
credential resolution and the per-window log trimming a restarted server relies on."""

from __future__ import annotations

import asyncio
import json
import math
import os
import time as wallclock
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest

from fedsim.aggregation import PlateauStepSize, make_strategy
from fedsim.aggregation.policies import FedAsync
from fedsim.clock import ScaledClock
from fedsim.errors import ConfigError
from fedsim.protocol.headers import MAX_COUNTER
from fedsim.protocol.messages import ClientStatus
from fedsim.runtime.actors.server import ClientInfo, ServerActor
from fedsim.runtime.deployed.checkpoint import CheckpointError, ServerCheckpoint
from fedsim.runtime.deployed.deployment import resolve_broker
from fedsim.runtime.deployed.server_process import (
    MIN_VERSION_LEASE,
    Checkpoints,
    keep_windows_through,
)
from fedsim.transports.security import generate_secrets, write_secrets
from tests.doubles import SilentEndpoint

IDENTITY = {"run": "r", "scenario": "s", "seed": 1, "parameters": 6, "clients": ["a", "b"]}


class _StillClock:
    def __init__(self, now: float) -> None:
        self.value = now

    def now(self) -> float:
        return self.value

    async def sleep(self, seconds: float) -> None:
        self.value += seconds


def _server(now: float = 0.0, *, seed: int = 7) -> ServerActor:
    return ServerActor(
        clock=_StillClock(now),
        endpoint=SilentEndpoint(),
        initial_params=np.zeros(6, np.float32),
        clients={"a": ClientInfo(100, 0.5), "b": ClientInfo(50, 0.5)},
        window=1.0,
        strategy=make_strategy("data_size"),
        step_size=PlateauStepSize(1.0, factor=0.5, patience=1),
        participation=0.5,
        rng=np.random.default_rng(seed),
    )


def _busy_server() -> ServerActor:
    """A server whose state differs from a fresh one in every field a snapshot holds."""
    server = _server(now=12.5)
    server.params = np.arange(6, dtype=np.float32) / 7
    server.version = 9
    server.windows_closed = 12
    for client, round_ in (("a", 0), ("a", 1), ("b", 0), ("b", 7)):
        server.book.record(client, round_)
    server.step_size.observe(0.6)
    server.step_size.observe(0.5)  # no improvement: the step size halves
    server.rng.random(5)
    server.last_accuracy = 0.6
    server.evaluation.version = 9
    server.evaluation.last = (0.6, 0.9)
    assert server.accept_status(ClientStatus("b", "training", 9, 1.5, 1e-5, "", 11.0))
    server.book.invite(12, {"a"})
    server.book.invite(13, {"b"})
    return server


def test_snapshot_round_trip_restores_every_field(tmp_path: Path) -> None:
    original = _busy_server()
    assert original.step_size.current(1) == 0.5 and original.step_size.best == 0.6
    checkpoint = ServerCheckpoint(tmp_path, IDENTITY)
    assert checkpoint.load() is None
    checkpoint.save(original.snapshot())

    restored = _server(seed=999)
    restored.restore(ServerCheckpoint(tmp_path, IDENTITY).load())
    assert restored.params.tobytes() == original.params.tobytes()
    assert (restored.version, restored.windows_closed) == (9, 12)
    assert restored.book.state() == original.book.state(publishing=9)  # (may be broadcast next)
    assert [r for r in range(9) if ("b", r) in restored.book] == [0, 7]
    assert restored.book.watermark("a") == 2 and restored.book.missing() == 9 - 2
    assert vars(restored.step_size) == vars(original.step_size)
    assert restored.statuses == original.statuses
    assert restored.last_accuracy == 0.6 and restored.evaluation.last == (0.6, 0.9)
    assert restored.book.invited("a", 12) and not restored.book.invited("b", 12)
    # The participation generator continues exactly where the original was.
    assert restored._invite(14) == original._invite(14)
    assert restored.rng.random() == original.rng.random()


def test_renew_version_moves_forward_and_keeps_the_evaluation() -> None:
    server = _server()
    evaluated: list[np.ndarray] = []
    server.evaluation.evaluate = lambda params: evaluated.append(params) or (0.1, 2.0)
    server.restore(_busy_server().snapshot())
    step_state = dict(vars(server.step_size))
    server.renew_version()
    assert server.version == 10 and server.params.tobytes() == _busy_server().params.tobytes()
    report = server.close_window()  # nothing arrived: the unchanged model is not re-evaluated
    assert report.version == 10 and (report.accuracy, report.loss) == (0.6, 0.9)
    assert evaluated == [] and vars(server.step_size) == step_state


def test_a_fresh_servers_snapshot_with_nan_and_infinity_survives(tmp_path: Path) -> None:
    fresh = _server()
    assert fresh.step_size.best == -math.inf and math.isnan(fresh.evaluation.last[0])
    checkpoint = ServerCheckpoint(tmp_path, IDENTITY)
    checkpoint.save(fresh.snapshot())
    loaded = checkpoint.load()
    assert loaded.step_size_state["best"] == -math.inf
    assert all(math.isnan(v) for v in loaded.last_evaluation)


def test_a_restored_server_continues_its_window_count() -> None:
    server = _server(now=12.5)
    server.restore(_busy_server().snapshot())
    reports: list[tuple[int, float]] = []

    def on_window(report) -> bool:
        reports.append((report.window, report.time))
        return report.window >= 14

    server.endpoint = SilentEndpoint()  # broadcasts go nowhere here
    asyncio.run(server.run(on_window))
    # Window 13 ends one window length after the restore, not 13 windows later.
    assert reports == [(13, 13.5), (14, 14.5)]


def test_identity_mismatch_and_damage_are_clear_errors(tmp_path: Path) -> None:
    ServerCheckpoint(tmp_path, IDENTITY).save(_busy_server().snapshot())
    with pytest.raises(CheckpointError, match="belongs to another run"):
        ServerCheckpoint(tmp_path, {**IDENTITY, "seed": 2}).load()
    path = tmp_path / "server.ckpt"
    path.write_bytes(path.read_bytes()[:100])  # truncated
    with pytest.raises(CheckpointError, match="unreadable"):
        ServerCheckpoint(tmp_path, IDENTITY).load()


def test_a_crash_while_writing_leaves_the_previous_checkpoint(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    checkpoint = ServerCheckpoint(tmp_path, IDENTITY)
    first = _busy_server()
    checkpoint.save(first.snapshot())

    def crash(*args: object) -> None:
        raise OSError("power lost before the rename")

    later = _busy_server()
    later.version = 10
    monkeypatch.setattr(os, "replace", crash)
    with pytest.raises(OSError):
        checkpoint.save(later.snapshot())
    monkeypatch.undo()
    assert ServerCheckpoint(tmp_path, IDENTITY).load().version == 9


def test_keep_windows_through_drops_later_windows_and_a_torn_line(tmp_path: Path) -> None:
    path = tmp_path / "metrics.jsonl"
    lines = [json.dumps({"window": w, "x": w * 2}) for w in (1, 2, 3, 4)]
    path.write_text("\n".join(lines) + '\n{"window": 5, "x"')
    keep_windows_through(path, 2)
    assert [json.loads(t)["window"] for t in path.read_text().splitlines()] == [1, 2]


def test_scaled_clock_runs_scenario_time_at_the_given_rate() -> None:
    async def measure() -> tuple[float, float]:
        clock = ScaledClock(0.02, start=100.0)
        loop = asyncio.get_running_loop()
        wall = loop.time()
        await clock.sleep(5.0)  # 5 scenario seconds = 0.1 wall seconds
        return clock.now(), loop.time() - wall

    now, wall = asyncio.run(measure())
    assert 0.1 <= wall < 0.5
    assert now == pytest.approx(100.0 + wall / 0.02, rel=0.05)
    with pytest.raises(ConfigError, match="time-scale"):
        ScaledClock(0.0)


def test_resolve_broker_takes_credentials_from_url_or_secrets(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("FEDSIM_BROKER", raising=False)
    monkeypatch.delenv("FEDSIM_SECRETS", raising=False)
    secrets = generate_secrets("run-1", ["a", "b"])
    write_secrets(tmp_path / "secrets.json", secrets)
    settings, run = resolve_broker(
        "mqtt://127.0.0.1:1884",
        secrets_file=tmp_path / "secrets.json",
        role="client",
        client_id="b",
    )
    assert (settings.username, settings.password, run) == (
        "b",
        secrets.clients["b"].password,
        "run-1",
    )
    settings, _ = resolve_broker(
        "mqtt://127.0.0.1", secrets_file=tmp_path / "secrets.json", role="server"
    )
    assert settings.username == secrets.server.username and settings.port == 1883
    settings, run = resolve_broker("mqtt://u:p@h:1", secrets_file=None, role="server", run="x")
    assert (settings.username, settings.password, run) == ("u", "p", "x")
    with pytest.raises(ConfigError, match="is for run 'run-1', not 'other'"):
        resolve_broker(
            "mqtt://h", secrets_file=tmp_path / "secrets.json", role="server", run="other"
        )
    with pytest.raises(ConfigError, match="no credentials for client 'c'"):
        resolve_broker(
            "mqtt://h", secrets_file=tmp_path / "secrets.json", role="client", client_id="c"
        )
    with pytest.raises(ConfigError, match="no broker"):
        resolve_broker(None, secrets_file=None, role="server")
    monkeypatch.setenv("FEDSIM_BROKER", "mqtt://envhost:1999")
    assert resolve_broker(None, secrets_file=None, role="server")[0].host == "envhost"


class _SlowCheckpoint(ServerCheckpoint):
    def save(self, snapshot: Any) -> None:
        wallclock.sleep(0.2)  # a large checkpoint on a slow disk
        super().save(snapshot)


def test_checkpoints_are_written_off_the_event_loop_and_cover_the_versions_published(
        tmp_path: Path) -> None:
    """Finding 4: the event loop runs on while a checkpoint is written; receipts go out only
    once it is durable; under FedAsync a model within the durable version ceiling leaves
    without a new checkpoint, one beyond it waits for one; a restored server renews above the
    ceiling (under time windows the ceiling is the version itself: renewed by one)."""
    acknowledged: list[bool] = []
    endpoint = SimpleNamespace(acknowledge=lambda book: acknowledged.append(("a", 1) in book))

    async def main() -> tuple[int, int, int]:
        server = _busy_server()  # version 9, ("a", 1) judged
        server.policy = FedAsync(alpha=0.5)
        checkpoints = Checkpoints(_SlowCheckpoint(tmp_path, IDENTITY), endpoint)  # type: ignore[arg-type]
        ticks = 0

        async def tick() -> None:
            nonlocal ticks
            while True:
                await asyncio.sleep(0.01)
                ticks += 1

        ticker = asyncio.create_task(tick())
        written = checkpoints.start(server, window=True)
        assert not written.done() and acknowledged == []
        await checkpoints.cover(server, 9 + MIN_VERSION_LEASE)  # the pending one covers it
        during = ticks
        assert acknowledged == [True] and checkpoints.durable_ceiling == 9 + MIN_VERSION_LEASE
        await checkpoints.cover(server, 20)
        saves = checkpoints.checkpoint.saves
        server.version = 10 + MIN_VERSION_LEASE
        await checkpoints.cover(server, server.version)  # beyond the ceiling: one more
        server.version += 300  # a busy window: the next lease is twice what it published
        checkpoints.start(server, window=True)
        await checkpoints.drain()
        ticker.cancel()
        return during, checkpoints.checkpoint.saves - saves, checkpoints.lease

    during, more, lease = asyncio.run(main())
    assert during >= 10  # the loop ticked through the 0.2 s write
    assert more == 2 and lease == 2 * (10 + MIN_VERSION_LEASE + 300 - 9)
    restored = _server()
    loaded = ServerCheckpoint(tmp_path, IDENTITY).load()
    assert loaded is not None and loaded.version_ceiling == 10 + MIN_VERSION_LEASE + 300 + lease
    restored.restore(loaded)
    restored.renew_version()
    assert restored.version == loaded.version_ceiling + 1

    async def windows() -> int | None:
        server = _busy_server()
        checkpoints = Checkpoints(ServerCheckpoint(tmp_path, IDENTITY), endpoint)  # type: ignore[arg-type]
        await checkpoints.cover(server, server.version)
        await checkpoints.drain()
        return checkpoints.durable_ceiling

    assert asyncio.run(windows()) == 9


def test_the_checkpoint_before_a_broadcast_is_an_explicit_step_not_the_endpoints(
        tmp_path: Path) -> None:
    """The deployed server's endpoint is the transport's, unwrapped; before a model leaves,
    the server runs the runtime's step (ServerActor.before_publish): a durable checkpoint that
    covers its version, or, once the run has ended, the end announced instead of the model
    (issue 28, item 6)."""
    from fedsim.protocol.messages import GlobalModel, RunFinished
    from fedsim.runtime.actors.stops import RunStop, RunStopKind
    from fedsim.runtime.deployed.server_process import _BeforePublish

    sent: list[tuple[object, int]] = []

    class Transport:
        def acknowledge(self, book: object) -> None:
            pass

        async def publish(self, message: object) -> None:
            sent.append((message, checkpoints.checkpoint.saves))

    transport = Transport()

    async def main() -> None:
        server = _busy_server()
        server.endpoint = transport  # type: ignore[assignment]
        step = _BeforePublish(transport, checkpoints, server)  # type: ignore[arg-type]
        await server.publish_model(invite=True)
        step.stop_reason = lambda: RunStop(RunStopKind.WINDOWS, "it reached 12 windows")
        server.version += 1
        await server.publish_model(invite=True)
        await server.publish_model(invite=True)  # announced once
        await checkpoints.drain()

    checkpoints = Checkpoints(ServerCheckpoint(tmp_path, IDENTITY), transport)  # type: ignore[arg-type]
    asyncio.run(main())
    (model, saves), (end, _) = sent
    assert isinstance(model, GlobalModel) and model.version == 9 and saves == 1
    assert isinstance(end, RunFinished) and end.reason == "it reached 12 windows"
    assert checkpoints.checkpoint.saves == 2  # the ended run's last version is covered too
    loaded = ServerCheckpoint(tmp_path, IDENTITY).load()
    assert loaded is not None and loaded.version == 10


def test_a_second_server_on_one_state_directory_is_refused(tmp_path: Path) -> None:
    """A stranger's test (session 50): a second `fedsim server` on the first's --state resumed
    from the same checkpoint, the two fought over the broker and overwrote each other's
    checkpoint, and a later restart published a version older than one already broadcast.
    The second is now refused before it reads the checkpoint or connects."""
    from fedsim.config import load_scenario
    from fedsim.runtime.deployed.checkpoint import ServerStateLock
    from fedsim.runtime.deployed.server_process import serve
    from fedsim.transports.mqtt import parse_broker_url

    loaded = load_scenario(Path(__file__).with_name("four_clients.yaml"))
    state = tmp_path / "state"
    never = parse_broker_url("mqtt://127.0.0.1:9")  # refused before any connection
    with ServerStateLock(state):  # the first server, running
        with pytest.raises(CheckpointError, match="another server is running"):
            asyncio.run(serve(loaded, never, state_dir=state, out_dir=tmp_path / "out"))
        assert not (tmp_path / "out").exists()
    with ServerStateLock(state):  # released when the first stops: the next one starts
        pass


def test_the_names_sent_to_aggregation_nodes_survive_a_restart(tmp_path: Path) -> None:
    """A review (session 56): the clients named to the aggregation nodes (their marks, below
    which an aggregator folds none of their rounds) were not in the checkpoint, so after a
    server restart a named client could get a group refused again. They are kept; a damaged
    mark is a clear error."""
    from dataclasses import replace

    def server() -> ServerActor:
        return ServerActor(clock=_StillClock(0.0), endpoint=SilentEndpoint(),
                           initial_params=np.zeros(6, np.float32),
                           clients={"a": ClientInfo(100, 0.5), "b": ClientInfo(50, 0.5)},
                           window=1.0, strategy=make_strategy("data_size"),
                           step_size=PlateauStepSize(1.0, factor=0.5, patience=1),
                           aggregators=("g0",))

    original = server()
    original.partials.hold_back("a", MAX_COUNTER)
    original.partials.hold_back("b", 2000)
    original.partials.notes.take()  # named in a close before the checkpoint
    checkpoint = ServerCheckpoint(tmp_path, IDENTITY)
    checkpoint.save(original.snapshot())
    restored = server()
    restored.restore(checkpoint.load())
    watermarks, _ = restored.partials.notes.take()
    assert sorted(watermarks) == [("a", MAX_COUNTER), ("b", 2000)]  # named again at once
    for bad in ({"a": -1}, {"a": "2000"}, {"a": MAX_COUNTER + 1}):
        checkpoint.save(replace(original.snapshot(), aggregator_marks=bad))  # type: ignore[arg-type]
        with pytest.raises(CheckpointError, match="malformed"):
            checkpoint.load()


def test_a_restored_servers_first_line_counts_only_its_own_window_of_lost_updates(
        tmp_path: Path) -> None:
    """A stranger's resumed lossy launch: 274 updates lost in flight up to window 30, then
    window 31 alone reported 285, the restored book's whole total again (916 in the summary
    where the links dropped 654). A monitor starts from the restored count."""
    from types import SimpleNamespace

    from fedsim.config import load_scenario
    from fedsim.runtime.actors.window_report import WindowReport
    from fedsim.runtime.deployed.server_process import _ServerMonitor
    from fedsim.transports.mqtt_settings import MqttStats

    missing = [274]
    server = SimpleNamespace(missing_updates=lambda: missing[0], statuses={}, clients=["c"])
    checkpoints = SimpleNamespace(start=lambda *args, **kwargs: None)
    scenario = load_scenario(Path(__file__).with_name("four_clients.yaml")).scenario
    with open(tmp_path / "metrics.jsonl", "w+", encoding="utf-8") as metrics, \
            open(tmp_path / "applied.jsonl", "w", encoding="utf-8") as applied:
        monitor = _ServerMonitor(scenario, server,  # type: ignore[arg-type]
                                 SimpleNamespace(stats=MqttStats()),  # type: ignore[arg-type]
                                 checkpoints, metrics, applied)  # type: ignore[arg-type]
        missing[0] = 285
        monitor.on_window(WindowReport(window=31, time=31.0, version=40))
    line = json.loads((tmp_path / "metrics.jsonl").read_text())
    assert line["dropped_in_flight"] == 11


def _tampered(tmp_path: Path, change: Any) -> ServerCheckpoint:
    """The busy server's checkpoint with its state document changed by ``change``."""
    import io

    checkpoint = ServerCheckpoint(tmp_path, IDENTITY)
    checkpoint.save(_busy_server().snapshot())
    with np.load(checkpoint.path) as archive:
        params, state = archive["params"].copy(), json.loads(archive["state"].tobytes())
    change(state)
    buffer = io.BytesIO()
    np.savez(buffer, params=params,
             state=np.frombuffer(json.dumps(state).encode(), dtype=np.uint8))
    checkpoint.path.write_bytes(buffer.getvalue())
    return checkpoint


TAMPERED = {
    # crashed with a traceback (AttributeError, IndexError, ValueError) instead of a clear error
    "clients not an object": lambda s: s["book"].__setitem__("clients", []),
    "statuses not an object": lambda s: s["book"].__setitem__("statuses", [1]),
    "a short client row": lambda s: s["book"]["clients"].__setitem__("a", [0]),
    "a bitmap not hex": lambda s: s["book"]["clients"]["a"].__setitem__(1, "zz"),
    "an invitation not hex": lambda s: s["book"]["invitations"].__setitem__("12", "zz"),
    "a generator state of another kind": lambda s: s.__setitem__("rng_state", {}),
    # accepted, then broke the run later (a version or lineage no frame can carry, a clock
    # that never reaches a window's end, a window count below zero)
    "a negative version": lambda s: s.__setitem__("version", -7),
    "a version past the wire's counters": lambda s: s.__setitem__("version", 10**30),
    "a ceiling below the version": lambda s: s.__setitem__("version_ceiling", 2),
    "a negative window count": lambda s: s.__setitem__("windows_closed", -3),
    "a time that is not a number": lambda s: s.__setitem__("time", math.nan),
    "an infinite time": lambda s: s.__setitem__("time", math.inf),
    "incarnations as one string": lambda s: s.__setitem__("incarnations", "abcdef"),
    "an incarnation no frame carries": lambda s: s.__setitem__("incarnations", ["XYZ"]),
    "a negative watermark": lambda s: s["book"]["clients"]["a"].__setitem__(0, -100),
    "a bitmap past its window": lambda s: s["book"]["clients"]["a"].__setitem__(1, "f" * 1000),
    "a client outside the run": lambda s: s["book"]["clients"].__setitem__("z", [0, "0", 0, 0, 0]),
}


@pytest.mark.parametrize("change", TAMPERED.values(), ids=TAMPERED.keys())
def test_a_tampered_checkpoint_is_refused_with_a_clear_error(tmp_path: Path, change: Any) -> None:
    """A checkpoint whose state no server writes (an attacker's review, session 64) is refused
    when it is read, naming the file, before a server restores anything from it."""
    checkpoint = _tampered(tmp_path, change)
    with pytest.raises(CheckpointError, match="server.ckpt is malformed"):
        _server().restore(checkpoint.load())


def test_an_untampered_checkpoint_of_a_fresh_server_still_loads(tmp_path: Path) -> None:
    checkpoint = _tampered(tmp_path, lambda state: None)
    _server().restore(checkpoint.load())
    fresh = ServerCheckpoint(tmp_path / "fresh", IDENTITY)
    fresh.save(_server().snapshot())
    _server().restore(fresh.load())
