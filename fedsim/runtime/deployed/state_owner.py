"""Whose state directory this is: a deployed client resumes only its own.

A client's ``--state`` directory holds its ledger (``ledgers/<id>.jsonl`` and its mark) and its
exit report (``client-<id>.json``). A client given another client's directory - swapped
volumes, a wrong ``--state`` - found no ledger of its own there and started a fresh one at
epsilon 0, spending its whole budget
again (session 49's review: 674 rounds at eps 2.998, then 674 more; 4.44 composed against a
budget of 3.0). So the first start writes ``owner.json`` (the client's id), and a start is
refused when the directory names another client, holds another client's ledger or exit
report, or holds this client's exit report of released rounds while its ledger and mark are
both gone (a fresh ledger would forget them); an owner file that is there but damaged
is refused too, not taken for none (:func:`_owner`). An empty directory (a default path resolved
from another working directory, a volume not mounted, the whole directory deleted) holds
nothing to tell: there the server's welcome does, when it knows rounds of the client
(:class:`fedsim.transports.mqtt.MqttClientEndpoint`, ``recorded_rounds``). This guards
against mistakes, not against the machine's owner (docs/SECURITY.md).

**A run that ended is not resumed** (a stranger's review, session 66). A client that saw the
server's end of the run (:class:`~fedsim.protocol.messages.RunFinished`) records it in its exit
report (``run_finished``: the version and reason; an earlier fedsim's report says it by its
``server_finished`` stop), and a client started again on that directory is refused before it
opens its ledger or connects (:func:`refuse_ended_run`), as ``fedsim server`` refuses a finished
run's ``--state``: restarted, it waited for a welcome no server would send until it was killed,
and a server of the same run name could have had it spend privacy after its run ended. A
client that stopped before the end never saw it; the run incarnations it followed
(:func:`followed_runs`) are its evidence, and the broker's retained end of one of them ends its
next process before any model (:class:`fedsim.transports.mqtt.MqttClientEndpoint`'s
``followed``), in the same line (:func:`run_ended_error`). Each is kept in ``followed.json``
as the live server confirms it, before any model of it is delivered (:func:`remember_followed`):
a process killed (SIGKILL) before it wrote a report left no ``incarnations`` in one, and its
next process, started after the end, waited for a welcome until it was stopped. A retained
end is the server's alone (ACL) and names its incarnation, 64 random bits drawn at each server
start: one of an earlier or later run never names what this directory's client followed. A
client that was never welcomed followed nothing and spent nothing; it cannot tell the run's end
from an earlier run's of the same name (a new run's client may start before its server) and
waits for a live server, as before (logged).
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any, TypeVar

from pydantic import BaseModel, ConfigDict, Field, field_validator

from fedsim.atomic import write_atomically
from fedsim.errors import ConfigError
from fedsim.json_input import read_json_model
from fedsim.privacy.ledger_mark import mark_path
from fedsim.protocol.headers import ClientId
from fedsim.runtime.run_outputs import (
    FINISHED_STATES,
    LEDGER_DIR,
    ledger_file,
    read_json_if_present,
    write_json,
)

OWNER_FILE = "owner.json"
"""The state directory's owner: ``{"client_id": ...}``, written at the first start."""
MAX_OWNER_BYTES = 4096
"""The largest owner file read (fedsim writes about 30 bytes); a larger one is damage."""

RUN_FINISHED = "run_finished"
"""The report's record of the server's end of the run: ``{"version": ..., "reason": ...}``, or
None (not seen)."""

FOLLOWED_FILE = "followed.json"
"""The run incarnations the directory's client followed, oldest first:
``{"incarnations": [...]}`` (:func:`remember_followed`)."""
MAX_FOLLOWED_BYTES = 4096
"""The largest ``followed.json`` read (fedsim writes at most about 700 bytes); a larger one is
damage (it was read up to a run file's 512 MiB, at the start and at each incarnation)."""

__all__ = ["FOLLOWED_FILE", "OWNER_FILE", "RUN_FINISHED", "claim_state_dir",
           "client_state_file", "ended_run", "followed_incarnations", "followed_runs",
           "read_client_report", "refuse_ended_run", "remember_followed", "report_count",
           "run_ended_error", "stopped_for_good"]


