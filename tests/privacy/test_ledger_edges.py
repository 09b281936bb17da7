"""Ledger edges of issue 25, finding 7, each played as the attack: (a) a replaced mark must not
let a second writer spend beside the first; (b) ``ledger check`` must report a lost mark and a
cut ledger; (c) a repair must never charge less than the records it keeps show was released;
(d) an emptied ledger whose mark counts records can be repaired."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest

from fedsim.cli import main
from fedsim.errors import ConfigError, LedgerError
from fedsim.privacy.accountant import make_accountant
from fedsim.privacy.events import GaussianStep
from fedsim.privacy.ledger import Budget, PrivacyLedger
from fedsim.privacy.ledger_mark import mark_path
from fedsim.privacy.ledger_repair import repair_ledger
from tests.privacy.old_marks import rewrite_as_old_mark

STEP = GaussianStep("poisson", 0.05, 1.0)
BUDGET = Budget(8.0, 1e-5)
HEADER = {"client_id": "c1", "sampling": "poisson", "accountant": "pld",
          "budget": BUDGET.to_json()}


def open_ledger(path: Path, **kw: object) -> PrivacyLedger:
    return PrivacyLedger.open(path, client_id="c1", sampling="poisson", budget=BUDGET, **kw)  # type: ignore[arg-type]


def written(path: Path, rounds: int = 61) -> float:
    """A closed ledger of ``rounds`` acknowledged spends of STEP; its eps."""
    with open_ledger(path) as ledger:
        for r in range(rounds):
            ledger.spend(STEP, time=float(r), round=r)
        return ledger.epsilon()


def eps_of(steps: list[GaussianStep]) -> float:
    """The eps at BUDGET.delta of exactly ``steps`` (a fresh accountant, no ledger)."""
    return make_accountant("pld", steps).epsilon(BUDGET.delta)


def _replace(file: Path) -> None:
    """``cp FILE tmp && mv tmp FILE``: the same bytes under a new inode."""
    temporary = file.with_name(file.name + ".new")
    shutil.copyfile(file, temporary)
    os.replace(temporary, file)


# -- (a) the lock is not defeated by replacing the mark ------------------------------------------
@pytest.mark.parametrize("swap", ["replaced", "removed-then-copied-back"])
def test_a_replaced_mark_stops_the_writer_that_held_the_lock(tmp_path: Path, swap: str) -> None:
    """Before: a second writer opened the ledger beside the first and both spent the same
    rounds (76 rounds twice; true eps 9.78 against 8.0). Now the first stops at its next
    spend, so no round is written twice."""
    path = tmp_path / "l.jsonl"
    first = open_ledger(path)
    for r in range(10):
        first.spend(STEP, time=float(r), round=r)
    if swap == "replaced":
        _replace(mark_path(path))
    else:
        saved = mark_path(path).read_bytes()
        mark_path(path).unlink()
        mark_path(path).write_bytes(saved)
    second = open_ledger(path)  # its lock is on the new inode
    second.spend(STEP, time=10.0, round=10)
    with pytest.raises(LedgerError, match="replaced or removed while this writer held its lock"):
        first.spend(STEP, time=10.0, round=10)
    for r in range(11, 15):
        second.spend(STEP, time=float(r), round=r)
    first.close()
    second.close()
    with open_ledger(path) as ledger:  # one writer's history, intact
        rounds = [record.round for record in ledger.records]
        assert rounds == list(range(15))
        assert ledger.epsilon() == pytest.approx(eps_of([STEP.times(15)]), rel=1e-9)


def test_a_mark_removed_under_its_holder_stops_it(tmp_path: Path) -> None:
    path = tmp_path / "l.jsonl"
    with open_ledger(path) as ledger:
        ledger.spend(STEP, time=0.0, round=0)
        mark_path(path).unlink()
        with pytest.raises(LedgerError, match="replaced or removed"):
            ledger.spend(STEP, time=1.0, round=1)
    assert len(path.read_bytes().splitlines()) == 2  # header + the one record


# -- (b) check reports a lost mark and a cut ledger ----------------------------------------------
@pytest.mark.parametrize("damage", ["mark deleted", "mark emptied", "cut 20 and mark deleted"])
def test_check_reports_a_lost_mark(tmp_path: Path, damage: str,
                                   capsys: pytest.CaptureFixture[str]) -> None:
    """Before: ``ok`` (and 41 records, eps 3.12, after a cut of 20 of 61 with the mark gone)."""
    path = tmp_path / "l.jsonl"
    written(path)
    if damage == "mark emptied":
        mark_path(path).write_bytes(b"")
    else:
        mark_path(path).unlink()
    if damage.startswith("cut"):
        path.write_bytes(b"".join(path.read_bytes().splitlines(keepends=True)[:42]))
    assert main(["ledger", "check", str(path), "--json"]) == 2
    err = capsys.readouterr().err
    assert "no high-water mark" in err and "cannot be detected" in err, err


def test_check_reports_a_cut_against_the_mark(tmp_path: Path,
                                              capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "l.jsonl"
    written(path)
    path.write_bytes(b"".join(path.read_bytes().splitlines(keepends=True)[:42]))
    assert main(["ledger", "check", str(path)]) == 2
    assert "holds 41 records but 61 were acknowledged" in capsys.readouterr().err


def test_check_of_an_intact_ledger_reports_its_spending(tmp_path: Path,
                                                        capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "l.jsonl"
    spent = written(path)
    assert main(["ledger", "check", str(path), "--json"]) == 0
    answer = json.loads(capsys.readouterr().out)
    assert answer["ok"] is True and answer["records"] == 61 and answer["marked"] == 61
    assert answer["epsilon"] == pytest.approx(spent, rel=1e-12)


# -- (c) a repair never charges a lost record less than the kept records show ------------------
def test_repair_refuses_a_lost_step_cheaper_than_the_kept_records(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Before: ``--lost-step 0.000001 1000`` was accepted, eps 3.64 -> 3.39."""
    path = tmp_path / "l.jsonl"
    spent = written(path)
    path.write_bytes(b"".join(path.read_bytes().splitlines(keepends=True)[:42]))
    assert main(["ledger", "repair", str(path), "--lost-step", "0.000001", "1000"]) == 2
    err = capsys.readouterr().err
    assert "cheaper than" in err and "q >= 0.05" in err and "sigma <= 1" in err, err
    with pytest.raises(ConfigError, match="cheaper than"):
        repair_ledger(path, lost_step=GaussianStep("poisson", 0.05, 1.5))
    assert main(["ledger", "repair", str(path), "--lost-step", "0.05", "1.0"]) == 0
    with open_ledger(path) as ledger:  # the 20 lost, and the last kept (nothing vouches for it)
        assert ledger.epsilon() >= spent
        assert ledger.epsilon() == pytest.approx(eps_of([STEP.times(62)]), rel=1e-9)


