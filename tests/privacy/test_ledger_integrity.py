"""Ledger integrity (issue 15 item 9): one writer per ledger, cuts and edits detected and
refused, a repair that only adds spending, and times that never go back."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from fedsim.cli import main
from fedsim.errors import BudgetExhausted, LedgerError
from fedsim.privacy.accountant import make_accountant
from fedsim.privacy.events import GaussianStep
from fedsim.privacy.ledger import Budget, PrivacyLedger
from fedsim.privacy.ledger_file import line_hash
from fedsim.privacy.ledger_mark import mark_path
from fedsim.privacy.ledger_repair import repair_ledger
from tests.privacy.old_marks import rewrite_as_old_mark

STEP = GaussianStep("poisson", 0.01, 1.0)
BUDGET = Budget(2.0, 1e-5)
ROOT = Path(__file__).resolve().parents[2]


def open_ledger(path: Path, **kw: object) -> PrivacyLedger:
    return PrivacyLedger.open(path, client_id="c1", sampling="poisson", budget=BUDGET, **kw)  # type: ignore[arg-type]


def written(path: Path, rounds: int = 20) -> float:
    """A ledger of ``rounds`` acknowledged spends; its eps."""
    with open_ledger(path) as ledger:
        for r in range(rounds):
            ledger.spend(STEP, time=float(r), round=r)
        return ledger.epsilon()


def eps_after_repair(path: Path, rounds: int | None = None, **kw: object) -> float:
    """Repair, check that the repaired ledger holds at least the ``rounds`` acknowledged steps
    (when given) and return its eps."""
    repair_ledger(path, **kw)  # type: ignore[arg-type]
    with open_ledger(path) as ledger:  # valid again, writable
        if rounds is not None:
            counts = dict((s.key, s.count) for s in ledger.steps)
            assert counts.get(STEP.key, 0) >= rounds  # never a released step less
        return ledger.epsilon()


# -- one writer ------------------------------------------------------------------------------
def test_second_opener_in_the_same_process_fails_until_the_first_closes(tmp_path: Path) -> None:
    path = tmp_path / "l.jsonl"
    first = open_ledger(path)
    with pytest.raises(LedgerError, match="open elsewhere"):
        open_ledger(path)
    first.spend(STEP, time=0.0, round=0)
    first.close()
    with open_ledger(path) as again:
        assert len(again.records) == 1


_CHILD = textwrap.dedent("""
    import sys
    from fedsim.errors import BudgetExhausted, LedgerError
    from fedsim.privacy.events import GaussianStep
    from fedsim.privacy.ledger import Budget, PrivacyLedger
    try:
        ledger = PrivacyLedger.open(sys.argv[1], client_id="c1", sampling="poisson",
                                    budget=Budget(2.0, 1e-5))
    except LedgerError as exc:
        print("REFUSED", exc)
        sys.exit(3)
    print("OPENED", flush=True)
    sys.stdin.readline()  # hold the ledger until told to spend
    step = GaussianStep("poisson", 0.01, 1.0)
    spent = 0
    try:
        for r in range(2400):
            ledger.spend(step, time=float(r), round=r)
            spent += 1
    except BudgetExhausted:
        pass
    print("SPENT", spent)
