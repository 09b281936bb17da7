"""A client's resends under an overload (transports/mqtt.py; docs/DEPLOYMENT.md, "Overload"):
an unacknowledged update is resent at doubling intervals, and not at all once the server can
only refuse it as stale."""

from __future__ import annotations

import asyncio

import numpy as np

from fedsim.protocol.messages import ClientUpdate, GlobalModel
from fedsim.transports.mqtt_client import RESEND_BACKOFF_MAX, MqttClientEndpoint, _Pending


def test_resends_back_off_to_at_most_eight_times_the_period() -> None:
    pending = _Pending(b"", sent_at=0.0, base_version=0)
    waits = []
    now = 0.0
    for _ in range(6):
        while not pending.due(now, 2.5):
            now += 0.25
        waits.append(now - pending.sent_at)
        pending.sent_at, pending.resends = now, pending.resends + 1
    assert waits == [2.5, 5.0, 10.0, 20.0, 20.0, 20.0]
    assert RESEND_BACKOFF_MAX * 2.5 == 20.0


def test_an_update_stale_by_the_newest_model_is_forgotten_not_resent() -> None:
    """max_staleness 2: with version 5 seen, the updates on versions 1 and 2 (3 and 4 behind)
    go, counted as expired; the one on version 3 (2 behind, still accepted) stays."""

    async def main() -> MqttClientEndpoint:
        endpoint = MqttClientEndpoint("mqtt://127.0.0.1:1", run="r", client_id="c1",
                                      max_staleness=2)
        for round_, base in ((0, 1), (1, 2), (2, 3)):
            update = ClientUpdate("c1", round_, base, np.zeros(2, np.float32), 1.0)
            await endpoint.publish(update)  # not connected: kept, sent later
        endpoint._deliver(GlobalModel(5, np.zeros(2, np.float32), 0.0))
        await endpoint._resend(older_than=0.0)
        return endpoint

    endpoint = asyncio.run(main())
    assert endpoint.unacknowledged == (2,) and endpoint.stats.expired == 2
    assert endpoint.stats.resent == 0  # (not connected: the one kept waits for the connection)
