"""A process given only its own per-process secrets file (``secrets/<username>.json``, what
each container of the compose file gets) works as itself and as nobody else: a real ``fedsim
client`` process connects with it and is heard by the server; the same file given to a server
or to another client is refused with an error naming the file; and the real broker refuses its
password under any other username."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

import fedsim
from fedsim.cli import main
from fedsim.errors import AccessDenied
from fedsim.protocol.messages import ClientStatus
from fedsim.runtime.deployed.deployment import resolve_broker
from fedsim.transports.broker import LocalMosquitto, find_mosquitto
from fedsim.transports.mqtt import MqttClientEndpoint, MqttServerEndpoint, ReconnectPolicy
from fedsim.transports.security import SERVER_USERNAME, aggregator_username, load_secrets

SCENARIO = Path(__file__).with_name("four_clients.yaml")
REPO = Path(fedsim.__file__).resolve().parents[1]
RUN = "deploy-four"  # the scenario's name
FAST = ReconnectPolicy(initial_delay=0.05, max_delay=0.4, connect_timeout=10.0)

pytestmark = [
    pytest.mark.mqtt,
    pytest.mark.skipif(find_mosquitto() is None, reason="mosquitto is not installed"),
]


def _client_process(broker: LocalMosquitto, tmp_path: Path, client_id: str,
                    secrets: Path) -> subprocess.Popen[bytes]:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        [str(REPO), *filter(None, [os.environ.get("PYTHONPATH")])])}
    env.pop("FEDSIM_SECRETS", None)
    argv = [sys.executable, "-m", "fedsim", "client", "--scenario", str(SCENARIO),
            "--client-id", client_id, "--broker", broker.url(), "--secrets", str(secrets),
            "--state", str(tmp_path / "state"), "--json-logs"]
    with (tmp_path / "client.log").open("wb") as log:
        return subprocess.Popen(argv, env=env, stdout=log, stderr=subprocess.STDOUT)


@pytest.mark.slow
async def test_a_client_process_with_its_own_file_connects_and_is_heard(tmp_path: Path) -> None:
    with LocalMosquitto(tmp_path / "broker", RUN, ["c-000", "c-001"],
                        per_process_secrets=True) as broker:
        # The server too reads only its own file.
        settings, run = resolve_broker(
            broker.url(), secrets_file=broker.files.process_secrets_file(SERVER_USERNAME),
            role="server")
        assert run == RUN
        async with MqttServerEndpoint(settings, run=RUN, reconnect=FAST) as server:
            process = _client_process(broker, tmp_path, "c-000",
                                      broker.files.process_secrets_file("c-000"))
            try:
                # Its "connected" status, published on its own topic: logged in as itself.
                status = await asyncio.wait_for(server.receive(), 120)
                assert isinstance(status, ClientStatus) and status.client_id == "c-000"
            finally:
                os.kill(process.pid, signal.SIGTERM)
                code = await asyncio.to_thread(process.wait, 60)
    assert code == 0, (tmp_path / "client.log").read_text()


@pytest.mark.parametrize(
    ("argv", "whose"),
    [
        (["server", "--out", "out"], "the server"),
        (["client", "--client-id", "c-001"], "client 'c-001'"),
        (["aggregator", "--aggregator-id", "aggregator-0", "--set", "aggregators.count=1"],
         "aggregator 'aggregator-0'"),
    ],
    ids=["as-the-server", "as-another-client", "as-an-aggregator"],
)
def test_a_clients_file_used_for_another_process_is_a_clear_error(
    argv: list[str], whose: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys
) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("FEDSIM_SECRETS", raising=False)
    from fedsim.transports.security import generate_secrets, write_secrets

    everyone = generate_secrets(RUN, ["c-000", "c-001"], ["aggregator-0"])
    file = tmp_path / "c-000.json"
    write_secrets(file, everyone.per_process()["secrets/c-000.json"])
    code = main([*argv, "--scenario", str(SCENARIO), "--broker", "mqtt://127.0.0.1:9",
                 "--secrets", str(file), "--state", str(tmp_path / "state")])
    err = capsys.readouterr().err
    assert code == 2, err
    assert f"secrets file {file}" in err and f"no credentials for {whose}" in err, err
    assert "client 'c-000''s own file" in err and "Traceback" not in err


async def test_the_broker_refuses_a_password_under_any_other_username(tmp_path: Path) -> None:
    """c-000's own file logs in as c-000; its password as the server, another client or an
    aggregator is refused by mosquitto itself (the container cannot act as anyone else)."""
    with LocalMosquitto(tmp_path / "broker", RUN, ["c-000", "c-001"],
                        aggregators=["aggregator-0"], per_process_secrets=True) as broker:
        mine = load_secrets(broker.files.process_secrets_file("c-000")).for_client("c-000")
        async with MqttClientEndpoint(broker.url(mine.username, mine.password), run=RUN,
                                      client_id="c-000", reconnect=FAST) as own:
            assert own.connected
        for username in (SERVER_USERNAME, "c-001", aggregator_username("aggregator-0")):
            url = broker.url(username, mine.password)
            endpoint = (MqttServerEndpoint(url, run=RUN, reconnect=FAST)
                        if username == SERVER_USERNAME else
                        MqttClientEndpoint(url, run=RUN, client_id=username, reconnect=FAST))
            with pytest.raises(AccessDenied):
                async with endpoint:
                    pass