""")


@pytest.mark.slow
def test_two_processes_cannot_both_spend_one_ledger(tmp_path: Path) -> None:
    """Today's attack: two processes on one ledger each spent to the budget (eps 2.84 for a
    budget of 2.0). Now the second is refused while the first holds the ledger."""
    path = tmp_path / "l.jsonl"
    env = {"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"}
    first = subprocess.Popen([sys.executable, "-c", _CHILD, str(path)], stdin=subprocess.PIPE,
                             stdout=subprocess.PIPE, text=True, env=env)
    try:
        assert first.stdout is not None and first.stdout.readline().startswith("OPENED")
        second = subprocess.run([sys.executable, "-c", _CHILD, str(path)], input="\n",
                                capture_output=True, text=True, env=env, timeout=120)
        assert second.returncode == 3 and "open elsewhere" in second.stdout
        out, _ = first.communicate("\n", timeout=300)
    finally:
        first.kill()
    assert first.returncode == 0 and "SPENT" in out
    with open_ledger(path) as ledger:
        assert ledger.epsilon() <= BUDGET.epsilon
        assert len(ledger.records) == int(out.split()[-1]) < 2400


# -- cuts and edits ----------------------------------------------------------------------------
@pytest.mark.parametrize("mark", ["ceiling", "old"])
def test_cut_in_half_is_refused_and_repair_adds_the_lost_spending(tmp_path: Path,
                                                                   mark: str) -> None:
    path = tmp_path / "l.jsonl"
    spent = written(path, 40)
    if mark == "old":  # made by a fedsim before the mark carried the step ceiling
        rewrite_as_old_mark(path)
    lines = path.read_bytes().splitlines(keepends=True)
    path.write_bytes(b"".join(lines[:21]))  # header + 20 of 40 records
    with pytest.raises(LedgerError, match="holds 20 records but 40 were acknowledged"):
        open_ledger(path)
    if mark == "old":  # nothing says what the lost records cost: a human names it
        with pytest.raises(LedgerError, match="--lost-step"):
            repair_ledger(path)
        repaired = eps_after_repair(path, 40, lost_step=STEP)
    else:  # the mark's ceiling charges them, with no one's word
        repaired = eps_after_repair(path, 40)
    # the 20 lost, and the last kept again (no later line vouches for it): 41 steps
    assert repaired >= spent
    assert repaired == pytest.approx(make_accountant("pld", [STEP.times(41)]).epsilon(
        BUDGET.delta), rel=1e-9)
    assert len(list(tmp_path.glob("l.jsonl.damaged-*"))) == 1


def test_edited_sigma_is_refused_and_repair_never_lowers_eps(tmp_path: Path) -> None:
    path = tmp_path / "l.jsonl"
    spent = written(path, 30)
    text = path.read_text().splitlines()
    record = json.loads(text[5])
    record["step"]["sigma"] = 100.0  # the hand edit of the issue (eps 0.718 -> 0.0044)
    text[5] = json.dumps(record)
    path.write_text("\n".join(text) + "\n")
    with pytest.raises(LedgerError, match="line 7: .*hash chain is broken"):
        open_ledger(path)
    with pytest.raises(LedgerError, match="line 7"):
        PrivacyLedger.open(path, client_id="c1", sampling="poisson", budget=BUDGET,
                           read_only=True)
    assert eps_after_repair(path, 30, lost_step=STEP) >= spent * (1 - 1e-3)


def test_a_rehashed_edit_is_caught_by_the_mark(tmp_path: Path) -> None:
    path = tmp_path / "l.jsonl"
    spent = written(path, 10)
    lines = path.read_text().splitlines()
    out, prev = [lines[0]], line_hash(lines[0].encode())
    for line in lines[1:]:
        record = json.loads(line)
        record["step"]["sigma"], record["prev"] = 50.0, prev
        out.append(json.dumps(record))
        prev = line_hash(out[-1].encode())
    path.write_text("\n".join(out) + "\n")  # a consistent chain, but not the acknowledged one
    with pytest.raises(LedgerError, match="record 10 is not the one acknowledged"):
        open_ledger(path)
    # Every acknowledged step is charged again (the edited ones are kept as well). Their tiny
    # extra steps refine the accountant's grid, which may lower its (upper-bound) eps by
    # ~1e-4 relative: the spending only grew, the number is compared at grid accuracy.
    assert eps_after_repair(path, 10, lost_step=STEP) >= spent * (1 - 1e-3)


@pytest.mark.parametrize("damage", ["delete", "duplicate", "nan-time", "garbage"])
def test_line_damage_is_refused_and_repair_only_adds(tmp_path: Path, damage: str) -> None:
    path = tmp_path / "l.jsonl"
    spent = written(path, 20)
    lines = path.read_text().splitlines()
    if damage == "delete":
        del lines[7]
    elif damage == "duplicate":
        lines.insert(7, lines[7])
    elif damage == "nan-time":
        lines[7] = lines[7].replace('"time": 6.0', '"time": NaN')
    else:
        lines[7] = "\udcff not json".encode("utf-8", "surrogateescape").decode("latin-1")
    path.write_text("\n".join(lines) + "\n", encoding="latin-1" if damage == "garbage" else None)
    with pytest.raises(LedgerError, match="line (8|9)"):
        open_ledger(path)
    assert eps_after_repair(path, 20, lost_step=STEP) >= spent


def test_crash_between_records_and_mark_is_accepted(tmp_path: Path) -> None:
    path = tmp_path / "l.jsonl"
    with open_ledger(path) as ledger:
        ledger.spend(STEP, time=0.0, round=0)
        mark = mark_path(path).read_bytes()
        ledger.spend(STEP, time=1.0, round=1)
    mark_path(path).write_bytes(mark)  # the records were fsynced, the mark not yet moved
    with open_ledger(path) as ledger:
        assert [r.round for r in ledger.records] == [0, 1]  # counted: the safe direction
    with open_ledger(path) as ledger:  # and the mark was moved up
        assert len(ledger.records) == 2


def test_a_lost_mark_refuses_writing_until_vouched_for(tmp_path: Path) -> None:
    path = tmp_path / "l.jsonl"
    spent = written(path, 5)
    mark_path(path).unlink()
    with pytest.raises(LedgerError, match="no high-water mark"):
        open_ledger(path)
    with PrivacyLedger.open(path, client_id="c1", sampling="poisson", budget=BUDGET,
                            read_only=True) as view:  # reports on a copy: chain only
        assert view.epsilon() == spent
    with pytest.raises(LedgerError, match="--assume-lost"):
        repair_ledger(path)
    assert eps_after_repair(path, assume_lost=0) == spent


def test_old_format_is_refused_with_its_migration(tmp_path: Path) -> None:
    path = tmp_path / "old.jsonl"
    header = {"format": "fedsim-ledger/1", "client_id": "c1", "sampling": "poisson",
              "accountant": "pld", "budget": BUDGET.to_json()}
    records = [{"time": float(r), "round": r, "step": STEP.to_json()} for r in range(4)]
    path.write_text("\n".join(json.dumps(x) for x in [header, *records]) + "\n")
    with pytest.raises(LedgerError, match="fedsim ledger repair .* --assume-lost 0"):
        open_ledger(path)
    assert main(["ledger", "repair", str(path), "--assume-lost", "0"]) == 0
    with open_ledger(path) as ledger:
        assert ledger.steps == (STEP.times(4),)
    assert main(["ledger", "check", str(path)]) == 0


def test_check_command_exits_2_on_a_cut_ledger(tmp_path: Path,
                                                capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "l.jsonl"
    written(path, 6)
    path.write_bytes(b"".join(path.read_bytes().splitlines(keepends=True)[:3]))
    assert main(["ledger", "check", str(path)]) == 2
    assert "acknowledged" in capsys.readouterr().err
    assert main(["ledger", "repair", str(path), "--lost-step", "0.01", "1.0"]) == 0
    assert main(["ledger", "check", str(path)]) == 0


# -- time ---------------------------------------------------------------------------------------
def test_records_never_go_back_in_time(tmp_path: Path) -> None:
    path = tmp_path / "l.jsonl"
    with open_ledger(path) as ledger:
        assert ledger.last_time == 0.0
        ledger.spend(STEP, time=8.44, round=7)
    with open_ledger(path) as restarted:  # a restarted client's clock starts here
        assert restarted.last_time == 8.44
        with pytest.raises(LedgerError, match="before the last record"):
            restarted.spend(STEP, time=0.65, round=8)  # the restart at t=0
        restarted.spend(STEP, time=restarted.last_time + 0.65, round=8)
        assert [r.time for r in restarted.records] == [8.44, 8.44 + 0.65]


def test_spend_reuses_the_check_just_made(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A changing schedule without a plan: the client checks, then spends; the spend must not
    run the dry run again (it used to compute the kind's headroom, ~30 evaluations)."""
    with open_ledger(tmp_path / "l.jsonl") as ledger:
        for r, sigma in enumerate((1.0, 1.1, 1.2, 1.3, 1.4)):
            step = GaussianStep("poisson", 0.01, sigma)
            assert ledger.can_spend(step)
            with monkeypatch.context() as patch:
                patch.setattr(type(ledger.accountant), "preview",
                              lambda *a: pytest.fail("a second dry run"))
                ledger.spend(step, time=float(r), round=r)
        bigger = GaussianStep("poisson", 0.5, 0.5, 10**4)
        assert not ledger.can_spend(bigger)  # the memo is per question and per state
        with pytest.raises(BudgetExhausted):
            ledger.spend(bigger, time=9.0, round=9)


