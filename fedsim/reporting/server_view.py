"""A deployed server's output directory read as a run directory: what ``fedsim report`` and
``fedsim compare`` can say about a run whose server was started by hand or by the compose file
(``fedsim server --out DIR``; ``docker compose cp server:/runs/<run> ./runs/``).

Such a directory holds the server's ``metrics.jsonl``, ``server.json`` (its outcome and every
client's last status), ``applied.jsonl`` and ``scenario.resolved.yaml``, but no
``summary.json`` or ``clients.csv``: ``fedsim launch`` writes those after gathering the
clients' ledgers, and a deployment's ledgers stay with their clients (each client's ``--state``
directory). So the view is the server's:

* accuracy, windows and updates from ``metrics.jsonl`` and ``server.json``;
* each client's state, rounds and eps as its last status *reported* them: self-reports the
  server cannot verify, said so;
* the clients' ledgers, verified and their eps recomputed, only where someone copied them
  into ``DIR/ledgers/`` (each ``<id>.jsonl`` with its ``<id>.jsonl.hwm``): the report then
  warns where a status and its ledger disagree.

Damaged files raise :class:`~fedsim.errors.ConfigError` naming the file.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from fedsim.errors import ConfigError
from fedsim.privacy.epsilon_text import by_relation_text
from fedsim.privacy.events import by_relation
from fedsim.reporting.stops import stop_counts
from fedsim.reporting.values import accuracy, count, finite_number, printable, relative_gap, spread
from fedsim.runtime.actors.stops import (
    RunStop,
    RunStopKind,
    client_stop_phrase,
    finished_stop_kind,
)
from fedsim.runtime.run_outputs import (
    SCENARIO_FILE,
    SERVER_FILE,
    STOPPED_STATES,
    SUMMARY_FILE,
    read_json_object,
)
from fedsim.runtime.run_record import RELEASED_UNACKNOWLEDGED, stop_time_in_run
from fedsim.runtime.run_summary import unacknowledged_sentence

REPORTED_EPSILON = "reported_epsilon"
"""The client row's column of the eps its last status reported (not ``epsilon``: nothing
here recomputed it)."""


def is_server_directory(root: Path) -> bool:
    """Whether ``root`` is a deployed server's output directory rather than a run directory:
    ``server.json`` without the summary a launch or a simulation writes."""
    return (root / SERVER_FILE).is_file() and not (root / SUMMARY_FILE).is_file()


UPDATE_FATES = ("received", "applied", "stale", "duplicate", "rejected", "dropped_in_flight")
"""The per-window counts of ``metrics.jsonl`` summed into the view's ``updates``."""


def server_rows_and_summary(
    root: Path, metrics: tuple[dict[str, Any], ...]
) -> tuple[tuple[dict[str, Any], ...], dict[str, Any]]:
    """The client rows (one a scenario client, from its last status) and a summary of the
    server's view (module docstring) of the server's output directory ``root`` whose windows
    are ``metrics``. Every value is read as what it must be (a count, a finite number, a
    known kind); anything else reads as unknown."""
    from fedsim.config import load_scenario

    server = read_json_object(root / SERVER_FILE)
    resolved = root / SCENARIO_FILE
    if not resolved.is_file():
        raise ConfigError(f"{root}: a server's output directory without its "
                          f"{SCENARIO_FILE} (the server writes it at its start)")
    scenario = load_scenario(resolved).scenario  # parsed only: no factory is imported
    statuses = server.get("statuses")
    statuses = statuses if isinstance(statuses, Mapping) else {}
    # the last window's time, as a launched run's summary says it (server.json's is when
    # the server stopped, a little later: a stranger saw two lengths for one run)
    end = max((float(m["time"]) for m in metrics), default=finite_number(server.get("time")))
    rows = tuple(_row(client_id, group.name, group.rounds, statuses.get(client_id), end)
                 for group in scenario.clients.groups for client_id in group.client_ids())
    final = server.get("final_evaluation")
    final_accuracy = accuracy(final.get("accuracy")) if isinstance(final, Mapping) else None
    evaluated = [a for m in metrics if (a := accuracy(m.get("accuracy"))) is not None]
    stop = RunStop.read(server)
    windows = count(server.get("windows"))
    summary: dict[str, Any] = {
        "scenario": scenario.name,
        "seed": scenario.seed,
        "windows": len(metrics) if windows is None else windows,
        "updates": {fate: sum(n for m in metrics if (n := count(m.get(fate))))
                    for fate in UPDATE_FATES},
        "virtual_time": end,
        "time_kind": "scenario",
        "final_accuracy": final_accuracy,
        # (as a run's summary counts it: the final evaluation too)
        "best_accuracy": max([*evaluated, *([final_accuracy] if final_accuracy is not None
                                            else [])], default=None),
        "privacy": {"delta": scenario.privacy.delta},
        "stop_kind": None if stop is None else stop.kind.value,
        "stop_reason": "" if stop is None else stop.text,
        RELEASED_UNACKNOWLEDGED: (unacknowledged := _unacknowledged(server)),
        "explanation": _explanation(
            root, rows, stop, scenario.privacy.delta, unacknowledged,
            {group.name: group.sampling for group in scenario.clients.groups}),
    }
    if stop is not None and stop.kind is RunStopKind.SIGNAL:  # partial: said as a run's is
        summary["interrupted"] = {"signal": "a signal", "partial": True}
    return rows, summary


def _unacknowledged(server: Mapping[str, Any]) -> dict[str, Any] | None:
    """``server.json``'s count of released updates never acknowledged, every value checked
    (None: the file has none, an older server's)."""
    found = server.get(RELEASED_UNACKNOWLEDGED)
    if not isinstance(found, Mapping):
        return None
    listed = found.get("clients")
    clients = {printable(c, 64): n for c, v in listed.items() if (n := count(v))} \
        if isinstance(listed, Mapping) else {}
    return {"total": count(found.get("total")), "reported": count(found.get("reported")),
            "clients": clients}


