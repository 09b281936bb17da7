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
from fedsim.reporting.rundir import RunDirectory
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


def tuning_epsilons(folder: Path, delta: float) -> dict[str, float]:
    """Each client's eps at ``delta`` from a private tuning's ledgers (a sweep's
    ``tuning/ledgers``, one tuned selection each, under their own accountant, ``rdp``), opened
    read-only as :func:`read_ledger` opens a run's; ``{}`` where there are none or one cannot
    be read."""
    found: dict[str, float] = {}
    if not folder.is_dir():
        return found
    for path in sorted(folder.glob("*.jsonl")):
        try:
            with _opened(path, default_accountant="rdp") as ledger:
                found[ledger.client_id] = ledger.epsilon(delta)
        except (ConfigError, LedgerError, OSError):
            return {}
    return found


def ledger_gaps(run: RunDirectory) -> list[str]:
    """Warnings for what a report's epsilon cannot see: clients of ``clients.csv`` (of the
    scenario, in a server's view without ``clients.csv``) that have no ledger in the run
    directory (their spending is left out of every figure read from the
    ledgers), and ledgers without their high-water mark (a cut file is then undetectable)."""
    paths = run.ledger_paths
    listed = [str(row.get("client_id")) for row in run.clients if row.get("client_id")]
    missing = [client_id for client_id in listed if client_id not in paths]
    unmarked = [client_id for client_id, path in paths.items() if not mark_path(path).exists()]
    warnings = []
    if run.server_view and not paths:
        missing = []  # a server's view: its explanation says where the ledgers are
    if missing:
        listing = "the scenario" if run.server_view else "clients.csv"
        warnings.append(f"warning: {len(missing)} client(s) of {listing} have no ledger in "
                        f"{run.path / LEDGER_DIR} ({_some(missing)}): the eps from the ledgers "
                        f"leaves their spending out")
    if unmarked:
        warnings.append(f"warning: {len(unmarked)} ledger(s) have no high-water mark "
                        f"({_some(unmarked)}): a cut file cannot be detected, so their eps may "
                        f"be too low")
    return warnings


def _some(client_ids: list[str], shown: int = 5) -> str:
    """The first ``shown`` ids, and how many more."""
    more = len(client_ids) - shown
    return ", ".join(client_ids[:shown]) + (f" and {more} more" if more > 0 else "")


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
            message = str(exc) if str(path) in str(exc) else f"{path}: {exc}"
            raise ConfigError(f"{message} (`fedsim ledger check {path}` says more; to report the "
                              f"rest of the run, move it out of {path.parent})") from None
        if ledger.client_id != client_id:
            raise ConfigError(
                f"{path}: holds client {ledger.client_id!r}, but the file name says {client_id!r}"
            )
        ledgers.append(ledger)
    return ledgers