def test_repair_charges_each_lost_record_as_many_steps_as_the_largest_kept(
    tmp_path: Path
) -> None:
    """A record may hold several steps (local_steps): a lost one is charged the most any kept
    record holds."""
    path = tmp_path / "l.jsonl"
    with open_ledger(path) as ledger:
        for r in range(30):
            ledger.spend(STEP.times(4), time=float(r), round=r)
        spent = ledger.epsilon()
    path.write_bytes(b"".join(path.read_bytes().splitlines(keepends=True)[:21]))
    repair_ledger(path, lost_step=STEP)
    with open_ledger(path) as ledger:  # 30 records of 4, and the last kept charged again
        assert sum(s.count for s in ledger.steps) == 124
        assert ledger.epsilon() >= spent


# -- (d) an emptied ledger with a mark can be repaired -------------------------------------------
@pytest.mark.parametrize("mark", ["ceiling", "old"])
def test_an_emptied_ledger_is_repaired_from_its_mark(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], mark: str
) -> None:
    """Before: rc 2, "not a ledger header", whatever was given."""
    path = tmp_path / "l.jsonl"
    spent = written(path)
    if mark == "old":
        rewrite_as_old_mark(path)
    path.write_bytes(b"")
    assert main(["ledger", "repair", str(path), "--lost-step", "0.05", "1.0"]) == 2
    assert "--header" in capsys.readouterr().err  # the header's fields are lost with it
    header = json.dumps(HEADER)
    if mark == "old":
        # Every record is lost, the releases before round one with them if the client made
        # any; and only a human can say what the rounds cost.
        assert main(["ledger", "repair", str(path), "--header", header,
                     "--no-releases"]) == 2  # a LedgerError (a refused repair: exit 2)
        assert "--lost-step" in capsys.readouterr().err
        assert main(["ledger", "repair", str(path), "--lost-step", "0.05", "1.0",
                     "--header", header]) == 2
        assert "--no-releases" in capsys.readouterr().err
        assert main(["ledger", "repair", str(path), "--lost-step", "0.05", "1.0",
                     "--header", header, "--no-releases"]) == 0
    else:  # the mark says what its rounds cost and that nothing came before round one
        assert main(["ledger", "repair", str(path), "--lost-step", "0.01", "1.0",
                     "--header", header]) == 2
        assert "q >= 0.05" in capsys.readouterr().err  # a cheaper word is refused
        assert main(["ledger", "repair", str(path), "--header", header, "--json"]) == 0
        answer = json.loads(capsys.readouterr().out)
        assert answer["charged_from"] == "mark" and answer["substituted"] == 61
        assert answer["charged"] == {"sampling": "poisson", "q": 0.05, "sigma": 1.0, "count": 1}
    with open_ledger(path) as ledger:  # the client's own open accepts it
        assert sum(s.count for s in ledger.steps) == 61
        assert ledger.epsilon() == pytest.approx(spent, rel=1e-9)
        ledger.spend(STEP, time=100.0, round=61)
    assert main(["ledger", "check", str(path)]) == 0


