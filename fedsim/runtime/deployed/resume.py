"""Going on with an interrupted ``fedsim launch`` (``--resume DIR``): which directory may be
resumed, with which scenario, and whether its clients' ledgers will open.

A launch records its resolved scenario's SHA-256 (:data:`LAUNCH_FILE`): a resume runs that
file as it was, since the ledgers were written under it (an attacker's review: an edited sigma
and partition resumed silently). Its clients' ledgers are opened once before anything starts,
so a ledger its client would refuse stops the resume with the reason instead of leaving the
server to run on without that client.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from pathlib import Path

from fedsim.config.loading import LoadedScenario
from fedsim.errors import ConfigError, FedsimError, LedgerInUse
from fedsim.runtime.assembly import open_ledger
from fedsim.runtime.deployed.state_owner import followed_runs, read_client_report
from fedsim.runtime.population import build_population
from fedsim.runtime.run_outputs import (
    METRICS_FILE,
    PROCESSES_FILE,
    SCENARIO_FILE,
    SERVER_FILE,
    ledger_file,
    read_json_if_present,
    read_run_file,
)

__all__ = ["LAUNCH_FILE", "check_state_ledgers", "resumable_scenario", "scenario_sha256"]

LAUNCH_FILE = "launch.json"
"""A launch's own record beside ``processes.json``: its resolved scenario's SHA-256, which a
resume checks."""

HELD_ADVICE = ("a process of the earlier launch may still be stopping (a client waits up to its "
               "flush timeout for the server's receipts; ps lists it as 'fedsim client ID'): "
               "wait for it and run the same command again")
"""What a resume refused for a ledger another process holds adds: a launcher killed outright
leaves its clients stopping for a few seconds, their ledgers locked."""


def scenario_sha256(path: Path) -> str:
    """The fingerprint of a launch's resolved scenario file (a regular file: a FIFO is named,
    not waited on)."""
    try:
        return hashlib.sha256(read_run_file(path)).hexdigest()
    except OSError as exc:
        raise ConfigError(f"{path}: cannot be read ({exc.strerror})") from None


def resumable_scenario(out: str | Path) -> Path:
    """The resolved scenario of the interrupted launch in ``out`` (``fedsim launch --resume``),
    or a :class:`ConfigError` saying why it cannot be resumed: not a launch's directory, or a
    run that ended."""
    out = Path(out)
    scenario = out / SCENARIO_FILE
    missing = [str(p) for p in (scenario, out / PROCESSES_FILE, out / "state" / "server")
               if not p.exists()]
    if missing:
        # (a stranger resumed a `fedsim run` directory and was told only what was missing)
        simulation = (out / METRICS_FILE).exists() and not (out / PROCESSES_FILE).exists()
        raise ConfigError(f"{out} is not the directory of a fedsim launch (no "
                          f"{', '.join(missing)}): nothing to resume"
                          + ("; it looks like a simulation's (fedsim run), which cannot be "
                             "resumed: run the scenario again, to a new --out"
                             if simulation else ""))
    # Damage is said, not taken for "not finished" (a FIFO hung here, deep nesting raised
    # RecursionError: an attacker's review).
    server = read_json_if_present(out / SERVER_FILE)
    if server.get("finished") is True:
        raise ConfigError(f"{out}: its run ended ({SERVER_FILE} says finished); nothing to "
                          f"resume")
    launched = read_json_if_present(out / LAUNCH_FILE).get("scenario_sha256")
    if launched is None:
        raise ConfigError(f"{out}: no {LAUNCH_FILE} (a launch made before fedsim could resume "
                          f"one, or damaged), so nothing shows which scenario it ran")
    if launched != scenario_sha256(scenario):
        # (an attacker's review: an edited sigma and partition resumed with rc 0, under
        # ledgers written for the first ones)
        raise ConfigError(f"{scenario} is not the scenario this launch started with (its "
                          f"sha256 is not the one in {out / LAUNCH_FILE}): a resumed run runs "
                          f"the scenario its ledgers were written under")
    return scenario


def check_state_ledgers(loaded: LoadedScenario, state_dir: Callable[[str], Path]) -> None:
    """Open (and close) every client's ledger in its state directory (``state_dir(client
    id)``), and read its exit report and ``followed.json``, as the client will; a
    :class:`ConfigError` naming each one that does not open or read (damaged, another posture's, still held by a process of the earlier launch that has not
    stopped yet: an attacker's review saw a run whose every client failed at start run to its
    end empty, after which it could not be resumed again)."""
    problems = []
    held = False  # a ledger another process holds: one of the earlier launch, still stopping?
    for plan in build_population(loaded).plans:
        state = state_dir(plan.client_id)
        try:  # what its start reads before its ledger: damage stops it there, so say it now
            followed_runs(state, read_client_report(state, plan.client_id))
        except ConfigError as exc:
            problems.append(f"{plan.client_id}: {exc}")
        path = ledger_file(state, plan.client_id)
        if not path.exists():
            continue  # a client that never spent: it starts afresh
        try:
            open_ledger(plan, path).close()
        except LedgerInUse as exc:
            held = True
            problems.append(f"{plan.client_id}: {exc}")
        except FedsimError as exc:
            problems.append(f"{plan.client_id}: {exc}")
    if problems:
        # (a stranger's resume just after a launcher killed outright said "open elsewhere"
        # alone, while its clients were still flushing to a server that was gone)
        raise ConfigError("cannot resume: " + "; ".join(problems[:8])
                          + (" ..." if len(problems) > 8 else "")
                          + (f"; {HELD_ADVICE}" if held else ""))
