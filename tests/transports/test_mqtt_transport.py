"""The MQTT endpoints against a real mosquitto with generated passwords and ACL (conftest.py)."""

from __future__ import annotations

import asyncio
import random
import shutil
import signal
import ssl
import subprocess
from pathlib import Path

import aiomqtt
import numpy as np
import pytest

from fedsim.errors import AccessDenied, ConfigError, TransportError
from fedsim.protocol import codec
from fedsim.protocol.messages import ClientStatus, ClientUpdate, GlobalModel, RunFinished
from fedsim.transports.base import Endpoint
from fedsim.transports.broker import MOSQUITTO_MISSING, find_mosquitto
from fedsim.transports.broker import LocalMosquitto as Broker
from fedsim.transports.mqtt import (
    BrokerSettings,
    MqttClientEndpoint,
    MqttServerEndpoint,
    ReconnectPolicy,
    TlsSettings,
    parse_broker_url,
)
from fedsim.transports.security import ListenerTls
from fedsim.transports.topics import Topics

RUN = "test-run"  # the run the ``mosquitto`` fixture's passwords and ACL are for
PARAMS = 64
FAST = ReconnectPolicy(initial_delay=0.05, max_delay=0.4, connect_timeout=5.0)


def update(client_id: str, round_: int) -> ClientUpdate:
    delta = np.random.default_rng(round_).standard_normal(PARAMS).astype(np.float32)
    return ClientUpdate(client_id, round_, 0, delta, 16.0)


def model(version: int) -> GlobalModel:
    return GlobalModel(version, np.full(PARAMS, version, np.float32))


def server(broker: Broker, **kwargs) -> MqttServerEndpoint:
    return MqttServerEndpoint(
        broker.server_url(), run=RUN, expected_params=PARAMS, reconnect=FAST, seed=0, **kwargs
    )


def client(broker: Broker, client_id: str, **kwargs) -> MqttClientEndpoint:
    return MqttClientEndpoint(
        broker.client_url(client_id),
        run=RUN,
        client_id=client_id,
        expected_params=PARAMS,
        reconnect=FAST,
        seed=1,
        **kwargs,
    )


async def welcomed(endpoint: MqttClientEndpoint, timeout: float = 5.0) -> str:
    """Wait until the client has learnt the live server's incarnation (its welcome)."""
    async with asyncio.timeout(timeout):
        while endpoint.incarnation.current is None:
            await asyncio.sleep(0.02)
    return endpoint.incarnation.current


async def receive_all(endpoint: Endpoint, *, quiet: float = 0.3) -> list:
    received = []
    while True:
        try:
            received.append(await asyncio.wait_for(endpoint.receive(), quiet))
        except TimeoutError:
            return received


@pytest.mark.mqtt
async def test_round_trip_updates_status_and_global(mosquitto: Broker) -> None:
    async with (
        server(mosquitto) as srv,
        client(mosquitto, "c1") as c1,
        client(mosquitto, "c2") as c2,
    ):
        assert isinstance(srv, Endpoint) and isinstance(c1, Endpoint)
        await srv.publish(model(1))
        for endpoint in (c1, c2):
            received = await asyncio.wait_for(endpoint.receive(), 5)
            assert isinstance(received, GlobalModel) and received.version == 1
            assert np.array_equal(received.params, model(1).params)
        sent = update("c1", 3)
        await c1.publish(sent)
        await c2.publish(ClientStatus("c2", "waiting", 2, 0.4, 1e-5, detail="stale"))
        got = [await asyncio.wait_for(srv.receive(), 5) for _ in range(2)]
        by_type = {type(m): m for m in got}
        assert by_type[ClientUpdate].delta.tobytes() == sent.delta.tobytes()
        assert by_type[ClientStatus].client_id == "c2" and by_type[ClientStatus].detail == "stale"
        assert srv.unacknowledged == 1
        assert srv.acknowledge({("c1", 3)}) == 1
        assert await c1.flush(5)  # the server's receipt reached the client
        assert c1.unacknowledged == () and c1.stats.acked == 1


