"""Several run directories side by side (``fedsim compare``, ``fedsim sweep``'s table).

:func:`run_row` summarises one run directory: final and best held-out accuracy, the clients'
epsilon at the scenario's delta (min / median / max, from the ledgers under pld, as
``summary.json`` reports it, with a warning where that file disagrees or a ledger or its mark
is missing), virtual time, windows, and the clients' stop reasons grouped by
kind (:func:`~fedsim.reporting.stops.stop_counts`). :func:`draw_comparison` overlays the runs'
accuracy curves and epsilon curves. :func:`relations_note` is what both tables say under eps
columns that hold add/remove and replace-one clients.

Epsilon curves are drawn per neighbouring relation (Poisson sampling is add/remove,
fixed-size batches replace-one: the numbers measure different things and are never drawn on
one axis). For each run and relation the curve is the client with the median final epsilon,
with a band between the clients with the smallest and the largest final epsilon (three
ledgers per run, so comparing runs of hundreds of clients stays quick).
"""

from __future__ import annotations

import statistics
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from fedsim.clock import seconds_text
from fedsim.reporting.ledgers import ClientLedger, ledger_gaps, read_ledgers, tuned_privacy
from fedsim.reporting.rundir import RunDirectory
from fedsim.reporting.stops import stop_counts
from fedsim.reporting.values import accuracy, epsilon_text, finite_number, printable, relative_gap

COLUMNS = ("run", "final_accuracy", "best_accuracy", "eps_min", "eps_median", "eps_max",
           "virtual_time", "windows", "ended", "stops")
EPS_RELATIVE_TOLERANCE = 1e-3
"""summary.json's eps and the ledgers' may differ by this much (its figures are rounded)."""
LEGEND_COLUMN_WIDTH = 0.30  # share of the figure's width kept for the legend beside the axes
MAX_BANDED_RUNS = 4
"""The epsilon comparison draws each run's min-max band for at most this many runs."""


def tuning_texts(run: RunDirectory) -> tuple[list[str], list[str]]:
    """A private tuning's trial (``summary.json`` ``private_tuning``) in a table: its notes and
    warnings. Its eps columns are the trial's own; the release's privacy is the tuned eps,
    verified against the sweep's tuning ledgers where they are beside it, in the words of
    ``fedsim report`` (:func:`~fedsim.reporting.ledgers.tuned_privacy`: a damaged one raises
    :class:`~fedsim.errors.ConfigError`, as a damaged client ledger does); any other trial is
    no release."""
    tuning = run.tuning
    if tuning is None:
        return [], []
    name = run.path.name
    if not tuning.release:
        return [f"note: {name}: NOT A RELEASE (a private tuning's unselected trial): it must "
                f"not be published"], []
    tuned = tuned_privacy(run, tuning)
    return ([f"note: {name}: a private tuning's release, whose privacy is not its eps columns "
             f"(this trial alone): {tuned.statement}"],
            [f"warning: {name}: {problem}" for problem in tuned.problems])


def summary_gaps(run: RunDirectory, epsilons: Iterable[float]) -> list[str]:
    """Where ``run``'s summary.json states its clients' eps min, median or max other than
    ``epsilons`` give (each client's, from its ledger, under pld at the run's own delta): one
    sentence each, which a caller prefixes with "warning: " (and the run's name). A file
    anybody can edit, checked: the one check of ``fedsim compare``'s table and ``fedsim
    report`` (a review removed a client's ledger and clients.csv row; summary.json's max was
    still the removed client's)."""
    stated = stated_spread(run)
    return [f"summary.json says {key} {said:.6g}, the ledgers give {value:.6g}"
            for key, value in eps_spread(epsilons).items()
            if (said := stated[key]) is not None
            and abs(relative_gap(said, value)) > EPS_RELATIVE_TOLERANCE]