def client_state_file(state_dir: str | Path, client_id: str) -> Path:
    """The client's exit report in its state directory (``client-<id>.json``)."""
    return Path(state_dir) / f"client-{client_id}.json"


def claim_state_dir(state: Path, client_id: str) -> None:
    """Refuse ``state`` unless it is ``client_id``'s (or new), then mark it as its own.

    Raises:
        ConfigError: the directory names another client, holds another client's ledger or
            exit report, or this client's report of released rounds with no ledger left.
    """
    report_file = client_state_file(state, client_id)
    owner = _owner(state)
    if owner is not None and owner != client_id:
        raise ConfigError(f"{state} is the state directory of client {owner!r}, not "
                          f"{client_id!r}: give each client its own --state (a client "
                          f"resumes its own ledger there; in another's it would start a "
                          f"fresh one at epsilon 0)")
    folder = state / LEDGER_DIR
    others = sorted(p.stem for p in folder.glob("*.jsonl") if p.stem != client_id) \
        if folder.is_dir() else []
    others += sorted(p.stem.removeprefix("client-") for p in state.glob("client-*.json")
                     if p != report_file)
    if others:
        raise ConfigError(f"{state} holds the state of client(s) {sorted(set(others))}, not of "
                          f"{client_id!r}: give each client its own --state")
    ledger = ledger_file(state, client_id)
    if not ledger.exists() and not mark_path(ledger).exists():
        released = _released_rounds(report_file, client_id, state)
        if released:
            raise ConfigError(
                f"{report_file} says client {client_id!r} released {released} round(s), but "
                f"its ledger and mark are gone from {state}: restore them (a fresh ledger "
                f"would forget that spending, and the server, which knows those rounds, would "
                f"stop the client)")
    if owner is None:
        state.mkdir(parents=True, exist_ok=True)
        write_json(state / OWNER_FILE, {"client_id": client_id})


class _Owner(BaseModel):
    """What ``owner.json`` holds (:func:`claim_state_dir` writes it)."""

    model_config = ConfigDict(frozen=True, extra="forbid", strict=True)

    client_id: ClientId


def read_client_report(state: Path, client_id: str) -> dict[str, Any]:
    """``client_id``'s exit report in ``state`` (``{}``: none there), as every start reads it.
    One that is there but cannot be read, is not a JSON object or is larger than a run
    writes is refused (:class:`ConfigError`), as a damaged :data:`OWNER_FILE` is: taken for
    absence (as it once was), a damaged report let a client of a run that ended start again,
    and the next report, written over it, dropped the rounds and counts it held."""
    try:
        return read_json_if_present(client_state_file(state, client_id))
    except ConfigError as exc:
        raise ConfigError(f"{exc}: the exit report of client {client_id!r} (its released "
                          f"rounds, whether its run ended), so nothing is started on {state}; "
                          f"restore it, or give the client a fresh --state directory") from None


def _owner(state: Path) -> str | None:
    """The client ``state``'s owner file names, None where it has none. A damaged one is
    refused (:func:`_read_state_file`): taken for absence (as it once was), it let a start
    adopt another client's directory with its owner file damaged, and write itself in as the
    owner. So the ledger's mark and the server's ``server.hwm`` treat their damage too."""
    owner = _read_state_file(
        state / OWNER_FILE, _Owner, most=MAX_OWNER_BYTES, shape='{"client_id": "<client id>"}',
        why=f"it says whose state directory {state} is, so nothing is started on it; restore "
            f"it, or give the client a fresh --state directory")
    return None if owner is None else owner.client_id


_Model = TypeVar("_Model", bound=BaseModel)


def _read_state_file(path: Path, model: type[_Model], *, most: int, shape: str,
                     why: str) -> _Model | None:
    """:func:`~fedsim.json_input.read_json_model`, its damage said with ``why`` it matters
    (what the file keeps, what to do)."""
    try:
        return read_json_model(path, model, most=most, shape=shape)
    except ConfigError as exc:
        raise ConfigError(f"{exc}: {why}") from None