@pytest.mark.mqtt
async def test_late_joiner_gets_the_retained_latest_model(mosquitto: Broker) -> None:
    async with server(mosquitto) as srv:
        for version in (1, 2, 3):
            await srv.publish(model(version))
        async with client(mosquitto, "c3") as late:
            assert [m.version for m in await receive_all(late)] == [3]


@pytest.mark.slow
@pytest.mark.mqtt
async def test_the_end_of_the_run_is_retained_and_follows_the_due_receipts(
    mosquitto: Broker,
) -> None:
    async with server(mosquitto) as srv, client(mosquitto, "c1") as c1:
        await srv.publish(model(1))
        await welcomed(c1)
        await c1.publish(update("c1", 0))
        assert isinstance(await asyncio.wait_for(srv.receive(), 5), ClientUpdate)
        srv.acknowledge({("c1", 0)})  # due, batched: it leaves before the end of the run
        await srv.publish(RunFinished(1, "stop.windows reached", 2.0))
        got = [m for m in await receive_all(c1) if not isinstance(m, GlobalModel)]
        assert got == [RunFinished(1, "stop.windows reached", 2.0)]
        assert c1.unacknowledged == ()  # its receipt came first
        incarnation = srv.incarnation.current
        # A client of this run that (re)connects later learns it from the retained message.
        async with client(mosquitto, "c2") as late:
            # (delivered once the live server's welcome confirms the incarnation)
            assert await receive_all(late, quiet=2.0) == [
                RunFinished(1, "stop.windows reached", 2.0)
            ]
            assert late.incarnation.current == incarnation
    # A new run of the same name: the old run's retained end is another incarnation's.
    async with server(mosquitto) as fresh, client(mosquitto, "c3") as newcomer:
        assert await welcomed(newcomer) == fresh.incarnation.current != incarnation
        await fresh.publish(model(1))
        assert [type(m) for m in await receive_all(newcomer)] == [GlobalModel]


@pytest.mark.mqtt
@pytest.mark.parametrize("credentials", ["wrong-password", "unknown-user", "anonymous"])
async def test_refused_credentials_raise_access_denied(mosquitto: Broker, credentials: str) -> None:
    url = {
        "wrong-password": mosquitto.url("c1", "not-the-password"),
        "unknown-user": mosquitto.url("mallory", "x"),
        "anonymous": mosquitto.url(),
    }[credentials]
    endpoint = MqttClientEndpoint(url, run=RUN, client_id="c1", reconnect=FAST)
    with pytest.raises(AccessDenied, match=f"127.0.0.1:{mosquitto.port} refused"):
        async with endpoint:
            pass
    assert isinstance(AccessDenied("x"), TransportError)


@pytest.mark.mqtt
async def test_no_broker_is_a_transport_error_with_context(unused_port: int) -> None:
    port = unused_port
    policy = ReconnectPolicy(initial_delay=0.05, max_delay=0.1, connect_timeout=0.5)
    with pytest.raises(TransportError, match=f"127.0.0.1:{port} within 0.5 s"):
        async with MqttServerEndpoint(f"mqtt://127.0.0.1:{port}", run=RUN, reconnect=policy):
            pass


async def _raw_client(broker: Broker, client_id: str) -> aiomqtt.Client:
    creds = broker.secrets.for_client(client_id)
    return aiomqtt.Client(
        broker.host, broker.port, username=creds.username, password=creds.password
    )