def accuracy_gaps(run: RunDirectory) -> list[str]:
    """The accuracies ``run`` states that are none (:func:`~fedsim.reporting.values.accuracy`:
    not a number from 0 to 1), which ``fedsim report``'s and ``fedsim compare``'s figures
    leave out: one sentence each, which a caller prefixes as :func:`summary_gaps`' (a review's
    summary.json stating 1e308 was printed as 309 digits; compare then showed a metrics line's
    accuracy as the final one without a word)."""
    gaps = [f"summary.json's {key} {printable(repr(value), 40)} is not an accuracy (a number "
            f"from 0 to 1): not used"
            for key in ("final_accuracy", "best_accuracy")
            if (value := run.summary.get(key)) is not None and accuracy(value) is None]
    unusable = sum(1 for m in run.metrics
                   if m.get("accuracy") is not None and accuracy(m.get("accuracy")) is None)
    if unusable:
        gaps.append(f"{unusable} line(s) of metrics.jsonl state an accuracy that is not a "
                    f"number from 0 to 1: not used")
    return gaps


def eps_spread(epsilons: Iterable[float]) -> dict[str, float]:
    """``eps_min``, ``eps_median`` and ``eps_max`` of ``epsilons`` ({} for none): the spread a
    table and summary.json state."""
    ordered = sorted(epsilons)
    if not ordered:
        return {}
    return {"eps_min": ordered[0], "eps_median": float(statistics.median(ordered)),
            "eps_max": ordered[-1]}


def stated_spread(run: RunDirectory) -> dict[str, float | None]:
    """The spread ``run``'s summary.json states (:func:`eps_spread`'s keys; None where it
    states none, or no finite number)."""
    found = run.summary.get("privacy")
    privacy: Mapping[str, Any] = found if isinstance(found, Mapping) else {}
    return {key: finite_number(privacy.get(key.replace("eps_", "epsilon_")))
            for key in ("eps_min", "eps_median", "eps_max")}


def run_row(run: RunDirectory, label: str | None = None, *,
            ledgers: Sequence[ClientLedger] | None = None,
            delta: float | None = None) -> dict[str, Any]:
    """One run's comparison row (the keys of :data:`COLUMNS`, ``ended`` why the run ended,
    ``stops`` a dict kind -> count,
    plus ``path``, ``scenario``, ``seed``, ``delta``, ``warnings`` and ``notes``; ``ledgers``:
    the run's, if read already). Its eps are at ``delta`` (default: the run's own, its
    scenario's), computed from its ledgers."""
    from fedsim.privacy.accountant import make_accountant
    from fedsim.privacy.events import by_relation
    from fedsim.reporting.epsilon_history import EpsilonCache, final_epsilons

    summary = run.summary
    found = summary.get("privacy")
    privacy: dict[str, Any] = found if isinstance(found, dict) else {}
    stated = stated_delta(run, delta)
    # summary.json's figures are at the run's own delta: checked against the ledgers there only
    recorded = (stated_spread(run) if stated == run.delta
                else dict.fromkeys(("eps_min", "eps_median", "eps_max")))
    warnings = ledger_gaps(run)
    # The clients' eps from their ledgers under pld, as summary.json and clients.csv report it
    # (whatever accountant a ledger enforces with): summary.json's figures are what the run
    # wrote, and a file anybody can edit (checked against them).
    read = read_ledgers(run) if ledgers is None else ledgers
    from_ledgers = sorted(final_epsilons(read, EpsilonCache(stated),
                                         under=make_accountant("pld", [])).values())
    if run.server_view and len(read) < len(run.clients):
        # A server's view with some of its clients' ledgers copied in: their eps is no run's
        # (a stranger's table put 2 of 10 clients' median beside whole runs').
        warnings.append(f"warning: {run.path.name}: a deployed server's view with "
                        f"{len(read)} of its {len(run.clients)} clients' ledgers: no eps "
                        f"for the run")
        from_ledgers = []
    notes = []
    caveats = privacy.get("caveats")
    if isinstance(caveats, list) and caveats:  # (a stranger: a deployed run's went unsaid)
        notes.append(f"note: {run.path.name}: {len(caveats)} privacy caveat(s) qualify its eps "
                     f"(summary.json privacy.caveats), the first: "
                     f"{printable(str(caveats[0]), limit=200)}")
    tuning_notes, tuning_warnings = tuning_texts(run)
    notes += tuning_notes
    warnings += tuning_warnings
    if (versions := run.unevaluated_final) is not None:
        notes.append(f"note: {run.path.name}: its final acc is the last evaluation's, of model "
                     f"version {versions[0]}; the final model, version {versions[1]}, was not "
                     "evaluated")
    differences = summary.get("deployed_differences")
    if isinstance(differences, list) and differences:
        notes.append(f"note: {run.path.name}: a deployed run; what it did not do as a "
                     f"simulation does is in its summary.json deployed_differences")
    epsilons = from_ledgers or sorted(
        e for row in run.clients if (e := finite_number(row.get("epsilon"))) is not None)
    computed = eps_spread(epsilons)
    if from_ledgers and stated == run.delta:  # (summary.json's are at the run's own delta)
        warnings += [f"warning: {run.path.name}: {gap}" for gap in summary_gaps(run, epsilons)]
    eps: dict[str, float | None] = {**recorded, **computed}
    warnings += [f"warning: {run.path.name}: {gap}" for gap in accuracy_gaps(run)]
    accuracies = [a for m in run.metrics if (a := accuracy(m.get("accuracy"))) is not None]
    final = accuracy(summary.get("final_accuracy"))
    best = accuracy(summary.get("best_accuracy"))
    stops = stop_counts(row.get("stop_kind") for row in run.clients
                        if row.get("stopped_at") is not None or row.get("stop_reason"))
    return {
        "run": label or run.path.name,
        "path": str(run.path),
        "scenario": run.scenario_name,
        "seed": summary.get("seed"),
        "final_accuracy": final if final is not None else (accuracies[-1] if accuracies else None),
        "best_accuracy": best if best is not None else max(accuracies, default=None),
        **eps,
        "delta": stated,
        "virtual_time": run.virtual_time,
        "windows": summary.get("windows", len(run.metrics)),
        "ended": _ended(run),
        "stops": dict(sorted(stops.items())),
        # the neighbouring relations of its clients' eps (relations_note: a table's note)
        "relations": list(by_relation((ledger.sampling, ledger) for ledger in read)),
        "warnings": warnings,
        "notes": notes,
    }


