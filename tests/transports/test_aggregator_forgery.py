"""A compromised aggregator (or a stolen aggregator password) against other aggregators'
clients (review of issue 26's receipts relay): it must not settle or fold the rounds of a
client routed to another aggregator (the server would acknowledge them and the client forget
updates never applied: the deployed server endpoint, where an aggregator's bytes arrive,
refuses such a partial whole), nor settle a round beyond the round gap, nor move a client to another run incarnation through a relayed
receipt (the real server's receipts and models would then be ignored), nor write anything
beside the relayed receipts under its ``acks/<aggregator>`` prefix."""

from __future__ import annotations

import json

import numpy as np

from fedsim.aggregation import ConstantStepSize
from fedsim.aggregation.mixing import DataSizeWeights
from fedsim.clock import WallClock
from fedsim.protocol import codec
from fedsim.protocol.messages import Partial
from fedsim.runtime.actors.integrity import ClientLimits
from fedsim.runtime.actors.server import ClientInfo, ServerActor
from fedsim.transports.mqtt import MqttClientEndpoint, MqttServerEndpoint
from fedsim.transports.security import acl_text, generate_secrets
from fedsim.transports.topics import Topics, aggregator_ids, aggregator_of
from tests.doubles import RecordingEndpoint

DIM = 16
AGGREGATORS = aggregator_ids(2)
CLIENTS = ("alice", "bob", "carol", "dave")
ROUTES = {c: aggregator_of(c, AGGREGATORS) for c in CLIENTS}
VICTIM = next(c for c in CLIENTS if ROUTES[c] == "aggregator-1")
OWN = next(c for c in CLIENTS if ROUTES[c] == "aggregator-0")


def _server() -> ServerActor:
    limits = ClientLimits(sampling="poisson", batch_size=8.0, num_samples=100, dim=DIM,
                          clip=lambda r: 1.0, sigma=lambda r: 1.0)
    endpoint = RecordingEndpoint(WallClock())
    return ServerActor(clock=endpoint.clock, endpoint=endpoint, initial_params=np.zeros(DIM),
                       clients={c: ClientInfo(100, 0.5, limits=limits) for c in CLIENTS},
                       window=1.0, strategy=DataSizeWeights(),
                       step_size=ConstantStepSize(1.0), aggregators=AGGREGATORS,
                       aggregator_wait=0.05)


def _wire(partial: Partial) -> Partial:
    decoded = codec.decode(codec.encode(partial, incarnation="abcd"), expected_params=DIM)
    assert isinstance(decoded, Partial)
    return decoded


def test_a_settled_round_beyond_the_round_gap_is_not_recorded() -> None:
    server = _server()
    server._take_partial(_wire(Partial("aggregator-0", 1, (), (), np.zeros(0, np.float32),
                                       settled=((OWN, 2**52),))))
    server.close_window()
    assert (OWN, 2**52) not in server.book and (OWN, 0) not in server.book


def test_the_mqtt_server_endpoint_denies_a_partial_naming_another_aggregators_client() -> None:
    endpoint = MqttServerEndpoint("mqtt://127.0.0.1:1", run="r", expected_params=DIM,
                                  aggregators=AGGREGATORS)
    topic = endpoint.topics.partials("aggregator-0")
    for settled in (((VICTIM, 0),), ((OWN, 0), (VICTIM, 3))):
        endpoint._from_aggregator(topic, "aggregator-0", codec.encode(
            Partial("aggregator-0", 1, (), (), np.zeros(0, np.float32), settled=settled),
            incarnation=endpoint.incarnation.current))
    assert endpoint.stats.refused_by_kind == {"forged_aggregator": 2}
    assert endpoint.unacknowledged == 0
    endpoint._from_aggregator(topic, "aggregator-0", codec.encode(
        Partial("aggregator-0", 1, (), (), np.zeros(0, np.float32), settled=((OWN, 0),)),
        incarnation=endpoint.incarnation.current))
    assert endpoint.unacknowledged == 1  # its own client's round waits for its receipt


