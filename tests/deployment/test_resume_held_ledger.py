"""``fedsim launch --resume`` right after a launcher was killed outright (SIGKILL): its clients
were still stopping (each waits up to its flush timeout for receipts from a server that is
gone) and held their ledgers. A stranger's resume then said four times "the ledger is open
elsewhere (another process or handle holds its lock)" and nothing more, though waiting a few
seconds and running the same command again was all it took (docs/DEPLOYMENT.md says so). The
refusal now says it too."""

from __future__ import annotations

import fcntl
import os
from pathlib import Path

import pytest

from fedsim.config import load_scenario
from fedsim.errors import ConfigError
from fedsim.runtime.assembly import open_ledger
from fedsim.runtime.deployed.resume import check_state_ledgers
from fedsim.runtime.population import build_population
from fedsim.runtime.run_outputs import ledger_file
from tests.deployment.test_deployed_run import SCENARIO


def test_a_ledger_still_held_says_to_wait_and_retry(tmp_path: Path) -> None:
    loaded = load_scenario(SCENARIO)
    plan = build_population(loaded).plans[1]

    def state_dir(client_id: str) -> Path:
        return tmp_path / "state" / client_id

    path = ledger_file(state_dir(plan.client_id), plan.client_id)
    path.parent.mkdir(parents=True)
    open_ledger(plan, path).close()
    check_state_ledgers(loaded, state_dir)  # free: it opens

    marks = [p for p in path.parent.iterdir() if p != path]
    assert marks, list(path.parent.iterdir())
    held = [os.open(mark, os.O_RDONLY) for mark in marks]  # a stopping client's lock
    try:
        for fd in held:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        with pytest.raises(ConfigError) as refused:
            check_state_ledgers(loaded, state_dir)
    finally:
        for fd in held:
            os.close(fd)
    said = str(refused.value)
    assert said.startswith(f"cannot resume: {plan.client_id}: ")
    assert "open elsewhere" in said
    assert said.endswith("a process of the earlier launch may still be stopping (a client waits "
                         "up to its flush timeout for the server's receipts; ps lists it as "
                         "'fedsim client ID'): wait for it and run the same command again")

    # A damaged ledger is not one to wait for: no such advice.
    path.write_bytes(path.read_bytes()[:-5] + b"####\n")
    with pytest.raises(ConfigError) as damaged:
        check_state_ledgers(loaded, state_dir)
    assert "wait for it" not in str(damaged.value)


def test_a_damaged_exit_report_or_followed_file_is_said_before_the_resume(tmp_path: Path) -> None:
    """A client's start refuses a damaged exit report or ``followed.json`` (exit status 2): a
    resumed launch says so before it starts anything, as it does a damaged ledger, rather
    than run with that client failing at its start."""
    loaded = load_scenario(SCENARIO)
    first, second = (p.client_id for p in build_population(loaded).plans[:2])

    def state_dir(client_id: str) -> Path:
        return tmp_path / "state" / client_id

    check_state_ledgers(loaded, state_dir)  # nothing there: every client starts afresh
    state_dir(first).mkdir(parents=True)
    (state_dir(first) / f"client-{first}.json").write_text('{"released": [')
    state_dir(second).mkdir(parents=True)
    (state_dir(second) / "followed.json").write_text('{"incarnations": 7}')
    with pytest.raises(ConfigError) as refused:
        check_state_ledgers(loaded, state_dir)
    said = str(refused.value)
    assert said.startswith(f"cannot resume: {first}: {state_dir(first)}/client-{first}.json: ")
    assert f"; {second}: {state_dir(second)}/followed.json is damaged" in said