def stated_delta(run: RunDirectory, delta: float | None) -> float:
    """The delta ``run``'s eps are stated at: ``delta``, else the run's own."""
    return run.delta if delta is None else delta


def delta_note(runs: Sequence[RunDirectory], labels: Sequence[str],
               delta: float | None = None) -> str | None:
    """What to say when ``runs`` state their eps at different deltas (each its scenario's):
    the same mechanism reads a smaller eps at a larger delta, so their eps are not comparable
    as numbers (a stranger read a run at delta 1e-3 as spending half the privacy of the same
    run at 1e-5); or, with one ``delta`` for all, when it is above a run's own (a review's
    ``--delta 0.5`` printed every eps as 0 with no word). None when neither."""
    if delta is not None:
        weaker = [label for run, label in zip(runs, labels, strict=True) if delta > run.delta]
        if not weaker:
            return None
        return (f"note: delta {delta:g} is larger than the scenario's own of {', '.join(weaker)}: "
                f"their eps read smaller at it, a weaker guarantee (a delta near or above 1 / "
                f"a client's records allows a whole record to leak)")
    if len({run.delta for run in runs}) < 2:
        return None
    each = ", ".join(f"{label} {run.delta:g}" for run, label in zip(runs, labels, strict=True))
    return (f"note: the runs state eps at different deltas ({each}): the same mechanism reads "
            f"a smaller eps at a larger delta, so these eps are not comparable as numbers; "
            f"--delta D states every run's at one delta (from its ledgers)")


_NAMED_RUNS = 5
"""How many runs a note names before it counts the rest."""


def _named(names: Sequence[str]) -> str:
    shown = ", ".join(names[:_NAMED_RUNS])
    return shown + (f" and {len(names) - _NAMED_RUNS} more" if len(names) > _NAMED_RUNS else "")


def relations_note(rows: Sequence[Mapping[str, Any]]) -> str | None:
    """What to say under a table of runs (``fedsim compare``'s, ``fedsim sweep``'s: their
    rows from :func:`run_row`, ``run`` and ``relations``) whose eps columns hold clients of
    both neighbouring relations, in one run or across runs: add/remove (Poisson sampling)
    and replace-one (fixed-size) eps are guarantees about different neighbours, not comparable
    numbers (a stranger read one spread over both). None where every eps is of one relation."""
    runs = [(str(row.get("run")), list(held)) for row in rows if (held := row.get("relations"))]
    relations = sorted({relation for _, held in runs for relation in held})
    if len(relations) < 2:
        return None
    both = " and ".join(relations)
    why = ("guarantees about different neighbours, not comparable as numbers (fedsim report "
           "DIR and the epsilon plots keep the relations apart)")
    spanning = [name for name, held in runs if len(held) > 1]
    if len(spanning) == len(runs):
        whose = f"{spanning[0]}: its" if len(runs) == 1 else "every run's"
        return f"note: {whose} eps columns span {both} clients, {why}"
    held_by = [(f"{relation} only", [name for name, held in runs if held == [relation]])
               for relation in relations] + [("both", spanning)]
    where = "; ".join(f"{what}: {_named(names)}" for what, names in held_by if names)
    return f"note: the eps columns hold {both} clients ({where}), {why}"


