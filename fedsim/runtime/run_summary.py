"""What a run's ``summary.json`` says (:func:`summary_of`): its totals, its privacy figures by
neighbouring relation, and the explanation in words of why the run stopped and what qualifies
its figures (stopped clients, deployed clocks, resumes, crashes and emulated links, updates
never acknowledged, schedules, privacy caveats, warnings), from a :class:`~fedsim.runtime.
run_record.RunRecord` and its ``clients.csv`` rows."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from fedsim.clock import seconds_text
from fedsim.privacy.epsilon_text import by_relation_text, epsilon_alike, epsilon_range
from fedsim.privacy.events import by_relation
from fedsim.runtime.actors.exposure import privacy_caveats
from fedsim.runtime.actors.stops import ClientStopKind, client_stop_phrase, stop_fields
from fedsim.runtime.run_record import RELEASED_UNACKNOWLEDGED, RunRecord, StoppedClient

__all__ = ["DEPLOYED_CLOCKS", "epsilon_by_relation", "summary_of", "unacknowledged_sentence"]


def unacknowledged_sentence(total: int, clients: int) -> str:
    """The explanation's sentence on ``total`` released updates of ``clients`` clients the
    server never acknowledged (``fedsim report``'s and a launch's summary's)."""
    return (f"{total} update(s) released by {clients} client(s) were never acknowledged by the "
            f"server when the run ended: charged to those clients' privacy budgets, perhaps "
            f"never applied (each client's client-<id>.json lists them as unacknowledged).")


DEPLOYED_CLOCKS = (
    "(A deployed client's stop time is on the server's clock, the run's, as the client measured "
    "its own clock's lead over it from the server's messages (its own clock starts with its "
    "process, resumed where its ledger ends, and never goes back: its ledger's times can read "
    "ahead of the server's); a client that stopped as the run ended, told by the server, "
    "stopped at the run's end.)")


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
        parts.append(
            f"Per-client epsilon at delta={record.scenario.privacy.delta:g} (pld) "
            + (("is " if epsilon_alike(min(epsilons), max(epsilons)) else "ranges from ")
               + f"{epsilon_range(min(epsilons), max(epsilons))}."
               if len(relations) == 1
               else by_relation_text({relation: epsilon_range(r["epsilon_min"], r["epsilon_max"])
                                      for relation, r in relations.items()}) + ".")
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


def summary_of(record: RunRecord, rows: list[dict[str, Any]]) -> dict[str, Any]:
    """What ``summary.json`` says of ``record`` (``rows``: its ``clients.csv`` rows,
    :func:`~fedsim.runtime.run_outputs.client_rows`)."""
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
