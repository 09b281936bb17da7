"""The client book (fedsim.runtime.actors.client_book): the same verdicts as the server before
it on a recorded hostile trace, an exact and bounded watermark, claims that do not ratchet
(issue 25, finding 5) and adopted rounds after a lost server state (finding 6)."""

from __future__ import annotations

import asyncio
import json

import numpy as np
import pytest
from structlog.testing import capture_logs

from fedsim.aggregation import ConstantStepSize, UniformWeights
from fedsim.clock import WallClock
from fedsim.protocol.messages import ClientStatus, ClientUpdate
from fedsim.runtime.actors.client_book import WINDOW, BookState, ClientBook, Kind
from fedsim.runtime.actors.integrity import MAX_ROUND_GAP
from fedsim.runtime.actors.server import ClientInfo, ServerActor
from tests.doubles import RecordingEndpoint
from tests.runtime.book_trace import TRACE, Player, make_server


def test_the_book_gives_the_old_servers_verdicts_on_a_recorded_hostile_trace() -> None:
    """600 events recorded through the server before the book (97ec5ba, by
    ``python -m tests.runtime.book_trace``): every verdict, version and missing count equal."""
    recorded = json.loads(TRACE.read_text())
    player = Player(make_server())
    for i, event in enumerate(recorded["events"]):
        assert player.play(event) == recorded["verdicts"][i], (i, event)
    kinds = {v.split(":")[0] for v in recorded["verdicts"]}
    assert {"accepted", "duplicate", "stale", "rejected", "refused", "kept"} <= kinds


def _update(client: str, round_: int, base: int = 0) -> ClientUpdate:
    return ClientUpdate(client, round_, base, np.zeros(3, np.float32), 8.0)


def test_the_watermark_is_exact_below_the_window_and_bounded_above_it() -> None:
    book = ClientBook({"a": None}, 3)
    for r in (0, 1, 3):
        book.record("a", r)
    assert book.watermark("a") == 2 and ("a", 1) in book and ("a", 2) not in book
    assert book.judge(_update("a", 2)).kind is Kind.ACCEPTED  # the gap is still open
    book.record("a", 2)
    assert book.watermark("a") == 4  # the run 0..3 closed: nothing kept above it
    # A round WINDOW above the watermark passes over the oldest gap: refused from then on.
    book.record("a", 4 + WINDOW)
    assert book.watermark("a") == 5 and ("a", 4) in book
    verdict = book.judge(_update("a", 4))
    assert verdict.kind is Kind.DUPLICATE and "watermark" in verdict.reason
    # Every round ever recorded stays refused, however many follow.
    rng = np.random.default_rng(1)
    recorded = set()
    for r in rng.permutation(5000)[:3000]:
        book.record("a", int(r) + 10_000)
        recorded.add(int(r) + 10_000)
    assert all(("a", r) in book for r in recorded)
    assert book.state().clients["a"][1] == format(book._clients["a"].bits, "x")
    assert book._clients["a"].bits.bit_length() <= WINDOW


def test_a_checkpointed_book_refuses_what_it_refused_before() -> None:
    book = ClientBook({"a": None, "b": None}, 3, max_staleness=2)
    for r in (0, 1, 2, 5, 9):
        book.record("a", r)
    book.publish(1)
    book.publish(4)
    book.judge_status(ClientStatus("b", "training", 7, 1.0, 1e-5))
    state = BookState.from_document(json.loads(json.dumps(book.state().document())))
    twin = ClientBook({"a": None, "b": None}, 3, max_staleness=2)
    twin.load(state)
    for r in range(12):
        assert (("a", r) in twin) == (("a", r) in book) == (r in (0, 1, 2, 5, 9))
        assert ("a", r) in state or r not in (0, 1, 2, 5, 9)
    assert twin.statuses == book.statuses and twin.missing() == book.missing() == (10 - 5) + 7
    assert all((v in twin.published) == (v in (0, 1, 4)) for v in range(6))


def test_status_claims_do_not_ratchet() -> None:
    """Finding 5: 1,000 statuses, each 1,024 rounds beyond the last, after 3 judged rounds:
    only claims within MAX_ROUND_GAP of the judged rounds are kept, what never arrived stays
    within that gap, and an update at the far round is refused."""
    book = ClientBook({"m": None}, 3)
    for r in range(3):
        book.record("m", r)
    kept = [book.judge_status(ClientStatus("m", "training", 3 + k * MAX_ROUND_GAP, 1.0, 1e-5))
            for k in range(1, 1001)]
    assert [v.kind for v in kept[:1]] == [Kind.ACCEPTED]
    assert {v.kind for v in kept[1:]} == {Kind.STATUS_INCONSISTENT}
    assert book.missing() == MAX_ROUND_GAP
    far = book.judge(_update("m", 3 + 1001 * MAX_ROUND_GAP))
    assert far.kind is Kind.ROUND_AHEAD