@pytest.mark.mqtt
async def test_acl_stops_a_client_publishing_on_another_clients_topic(mosquitto: Broker) -> None:
    topics = Topics(RUN)
    async with server(mosquitto) as srv:
        async with await _raw_client(mosquitto, "c1") as raw:
            # A well-formed update for c2, published by c1 on c2's topic: the broker drops it.
            stamp = srv.incarnation.current  # the raw client knows the run's incarnation
            await raw.publish(
                topics.updates("c2"), codec.encode(update("c2", 1), incarnation=stamp), qos=1
            )
            await raw.publish(
                topics.global_model, codec.encode(model(99), incarnation=stamp), qos=1, retain=True
            )
            await raw.publish(
                topics.updates("c1"), codec.encode(update("c1", 2), incarnation=stamp), qos=1
            )
        received = await receive_all(srv)
        assert [(m.client_id, m.round) for m in received] == [("c1", 2)]
        async with client(mosquitto, "c2") as c2:  # nobody but the server may write the model
            assert await receive_all(c2) == []


@pytest.mark.mqtt
async def test_server_denies_forged_ids_and_rejects_malformed_payloads(mosquitto: Broker) -> None:
    topics = Topics(RUN)
    nan_update = bytearray(codec.encode(update("c1", 7)))
    nan_update[-4:] = np.array([np.nan], dtype="<f4").tobytes()  # last parameter -> NaN
    oversized = b"FSIM" + bytes(codec.max_message_bytes(PARAMS))
    limit = codec.max_message_bytes(PARAMS)
    async with server(mosquitto, max_message_bytes=limit) as srv:
        stamp = srv.incarnation.current
        async with client(mosquitto, "c1") as c1:
            await welcomed(c1)
            await c1.publish(update("c2", 1))  # c1's own topic, c2's id in the payload
            await c1.publish(ClientStatus("c2", "done", 1, 0.1, 1e-5))
            assert not await c1.flush(0.5)  # a denied update is never acknowledged
        async with await _raw_client(mosquitto, "c1") as raw:
            junks = (b"", b"\x00" * 10, b"FSIM" + b"\xff" * 30, codec.encode(model(1)))
            truncated = codec.encode(update("c1", 8))[:-5]
            for junk in (*junks, bytes(nan_update), oversized, truncated):
                await raw.publish(topics.updates("c1"), junk, qos=1)
            wrong_shape = ClientUpdate("c1", 5, 0, np.ones(PARAMS + 1, np.float32), 1.0)
            await raw.publish(topics.updates("c1"), codec.encode(wrong_shape), qos=1)
            await raw.publish(topics.updates("c1"), codec.encode(update("c1", 9)), qos=1)
            valid = codec.encode(update("c1", 6), incarnation=stamp)
            await raw.publish(topics.updates("c1"), valid, qos=1)
        received = await receive_all(srv)
        assert [(m.client_id, m.round) for m in received] == [("c1", 6)]
        assert srv.stats.denied == 2 and srv.stats.rejected == 8
        assert srv.stats.other_incarnation == 1  # round 9, stamped with no incarnation
        assert srv.stats.refused_by_kind == {
            "forged_client_id": 2, "malformed": 4, "non_finite": 1, "oversized": 1,
            "other_incarnation": 1, "shape": 1, "wrong_topic": 1,
        }


@pytest.mark.mqtt
@pytest.mark.slow
async def test_broker_crash_and_restart_mid_stream_loses_no_update(mosquitto: Broker) -> None:
    rounds = 30
    async with (
        server(mosquitto) as srv,
        client(mosquitto, "c1", resend_after=1.0) as c1,
        client(mosquitto, "c2", resend_after=1.0) as c2,
    ):
        await srv.publish(model(1))
        await welcomed(c1)
        await welcomed(c2)
        received: list[ClientUpdate] = []

        async def collect() -> None:
            while True:
                message = await srv.receive()
                received.append(message)
                srv.acknowledge({(message.client_id, message.round)})

        collector = asyncio.create_task(collect())

        async def stream(endpoint: MqttClientEndpoint) -> None:
            for r in range(rounds):
                await endpoint.publish(update(endpoint.client_id, r))
                await asyncio.sleep(0.03)

        try:
            streams = asyncio.gather(stream(c1), stream(c2))
            await asyncio.sleep(0.3)
            mosquitto.kill()  # SIGKILL: the broker forgets sessions, retained model, queue
            await asyncio.sleep(0.5)
            await srv.publish(model(2))  # published while the broker is down: sent later
            mosquitto.start()
            await streams
            flushed = [await c1.flush(15), await c2.flush(15)]
            await asyncio.sleep(0.2)
        finally:
            collector.cancel()
        assert flushed == [True, True]

        expected = {(c, r) for c in ("c1", "c2") for r in range(rounds)}
        assert {(m.client_id, m.round) for m in received} == expected  # nothing lost
        assert srv.stats.connection_losses >= 1 and c1.stats.connection_losses >= 1
        # After the restart the server re-published its latest model as retained.
        versions = [m.version for m in await receive_all(c1)]
        assert versions and versions[-1] == 2
        async with client(mosquitto, "c3") as late:
            assert [m.version for m in await receive_all(late)] == [2]


