"""Reading a run directory written by ``fedsim run``.

Layout (the runtime writes it, with the names of :mod:`fedsim.runtime.run_outputs`;
reporting only reads it)::

    DIR/scenario.resolved.yaml   the scenario after defaults and --set overrides
    DIR/metrics.jsonl            one JSON object per server window
    DIR/ledgers/<client>.jsonl   each client's PrivacyLedger (header line, then records)
    DIR/clients.csv              one row per client (posture, spending, state)
    DIR/summary.json             run-level results; ``privacy.delta`` is the scenario's delta

Malformed or missing files raise :class:`~fedsim.errors.ConfigError` naming the file, so
``fedsim report`` exits 2 with a message instead of a traceback.
"""

from __future__ import annotations

import csv
import io
import json
import os
from collections.abc import Mapping
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import Any

from fedsim.config import limits
from fedsim.errors import ConfigError
from fedsim.json_input import json_problem, parse_json
from fedsim.reporting.server_view import is_server_directory, server_rows_and_summary
from fedsim.reporting.values import finite_number, name_text, printable
from fedsim.runtime.run_outputs import (
    CLIENTS_FILE,
    LEDGER_DIR,
    METRICS_FILE,
    SCENARIO_FILE,
    SUMMARY_FILE,
    TUNING_LEDGER_DIR,
    read_json_object,
    read_run_file,
)

PLOT_DIR = "plots"

# Columns of clients.csv that hold text; every other column is a number or empty (None).
_TEXT_COLUMNS = frozenset({"client_id", "group", "sampling", "state", "stop_reason", "stop_kind",
                           "schedule"})


def _number_or_text(column: str, value: str) -> Any:
    if column in _TEXT_COLUMNS:
        return value
    if value.strip() == "":
        return None
    try:
        number = float(value)
    except ValueError:
        return value  # a column this reader does not know about: keep it as text
    return int(number) if number.is_integer() and "." not in value and "e" not in value.lower() else number


_SIGNAL_CHARS = 40
"""An interrupting signal's name is read from summary.json to at most this many characters."""


@dataclass(frozen=True)
class TuningRole:
    """A private tuning's trial (:attr:`RunDirectory.tuning`): the release (selected; its
    privacy is the tuned eps, above its own ledgers') or a trial that must not be published."""

    release: bool
    selected: str | None
    """The selected trial's name (None: none was)."""
    tuned_max: float | None
    """The release's largest tuned eps, as its summary says (None: not a release, or none)."""
    tuned: dict[str, float]
    """Each client's tuned eps, as the release's summary says (``{}`` for another trial)."""
    ledgers: Path
    """Where the sweep's tuning ledgers are when they are beside the trial (its sweep's
    ``tuning/ledgers``): the release's tuned eps is verified against them there
    (:func:`fedsim.reporting.ledgers.tuned_privacy`)."""


