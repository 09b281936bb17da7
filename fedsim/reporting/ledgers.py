"""Reading the clients' privacy ledgers of a run directory (read-only views for reports).

Each ledger is opened with :class:`fedsim.privacy.ledger.PrivacyLedger` itself, so a report
sees exactly what the client's budget enforcement saw (same accountant, same settings), and a
corrupt ledger is reported as the ledger's own :class:`~fedsim.errors.LedgerError`.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from fedsim.atomic import read_regular
from fedsim.errors import ConfigError, LedgerError
from fedsim.json_input import parse_json
from fedsim.privacy.accountant import Accountant
from fedsim.privacy.events import GaussianStep
from fedsim.privacy.ledger import Budget, PrivacyLedger
from fedsim.privacy.ledger_mark import mark_path
from fedsim.reporting.rundir import RunDirectory, TuningRole
from fedsim.reporting.values import name_text, relative_gap, spread
from fedsim.runtime.run_outputs import LEDGER_DIR


@dataclass(frozen=True)
class ClientLedger:
    """One client's released steps in time order, and the accountant over all of them."""

    client_id: str
    steps: tuple[tuple[float, GaussianStep], ...]  # (virtual time, step), by time
    accountant: Accountant  # composed over every step; its name and settings are the ledger's
    sampling: str = "poisson"  # the header's: poisson (add/remove) or fixed (replace-one)


MAX_HEADER_BYTES = 64 * 1024
"""A ledger's header line is read from at most this many first bytes (it is ~200)."""


def _header(path: Path) -> dict[str, Any]:
    """The header line: the ledger is opened with exactly what it says (it checks them)."""
    first = read_regular(path, MAX_HEADER_BYTES).split(b"\n", 1)[0].decode("utf-8", "replace")
    try:
        header = parse_json(first)
    except json.JSONDecodeError:
        raise LedgerError(f"{path}: line 1: not a JSON ledger header") from None
    if not isinstance(header, dict) or not {"client_id", "sampling"} <= set(header):
        raise LedgerError(f"{path}: line 1: not a ledger header (needs client_id and sampling)")
    return header


def _opened(path: Path, *, default_accountant: str) -> PrivacyLedger:
    """The ledger at ``path`` opened read-only with exactly what its header says (the
    accountant ``default_accountant`` where the header names none): a report never changes a
    run directory, so it also works on a read-only copy."""
    header = _header(path)
    return PrivacyLedger.open(path, client_id=str(header["client_id"]),
                              sampling=str(header["sampling"]),
                              budget=Budget.from_json(header.get("budget")),
                              accountant=str(header.get("accountant", default_accountant)),
                              read_only=True)


def read_ledger(path: Path) -> ClientLedger:
    """Open the ledger at ``path`` and take a snapshot of it (the file is closed again).

    The ledger is opened read-only (:meth:`PrivacyLedger.open` with ``read_only=True``): a
    report never changes a run directory, so it also works on a read-only copy.

    The accountant is the ledger's enforcing one: a guarantee (``pld`` or ``rdp``) even when
    the header names ``gdp-clt`` (see :mod:`fedsim.privacy.ledger`).
    """
    with _opened(path, default_accountant="pld") as ledger:
        if ledger.accountant.selections:
            raise LedgerError(f"{path}: holds a tuned selection (a sweep's tuning ledger, "
                              f"not a run's); its eps is the sweep's tuned total")
        timed = tuple(sorted(((record.time, record.step) for record in ledger.records
                              if isinstance(record.step, GaussianStep)), key=lambda pair: pair[0]))
        return ClientLedger(ledger.client_id, timed, ledger.accountant, str(ledger.sampling))


TUNING_RELATIVE_TOLERANCE = 1e-3
"""summary.json's tuned eps and its tuning ledger's, recomputed, may differ by this much."""