def _ended(run: RunDirectory) -> str | None:
    """Why the run ended, as its summary's ``stop_kind`` says (an interrupted run's outputs
    are partial: said with its signal, so no table reads it as a finished run's)."""
    if run.interrupted:
        return f"interrupted ({run.interrupted})"
    kind = run.summary.get("stop_kind")
    return kind if isinstance(kind, str) and kind else None


def unique_labels(paths: Sequence[Path]) -> list[str]:
    """Short names for run directories: the directory name, with parents added until unique."""
    parts = [p.resolve().parts for p in paths]
    depth = 1
    while True:
        labels = ["/".join(p[-depth:]) for p in parts]
        if len(set(labels)) == len(labels) or depth >= max(len(p) for p in parts):
            return labels
        depth += 1


def _cell(value: Any, key: str) -> str:
    if value is None:
        return "-"
    if key == "stops":
        return ", ".join(f"{kind} {n}" for kind, n in value.items()) or "-"
    if key in ("final_accuracy", "best_accuracy"):
        return f"{value:.4f}"
    if key.startswith("eps_") or key.endswith("_eps_max"):  # (tuned_eps_max: a sweep's)
        return epsilon_text(value)
    if key == "virtual_time":
        return seconds_text(value)
    return str(value)


def format_table(rows: Sequence[dict[str, Any]], columns: Sequence[str] = COLUMNS) -> list[str]:
    """The rows as an aligned text table (header first)."""
    headers = {"final_accuracy": "final acc", "best_accuracy": "best acc", "eps_min": "eps min",
               "eps_median": "eps median", "eps_max": "eps max",
               # (virtual seconds of a simulation, scenario seconds of a deployed run)
               "virtual_time": "time s",
               "stops": "stopped (by kind)"}
    table = [[headers.get(c, c) for c in columns]]
    table += [[_cell(row.get(c), c) for c in columns] for row in rows]
    widths = [max(len(line[i]) for line in table) for i in range(len(columns))]
    text = ["  ".join(cell.ljust(w) for cell, w in zip(line, widths, strict=True)).rstrip()
            for line in table]
    return [text[0], "  ".join("-" * w for w in widths), *text[1:]]


# ---------------------------------------------------------------------------------------------
# Plots


def _figure(rows: int) -> tuple[Any, list[Any]]:
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    from fedsim.reporting.figures import DPI

    figure = Figure(figsize=(10.0, 3.6 * rows + 0.6), dpi=DPI)
    FigureCanvasAgg(figure)
    return figure, [figure.add_subplot(rows, 1, i + 1) for i in range(rows)]


def _save(figure: Any, path: Path, *, suptitle: bool = False) -> Path:
    from fedsim.reporting.figures import save

    margin = 0.45 / figure.get_figheight()  # inches of room above and below the panels
    top = 1.0 - (2.0 if suptitle else 1.0) * margin  # a figure title above the panels' own
    return save(figure, path, left=0.08, right=1.0 - LEGEND_COLUMN_WIDTH, bottom=2.2 * margin,
                top=top, hspace=0.5)


def _style(index: int, count: int) -> dict[str, Any]:
    """Run ``index`` of ``count``: its colour, a dash pattern and a width that falls from the
    first run to the last, so runs with equal curves still show each line."""
    return {"color": f"C{index % 10}", "linestyle": ("-", "--", "-.", ":")[index % 4],
            "linewidth": 3.2 - 2.2 * index / max(count - 1, 1)}