@dataclass(frozen=True)
class RunDirectory:
    """The parsed contents of one run directory (see the module docstring)."""

    path: Path
    metrics: tuple[dict[str, Any], ...]
    clients: tuple[dict[str, Any], ...]
    summary: dict[str, Any]
    server_view: bool = False
    """A deployed server's output directory read alone (:mod:`~fedsim.reporting.server_view`):
    its clients' rows are their last statuses, its ledgers only those copied in. Set by
    :meth:`load` from the files present, never from a summary's contents (a handed-over
    ``summary.json`` saying so would silence the missing ledgers' warning)."""

    @classmethod
    def load(cls, path: str | Path) -> RunDirectory:
        """Read ``path``; raise :class:`ConfigError` if it is not a (readable) run directory.

        ``metrics.jsonl`` and ``summary.json`` must exist; ``clients.csv`` and ``ledgers/``
        may be missing (a run without clients, or one that crashed before writing them). A
        deployed server's output directory (``server.json``, no ``summary.json``) is read as
        the server's view of its run (:mod:`fedsim.reporting.server_view`).
        """
        root = Path(path)
        if not root.is_dir():
            raise ConfigError(f"{root}: not a directory (expected a run directory written by "
                              "`fedsim run` or `fedsim launch`, or a deployed server's --out)")
        server = is_server_directory(root)
        needed = (METRICS_FILE,) if server else (METRICS_FILE, SUMMARY_FILE)
        missing = [name for name in needed if not (root / name).is_file()]
        if missing:
            raise ConfigError(f"{root}: not a run directory (missing {', '.join(missing)}; "
                              "`fedsim run SCENARIO --out DIR` writes one)"
                              + _holding_runs(root))
        try:
            if server:  # a deployed server's output directory: its view of the run
                metrics = _read_metrics(root / METRICS_FILE)
                return cls(root, metrics, *server_rows_and_summary(root, metrics),
                           server_view=True)
            return cls(root, _read_metrics(root / METRICS_FILE),
                       _read_clients(root / CLIENTS_FILE), read_json_object(root / SUMMARY_FILE))
        except UnicodeDecodeError as exc:  # a damaged file: bad input, not a crash
            raise ConfigError(f"{root}: a file of the run directory is not UTF-8 text "
                              f"({exc.reason} at byte {exc.start})") from None
        except OSError as exc:
            raise ConfigError(f"{root}: cannot read the run directory ({exc})") from None

    # -- derived views -------------------------------------------------------------------
    @property
    def delta(self) -> float:
        """The scenario's delta (``summary.privacy.delta``)."""
        privacy = self.summary.get("privacy")
        delta = privacy.get("delta") if isinstance(privacy, Mapping) else None
        if not isinstance(delta, int | float) or not 0.0 < delta < 1.0:
            raise ConfigError(f"{self.path / SUMMARY_FILE}: privacy.delta must be a number in "
                              f"(0, 1), got {delta!r}")
        return float(delta)

    @property
    def time_name(self) -> str:
        """What the run's seconds are: "virtual time" (simulated) or, for a deployed run,
        "scenario time" (the wall clock times the time scale; ``summary.time_kind``)."""
        return "scenario time" if self.summary.get("time_kind") == "scenario" else "virtual time"

    @property
    def time_label(self) -> str:
        """The x-axis label of the run's seconds."""
        if self.time_name == "scenario time":
            return "scenario time (s: wall clock / time scale)"
        return "virtual time (s)"

    @property
    def client_time_label(self) -> str:
        """The x-axis label of the clients' seconds (their ledgers' times): a deployed
        client's clock starts with its process, not with the server's first window."""
        if self.time_name == "scenario time":
            return "scenario time (s: wall clock / time scale; each client's own clock)"
        return self.time_label

    @property
    def unevaluated_final(self) -> tuple[int, int] | None:
        """``(evaluated, final)`` model versions where the run's ``final_accuracy`` is of an
        earlier model than its final one (an interrupted run: the last periodic evaluation's);
        None where it is the final model's, or the summary does not say."""
        evaluated = self.summary.get("final_evaluated_version")
        final = self.summary.get("final_version")
        if isinstance(evaluated, int) and isinstance(final, int) and evaluated != final:
            return evaluated, final
        return None

    @property
    def interrupted(self) -> str | None:
        """The signal that interrupted the run (``summary.interrupted.signal``); None if it ran
        to its stop condition."""
        found = self.summary.get("interrupted")
        if not isinstance(found, Mapping):
            return None
        # (a signal's name, read from a handed-over file: bounded, as titles print it)
        return printable(found.get("signal"), _SIGNAL_CHARS) or "a signal"

    @property
    def tuning(self) -> TuningRole | None:
        """What the run is in a private tuning (``summary.private_tuning``, written by ``fedsim
        sweep --private-tuning``); None for any other run. Read from a handed-over file: each
        value checked, a ``release`` that is not exactly ``true`` is no release."""
        block = self.summary.get("private_tuning")
        if not isinstance(block, Mapping):
            return None
        tuned = block.get("tuned_epsilon")
        selected = block.get("selected_trial")
        return TuningRole(
            release=block.get("release") is True,
            selected=printable(selected, 300) if isinstance(selected, str) else None,
            tuned_max=finite_number(block.get("epsilon_max")),
            tuned={printable(str(c), 64): e for c, v in tuned.items()
                   if (e := finite_number(v)) is not None} if isinstance(tuned, Mapping) else {},
            ledgers=self.path.parent / TUNING_LEDGER_DIR)

    @property
    def virtual_time(self) -> float:
        """Virtual seconds the run lasted (summary, else the last window's time, else 0)."""
        value = finite_number(self.summary.get("virtual_time"))
        if value is not None:
            return value
        return max((float(m["time"]) for m in self.metrics), default=0.0)

    @property
    def scenario_name(self) -> str:
        return str(self.summary.get("scenario") or self.path.name)

    @cached_property
    def ledger_paths(self) -> dict[str, Path]:
        """Client id -> ledger file, sorted by client id."""
        folder = self.path / LEDGER_DIR
        if not folder.is_dir():
            return {}
        return {p.stem: p for p in sorted(folder.glob("*.jsonl"))}

    @cached_property
    def scenario_clients(self) -> tuple[str, ...] | None:
        """The client ids of the scenario the run ran (``scenario.resolved.yaml``), in its
        groups' order; None where the directory has no such file. (Its files' clients are
        checked against them: a client whose ledger and clients.csv row were both removed was
        otherwise left out of a report without a word.)

        Raises:
            ConfigError: the file is there but is no scenario (the caller warns).
        """
        from fedsim.config import load_scenario

        resolved = self.path / SCENARIO_FILE
        if not resolved.is_file():
            return None
        scenario = load_scenario(resolved).scenario  # parsed only: no factory is imported
        return tuple(client for group in scenario.clients.groups
                     for client in group.client_ids())

    def client(self, client_id: str) -> dict[str, Any] | None:
        for row in self.clients:
            if str(row.get("client_id")) == client_id:
                return row
        return None

    @property
    def plot_dir(self) -> Path:
        """Where the run's plots are (re)drawn: inside the run directory, never through a
        link out of it (a run directory handed over may carry one: drawing through it would
        overwrite files elsewhere)."""
        plots = self.path / PLOT_DIR
        if plots.is_symlink():
            raise ConfigError(f"{plots} is a symbolic link; the plots are drawn only inside "
                              f"the run directory (remove the link)")
        return plots


