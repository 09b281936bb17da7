"""A deployed client resumes only its own state directory (session 49's review): given another
client's - swapped volumes, a wrong --state - it found no ledger of its own, started a fresh one
at epsilon 0 and spent its whole budget again (eps 4.44 composed against a budget of 3.0)."""

from __future__ import annotations

import asyncio
import json
import os
from pathlib import Path

import pytest

from fedsim.config import load_scenario
from fedsim.errors import ConfigError
from fedsim.privacy.events import GaussianStep
from fedsim.privacy.ledger import PrivacyLedger
from fedsim.runtime.deployed.client_process import run_client
from fedsim.runtime.deployed.state_owner import OWNER_FILE, claim_state_dir, client_state_file
from fedsim.runtime.run_outputs import ledger_file
from fedsim.transports.mqtt import parse_broker_url

SCENARIO = Path(__file__).parent / "four_clients.yaml"


def _used_by(state: Path, client_id: str, rounds: int = 3) -> None:
    """``state`` as a client leaves it: its ledger of ``rounds`` spends and its exit report."""
    with PrivacyLedger.open(ledger_file(state, client_id), client_id=client_id,
                            sampling="poisson", budget=None) as ledger:
        for r in range(rounds):
            ledger.spend(GaussianStep("poisson", 0.1, 1.0), time=float(r), round=r)
    client_state_file(state, client_id).write_text(
        json.dumps({"client_id": client_id, "ledger_rounds": list(range(rounds))}))


def test_a_new_directory_is_claimed_and_its_owner_resumes_it(tmp_path: Path) -> None:
    state = tmp_path / "c"
    claim_state_dir(state, "c-000")
    assert json.loads((state / OWNER_FILE).read_text()) == {"client_id": "c-000"}
    _used_by(state, "c-000")
    claim_state_dir(state, "c-000")  # its own: resumed


@pytest.mark.parametrize("marked", [True, False])  # (False: a directory from before owner.json)
def test_another_clients_directory_is_refused(tmp_path: Path, marked: bool) -> None:
    state = tmp_path / "c"
    if marked:
        claim_state_dir(state, "c-001")
    _used_by(state, "c-001")
    with pytest.raises(ConfigError, match="c-001"):
        claim_state_dir(state, "c-000")
    assert not ledger_file(state, "c-000").exists()


OWNER_DAMAGE = {
    "not-json": b'{"client_id": "c-00',
    "not-utf8": b'{"client_id": "c-\xff"}',
    "a-list": b'["c-000"]',
    "no-id": b'{"owner": "c-000"}',
    "an-int": b'{"client_id": 7}',
    "not-an-id": b'{"client_id": "../c-000"}',
    "more-keys": b'{"client_id": "c-000", "x": 1}',
    "oversized": b'{"client_id": "c-000"}' + b" " * 5000,
}


@pytest.mark.parametrize("damage", [*OWNER_DAMAGE, "empty", "fifo", "directory", "link"])
def test_a_damaged_owner_file_is_refused_not_taken_for_absence(tmp_path: Path,
                                                              damage: str) -> None:
    """An owner file that is there but cannot be read, is not JSON or not ``{"client_id":
    ...}`` passed for none: the start claimed the directory and overwrote it with its own
    id. It now stops the start with a message naming the file, and is left as it was."""
    state = tmp_path / "c"
    claim_state_dir(state, "c-001")
    owner = state / OWNER_FILE
    owner.unlink()
    if damage == "fifo":
        os.mkfifo(owner)
    elif damage == "directory":
        owner.mkdir()
    elif damage == "link":
        (tmp_path / "elsewhere.json").write_text('{"client_id": "c-000"}')
        owner.symlink_to(tmp_path / "elsewhere.json")
    else:
        owner.write_bytes(OWNER_DAMAGE.get(damage, b""))
    before = owner.lstat()
    with pytest.raises(ConfigError, match=rf"{OWNER_FILE} is damaged .*fresh --state"):
        claim_state_dir(state, "c-000")
    assert owner.lstat() == before  # not claimed (rewritten) by the start
    assert not ledger_file(state, "c-000").exists()


