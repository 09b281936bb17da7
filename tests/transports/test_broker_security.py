"""What `fedsim deploy` generates, run by the installed mosquitto: TLS by default (a fresh CA,
made by the `cryptography` package or by openssl), PBKDF2 at the shipped iteration count, private
password and ACL files, client ids bound to usernames (taking the server's client id no longer
kicks the server off)."""

from __future__ import annotations

import argparse
import asyncio
import getpass
import json
import signal
import stat
import subprocess
import time
from pathlib import Path

import aiomqtt
import numpy as np
import pytest

from fedsim.commands import deploy
from fedsim.errors import AccessDenied, TransportError
from fedsim.protocol.messages import ClientUpdate, GlobalModel
from fedsim.transports import certificates
from fedsim.transports.broker import LocalMosquitto, find_mosquitto, free_loopback_port
from fedsim.transports.mqtt import (
    MqttClientEndpoint,
    MqttServerEndpoint,
    ReconnectPolicy,
    TlsSettings,
    parse_broker_url,
)
from fedsim.transports.security import PBKDF2_ITERATIONS, load_secrets

FAST = ReconnectPolicy(initial_delay=0.05, max_delay=0.4, connect_timeout=10.0)
needs_mosquitto = pytest.mark.skipif(find_mosquitto() is None, reason="mosquitto is not installed")


def run_deploy(*argv: str) -> int:
    parser = argparse.ArgumentParser()
    deploy.register(parser.add_subparsers(dest="command"))
    args = parser.parse_args(["deploy", *argv])
    return args.func(args)


def _start(config: Path, port: int) -> subprocess.Popen[bytes]:
    binary = find_mosquitto()
    assert binary is not None
    log = (config.parent / "mosquitto.log").open("ab")
    process = subprocess.Popen([binary, "-c", str(config)], stdout=log, stderr=subprocess.STDOUT)
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        assert process.poll() is None, (config.parent / "mosquitto.log").read_text()
        try:
            import socket

            socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
            return process
        except OSError:
            time.sleep(0.05)
    process.kill()
    raise AssertionError("mosquitto did not start")


def test_deploy_defaults_to_tls_and_private_files(tmp_path: Path, capsys) -> None:
    out = tmp_path / "gen"
    assert run_deploy("--client-id", "a", "--run", "r", "--out", str(out)) == 0
    conf = (out / "mosquitto.conf").read_text()
    assert f"listener 8883 0.0.0.0\ncertfile {out.resolve()}/broker.crt\n" in conf
    assert "use_username_as_clientid true" in conf and "allow_anonymous false" in conf
    for name in ("passwd", "acl", "secrets.json", "broker.key"):
        assert stat.S_IMODE((out / name).stat().st_mode) == 0o600, name
    assert not any(p.name.startswith("ca.key") for p in out.iterdir())  # the CA key is forgotten
    for line in (out / "passwd").read_text().splitlines():
        assert line.split("$")[2] == str(PBKDF2_ITERATIONS) == "1000"
    printed = capsys.readouterr().out
    assert "mqtts://HOST:8883" in printed and f"--tls-ca {out / 'ca.crt'}" in printed
    assert run_deploy("--client-id", "a", "--run", "r", "--out", str(tmp_path / "p"), "--plain") == 0
    plain = (tmp_path / "p" / "mosquitto.conf").read_text()
    assert "listener 1883 0.0.0.0\nallow_anonymous" in plain and "certfile" not in plain
    assert "WARNING: --plain" in capsys.readouterr().out


