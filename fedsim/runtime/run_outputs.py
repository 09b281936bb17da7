"""The run directory both runtimes write: its file names, its JSON, and its one writer.

A finished run, virtual-time (:mod:`fedsim.runtime.simulated.simulation`) or deployed
(:mod:`fedsim.runtime.deployed.launcher`), is described by a :class:`RunRecord`;
:func:`write_run_outputs` turns it into ``clients.csv``, ``summary.json`` and ``timing.json``,
so both modes write identical formats. :mod:`fedsim.reporting.rundir` reads the directory
with the names defined here.

Layout::

    scenario.resolved.yaml  metrics.jsonl  clients.csv  summary.json  ledgers/<id>.jsonl
    timing.json (wall-clock seconds; the only file that differs between identical runs)
    deployed runs also: server.json  applied.jsonl  processes.json

JSON: every file is strict JSON; a non-finite float (a NaN loss, an infinite epsilon) is
written as ``null`` (:func:`clean_json`).
"""

from __future__ import annotations

import csv
import functools
import json
import math
import os
import tempfile
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypedDict

import numpy as np

from fedsim.atomic import TooLarge, open_no_link, read_regular, write_atomically
from fedsim.clock import seconds_text
from fedsim.config.limits import MAX_RUN_FILE_BYTES
from fedsim.config.schema import Scenario
from fedsim.errors import ConfigError
from fedsim.json_input import json_problem, parse_json
from fedsim.privacy.accountant import make_accountant, smallest_epsilon
from fedsim.privacy.clt_error import clt_band
from fedsim.privacy.epsilon_text import epsilon_alike, epsilon_range
from fedsim.privacy.events import GaussianStep, by_relation, group_steps
from fedsim.privacy.gdp import clt_mu
from fedsim.privacy.ledger import PrivacyLedger
from fedsim.runtime.actors.exposure import privacy_caveats
from fedsim.runtime.actors.releases import Releases
from fedsim.runtime.actors.stops import ClientStopKind, RunStop, client_stop_phrase, stop_fields

if TYPE_CHECKING:  # the plan's module imports torch; this one is read by fedsim.reporting
    from fedsim.runtime.population import ClientPlan

__all__ = [
    "APPLIED_FILE",
    "CLIENTS_FILE",
    "CLIENT_COLUMNS",
    "FINISHED_STATES",
    "STOPPED_STATES",
    "LEDGER_DIR",
    "METRICS_FILE",
    "PROCESSES_FILE",
    "SCENARIO_FILE",
    "SERVER_FILE",
    "SUMMARY_FILE",
    "TIMING_FILE",
    "ClientOutcome",
    "RunRecord",
    "StoppedClient",
    "check_unused",
    "clean_json",
    "default_run_dir",
    "json_line",
    "ledger_file",
    "read_json",
    "read_json_if_present",
    "require_writable_dir",
    "write_json",
    "write_run_outputs",
]

SCENARIO_FILE = "scenario.resolved.yaml"
METRICS_FILE = "metrics.jsonl"
CLIENTS_FILE = "clients.csv"
SUMMARY_FILE = "summary.json"
TIMING_FILE = "timing.json"
LEDGER_DIR = "ledgers"
TUNING_LEDGER_DIR = Path("tuning") / "ledgers"  # a private tuning sweep's, beside its trials
SERVER_FILE = "server.json"  # the deployed server's outcome
APPLIED_FILE = "applied.jsonl"  # deployed: one line per applied update (window, client, round, base)
PROCESSES_FILE = "processes.json"  # deployed: each process's command line, starts, exit codes

# A client in one of these states will never train again.
FINISHED_STATES = frozenset({"budget_exhausted", "done"})
# ... nor in these, as a deployed client tells its state (its report, its last status): a
# "crashed" one crashed for good (a crash it rejoins from sends nothing).
STOPPED_STATES = FINISHED_STATES | {"crashed"}

RELEASED_UNACKNOWLEDGED = "released_unacknowledged"
"""A deployed run's ``server.json`` and ``summary.json`` key: its clients' released updates
the server never acknowledged (:func:`released_unacknowledged`)."""