def _without_ledger(tmp_path: Path) -> Path:
    """A client's state directory whose report says it released rounds, and whose ledger and
    mark are gone."""
    state = tmp_path / "c"
    claim_state_dir(state, "c-000")
    _used_by(state, "c-000")
    ledger = ledger_file(state, "c-000")
    ledger.unlink()
    ledger.with_name(ledger.name + ".hwm").unlink()
    return state


def test_an_exit_report_of_released_rounds_without_a_ledger_is_refused(tmp_path: Path) -> None:
    state = _without_ledger(tmp_path)
    with pytest.raises(ConfigError, match="released 3 round"):
        claim_state_dir(state, "c-000")


@pytest.mark.parametrize("damage", ["count", "true", "not-json", "fifo"])
def test_a_damaged_exit_report_without_a_ledger_is_refused_with_a_message(
        tmp_path: Path, damage: str) -> None:
    """An attacker's review (session 66b): with the ledger and mark gone, a report whose
    ``ledger_rounds`` was a count (or ``true``) crashed the start with a TypeError, and one
    that could not be read passed for no report, so a fresh ledger started at epsilon 0."""
    state = _without_ledger(tmp_path)
    report = client_state_file(state, "c-000")
    if damage == "fifo":
        report.unlink()
        os.mkfifo(report)
    else:
        report.write_text({"count": '{"ledger_rounds": 3}', "true": '{"ledger_rounds": true}',
                           "not-json": '{"ledger_rounds": [0, 1,'}[damage])
    with pytest.raises(ConfigError, match="ledger and mark of client 'c-000' are gone"):
        claim_state_dir(state, "c-000")
    assert not ledger_file(state, "c-000").exists()


def test_a_report_of_no_rounds_without_a_ledger_starts_afresh(tmp_path: Path) -> None:
    state = tmp_path / "c"
    claim_state_dir(state, "c-000")
    client_state_file(state, "c-000").write_text('{"client_id": "c-000", "ledger_rounds": []}')
    claim_state_dir(state, "c-000")
    client_state_file(state, "c-000").write_text('{"client_id": "c-000"}')
    claim_state_dir(state, "c-000")


def test_the_client_refuses_before_it_opens_a_ledger_or_a_connection(tmp_path: Path) -> None:
    loaded = load_scenario(SCENARIO)
    broker = parse_broker_url("mqtt://127.0.0.1:9")  # never reached: refused before connecting
    state = tmp_path / "c"
    _used_by(state, "c-001")
    with pytest.raises(ConfigError, match="give each client its own --state"):
        asyncio.run(run_client(loaded, "c-000", broker, state_dir=state))
    assert not ledger_file(state, "c-000").exists()


def test_counts_add_up_over_processes_and_parts_and_damage_adds_nothing() -> None:
    from fedsim.runtime.deployed.state_owner import add_counts, emulated_totals

    earlier = {"acked": 3, "refused_by_kind": {"stale": 1}, "note": "x", "bad": -2,
               "flag": True}
    now = {"acked": 4, "refused_by_kind": {"stale": 2, "forged": 1}, "bad": 1, "flag": 1}
    assert add_counts(add_counts({}, earlier), now) == {
        "acked": 7, "refused_by_kind": {"stale": 3, "forged": 1}, "bad": 1, "flag": 1}
    assert add_counts({}, "damaged") == {}
    up = {"sent": 5, "dropped": 1}
    assert emulated_totals([{"uplink": up}, None, "x", {"uplink": up, "downlink": {"sent": 2}}]) \
        == {"uplink": {"sent": 10, "dropped": 2}, "downlink": {"sent": 2}}
    assert emulated_totals([None, {}]) is None