def test_a_repaired_ledger_resumes_its_rounds_past_its_substitutes(tmp_path: Path) -> None:
    """Two rounds' records lost and repaired: each substitute (round -1) stands for a record
    that may have been a released round, so the client resumes at 3 + 2, never at a round it
    may have released (a server would drop it as a duplicate, or take the client for one on a
    lost ledger)."""
    path = tmp_path / "c.jsonl"
    with PrivacyLedger.open(path, client_id="c", sampling="poisson", budget=None) as ledger:
        for r in range(5):
            ledger.spend(STEP, time=float(r), round=r)
        assert ledger.next_round == 5
    lines = path.read_bytes().splitlines(keepends=True)
    path.write_bytes(b"".join(lines[:-2]))
    # the two lost, and the last kept (round 2: nothing after it vouches for it)
    assert repair_ledger(path, lost_step=STEP).substituted == 3
    with PrivacyLedger.open(path, client_id="c", sampling="poisson", budget=None) as repaired:
        assert repaired.rounds == frozenset({0, 1, 2})
        assert repaired.next_round == 6
        repaired.spend(STEP, time=5.0, round=repaired.next_round)
    with PrivacyLedger.open(path, client_id="c", sampling="poisson", budget=None,
                            read_only=True) as again:
        assert again.next_round == 7


