"""A deployed run's directory, collected after its processes have ended: the server's files
as they are, each client's ledger copied from its state directory (never a shorter record over
a longer one), and ``clients.csv``, ``summary.json``, ``timing.json`` from the simulator's own
writer (:func:`~fedsim.runtime.run_outputs.write_run_outputs`)."""

from __future__ import annotations

import math
import signal
from collections.abc import Mapping
from pathlib import Path
from types import MappingProxyType
from typing import Any

from fedsim.config.loading import LoadedScenario
from fedsim.errors import ConfigError
from fedsim.json_input import parse_json
from fedsim.logging import get_logger
from fedsim.privacy.ledger_file import copy_ledger, read_ledger_bytes
from fedsim.runtime.actors.releases import Releases, RoundRecord
from fedsim.runtime.actors.stops import RunStop, RunStopKind, finished_stop_kind
from fedsim.runtime.assembly import open_ledger
from fedsim.runtime.deployed.differences import measured_differences
from fedsim.runtime.deployed.state_owner import (
    emulated_totals,
    read_client_report,
    report_count,
    stopped_for_good,
)
from fedsim.runtime.interrupted import interrupted_reason
from fedsim.runtime.population import Population, build_population
from fedsim.runtime.run_outputs import (
    LEDGER_DIR,
    METRICS_FILE,
    SERVER_FILE,
    STOPPED_STATES,
    ledger_file,
    read_json,
    read_run_file,
    write_run_outputs,
)
from fedsim.runtime.run_record import (
    ClientOutcome,
    RunRecord,
    StoppedClient,
    released_unacknowledged,
)
from fedsim.transports.mqtt_server import BEFORE_START

__all__ = ["collect_outputs", "exit_text"]

_log = get_logger("fedsim.runtime.deployed.collection")
MAX_REFUSAL_CHARS = 1000
"""The most of a client report's refusal text a summary's warning repeats."""


def _client_report(state_dir: Path, client_id: str, warnings: list[str]) -> dict[str, Any]:
    """``client_id``'s exit report in ``state_dir`` (``{}``: none), read as its starts read
    it (:func:`~fedsim.runtime.deployed.state_owner.read_client_report`); a damaged one is
    left out with a warning naming it, where it used to shrink the summary without a word
    (its rounds, counts and stop gone from it)."""
    try:
        return read_client_report(state_dir, client_id)
    except ConfigError as exc:
        warnings.append(f"{client_id}: its exit report was left out: {exc}")
        _log.warning("damaged client exit report left out of the summary", client=client_id,
                     error=str(exc))
        return {}