def _holding_runs(root: Path, looked_at: int = 1000) -> str:
    """What to say of a directory that holds run directories (a sweep's, a runs/ folder): a
    stranger gave `fedsim compare` the sweep's directory itself."""
    try:  # (a child that cannot be read: a review's locked directory raised here)
        children = [child for _, child in zip(range(looked_at), root.iterdir(), strict=False)]
        runs = sorted(child.name for child in children if os.path.isfile(child / SUMMARY_FILE))
        sweep = os.path.isfile(root / "sweep.json")
    except OSError:
        return ""
    if not runs:
        return ""
    what = "a sweep's directory" if sweep else "a directory of runs"
    # A glob that names run directories only: `root/*` also matches a sweep's sweep.csv and
    # sweep.json, and its tuning/ folder (a stranger ran the suggestion and was refused).
    pattern = "trial-*/" if all(run.startswith("trial-") for run in runs) else "*/"
    return (f"; it is {what}: name its runs, for example "
            f"`fedsim compare {printable(str(root), limit=300)}/{pattern}` or "
            f"`fedsim report {printable(str(root / runs[0]), limit=300)}`")


_SHARED_KEYS = 1024
"""Metrics keys shared among rows at most (a run writes some twenty)."""


def _read_metrics(path: Path) -> tuple[dict[str, Any], ...]:
    rows: list[dict[str, Any]] = []
    # Every line's keys are the same few strings: one object each for all rows, not one a row
    # (json.loads makes new ones each call). A row of the quickstart's metrics then takes 584
    # bytes instead of 1,456, so a long run's report 2.5 times less memory.
    keys: dict[str, str] = {}
    for number, line in enumerate(read_run_file(path).decode("utf-8").splitlines(), start=1):
        if not line.strip():
            continue
        if len(rows) >= limits.MAX_WINDOWS:  # a line a window: more than a run can have
            # (each line read is a dict of some hundred bytes: a review's 3 million tiny
            # lines took 1.1 GB; at most MAX_WINDOWS of them are read)
            raise ConfigError(f"{path}: more than {limits.MAX_WINDOWS:,} lines, more windows "
                              "than a run can have; not read")
        try:
            row = parse_json(line)
        except json.JSONDecodeError as exc:  # (5,000 digits and deep nesting too)
            raise ConfigError(f"{path}:{number}: not JSON ({json_problem(exc, line=False)})") from None
        if not isinstance(row, dict):
            raise ConfigError(f"{path}:{number}: each line must be a JSON object")
        time = finite_number(row.get("time"))
        if time is None or not 0.0 <= time <= limits.MAX_SECONDS:  # (±1e308 broke the plots)
            raise ConfigError(f"{path}:{number}: 'time' must be a number of seconds in [0, "
                              f"{limits.MAX_SECONDS:g}], got {row.get('time')!r:.40}")
        window = row.get("window")
        if not (window is None or (type(window) is int and window >= 0)):
            raise ConfigError(f"{path}:{number}: 'window' must be a window number, got "
                              f"{window!r:.40}")
        if len(keys) < _SHARED_KEYS:  # (a hostile file's new keys a line are not kept twice)
            row = {keys.setdefault(key, key): value for key, value in row.items()}
        rows.append(row)
    return tuple(sorted(rows, key=lambda r: (float(r["time"]), r.get("window") or 0)))



def _read_clients(path: Path) -> tuple[dict[str, Any], ...]:
    if not path.is_file():
        return ()
    with io.StringIO(read_run_file(path).decode("utf-8"), newline="") as handle:
        reader = csv.DictReader(handle)
        rows: list[dict[str, Any]] = []
        try:  # (csv's own bound: a field over 128 KiB raises, as any malformed CSV does)
            if reader.fieldnames is None or "client_id" not in reader.fieldnames:
                raise ConfigError(f"{name_text(path)}: expected a CSV header with a client_id "
                                  f"column")
            for number, row in enumerate(reader, start=2):
                if None in row:
                    raise ConfigError(f"{name_text(path)}:{number}: more fields than the "
                                      f"header has")
                rows.append({k: _number_or_text(k, v or "") for k, v in row.items()})
        except csv.Error as exc:  # (a review's 200 KB field gave a _csv.Error traceback)
            raise ConfigError(f"{name_text(path)}: line {reader.line_num + 1}: not readable "
                              f"as CSV ({exc})") from None
        return tuple(rows)