def ended_run(report: Mapping[str, object]) -> str | None:
    """How a client's exit report says its run ended (``"at version 7 (...)"``), None where it
    does not: neither ``run_finished`` nor a ``server_finished`` stop (an earlier fedsim's
    report). A ``run_finished`` that is not what a client writes (damage) still says the run
    ended: taken for absence, it would let the client train on a run it was told is over."""
    finished = report.get(RUN_FINISHED)
    if isinstance(finished, dict) and type(finished.get("version")) is int \
            and isinstance(finished.get("reason"), str):
        return f"at version {finished['version']} ({finished['reason'] or 'no reason given'})"
    if finished is not None:
        return f"(its {RUN_FINISHED} reads {str(finished)[:80]!r})"
    if report.get("stop_kind") == "server_finished":
        return f"({str(report.get('stop_reason') or 'the server finished the run')[:300]})"
    return None


def refuse_ended_run(state: Path, client_id: str,
                     report: Mapping[str, object] | None = None) -> None:
    """Refuse to start ``client_id`` on ``state`` when its exit report says its run ended
    (:func:`ended_run`; module docstring). ``report``: the report as the caller read it
    (:func:`read_client_report`), else read here. Writes nothing.

    Raises:
        ConfigError: the run ended, or the report is damaged (:func:`read_client_report`;
            exit status 2, one line).
    """
    ended = ended_run(read_client_report(state, client_id) if report is None else report)
    if ended is not None:
        raise run_ended_error(state, client_id, ended,
                              f"{client_state_file(state, client_id).name} records")


def run_ended_error(state: Path, client_id: str, ended: str, source: str) -> ConfigError:
    """The one line a client started on a run that ended stops with (exit status 2):
    ``ended`` says at what, ``source`` who says so."""
    return ConfigError(f"{state}: the run of client {client_id!r} ended {ended}, as {source}; "
                       "nothing to resume: start a new run on a fresh --state directory")


def _released_rounds(report_file: Path, client_id: str, state: Path) -> int:
    """How many rounds the exit report ``report_file`` says the client released, where its
    ledger and mark are gone (0: no report). A report that is there but cannot be read, or
    whose list of rounds is not a list, may have said some: its damage does not pass for
    absence (a fresh ledger would start at epsilon 0; an attacker's review, session 66b: a
    count in place of the list crashed the start with a TypeError, and an unreadable report
    let it start a fresh ledger)."""
    lost = (f"and the ledger and mark of client {client_id!r} are gone from {state}: restore "
            f"them, or the report if it is the one damaged (a fresh ledger would forget the "
            f"client's spending)")
    try:
        report = read_client_report(state, client_id)
    except ConfigError as exc:
        raise ConfigError(f"{exc}; {lost}") from None
    rounds = report.get("ledger_rounds")
    if isinstance(rounds, list):
        return len(rounds)
    if rounds is None:
        return 0
    raise ConfigError(f"{report_file}: its ledger_rounds is not a list of rounds "
                      f"({type(rounds).__name__}), {lost}")


def _followable(value: object) -> bool:
    """Whether ``value`` can be a run incarnation a client followed (the one rule for both
    files that keep them)."""
    return isinstance(value, str) and 0 < len(value) <= 32


def followed_incarnations(report: Mapping[str, object]) -> list[str]:
    """The run incarnations a client's report says its processes followed (``incarnations``;
    anything else in it, damage, is left out: the report's own damage is judged by
    :func:`read_client_report`, and :data:`FOLLOWED_FILE` keeps them too)."""
    followed = report.get("incarnations")
    if not isinstance(followed, list):
        return []
    return [i for i in followed if _followable(i)][-MAX_FOLLOWED:]


MAX_FOLLOWED = 16
"""The most run incarnations a client's report, or its ``followed.json``, keeps (the newest)."""


class _Followed(BaseModel):
    """What ``followed.json`` holds (:func:`remember_followed` writes it)."""

    model_config = ConfigDict(frozen=True, extra="forbid", strict=True)

    incarnations: list[str] = Field(max_length=MAX_FOLLOWED)

    @field_validator("incarnations")
    @classmethod
    def _each_followable(cls, value: list[str]) -> list[str]:
        if not all(_followable(i) for i in value):
            raise ValueError("an incarnation that no server draws")
        return value


