"""A deployed client started on a lost ledger stops before it releases anything (session 49's
"left"): a fresh, empty state directory (the default ``fedsim-state/RUN/ID`` resolved from
another working directory, a volume not mounted) holds no sign of the client's earlier life,
so only the server can tell. Its book knows how many rounds each client released
(``ClientBook.known_rounds``) and says so in every welcome and receipt; a client whose ledger
records fewer confirms nothing, trains on nothing and exits with a LedgerError.

Over a real mosquitto (127.0.0.1, free port), with the real client process and a server
endpoint answering from a real client book."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest
import torch
import yaml

from fedsim.config import load_scenario
from fedsim.errors import LedgerError
from fedsim.privacy.events import GaussianStep
from fedsim.privacy.ledger import PrivacyLedger
from fedsim.privacy.ledger_repair import repair_ledger
from fedsim.protocol.messages import ClientStatus, ClientUpdate, GlobalModel
from fedsim.runtime.actors.client_book import ClientBook
from fedsim.runtime.deployed.client_process import run_client
from fedsim.runtime.population import build_population
from fedsim.runtime.run_outputs import ledger_file
from fedsim.transports.broker import LocalMosquitto, find_mosquitto
from fedsim.transports.mqtt import MqttServerEndpoint, parse_broker_url

pytestmark = [
    pytest.mark.mqtt,
    pytest.mark.skipif(find_mosquitto() is None, reason="mosquitto is not installed"),
]
torch.set_num_threads(1)

CLIENT = "c-000"
ROUNDS = 3


def _scenario(tmp_path: Path) -> Any:
    data = {
        "name": "lost-ledger", "seed": 4, "stop": {"windows": 1},
        "dataset": {"name": "synthetic", "num_samples": 300, "num_test_samples": 50,
                    "num_features": 6, "num_classes": 2},
        "model": {"name": "logreg"},
        "clients": {"groups": [
            {"name": "c", "count": 1, "data_share": 1.0, "batch_size": 8, "sampling": "poisson",
             "clip": 1.0, "noise": 1.0, "local_lr": 0.1, "rounds": ROUNDS,
             "speed": 0.0005}]},
        "server": {"window": 1.0},
    }
    path = tmp_path / "scenario.yaml"
    path.write_text(yaml.safe_dump(data), encoding="utf-8")
    return load_scenario(path)


async def _serve(broker: LocalMosquitto, loaded: Any, book: ClientBook, state: Path, *,
                 judge: bool = True) -> tuple[list[Any], dict[str, Any] | BaseException]:
    """Play the server for one start of the client on ``state``: publish a model, record and
    acknowledge every update in ``book`` (``judge=False``: hold them unjudged, as a window
    does until its end), until the client process ends."""
    population = build_population(loaded)
    received: list[Any] = []
    async with MqttServerEndpoint(broker.server_url(), run=broker.run,
                                  expected_params=int(population.initial_params.size),
                                  known_rounds=book.known_rounds) as server:
        client = asyncio.create_task(run_client(
            loaded, CLIENT, parse_broker_url(broker.client_url(CLIENT)), run=broker.run,
            state_dir=state, flush_timeout=10.0 if judge else 1.0, population=population))
        await server.publish(GlobalModel(1, population.initial_params.copy(), 0.0, 1))
        while not client.done():
            try:
                message = await asyncio.wait_for(server.receive(), 0.5)
            except TimeoutError:
                continue
            received.append(message)
            if isinstance(message, ClientUpdate) and judge:
                book.record(message.client_id, message.round)
                server.acknowledge({(message.client_id, message.round)})
        outcome: dict[str, Any] | BaseException = (
            client.exception() or client.result())  # type: ignore[assignment]
    return received, outcome


def _released(received: list[Any]) -> list[int]:
    return [m.round for m in received if isinstance(m, ClientUpdate)]


def test_a_client_on_a_fresh_state_directory_stops_before_it_releases(tmp_path: Path) -> None:
    loaded = _scenario(tmp_path)
    size = int(build_population(loaded).initial_params.size)
    book = ClientBook({CLIENT: None}, size)
    broker = LocalMosquitto(tmp_path / "broker", "lost", [CLIENT])
    broker.start()
    try:
        first, outcome = asyncio.run(asyncio.wait_for(
            _serve(broker, loaded, book, tmp_path / "own"), 120))
        assert _released(first) == list(range(ROUNDS)), outcome
        assert book.known_rounds(CLIENT) == ROUNDS

        # The same client on a fresh directory: refused, nothing released, nothing spent.
        fresh = tmp_path / "fresh"
        second, refused = asyncio.run(asyncio.wait_for(_serve(broker, loaded, book, fresh), 60))
        assert isinstance(refused, LedgerError), refused
        assert f"received {ROUNDS} rounds" in str(refused)
        assert str(ledger_file(fresh, CLIENT)) in str(refused)
        assert _released(second) == []
        assert any(isinstance(m, ClientStatus) for m in second)  # it did reach the server
        with PrivacyLedger.open(ledger_file(fresh, CLIENT), client_id=CLIENT,
                                sampling="poisson", budget=None, read_only=True) as ledger:
            assert ledger.records == ()
        report = json.loads((fresh / f"client-{CLIENT}.json").read_text(encoding="utf-8"))
        assert "received 3 rounds" in report["refused"]

        # Its own directory again: not refused (the book's count is what its ledger records).
        third, done = asyncio.run(asyncio.wait_for(
            _serve(broker, loaded, book, tmp_path / "own"), 60))
        assert isinstance(done, dict), done
        assert done["refused"] is None
        assert done["first_round"] == ROUNDS
        assert _released(third) == []  # its rounds were all spent before
    finally:
        broker.kill()


def test_rounds_received_and_not_yet_judged_count_too(tmp_path: Path) -> None:
    """The client's rounds are still waiting in the server's window (received, not judged,
    not acknowledged) when it restarts on a fresh directory: the welcome counts them."""
    loaded = _scenario(tmp_path)
    book = ClientBook({CLIENT: None}, int(build_population(loaded).initial_params.size))
    broker = LocalMosquitto(tmp_path / "broker", "unjudged", [CLIENT])
    broker.start()
    try:
        async def both() -> tuple[list[Any], Any]:
            population = build_population(loaded)
            received: list[Any] = []
            async with MqttServerEndpoint(broker.server_url(), run=broker.run,
                                          expected_params=int(population.initial_params.size),
                                          known_rounds=book.known_rounds) as server:
                await server.publish(GlobalModel(1, population.initial_params.copy(), 0.0, 1))
                outcomes = []
                for state in (tmp_path / "own", tmp_path / "fresh"):
                    client = asyncio.create_task(run_client(
                        loaded, CLIENT, parse_broker_url(broker.client_url(CLIENT)),
                        run=broker.run, state_dir=state, flush_timeout=1.0,
                        population=population))
                    while not client.done():
                        try:
                            received.append(await asyncio.wait_for(server.receive(), 0.5))
                        except TimeoutError:
                            continue
                    outcomes.append(client.exception() or client.result())
            return received, outcomes

        received, (first, second) = asyncio.run(asyncio.wait_for(both(), 120))
    finally:
        broker.kill()
    assert isinstance(first, dict) and first["unacknowledged"] == list(range(ROUNDS))
    assert book.known_rounds(CLIENT) == 0  # nothing judged: the window has not ended
    assert isinstance(second, LedgerError), second
    assert f"received {ROUNDS} rounds" in str(second)
    assert _released(received) == list(range(ROUNDS))  # the fresh start released nothing


def test_a_repaired_ledger_resumes_past_its_lost_rounds(tmp_path: Path) -> None:
    """Its tail lost and repaired (a substitute for the lost record, at round -1): the client
    numbers its rounds past the substitutes (``PrivacyLedger.next_round``) and is not taken
    for one on a lost ledger (a review's finding: it was refused at every start)."""
    loaded = _scenario(tmp_path)
    book = ClientBook({CLIENT: None}, int(build_population(loaded).initial_params.size))
    broker = LocalMosquitto(tmp_path / "broker", "repaired", [CLIENT])
    broker.start()
    own = tmp_path / "own"
    path = ledger_file(own, CLIENT)
    try:
        first, _ = asyncio.run(asyncio.wait_for(_serve(broker, loaded, book, own), 120))
        assert _released(first) == list(range(ROUNDS))
        lines = path.read_bytes().splitlines(keepends=True)
        path.write_bytes(b"".join(lines[:-1]))  # the last round's record is lost
        step = GaussianStep.from_json(json.loads(lines[-2])["step"])
        # the lost record, and the last kept (no later line vouches for it)
        assert repair_ledger(path, lost_step=step).substituted == 2
        second, outcome = asyncio.run(asyncio.wait_for(_serve(broker, loaded, book, own), 60))
    finally:
        broker.kill()
    assert isinstance(outcome, dict), outcome
    assert outcome["refused"] is None
    assert outcome["first_round"] == ROUNDS + 1  # 2 rounds kept + 2 substitutes
    assert _released(second) == []