def collect_outputs(
    loaded: LoadedScenario,
    out_dir: str | Path,
    client_state_dirs: Mapping[str, Path],
    *,
    wall_seconds: float,
    cpu_seconds: float = math.nan,
    population: Population | None = None,
    interrupted: str | None = None,
    cause: str | None = None,
    parts: int = 1,
    failed_processes: Mapping[str, int] = MappingProxyType({}),
    restarted_clients: Mapping[str, int] = MappingProxyType({}),
) -> dict[str, Any]:
    """Gather a deployed run into ``out_dir`` the way ``fedsim run`` lays it out.

    ``wall_seconds`` and ``cpu_seconds`` (of all processes together) go to ``timing.json``;
    ``interrupted``: the signal that interrupted the launch (the summary says so, as an
    interrupted ``fedsim run``'s does; ``cause``: who sent it and why, when the launcher did:
    "the launch at its --timeout of 600 wall seconds"); ``parts``: how many launches ran it (more than one:
    interrupted and resumed, which the summary says); ``failed_processes``: the processes of
    the launch whose last exit status was not 0 (a client killed mid-run: its summary said only
    that it "could still train"), which the summary's warnings name; ``restarted_clients``:
    how many times the launch restarted each client whose process was killed (its report
    counts only its processes that stopped cleanly: the warnings say so).

    ``out_dir`` already holds the server's ``metrics.jsonl`` and ``server.json``; the clients'
    ledgers are copied from their state directories into ``ledgers/`` and ``clients.csv``,
    ``summary.json`` and ``timing.json`` are written by the simulator's own writer. Returns the
    summary.
    """
    out = Path(out_dir)
    population = population or build_population(loaded)
    server = read_json(out / SERVER_FILE)
    metrics = []
    if (out / METRICS_FILE).exists():
        metrics = [parse_json(t) for t in
                   read_run_file(out / METRICS_FILE).decode("utf-8").splitlines() if t]
    (out / LEDGER_DIR).mkdir(parents=True, exist_ok=True)
    statuses = server.get("statuses", {})
    stopped: list[StoppedClient] = []
    clients: list[ClientOutcome] = []
    links: list[object] = []  # each client report's emulated_network
    unacknowledged: dict[str, int | None] = {}  # each client report's count
    warnings = _process_warnings(metrics, failed_processes, restarted_clients)
    try:
        for plan in population.plans:
            client_id = plan.client_id
            state_dir = client_state_dirs.get(client_id)
            copied = ledger_file(out, client_id)
            if state_dir is not None and ledger_file(state_dir, client_id).exists():
                source = ledger_file(state_dir, client_id)
                if _extends(source, copied):
                    copy_ledger(source, copied)  # with its mark
                else:
                    # A collect of a resumed launch: never a shorter record over a longer one
                    # (an attacker's review: a lost state ledger's new one was copied over the
                    # run directory's 5 records, and the summary read eps 0).
                    warnings.append(
                        f"{client_id}: its state ledger ({source}) does not extend the run "
                        f"directory's copy ({copied}), which is kept: the state was lost, "
                        f"replaced or repaired since the last collect (`fedsim ledger check` "
                        f"both)")
                    _log.warning("state ledger does not extend the run directory's copy; "
                                 "kept the copy", client=client_id, state=str(source))
            report = _client_report(state_dir, client_id, warnings) if state_dir else {}
            links.append(report.get("emulated_network"))
            unacknowledged[client_id] = _unacknowledged(report)
            refused = report.get("refused")
            if isinstance(refused, str) and refused:  # (a file: its text bounded)
                warnings.append(f"{client_id} was refused by the server: "
                                f"{refused[:MAX_REFUSAL_CHARS]}")
            status = statuses.get(client_id, {})
            state = report.get("state") or status.get("state") or "waiting"
            reason = report.get("stop_reason") or status.get("detail", "")
            stopped_at = report.get("stopped_at", status.get("sent_at"))
            # (with no report, its last status: a "crashed" one is sent for good only)
            finished = stopped_for_good(report) if report.get("state") else \
                state in STOPPED_STATES
            if finished:
                stopped.append({"client_id": client_id, "time": stopped_at, "reason": reason,
                                "kind": finished_stop_kind(report, status, plan.group.rounds)})
            released = Releases.of(RoundRecord(**r) for r in report.get("released", []))
            clients.append(
                ClientOutcome(
                    plan, open_ledger(plan, copied), state, released, finished,
                    randomness=report.get("randomness", ""),
                    timing_overruns=report_count(report, "timing_overruns"),
                    split_delays=report_count(report, "split_delays"),
                    late_models=report_count(report, "late_models"),
                    crashes=report_count(report, "crashes"),
                )
            )
        stop_reason = RunStop.read(server)
        if interrupted:
            at = metrics[-1]["time"] if metrics else 0.0
            by = interrupted if cause is None else cause  # (its signal: the summary's own)
            stop_reason = RunStop(RunStopKind.SIGNAL,
                                  interrupted_reason(by, len(metrics), at, "scenario"))
        return write_run_outputs(
            RunRecord(
                scenario=loaded.scenario,
                out_dir=out,
                metrics=metrics,
                clients=clients,
                stopped=stopped,
                stop_reason=stop_reason,
                interrupted=interrupted,
                parts=parts,
                resumed_from_window=server.get("resumed_from_window") if parts > 1 else None,
                final_version=int(server.get("final_version", 0)),
                network={"mqtt_server": server.get("mqtt", {}),
                         "emulated_links": emulated_totals(links)},
                wall_seconds=wall_seconds,
                cpu_seconds=cpu_seconds,
                time_kind="scenario",
                final_evaluation=server.get("final_evaluation"),
                warnings=warnings,
                deployed_differences=measured_differences(
                    loaded.scenario, (c.split_delays for c in clients),
                    sum(c.releases.count for c in clients
                        if c.plan.group.interrupt == "switch"),
                    (c.late_models for c in clients)),
                released_unacknowledged=released_unacknowledged(unacknowledged),
            )
        )
    finally:
        for client in clients:
            client.ledger.close()


def _unacknowledged(report: Mapping[str, Any]) -> int | None:
    """How many released updates a client's report lists as never acknowledged (None: no
    report, or not a list there)."""
    listed = report.get("unacknowledged")
    return len(listed) if isinstance(listed, list) else None


def _extends(source: Path, copy: Path) -> bool:
    """Whether the ledger file ``source`` holds every complete line of ``copy`` (absent: yes)
    as its beginning: a ledger only grows, so a state ledger that does not is not the one the
    copy was taken from (lost, replaced by an older one, repaired)."""
    if not copy.exists():
        return True
    held = read_ledger_bytes(copy)  # (bounded: a copy handed over may be a sparse giant)
    held = held[:held.rfind(b"\n") + 1]
    with source.open("rb") as handle:
        return handle.read(len(held)) == held


def _process_warnings(metrics: list[Any], failed: Mapping[str, int],
                      restarted: Mapping[str, int]) -> list[str]:
    """The summary's warnings on the launch's processes: those that failed and were down at
    the end, clients the launch restarted, and updates refused before the first window."""
    warnings = [f"{name}'s process {exit_text(code)} and was not running at the end "
                f"(logs/{name}.log)" for name, code in failed.items()]
    # (a stranger: the summary said nothing of a restart, and a killed process's released
    # rounds, never reported, were missing from its counts)
    warnings += [
        f"{name}'s process was killed and restarted by the launch {count} time(s) (logs/"
        f"{name}.log): its ledger holds every round it released, its report (released "
        f"rounds, counters) only those of its processes that stopped cleanly"
        for name, count in restarted.items() if count]
    refused_early = sum(count for line in metrics if isinstance(line, dict)
                        and isinstance(kinds := line.get("rejections"), dict)
                        and isinstance(count := kinds.get(BEFORE_START, 0), int))
    if refused_early:  # (a stranger's resumed launch said nothing of them)
        warnings.append(
            f"{refused_early} update(s) arrived before the server's first window and were "
            f"refused ({BEFORE_START}): released and charged to their clients' privacy "
            f"(their ledgers count them), never applied (a resumed launch's server refuses "
            f"the earlier part's updates that reach it before its first window)")
    return warnings


def exit_text(code: int) -> str:
    """How a process ended, from its exit status (negative: the signal that killed it)."""
    if code < 0:
        try:
            return f"was killed by {signal.Signals(-code).name}"
        except ValueError:
            pass
    return f"exited with status {code}"