def _legend_beside(axes: Any) -> None:
    import textwrap

    from fedsim.reporting.figures import LEGEND_LABEL_CHARS

    handles, labels = axes.get_legend_handles_labels()
    if handles:
        # wrapped: the column beside the axes is a third of the figure (a stranger's
        # "...(interrupted by SIGTERM)" ran off its edge)
        axes.legend(handles, [textwrap.fill(label, LEGEND_LABEL_CHARS) for label in labels],
                    loc="upper left", bbox_to_anchor=(1.02, 1.0), borderaxespad=0.0,
                    fontsize=8, frameon=False)


def _label(run: RunDirectory, label: str) -> str:
    """A run's legend label; an interrupted run says so."""
    return f"{label} (interrupted by {run.interrupted})" if run.interrupted else label


def _time_axis(runs: Sequence[RunDirectory]) -> tuple[str, str]:
    """The time axis's label and name: the runs' own (virtual or scenario time), or both."""
    labels = sorted({run.time_label for run in runs})
    names = sorted({run.time_name for run in runs})
    if len(labels) == 1:
        return labels[0], names[0]
    return "virtual or scenario time (s; see each run)", " / ".join(names)


def _draw_run_line(axes: Any, run: RunDirectory, times: Sequence[float], values: Sequence[float],
                   label: str, style: dict[str, Any]) -> None:
    """A run's curve, with a marker on every point when it has few (a run with one evaluated
    window is a point, which a line alone would not show) and, for an interrupted run, a cross
    where it stopped."""
    axes.plot(times, values, label=_label(run, label), marker="o" if len(times) < 12 else None,
              markersize=4, **style)
    if run.interrupted and len(times):
        axes.plot([times[-1]], [values[-1]], linestyle="none", marker="X", markersize=10,
                  color=style["color"], markeredgecolor="black")


def draw_accuracy_comparison(runs: Sequence[RunDirectory], labels: Sequence[str],
                             path: Path) -> Path:
    """Held-out accuracy against time, one line per run (axis fitted to the values); the
    final model's evaluation of each run that has one as a star, the end of an interrupted run
    as a cross."""
    from fedsim.reporting.plots import accuracy_limits, final_point

    figure, (axes,) = _figure(1)
    values: list[float] = []
    for index, (run, label) in enumerate(zip(runs, labels, strict=True)):
        points = [(m["time"], a) for m in run.metrics if (a := accuracy(m.get("accuracy"))) is not None]
        style = _style(index, len(runs))
        if points:
            times, accuracies = zip(*points, strict=True)
            _draw_run_line(axes, run, times, accuracies, label, style)
            values.extend(accuracies)
        final = final_point(run)
        if final is not None:
            axes.plot([final[0]], [final[1]], linestyle="none", marker="*", markersize=11,
                      color=style["color"], markeredgecolor="black",
                      label=None if points else _label(run, label))
            values.append(final[1])
    if any(run.interrupted for run in runs):
        axes.plot([], [], linestyle="none", marker="X", color="0.5", markeredgecolor="black",
                  label="an interrupted run's last point")
    if any(final_point(run) is not None for run in runs):
        axes.plot([], [], linestyle="none", marker="*", color="0.5", markeredgecolor="black",
                  label="final model, evaluated at the end")
    axis_label, name = _time_axis(runs)
    axes.set_xlabel(axis_label)
    axes.set_ylabel("held-out accuracy")
    axes.set_ylim(*(accuracy_limits(values) if values else (0.0, 1.0)))
    axes.grid(True, alpha=0.3)
    axes.set_title(f"accuracy over {name}")
    _legend_beside(axes)
    return _save(figure, path)