@pytest.mark.mqtt
async def test_closed_endpoint_refuses_and_wakes_receivers(mosquitto: Broker) -> None:
    endpoint = client(mosquitto, "c1")
    async with endpoint:
        waiter = asyncio.create_task(endpoint.receive())
        await asyncio.sleep(0.05)
    with pytest.raises(TransportError, match="closed"):
        await waiter
    with pytest.raises(TransportError, match="closed"):
        await endpoint.publish(update("c1", 1))
    await endpoint.close()  # idempotent
    async with server(mosquitto) as srv:
        with pytest.raises(TransportError, match="GlobalModel, RunFinished or WindowClose only"):
            await srv.publish(update("c1", 1))


def test_broker_url_parsing() -> None:
    assert parse_broker_url("mqtt://broker") == BrokerSettings("broker", 1883)
    settings = parse_broker_url("mqtt://c%401:p%3Ass@10.0.0.2:1999")
    assert (settings.host, settings.port, settings.username, settings.password) == (
        "10.0.0.2",
        1999,
        "c@1",
        "p:ss",
    )
    assert "p:ss" not in repr(settings) and "p:ss" not in settings.describe()
    secure = parse_broker_url("mqtts://u:p@example.org")
    assert secure.port == 8883 and secure.tls == TlsSettings()
    for bad in ("http://x", "mqtt://", "mqtt://h:99999", "mqtt://h/path", "broker:1883"):
        with pytest.raises(ConfigError):
            parse_broker_url(bad)


def test_tls_settings_build_a_context() -> None:
    assert TlsSettings().context().verify_mode == ssl.CERT_REQUIRED
    insecure = TlsSettings(insecure=True).context()
    assert insecure.verify_mode == ssl.CERT_NONE and not insecure.check_hostname
    with pytest.raises(ConfigError, match="TLS settings unusable"):
        TlsSettings(ca_certs="/nonexistent/ca.pem").context()


def test_backoff_is_capped_exponential_with_jitter() -> None:
    policy = ReconnectPolicy(initial_delay=0.1, max_delay=2.0, multiplier=2.0)
    rng = random.Random(0)
    for attempt in range(12):
        cap = min(2.0, 0.1 * 2**attempt)
        delays = [policy.delay(attempt, rng) for _ in range(50)]
        assert all(cap / 2 <= d <= cap for d in delays)
        assert len(set(delays)) > 1  # jittered


def test_run_and_client_ids_must_be_topic_safe() -> None:
    with pytest.raises(ConfigError, match="run name"):
        Topics("a/b")
    with pytest.raises(ConfigError, match="MQTT topics"):
        MqttClientEndpoint("mqtt://h", run=RUN, client_id="+")