def released_unacknowledged(counts: Mapping[str, int | None]) -> dict[str, Any]:
    """What ``server.json`` and a launch's ``summary.json`` say of the updates the clients
    released (charged to their privacy) and the server never acknowledged, from each client's
    count (its final status's, or its report's; None: unknown): the ``total``, the ``clients``
    with any (id: count) and how many clients ``reported`` a count."""
    known = {c: n for c, n in counts.items() if n is not None}
    return {"total": sum(known.values()), "reported": len(known),
            "clients": {c: n for c, n in sorted(known.items()) if n}}


def unacknowledged_sentence(total: int, clients: int) -> str:
    """The explanation's sentence on ``total`` released updates of ``clients`` clients the
    server never acknowledged (``fedsim report``'s and a launch's summary's)."""
    return (f"{total} update(s) released by {clients} client(s) were never acknowledged by the "
            f"server when the run ended: charged to those clients' privacy budgets, perhaps "
            f"never applied (each client's client-<id>.json lists them as unacknowledged).")


CLIENT_COLUMNS = (
    "client_id",
    "group",
    "num_samples",
    "batch_size",
    "sampling",
    "q",
    "rounds",
    "steps",
    "sigma",
    "clip",
    "epsilon",
    "mu_clt",
    "mu_clt_gamma",
    "budget_epsilon",
    "budget_delta",
    "remaining_epsilon",
    "state",
    "stopped_at",
    "stop_reason",
    "stop_kind",
    # (appended, so that the columns above keep their places) sigma and clip above are the
    # last released round's; a client whose noise or clip changes over the run (a schedule)
    # had others before: its first round's, and whether they ever changed
    "sigma_first",
    "clip_first",
    "schedule",
)


def ledger_file(directory: str | Path, client_id: str) -> Path:
    """``<directory>/ledgers/<client_id>.jsonl`` (a run directory or a client's state)."""
    return Path(directory) / LEDGER_DIR / f"{client_id}.jsonl"


def default_run_dir(name: str, root: str | Path = "runs", *, claim: bool = False) -> Path:
    """The run directory a run named ``name`` writes by default (``fedsim run``:
    ``<scenario>-seed<N>``, ``fedsim launch``: ``<scenario>-launch``): ``root/name``, or, if
    that exists, the first of ``name-1``, ``name-2``, ... that does not (a run directory is
    never reused: its ledgers would continue spending).

    ``claim``: made here (one ``mkdir`` each, atomic), so that two runs started together
    take two directories (a stranger's two ``fedsim run`` of one scenario both chose
    ``runs/quickstart-seed0``, and the second failed on the first's ledger locks). A
    directory that cannot be made is returned unmade, for the caller's check to say why."""
    base = Path(root) / name
    candidate, suffix = base, 1
    while True:
        if claim:
            try:
                candidate.mkdir(parents=True)
                return candidate
            except FileExistsError:
                pass
            except OSError:
                return candidate
        elif not candidate.exists():
            return candidate
        candidate = base.with_name(f"{base.name}-{suffix}")
        suffix += 1


def check_unused(out_dir: Path, how: str = "--out, or out= from Python") -> None:
    """Refuse a run directory that already holds ledgers: a ledger is never reset, so reusing
    it would silently continue spending (``how``: how the caller chooses another)."""
    ledgers = out_dir / LEDGER_DIR
    if ledgers.exists() and not ledgers.is_dir():
        raise ConfigError(f"{ledgers} is not a directory; choose a new output directory "
                          f"({how})")
    if ledgers.exists() and any(ledgers.iterdir()):
        raise ConfigError(f"{out_dir} already holds a run's ledgers; choose a new output "
                          f"directory ({how})")


def require_new_run_dir(path: str | os.PathLike[str], what: str) -> Path:
    """The one check of a run directory a front door (``fedsim run``, :func:`fedsim.simulate`)
    makes before any work: writable (:func:`require_writable_dir`) and holding no run's
    ledgers (:func:`check_unused`). A stranger saw the refusal after a population was built
    and its log lines written."""
    target = require_writable_dir(path, what)
    check_unused(target)
    return target