@pytest.mark.parametrize("header", [
    "{}", "[1]", "not json", json.dumps({**HEADER, "sampling": "shuffled"}),
    json.dumps({**HEADER, "budget": {"epsilon": -1, "delta": 1e-5}}),
])
def test_a_bad_header_is_refused(tmp_path: Path, header: str) -> None:
    path = tmp_path / "l.jsonl"
    written(path, 3)
    path.write_bytes(b"")
    with pytest.raises((ConfigError, LedgerError), match="--header"):
        repair_ledger(path, lost_step=STEP, header=json.loads(header)
                      if header.startswith(("{", "[")) else header)  # type: ignore[arg-type]


def test_a_history_the_pld_cannot_represent_is_bounded_by_rdp(tmp_path: Path,
                                                              capsys: pytest.CaptureFixture[str]
                                                              ) -> None:
    """An attacker's fixed-size history (7 rounds of sigma 9.3, then 100 of sigma 0.38: a
    posture changed across a restart) makes the PLD's composed grid too wide to compute: the
    ledger's eps, its remaining budget and `fedsim account --ledger` raised where RDP bounds
    it at 3.37 under a budget of 5. They now answer RDP's bound (the smallest guarantee that
    can be computed), which is above the PLD of the later rounds alone."""
    from fedsim.errors import AccountantOutOfRange

    first = GaussianStep("fixed", 0.00019105573454994174, 9.312663317530415)
    later = GaussianStep("fixed", 0.00012561914337854606, 0.38326428052608313)
    with pytest.raises(AccountantOutOfRange, match="grid points"):
        make_accountant("pld", [first.times(7), later.times(100)]).epsilon(1e-5)
    rdp = make_accountant("rdp", [first.times(7), later.times(100)]).epsilon(1e-5)
    path = tmp_path / "c.jsonl"
    with PrivacyLedger.open(path, client_id="c", sampling="fixed",
                            budget=Budget(5.0, 1e-5)) as ledger:
        for r in range(107):
            ledger.spend([first if r < 7 else later], time=float(r), round=r)
        assert ledger.epsilon() == pytest.approx(rdp, rel=1e-12)
        assert ledger.remaining_epsilon == pytest.approx(5.0 - rdp, rel=1e-12)
    assert rdp > make_accountant("pld", [later.times(100)]).epsilon(1e-5)
    assert main(["account", "--ledger", str(path), "--json"]) == 0
    answer = json.loads(capsys.readouterr().out)
    assert (answer["epsilon"], answer["bound"]) == (pytest.approx(rdp, rel=1e-9), "rdp")
    assert answer["mu_kind"].startswith("none: the PLD cannot represent this history")


