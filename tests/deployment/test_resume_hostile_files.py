"""An interrupted launch's directory handed over with hostile files in it (an attacker's review,
session 62), at the level of the functions a ``fedsim launch --resume`` calls: a FIFO where
``server.json``, ``launch.json`` or ``processes.json`` should be is named, not waited on for
ever; a deeply nested ``server.json`` is damage said as such; a symbolic link planted where the
resume writes (a process log, the server state's lock, ``clients.csv``) is refused, never
written through. (The ledgers' copies: tests/privacy/test_ledger_hostile_files.py.)"""

from __future__ import annotations

import contextlib
import os
import shutil
from pathlib import Path

import pytest

from fedsim.atomic import LinkRefused, open_log
from fedsim.errors import ConfigError
from fedsim.runtime.deployed.checkpoint import CheckpointError, ServerStateLock
from fedsim.runtime.deployed.resume import LAUNCH_FILE, resumable_scenario, scenario_sha256
from fedsim.runtime.run_outputs import (
    PROCESSES_FILE,
    SCENARIO_FILE,
    SERVER_FILE,
    TIMING_FILE,
    read_json,
    read_json_if_present,
    write_json,
)

FOUR = Path(__file__).parent / "four_clients.yaml"
PRECIOUS = b"PRECIOUS\n"


def _interrupted_launch(tmp_path: Path) -> Path:
    """What an interrupted launch leaves that a resume reads first."""
    out = tmp_path / "launch"
    (out / "state" / "server").mkdir(parents=True)
    shutil.copy(FOUR, out / SCENARIO_FILE)
    write_json(out / PROCESSES_FILE, {})
    write_json(out / LAUNCH_FILE, {"scenario_sha256": scenario_sha256(out / SCENARIO_FILE)})
    return out


def test_an_honest_directory_resumes(tmp_path: Path) -> None:
    out = _interrupted_launch(tmp_path)
    assert resumable_scenario(out) == out / SCENARIO_FILE


def test_a_simulations_directory_is_said_to_be_one_that_cannot_be_resumed(
        tmp_path: Path) -> None:
    """A stranger's ``launch --resume`` of an interrupted ``fedsim run`` directory was told
    only which of a launch's files were missing."""
    simulation = tmp_path / "run"
    simulation.mkdir()
    shutil.copy(FOUR, simulation / SCENARIO_FILE)
    (simulation / "metrics.jsonl").write_text("")
    with pytest.raises(ConfigError, match=r"a simulation's \(fedsim run\), which cannot be "
                                          r"resumed: run the scenario again"):
        resumable_scenario(simulation)
    elsewhere = tmp_path / "empty"
    elsewhere.mkdir()
    with pytest.raises(ConfigError, match="nothing to resume$"):
        resumable_scenario(elsewhere)


@pytest.mark.parametrize("name", [SERVER_FILE, LAUNCH_FILE])
def test_a_fifo_for_a_file_the_resume_reads_is_named_not_waited_on(tmp_path: Path,
                                                                   name: str) -> None:
    out = _interrupted_launch(tmp_path)
    (out / name).unlink(missing_ok=True)
    os.mkfifo(out / name)  # hung the resume before
    with pytest.raises(ConfigError, match=f"{name}: cannot be read"):
        resumable_scenario(out)


def test_a_nested_server_json_is_damage_said_as_such(tmp_path: Path) -> None:
    out = _interrupted_launch(tmp_path)
    (out / SERVER_FILE).write_text("[" * 200_000 + "]" * 200_000)  # RecursionError before
    with pytest.raises(ConfigError, match=f"{SERVER_FILE}: not JSON"):
        resumable_scenario(out)


def test_the_launchers_own_files_are_read_without_waiting(tmp_path: Path) -> None:
    """``processes.json`` (read strictly on a resume) and ``timing.json`` (read leniently at
    the collect) as FIFOs."""
    for name in (PROCESSES_FILE, TIMING_FILE):
        os.mkfifo(tmp_path / name)
    with pytest.raises(ConfigError, match=f"{PROCESSES_FILE}: cannot be read"):
        read_json_if_present(tmp_path / PROCESSES_FILE)
    assert read_json(tmp_path / TIMING_FILE) == {}
    assert read_json_if_present(tmp_path / "absent.json") == {}


