"""A deployed client's final status (``ClientStatus.unacknowledged``: its released updates the
server never acknowledged) on the wire, in the server's book, and in what the outputs say of
it: hostile counts are refused, a status that is not final encodes as it did before, and the
report and a launch's summary state the total. The real run is in
tests/deployment/test_final_statuses.py."""

from __future__ import annotations

import json
import struct
from pathlib import Path

import pytest

from fedsim.config import limits
from fedsim.errors import CodecError, ConfigError
from fedsim.protocol import codec
from fedsim.protocol.messages import ClientStatus
from fedsim.reporting.rundir import RunDirectory
from fedsim.runtime.actors.client_book import ClientBook, Kind
from fedsim.runtime.run_record import RELEASED_UNACKNOWLEDGED, released_unacknowledged

FINAL = ClientStatus("c-001", "done", 3, 0.5, 1e-5, "the server finished the run", 2.0,
                     unacknowledged=2)


def _patched(payload: bytes, old: bytes, new: bytes) -> bytes:
    """``payload`` with its JSON header's ``old`` bytes replaced (the encoder refuses them)."""
    (length,) = struct.unpack_from("<I", payload, 6)
    header = payload[10:10 + length].replace(old, new)
    assert header != payload[10:10 + length]
    return payload[:6] + struct.pack("<I", len(header)) + header + payload[10 + length:]


def test_a_final_status_round_trips_and_a_plain_one_encodes_as_before() -> None:
    assert codec.decode_frame(codec.encode(FINAL, incarnation="ab")).message == FINAL
    plain = ClientStatus("c-001", "training", 3, 0.5, 1e-5)
    payload = codec.encode(plain, incarnation="ab")
    assert b"unacknowledged" not in payload  # (an older server's header, its size unchanged)
    assert codec.decode_frame(payload).message == plain


@pytest.mark.parametrize(("old", "new"), [
    (b'"unacknowledged":2', b'"unacknowledged":-1'),
    (b'"unacknowledged":2', b'"unacknowledged":' + str(limits.MAX_UNACKNOWLEDGED + 1).encode()),
    (b'"unacknowledged":2', b'"unacknowledged":2.5'),
    (b'"unacknowledged":2', b'"unacknowledged":"2"'),
    (b'"epsilon":0.5', b'"epsilon":NaN'),
    (b'"rounds":3', b'"rounds":-3'),
    (b'"client_id":"c-001"', b'"client_id":"c/001"'),
    (b'"detail":"the server finished the run"', b'"detail":"' + b"x" * 5000 + b'"'),
])
def test_a_hostile_final_status_is_refused_by_the_decoder(old: bytes, new: bytes) -> None:
    payload = _patched(codec.encode(FINAL, incarnation="ab"), old, new)
    with pytest.raises(CodecError):
        codec.decode_frame(payload)


def test_the_book_keeps_a_final_status_only_after_the_end_and_within_its_rounds() -> None:
    book = ClientBook({"c-001": None}, 3)
    assert book.judge_status(FINAL).kind is Kind.STATUS_INCONSISTENT  # the run goes on
    more = ClientStatus("c-001", "done", 3, 0.5, 1e-5, unacknowledged=4)
    assert book.judge_status(more, run_ended=True).kind is Kind.STATUS_INCONSISTENT
    assert book.judge_status(FINAL, run_ended=True).kind is Kind.ACCEPTED
    assert book.statuses["c-001"].unacknowledged == 2


def test_released_unacknowledged_totals_the_known_counts() -> None:
    assert released_unacknowledged({"a": 2, "b": 0, "c": None, "d": 1}) == {
        "total": 3, "reported": 3, "clients": {"a": 2, "d": 1}}


SCENARIO = Path(__file__).parents[2] / "scenarios" / "quickstart.yaml"


def test_the_servers_view_states_the_unacknowledged_total(tmp_path: Path) -> None:
    root = tmp_path / "server"
    root.mkdir()
    (root / "scenario.resolved.yaml").write_text(SCENARIO.read_text())
    (root / "metrics.jsonl").write_text(json.dumps(
        {"window": 1, "time": 0.5, "accuracy": 0.5, "received": 3, "applied": 2, "stale": 1,
         "duplicate": 0, "rejected": 0, "dropped_in_flight": 0}) + "\n")
    statuses = {"phone-000": {"state": "done", "rounds": 4, "epsilon": 1.0, "sent_at": 0.6,
                              "detail": "the server finished the run", "unacknowledged": 3}}
    server = {"windows": 1, "time": 0.6, "stop_kind": "windows", "stop_reason": "1 window",
              "statuses": statuses,
              RELEASED_UNACKNOWLEDGED: {"total": 3, "reported": 1, "clients": {"phone-000": 3}}}
    (root / "server.json").write_text(json.dumps(server))
    view = RunDirectory.load(root)
    assert view.summary[RELEASED_UNACKNOWLEDGED] == {"total": 3, "reported": 1,
                                                    "clients": {"phone-000": 3}}
    assert "3 update(s) released by 1 client(s) were never acknowledged" in \
        view.summary["explanation"]
    server[RELEASED_UNACKNOWLEDGED] = {"total": 0, "reported": 1, "clients": {}}
    (root / "server.json").write_text(json.dumps(server))
    assert "never acknowledged" not in RunDirectory.load(root).summary["explanation"]
    server[RELEASED_UNACKNOWLEDGED] = {"total": -5, "clients": {"x": "many"}}  # damaged
    (root / "server.json").write_text(json.dumps(server))
    damaged = RunDirectory.load(root).summary
    assert damaged[RELEASED_UNACKNOWLEDGED] == {"total": None, "reported": None, "clients": {}}
    assert "never acknowledged" not in damaged["explanation"]


def test_the_servers_wait_for_final_statuses_is_a_finite_option() -> None:
    from fedsim.runtime.deployed.options import FINAL_STATUS_WAIT, DeploymentOptions

    assert DeploymentOptions().final_status_wait == FINAL_STATUS_WAIT
    assert "--final-status-wait" not in DeploymentOptions().server_argv()  # (commands as before)
    chosen = DeploymentOptions(final_status_wait=2.5)
    assert DeploymentOptions.from_argv(chosen.server_argv()).final_status_wait == 2.5
    for wrong in (float("inf"), float("nan"), -1.0):
        with pytest.raises(ConfigError, match="--final-status-wait"):
            DeploymentOptions(final_status_wait=wrong)
