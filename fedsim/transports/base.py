"""The Transport protocol: how actors talk. Implementations: the simulated in-process network
(:mod:`fedsim.transports.simulated`) and MQTT (:mod:`fedsim.transports.mqtt`).

An actor holds one *endpoint*. The server's endpoint receives every client's updates and
statuses and publishes global models; a client's endpoint publishes its own updates and statuses
and receives global models. Every message crosses the endpoint as bytes produced by
:mod:`fedsim.protocol.codec`, in both implementations, so simulation exercises the codec too.
Messages that fail to decode are logged and dropped by the endpoint; they never reach the actor.
"""

from __future__ import annotations

from typing import Protocol, runtime_checkable

from fedsim.protocol.messages import Message


@runtime_checkable
class Endpoint(Protocol):
    """One actor's connection to the others."""

    async def publish(self, message: Message) -> None:
        """Send a message (delivery may be delayed, dropped, duplicated or reordered)."""
        ...

    async def receive(self) -> Message:
        """The next message delivered to this actor (waits until there is one)."""
        ...

    async def close(self) -> None:
        """Stop sending and receiving; idempotent."""
        ...
