"""The Endpoint protocol over MQTT (aiomqtt 2.x, MQTT 3.1.1, QoS 1): the server's, the
clients' and the aggregation nodes' endpoints (:mod:`~fedsim.transports.mqtt_server`,
:mod:`~fedsim.transports.mqtt_client`, :mod:`~fedsim.transports.mqtt_aggregator`, exported
here), the server's receipts (:mod:`~fedsim.transports.mqtt_receipts`). Connection supervision
is in :mod:`fedsim.transports.mqtt_endpoint`, the settings in
:mod:`fedsim.transports.mqtt_settings`; only these modules import aiomqtt.

Topics (:class:`~fedsim.transports.topics.Topics`) under ``fedsim/<run>/``: ``global``
(retained: a joining or reconnecting client gets the latest model at once), ``updates/<client>``,
``status/<client>``, and ``acks/<client>`` for the server's receipts.

Delivery is at-least-once end to end, not only to the broker: a client keeps every update in an
outbox until the *server* acknowledges it on ``acks/<client>``; it resends the outbox after every
reconnect and whatever stays unacknowledged for ``resend_after`` seconds, then at doubling
intervals (:data:`~fedsim.transports.mqtt_client.RESEND_BACKOFF_MAX`); a broker restart loses what it held, and a PUBACK
alone proves nothing about the server. The server endpoint does not
acknowledge on receipt: its owner calls :meth:`MqttServerEndpoint.acknowledge` with the
``(client_id, round)`` pairs it has durably recorded (the deployment's server does so right
after each checkpoint), so an update that dies with a crashed server is resent to its successor.
The server actor de-duplicates by ``(client_id, round)``, so resends are harmless. The server keeps a persistent
session (fixed client identifier, ``clean_session=False``) so the broker queues updates while it
reconnects, and re-publishes its latest global model after every reconnect (a restarted broker
without persistence has forgotten the retained one).

Connections are supervised: a lost connection is retried with capped exponential backoff and
jitter, subscriptions are renewed, and the endpoint's actor sees no error meanwhile (publishes
wait in the outbox, ``receive`` waits). Refused credentials are final: :class:`~fedsim.errors.AccessDenied`.
Failure to connect at all within ``ReconnectPolicy.connect_timeout`` is a
:class:`~fedsim.errors.TransportError` naming host, port and topic.

The server endpoint delivers a client's update or status only if the client id inside the
payload is the one in its topic (the broker's ACL ensures the topic is the sender's own); a
mismatch is logged as access denied and dropped, as are undecodable payloads.

Every message carries its sender's run incarnation (:mod:`fedsim.transports.incarnation`):
each server start draws a fresh one; messages of another incarnation (a retained model or a
queued update of an earlier run of the same name) are ignored, logged and counted on both
sides; a client learns the incarnation from the live server's welcome or receipts.

**Aggregation nodes** (:class:`MqttAggregatorEndpoint`; docs/DEPLOYMENT.md, "Aggregation
nodes"). With aggregators the server endpoint reads ``partials/+`` instead of ``updates/+``: an
aggregator's partials, and the updates it forwards unmixed (delivered only if their client is
routed to that aggregator, :func:`~fedsim.transports.topics.aggregator_of`); it publishes each
window's close on ``close`` at QoS 0, not retained (no broker queues a stale close for an
aggregator that is away). Receipts mean what they mean without aggregators: the ``(client,
round)`` a partial names (folded or settled) wait for :meth:`MqttServerEndpoint.acknowledge`
like direct updates, so an update is acknowledged only once the server has durably recorded it
(a partial refused or late, or one lost with a crashed server, leaves its updates
unacknowledged: their clients resend them, and the aggregator forwards a resend unmixed). Only
the delivery moves: the server sends each batch of receipts as a few messages on
``receipts/<aggregator>`` (:data:`~fedsim.transports.mqtt_receipts.RECEIPT_BATCH_BYTES` each) to the aggregator its clients are
routed to, which passes each client's on to ``acks/<aggregator>/<client>`` (the client
subscribes there too: :class:`MqttClientEndpoint`'s ``aggregator``), stamped with the server's
incarnation and lineage: the server publishes a few messages per batch instead of one per
client. Welcomes (receipts naming no round) still go straight from the server.

The end of the run (:class:`~fedsim.protocol.messages.RunFinished`) travels like a global
model: on the global topic (the broker lets only the server publish there), retained (it
replaces the last model, so a client that reconnects later learns it), stamped with the
incarnation and lineage (an earlier run's retained "finished" is another incarnation's, ignored).
The server sends the receipts already due before it.
"""


from fedsim.transports.mqtt_aggregator import MqttAggregatorEndpoint
from fedsim.transports.mqtt_client import FollowedRuns, MqttClientEndpoint
from fedsim.transports.mqtt_server import MqttServerEndpoint
from fedsim.transports.mqtt_settings import (
    DEFAULT_PORT,
    DEFAULT_TLS_PORT,
    BrokerSettings,
    MqttStats,
    ReconnectPolicy,
    TlsSettings,
    parse_broker_url,
)

__all__ = [
    "DEFAULT_PORT",
    "DEFAULT_TLS_PORT",
    "BrokerSettings",
    "FollowedRuns",
    "MqttAggregatorEndpoint",
    "MqttClientEndpoint",
    "MqttServerEndpoint",
    "MqttStats",
    "ReconnectPolicy",
    "TlsSettings",
    "parse_broker_url",
]
