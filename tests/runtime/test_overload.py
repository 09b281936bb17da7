"""The server under more updates than it can take (docs/DEPLOYMENT.md, "Overload"): a paced
client that fell behind catches up at its slot rate, and an update that arrives stale is judged
as it arrives instead of waiting behind the others (runtime/actors/admission.py, server.py)."""

from __future__ import annotations

import asyncio

import numpy as np

from fedsim.aggregation import ConstantStepSize, UniformWeights
from fedsim.clock import WallClock
from fedsim.protocol.messages import ClientUpdate
from fedsim.runtime.actors.admission import BURST, MAX_DEFERRED, Pacer
from fedsim.runtime.actors.server import ClientInfo, ServerActor
from tests.doubles import RecordingEndpoint


def _update(client: str, round_: int, base: int = 0) -> ClientUpdate:
    return ClientUpdate(client, round_, base, np.zeros(2, np.float32), 1.0)


def _paced_windows(slot: float, window: float, bunch: int, gap: float, windows: int
                   ) -> tuple[list[int], int, Pacer]:
    """One client under time windows: ``bunch`` rounds arrive together at ``slot`` (an outage
    delivering them at once), then one round every ``gap`` seconds; each window's end judges
    the pacer's due updates and the window's arrivals that passed, as ``close_window`` does.
    Returns the judged rounds in order, the rounds sent, and the pacer."""
    pacer = Pacer({"h": slot}, start=0.0)
    arrivals = [(slot, r) for r in range(bunch)]
    arrivals += [(slot + gap * (k + 1), bunch + k) for k in range(int(windows * window / gap))]
    judged: list[int] = []
    pending = list(arrivals)
    for index in range(1, windows + 1):
        end = index * window
        arrived = []
        while pending and pending[0][0] <= end:
            at, round_ = pending.pop(0)
            update = _update("h", round_)
            pacer.note(update, at)
            arrived.append(update)
        judged += [u.round for u in pacer.due(end) + pacer.judged_now(arrived, end)]
    return judged, len(arrivals) - len(pending), pacer


def test_a_deferred_client_is_served_at_its_arrivals_and_catches_up() -> None:
    """Window 4 s, slot 0.1 s (40 slots a window, BURST 16 tokens at most): after a bunch of
    2 BURST rounds, a client sending one round every 1.1 slots has its queue served as its
    tokens accrue, so the queue drains and every round is judged, once. Served only at each
    window's end it would get at most BURST a window (16 < 36 sent): its queue would fill to
    MAX_DEFERRED, every round in it waiting ever longer, and the rest would be refused."""
    judged, sent, pacer = _paced_windows(slot=0.1, window=4.0, bunch=2 * int(BURST), gap=0.11,
                                         windows=60)
    assert sent > 60 * BURST  # more than BURST a window
    assert pacer.take_refused() == 0 and pacer.waiting() == 0
    assert sorted(judged) == list(range(sent))  # each once


def test_a_flood_at_the_arrivals_still_gets_one_update_a_slot() -> None:
    """Serving a queue at its client's arrivals spends tokens as they accrue: a client sending
    ten rounds a slot still gets one a slot (plus one burst) and the rest wait, then refused."""
    judged, sent, pacer = _paced_windows(slot=0.1, window=4.0, bunch=1, gap=0.01, windows=10)
    allowed = 10 * 4.0 / 0.1 + BURST
    assert len(judged) <= allowed and len(judged) >= 10 * 4.0 / 0.1 - 1
    assert pacer.waiting() == MAX_DEFERRED
    assert pacer.take_refused() == sent - len(judged) - MAX_DEFERRED


def _server(shed: bool) -> tuple[ServerActor, RecordingEndpoint]:
    endpoint = RecordingEndpoint()
    server = ServerActor(clock=WallClock(), endpoint=endpoint, initial_params=np.zeros(2),
                         clients={c: ClientInfo(1, 1.0, slot=1.0) for c in ("a", "b")},
                         window=1.0, strategy=UniformWeights(), step_size=ConstantStepSize(1.0),
                         max_staleness=1)
    server.shed_on_arrival = shed
    for version in range(6):
        server.book.publish(version)
    server.version = 5
    return server, endpoint


async def _receive_all(server: ServerActor, endpoint: RecordingEndpoint) -> None:
    receiving = asyncio.create_task(server._receive_forever())
    while not endpoint.inbox.empty():
        await asyncio.sleep(0)
    await asyncio.sleep(0)
    receiving.cancel()


def test_an_update_that_arrives_stale_is_judged_at_once_and_counted_as_shed() -> None:
    """A backlog of 40 updates on version 0 reaches a server at version 5 (max_staleness 1):
    each is judged stale as it arrives (no token, no wait), enters the book (so the receipt
    after the next checkpoint frees its client, and a resend is a duplicate, never applied),
    and counts as shed; the fresh update of the other client is applied."""

    async def main() -> tuple[ServerActor, list[object]]:
        server, endpoint = _server(shed=True)
        for round_ in range(40):
            endpoint.inbox.put_nowait(_update("a", round_, base=0))
        endpoint.inbox.put_nowait(_update("b", 0, base=5))
        await _receive_all(server, endpoint)
        first = server.close_window()
        endpoint.inbox.put_nowait(_update("a", 7, base=5))  # a resend, on a fresh model
        await _receive_all(server, endpoint)
        return server, [first, server.close_window()]

    server, (first, second) = asyncio.run(main())  # type: ignore[misc]
    assert (first.received, first.stale, first.shed, first.applied) == (41, 40, 40, 1)
    assert server.pacer.deferred == 0
    book = server.book.state()
    assert all(("a", r) in book for r in range(40))
    assert (second.received, second.duplicate, second.applied) == (1, 1, 0)


def test_without_shedding_the_same_backlog_waits_for_tokens() -> None:
    """The contrast (the simulator's server): the stale backlog takes the client's tokens and
    waits in its queue before it is judged stale all the same."""

    async def main() -> tuple[ServerActor, object]:
        server, endpoint = _server(shed=False)
        for round_ in range(40):
            endpoint.inbox.put_nowait(_update("a", round_, base=0))
        await _receive_all(server, endpoint)
        return server, server.close_window()

    server, report = asyncio.run(main())
    assert server.pacer.deferred == 39 and report.shed == 0  # type: ignore[attr-defined]