def _make_certificates(directory: Path) -> dict[str, Path]:
    """A throwaway CA and a server certificate for 127.0.0.1, made with the openssl CLI."""
    openssl = shutil.which("openssl")
    if openssl is None:
        pytest.skip("openssl is not installed")
    paths = {
        name: directory / name
        for name in ("ca.key", "ca.crt", "srv.key", "srv.csr", "srv.crt", "san.ext")
    }
    paths["san.ext"].write_text("subjectAltName=IP:127.0.0.1\n")
    commands = [
        [
            "req",
            "-x509",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-days",
            "1",
            "-subj",
            "/CN=fedsim-test-ca",
            "-keyout",
            paths["ca.key"],
            "-out",
            paths["ca.crt"],
        ],
        [
            "req",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-subj",
            "/CN=127.0.0.1",
            "-keyout",
            paths["srv.key"],
            "-out",
            paths["srv.csr"],
        ],
        [
            "x509",
            "-req",
            "-in",
            paths["srv.csr"],
            "-CA",
            paths["ca.crt"],
            "-CAkey",
            paths["ca.key"],
            "-CAcreateserial",
            "-days",
            "1",
            "-extfile",
            paths["san.ext"],
            "-out",
            paths["srv.crt"],
        ],
    ]
    for command in commands:
        subprocess.run([openssl, *map(str, command)], check=True, capture_output=True)
    return paths


@pytest.mark.mqtt
async def test_tls_listener_round_trip_and_untrusted_certificate_refused(tmp_path: Path) -> None:
    if find_mosquitto() is None:
        pytest.skip(MOSQUITTO_MISSING)
    certs = _make_certificates(tmp_path)
    tls = ListenerTls(certfile=str(certs["srv.crt"]), keyfile=str(certs["srv.key"]))
    broker = Broker(tmp_path / "broker", RUN, ["c1"], tls=tls)
    broker.start()
    try:
        trusted = TlsSettings(ca_certs=str(certs["ca.crt"]))
        server_url = parse_broker_url(broker.server_url(), tls=trusted)
        client_url = parse_broker_url(broker.client_url("c1"), tls=trusted)
        assert server_url.port == broker.port and server_url.tls == trusted
        async with (
            MqttServerEndpoint(server_url, run=RUN, expected_params=PARAMS, reconnect=FAST) as srv,
            MqttClientEndpoint(
                client_url, run=RUN, client_id="c1", expected_params=PARAMS, reconnect=FAST
            ) as c1,
        ):
            await srv.publish(model(1))
            assert (await asyncio.wait_for(c1.receive(), 5)).version == 1
            await c1.publish(update("c1", 4))
            assert (await asyncio.wait_for(srv.receive(), 5)).round == 4
        # The system CAs do not know this certificate: the connection is never made.
        untrusted = parse_broker_url(broker.client_url("c1"))
        quick = ReconnectPolicy(initial_delay=0.05, max_delay=0.1, connect_timeout=0.5)
        with pytest.raises(TransportError, match="cannot connect"):
            async with MqttClientEndpoint(untrusted, run=RUN, client_id="c1", reconnect=quick):
                pass
    finally:
        broker.kill(signal.SIGTERM)


@pytest.mark.mqtt
async def test_an_internal_failure_surfaces_instead_of_a_silent_dead_endpoint(
    mosquitto: Broker, monkeypatch: pytest.MonkeyPatch
) -> None:
    async def broken(self: MqttServerEndpoint, client: object) -> None:
        raise RuntimeError("boom")

    monkeypatch.setattr(MqttServerEndpoint, "_on_connected", broken)
    with pytest.raises(TransportError, match="server endpoint stopped: RuntimeError\\('boom'\\)"):
        async with server(mosquitto):
            pass


@pytest.mark.mqtt
async def test_updates_sent_while_the_server_is_away_wait_in_its_broker_session(
    mosquitto: Broker,
) -> None:
    async with client(mosquitto, "c1", resend_after=60.0) as c1:  # no resend within the test
        async with server(mosquitto) as first:
            await welcomed(c1)
        # The server's persistent session (and subscriptions) now exist on the broker.
        await c1.publish(update("c1", 1))
        await c1.publish(update("c1", 2))
        async with server(mosquitto, lineage=[first.incarnation.current]) as restarted:
            assert [m.round for m in await receive_all(restarted)] == [1, 2]
            restarted.acknowledge({("c1", 1), ("c1", 2)})
            assert await c1.flush(5) and c1.stats.resent == 0


