"""The run directory both runtimes write: its file names, its JSON, and its one writer.

A finished run, virtual-time (:mod:`fedsim.runtime.simulated.simulation`) or deployed
(:mod:`fedsim.runtime.deployed.launcher`), is described by a :class:`~fedsim.runtime.run_record.RunRecord`;
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
import shutil
import tempfile
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np

from fedsim.atomic import TooLarge, open_no_link, read_regular, write_atomically
from fedsim.config.limits import MAX_RUN_FILE_BYTES
from fedsim.errors import ConfigError
from fedsim.json_input import json_problem, parse_json
from fedsim.privacy.accountant import make_accountant, smallest_epsilon
from fedsim.privacy.clt_error import clt_band
from fedsim.privacy.events import GaussianStep, group_steps
from fedsim.privacy.gdp import clt_mu
from fedsim.runtime.run_record import ClientOutcome, RunRecord, StoppedClient
from fedsim.runtime.run_summary import summary_of

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
    "check_unused",
    "clean_json",
    "claimed_run_dir",
    "default_run_dir",
    "give_back_if_no_run",
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


@contextmanager
def claimed_run_dir(name: str, root: str | Path = "runs") -> Iterator[Path]:
    """The default directory of a run, sweep or launch named ``name``, claimed
    (:func:`default_run_dir` with ``claim``: two started together take two) and given back
    (:func:`give_back_if_no_run`) if what runs in it fails or is interrupted before it is a
    run. The one rule of ``fedsim run``, ``fedsim sweep`` and ``fedsim launch``: two sweeps
    (or launches) of one scenario started together both chose ``runs/<name>-sweep``."""
    out = default_run_dir(name, root, claim=True)
    try:
        yield out
    except BaseException:  # (Ctrl-C while the population is built, too)
        give_back_if_no_run(out)
        raise


def give_back_if_no_run(out: Path) -> None:
    """Remove ``out``, a directory this process made, if it holds no run: no metrics, and no
    ledger that recorded a spend, at any depth (a run's own, a sweep's runs', a launch's
    client state directories: a privacy record is never removed)."""
    from fedsim.privacy.ledger_open import holds_records

    if not out.is_dir():
        return
    for path in out.rglob("*"):
        if path.name == METRICS_FILE and path.is_file() and path.stat().st_size > 0:
            return
        if path.parent.name == LEDGER_DIR and path.suffix == ".jsonl" and holds_records(path):
            return
    shutil.rmtree(out, ignore_errors=True)


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
# The writer (the record: fedsim.runtime.run_record; what the summary says: run_summary)


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
    summary = summary_of(record, rows)
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