def _kept_followed(state: Path) -> list[str]:
    """The run incarnations ``state``'s :data:`FOLLOWED_FILE` keeps (``[]``: no file). A
    damaged one is refused (:func:`_read_state_file`), as a damaged :data:`OWNER_FILE` is:
    taken for none (as it once was), it lost the evidence that ends a client of a run that
    ended, and the next incarnation written over it lost it for good."""
    kept = _read_state_file(
        state / FOLLOWED_FILE, _Followed, most=MAX_FOLLOWED_BYTES,
        shape=f'{{"incarnations": [...]}} of at most {MAX_FOLLOWED} run incarnations',
        why=f"it keeps the runs this client followed (a run that ended is not resumed), so "
            f"nothing is started on {state}; restore it, or remove it if that run has not ended")
    return [] if kept is None else kept.incarnations


def followed_runs(state: Path, report: Mapping[str, object]) -> list[str]:
    """The run incarnations the client of ``state`` followed: those its earlier processes
    kept as the live server confirmed them (:data:`FOLLOWED_FILE`, damage refused:
    :func:`_kept_followed`) and its exit ``report``'s (an earlier fedsim wrote them there
    alone), the newest :data:`MAX_FOLLOWED`."""
    kept = _kept_followed(state)
    merged = dict.fromkeys([*followed_incarnations(report), *kept])
    return list(merged)[-MAX_FOLLOWED:]


def remember_followed(state: Path, incarnation: str) -> None:
    """Keep ``incarnation`` among the run incarnations the client of ``state`` followed
    (:data:`FOLLOWED_FILE`), durably (fsynced, as its ledger is): called as the live server
    confirms it, before any model of it is delivered, so a client that spent in that run
    has it on disk whatever kills its process later (module docstring). Raises OSError (the
    write failed) or ConfigError (the file is damaged: left as it is, for the next start to
    refuse); the caller logs it, and a later process may only wait."""
    kept = _kept_followed(state)
    if incarnation in kept or not _followable(incarnation):  # ("": no server's)
        return
    text = json.dumps({"incarnations": [*kept, incarnation][-MAX_FOLLOWED:]}, indent=2) + "\n"
    write_atomically(state / FOLLOWED_FILE, text, durability="durable")


def report_count(report: Mapping[str, object], key: str) -> int:
    """A count in a client's report (``client-<id>.json``): 0 when absent or not a count
    (the file is an input like any other, and may be damaged)."""
    value = report.get(key)
    return value if type(value) is int and value >= 0 else 0


def add_counts(total: dict[str, object], counts: object) -> dict[str, object]:
    """Add the counts of ``counts`` (a report's mapping of non-negative ints, nested mappings
    too) into ``total`` and return it; anything else in it (a damaged file) adds nothing.
    The one rule for counts over a client's processes or a launch's parts."""
    if not isinstance(counts, dict):
        return total
    for key, value in counts.items():
        if not isinstance(key, str):
            continue
        held = total.get(key, 0)
        if type(value) is int and value >= 0 and type(held) is int:
            total[key] = held + value
        elif isinstance(value, dict):
            inner = total.setdefault(key, {})
            if isinstance(inner, dict):
                add_counts(inner, value)
    return total


def emulated_totals(reports: Iterable[object]) -> dict[str, object] | None:
    """The emulated links' counts of ``reports`` (each a report's ``emulated_network``)
    summed by direction and count (:func:`add_counts`). None: no report has any (the
    scenario's links are perfect)."""
    totals: dict[str, object] = {}
    for report in reports:
        if isinstance(report, dict):
            add_counts(totals, {direction: report.get(direction)
                                for direction in ("uplink", "downlink")})
    return totals or None


def stopped_for_good(report: Mapping[str, object]) -> bool:
    """Whether a client's report says it never trains again: a finished state, or a crash
    for good (a "crashed" state alone may be a client down when the run ended)."""
    return report.get("state") in FINISHED_STATES or report.get("stop_kind") == "crashed"