def test_a_relayed_receipt_cannot_move_the_client_to_another_incarnation() -> None:
    client = MqttClientEndpoint("mqtt://127.0.0.1:1", run="r", client_id=VICTIM,
                                aggregator="aggregator-1")
    real, fake = "aa" * 8, "ff" * 8
    direct = client.topics.acks(VICTIM)
    relayed = client.topics.relayed_acks("aggregator-1", VICTIM)
    client._on_message(direct, json.dumps({"rounds": [], "incarnation": real,
                                           "lineage": []}).encode())
    assert client.incarnation.current == real
    client._on_message(relayed, json.dumps({"rounds": [], "incarnation": fake,
                                            "lineage": [real]}).encode())
    assert client.incarnation.current == real
    # The server's own receipt still confirms a successor (a restarted server's lineage).
    client._on_message(direct, json.dumps({"rounds": [], "incarnation": fake,
                                           "lineage": [real]}).encode())
    assert client.incarnation.current == fake


def test_an_aggregator_writes_only_relayed_receipts_under_its_prefix() -> None:
    topics = Topics("r")
    text = acl_text(generate_secrets("r", list(CLIENTS), AGGREGATORS))
    lines = [line.strip() for line in text.splitlines()]
    for aggregator in AGGREGATORS:
        assert f"topic write {topics.root}/acks/{aggregator}/+" in lines
        assert f"topic write {topics.root}/acks/{aggregator}/#" not in lines


def test_the_server_endpoint_refuses_ids_outside_the_run() -> None:
    """With the run's client list (the deployed server passes it), neither a partial naming an
    invented id routed to its sender nor a client topic of an unknown id reaches the tables
    that wait for receipts: they hold the run's clients at most."""
    endpoint = MqttServerEndpoint("mqtt://127.0.0.1:1", run="r", expected_params=DIM,
                                  aggregators=AGGREGATORS, clients=CLIENTS)
    invented = next(f"mallory{i}" for i in range(100)
                    if aggregator_of(f"mallory{i}", AGGREGATORS) == "aggregator-0")
    topic = endpoint.topics.partials("aggregator-0")
    stamp = endpoint.incarnation.current
    endpoint._from_aggregator(topic, "aggregator-0", codec.encode(
        Partial("aggregator-0", 1, (), (), np.zeros(0, np.float32),
                settled=((OWN, 0), (invented, 0))), incarnation=stamp))
    assert endpoint.stats.refused_by_kind == {"unknown_client": 1}
    assert endpoint.unacknowledged == 0
    endpoint._on_message(endpoint.topics.hello(invented), b"")
    assert endpoint.stats.refused_by_kind == {"unknown_client": 2}
    assert not endpoint._welcome
    endpoint._on_message(endpoint.topics.hello(OWN), b"")
    assert endpoint._welcome == {OWN}
    endpoint._from_aggregator(topic, "aggregator-0", codec.encode(
        Partial("aggregator-0", 1, (), (), np.zeros(0, np.float32), settled=((OWN, 0),)),
        incarnation=stamp))
    assert endpoint.unacknowledged == 1
    # Nor an update an aggregator forwards unmixed for an invented id routed to it.
    from fedsim.protocol.messages import ClientUpdate
    endpoint._from_aggregator(topic, "aggregator-0", codec.encode(
        ClientUpdate(invented, 0, 0, np.zeros(DIM, np.float32), 8.0), incarnation=stamp))
    assert endpoint.stats.refused_by_kind == {"unknown_client": 3}
    assert endpoint.unacknowledged == 1
    # Without a list (a library user's endpoint), ids are not checked here, as before.
    open_endpoint = MqttServerEndpoint("mqtt://127.0.0.1:1", run="r", expected_params=DIM,
                                       aggregators=AGGREGATORS)
    open_endpoint._on_message(open_endpoint.topics.hello(invented), b"")
    assert open_endpoint._welcome == {invented}