def _relation_curves(run: RunDirectory, read: Sequence[ClientLedger], delta: float
                     ) -> dict[str, tuple[Any, Any, Any, Any]]:
    """Neighbouring relation -> (times, min, median, max) epsilon of ``run``'s clients at each
    time (``read``: its ledgers), as the run's own epsilon plot takes them: over every client,
    or past :data:`~fedsim.reporting.epsilon_history.EXACT_BAND_EVALUATIONS` over the clients
    at :data:`~fedsim.reporting.epsilon_history.QUANTILES` of final eps. (The curves of the
    clients of least, median and most final eps crossed: a stranger saw the "median" line
    leave its own band, where a client spent its budget early.)"""
    import numpy as np

    from fedsim.privacy.events import by_relation
    from fedsim.reporting.epsilon_history import (
        EXACT_BAND_EVALUATIONS,
        QUANTILES,
        TIME_GRID_POINTS,
        EpsilonCache,
        epsilon_history,
        final_epsilons,
        quantile_clients,
        time_grid,
    )

    ledgers = [lg for lg in read if lg.steps]
    cache = EpsilonCache(delta)
    curves = {}
    for relation, members in by_relation((lg.steps[0][1].sampling, lg) for lg in ledgers).items():
        drawn = members
        if len(members) * TIME_GRID_POINTS > EXACT_BAND_EVALUATIONS:
            chosen = {lg.client_id: lg for lg in members}
            drawn = [chosen[c] for c in quantile_clients(final_epsilons(members, cache),
                                                         QUANTILES)]
        end = max(run.virtual_time, max(lg.steps[-1][0] for lg in members))
        history = epsilon_history(drawn, time_grid(end, TIME_GRID_POINTS), delta, cache)
        eps = history.epsilon
        curves[relation] = (history.times, eps.min(axis=0), np.median(eps, axis=0),
                            eps.max(axis=0))
    return curves


def draw_epsilon_comparison(runs: Sequence[RunDirectory], labels: Sequence[str],
                            path: Path, ledgers: Sequence[Sequence[ClientLedger]] | None = None,
                            delta: float | None = None) -> Path:
    """Epsilon against virtual time per neighbouring relation: for each run its clients' median
    at each time, with a band from their least to their most spent (``ledgers``: each run's, if
    read already), at ``delta`` (default: each run's own; runs at different deltas say theirs
    in the legend)."""
    read = ledgers if ledgers is not None else [read_ledgers(run) for run in runs]
    stated = [stated_delta(run, delta) for run in runs]
    curves = [_relation_curves(run, lgs, at) for run, lgs, at in zip(runs, read, stated,
                                                                      strict=True)]
    relations = sorted({relation for run_curves in curves for relation in run_curves})
    figure, panels = _figure(max(len(relations), 1))
    deltas = sorted(set(stated))
    # (a stranger's seven overlapping bands made one brown area: past a few runs, medians only)
    banded = len(runs) <= MAX_BANDED_RUNS
    if len(deltas) > 1:  # (a stranger read a run at 1e-3 as spending half of one at 1e-5)
        labels = [f"{label} (delta {at:g})" for label, at in zip(labels, stated, strict=True)]
    for axes, relation in zip(panels, relations, strict=False):
        for index, (label, run_curves) in enumerate(zip(labels, curves, strict=True)):
            if relation not in run_curves:
                continue
            times, low, mid, high = run_curves[relation]
            style = _style(index, len(runs))
            _draw_run_line(axes, runs[index], times, mid, label, style)
            if banded:
                axes.fill_between(times, low, high, color=style["color"], alpha=0.15,
                                  linewidth=0)
        axes.set_title(f"{relation} neighbours: clients' median"
                       + (", band min-max" if banded else ""), fontsize=10)
        axes.set_xlabel(_time_axis(runs)[0])
        axes.set_ylabel(f"epsilon (delta = {deltas[0]:g})" if len(deltas) == 1
                        else "epsilon (each run at its delta: legend)")
        axes.set_ylim(bottom=0.0)
        axes.grid(True, alpha=0.3)
        _legend_beside(axes)
    if not relations:
        panels[0].text(0.5, 0.5, "no client released an update", ha="center", va="center",
                       transform=panels[0].transAxes)
    # (a stranger: the accuracy figure said what it showed, this one only per panel)
    figure.suptitle(f"privacy spent over {_time_axis(runs)[1]}: each run's clients' epsilon",
                    x=(0.08 + 1.0 - LEGEND_COLUMN_WIDTH) / 2)  # over the panels
    return _save(figure, path, suptitle=True)


def draw_comparison(runs: Sequence[RunDirectory], labels: Sequence[str], out_dir: Path,
                    ledgers: Sequence[Sequence[ClientLedger]] | None = None,
                    delta: float | None = None) -> list[Path]:
    """``accuracy.png`` and ``epsilon.png`` of the runs into ``out_dir`` (``ledgers``: each
    run's, if read already; ``delta``: every run's eps at it, default each run's own)."""
    return [draw_accuracy_comparison(runs, labels, out_dir / "accuracy.png"),
            draw_epsilon_comparison(runs, labels, out_dir / "epsilon.png", ledgers, delta)]