def test_a_first_far_claim_is_adopted_once() -> None:
    book = ClientBook({"a": None}, 3)
    assert book.judge_status(ClientStatus("a", "waiting", 2000, 1.0, 1e-5)).kind is Kind.ACCEPTED
    assert book.adoptions == 1 and book.watermark("a") == 2000 and book.missing() == 0
    assert book.judge(_update("a", 1999)).kind is Kind.DUPLICATE  # before the record began
    assert book.judge(_update("a", 2000)).kind is Kind.ACCEPTED
    book.record("a", 2000)
    again = book.judge_status(ClientStatus("a", "waiting", 10**6, 1.0, 1e-5))
    assert again.kind is Kind.STATUS_INCONSISTENT and book.adoptions == 1


@pytest.mark.parametrize("kind", list(Kind))
def test_rejection_kinds_are_their_metrics_column_names(kind: Kind) -> None:
    assert str(kind) == kind.value and json.dumps({kind: 1}) == f'{{"{kind.value}": 1}}'


def _server(clients: tuple[str, ...]) -> ServerActor:
    return ServerActor(clock=WallClock(), endpoint=RecordingEndpoint(), initial_params=np.zeros(3),
                       clients={c: ClientInfo(1, 1.0) for c in clients}, window=1.0,
                       strategy=UniformWeights(), step_size=ConstantStepSize(1.0))


def _small(client: str, round_: int, base: int) -> ClientUpdate:
    return ClientUpdate(client, round_, base, np.full(3, 0.01, np.float32), 8.0)


def test_a_ratchet_of_status_claims_neither_inflates_the_missing_nor_opens_far_rounds() -> None:
    """Finding 5 as played: after 5 honest rounds, 1,000 statuses each claiming 1,024 rounds
    beyond the last (1,001,029 at the end), then an update at the last claim + 1,000. Before the
    book: all 1,000 kept, 1,001,024 rounds counted as lost, the far update applied."""
    server = _server(("m",))
    server._inbox = [_small("m", r, 0) for r in range(5)]
    assert server.close_window().applied == 5
    with capture_logs():
        kept = [server.accept_status(ClientStatus("m", "training", 5 + k * MAX_ROUND_GAP,
                                                  1.0, 1e-5)) for k in range(1, 1001)]
        server._inbox = [_small("m", 5 + 1000 * MAX_ROUND_GAP + 1000, server.version)]
        report = server.close_window()
    assert kept == [True] + [False] * 999
    assert report.rejections == {"status_inconsistent": 999, "round_ahead": 1}
    assert report.applied == 0 and server.missing_updates() == MAX_ROUND_GAP


def test_a_fresh_server_adopts_the_rounds_of_clients_it_has_no_record_of() -> None:
    """Finding 6 as played: the server's state is lost and its clients hold about 2,000 ledger
    rounds each. Their "connected" statuses (sent until the first model, as a deployed client
    does) are adopted, so their next rounds are applied and the model moves on, where before
    the book every update was refused as round_ahead and the model stayed at version 0; the
    adoption is logged, counted and in the server's summary."""
    clients = ("a", "b", "c", "d")
    held = {"a": 1990, "b": 2003, "c": 2047, "d": 2100}
    server = _server(clients)
    with capture_logs() as logs:
        for c in clients:
            assert server.accept_status(ClientStatus(c, "waiting", held[c], 3.1, 1e-5,
                                                     "connected"))
        reports = []
        for window in range(20):
            server._inbox = [_small(c, held[c] + window, server.version) for c in clients]
            reports.append(server.close_window())
            asyncio.run(server.broadcast())
    assert [r.applied for r in reports] == [4] * 20 and server.version == 20
    assert sum(r.rejected for r in reports) == 0 and server.missing_updates() == 0
    assert server.book.adoptions == 4
    assert [e["client"] for e in logs if e["event"].startswith("client's rounds adopted")] \
        == list(clients)
    # A replay of a round from before the record began is a duplicate, never applied.
    server._inbox = [_small("a", 5, server.version)]
    assert server.close_window().duplicate == 1
    # Adopted once: a second far claim is refused, and a restored server does not adopt again.
    twin = _server(clients)
    twin.restore(server.snapshot())
    assert not twin.accept_status(ClientStatus("a", "training", 10**6, 3.2, 1e-5))
    assert twin.book.adoptions == 4 and twin.book.watermark("a") == held["a"] + 20


def test_known_rounds_of_a_checkpoint_are_the_restored_books() -> None:
    """A restarted deployed server tells clients their known rounds from its checkpoint until
    its actor exists (server_process._KnownRounds): the same count the restored book gives."""
    book = ClientBook({"a": None, "b": None, "c": None, "d": None}, 3)
    for round_ in (0, 1, 2, 5):  # a gap: 3 and 4 lost in flight
        book.record("a", round_)
    book.judge_status(ClientStatus("b", "waiting", 4, 0.5, 1e-5))
    book.judge_status(ClientStatus("c", "waiting", MAX_ROUND_GAP + 7, 0.5, 1e-5))  # adopted
    state = BookState.from_document(json.loads(json.dumps(book.state().document())))
    restored = ClientBook({"a": None, "b": None, "c": None, "d": None}, 3)
    restored.load(state)
    expected = {"a": 6, "b": 4, "c": MAX_ROUND_GAP + 7, "d": 0}
    for client, known in expected.items():
        assert book.known_rounds(client) == restored.known_rounds(client) == known
        assert state.known_rounds(client) == known
    assert restored.state() == book.state()


