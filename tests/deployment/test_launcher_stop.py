"""The launcher's stop records every process's exit, even one that ends by itself while the
stop looks at it (a flaky crash test lost a restarted client's 0: it ended between the stop's
look for ended processes and its look for running ones, and was in neither)."""

from __future__ import annotations

import json
import signal
import subprocess
from collections.abc import Callable
from pathlib import Path

import pytest

from fedsim.errors import TransportError
from fedsim.runtime.deployed.launcher import Launcher, _Process
from tests.deployment.test_deployed_run import SCENARIO


class _EndsWhileLookedAt:
    """A child that is running at the first look and has ended (status 0) at every later one,
    so whichever two looks a stop takes straddle its end."""

    def __init__(self) -> None:
        self.looks = 0
        self.signals: list[int] = []

    def poll(self) -> int | None:
        self.looks += 1
        return None if self.looks == 1 else 0

    def wait(self, timeout: float | None = None) -> int:
        return 0

    def send_signal(self, sig: int) -> None:
        if self.poll() is None:
            self.signals.append(sig)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)


class _Running:
    """A child that runs until it is sent SIGTERM, then exits 0."""

    def __init__(self) -> None:
        self.signals: list[int] = []

    def poll(self) -> int | None:
        return 0 if self.signals else None

    def wait(self, timeout: float | None = None) -> int:
        assert self.signals == [signal.SIGTERM]
        return 0

    def send_signal(self, sig: int) -> None:
        self.signals.append(sig)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)


def test_stop_all_records_a_process_that_ends_while_it_looks(tmp_path: Path) -> None:
    launcher = Launcher(SCENARIO, tmp_path / "run")
    ending, running = _EndsWhileLookedAt(), _Running()
    children = {"c-000": ending, "c-001": running}
    for name in launcher.client_ids + ["server"]:
        launcher.processes[name] = _Process(name, [], tmp_path / f"{name}.log")
    for name, child in children.items():
        launcher.processes[name].child = child  # type: ignore[assignment]
    launcher.exit_codes["c-000"] = [-signal.SIGKILL]  # killed once, restarted

    launcher.stop_all(grace=0.1)

    assert launcher.exit_codes == {"c-000": [-signal.SIGKILL, 0], "c-001": [0]}
    assert running.signals == [signal.SIGTERM]
    assert all(process.child is None for process in launcher.processes.values())