def require_writable_dir(path: str | os.PathLike[str], what: str) -> Path:
    """The one rule for an output directory (``--out``, ``--plots``, a run's ``plots/``):
    checked before any work, it must be a directory this process can create files in, or
    be creatable under its nearest existing parent. Probed by creating (and removing) a file
    there - permission bits alone do not tell (root ignores them; a read-only file system
    does not). Nothing is created for a directory that does not exist yet.

    Raises:
        ConfigError: one line naming ``what``, the path and why (a file in the way, a
            read-only file system, no permission).
    """
    target = Path(path)
    existing = target
    while not existing.exists() and existing != existing.parent:
        if existing.is_symlink():  # a dangling link: nothing to create the directory in
            raise ConfigError(f"{what} {target}: {existing} is a broken symbolic link")
        existing = existing.parent
    existing = existing.absolute()  # "cannot write in /home/me/x", not "in ."
    if not existing.is_dir():
        raise ConfigError(f"{what} {target}: {existing} is a file, not a directory")
    try:
        handle, probe = tempfile.mkstemp(prefix=".fedsim-write-check-", dir=existing)
    except OSError as exc:
        raise ConfigError(f"{what} {target}: cannot write in {existing} "
                          f"({exc.strerror or exc})") from None
    os.close(handle)
    os.unlink(probe)
    return target


# ---------------------------------------------------------------------------------------------
# JSON


