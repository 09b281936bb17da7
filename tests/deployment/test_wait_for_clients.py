"""The deployed server's wait for its clients' "connected" statuses (server_process)."""

from __future__ import annotations

import asyncio

import numpy as np

from fedsim.protocol.messages import ClientStatus, ClientUpdate
from fedsim.runtime.deployed.server_process import _wait_for_clients


class _Queue:
    """What ``_wait_for_clients`` uses of an endpoint: ``receive``, ``refuse_before_start``."""

    def __init__(self, messages: list[object]) -> None:
        self.messages = list(messages)
        self.taken = 0
        self.refused: list[object] = []

    def refuse_before_start(self, message: object) -> None:
        self.refused.append(message)

    async def receive(self) -> object:
        if not self.messages:
            await asyncio.sleep(3600)
        self.taken += 1
        return self.messages.pop(0)


def _status(client_id: str) -> ClientStatus:
    return ClientStatus(client_id, "waiting", 0, 0.0, 1e-5)


async def test_it_returns_once_every_client_is_in_and_reads_no_further() -> None:
    ids = [f"c{i}" for i in range(50_000)]
    early = ClientUpdate("c3", 0, 0, np.zeros(4, np.float32), 1.0)
    messages: list[object] = [early, *(_status(c) for c in reversed(ids)), _status("c1"),
                              _status("late")]
    endpoint = _Queue(messages)
    joined = await _wait_for_clients(endpoint, ids, timeout=60.0)  # type: ignore[arg-type]
    assert set(joined) == set(ids)
    assert endpoint.taken == len(ids) + 1  # the update before the run is dropped; then it stops
    assert endpoint.refused == [early]  # (counted by the endpoint, ``before_start``)


async def test_it_gives_up_at_the_timeout_with_whoever_joined() -> None:
    endpoint = _Queue([_status("a"), _status("a")])
    joined = await _wait_for_clients(endpoint, ["a", "b"], timeout=0.2)  # type: ignore[arg-type]
    assert set(joined) == {"a"}