def _measured(client: str, round_: int, base: int, value: float) -> ClientUpdate:
    """An update as a receiver holds it: its norm measured (the decoder's, the seal's)."""
    from dataclasses import replace

    from fedsim.protocol.norms import vector_norm

    delta = np.full(3, value, np.float32)
    return replace(ClientUpdate(client, round_, base, delta, 8.0), norm=vector_norm(delta))


def test_a_different_update_of_the_newest_round_is_a_forked_client() -> None:
    """Two copies of one client's state running: each releases round r under the same id. A
    resend (the same bytes) stays a duplicate; a second update of the newest round whose base
    version or norm differs is refused as forked, the server's one sign of the double spend."""
    book = ClientBook({"a": None}, 3)
    first = _measured("a", 0, 0, 0.01)
    assert book.judge(first).kind is Kind.ACCEPTED
    # waiting in a window's buffer (not yet recorded): the copy's round 0 is seen as a fork
    assert book.judge(_measured("a", 0, 0, 0.02), {("a", 0)}).kind is Kind.FORKED
    assert book.judge(first, {("a", 0)}).kind is Kind.DUPLICATE  # a resend
    book.record("a", 0)
    assert book.judge(first).kind is Kind.DUPLICATE
    forked = book.judge(_measured("a", 0, 0, 0.02))
    assert forked.kind is Kind.FORKED and forked.kind.rejected
    assert "two copies of this client's state" in forked.reason
    assert book.judge(_measured("a", 0, 1, 0.01)).kind is Kind.FORKED  # another base version
    # Only the newest round is remembered: an older round's differing copy reads as a replay.
    for r in (1, 2):
        assert book.judge(_measured("a", r, 0, 0.01)).kind is Kind.ACCEPTED
        book.record("a", r)
    assert book.judge(_measured("a", 0, 0, 0.05)).kind is Kind.DUPLICATE
    assert book.judge(_measured("a", 2, 0, 0.05)).kind is Kind.FORKED
    # Unmeasured updates (norm None) are never told apart: no false alarm either.
    assert book.judge(_update("a", 2)).kind is Kind.DUPLICATE
    # A refused update is not what the book saw of a round: a refused round 3 (a base version
    # ahead of the server's) left the fork of round 2 hidden as a duplicate (a review).
    assert book.judge(_measured("a", 3, 7, 0.01)).kind is Kind.FUTURE_VERSION
    assert book.judge(_measured("a", 2, 0, 0.06)).kind is Kind.FORKED


def test_the_server_refuses_and_counts_a_forked_clients_copy_and_applies_the_first() -> None:
    server = _server(("a", "b"))
    with capture_logs() as logs:
        server._inbox = [_measured("a", 0, 0, 0.01), _measured("b", 0, 0, 0.01),
                         _measured("a", 0, 0, 0.03)]
        report = server.close_window()
        assert report.applied == 2 and report.rejections == {"forked": 1}
        server._inbox = [_measured("a", 0, 0, 0.01)]  # the first's resend: a duplicate
        assert server.close_window().duplicate == 1
    warned = [e for e in logs if e.get("kind") == Kind.FORKED]
    assert len(warned) == 1 and warned[0]["client"] == "a"
    assert np.allclose(server.params, -np.full(3, 0.01))  # the mix of the two first updates


def test_a_done_status_below_the_round_limit_is_honest_once_the_run_has_ended() -> None:
    """A client told that the run is finished stops as "done" with the rounds it released: a
    stranger's deployed runs logged this honest answer as a rejected status (a security
    warning). Before the end, "done" short of the limit (or without one) is still refused."""
    server = make_server()  # client "a" has a limit of 60 rounds, "b" none
    early = [ClientStatus("a", "done", 0, 1.0, 1e-5), ClientStatus("b", "done", 0, 1.0, 1e-5)]
    with capture_logs() as logs:
        assert [server.accept_status(s) for s in early] == [False, False]
    assert [entry["kind"] for entry in logs] == [Kind.STATUS_INCONSISTENT] * 2
    server.ended = True  # the last window has closed and the end is announced
    with capture_logs() as logs:
        assert [server.accept_status(s) for s in early] == [True, True]
    assert logs == []
    assert server.statuses["b"].state == "done"
    # still no more rounds than the limit, nor fewer than the server received
    assert not server.accept_status(ClientStatus("a", "done", 61, 1.0, 1e-5))
