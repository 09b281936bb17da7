"""Every process of a deployed run on this machine, and the run directory they leave.

:class:`Launcher` starts a server and all clients as local processes running the command lines
of :func:`~fedsim.runtime.deployed.process_commands.process_commands` (what ``docker-compose.yml`` runs in containers), waits for the stop
condition and collects (:func:`~fedsim.runtime.deployed.collection.collect_outputs`) the same
run directory as ``fedsim run``. One launcher runs in a directory at a time
(:data:`LAUNCH_LOCK_FILE`); an interrupted one goes on with ``resume=True``
(:mod:`fedsim.runtime.deployed.resume`).
"""

from __future__ import annotations

import math
import os
import resource
import signal
import subprocess
import sys
import time as wallclock
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from fedsim.atomic import locked_or_closed, open_log, open_no_link
from fedsim.config.factories import SEARCH_ENV
from fedsim.config.loading import dump_scenario, load_scenario
from fedsim.data.load import dataset_file, scenario_data
from fedsim.errors import ConfigError, FedsimError, TransportError
from fedsim.json_input import parse_json
from fedsim.logging import get_logger
from fedsim.runtime.deployed.collection import collect_outputs, exit_text
from fedsim.runtime.deployed.deployment import SECRETS_ENV, run_name
from fedsim.runtime.deployed.forked_child import ForkedChild
from fedsim.runtime.deployed.guarantees import require_public_slots
from fedsim.runtime.deployed.options import (
    FLUSH_TIMEOUT,
    LAUNCH_WAIT_FOR_CLIENTS,
    DeploymentOptions,
)
from fedsim.runtime.deployed.process_commands import earlier_commands, process_commands
from fedsim.runtime.deployed.resume import (
    LAUNCH_FILE,
    check_state_ledgers,
    scenario_sha256,
)
from fedsim.runtime.interrupted import (
    interrupting_signal,
    signals_ignored,
)
from fedsim.runtime.population import client_ids
from fedsim.runtime.rng import SeedTree
from fedsim.runtime.run_outputs import (
    METRICS_FILE,
    PROCESSES_FILE,
    SCENARIO_FILE,
    SERVER_FILE,
    TIMING_FILE,
    check_unused,
    read_json,
    read_json_if_present,
    write_json,
)
from fedsim.transports.broker import LocalMosquitto
from fedsim.transports.child_process import bound_argv, bound_env
from fedsim.transports.mqtt_settings import parse_broker_url
from fedsim.transports.security import load_secrets
from fedsim.transports.topics import aggregator_ids

__all__ = ["LAUNCH_LOCK_FILE", "Launcher"]

_log = get_logger("fedsim.runtime.deployed.launcher")
LAUNCH_LOCK_FILE = "launch.lock"
"""Held (``flock``) by the one launcher running in a directory."""
MAX_CLIENT_RESTARTS = 3
"""Restarts of one client's killed process within a launch; its next kill stops the launch
(a process killed again and again - by the OOM killer - would otherwise start over forever)."""
RESUME_WAIT_FOR_CLIENTS = 30.0
"""The longest a resumed launch's server waits for its restarted clients (seconds)."""


# ---------------------------------------------------------------------------------------------
# Launching everything as local processes


def _children_cpu_seconds() -> float:
    """CPU seconds (user + system) of this process's ended and waited-for children."""
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


@dataclass
class _Process:
    name: str
    argv: list[str]  # after "fedsim"
    log: Path
    child: subprocess.Popen[bytes] | ForkedChild | None = None
    starts: int = 0
    restarts: int = 0
    """This launch's restarts of it (a client killed, an aggregator failed):
    :data:`MAX_CLIENT_RESTARTS` bounds a client's."""
    earlier_restarts: int = 0
    """A resumed launch's earlier parts' restarts of it (their ``processes.json``)."""

    @property
    def all_restarts(self) -> int:
        """Its restarts over the whole run, every part's (the summary's warning names a
        client's)."""
        return self.earlier_restarts + self.restarts

    @property
    def running(self) -> bool:
        return self.child is not None and self.child.poll() is None