@pytest.mark.mqtt
async def test_only_recorded_updates_are_acknowledged_the_rest_reach_the_next_server(
    mosquitto: Broker,
) -> None:
    """The server endpoint acknowledges what its owner says is durably recorded, nothing more:
    an update received by a server that dies before recording it is resent to its successor."""
    async with client(mosquitto, "c1", resend_after=0.5) as c1:
        first = server(mosquitto)
        await first.start()
        await welcomed(c1)
        for round_ in (1, 2, 3):
            await c1.publish(update("c1", round_))
        assert [m.round for m in await receive_all(first)] == [1, 2, 3]
        assert first.acknowledge({("c1", 1), ("c2", 2)}) == 1  # c2's round 2 was never received
        assert first.unacknowledged == 2
        await first.close()  # sends round 1's due receipt; rounds 2 and 3 were never recorded
        assert not await c1.flush(1.0) and c1.unacknowledged == (2, 3)
        assert c1.stats.acked == 1
        async with server(mosquitto, lineage=[first.incarnation.current]) as successor:
            rounds: set[int] = set()
            while rounds != {2, 3}:  # resent, maybe more than once (the server de-duplicates)
                message = await asyncio.wait_for(successor.receive(), 5)
                rounds.add(message.round)
            assert successor.acknowledge({("c1", r) for r in rounds}) == 2
            assert await c1.flush(5) and c1.stats.resent >= 2


@pytest.mark.mqtt
async def test_a_clients_table_of_unrecorded_rounds_stays_bounded(
    mosquitto: Broker, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Rounds the book cannot judge (round_ahead: a distinct forged far round each time) used to
    # stay in the server endpoint's table for the process's life; now a client's table is
    # bounded and its highest rounds are forgotten (counted): the forged ones, not the honest
    # rounds below them, which are still acknowledged.
    from fedsim.transports import mqtt_server

    monkeypatch.setattr(mqtt_server, "MAX_UNRECORDED_PER_CLIENT", 16)
    async with server(mosquitto) as srv:
        stamp = srv.incarnation.current
        async with await _raw_client(mosquitto, "c1") as raw:
            for forged in range(40):
                await raw.publish(Topics(RUN).updates("c1"), codec.encode(
                    update("c1", 10**6 + forged), incarnation=stamp), qos=1)
        async with client(mosquitto, "c1") as c1:
            await welcomed(c1)
            for round_ in range(10):
                await c1.publish(update("c1", round_))
            received = await receive_all(srv)
            assert len(received) == 50  # every message still reaches the server's inbox
            held = srv.unacknowledged
            assert 12 <= held <= 16 and srv.stats.receipts_forgotten == 50 - held
            honest = {("c1", r) for r in range(10)}
            assert srv.acknowledge(honest | {("c1", 10**6 + 39)}) == 10  # all honest kept
            assert await c1.flush(5) and c1.unacknowledged == ()


def test_a_client_outbox_larger_than_the_servers_bounds_is_refused() -> None:
    # The server's round gap and receipt table are four times limits.MAX_UNACKNOWLEDGED; a
    # longer outbox would have honest resends refused as round_ahead.
    from fedsim.config import limits
    from fedsim.runtime.actors.client_book import WINDOW

    assert WINDOW == 1024 == 4 * limits.MAX_UNACKNOWLEDGED  # checkpointed bitmaps are this wide
    for bad in (0, limits.MAX_UNACKNOWLEDGED + 1, True):
        with pytest.raises(ConfigError, match="max_unacknowledged must be between 1 and 256"):
            MqttClientEndpoint("mqtt://127.0.0.1:1", run=RUN, client_id="c1",
                               max_unacknowledged=bad)
    MqttClientEndpoint("mqtt://127.0.0.1:1", run=RUN, client_id="c1",
                       max_unacknowledged=limits.MAX_UNACKNOWLEDGED)
