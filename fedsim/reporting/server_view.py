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

import math
import statistics
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from fedsim.errors import ConfigError
from fedsim.runtime.actors.stops import RunStop, client_stop_phrase, finished_stop_kind
from fedsim.runtime.run_outputs import (
    FINISHED_STATES,
    SCENARIO_FILE,
    SERVER_FILE,
    read_json_object,
)

REPORTED_EPSILON = "reported_epsilon"
"""The client row's column of the eps its last status reported (not ``epsilon``: nothing
here recomputed it)."""


def is_server_directory(root: Path, summary_file: str) -> bool:
    """Whether ``root`` is a deployed server's output directory rather than a run directory:
    ``server.json`` without the summary a launch or a simulation writes."""
    return (root / SERVER_FILE).is_file() and not (root / summary_file).is_file()


UPDATE_FATES = ("received", "applied", "stale", "duplicate", "rejected", "dropped_in_flight")
"""The per-window counts of ``metrics.jsonl`` summed into the view's ``updates``."""


def server_rows_and_summary(
    root: Path, metrics: tuple[dict[str, Any], ...]
) -> tuple[tuple[dict[str, Any], ...], dict[str, Any]]:
    """The client rows (one a scenario client, from its last status) and a summary of the
    server's view (module docstring) of the server's output directory ``root`` whose windows
    are ``metrics``."""
    from fedsim.config import load_scenario

    server = read_json_object(root / SERVER_FILE)
    resolved = root / SCENARIO_FILE
    if not resolved.is_file():
        raise ConfigError(f"{root}: a server's output directory without its "
                          f"{SCENARIO_FILE} (the server writes it at its start)")
    scenario = load_scenario(resolved).scenario
    statuses = server.get("statuses")
    statuses = statuses if isinstance(statuses, Mapping) else {}
    rows: list[dict[str, Any]] = []
    for group in scenario.clients.groups:
        for client_id in group.client_ids():
            rows.append(_row(client_id, group.name, group.rounds, statuses.get(client_id)))
    final = server.get("final_evaluation")
    stop = RunStop.read(server)
    summary: dict[str, Any] = {
        "scenario": scenario.name,
        "seed": scenario.seed,
        "view": "server",
        "windows": server.get("windows") if isinstance(server.get("windows"), int) else None,
        "updates": {fate: sum(int(m[fate]) for m in metrics if isinstance(m.get(fate), int))
                    for fate in UPDATE_FATES},
        "virtual_time": _number(server.get("time")),
        "time_kind": "scenario",
        "final_accuracy": _number(final.get("accuracy")) if isinstance(final, Mapping) else None,
        "privacy": {"delta": scenario.privacy.delta},
        "stop_kind": None if stop is None else stop.kind.value,
        "stop_reason": "" if stop is None else stop.text,
        "explanation": _explanation(root, rows, stop),
    }
    return tuple(rows), summary


def _row(client_id: str, group: str, rounds: int | None, status: Any) -> dict[str, Any]:
    """One client's row from its last status (None: the server never heard from it)."""
    status = status if isinstance(status, Mapping) else {}
    state = status.get("state") if isinstance(status.get("state"), str) else "unknown"
    released = status.get("rounds")
    released = released if isinstance(released, int) and released >= 0 else None
    finished = state in FINISHED_STATES
    detail = status.get("detail")
    return {
        "client_id": client_id,
        "group": group,
        "state": state,
        "rounds": released,
        REPORTED_EPSILON: _number(status.get("epsilon")),
        "stop_reason": detail if finished and isinstance(detail, str) else "",
        "stop_kind": finished_stop_kind({}, {"state": state, "rounds": released or 0},
                                        rounds).value if finished else "",
        "stopped_at": _number(status.get("sent_at")) if finished else None,
    }


def _explanation(root: Path, rows: list[dict[str, Any]], stop: RunStop | None) -> str:
    heard = [row for row in rows if row["state"] != "unknown"]
    reported = sorted(eps for row in heard if (eps := row[REPORTED_EPSILON]) is not None)
    parts = [f"{root} is a deployed server's output directory (server.json, no summary.json): "
             f"the server's view of the run."]
    if stop is not None:
        parts.append(f"The server stopped because {stop.text}.")
    parts.append(f"{len(heard)} of {len(rows)} clients sent a status.")
    stopped: dict[str, int] = {}
    for row in heard:
        if row["stop_kind"]:
            stopped[row["stop_kind"]] = stopped.get(row["stop_kind"], 0) + 1
    for kind, count in sorted(stopped.items(), key=lambda item: -item[1]):
        parts.append(f"{count} stopped because {client_stop_phrase(kind)}.")
    running = len(rows) - sum(stopped.values())
    if running and stop is not None:
        parts.append(f"{running} had not reported a stop when the server ended the run (its "
                     f"end stops them; each client's own report in its --state directory, "
                     f"client-<id>.json, says how it stopped).")
    if reported:
        parts.append(f"Their last statuses reported eps min {reported[0]:.4g} / median "
                     f"{statistics.median(reported):.4g} / max {reported[-1]:.4g}: "
                     f"self-reports the server cannot verify, each as of its sending (a "
                     f"client sends one as it starts, changes state or stops).")
    parts.append("The clients' ledgers stay with the clients (each one's --state "
                 "directory, ledgers/<id>.jsonl and its .hwm); copied into "
                 f"{root / 'ledgers'}, they are verified here and their eps recomputed "
                 "(`fedsim ledger check FILE` checks one where it is).")
    return " ".join(parts)


def _number(value: Any) -> float | None:
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) \
        and math.isfinite(value) else None