@dataclass(frozen=True)
class TunedPrivacy:
    """A private tuning's release's privacy as ``fedsim report`` and ``fedsim compare`` state
    it (:func:`tuned_privacy`): each client's tuned eps, from the sweep's tuning ledgers where
    they are beside the trial, else as its summary says, and what could not be verified."""

    epsilons: dict[str, float]
    """Each client's tuned eps at :attr:`delta`."""
    delta: float
    source: str
    """Where the eps are from, in words."""
    problems: tuple[str, ...]
    """Disagreements and what is unverified, each a sentence a caller prefixes with
    "warning: " (and a run's name)."""
    verified: bool = False
    """Every client's eps is its tuning ledger's (none is summary.json's alone)."""

    @property
    def statement(self) -> str:
        """The one line both commands print (fedsim report alone, compare after its run's
        name)."""
        head = f"release privacy (private tuning, rdp, delta = {self.delta:g})"
        if not self.epsilons:
            return f"{head}: no tuned eps found"
        return (f"{head}: tuned eps {spread(self.epsilons.values())} over {len(self.epsilons)} "
                f"clients, covering every trial and the selection (from {self.source})")


def _tuning_ledger_epsilons(folder: Path, delta: float) -> dict[str, float]:
    """Each client's eps at ``delta`` from the tuning ledgers in ``folder`` (one tuned
    selection each, under their own accountant, ``rdp``), opened read-only as
    :func:`read_ledger` opens a run's.

    Raises:
        ConfigError: one is damaged (or holds another client than its name says): the tuned
            eps cannot be verified, as a damaged client ledger stops a report.
    """
    found: dict[str, float] = {}
    for path in sorted(folder.glob("*.jsonl")):
        try:
            with _opened(path, default_accountant="rdp") as ledger:
                client_id, epsilon = ledger.client_id, ledger.epsilon(delta)
        except (ConfigError, LedgerError, OSError) as exc:
            raise ConfigError(f"{_named_in(exc, path)}: a damaged tuning ledger: the "
                              f"release's tuned eps cannot be verified, and summary.json's "
                              f"figures are not stated in its place (`fedsim ledger check "
                              f"{name_text(path)}` says more; to report the trial without it, "
                              f"move it out of {name_text(folder)}: its client's tuned eps is "
                              f"then reported as unverified)") from None
        if client_id != path.stem:
            raise ConfigError(f"{name_text(path)}: holds client {client_id!r}, but the file "
                              f"name says {path.stem!r}: the release's tuned eps cannot be "
                              f"verified")
        found[client_id] = epsilon
    return found


def tuned_privacy(run: RunDirectory, tuning: TuningRole) -> TunedPrivacy:
    """The release's tuned eps (``tuning``: ``run``'s private tuning, a release), verified
    against the sweep's tuning ledgers where they are beside the trial (:attr:`TuningRole.
    ledgers`); summary.json's figures where they are not ("not there": the trial copied on its
    own), each said so. A client of the summary without a tuning ledger there keeps the
    summary's figure, with a problem saying it is unverified.

    Raises:
        ConfigError: a tuning ledger there is damaged (:func:`_tuning_ledger_epsilons`): a
            report then stops (exit status 2) as for a damaged client ledger, never falling
            back to summary.json's figures.
    """
    recorded, folder, delta = tuning.tuned, tuning.ledgers, run.delta
    if not folder.is_dir():
        return TunedPrivacy(dict(recorded), delta, "summary.json (the sweep's tuning ledgers "
                            "are not beside this trial)", ())
    found = _tuning_ledger_epsilons(folder, delta)
    problems = [f"client {client}: summary.json's tuned eps {recorded.get(client)}, the tuning "
                f"ledger gives {eps:.6g}" for client, eps in sorted(found.items())
                if recorded.get(client) is None
                or abs(relative_gap(recorded[client], eps)) > TUNING_RELATIVE_TOLERANCE]
    unverified = [client for client in recorded if client not in found]
    if unverified:
        problems.append(f"{len(unverified)} client(s) of summary.json's tuned eps have no tuning "
                        f"ledger in {name_text(folder)} ({_some(unverified)}): their tuned eps "
                        f"cannot be verified (summary.json's are shown)")
    source = f"its sweep's tuning ledgers {name_text(folder)}"
    if not found:
        source = f"summary.json, unverified: {name_text(folder)} holds no tuning ledger"
    elif unverified:
        source += f"; summary.json's, unverified, for {len(unverified)} client(s) without one"
    return TunedPrivacy({**{c: recorded[c] for c in unverified}, **found}, delta, source,
                        tuple(problems), verified=bool(found) and not unverified)


