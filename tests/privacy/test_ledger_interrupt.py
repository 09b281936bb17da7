"""Ctrl-C during a spend: the record is either on disk and in memory, or in neither.

An interrupted run writes its clients.csv from the ledgers in memory and ``fedsim report``
checks it against the files: a KeyboardInterrupt between the durable write and the in-memory
update made clients.csv report less spending than the ledger held (seen on a loaded machine:
eps 5.323 against the file's 5.366)."""

from __future__ import annotations

import os
import signal
from pathlib import Path
from typing import Any

import pytest

from fedsim.privacy import ledger as ledger_module
from fedsim.privacy.events import GaussianStep
from fedsim.privacy.ledger import Budget, PrivacyLedger, read_ledger_steps


def test_a_ctrl_c_after_the_durable_write_waits_for_the_memory(tmp_path: Path,
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    original = ledger_module.append_durably

    def append_then_interrupt(handle: Any, payload: bytes, *, fsync: bool = True) -> None:
        original(handle, payload, fsync=fsync)
        os.kill(os.getpid(), signal.SIGINT)  # Ctrl-C, once the records are on disk

    path = tmp_path / "c.jsonl"
    with PrivacyLedger.open(path, client_id="c", sampling="poisson",
                            budget=Budget(10.0, 1e-5)) as ledger:
        ledger.spend(GaussianStep("poisson", 0.01, 1.0), time=0.0, round=0)
        monkeypatch.setattr(ledger_module, "append_durably", append_then_interrupt)
        with pytest.raises(KeyboardInterrupt):
            ledger.spend(GaussianStep("poisson", 0.01, 1.0), time=1.0, round=1)
        monkeypatch.setattr(ledger_module, "append_durably", original)
        assert len(ledger.records) == len(list(read_ledger_steps(path))) == 2
        # The accountant (clients.csv's eps) holds what the file holds, not one spend fewer.
        assert sum(step.count for step in ledger.steps) == 2
        spent = ledger.epsilon()
        with PrivacyLedger.open(path, client_id="c", sampling="poisson", budget=Budget(10.0, 1e-5),
                                read_only=True) as reread:
            assert reread.epsilon(1e-5) == spent
        ledger.spend(GaussianStep("poisson", 0.01, 1.0), time=2.0, round=2)  # still usable
    assert len(list(read_ledger_steps(path))) == 3


def test_the_budget_counters_move_with_the_interrupted_spend(tmp_path: Path,
                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    """The allowance (how many more rounds fit, counted down per spend) is part of the commit:
    had it missed the interrupted spend, it would let one round too many through."""
    original = ledger_module.append_durably
    step = GaussianStep("poisson", 0.05, 2.0)

    def append_then_interrupt(handle: Any, payload: bytes, *, fsync: bool = True) -> None:
        original(handle, payload, fsync=fsync)
        os.kill(os.getpid(), signal.SIGINT)

    path = tmp_path / "c.jsonl"
    with PrivacyLedger.open(path, client_id="c", sampling="poisson",
                            budget=Budget(0.8, 1e-5)) as ledger:
        # The allowance is built here: 52 steps fit, fewer than its first search's 64, so it
        # counts exactly and only its count stops the 53rd.
        assert ledger.can_spend(step)
        monkeypatch.setattr(ledger_module, "append_durably", append_then_interrupt)
        with pytest.raises(KeyboardInterrupt):
            ledger.spend(step, time=0.0, round=0)
        monkeypatch.setattr(ledger_module, "append_durably", original)
        spent = 1
        while ledger.can_spend(step):
            ledger.spend(step, time=float(spent), round=spent)
            spent += 1
    # A fresh accountant over the file: the last spend fits, one more does not.
    steps = list(read_ledger_steps(path))
    assert len(steps) == spent
    from fedsim.privacy.accountant import make_accountant

    assert make_accountant("pld", [step.times(spent)]).epsilon(1e-5) <= 0.8
    assert make_accountant("pld", [step.times(spent + 1)]).epsilon(1e-5) > 0.8