@pytest.mark.slow
@needs_mosquitto
@pytest.mark.mqtt
@pytest.mark.parametrize("backend", ["cryptography", "openssl"])
async def test_mosquitto_runs_the_generated_files(
    tmp_path: Path, backend: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    if backend == "openssl":  # as where the cryptography package is missing
        monkeypatch.setattr(certificates, "_with_cryptography", certificates._with_openssl)
    out, port = tmp_path / "gen", free_loopback_port()
    argv = ["--client-id", "c1", "--run", "r", "--out", str(out), "--port", str(port),
            "--bind", "127.0.0.1", "--broker-user", getpass.getuser()]
    assert run_deploy(*argv) == 0
    secrets = load_secrets(out / "secrets.json")
    broker = _start(out / "mosquitto.conf", port)
    try:
        trust = TlsSettings(ca_certs=str(out / "ca.crt"))

        def url(user: str, password: str) -> object:
            return parse_broker_url(f"mqtts://{user}:{password}@127.0.0.1:{port}", tls=trust)

        server = MqttServerEndpoint(url(secrets.server.username, secrets.server.password),
                                    run="r", reconnect=FAST)
        c1 = MqttClientEndpoint(url("c1", secrets.for_client("c1").password), run="r",
                                client_id="c1", reconnect=FAST)
        async with server, c1:
            await server.publish(GlobalModel(3, np.zeros(4, np.float32)))
            assert (await asyncio.wait_for(c1.receive(), 10)).version == 3
            await c1.publish(ClientUpdate("c1", 0, 3, np.zeros(4, np.float32), 8.0))
            assert (await asyncio.wait_for(server.receive(), 10)).round == 0
        with pytest.raises(AccessDenied):
            async with MqttClientEndpoint(url("c1", "wrong"), run="r", client_id="c1",
                                          reconnect=FAST):
                pass
        plain = parse_broker_url(f"mqtt://c1:{secrets.for_client('c1').password}@127.0.0.1:{port}")
        quick = ReconnectPolicy(initial_delay=0.05, max_delay=0.1, connect_timeout=1.0)
        with pytest.raises(TransportError):  # the listener speaks TLS only
            async with MqttClientEndpoint(plain, run="r", client_id="c1", reconnect=quick):
                pass
    finally:
        broker.send_signal(signal.SIGTERM)
        broker.wait(10)


@needs_mosquitto
@pytest.mark.mqtt
async def test_taking_the_servers_client_id_no_longer_kicks_the_server(tmp_path: Path) -> None:
    with LocalMosquitto(tmp_path / "b", "r", ["c1"]) as broker:
        async with MqttServerEndpoint(broker.server_url(), run="r", reconnect=FAST) as server:
            password = broker.secrets.for_client("c1").password
            # c1 connects claiming the server's MQTT client id: the broker uses "c1" instead.
            async with aiomqtt.Client(broker.host, broker.port, username="c1", password=password,
                                      identifier="fedsim-r-server", clean_session=False):
                await asyncio.sleep(1.0)
            await asyncio.sleep(0.5)
            assert server.connected and server.stats.connection_losses == 0
            log = broker.log_path.read_text()
            assert "already connected, closing old connection" not in log


def test_generated_certificates_name_the_given_hosts(tmp_path: Path) -> None:
    pytest.importorskip("cryptography")
    from cryptography import x509

    files = certificates.write_tls_files(tmp_path, ["mqtt.example.org", "10.0.0.7"])
    cert = x509.load_pem_x509_certificate(files.cert.read_bytes())
    names = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert names.get_values_for_type(x509.DNSName) == ["mqtt.example.org"]
    assert [str(ip) for ip in names.get_values_for_type(x509.IPAddress)] == ["10.0.0.7"]
    ca = x509.load_pem_x509_certificate(files.ca_cert.read_bytes())
    cert.verify_directly_issued_by(ca)
    assert json.dumps(stat.S_IMODE(files.key.stat().st_mode)) == str(0o600)


@pytest.mark.slow
def test_a_tls_compose_file_connects_over_mqtts_and_trusts_the_runs_ca(tmp_path: Path) -> None:
    import yaml

    repo = Path(__file__).resolve().parents[2]
    compose = tmp_path / "compose.yml"
    out = tmp_path / "gen"
    assert run_deploy(str(repo / "scenarios" / "quickstart.yaml"), "--out", str(out),
                      "--compose", str(compose)) == 0
    document = yaml.safe_load(compose.read_text())
    assert document["secrets"]["fedsim-ca"] == {"file": "./gen/ca.crt"}
    for name, service in document["services"].items():
        if name == "broker":
            continue
        command = service["command"]
        assert command[command.index("--broker") + 1] == "mqtts://broker:8883", name
        assert command[command.index("--tls-ca") + 1] == deploy.CONTAINER_CA, name
        assert {"source": "fedsim-ca", "target": deploy.CONTAINER_CA} in service["secrets"]