def _named_in(exc: Exception, path: Path) -> str:
    """``exc``'s message, naming ``path`` (escaped: a file name from a handed-over directory
    may hold terminal escapes)."""
    message = name_text(exc)
    return message if name_text(path) in message else f"{name_text(path)}: {message}"


def ledger_gaps(run: RunDirectory) -> list[str]:
    """Warnings for what a report's epsilon cannot see: clients of the scenario
    (``scenario.resolved.yaml``) or of ``clients.csv`` that have no ledger in the run directory
    (their spending is left out of every figure read from the ledgers: a review removed a
    client's ledger and its clients.csv row, and the report's eps spread silently left it
    out), and ledgers without their high-water mark (a cut file is then undetectable)."""
    paths = run.ledger_paths
    warnings = []
    try:
        scenario = run.scenario_clients or ()
    except (ConfigError, OSError) as exc:  # (a file that is no scenario: said, not fatal)
        scenario = ()
        first, *more = str(exc).splitlines() or [""]
        warnings.append(f"warning: {name_text(first)}"
                        + (f" (the first: {name_text(more[0].strip())})" if more else "")
                        + ": the ledgers are not checked against the scenario's clients")
    in_csv = [str(row.get("client_id")) for row in run.clients if row.get("client_id")]
    listed = list(dict.fromkeys([*scenario, *in_csv]))  # (the scenario's order first)
    missing = [client_id for client_id in listed if client_id not in paths]
    unmarked = [client_id for client_id, path in paths.items() if not mark_path(path).exists()]
    if run.server_view and not paths:
        missing = []  # a server's view: its explanation says where the ledgers are
    if missing:
        unlisted = set(missing)
        listing = ("the scenario" if run.server_view
                   else "clients.csv" if unlisted <= set(in_csv)
                   else "the scenario" if unlisted <= set(scenario)
                   else "the scenario and clients.csv")
        warnings.append(f"warning: {len(missing)} client(s) of {listing} have no ledger in "
                        f"{name_text(run.path / LEDGER_DIR)} ({_some(missing)}): the eps from "
                        f"the ledgers leaves their spending out")
    if unmarked:
        warnings.append(f"warning: {len(unmarked)} ledger(s) have no high-water mark "
                        f"({_some(unmarked)}): a cut file cannot be detected, so their eps may "
                        f"be too low")
    return warnings


def _some(client_ids: list[str], shown: int = 5) -> str:
    """The first ``shown`` ids, and how many more."""
    more = len(client_ids) - shown
    shown_ids = ", ".join(name_text(client_id) for client_id in client_ids[:shown])
    return shown_ids + (f" and {more} more" if more > 0 else "")


def read_ledgers(run: RunDirectory) -> list[ClientLedger]:
    """Every ledger of ``run``, sorted by client id.

    Raises:
        ConfigError: a ledger is unreadable (for a report that is bad input: exit status 2).
    """
    ledgers = []
    for client_id, path in run.ledger_paths.items():
        try:
            ledger = read_ledger(path)
        except (LedgerError, ConfigError, OSError) as exc:  # OSError: e.g. a read-only copy
            raise ConfigError(f"{_named_in(exc, path)} (`fedsim ledger check {name_text(path)}` "
                              f"says more; to report the rest of the run, move it out of "
                              f"{name_text(path.parent)})") from None
        if ledger.client_id != client_id:
            raise ConfigError(f"{name_text(path)}: holds client {ledger.client_id!r}, but the "
                              f"file name says {client_id!r}")
        ledgers.append(ledger)
    return ledgers
