"""The client book (fedsim.runtime.actors.client_book): the same verdicts as the server before
it on a recorded hostile trace, an exact and bounded watermark, claims that do not ratchet
(issue 25, finding 5) and adopted rounds after a lost server state (finding 6)."""

from __future__ import annotations

import json

import numpy as np
import pytest

from fedsim.protocol.messages import ClientStatus, ClientUpdate
from fedsim.runtime.actors.client_book import WINDOW, BookState, ClientBook, Kind
from fedsim.runtime.actors.integrity import MAX_ROUND_GAP
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
