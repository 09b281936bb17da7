"""The rounds a server knows a client released, as it tells them (tests/deployment/
test_lost_ledger.py plays the whole exchange over mosquitto): where the count comes from
before and after the server actor exists, which messages may carry it, and hostile values."""

from __future__ import annotations

import json

import numpy as np
import pytest
from pydantic import ValidationError

from fedsim.errors import LedgerError
from fedsim.protocol.messages import GlobalModel
from fedsim.runtime.actors.client_book import ClientBook
from fedsim.runtime.deployed.server_process import _KnownRounds
from fedsim.transports.mqtt import MqttClientEndpoint, MqttServerEndpoint
from fedsim.transports.mqtt_receipts import Ack

BROKER = "mqtt://127.0.0.1:9"  # never connected: these tests drive the endpoints' handlers


def test_a_restarted_server_answers_from_its_checkpoint_until_its_actor_exists() -> None:
    saved = ClientBook({"a": None, "b": None}, 3)
    for round_ in range(5):
        saved.record("a", round_)
    known = _KnownRounds(saved.state())
    assert (known("a"), known("b")) == (5, 0)
    live = ClientBook({"a": None, "b": None}, 3)
    live.load(saved.state())
    live.record("a", 5)
    live.record("b", 0)
    known.book = live
    assert (known("a"), known("b")) == (6, 1)
    assert _KnownRounds(None)("a") == 0  # a fresh server knows nothing


def test_the_welcome_counts_rounds_waiting_to_be_judged() -> None:
    book = ClientBook({"a": None}, 3)
    book.record("a", 0)
    server = MqttServerEndpoint(BROKER, run="r", known_rounds=book.known_rounds)
    assert server._known("a") == 1
    server._await_receipt("a", 3)  # received, in a window that has not ended
    assert server._known("a") == 4
    assert MqttServerEndpoint(BROKER, run="r")._known("a") is None  # not told


@pytest.mark.parametrize("value", ["-1", "true", "1.0", '"7"', "1e3", str(2**64)])
def test_a_hostile_known_is_a_malformed_acknowledgement(value: str) -> None:
    with pytest.raises(ValidationError):
        Ack.model_validate_json(f'{{"rounds": [], "incarnation": "", "known": {value}}}')


def _ack(known: int | None, incarnation: str = "0123456789abcdef") -> bytes:
    body: dict[str, object] = {"rounds": [], "incarnation": incarnation, "lineage": []}
    if known is not None:
        body["known"] = known
    return json.dumps(body).encode()


async def test_only_the_servers_own_acknowledgements_can_stop_a_client() -> None:
    client = MqttClientEndpoint(BROKER, run="r", client_id="a", aggregator="aggregator-0",
                                recorded_rounds=2)
    direct, relayed = client.topics.acks("a"), client.topics.relayed_acks("aggregator-0", "a")
    client._on_ack(direct, _ack(2))  # the welcome: the server knows what the ledger records
    assert client.refusal is None and client.incarnation.current == "0123456789abcdef"
    client._on_ack(relayed, _ack(99))  # an aggregator's relay carries no count that counts
    assert client.refusal is None
    client._deliver(GlobalModel(1, np.zeros(3, np.float32)))
    assert await client.receive() is not None
    client._on_ack(direct, _ack(99))
    assert isinstance(client.refusal, LedgerError)
    assert "received 99 rounds" in str(client.refusal) and "records 2" in str(client.refusal)
    assert isinstance(await client.refused(), LedgerError)
    client._deliver(GlobalModel(2, np.zeros(3, np.float32)))  # nothing more is handed over
    assert client.stats.received == 1
