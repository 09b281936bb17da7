"""A curious server against deployed clients over a real mosquitto (127.0.0.1, free port).

The server knows the scenario (its seed included) and sees every message. It tries to
rebuild a client's noise by regenerating the client's seeded stream; by default the client
draws from OS entropy, so the rebuilt noise is uncorrelated with what the client released. In
the opt-in ``seeded_not_private`` mode the same attack recovers the noise (which shows the
attack works) and the run's outputs say it is not private.

Client sampling by invitation over MQTT: with ``server.participation = 0.5`` every round a
client released was begun under an invitation naming it, and no update is rejected.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
import yaml

from fedsim.config import load_scenario
from fedsim.protocol.messages import ClientStatus, ClientUpdate, GlobalModel
from fedsim.runtime.actors.client_book import BookState, ClientBook
from fedsim.runtime.deployed.client_process import run_client
from fedsim.runtime.deployed.collection import collect_outputs
from fedsim.runtime.deployed.launcher import Launcher
from fedsim.runtime.deployed.options import LAUNCH_WAIT_FOR_CLIENTS, DeploymentOptions
from fedsim.runtime.population import build_population
from fedsim.training.gaussian import gaussian_noise
from fedsim.transports.broker import LocalMosquitto, find_mosquitto
from fedsim.transports.mqtt import MqttServerEndpoint, parse_broker_url

pytestmark = [
    pytest.mark.mqtt,
    pytest.mark.slow,
    pytest.mark.skipif(find_mosquitto() is None, reason="mosquitto is not installed"),
]
torch.set_num_threads(1)

CLIENT = "c-000"
ROUNDS = 4
FOUR_CLIENTS = Path(__file__).with_name("four_clients.yaml")


def _scenario_file(tmp_path: Path, randomness: str) -> Path:
    """One client whose update is noise-dominated: P = 2,010 parameters, noise of norm about
    sigma C sqrt(P) = 45 C against a clipped sum of norm at most |B| C (|B| about 8)."""
    data = {
        "name": "curious-server", "seed": 21, "stop": {"windows": 1},
        "dataset": {"name": "synthetic", "num_samples": 400, "num_test_samples": 50,
                    "num_features": 200, "num_classes": 10},
        "model": {"name": "logreg"},
        "clients": {"groups": [
            {"name": "c", "count": 1, "data_share": 1.0, "batch_size": 8, "sampling": "poisson",
             "clip": 1.0, "noise": 1.0, "local_lr": 0.1, "rounds": ROUNDS,
             "speed": 0.0005}]},  # a public slot: deployed postures need one (SECURITY.md)
        "server": {"window": 1.0},
        "privacy": {"deployed_randomness": randomness},
    }
    path = tmp_path / "scenario.yaml"
    path.write_text(yaml.safe_dump(data), encoding="utf-8")
    return path


async def _serve_one_client(broker: LocalMosquitto, loaded: Any, state: Path) -> list[Any]:
    """Play the server: publish the initial model, receive (and acknowledge) everything the
    client sends until it is done."""
    population = build_population(loaded)
    size = int(population.initial_params.size)
    received: list[Any] = []
    async with MqttServerEndpoint(broker.server_url(), run=broker.run,
                                  expected_params=size) as server:
        client = asyncio.create_task(run_client(
            loaded, CLIENT, parse_broker_url(broker.client_url(CLIENT)), run=broker.run,
            state_dir=state, flush_timeout=10.0, population=population))
        await server.publish(GlobalModel(1, population.initial_params.copy(), 0.0, 1))
        while not (received and isinstance(received[-1], ClientStatus)
                   and received[-1].state == "done"):
            message = await asyncio.wait_for(server.receive(), 60.0)
            received.append(message)
            if isinstance(message, ClientUpdate):
                server.acknowledge({(message.client_id, message.round)})
        await asyncio.wait_for(client, 60.0)
    return received


def _rebuilt_noise_correlations(loaded: Any, updates: list[ClientUpdate]) -> list[float]:
    """The attack: regenerate the client's seeded stream ``client/<id>/train`` from the
    scenario, replay the trainer's draws round by round, and correlate each round's noise (the
    sampler's values for the replayed key; correlation ignores its scale) with the update."""
    population = build_population(loaded)
    plan = population.plans[0]
    trainer = population.trainer(plan, generator=population.tree.torch("client", CLIENT, "train"))
    size = int(population.initial_params.size)
    correlations = []
    for update in sorted(updates, key=lambda u: u.round):
        pending = trainer.begin_round(population.initial_params, update.round)
        guess = gaussian_noise(size, 1.0, pending.draws[0].noise, torch.zeros(size)).numpy()
        correlations.append(float(np.corrcoef(guess, update.delta)[0, 1]))
    return correlations


@pytest.mark.parametrize("randomness", ["os_entropy", "seeded_not_private"])
def test_the_server_cannot_rebuild_a_deployed_clients_noise(tmp_path: Path, randomness) -> None:
    loaded = load_scenario(_scenario_file(tmp_path, randomness))
    broker = LocalMosquitto(tmp_path / "broker", "curious", [CLIENT])
    broker.start()
    try:
        received = asyncio.run(_serve_one_client(broker, loaded, tmp_path / "state"))
    finally:
        broker.kill()
    updates = [m for m in received if isinstance(m, ClientUpdate)]
    assert [u.round for u in updates] == list(range(ROUNDS))
    correlations = _rebuilt_noise_correlations(loaded, updates)
    size = updates[0].delta.size
    report = json.loads((tmp_path / "state" / f"client-{CLIENT}.json").read_text())
    assert report["randomness"] == randomness
    (tmp_path / "out").mkdir()
    summary = collect_outputs(loaded, tmp_path / "out", {CLIENT: tmp_path / "state"},
                              wall_seconds=1.0)
    caveats = summary["privacy"]["caveats"]
    if randomness == "os_entropy":
        # Uncorrelated: each correlation is about N(0, 1/P); 4.5 standard deviations.
        assert max(abs(c) for c in correlations) < 4.5 / np.sqrt(size), correlations
        assert not any("NOT PRIVATE" in c for c in caveats)
    else:
        # The attack works on a seeded client: its noise is recovered (the update is noise).
        assert min(correlations) > 0.9, correlations
        assert any("NOT PRIVATE" in c and CLIENT in c for c in caveats)


def test_uninvited_deployed_clients_neither_train_nor_spend(tmp_path: Path) -> None:
    """``fedsim launch`` with participation 0.5: each window's invitation reaches the client
    processes through the retained global model; the rounds each client released were all
    begun under an invitation naming it (checked against the server's checkpoint), and the
    server rejected nothing."""
    options = DeploymentOptions(time_scale=0.25, max_backoff=0.5,
                                wait_for_clients=LAUNCH_WAIT_FOR_CLIENTS)
    launcher = Launcher(FOUR_CLIENTS, tmp_path / "run", options=options,
                        overrides=["server.participation=0.5", "stop.windows=14"])
    summary = launcher.run_to_end(timeout=240.0)
    assert summary["updates"]["rejected"] == 0 and summary["updates"]["applied"] > 0
    with np.load(tmp_path / "run" / "state" / "server" / "server.ckpt", allow_pickle=False) as f:
        state = json.loads(f["state"].tobytes())
    book = ClientBook(dict.fromkeys(launcher.client_ids), 1)
    book.load(BookState.from_document(state["book"]))
    invitations = {int(w): {c for c in launcher.client_ids if book.invited(c, int(w))}
                   for w in state["book"]["invitations"]}
    assert invitations and all(len(ids) == 2 for ids in invitations.values())
    released = 0
    for client_id in launcher.client_ids:
        report = json.loads((tmp_path / "run" / "state" / client_id
                             / f"client-{client_id}.json").read_text())
        for record in report["released"]:
            assert client_id in invitations[record["window"]], (client_id, record)
            released += 1
    assert released > 0