def _planted(tmp_path: Path, where: Path) -> Path:
    victim = tmp_path / "victims" / where.name
    victim.parent.mkdir(exist_ok=True)
    victim.write_bytes(PRECIOUS)
    where.parent.mkdir(parents=True, exist_ok=True)
    where.symlink_to(victim)
    return victim


def test_a_process_log_that_is_a_link_is_refused(tmp_path: Path) -> None:
    log = tmp_path / "launch" / "logs" / "c-001.log"
    victim = _planted(tmp_path, log)
    with pytest.raises(LinkRefused, match="c-001.log: is a symbolic link"):
        open_log(log)
    assert victim.read_bytes() == PRECIOUS
    fresh = log.with_name("c-002.log")
    os.close(open_log(fresh))
    assert fresh.is_file()


def test_a_server_state_lock_that_is_a_link_is_refused(tmp_path: Path) -> None:
    state = tmp_path / "launch" / "state" / "server"
    victim = _planted(tmp_path, state / "server.lock")
    with pytest.raises(CheckpointError, match="symbolic link"):
        ServerStateLock(state)
    assert victim.read_bytes() == PRECIOUS


def test_a_fifo_for_the_servers_checkpoint_is_refused_not_waited_on(tmp_path: Path) -> None:
    """A resumed server opened state/server/server.ckpt with a plain open: a FIFO there hung
    it (a review)."""
    from fedsim.runtime.deployed.checkpoint import ServerCheckpoint

    checkpoint = ServerCheckpoint(tmp_path, {"run": "r"})
    os.mkfifo(checkpoint.path)
    with pytest.raises(CheckpointError, match="not a regular file"):
        checkpoint.load()



def _serve_stopped_at_once(out: Path, state: Path) -> None:
    """``serve`` on a run directory, a signal already given: it prepares its output directory
    (what a resumed launch's server does first) and stops before any connection."""
    import asyncio

    from fedsim.config import load_scenario
    from fedsim.runtime.deployed.server_process import serve
    from fedsim.transports.mqtt import parse_broker_url

    async def main() -> None:
        stop = asyncio.Event()
        stop.set()
        await serve(load_scenario(FOUR), parse_broker_url("mqtt://127.0.0.1:9"),
                    state_dir=state, out_dir=out, stop=stop)

    asyncio.run(main())


@pytest.mark.parametrize("name", ["metrics.jsonl", "applied.jsonl", SCENARIO_FILE])
def test_a_servers_output_file_that_is_a_dangling_link_is_not_written_through(
        tmp_path: Path, name: str) -> None:
    """The server's per-window files (appended to) and its resolved scenario in a run
    directory handed over: a link with no target was created through, the server's lines
    written to a file elsewhere (an attacker's review, session 64)."""
    out = tmp_path / "launch"
    out.mkdir()
    victim = tmp_path / "victims" / name
    victim.parent.mkdir()
    (out / name).symlink_to(victim)
    with contextlib.suppress(LinkRefused):  # refused, or the link replaced: never followed
        _serve_stopped_at_once(out, tmp_path / "state")
    assert not victim.exists()


@pytest.mark.parametrize("name", ["metrics.jsonl", "applied.jsonl"])
def test_a_fifo_for_a_servers_per_window_file_is_named_not_waited_on(
        tmp_path: Path, name: str) -> None:
    """A FIFO where a resumed server trims its per-window lines hung it before it connected
    (an attacker's review, session 64)."""
    out = tmp_path / "launch"
    out.mkdir()
    os.mkfifo(out / name)
    with pytest.raises(ConfigError, match=f"{name}: cannot be read"):
        _serve_stopped_at_once(out, tmp_path / "state")