def test_check_prints_aligned_fields_and_the_ceiling_as_fields(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A stranger: `damaged_mark_slot:False` ran into its value (the key longer than the
    column) and the step ceiling printed as a Python dict."""
    path = tmp_path / "l.jsonl"
    written(path, 3)
    assert main(["ledger", "check", str(path)]) == 0
    *lines, verdict = capsys.readouterr().out.splitlines()
    assert verdict.startswith("The file is intact")  # a sentence below the table
    starts = {line.index(line.split(":", 1)[1].strip()) for line in lines}
    assert len(starts) == 1  # every value starts in one column
    (ceiling,) = [line for line in lines if line.startswith("step_ceiling:")]
    assert "{" not in ceiling and "q=" in ceiling and "sigma=" in ceiling
    assert any(line.startswith("damaged_mark_slot: ") for line in lines)


def test_a_mark_swapped_in_from_a_longer_ledger_is_refused_naming_that_case(
        tmp_path: Path) -> None:
    """An attacker's review: a mark file copied from another client's longer ledger was
    refused as "the file was cut" alone; the refusal now names the swap as well."""
    path, other = tmp_path / "l.jsonl", tmp_path / "other" / "l.jsonl"
    other.parent.mkdir()
    written(path, 10)
    written(other, 30)
    mark_path(path).write_bytes(mark_path(other).read_bytes())
    with pytest.raises(LedgerError, match=r"holds 10 records but 30 were acknowledged .*"
                                          r"its mark file is another ledger's"):
        open_ledger(path)