def test_the_starts_are_on_disk_once_the_processes_have_started(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A stranger's launcher killed outright (SIGKILL) left processes.json as its start wrote
    it, every process started 0 times; `fedsim launch --resume` then counted one start of the
    server in all, and its summary said nothing of the run's first part (no `resumed`, no "It
    ran in 2 parts"). The starts are written once the processes have started."""
    launcher = Launcher(SCENARIO, tmp_path / "run")
    for name in launcher.client_ids + ["server"]:
        launcher.processes[name] = _Process(name, [], tmp_path / f"{name}.log")

    def start(name: str) -> None:  # no process: the count alone
        launcher.processes[name].starts += 1

    monkeypatch.setattr(launcher, "start", start)
    (tmp_path / "run").mkdir()
    launcher.start_all()

    written = json.loads((tmp_path / "run" / "processes.json").read_text())
    assert {name: p["starts"] for name, p in written.items()} == {
        name: 1 for name in [*launcher.client_ids, "server"]}


class _Slow(_Running):
    """A child that runs (its waits time out) until it is sent SIGTERM, then exits 0."""

    def wait(self, timeout: float | None = None) -> int:
        if not self.signals:
            raise subprocess.TimeoutExpired("fedsim", timeout or 0.0)
        return 0


def _no_processes_yet(launcher: Launcher, tmp_path: Path) -> Callable[[], None]:
    """A ``prepare`` for ``launcher`` that makes its run directory and a record, with no child
    yet, of the server and each client (the tests start fake children in their place)."""

    def prepare() -> None:
        (tmp_path / "run").mkdir()
        for name in [*launcher.client_ids, "server"]:
            launcher.processes[name] = _Process(name, [], tmp_path / f"{name}.log")

    return prepare


def test_a_timed_out_launch_says_it_can_go_on_and_keeps_the_exit_statuses(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A stranger's launch past its --timeout said only "the server did not reach the stop
    condition within 20 wall seconds (see .../logs)", though its state was kept and
    `fedsim launch --resume` goes on with it, and left processes.json without the exit
    statuses of the processes it stopped."""
    launcher = Launcher(SCENARIO, tmp_path / "run")
    names = [*launcher.client_ids, "server"]

    def start_all() -> None:
        for process in launcher.processes.values():
            process.starts += 1
            process.child = _Slow()  # type: ignore[assignment]

    monkeypatch.setattr(launcher, "prepare", _no_processes_yet(launcher, tmp_path))
    monkeypatch.setattr(launcher, "start_all", start_all)
    with pytest.raises(TransportError) as raised:
        launcher.run_to_end(0.2)
    assert str(raised.value).endswith(
        f"its processes were stopped: 'fedsim launch --resume {tmp_path / 'run'} --timeout "
        f"SECONDS' goes on with it")
    written = json.loads((tmp_path / "run" / "processes.json").read_text())
    assert {name: p["exit_codes"] for name, p in written.items()} == {n: [0] for n in names}


def test_a_resumed_launch_follows_only_the_windows_it_runs(tmp_path: Path) -> None:
    """A stranger's resumed launch logged the first part's windows again (window 40 at
    accuracy 0.7336, stamped with the resume's time): its follower of metrics.jsonl read the
    file from its start. Resumed, it reads from the lines already there; a file trimmed by a
    restarted server is read again from its start, as before."""
    from fedsim.runtime.deployed.launcher import _LineFollower

    metrics = tmp_path / "metrics.jsonl"
    metrics.write_text('{"window": 1}\n{"window": 2}\n{"win', encoding="utf-8")
    assert [m["window"] for m in _LineFollower(metrics).new_lines()] == [1, 2]
    follower = _LineFollower(metrics, from_end=True)
    assert follower.new_lines() == []
    with open(metrics, "a", encoding="utf-8") as handle:
        handle.write('dow": 3}\n')
    assert follower.new_lines() == [{"window": 3}]
    metrics.write_text('{"window": 1}\n', encoding="utf-8")  # trimmed
    assert follower.new_lines() == [{"window": 1}]


def test_a_launchs_summary_names_a_process_that_died(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A stranger's client process killed mid-launch (SIGKILL) was not restarted, and the
    summary said only that 1 client "could still train when the run ended" (its state
    "waiting"): processes.json alone held its -9. The launcher hands the collect each
    process whose last exit status was not 0, and the summary's warnings name it."""
    from fedsim.config import load_scenario
    from fedsim.runtime.deployed.collection import collect_outputs

    summary = collect_outputs(load_scenario(SCENARIO), tmp_path, {}, wall_seconds=1.0,
                              failed_processes={"c-000": -signal.SIGKILL, "c-001": 2})
    said = ["c-000's process was killed by SIGKILL and was not running at the end "
            "(logs/c-000.log)",
            "c-001's process exited with status 2 and was not running at the end "
            "(logs/c-001.log)"]
    assert summary["warnings"] == said
    assert f"Warnings: (1) {said[0]}" in summary["explanation"]

    launcher = Launcher(SCENARIO, tmp_path / "run")
    seen: dict[str, object] = {}
    launcher.exit_codes = {"c-000": [-signal.SIGKILL], "c-001": [0], "c-002": [-9, 0]}
    for name in [*launcher.client_ids, "server"]:
        launcher.processes[name] = _Process(name, [], tmp_path / f"{name}.log")

    def collect(*args: object, **kwargs: object) -> dict[str, object]:
        seen.update(kwargs)
        return {}

    monkeypatch.setattr("fedsim.runtime.deployed.launcher.collect_outputs", collect)
    (tmp_path / "run").mkdir()
    launcher.processes["c-002"].restarts = 1
    launcher.collect()
    assert seen["failed_processes"] == {"c-000": -signal.SIGKILL}
    assert seen["restarted_clients"] == {name: int(name == "c-002")
                                         for name in launcher.client_ids}


class _Ended:
    """A child that has ended with ``code`` (negative: killed by that signal)."""

    def __init__(self, code: int) -> None:
        self.code = code

    def poll(self) -> int | None:
        return self.code

    def wait(self, timeout: float | None = None) -> int:
        return self.code

    def send_signal(self, sig: int) -> None:
        pass

    def kill(self) -> None:
        pass


def test_a_killed_client_is_restarted_until_killed_again_and_again(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A client process killed by a signal (the OOM killer, a user) is started again from its
    state; one killed every time is restarted MAX_CLIENT_RESTARTS times, then the launch stops
    and says which client and why, instead of running on to its --timeout waiting for it (a
    stranger's) or starting it over forever. One that exits with an error status (refused by
    the server, a damaged state) would fail again: it stays down and the run goes on."""
    from fedsim.runtime.deployed.launcher import MAX_CLIENT_RESTARTS

    launcher = Launcher(SCENARIO, tmp_path / "run")
    names = [*launcher.client_ids, "server"]
    victim, refused = launcher.client_ids[1], launcher.client_ids[2]

    def start(name: str) -> None:
        process = launcher.processes[name]
        process.starts += 1
        process.child = (_Ended(-signal.SIGKILL) if name == victim  # type: ignore[assignment]
                         else _Ended(1) if name == refused else _Slow())

    monkeypatch.setattr(launcher, "prepare", _no_processes_yet(launcher, tmp_path))
    monkeypatch.setattr(launcher, "start", start)
    with pytest.raises(TransportError) as raised:
        launcher.run_to_end(30.0)
    assert str(raised.value).startswith(
        f"the launch stopped when client {victim}'s process was killed {MAX_CLIENT_RESTARTS + 1} "
        f"times; the last time it was killed by SIGKILL (see ")
    assert str(raised.value).endswith(
        f"--resume {tmp_path / 'run'} --timeout SECONDS' goes on with it, once what stopped "
        f"it (its log) is mended")
    written = json.loads((tmp_path / "run" / "processes.json").read_text())
    assert written[victim]["starts"] == MAX_CLIENT_RESTARTS + 1
    assert written[victim]["exit_codes"] == [-signal.SIGKILL] * (MAX_CLIENT_RESTARTS + 1)
    assert written[refused]["starts"] == 1 and written[refused]["exit_codes"] == [1]
    # the summary counts the restarts, not the kill that stopped the launch
    warnings = json.loads((tmp_path / "run" / "summary.json").read_text())["warnings"]
    assert f"{victim}'s process was killed and restarted by the launch " \
           f"{MAX_CLIENT_RESTARTS} time(s) (logs/{victim}.log): its ledger holds every round " \
           f"it released, its report (released rounds, counters) only those of its " \
           f"processes that stopped cleanly" in warnings
    # the others were stopped (SIGTERM), each once
    assert all(written[n]["starts"] == 1 and written[n]["exit_codes"] == [0]
               for n in names if n not in (victim, refused))


def test_a_resumed_launch_restarts_a_client_whose_kills_were_in_an_earlier_part(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """MAX_CLIENT_RESTARTS bounds the restarts within one launch. A resumed launch carries
    the earlier parts' exit statuses (processes.json), and counted their kills too (an
    attacker's review): a client killed four times in the part that stopped for it had its
    first kill after ``--resume`` stop the launch at once, never restarted."""
    from fedsim.runtime.deployed.launcher import MAX_CLIENT_RESTARTS

    launcher = Launcher(SCENARIO, tmp_path / "run")
    victim = launcher.client_ids[1]
    earlier = [-signal.SIGKILL] * (MAX_CLIENT_RESTARTS + 1)  # the part that stopped for it

    def prepare() -> None:
        _no_processes_yet(launcher, tmp_path)()
        # a resumed launch's processes.json, read as prepare() reads it
        launcher._earlier = {
            victim: {"starts": len(earlier), "restarts": MAX_CLIENT_RESTARTS,
                     "exit_codes": list(earlier)},
            "server": {"starts": 1, "exit_codes": [-signal.SIGTERM]}}
        for name in launcher.processes:
            launcher._carry_earlier(name)

    def start(name: str) -> None:
        process = launcher.processes[name]
        process.starts += 1
        # the victim is killed once in this launch, then runs
        killed = name == victim and process.starts == len(earlier) + 1
        process.child = _Ended(-signal.SIGKILL) if killed else _Slow()  # type: ignore[assignment]

    monkeypatch.setattr(launcher, "prepare", prepare)
    monkeypatch.setattr(launcher, "start", start)
    with pytest.raises(TransportError) as raised:
        launcher.run_to_end(2.0)  # its timeout: the kill did not stop it
    assert str(raised.value).startswith("the server did not reach the stop condition within 2")
    written = json.loads((tmp_path / "run" / "processes.json").read_text())
    assert written[victim]["starts"] == len(earlier) + 2  # restarted once
    assert written[victim]["exit_codes"] == [*earlier, -signal.SIGKILL, 0]
    # A stranger: the resumed summary forgot the earlier part's restarts (processes.json alone
    # held their -9s), and with them that its counters miss the killed processes' rounds.
    assert written[victim]["restarts"] == MAX_CLIENT_RESTARTS + 1
    warnings = json.loads((tmp_path / "run" / "summary.json").read_text())["warnings"]
    assert f"{victim}'s process was killed and restarted by the launch " \
           f"{MAX_CLIENT_RESTARTS + 1} time(s) (logs/{victim}.log)" in warnings[0]


def test_a_timed_out_launch_stops_the_clients_before_the_server(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A stranger's launch past its --timeout SIGTERMed the server first, then the clients:
    each client waited its whole flush timeout (10 s) for receipts no server would send, left
    its last update charged to its privacy but unacknowledged (the partial summary's
    released_unacknowledged: 4 of 4 clients), and the resumed server refused those updates
    (before_start). Interrupted by a signal, the same launch stopped the clients first and
    lost nothing; at its timeout it now stops them in that order too."""
    launcher = Launcher(SCENARIO, tmp_path / "run")
    signalled: list[str] = []

    class _Named(_Slow):
        def __init__(self, name: str) -> None:
            super().__init__()
            self.name = name

        def send_signal(self, sig: int) -> None:
            signalled.append(self.name)
            super().send_signal(sig)

    def start_all() -> None:
        for name, process in launcher.processes.items():
            process.starts += 1
            process.child = _Named(name)  # type: ignore[assignment]

    monkeypatch.setattr(launcher, "prepare", _no_processes_yet(launcher, tmp_path))
    monkeypatch.setattr(launcher, "start_all", start_all)
    monkeypatch.setattr(launcher, "collect", lambda *args, **kwargs: {})
    with pytest.raises(TransportError):
        launcher.run_to_end(0.2)
    assert signalled[-1] == "server"
    assert set(signalled[:-1]) == set(launcher.client_ids)


def test_a_launch_whose_server_dies_writes_a_partial_summary_and_says_it_can_go_on(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A stranger's server process killed mid-launch (SIGKILL): the launcher said only "the
    server exited with status -9 (see .../server.log)", wrote no summary (`fedsim report`
    refused the directory) and did not say that `fedsim launch --resume` goes on with it,
    which it did, to the run's end. It now stops as a launch stopped early does: the clients
    first, a partial summary, and the way on."""
    launcher = Launcher(SCENARIO, tmp_path / "run")
    collected: list[tuple[object, ...]] = []

    def start_all() -> None:
        for name, process in launcher.processes.items():
            process.starts += 1
            process.child = (_Ended(-signal.SIGKILL) if name == "server"  # killed outright
                             else _Slow())  # type: ignore[assignment]

    def collect(*args: object, **kwargs: object) -> dict[str, object]:
        collected.append((*args, kwargs.get("cause")))
        return {}

    monkeypatch.setattr(launcher, "prepare", _no_processes_yet(launcher, tmp_path))
    monkeypatch.setattr(launcher, "start_all", start_all)
    monkeypatch.setattr(launcher, "collect", collect)
    with pytest.raises(TransportError) as raised:
        launcher.run_to_end(30.0)
    said = str(raised.value)
    assert said.startswith(f"the launch stopped when the server process was killed by SIGKILL "
                           f"(see {tmp_path / 'run' / 'logs'}); ")
    assert f"its partial summary is in {tmp_path / 'run' / 'summary.json'}" in said
    assert said.endswith(f"'fedsim launch --resume {tmp_path / 'run'} --timeout SECONDS' goes "
                         f"on with it, once what stopped it (its log) is mended")
    assert len(collected) == 1
    written = json.loads((tmp_path / "run" / "processes.json").read_text())
    assert written["server"]["exit_codes"] == [-signal.SIGKILL]
    assert all(written[n]["exit_codes"] == [0] for n in launcher.client_ids)


def test_a_launchs_summary_says_what_a_restart_and_a_resume_cost(tmp_path: Path) -> None:
    """A stranger: after a client killed and restarted, the summary said nothing of it (and its
    counts missed the killed process's rounds, which its ledger holds); after a resume, 8
    updates charged to their clients' privacy and refused before the server's first window
    (before_start) showed only as a count of rejections."""
    from fedsim.config import load_scenario
    from fedsim.runtime.actors.window_report import WindowReport
    from fedsim.runtime.deployed.collection import collect_outputs

    lines = [WindowReport(window, float(window), window).metrics_line(
        rejected=0, dropped_in_flight=0, active_clients=4, min_remaining_epsilon=None,
        refused=refused) for window, refused in enumerate(
            [{"before_start": 5, "norm": 1}, {"before_start": 3}, {}], 1)]
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(line) + "\n" for line in lines))
    summary = collect_outputs(load_scenario(SCENARIO), tmp_path, {}, wall_seconds=1.0,
                              restarted_clients={"c-001": 2, "c-002": 0})
    assert summary["warnings"] == [
        "c-001's process was killed and restarted by the launch 2 time(s) (logs/c-001.log): "
        "its ledger holds every round it released, its report (released rounds, counters) "
        "only those of its processes that stopped cleanly",
        "8 update(s) arrived before the server's first window and were refused "
        "(before_start): released and charged to their clients' privacy (their ledgers count "
        "them), never applied (a resumed launch's server refuses the earlier part's updates "
        "that reach it before its first window)"]


def test_a_launchs_summary_names_a_damaged_client_report(tmp_path: Path) -> None:
    """The collect read each client's exit report leniently: a damaged one (here cut short)
    gave ``{}`` and the summary lost that client's released rounds, counts and stop without a
    word. It is read as the client's own start reads it, and the summary's warnings name it."""
    from fedsim.config import load_scenario
    from fedsim.runtime.deployed.collection import collect_outputs

    states = {c: tmp_path / "state" / c for c in ("c-000", "c-001")}
    for client, state in states.items():
        state.mkdir(parents=True)
        (state / f"client-{client}.json").write_text('{"state": "done", "released": []}')
    (states["c-001"] / "client-c-001.json").write_text('{"state": "do')  # cut short
    (tmp_path / "run").mkdir()
    summary = collect_outputs(load_scenario(SCENARIO), tmp_path / "run", states,
                              wall_seconds=1.0)
    damaged = [w for w in summary["warnings"] if "exit report" in w]
    assert len(damaged) == 1 and damaged[0].startswith("c-001: its exit report was left out")
    assert "client-c-001.json" in damaged[0]