class Launcher:
    """The server, every client and the scenario's aggregation nodes (``aggregators.count``)
    as local processes (``fedsim launch``); an aggregator whose process fails, or a client's
    killed, while the run goes on is restarted (:meth:`supervise_aggregators`,
    :meth:`supervise_clients`).

    Each process runs ``fedsim server ...`` / ``fedsim client ...`` (the commands are in
    ``processes.json``, the same ones ``docker-compose.yml`` runs) with ``options`` (the run is
    named after the scenario; without ``options.broker`` a private mosquitto is started; the
    processes write JSON log lines to their log files). ``fork=True`` (default)
    forks them from this already-initialised process instead of starting fresh interpreters,
    which saves the import of torch per process; ``fork=False`` execs ``python -m fedsim``.

    Clients start first; the server waits (``--wait-for-clients``) until every client has said
    it is connected, so the first window does not pass while processes are still starting.

    Layout under ``out``: the run directory files, ``state/server/``, ``state/<client id>/``,
    ``logs/<name>.log`` (appended across restarts), ``broker/`` (a private mosquitto's files,
    if no broker URL is given) and ``processes.json``. Individual processes can be killed and
    restarted (:meth:`kill`, :meth:`start`) to test crash recovery.
    """

    def __init__(
        self,
        scenario_file: str | Path,
        out: str | Path,
        *,
        options: DeploymentOptions = DeploymentOptions(wait_for_clients=LAUNCH_WAIT_FOR_CLIENTS),
        overrides: Sequence[str] = (),
        fork: bool = True,
        resume: bool = False,
    ) -> None:
        """``resume``: go on with the launched run in ``out`` that was interrupted (its
        ``scenario_file`` must be ``out``'s resolved scenario, :func:`resumable_scenario`):
        its processes start again from their state directories - the server from its
        checkpoint, each client from its ledger - and the run directory is written again at
        the end."""
        if options.run is not None:
            raise ConfigError("fedsim launch names the run after the scenario; --run is not used")
        self.out = Path(out)
        self.resume = resume
        if resume:
            if overrides:
                raise ConfigError("a resumed launch runs its directory's resolved scenario as "
                                  "it was; --set and --aggregators do not apply")
            self._earlier = read_json_if_present(self.out / PROCESSES_FILE)
        else:
            if (self.out / PROCESSES_FILE).exists() or (self.out / "state").exists():
                # (an attacker's review: a launcher killed before its first collect left state
                # but no ledgers, and a new launch's server resumed that state)
                if read_json(self.out / SERVER_FILE).get("finished") is True:
                    raise ConfigError(f"{self.out} holds a launch that ended; choose a new "
                                      f"--out")
                raise ConfigError(f"{self.out} holds a launch's state; go on with it (fedsim "
                                  f"launch --resume {self.out}) or choose a new --out")
            check_unused(self.out, "--out")
            self._earlier = {}
        self.loaded = load_scenario(scenario_file, overrides,
                                    allow_factories=options.allow_factories)
        self.scenario = self.loaded.scenario
        require_public_slots(self.scenario)
        self.run = run_name(self.scenario, None)
        self.client_ids = client_ids(self.scenario)
        self.aggregator_ids = aggregator_ids(self.scenario.aggregators.count)
        if options.broker is not None:
            self._require_credentials(options)
        # Resumed: every client restarts with the server, which waits for them as at a start,
        # but not for long: a client the server refuses (its state lost) never says it is
        # connected, and the wait would hold the whole run (a wait of none lost 1-6 windows).
        self.options = replace(
            options, run=self.run, json_logs=True, wait_on_resume=resume,
            wait_for_clients=(min(options.wait_for_clients, RESUME_WAIT_FOR_CLIENTS) if resume
                              else options.wait_for_clients))
        self.fork = fork
        self.local_broker: LocalMosquitto | None = None
        self.processes: dict[str, _Process] = {}
        self.exit_codes: dict[str, list[int]] = {}
        self.earlier_commands: dict[str, list[list[str]]] = {}
        """Per process, the command lines of a resumed launch's earlier parts that differ from
        this part's (oldest first; none: every part ran this one)."""
        # The processes read the resolved scenario from the run directory: a factory module
        # beside the user's scenario (or in the launcher's working directory) is searched there.
        searched = [str(self.loaded.base_dir.resolve()), str(Path.cwd().resolve()),
                    *filter(None, os.environ.get(SEARCH_ENV, "").split(os.pathsep))]
        self.child_env = {SEARCH_ENV: os.pathsep.join(dict.fromkeys(searched))}
        self._started = wallclock.perf_counter()
        self._children_cpu_at_start = _children_cpu_seconds()
        self._lock_fd: int | None = None
        if resume:
            check_state_ledgers(self.loaded, self.state_dir)

    def _require_credentials(self, options: DeploymentOptions) -> None:
        """With a broker of one's own, the secrets file must hold every process's credentials
        for this run, checked before anything starts: one that did not (a per-process file,
        another run's) had every client exit at once, naming it in its log, while the launcher
        waited out its --timeout (a stranger's)."""
        secrets_file = options.secrets_file or os.environ.get(SECRETS_ENV)
        if not secrets_file or parse_broker_url(str(options.broker)).username is not None:
            return  # the URL's user:password, or an anonymous connection: the broker decides
        secrets = load_secrets(secrets_file)
        if secrets.run != self.run:
            raise ConfigError(f"secrets file {secrets_file} is for run {secrets.run!r}, not "
                              f"{self.run!r} (fedsim launch names the run after the scenario)")
        secrets.for_server()
        for client in self.client_ids:
            secrets.for_client(client)
        for aggregator in self.aggregator_ids:
            secrets.for_aggregator(aggregator)

    # -- setup -------------------------------------------------------------------------------
    def state_dir(self, name: str) -> Path:
        return self.out / "state" / name

    def prepare(self) -> None:
        """Take the directory's launch lock, write the resolved scenario (and its fingerprint,
        for a resume) and the processes' commands, start a private broker if none was given."""
        self.out.mkdir(parents=True, exist_ok=True)
        self._take_launch_lock()
        (self.out / "logs").mkdir(exist_ok=True)
        # Found (or fetched) once here: the processes read the same file, none downloads.
        dataset = self.scenario.dataset
        dataset_path = dataset_file(dataset.name, dataset.path, base_dir=self.loaded.base_dir)
        if dataset.factory is not None:
            # Every process calls the user's data factory: one that fails here (a relative
            # path from another working directory, a typo) fails before the broker and the
            # processes start, with its own error (a stranger's failed after all had started).
            scenario_data(dataset, base_dir=self.loaded.base_dir,
                          seed=SeedTree(self.scenario.seed).integer("dataset"))
        self.scenario_file = (self.out / SCENARIO_FILE).resolve()
        if not self.resume:  # (resumed, it is the file this scenario was read from)
            self.scenario_file.write_text(
                dump_scenario(self.scenario, dataset_path=dataset_path), encoding="utf-8"
            )
            write_json(self.out / LAUNCH_FILE,
                       {"scenario_sha256": scenario_sha256(self.scenario_file)})
        if self.options.broker is None:
            self.local_broker = LocalMosquitto(self.out / "broker", self.run, self.client_ids,
                                               aggregators=self.aggregator_ids)
            self.local_broker.start(own_group=True)
            url = self.local_broker.url()
            self.options = replace(
                self.options, broker=url, secrets_file=str(self.local_broker.files.secrets_file)
            )
            _log.info("private broker started", url=url, pid=self.local_broker.pid)
        commands = process_commands(
            self.scenario_file,
            self.client_ids,
            options=self.options.with_absolute_paths(),
            state_root=(self.out / "state").resolve(),
            out=self.out.resolve(),
            aggregators=self.aggregator_ids,
        )
        for name, argv in commands.items():
            self.processes[name] = _Process(name, argv[1:], self.out / "logs" / f"{name}.log")
            os.close(open_log(self.processes[name].log))  # a link refused before any start
            self._carry_earlier(name)
        # Written now, not only at the collect: a launcher killed outright (SIGKILL, a closed
        # terminal) leaves a directory --resume recognises.
        self._write_processes()

    def _carry_earlier(self, name: str) -> None:
        """Take over what a resumed launch's earlier parts recorded of process ``name`` (their
        ``processes.json``): its starts, restarts, exit statuses and other command lines."""
        earlier = self._earlier.get(name)
        if not isinstance(earlier, dict):
            return
        process = self.processes[name]
        starts, codes = earlier.get("starts"), earlier.get("exit_codes")
        process.starts = starts if type(starts) is int and starts > 0 else 0
        # (a stranger: a resumed launch's summary forgot a client restarted in an earlier part)
        restarts = earlier.get("restarts")
        process.earlier_restarts = restarts if type(restarts) is int and restarts > 0 else 0
        if isinstance(codes, list) and all(type(c) is int for c in codes):
            self.exit_codes[name] = list(codes)
        self.earlier_commands[name] = earlier_commands(earlier, ["fedsim", *process.argv])

    # -- processes ---------------------------------------------------------------------------
    def start(self, name: str) -> None:
        """Start (or restart) one process, in a process group of its own: a terminal's Ctrl-C
        (SIGINT to its foreground group) reaches the launcher alone, which then stops the
        processes in the order that loses nothing (:meth:`stop_all`)."""
        process = self.processes[name]
        if process.running:
            raise FedsimError(f"process {name} is already running")
        if self.fork:
            process.child = ForkedChild(process.argv, process.log, self.child_env, name)
        else:
            with open(open_log(process.log), "ab") as log:
                process.child = subprocess.Popen(
                    bound_argv([sys.executable, "-m", "fedsim", *process.argv]),
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    stdin=subprocess.DEVNULL,
                    env=bound_env({**os.environ, **self.child_env}),
                    process_group=0,
                )
        process.starts += 1

    def start_all(self) -> None:
        for name in self.processes:  # clients first, then the aggregators, the server last
            self.start(name)
        # Their starts recorded now: a launcher killed outright left the starts of prepare's
        # record, 0, and its resumed run's summary said nothing of its first part (a stranger).
        self._write_processes()

    def supervise_aggregators(self) -> list[str]:
        """Restart every aggregator that has failed (a crash: a non-zero status) while the run
        goes on; the names restarted. One that exited 0 saw the end of the run. An aggregator
        keeps nothing on disk: a fresh one rejoins at once."""
        restarted = []
        for name, code in self._failed(self.aggregator_ids):
            _log.warning("aggregator failed; restarting it", aggregator=name, code=code)
            self.start(name)
            self.processes[name].restarts += 1
            restarted.append(name)
        return restarted

    def supervise_clients(self) -> list[str]:
        """Restart every client whose process was killed (by a signal: SIGKILL from the OOM
        killer or a user, a segfault) while the run goes on, from its state directory, as
        ``--resume`` restarts it (its ledger and its outbox: epsilon never resets, nothing it
        sent is lost); the names restarted. A client left down said nothing to the server,
        which then waited for it to the end: a run stopping on spent budgets never stopped (a
        stranger's). One that exited with an error status (refused by the server, a state it
        cannot open) would fail the same way again: it stays down, said at once (and in the
        summary); one that exited 0 stopped by itself. Raises :class:`FedsimError` when a
        client is killed past :data:`MAX_CLIENT_RESTARTS` restarts."""
        restarted = []
        for name, code in self._failed(self.client_ids):
            if code > 0:
                _log.warning("client process exited with an error; it stays down", client=name,
                             code=code, log=str(self.out / "logs" / f"{name}.log"))
                continue
            # This launch's kills only: a resumed launch's exit statuses include the earlier
            # parts' (an attacker's review: a client killed four times in the part that
            # stopped for it had its first kill after --resume stop the launch, unrestarted)
            killed = self.processes[name].restarts + 1
            if killed > MAX_CLIENT_RESTARTS:
                raise FedsimError(
                    f"client {name}'s process was killed {killed} times; the last time it "
                    f"{exit_text(code)} (see {self.out / 'logs' / f'{name}.log'})")
            _log.warning("client process killed; restarting it from its state", client=name,
                         code=code, killed=killed)
            self.start(name)
            self.processes[name].restarts = killed  # (the kill that stops the launch: none)
            restarted.append(name)
        return restarted

    def _failed(self, names: Sequence[str]) -> list[tuple[str, int]]:
        """Those of ``names`` whose process has ended since the last look with a non-zero
        status, with it (every ended one's status is recorded)."""
        failed = []
        for name in names:
            process = self.processes[name]
            if process.child is None or process.running:
                continue
            code = self._ended(process, process.child.wait(timeout=0))
            if code != 0:
                failed.append((name, code))
        return failed

    def _ended(self, process: _Process, code: int) -> int:
        self.exit_codes.setdefault(process.name, []).append(code)
        process.child = None
        return code

    def kill(self, name: str, sig: int = signal.SIGKILL, timeout: float = 60.0) -> int:
        """Signal one process by its PID and wait for it; returns its exit status."""
        process = self.processes[name]
        if process.child is None:
            raise FedsimError(f"process {name} is not running")
        process.child.send_signal(sig)
        return self._ended(process, process.child.wait(timeout=timeout))

    def wait(self, name: str, timeout: float) -> int | None:
        """Wait for a process to exit on its own; None if it still runs after ``timeout``."""
        process = self.processes[name]
        if process.child is None:
            raise FedsimError(f"process {name} is not running")
        try:
            return self._ended(process, process.child.wait(timeout=timeout))
        except subprocess.TimeoutExpired:
            return None

    def stop_all(self, grace: float = 5.0) -> None:
        """Stop every running process, in the order that loses nothing: the clients first
        (SIGTERM: each waits up to its flush timeout for the server's receipts of what it sent,
        which needs the server and the broker still there), then the aggregation nodes, then
        the server; a process still running ``grace`` seconds past its own wait is killed
        (SIGKILL). A process that already ended by itself has its exit status recorded too."""
        clients = set(self.client_ids)
        aggregators = set(self.aggregator_ids)
        for names, wait in ((clients, FLUSH_TIMEOUT + grace), (aggregators, grace),
                            (set(self.processes) - clients - aggregators, grace)):
            # Every process not yet reaped, running or not: one that ends by itself between a
            # look at it and its signal (a client that saw the run's end) is still reaped and
            # its exit status recorded (a filter on "running" lost it, a flaky test's [-9]).
            self._stop([p for name, p in self.processes.items()
                        if name in names and p.child is not None], wait)

    def _stop(self, unreaped: list[_Process], wait: float) -> None:
        """SIGTERM those of ``unreaped`` still running together, wait up to ``wait`` seconds
        for all of them, then SIGKILL; every exit status is recorded."""
        for process in unreaped:
            assert process.child is not None
            process.child.send_signal(signal.SIGTERM)  # (a no-op for one that has ended)
        deadline = wallclock.monotonic() + wait
        for process in unreaped:
            assert process.child is not None
            try:
                code = process.child.wait(timeout=max(0.1, deadline - wallclock.monotonic()))
            except subprocess.TimeoutExpired:
                _log.warning("process did not stop on SIGTERM; killed", process=process.name,
                             waited=wait)
                process.child.kill()
                code = process.child.wait(timeout=60.0)
            self._ended(process, code)

    # -- the whole run -----------------------------------------------------------------------
    def collect(self, interrupted: str | None = None, *,
                cause: str | None = None) -> dict[str, Any]:
        """Write the run directory (after the processes have ended); ``interrupted``: the
        signal that interrupted the run (``cause``: who sent it and why, when the launcher
        did: "the launch at its --timeout of 600 wall seconds")."""
        earlier = read_json(self.out / TIMING_FILE) if self.resume else {}

        def before(key: str) -> float:  # a resumed launch's seconds include the first part's
            value = earlier.get(key)
            if isinstance(value, bool) or not isinstance(value, int | float):
                return 0.0
            return float(value) if math.isfinite(value) and value >= 0 else 0.0

        summary = collect_outputs(
            self.loaded,
            self.out,
            {c: self.state_dir(c) for c in self.client_ids},
            wall_seconds=before("wall_seconds") + wallclock.perf_counter() - self._started,
            cpu_seconds=(before("cpu_seconds") + _children_cpu_seconds()
                         - self._children_cpu_at_start),
            interrupted=interrupted,
            cause=cause,
            parts=max(1, self.processes["server"].starts),
            restarted_clients={name: self.processes[name].all_restarts
                               for name in self.client_ids if name in self.processes},
            failed_processes={name: codes[-1] for name, codes in self.exit_codes.items()
                              if codes and codes[-1] != 0 and name in self.processes
                              and self.processes[name].child is None},
        )
        self._write_processes()
        return summary

    def _write_processes(self) -> None:
        write_json(
            self.out / PROCESSES_FILE,
            {
                name: {
                    "command": ["fedsim", *p.argv],
                    "starts": p.starts,
                    "restarts": p.all_restarts,
                    "exit_codes": self.exit_codes.get(name, []),
                    **({"earlier_commands": self.earlier_commands[name]}
                       if self.earlier_commands.get(name) else {}),
                }
                for name, p in self.processes.items()
            },
        )

    def _take_launch_lock(self) -> None:
        """One launcher a directory (an attacker's review: a second ``--resume`` rewrote the
        broker's secrets under a running one before its processes' locks refused it)."""
        if self._lock_fd is not None:
            return
        fd = open_no_link(self.out / LAUNCH_LOCK_FILE, os.O_RDWR | os.O_CREAT, 0o600)
        if not locked_or_closed(fd):
            raise ConfigError(f"another fedsim launch is running in {self.out}")
        self._lock_fd = fd

    def close(self) -> None:
        """Stop every process (:meth:`stop_all`), then the private broker (idempotent). A
        further Ctrl-C or SIGTERM meanwhile is ignored: the processes are in groups of their
        own, and a stop cut short would leave them running."""
        with signals_ignored():
            self.stop_all()
            if any(p.starts for p in self.processes.values()):
                # their exit statuses on disk, also where no collect follows (a timeout)
                self._write_processes()
            if self.local_broker is not None:
                self.local_broker.kill(signal.SIGTERM)
            if self._lock_fd is not None:
                os.close(self._lock_fd)
                self._lock_fd = None

    def run_to_end(
        self,
        timeout: float,
        *,
        on_window: Callable[[dict[str, Any]], None] | None = None,
    ) -> dict[str, Any]:
        """Start everything, wait for the server to stop (or ``timeout`` wall seconds), stop
        the clients, collect the run directory and return its summary. ``on_window`` gets each
        new ``metrics.jsonl`` line while the run goes on (a progress display).

        Interrupted (Ctrl-C, or SIGTERM under :func:`~fedsim.runtime.interrupted.signals_interrupt`)
        once the processes have started, it stops them, still writes the run directory of what
        they did (a partial summary that says so, as an interrupted ``fedsim run``'s does) and
        raises :class:`KeyboardInterrupt` again. Stopped early by the launcher itself - at
        ``timeout``, when the server process fails, or when a client is killed past
        :data:`MAX_CLIENT_RESTARTS` restarts - it stops the processes the same way, writes a
        partial summary whose stop reason says why, and raises :class:`TransportError` naming
        the way on (``fedsim launch --resume``)."""
        interrupted: str | None = None
        stopped_early: str | None = None  # why the launcher stopped the run itself
        try:
            self.prepare()
            self.start_all()
            # Resumed: the earlier parts' windows were shown when they ran (a stranger's
            # resumed launch logged them again, stamped now)
            follower = _LineFollower(self.out / METRICS_FILE, from_end=self.resume)
            try:
                code = self._watch(timeout, follower, on_window)
                if code is None:
                    stopped_early = f"at its --timeout of {timeout:g} wall seconds"
            except FedsimError as exc:  # a client killed again and again
                code, stopped_early = None, f"when {exc}"
            if code is not None and code != 0:
                # Its checkpoint and the clients' ledgers go on: stopped early, as at a
                # timeout (a stranger's server killed outright left no summary, and nothing
                # said that --resume went on with the run, which it did)
                stopped_early = f"when the server process {exit_text(code)}"
            # Ended or stopped early, in the order that loses nothing (the clients first), as
            # an interrupted launch (a stranger's timed-out launch stopped the server first, and
            # every client then waited its flush timeout for receipts of its last update,
            # charged to its privacy, that no server sent: a resume refused them)
            self.stop_all()
        except KeyboardInterrupt:
            if not any(p.starts for p in self.processes.values()):
                raise  # nothing ran: there is no run directory to write
            interrupted = interrupting_signal()
        finally:
            self.close()
        if stopped_early is not None:
            raise TransportError(self._stopped_early(stopped_early, timeout))
        summary = self.collect(interrupted)
        if interrupted:
            raise KeyboardInterrupt
        return summary

    def _watch(self, timeout: float, follower: _LineFollower,
               on_window: Callable[[dict[str, Any]], None] | None) -> int | None:
        """Wait up to ``timeout`` wall seconds for the server's exit status (None: it still
        runs), restarting failed aggregators and handing ``on_window`` each new window."""
        deadline = wallclock.monotonic() + timeout
        code = None
        while code is None and wallclock.monotonic() < deadline:
            code = self.wait("server", min(0.5, max(0.0, deadline - wallclock.monotonic())))
            if code is None:
                self.supervise_aggregators()
                self.supervise_clients()
            for line in follower.new_lines():
                if on_window is not None:
                    on_window(line)
        return code

    def _stopped_early(self, when: str, timeout: float) -> str:
        """Write the run directory of a launch the launcher stopped ``when`` (at its timeout,
        or when a client kept failing): a partial summary, as an interrupted one's (a
        stranger's timed-out launch left none until it was resumed); return what to tell: its
        state is kept, and the run can go on."""
        written = ""
        try:
            self.collect("SIGTERM", cause=f"the launch {when}")
            written = f"; its partial summary is in {self.out / 'summary.json'}"
        except (FedsimError, OSError, ValueError) as exc:  # what there is stays on disk
            _log.warning("could not write the stopped launch's summary", error=str(exc))
        timed_out = when.startswith("at its --timeout")
        what = (f"the server did not reach the stop condition within {timeout:g} wall seconds"
                if timed_out else f"the launch stopped {when}")
        # (an owner's review: a server that fails at once - a setting it refuses - fails the
        # same way on --resume until that is mended)
        mended = "" if timed_out else ", once what stopped it (its log) is mended"
        return (f"{what} (see {self.out / 'logs'}){written}; its processes were stopped: "
                f"'fedsim launch --resume {self.out} --timeout SECONDS' goes on with it{mended}")


class _LineFollower:
    """New complete lines of a JSON-lines file another process appends to (``from_end``:
    those after its complete lines now, else all of them)."""

    def __init__(self, path: Path, *, from_end: bool = False) -> None:
        self.path = path
        self._offset = 0
        if from_end:
            self.new_lines()  # (read past, not returned)

    def new_lines(self) -> list[dict[str, Any]]:
        try:
            with open(self.path, "rb") as handle:
                if os.fstat(handle.fileno()).st_size < self._offset:
                    self._offset = 0  # rewritten (a restarted server trimmed it)
                handle.seek(self._offset)
                data = handle.read()
        except FileNotFoundError:
            return []
        complete = data[: data.rfind(b"\n") + 1]
        self._offset += len(complete)
        return [parse_json(text) for text in complete.decode().splitlines() if text.strip()]