def clean_json(value: Any) -> Any:
    """``value`` with non-finite floats as None and numpy scalars as Python numbers, through
    dicts, lists and tuples (tuples become lists)."""
    if isinstance(value, dict):
        return {k: clean_json(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [clean_json(v) for v in value]
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, np.floating | np.integer):
        return clean_json(value.item())
    return value


def read_json(path: Path) -> dict[str, Any]:
    """A JSON object written by :func:`write_json`; ``{}`` if the file is missing, unreadable or
    not an object (a process that died before writing it). Read as a run directory's file
    (:func:`read_run_file`: a FIFO, which hung ``fedsim launch --resume``, or a file past
    :data:`~fedsim.config.limits.MAX_RUN_FILE_BYTES` is unreadable, not waited on or read);
    a reader that must tell damage from absence uses :func:`read_json_if_present`."""
    try:
        data = parse_json(read_run_file(path).decode("utf-8"))
    except (OSError, ValueError, ConfigError):
        return {}
    return data if isinstance(data, dict) else {}


def read_run_file(path: Path) -> bytes:
    """The bytes of a run directory's file for a report (a directory that may have been handed
    over): a regular file (:func:`~fedsim.atomic.read_regular`) of at most
    :data:`~fedsim.config.limits.MAX_RUN_FILE_BYTES`, refused from its size before anything
    is read (a sparse file of 1 GiB was read to its cap first), else a :class:`ConfigError`."""
    try:
        return read_regular(path, refuse_over=MAX_RUN_FILE_BYTES)
    except TooLarge:
        raise ConfigError(f"{path}: larger than {MAX_RUN_FILE_BYTES:,} bytes, more than a "
                          "run writes; not read") from None


def read_json_if_present(path: Path) -> dict[str, Any]:
    """A run directory's JSON object file that may be absent (``{}``), but whose damage must
    not pass for absence (a resume deciding whether a run ended, and under which scenario):
    present, it is :func:`read_json_object`'s, damage a :class:`ConfigError` naming it."""
    if not os.path.lexists(path):
        return {}
    try:
        return read_json_object(path)
    except OSError as exc:  # a FIFO, a directory, unreadable: named, not waited on
        raise ConfigError(f"{path}: cannot be read ({exc.strerror})") from None


def read_json_object(path: Path) -> dict[str, Any]:
    """A run directory's JSON object file (``summary.json``, ``server.json``) for a reader
    that needs it (a report): damage is a :class:`ConfigError` naming the file, where
    :func:`read_json` gives ``{}``."""
    try:
        value = parse_json(read_run_file(path).decode("utf-8"))
    except json.JSONDecodeError as exc:  # (an integer of 5,000 digits, deep nesting too)
        raise ConfigError(f"{path}: not JSON ({json_problem(exc)})") from None
    except UnicodeDecodeError:
        raise ConfigError(f"{path}: not JSON (not UTF-8)") from None
    if not isinstance(value, dict):
        raise ConfigError(f"{path}: must hold a JSON object")
    return value


def json_line(obj: Mapping[str, Any]) -> str:
    """One JSON-lines line (strict JSON, see :func:`clean_json`)."""
    return json.dumps(clean_json(dict(obj)), allow_nan=False) + "\n"


def write_json(path: Path, obj: Mapping[str, Any]) -> None:
    """``obj`` as indented strict JSON, replaced atomically (:mod:`fedsim.atomic`), so a reader
    (or a process killed mid-write) never sees half a file. Durability ``"file"``: an output
    that a power failure may roll back to its previous version (the run is redone, nothing is
    acknowledged on it)."""
    text = json.dumps(clean_json(dict(obj)), indent=2, allow_nan=False) + "\n"
    write_atomically(path, text, durability="file")


# ---------------------------------------------------------------------------------------------
# The record


class StoppedClient(TypedDict):
    """A client that stopped for good: when (scenario time), why (``reason``, text) and the
    kind of why (``kind``, a :class:`~fedsim.runtime.actors.stops.ClientStopKind`)."""

    client_id: str
    time: float | None
    reason: str
    kind: ClientStopKind


@dataclass(frozen=True, eq=False)
class ClientOutcome:
    """One client at the end of a run (its row of ``clients.csv``)."""

    plan: ClientPlan
    ledger: PrivacyLedger
    state: str
    releases: Releases
    """Rounds released by every incarnation of the client (restarts included), summed."""
    finished: bool
    """Will never train again (budget spent, rounds done, crashed for good)."""
    randomness: str = ""
    """Where its batches and noise came from (:mod:`fedsim.runtime.actors.exposure`)."""
    timing_overruns: int = 0
    """Rounds released after their public slot (deployed clients)."""
    split_delays: int = 0
    """Padded releases a global model's arrival moved to a later slot (deployed clients,
    ``interrupt: switch``)."""
    late_models: int = 0
    """Global models that arrived mid-round after a paced round's last part began, so they
    were the next round's where a simulation splits the round at them (deployed clients,
    ``interrupt: switch``)."""
    crashes: int = 0
    """Crashes its group's ``availability.crashes`` gave it (simulated or emulated)."""

    @property
    def client_id(self) -> str:
        return self.plan.client_id


@dataclass(frozen=True, eq=False)
class RunRecord:
    """A finished run as both runtimes report it: what :func:`write_run_outputs` writes."""

    scenario: Scenario
    out_dir: Path
    metrics: Sequence[Mapping[str, Any]]
    """The ``metrics.jsonl`` lines, in window order."""
    clients: Sequence[ClientOutcome]
    stopped: Sequence[StoppedClient]
    """Clients that stopped for good, in the order they stopped."""
    stop_reason: RunStop | None
    """Why the run ended (None: it ended without a stop condition holding)."""
    final_version: int
    network: Mapping[str, Any]
    """Transport counters (the simulated network's, or the deployed server's MQTT endpoint's)."""
    wall_seconds: float
    cpu_seconds: float
    rounds_batched: int = 0
    """Rounds computed in a batched pass with other clients' (virtual-time runs only)."""
    batched_passes: int = 0
    rounds_recomputed: int = 0
    """Computed rounds a late w-hat split (interrupt = switch) and computed again."""
    time_kind: str = "virtual"
    """What the run's seconds are: "virtual" (simulated) or "scenario" (on the wall clock)."""
    interrupted: str | None = None
    """The signal that interrupted the run (None: it ran to its stop condition); the summary
    then says ``"interrupted": {"signal": ..., "partial": true}``."""
    final_evaluation: Mapping[str, Any] | None = None
    """The final model's evaluation at the run's end: ``version``, ``accuracy``, ``loss``
    (None: not evaluated, e.g. an interrupted or message-only run)."""
    parts: int = 1
    """How many launches ran this (deployed) run: more than one, it was interrupted and resumed
    (``fedsim launch --resume``), which its summary says (a stranger's review)."""
    resumed_from_window: int | None = None
    """The window its last resumed part went on from (``parts`` > 1; None or 0: the start, the
    part before it interrupted before its first window)."""
    warnings: Sequence[str] = ()
    """What the run's collection found wrong (a deployed run's: a state ledger that does not
    extend the run directory's copy, a client the server refused); empty for a simulation."""
    deployed_differences: Sequence[str] = ()
    """What this (deployed) run did not do as a simulation of its scenario does
    (:mod:`fedsim.runtime.deployed.differences`); empty for a simulation."""
    released_unacknowledged: Mapping[str, Any] | None = None
    """A deployed run's :func:`released_unacknowledged` (None: a simulation's, which has no
    such key)."""

    @property
    def sample_grads(self) -> int:
        """Per-example gradients computed in released rounds, over all clients and restarts."""
        return sum(c.releases.sample_grads for c in self.clients)

    @property
    def virtual_time(self) -> float:
        return float(self.metrics[-1]["time"]) if self.metrics else 0.0


# ---------------------------------------------------------------------------------------------
# The writer


def _clt_figures(steps: tuple[GaussianStep, ...]) -> tuple[float, float | None]:
    """A history's CLT mu and its certified band's gamma (the row's ``mu_clt`` and
    ``mu_clt_gamma``)."""
    if not steps:
        return 0.0, 0.0
    mu = clt_mu(steps)
    # no band around an infinite mu (a sigma so small that e^{1/sigma^2} overflows)
    return mu, clt_band(steps, mu).gamma if math.isfinite(mu) else None


def _client_row(client: ClientOutcome, delta: float, stopped: StoppedClient | None,
                clt: Callable[[tuple[GaussianStep, ...]], tuple[float, float | None]]
                ) -> dict[str, Any]:
    """``clt``: :func:`_clt_figures`, remembered for the rows of one run (a population's
    clients share a few histories; the figures are a pure function of the history)."""
    plan, ledger = client.plan, client.ledger
    steps = group_steps(ledger.steps)
    last, first = client.releases.last, client.releases.first
    budget = plan.group.budget
    remaining = ledger.remaining_epsilon if budget else None
    mu_clt, gamma = clt(steps)
    return {
        "client_id": plan.client_id,
        "group": plan.group.name,
        "num_samples": plan.num_samples,
        "batch_size": plan.group.batch_size,
        "sampling": plan.group.sampling,
        "q": plan.q,
        "rounds": len(ledger.rounds),
        "steps": sum(s.count for s in steps),
        "sigma": last.sigma if last is not None else float(plan.schedule.sigma(0)),
        "clip": last.clip if last is not None else float(plan.schedule.clip(0)),
        # the ledger's rule: pld, or the smallest other guarantee where pld has no finite
        # answer (a history its grid cannot represent raised here, and the run lost its outputs)
        "epsilon": (smallest_epsilon(make_accountant("pld", steps), delta,
                                     only_if_infinite=True)[0] if steps else 0.0),
        "mu_clt": mu_clt,
        # certified: the true curve is within this of G_mu_clt (Berry-Esseen, clt_error)
        "mu_clt_gamma": gamma,
        "budget_epsilon": budget.epsilon if budget else None,
        # A budget is a pair: its eps holds at its own delta, which may not be the run's
        # (the row's epsilon, at the run's delta, may then read above budget_epsilon).
        "budget_delta": budget.delta if budget else None,
        "remaining_epsilon": float(remaining) if remaining is not None else None,
        "state": client.state,
        "stopped_at": stopped["time"] if stopped else None,
        "stop_reason": stopped["reason"] if stopped else "",
        "stop_kind": stopped["kind"] if stopped else None,
        "sigma_first": first.sigma if first is not None else float(plan.schedule.sigma(0)),
        "clip_first": first.clip if first is not None else float(plan.schedule.clip(0)),
        # "varies": sigma and clip are the last round's, not its posture all along
        "schedule": "" if first is None else "varies" if client.releases.varied else "constant",
    }


def _format_cell(value: Any) -> str:
    value = clean_json(value)
    if value is None:
        return ""
    return repr(value) if isinstance(value, float) else str(value)


DEPLOYED_CLOCKS = (
    "(A deployed client's times are on its own clock, which starts with its process (resumed, "
    "where its ledger ends) and moves forward to the server's at its first global model when "
    "behind it, never back (its ledger's times only grow): a client's times can read a little "
    "earlier or later than the run's end, and after a resume later by as long as the earlier "
    "part's clients ran on past its server's last window.)")


def _resumed(record: RunRecord) -> list[str]:
    """The explanation's sentence for a run of several launches (none for one)."""
    if record.parts <= 1:
        return []
    # No window closed before the interruption: no checkpoint, so the last part began at the
    # start (a stranger's summary read "the last from window None").
    start = (f"window {record.resumed_from_window}" if record.resumed_from_window
             else "the start (no window had closed before it)")
    return [f"It ran in {record.parts} parts: interrupted and resumed (fedsim launch "
            f"--resume), the last from {start}."]


def _trained_nobody(record: RunRecord, rows: list[dict[str, Any]]) -> list[str]:
    """The explanation's sentence for a run in which every client stopped for its budget
    before its first round (none otherwise): a stranger's run with every budget too small read
    like any other budget stop."""
    if rows and len(record.stopped) == len(rows) and all(r["rounds"] == 0 for r in rows) \
            and all(e["kind"] == ClientStopKind.BUDGET for e in record.stopped):
        return ["No client trained a single round: each one's budget was too small for its "
                "first, so the final model is the initial one (fedsim validate refuses such a "
                "scenario)."]
    return []


def _explain(record: RunRecord, rows: list[dict[str, Any]], caveats: list[str]) -> str:
    parts = [
        f"The run stopped at {record.time_kind} time {seconds_text(record.virtual_time)} s after "
        f"{len(record.metrics)} server windows"
        + (f" because {record.stop_reason.text}." if record.stop_reason else ".")
    ]
    by_kind: dict[str, list[StoppedClient]] = {}
    for entry in record.stopped:
        by_kind.setdefault(client_stop_phrase(entry["kind"]), []).append(entry)
    for kind, entries in sorted(by_kind.items()):
        times = [e["time"] for e in entries if e["time"] is not None]
        names = ", ".join(e["client_id"] for e in entries[:5]) + (
            " and others" if len(entries) > 5 else ""
        )
        span = ""
        if times:
            span = (
                f"between {seconds_text(min(times))} s and {seconds_text(max(times))} s"
                if len(set(times)) > 1
                else f"at {seconds_text(times[0])} s"
            )
        parts.append(f"{len(entries)} client(s) stopped {span} because {kind} ({names}).")
    if record.time_kind == "scenario" and record.stopped:
        parts.append(DEPLOYED_CLOCKS)
    parts += _trained_nobody(record, rows)
    active = [c.plan.client_id for c in record.clients if not c.finished]
    if active:
        parts.append(f"{len(active)} client(s) could still train when the run ended.")
    epsilons = [r["epsilon"] for r in rows]
    if epsilons:
        budgeted = sum(r["budget_epsilon"] is not None for r in rows)
        relations = epsilon_by_relation(rows)
        ranges = "; ".join(f"{relation} clients {epsilon_range(r['epsilon_min'], r['epsilon_max'])}"
                           for relation, r in relations.items())
        parts.append(
            f"Per-client epsilon at delta={record.scenario.privacy.delta:g} (pld) "
            + (("is " if epsilon_alike(min(epsilons), max(epsilons)) else "ranges from ")
               + f"{epsilon_range(min(epsilons), max(epsilons))}."
               if len(relations) == 1
               else f"by neighbouring relation, guarantees about different neighbours that are "
                    f"not to be compared: {ranges}.")
            + (f" None of the {budgeted} client(s) with a budget exceeded it: every release was "
               "checked against, and written to, its ledger first." if budgeted else
               " No client had a budget; every release was still written to its ledger.")
        )
    other_delta = record.scenario.budgets_at_other_delta()
    if other_delta:
        parts.append(
            f"The budgets of {', '.join(other_delta)} hold at their own delta, not the run's "
            f"{record.scenario.privacy.delta:g}: their eps above, at the run's delta, may read "
            "above their budget (clients.csv: budget_delta).")
    parts += (_resumed(record) + _crashes_and_links(record) + _unacknowledged(record)
              + _scheduled(rows))
    for head, items in ((f"{len(caveats)} privacy caveat(s) qualify these eps values: ",
                         caveats),
                        ("Warnings: ", record.warnings),
                        ("Compared with a simulation of this scenario, this deployed run: ",
                         record.deployed_differences)):
        if items:
            parts.append(head + " ".join(f"({n}) {item.rstrip('.')}."
                                         for n, item in enumerate(items, 1)))
    return " ".join(parts)


def _scheduled(rows: list[dict[str, Any]]) -> list[str]:
    """The explanation's sentence on clients whose sigma or clip changed over the run (none
    where no client's did: a constant posture's summary is unchanged)."""
    varied = [r["client_id"] for r in rows if r["schedule"] == "varies"]
    if not varied:
        return []
    return [f"{len(varied)} client(s) changed their noise sigma or clip over the run (a "
            f"schedule): clients.csv's sigma and clip are their last round's, sigma_first and "
            f"clip_first their first's; their eps composes every round's (their ledgers), "
            f"not the last sigma's."]


def _unacknowledged(record: RunRecord) -> list[str]:
    """The explanation's sentence on released updates never acknowledged (none: none)."""
    unacknowledged = record.released_unacknowledged or {}
    if not unacknowledged.get("total"):
        return []
    return [unacknowledged_sentence(unacknowledged["total"],
                                    len(unacknowledged.get("clients", {})))]


def _crash_totals(record: RunRecord) -> dict[str, int] | None:
    """The run's crashes (``availability.crashes``): how many, of how many clients, how many
    for good; None when there were none (the summary then has no such key)."""
    crashed = [c for c in record.clients if c.crashes]
    if not crashed:
        return None
    return {"crashes": sum(c.crashes for c in crashed), "clients": len(crashed),
            "for_good": sum(c.state == "crashed" and c.finished for c in record.clients)}


def _crashes_and_links(record: RunRecord) -> list[str]:
    """The explanation's sentences on the crashes and on a deployed run's emulated links."""
    parts = []
    crashes = _crash_totals(record)
    if crashes is not None:
        parts.append(f"{crashes['clients']} client(s) crashed {crashes['crashes']} time(s) "
                     f"as availability.crashes has them ({crashes['for_good']} for good).")
    links = (record.network or {}).get("emulated_links")
    if isinstance(links, Mapping):
        up, down = links.get("uplink", {}), links.get("downlink", {})
        parts.append(
            f"The clients' scenario links were emulated: {up.get('dropped', 0)} of "
            f"{up.get('sent', 0)} updates and {down.get('dropped', 0)} of "
            f"{down.get('sent', 0)} global models were dropped on them (summary.json: "
            "network.emulated_links).")
    return parts


def _final_accuracy(record: RunRecord, metrics: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """``final_accuracy`` / ``final_loss`` and the model ``final_evaluated_version`` they are of:
    the final model's, evaluated at the run's end; without that evaluation (an interrupted or
    message-only run) the last periodic evaluation's, and ``final_evaluated_version`` says
    which model that was."""
    final = record.final_evaluation
    if final is not None:
        return {"final_accuracy": final["accuracy"], "final_loss": final["loss"],
                "final_evaluated_version": final["version"]}
    last = next((m for m in reversed(metrics) if m["accuracy"] is not None), None)
    return {"final_accuracy": last["accuracy"] if last else None,
            "final_loss": last["loss"] if last else None,
            "final_evaluated_version": last["version"] if last else None}


def epsilon_by_relation(rows: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """The clients' epsilon (``clients.csv`` rows) by neighbouring relation (add/remove for
    Poisson sampling, replace-one for fixed-size), each with its clients, min, median and
    max: one relation's guarantee is about other neighbours than the other's, so their
    figures are never pooled where both occur (a stranger: summary.json's median did)."""
    groups = by_relation((row["sampling"], float(row["epsilon"])) for row in rows)
    return {relation: {"clients": len(values), "epsilon_min": min(values),
                       "epsilon_median": float(np.median(values)), "epsilon_max": max(values)}
            for relation, values in groups.items()}


def _summary(record: RunRecord, rows: list[dict[str, Any]]) -> dict[str, Any]:
    metrics = record.metrics
    accuracies = [m["accuracy"] for m in metrics if m["accuracy"] is not None]
    totals = {
        key: sum(m[key] for m in metrics)
        for key in ("received", "applied", "stale", "duplicate", "rejected", "dropped_in_flight")
    }
    states: dict[str, int] = {}
    for row in rows:
        states[row["state"]] = states.get(row["state"], 0) + 1
    epsilons = sorted(r["epsilon"] for r in rows)
    caveats = privacy_caveats(record.scenario.privacy.timing, record.clients)
    final = _final_accuracy(record, metrics)
    return {
        "scenario": record.scenario.name,
        "seed": record.scenario.seed,
        **final,
        "best_accuracy": max(accuracies + [a for a in [final["final_accuracy"]] if a is not None],
                             default=None),
        "last_periodic_accuracy": accuracies[-1] if accuracies else None,
        "windows": len(metrics),
        "virtual_time": record.virtual_time,
        "time_kind": record.time_kind,
        "final_version": record.final_version,
        **stop_fields(record.stop_reason),
        "updates": totals,
        "network": record.network,
        "client_states": dict(sorted(states.items())),
        **({"crashes": crashes} if (crashes := _crash_totals(record)) is not None else {}),
        "stopped": list(record.stopped),
        "privacy": {
            "delta": record.scenario.privacy.delta,
            "epsilon_min": epsilons[0] if epsilons else None,
            "epsilon_median": float(np.median(epsilons)) if epsilons else None,
            "epsilon_max": epsilons[-1] if epsilons else None,
            "accountant": "pld",
            "caveats": caveats,
        } | ({"by_relation": relations,
              "note": "its clients' guarantees are about different neighbours (add/remove, "
                      "replace-one): compare the eps of one relation only (by_relation); the "
                      "figures above pool both"}
             if len(relations := epsilon_by_relation(rows)) > 1 else {}),
        "explanation": _explain(record, rows, caveats),
    } | ({"interrupted": {"signal": record.interrupted, "partial": True}}
         if record.interrupted else {}) | (
        # (a deployed run's only: a simulation's summary keeps its keys)
        {"deployed_differences": list(record.deployed_differences)}
        if record.time_kind == "scenario" else {}) | (
        {"warnings": list(record.warnings)} if record.warnings else {}) | (
        {RELEASED_UNACKNOWLEDGED: dict(record.released_unacknowledged)}
        if record.released_unacknowledged is not None else {}) | (
        {"resumed": {"parts": record.parts, "last_from_window": record.resumed_from_window or 0}}
        if record.parts > 1 else {})


def client_rows(record: RunRecord) -> list[dict[str, Any]]:
    """The rows of ``clients.csv`` (:data:`CLIENT_COLUMNS`), as computed: an epsilon the
    accountant could not bound is ``inf`` here (``clients.csv`` leaves its cell empty)."""
    delta = record.scenario.privacy.delta
    stops: dict[str, StoppedClient] = {}
    for entry in record.stopped:
        stops.setdefault(entry["client_id"], entry)
    clt = functools.cache(_clt_figures)  # for these rows only: dropped with them
    return [_client_row(c, delta, stops.get(c.plan.client_id), clt) for c in record.clients]


def write_run_outputs(record: RunRecord, rows: list[dict[str, Any]] | None = None
                      ) -> dict[str, Any]:
    """Write ``clients.csv``, ``summary.json`` and ``timing.json`` of a finished run into
    ``record.out_dir`` and return the summary (``rows``: :func:`client_rows`, if the caller
    computed them already)."""
    out = record.out_dir
    rows = client_rows(record) if rows is None else rows
    # A run that ended before its first window (interrupted at once) has written no metrics
    # line: its empty file still makes the directory a run's (a sweep listed such a run as
    # "cannot be read").
    os.close(open_no_link(out / METRICS_FILE, os.O_WRONLY | os.O_CREAT))  # (touch follows links)
    clients_fd = open_no_link(out / CLIENTS_FILE, os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
    with open(clients_fd, "w", encoding="utf-8", newline="") as handle:
        writer = csv.writer(handle, lineterminator="\n")
        writer.writerow(CLIENT_COLUMNS)
        for row in rows:
            writer.writerow([_format_cell(row[c]) for c in CLIENT_COLUMNS])
    summary = _summary(record, rows)
    write_json(out / SUMMARY_FILE, summary)
    wall, sample_grads = record.wall_seconds, record.sample_grads
    write_json(
        out / TIMING_FILE,
        {
            "wall_seconds": wall,
            "cpu_seconds": record.cpu_seconds,
            "sample_grads": sample_grads,
            "sample_grads_per_s": sample_grads / wall if wall > 0 else None,
            "simulated_s_per_wall_s": record.virtual_time / wall if wall > 0 else None,
            # How the rounds were computed: batched with other clients' or alone.
            "rounds_batched": record.rounds_batched,
            "batched_passes": record.batched_passes,
            # Computed rounds a late w-hat split (interrupt = switch), computed again.
            "rounds_recomputed": record.rounds_recomputed,
        },
    )
    return summary