def test_a_deleted_header_line_is_written_back_from_the_given_header(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """An attacker deleted the header line alone: `ledger repair --header` said "damaged:
    False" and changed nothing (the given header hashes as the lost one did, so the chain
    verified), and the client's open kept refusing line 1. The repair now writes the header
    back, every record kept, and the client's open accepts it at the same eps."""
    path = tmp_path / "l.jsonl"
    spent = written(path, rounds=5)
    path.write_bytes(b"".join(path.read_bytes().splitlines(keepends=True)[1:]))
    with pytest.raises(LedgerError, match="line 1"):
        open_ledger(path)
    assert main(["ledger", "check", str(path)]) == 2  # (it said "sampling ... got 'None'")
    assert "line 1: not a ledger header" in capsys.readouterr().err
    assert main(["ledger", "repair", str(path), "--header", json.dumps(HEADER), "--json"]) == 0
    answer = json.loads(capsys.readouterr().out)
    assert (answer["damaged"], answer["kept"], answer["substituted"]) == (True, 5, 0)
    assert answer["why"].endswith("its lost header line is written from --header")
    with open_ledger(path) as ledger:
        assert len(ledger.records) == 5 and ledger.epsilon() == pytest.approx(spent, rel=1e-12)


def test_check_says_apart_an_intact_file_and_a_spending_over_its_budget(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A repair's substitutes took the ledger to eps 8.5 over its budget of 1: check printed
    ``over_budget: True`` beside ``ok: True``, which a stranger read as "within budget". The
    table now says ``intact`` and ends with a sentence that says both in words; ``--json``
    keeps ``ok`` beside the new ``intact``."""
    path = tmp_path / "l.jsonl"
    small = Budget(1.0, 1e-5)
    with PrivacyLedger.open(path, client_id="c1", sampling="poisson", budget=small) as ledger:
        for r in range(10):
            ledger.spend(GaussianStep("poisson", 0.02, 1.0), time=float(r), round=r)
    path.write_bytes(b"".join(path.read_bytes().splitlines(keepends=True)[:6]))  # 5 of 10 kept
    repair_ledger(path, lost_step=GaussianStep("poisson", 0.5, 0.8))
    assert main(["ledger", "check", str(path)]) == 0  # the file is intact: exit 0 as before
    out = capsys.readouterr().out
    assert "ok:" not in out and "intact:            True" in out
    assert "over_budget:       True" in out
    last = out.strip().splitlines()[-1]
    assert last.startswith("The file is intact (its hash chain and high-water mark verify), "
                           "but it is OVER ITS BUDGET: eps ")
    assert last.endswith("at delta 1e-05 spent, above its budget's eps 1.000.")
    assert main(["ledger", "check", str(path), "--json"]) == 0
    answer = json.loads(capsys.readouterr().out)
    assert answer["ok"] is True and answer["intact"] is True and answer["over_budget"] is True
    assert answer["epsilon"] > 1.0


def test_check_says_an_intact_ledger_is_within_its_budget(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "l.jsonl"
    written(path, rounds=5)
    assert main(["ledger", "check", str(path)]) == 0
    last = capsys.readouterr().out.strip().splitlines()[-1]
    assert "and it is within its budget: eps " in last and "of its budget's eps 8.000." in last


def test_check_writes_a_spending_just_over_its_budget_apart_from_the_budget(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A stranger cut a quickstart client's ledger (phone-001: q 0.0265, sigma 1.2, budget
    2.5, 438 rounds) to its first 8 records and repaired it; `ledger check` then said "OVER
    ITS BUDGET: eps 2.500 at delta 1e-05 spent, above its budget's eps 2.500". The two are
    now written with the digits that tell them apart (2.5002 above 2.5000)."""
    from fedsim.errors import BudgetExhausted
    from fedsim.privacy.epsilon_text import epsilons_apart

    path = tmp_path / "phone-001.jsonl"
    step = GaussianStep("poisson", 0.02652300041442188, 1.2)
    with PrivacyLedger.open(path, client_id="phone-001", sampling="poisson",
                            budget=Budget(2.5, 1e-5)) as ledger:
        with pytest.raises(BudgetExhausted):
            for r in range(1000):
                ledger.spend(step, time=float(r), round=r)
    path.write_bytes(b"".join(path.read_bytes().splitlines(keepends=True)[:9]))
    repair_ledger(path)
    assert main(["ledger", "check", str(path), "--json"]) == 0
    spent = json.loads(capsys.readouterr().out)["epsilon"]
    assert 2.5 < spent < 2.5005  # over, by less than the fourth digit shows
    assert main(["ledger", "check", str(path)]) == 0
    last = capsys.readouterr().out.strip().splitlines()[-1]
    assert last.endswith("OVER ITS BUDGET: eps 2.5002 at delta 1e-05 spent, above its "
                         "budget's eps 2.5000.")
    assert epsilons_apart(2.4981, 2.5) == ("2.498", "2.500")  # apart at four digits already
    assert epsilons_apart(2.5, 2.5) == ("2.500", "2.500")
    assert epsilons_apart(1.0, 1.0 + 2 ** -52) == ("1.0000000000000000", "1.0000000000000002")