def _row(client_id: str, group: str, rounds: int | None, status: Any,
         end: float | None) -> dict[str, Any]:
    """One client's row from its last status (None: the server never heard from it); its
    stop time within the run's span to ``end`` (:func:`stop_time_in_run`; a deployed client's
    last status is sent at the server's time as the client measured it)."""
    status = status if isinstance(status, Mapping) else {}
    state = printable(status.get("state")) or "unknown"
    released = count(status.get("rounds"))
    finished = state in STOPPED_STATES
    epsilon = finite_number(status.get("epsilon"))
    kind = finished_stop_kind({}, {"state": state, "rounds": released or 0}, rounds)
    return {
        "client_id": client_id,
        "group": group,
        "state": state,
        "rounds": released,
        REPORTED_EPSILON: epsilon if epsilon is not None and epsilon >= 0 else None,
        # a finished client's stop, counted by the report as any run's (its text, or its kind's)
        "stop_reason": (printable(status.get("detail")) or client_stop_phrase(kind)) if finished
        else "",
        "stop_kind": kind.value if finished else "",
        "stopped_at": (stop_time_in_run(finite_number(status.get("sent_at")), end)
                       if end is not None else finite_number(status.get("sent_at")))
        if finished else None,
    }


def _explanation(root: Path, rows: tuple[dict[str, Any], ...], stop: RunStop | None,
                 delta: float, unacknowledged: Mapping[str, Any] | None,
                 samplings: Mapping[str, str]) -> str:
    """``samplings``: each group's sampling, by group name."""
    heard = [row for row in rows if row["state"] != "unknown"]
    # A finished client's last status says its final eps; a running one's is as old as its
    # last state change (0 at its start: a stranger read "eps min 0 / median 0 / max 0").
    # Never pooled across neighbouring relations, as a run's summary does not pool them (a
    # stranger's view gave one median of add/remove and replace-one clients).
    reported = by_relation((samplings.get(row["group"]), eps) for row in heard
                           if row["stop_kind"] and (eps := row[REPORTED_EPSILON]) is not None)
    many_reported = sum(len(values) for values in reported.values())
    parts = [f"{root} is a deployed server's output directory (server.json, no summary.json): "
             f"the server's view of the run."]
    if stop is not None:
        parts.append(f"The server stopped: {printable(stop.text)}.")
    parts.append(f"{len(heard)} of {len(rows)} clients sent a status.")
    stopped = stop_counts(row["stop_kind"] for row in heard if row["stop_kind"])
    for kind, many in stopped.most_common():
        parts.append(f"{many} stopped because {client_stop_phrase(kind)}.")
    running = len(rows) - sum(stopped.values())
    if running and stop is not None and stop.kind is RunStopKind.SIGNAL:
        parts.append(f"{running} had not reported a stop: a signal stopped the server, which "
                     f"does not end the run (its clients wait, and a restarted server "
                     f"continues it).")
    elif running and stop is not None:
        parts.append(f"{running} had not reported a stop when the server ended the run (its "
                     f"end stops them; each client's own report in its --state directory, "
                     f"client-<id>.json, says how it stopped).")
    if unacknowledged is not None and unacknowledged["total"]:
        parts.append(unacknowledged_sentence(unacknowledged["total"],
                                             len(unacknowledged["clients"]))
                     + " (Their final statuses say so: self-reports the server cannot verify.)")
    if reported:
        said = (spread(next(iter(reported.values()))) if len(reported) == 1 else
                by_relation_text({relation: spread(values)
                                  for relation, values in reported.items()}))
        parts.append(f"The {many_reported} stopped clients' last statuses reported eps (delta "
                     f"= {delta:g}) {said}: self-reports the server cannot verify.")
    if many_reported < len(rows):
        parts.append("A client still running at the end sent its last status at its last "
                     "change of state, so its eps there is older than the run's end.")
    parts.append("The clients' ledgers stay with the clients (each one's --state "
                 "directory, ledgers/<id>.jsonl and its .hwm); copied into "
                 f"{root / 'ledgers'}, they are verified here and their eps recomputed; the "
                 "report warns where a stopped client's status disagrees with its ledger, or "
                 "any status claims more than its ledger holds (`fedsim ledger check FILE` "
                 "checks one where it is).")
    return " ".join(parts)


STATUS_RELATIVE_TOLERANCE = 1e-3
"""A status's eps and its ledger's, recomputed, may differ by this much (rounding)."""


def status_disagreements(rows: Iterable[Mapping[str, Any]],
                         from_ledgers: Mapping[str, float]) -> list[str]:
    """Warnings where a client's last status and its ledger (copied in, recomputed) disagree:
    a finished client's status reports its final eps, so any difference; an unfinished one's
    reports eps as of its sending, so only one above the ledger's (the ledger then holds
    less than the client said it spent: records may be missing)."""
    warnings = []
    for row in rows:
        reported, client_id = row.get(REPORTED_EPSILON), str(row.get("client_id"))
        ledger = from_ledgers.get(client_id)
        if reported is None or ledger is None:
            continue
        gap = relative_gap(reported, ledger)
        finished = bool(row.get("stop_kind"))
        if gap > STATUS_RELATIVE_TOLERANCE or (finished and -gap > STATUS_RELATIVE_TOLERANCE):
            warnings.append(f"warning: client {client_id}: its last status ({row.get('state')}) "
                            f"reported eps {reported:.6g}, its ledger gives {ledger:.6g}")
    return warnings
