"""The plots of a run directory: accuracy, per-client epsilon over time, trade-off curves.

:func:`draw_all` reads a run directory (see :mod:`fedsim.reporting.rundir`) and writes

* ``plots/accuracy.png``: held-out accuracy against virtual time on an axis fitted to the
  values, the final model's evaluation at the run's end as a star, the server step size on a
  secondary axis, the legend below the axes;
* ``plots/epsilon.png``: the clients' epsilon at the scenario's delta against virtual time,
  from their ledgers, one panel per neighbouring relation (Poisson sampling with add/remove
  neighbours, fixed-size batches with replace-one neighbours: their eps measure different
  things and never share an axis). One line per client group (its median client, with a band
  from its least to its most spent client; the label says how many clients, and when their
  curves are identical), drawn thick to thin with distinct dash patterns, so none hides
  another; with many groups, a few representative clients over the min / median / max band.
  Each budget is a line of its own style; legends stand beside the axes;
* ``plots/tradeoff.png``: per relation, the trade-off curves (type I error alpha against type
  II error beta) of one client per group (the group's median spender; the title says how many
  of how many clients), from their accountant (a lower bound on the true curve for ``pld``),
  against the Gaussian-DP curve G_mu fitted to them, and the piecewise-linear curve of the
  single (eps, delta) pair they report (Dong, Roth & Su, "Gaussian Differential Privacy",
  Prop. 2.5 / Def. 2.3).

An interrupted run (``summary.interrupted``) says so in every title and has a vertical line
where it stopped.

Every number is each client's own guarantee about its own data set (per client, per
sample); the neighbouring relation is the one of the client's sampling scheme.

Figures are drawn with the Agg backend on private Figure objects (no pyplot state) at a
fixed dpi and with no software/time stamp in the PNG metadata, so the same run directory
always gives byte-identical files.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import matplotlib
import numpy as np
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from fedsim.privacy.accountant import Accountant, make_accountant
from fedsim.privacy.events import NEIGHBOURING_RELATION, GaussianStep, group_steps
from fedsim.privacy.fdp import default_alphas, eps_delta_tradeoff, fit_gdp_mu, tradeoff_curve
from fedsim.privacy.gdp import gdp_tradeoff
from fedsim.reporting.ledgers import ClientLedger, read_ledgers
from fedsim.reporting.rundir import RunDirectory

DPI = 100
FIGSIZE = (7.5, 4.5)
TRADEOFF_FIGSIZE = (5.6, 5.6)
# Enough points for a smooth curve, few enough that a 100-client run reports in seconds.
TIME_GRID_POINTS = 25
MIN_TIME_GRID_POINTS = 10
# Clients drawn individually; beyond this the epsilon plot shows a band and representatives.
MAX_INDIVIDUAL_CLIENTS = 8
# Above this many (client, time) evaluations the epsilon plot shows quantile clients only.
EXACT_BAND_EVALUATIONS = 1200
QUANTILES = (0.0, 0.1, 0.25, 0.5, 0.75, 0.9, 1.0)
TRADEOFF_CLIENTS = 3
# Dense near alpha = 0, where DP trade-off curves bend; the GDP fit is taken on this grid.
ALPHA_GRID = default_alphas(801)
# PNG metadata: matplotlib writes its version as "Software" unless told not to.
PNG_METADATA: dict[str, Any] = {"Software": None}


@dataclass
class EpsilonCache:
    """eps(delta) of a history, keyed by its grouped steps and the accountant settings.

    Clients with the same posture that have taken the same number of steps share one
    computation; the prefixes of a long ledger share most of theirs.
    """

    delta: float
    values: dict[tuple[Any, ...], float] = field(default_factory=dict)

    def epsilon(self, accountant: Accountant, steps: Iterable[GaussianStep]) -> float:
        grouped = group_steps(steps)
        if not grouped:
            return 0.0
        settings = accountant.settings()
        key = (accountant.name, _hashable(settings), grouped)
        if key not in self.values:
            fresh = make_accountant(accountant.name, grouped, **settings)
            self.values[key] = float(fresh.epsilon(self.delta))
        return self.values[key]


def _hashable(value: Any) -> Any:
    """``value`` as a cache key's part: mappings as sorted pairs, lists as tuples (an rdp
    accountant's settings hold its list of orders: as a list the key raised TypeError)."""
    if isinstance(value, Mapping):
        return tuple(sorted((key, _hashable(item)) for key, item in value.items()))
    if isinstance(value, list | tuple):
        return tuple(_hashable(item) for item in value)
    return value


@dataclass(frozen=True)
class EpsilonHistory:
    """Some clients' epsilon at ``delta`` at each of ``times`` (rows follow ``client_ids``)."""

    times: np.ndarray
    client_ids: tuple[str, ...]
    epsilon: np.ndarray  # shape (clients, times)
    accountant: str
    delta: float

    def final(self) -> dict[str, float]:
        return {cid: float(row[-1]) for cid, row in zip(self.client_ids, self.epsilon, strict=True)}


def time_grid(end: float, points: int = TIME_GRID_POINTS) -> np.ndarray:
    """``points`` evenly spaced virtual times from 0 to ``end`` (just 0 for an empty run)."""
    if not end > 0:
        return np.zeros(1)
    return np.linspace(0.0, float(end), points)


def accountant_names(ledgers: Iterable[ClientLedger]) -> str:
    return ", ".join(sorted({ledger.accountant.name for ledger in ledgers})) or "none"


def final_epsilons(ledgers: Sequence[ClientLedger], cache: EpsilonCache, *,
                   under: Accountant | None = None) -> dict[str, float]:
    """Each client's epsilon at ``cache.delta`` over its whole ledger, under its ledger's own
    accountant or ``under``'s name and settings (e.g. ``pld``, as summary.json reports)."""
    return {lg.client_id: cache.epsilon(under or lg.accountant, (s for _, s in lg.steps))
            for lg in ledgers}


def epsilon_history(ledgers: Sequence[ClientLedger], times: np.ndarray, delta: float,
                    cache: EpsilonCache | None = None) -> EpsilonHistory:
    """eps at ``delta`` spent by each client up to (and including) each of ``times``.

    The same numbers as each ledger's own ``epsilon_history``, computed through a cache
    shared by all clients (see :class:`EpsilonCache`).
    """
    cache = cache if cache is not None else EpsilonCache(delta)
    values = np.zeros((len(ledgers), len(times)))
    for row, ledger in enumerate(ledgers):
        record_times = np.array([t for t, _ in ledger.steps], dtype=float)
        for column, moment in enumerate(times):
            taken = int(np.searchsorted(record_times, moment, side="right"))
            values[row, column] = cache.epsilon(ledger.accountant,
                                                (s for _, s in ledger.steps[:taken]))
    return EpsilonHistory(np.asarray(times, dtype=float), tuple(lg.client_id for lg in ledgers),
                          values, accountant_names(ledgers), delta)


def quantile_clients(final: dict[str, float], quantiles: Sequence[float]) -> list[str]:
    """Client ids at the given quantiles of final epsilon (ties by id), distinct, in order."""
    ordered = sorted(final, key=lambda cid: (final[cid], cid))
    if not ordered:
        return []
    picks = [ordered[round(q * (len(ordered) - 1))] for q in quantiles]
    return list(dict.fromkeys(picks))


def representative_clients(final: dict[str, float], count: int = 3) -> list[str]:
    """Client ids with the smallest, median and largest final epsilon (ties by id), distinct."""
    if len(final) <= count:
        return sorted(final, key=lambda cid: (final[cid], cid))
    return quantile_clients(final, [i / (count - 1) for i in range(count)])


# -- the figures -----------------------------------------------------------------------------------
# Each neighbouring relation gets its own panel: eps under add/remove and under replace-one
# neighbours measure different things and are never put on one axis.
RELATION_TITLES = {
    "poisson": "Poisson sampling: add/remove neighbours (noise C sigma)",
    "fixed": "fixed-size batches: replace-one neighbours (noise 2 C sigma)",
}
# Distinct styles per budget line (colour and dash pattern).
BUDGET_STYLES: tuple[tuple[str, Any], ...] = (
    ("tab:red", ":"), ("black", "--"), ("tab:brown", "-."), ("tab:pink", (0, (1, 4))),
    ("tab:olive", (0, (6, 2, 1, 2, 1, 2))),
)
# Curves drawn one by one: thick first, thinner and differently dashed on top, so a curve that
# lies on another still shows at its edges.
CURVE_STYLES: tuple[Any, ...] = ("-", "--", "-.", ":", (0, (5, 1)), (0, (3, 1, 1, 1)))
LEGEND_OUTSIDE: dict[str, Any] = {"loc": "upper left", "bbox_to_anchor": (1.02, 1.0),
                                  "borderaxespad": 0.0, "fontsize": 8}
# A group's colour, the same on every plot of a run; none is a budget line's colour (red,
# black, brown, pink, olive). (Orange is also the accuracy plot's step size: no group is there.)
GROUP_COLOURS: tuple[str, ...] = ("tab:blue", "tab:orange", "tab:green", "tab:purple",
                                  "tab:cyan", "tab:gray", "navy", "darkgoldenrod")


def group_styles(groups: Iterable[str]) -> dict[str, tuple[str, Any]]:
    """Each of a run's groups (sorted by name) -> its (colour, dash), the same in every panel
    and every plot of the run, so that a group is one colour wherever it is drawn."""
    return {name: (GROUP_COLOURS[index % len(GROUP_COLOURS)],
                   CURVE_STYLES[index % len(CURVE_STYLES)])
            for index, name in enumerate(sorted(set(groups)))}


def _new_figure(figsize: tuple[float, float] = FIGSIZE, rows: int = 1) -> tuple[Figure, list[Any]]:
    figure = Figure(figsize=figsize, dpi=DPI)
    FigureCanvasAgg(figure)
    return figure, [figure.add_subplot(rows, 1, row + 1) for row in range(rows)]


def _save(figure: Figure, path: Path, *, left: float = 0.09, right: float = 0.9,
          bottom: float = 0.1, top: float = 0.93, hspace: float = 0.35) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    # Fixed margins (room for legends beside the axes): as good as tight_layout for these
    # figures, at a fraction of its cost, but for long tick labels (0.6025 on an axis fitted
    # to close values), which would push the axis label out of the figure: widened to fit.
    figure.subplots_adjust(left=left, right=right, bottom=bottom, top=top, hspace=hspace)
    spill = _left_spill(figure)
    if spill > 0:
        figure.subplots_adjust(left=min(left + spill + LABEL_PAD, right - 0.2))
    return save_png(figure, path)


LABEL_PAD = 0.01
"""Figure width left of the leftmost label once a margin has been widened to fit it."""


def _left_spill(figure: Figure) -> float:
    """How far (a fraction of the figure's width) the axes' labels reach left of the figure."""
    figure.draw_without_rendering()
    renderer = figure.canvas.get_renderer()  # type: ignore[attr-defined]
    boxes = [axes.get_tightbbox(renderer) for axes in figure.axes]
    left = min((box.x0 for box in boxes if box is not None), default=0.0)
    return max(0.0, -left / figure.bbox.width)


def save_png(figure: Figure, path: Path) -> Path:
    """Write ``figure`` as ``path`` (a PNG) by replacing it: a file left at that name by
    someone else - a symbolic link in a run directory handed over, pointing anywhere - is
    replaced, never written through (a review: ``plots/accuracy.png`` linked to another file
    had that file overwritten by ``fedsim report``)."""
    from fedsim.atomic import write_atomically

    write_atomically(path, lambda handle: figure.savefig(handle, dpi=DPI, format="png",
                                                          metadata=PNG_METADATA),
                     durability="file")
    return path


def interruption_note(run: RunDirectory) -> str:
    """" (interrupted by SIGINT: partial run)" for an interrupted run, else ""."""
    return f" (interrupted by {run.interrupted}: partial run)" if run.interrupted else ""


def mark_interruption(axes: Any, run: RunDirectory, colour: str = "tab:red",
                      label: str | None = None) -> None:
    """A vertical line where an interrupted run stopped (nothing for a finished run)."""
    if run.interrupted:
        axes.axvline(run.virtual_time, color=colour, linestyle=(0, (4, 2)), linewidth=1.2,
                     label=label or f"interrupted by {run.interrupted}")


def accuracy_limits(values: Sequence[float]) -> tuple[float, float]:
    """The accuracy axis fitted to ``values`` with a margin of 8 % of their range (at least
    0.01), kept within [0, 1], so that 0.73-0.88 is not flattened on a fixed 0-1 axis."""
    low, high = min(values), max(values)
    margin = max(0.08 * (high - low), 0.01)
    return max(0.0, low - margin), min(1.0, high + margin)


def final_point(run: RunDirectory) -> tuple[float, float, int] | None:
    """(time, accuracy, version) of the final model's evaluation at the run's end (None: an
    interrupted or older run, where ``final_accuracy`` is a periodic evaluation's)."""
    accuracy = run.summary.get("final_accuracy")
    version = run.summary.get("final_evaluated_version")
    if run.interrupted or not isinstance(accuracy, int | float) or not isinstance(version, int) \
            or version != run.summary.get("final_version"):
        return None
    return run.virtual_time, float(accuracy), version


def _evaluations(evaluated: Sequence[Mapping[str, Any]]) -> str:
    """How many periodic evaluations there were and, when evenly spaced, every how many
    windows ("26 evaluations, every 40 windows"), from the metrics themselves."""
    count = f"{len(evaluated)} evaluation{'s' if len(evaluated) != 1 else ''}"
    windows = [m.get("window") for m in evaluated]
    if len(windows) < 2 or not all(isinstance(w, int) for w in windows):
        return count
    gaps = {b - a for a, b in zip(windows, windows[1:], strict=False)}  # type: ignore[operator]
    return f"{count}, every {gaps.pop()} windows" if len(gaps) == 1 else count


def draw_accuracy(run: RunDirectory, path: Path) -> Path:
    """Held-out accuracy against virtual time (the axis fitted to the values), the final
    model's evaluation at the run's end as a star, the server step size on a secondary axis,
    an interruption marked; the legend below the axes."""
    figure, (axes,) = _new_figure((FIGSIZE[0], FIGSIZE[1] + 0.5))
    evaluated = [m for m in run.metrics if isinstance(m.get("accuracy"), int | float)]
    values = [float(m["accuracy"]) for m in evaluated]
    if evaluated:
        axes.plot(
            [m["time"] for m in evaluated],
            values,
            color="tab:blue",
            marker="." if len(evaluated) < 60 else None,
            label=f"held-out accuracy, {_evaluations(evaluated)} (left axis)",
        )
    final = final_point(run)
    if final is not None:
        axes.plot([final[0]], [final[1]], linestyle="none", marker="*", markersize=12,
                  color="tab:blue", markeredgecolor="black",
                  label=f"final model (version {final[2]}): {final[1]:.4f}")
        values.append(final[1])
    if not values:
        axes.text(
            0.5, 0.5, "no window was evaluated", ha="center", va="center", transform=axes.transAxes
        )
    mark_interruption(axes, run)
    axes.set_xlabel(run.time_label)
    axes.set_ylabel("accuracy", color="tab:blue")
    axes.set_ylim(*(accuracy_limits(values) if values else (0.0, 1.0)))
    axes.grid(True, alpha=0.3)
    handles, labels = axes.get_legend_handles_labels()
    stepped = [m for m in run.metrics if isinstance(m.get("step_size"), int | float)]
    if stepped:
        twin = axes.twinx()
        twin.step(
            [m["time"] for m in stepped],
            [m["step_size"] for m in stepped],
            where="post",
            color="tab:orange",
            linestyle="--",
            alpha=0.9,
            label="server step size (right axis)",
        )
        twin.set_ylabel("server step size", color="tab:orange")
        twin.set_ylim(bottom=0.0)
        twin_handles, twin_labels = twin.get_legend_handles_labels()
        handles, labels = handles + twin_handles, labels + twin_labels
    if handles:
        axes.legend(handles, labels, fontsize=8, loc="upper center", ncol=2,
                    bbox_to_anchor=(0.5, -0.13), frameon=False)
    axes.set_title(f"{run.scenario_name}: accuracy over {run.time_name}{interruption_note(run)}",
                   fontsize=11)
    return _save(figure, path, bottom=0.24)


def _budgets(run: RunDirectory, groups: set[str] | None = None) -> dict[float, list[str]]:
    """Each distinct budget eps in clients.csv (of ``groups``, if given), with its groups."""
    found: dict[float, set[str]] = {}
    for row in run.clients:
        value = row.get("budget_epsilon")
        group = str(row.get("group") or "?")
        if groups is not None and group not in groups:
            continue
        if isinstance(value, int | float) and math.isfinite(value):
            found.setdefault(float(value), set()).add(group)
    return {budget: sorted(names) for budget, names in sorted(found.items())}


def _same_curves(ids: Sequence[str], rows: np.ndarray) -> list[tuple[list[str], np.ndarray]]:
    """Curves that are equal (to 1e-9) merged: (client ids, curve), in first-seen order."""
    merged: list[tuple[list[str], np.ndarray]] = []
    for cid, row in zip(ids, rows, strict=True):
        for names, curve in merged:
            if np.allclose(curve, row, rtol=1e-9, atol=1e-12):
                names.append(cid)
                break
        else:
            merged.append(([cid], row))
    return merged


def _names(ids: Sequence[str], shown: int = 3) -> str:
    if len(ids) <= shown:
        return ", ".join(ids)
    return f"{', '.join(ids[:shown - 1])} and {len(ids) - shown + 1} more (same curve)"


@dataclass(frozen=True)
class EpsilonPanel:
    """The clients of one neighbouring relation on the epsilon plot."""

    sampling: str
    history: EpsilonHistory
    population: int  # clients of this relation in the run (``history`` may hold fewer)
    labels: dict[str, str] = field(default_factory=dict)  # quantile names, when fewer
    groups: frozenset[str] = frozenset()
    final: dict[str, float] = field(default_factory=dict)  # every member's final eps
    client_groups: dict[str, str] = field(default_factory=dict)  # client id -> its group
    run_groups: frozenset[str] = frozenset()  # every group of the run (its colours)


def _draw_individual(axes: Any, ids: Sequence[str], rows: np.ndarray, times: np.ndarray,
                     labels: dict[str, str], colours: Sequence[Any] | None = None) -> None:
    merged = _same_curves(ids, rows)
    count = len(merged)
    for index, (names, curve) in enumerate(merged):
        width = 3.2 - 2.0 * index / max(count - 1, 1)
        label = _names(names)
        if len(names) == 1 and names[0] in labels:
            label = f"{names[0]} ({labels[names[0]]})"
        colour = colours[index] if colours is not None else f"C{index % 10}"
        axes.plot(times, curve, color=colour, linewidth=width,
                  linestyle=CURVE_STYLES[index % len(CURVE_STYLES)], label=label)


def _by_group(history: EpsilonHistory, client_groups: dict[str, str]) -> dict[str, list[int]]:
    """Group name -> the rows of its clients in ``history`` (groups sorted by name); {} when a
    client's group is unknown (no clients.csv)."""
    if not all(cid in client_groups for cid in history.client_ids):
        return {}
    rows: dict[str, list[int]] = {}
    for row, cid in enumerate(history.client_ids):
        rows.setdefault(client_groups[cid], []).append(row)
    return dict(sorted(rows.items()))


def _draw_groups(axes: Any, history: EpsilonHistory, groups: dict[str, list[int]],
                 styles: dict[str, tuple[str, Any]]) -> None:
    """One line per group: its only client, or its clients' median with a band from the least
    to the most spent (a band of zero width when their curves are identical, which the label
    says, so identical curves never hide each other). Thick to thin, each group in its colour
    and dash of the run (``styles``: :func:`group_styles`)."""
    times, count = history.times, len(groups)
    for index, (name, rows) in enumerate(groups.items()):
        colour, dash = styles[name]
        width = 3.2 - 1.8 * index / max(count - 1, 1)
        eps = history.epsilon[rows]
        if len(rows) == 1:
            axes.plot(times, eps[0], color=colour, linewidth=width, linestyle=dash,
                      label=f"{name}: {history.client_ids[rows[0]]}")
            continue
        low, high = eps.min(axis=0), eps.max(axis=0)
        same = bool(np.allclose(low, high, rtol=1e-9, atol=1e-12))
        if not same:
            axes.fill_between(times, low, high, color=colour, alpha=0.2, linewidth=0)
        # A band thinner than the line says nothing: say how close the curves are instead.
        close = bool(np.all(high - low <= 0.01 * np.maximum(high, 1e-12)))
        spread = ("all identical" if same else "median; all within 1 %" if close
                  else "median, band min-max")
        axes.plot(times, np.median(eps, axis=0), color=colour, linewidth=width, linestyle=dash,
                  label=f"{name}: {len(rows)} clients ({spread})")


def _draw_band(axes: Any, history: EpsilonHistory) -> None:
    times, eps = history.times, history.epsilon
    count = len(history.client_ids)
    axes.fill_between(times, eps.min(axis=0), eps.max(axis=0), color="tab:blue", alpha=0.15,
                      label=f"min-max over {count} clients")
    median = np.median(eps, axis=0)
    index = {cid: i for i, cid in enumerate(history.client_ids)}
    roles = ("least spent", "median", "most spent")
    picks = representative_clients(history.final())
    same_as_median = [cid for cid in picks if np.allclose(eps[index[cid]], median, rtol=1e-9)]
    axes.plot(times, median, color="tab:blue", linewidth=3.0,
              label="median" + (f" (= {', '.join(same_as_median)})" if same_as_median else ""))
    styles = (("tab:green", "--"), ("tab:orange", "-."), ("tab:purple", ":"))
    drawn: list[np.ndarray] = []
    for (colour, dash), role, cid in zip(styles, roles, picks, strict=False):
        row = eps[index[cid]]
        if cid in same_as_median or any(np.allclose(row, d, rtol=1e-9) for d in drawn):
            continue
        drawn.append(row)
        axes.plot(times, row, color=colour, linewidth=1.6, linestyle=dash,
                  label=f"{cid} ({role})")


# A client within this fraction of a budget below it has spent that budget (for the count).
AT_BUDGET = 0.01


def _draw_budgets(axes: Any, budgets: dict[float, list[str]], every: Sequence[float],
                  final: dict[str, float]) -> None:
    """Budget lines; each value keeps its style (its place in ``every``) in every panel. Where
    several clients ended at a budget their curves run together along its line: the line is
    annotated with how many they are."""
    for budget, groups in budgets.items():
        colour, dash = BUDGET_STYLES[list(every).index(budget) % len(BUDGET_STYLES)]
        axes.axhline(budget, color=colour, linestyle=dash, linewidth=1.4,
                     label=f"budget eps = {budget:g} ({', '.join(groups)})")
        at = sum(budget * (1 - AT_BUDGET) <= eps <= budget for eps in final.values())
        if at > 1:
            axes.annotate(f"{at} clients end at eps = {budget:g}", xy=(0.99, budget),
                          xycoords=("axes fraction", "data"), xytext=(0, 3),
                          textcoords="offset points", ha="right", va="bottom", fontsize=8,
                          color=colour,
                          bbox={"boxstyle": "round,pad=0.15", "fc": "white", "ec": "none",
                                "alpha": 0.8})


def draw_epsilon(run: RunDirectory, panels: Sequence[EpsilonPanel], path: Path) -> Path:
    """Per-client epsilon over virtual time, one panel per neighbouring relation.

    In a panel, up to :data:`MAX_INDIVIDUAL_CLIENTS` groups are drawn one line each (the
    group's median with a min-max band, :func:`_draw_groups`); without groups (no clients.csv)
    up to that many distinct curves one by one (clients with equal curves share one line and
    its label); more as a min-max band, the median and three representatives. If a panel's history holds only the clients at quantiles
    of final epsilon out of a larger population (see :func:`draw_run`), those are drawn, each
    labelled with its quantile, and the legend says so. Budgets are lines of distinct styles;
    legends stand beside the axes.
    """
    rows = max(len(panels), 1)
    figure, axes_list = _new_figure((FIGSIZE[0] + 3.0, 3.6 * rows + 0.6), rows)
    accountant = ", ".join(sorted({p.history.accountant for p in panels})) or "no ledgers"
    delta = panels[0].history.delta if panels else run.delta
    if not panels:
        # (A server's output directory: the ledgers stay with the clients.)
        text = ("no client ledgers in this directory:\na deployed server's view; its clients' "
                "ledgers stay with them\n(copied into ledgers/, they are drawn here)"
                if run.server_view else "no client ledgers in this run")
        axes_list[0].text(0.5, 0.5, text, ha="center", va="center",
                          transform=axes_list[0].transAxes)
        axes_list[0].set_xticks([])
        axes_list[0].set_yticks([])
    for axes, panel in zip(axes_list, panels, strict=False):
        history = panel.history
        times, eps = history.times, history.epsilon
        count = len(history.client_ids)
        if panel.population > count:
            ranks = sorted(history.final().items(), key=lambda item: (item[1], item[0]))
            order = [history.client_ids.index(cid) for cid, _ in ranks]
            colours = [plt_colormap(i / max(len(order) - 1, 1)) for i in range(len(order))]
            _draw_individual(axes, [history.client_ids[i] for i in order], eps[order], times,
                             panel.labels, colours)
            axes.plot([], [], " ", label=f"{count} of {panel.population} clients, at quantiles "
                                         "of final eps")
        elif 0 < len(groups := _by_group(history, panel.client_groups)) \
                <= MAX_INDIVIDUAL_CLIENTS:
            _draw_groups(axes, history, groups, group_styles(panel.run_groups))
        elif len(_same_curves(history.client_ids, eps)) <= MAX_INDIVIDUAL_CLIENTS:
            _draw_individual(axes, history.client_ids, eps, times, panel.labels)
        else:
            _draw_band(axes, history)
        mark_interruption(axes, run)
        _draw_budgets(axes, _budgets(run, set(panel.groups) or None), list(_budgets(run)),
                      panel.final)
        axes.set_xlabel(run.client_time_label)
        axes.set_ylabel(f"epsilon at delta = {history.delta:g}")
        highest = max([float(eps.max()) if eps.size else 0.0,
                       *_budgets(run, set(panel.groups) or None)])
        # Headroom above the highest curve or budget for the budget annotations.
        axes.set_ylim(0.0, max(highest * 1.12, 1e-3))
        axes.grid(True, alpha=0.3)
        axes.set_title(RELATION_TITLES.get(panel.sampling, panel.sampling), fontsize=10)
        if axes.get_legend_handles_labels()[0]:
            axes.legend(**LEGEND_OUTSIDE)
    note = " (eps of different relations are not comparable)" if len(panels) > 1 else ""
    figure.suptitle(f"{run.scenario_name}: privacy spent per client ({accountant}, delta = "
                    f"{delta:g}){note}{interruption_note(run)}", fontsize=11)
    height = 3.6 * rows + 0.6
    return _save(figure, path, left=0.07, right=0.66, bottom=0.55 / height,
                 top=1 - 0.8 / height)


def plt_colormap(share: float) -> Any:
    """A colour from blue (least spent) to red (most spent)."""
    return matplotlib.colormaps["coolwarm"](share)


# Trade-off curves of clients whose eps differ by less than this look the same: one is shown.
DISTINCT_EPSILON = 0.03


def distinct_spenders(final: dict[str, float], count: int = TRADEOFF_CLIENTS) -> list[str]:
    """Up to ``count`` clients (least, median, most spent first) whose final eps differ from
    each other by at least :data:`DISTINCT_EPSILON` (relative), so no curve hides another."""
    spent = {cid: eps for cid, eps in sorted(final.items()) if eps > 0}
    ordered = sorted(spent, key=lambda cid: (spent[cid], cid))
    if not ordered:
        return []
    candidates = representative_clients(spent, count) + ordered
    chosen: list[str] = []
    for cid in candidates:
        if all(abs(spent[cid] - spent[c]) > DISTINCT_EPSILON * spent[c] for c in chosen):
            chosen.append(cid)
        if len(chosen) == count:
            break
    return sorted(chosen, key=lambda cid: (spent[cid], cid))


def tradeoff_clients(final: dict[str, float], client_groups: dict[str, str],
                     count: int = TRADEOFF_CLIENTS) -> list[tuple[str, str]]:
    """The clients whose trade-off curves a panel shows, each with its legend name: one per
    group, the client with the group's median final eps (``"phone, median of 4: phone-002"``);
    with more than ``count`` groups (or groups unknown: no clients.csv), the least, median and
    most spent of those (:func:`distinct_spenders`), so no curve hides another."""
    spent = {cid: eps for cid, eps in final.items() if eps > 0}
    members: dict[str, dict[str, float]] = {}
    for cid, eps in sorted(spent.items()):
        if cid not in client_groups:
            return [(cid, cid) for cid in distinct_spenders(spent, count)]
        members.setdefault(client_groups[cid], {})[cid] = eps
    names = {}
    for group, own in sorted(members.items()):
        (middle,) = quantile_clients(own, [0.5])
        names[middle] = (f"{group}, median of {len(own)}: {middle}" if len(own) > 1
                         else f"{group}: {middle}")
    chosen = distinct_spenders({cid: spent[cid] for cid in names}, count) \
        if len(names) > count else sorted(names, key=lambda cid: (spent[cid], cid))
    return [(cid, names[cid]) for cid in chosen]


def draw_tradeoff(run: RunDirectory, ledgers: Sequence[ClientLedger], final: dict[str, float],
                  path: Path) -> Path:
    """Trade-off curves per neighbouring relation (one panel each) of one client per group
    (:func:`tradeoff_clients`: the group's median spender; the title says so) against the GDP
    curve fitted to each (the smallest mu with G_mu below the curve on the grid, so the client
    is also mu-GDP there) and the curve of its single (eps, delta) pair."""
    client_groups = {str(row.get("client_id")): str(row.get("group") or "?")
                     for row in run.clients}
    by_relation: dict[str, list[ClientLedger]] = {}
    for ledger in ledgers:
        by_relation.setdefault(ledger.sampling, []).append(ledger)
    relations = sorted(by_relation, key=lambda name: (name != "poisson", name)) or ["poisson"]
    width = 4.2 * len(relations) + 3.8
    figure = Figure(figsize=(width, 5.6), dpi=DPI)
    FigureCanvasAgg(figure)
    styles = group_styles(client_groups.values())
    used = 0  # without groups, colours run on across panels: one colour, one client
    shown = 0
    for column, sampling in enumerate(relations):
        axes = figure.add_subplot(1, len(relations), column + 1)
        members = {lg.client_id: lg for lg in by_relation.get(sampling, [])}
        chosen = tradeoff_clients({cid: final[cid] for cid in members if cid in final},
                                  client_groups)
        axes.plot([0, 1], [1, 0], color="0.6", linewidth=0.8,
                  label="no privacy loss (1 - alpha)" if column == 0 else None)
        shown += len(chosen)
        for cid, name in chosen:
            # A group's client in the group's colour (as on the epsilon plot); else the next.
            colour = (styles[client_groups[cid]][0] if cid in client_groups
                      else GROUP_COLOURS[used % len(GROUP_COLOURS)])
            used += 1
            accountant = members[cid].accountant
            alphas, betas = tradeoff_curve(accountant, ALPHA_GRID)
            betas = np.clip(betas, 0.0, 1.0)
            mu = fit_gdp_mu(alphas, betas)
            epsilon = final[cid]
            # Wide and light, so the fitted curve drawn over it stays visible where they agree.
            relation = {str(k): v for k, v in NEIGHBOURING_RELATION.items()}.get(sampling, "?")
            axes.plot(alphas, betas, color=colour, linewidth=4, alpha=0.45,
                      label=f"{name} ({accountant.name}, {relation})")
            axes.plot(alphas, gdp_tradeoff(alphas, mu), color=colour, linestyle="--",
                      linewidth=1, label=f"  {cid} GDP fit, mu = {mu:.3f}")
            axes.plot(alphas, eps_delta_tradeoff(alphas, epsilon, run.delta), color=colour,
                      linestyle=":", linewidth=1.2,
                      label=f"  {cid} ({epsilon:.3f}, {run.delta:g})-DP")
        if not chosen:
            axes.text(0.5, 0.5, "no client ledgers in this directory\n(a deployed server's view)"
                      if run.server_view and not run.ledger_paths
                      else "no client has spent privacy yet", ha="center", va="center",
                      transform=axes.transAxes)
        axes.set_xlim(0.0, 1.0)
        axes.set_ylim(0.0, 1.0)
        axes.set_aspect("equal")
        axes.set_xlabel("type I error alpha")
        if column == 0:
            axes.set_ylabel("type II error beta")
        axes.set_title(RELATION_TITLES.get(sampling, sampling).replace(": ", ":\n"), fontsize=9)
    handles: list[Any] = []
    labels: list[str] = []
    for axes in figure.axes:
        h, lab = axes.get_legend_handles_labels()
        handles, labels = handles + h, labels + lab
    right = 1 - 3.6 / width
    figure.legend(handles, labels, loc="center left", bbox_to_anchor=(right + 0.01, 0.5),
                  fontsize=7, frameon=False)
    figure.suptitle(f"{run.scenario_name}: trade-off curves of {shown} of {len(ledgers)} "
                    "clients: per group, the client with the group's median final eps"
                    f"{interruption_note(run)}", fontsize=10)
    return _save(figure, path, left=0.6 / width, right=right, bottom=0.1, top=0.86,
                 hspace=0.2)


@dataclass(frozen=True)
class Drawn:
    """What :func:`draw_run` produced: the files and the epsilon numbers behind them."""

    paths: list[Path]
    final_epsilon: dict[str, float]  # every client, over its whole ledger
    accountant: str
    delta: float


def draw_run(run: RunDirectory) -> Drawn:
    """Draw the three plots of ``run`` into ``run.plot_dir``.

    Epsilon over time costs one accountant evaluation per client and time point (shared
    between clients with equal histories, about 10 ms each otherwise). The grid has
    :data:`TIME_GRID_POINTS` points, fewer (down to :data:`MIN_TIME_GRID_POINTS`) for more
    clients; up to :data:`EXACT_BAND_EVALUATIONS` evaluations every client is evaluated on the
    grid; beyond that (hundreds of clients with distinct postures), only the clients at the
    quantiles :data:`QUANTILES` of final epsilon of each neighbouring relation are, so that a
    report stays within seconds; every client's final epsilon is always computed.
    """
    ledgers = read_ledgers(run)
    delta = run.delta
    cache = EpsilonCache(delta)
    final = final_epsilons(ledgers, cache)
    # The grid ends at the last release even if the summary says the run ended earlier, so the
    # last point is each client's full spending.
    last_release = max((lg.steps[-1][0] for lg in ledgers if lg.steps), default=0.0)
    # Fewer time points for more clients (down to MIN_TIME_GRID_POINTS) keeps the exact band.
    points = max(MIN_TIME_GRID_POINTS,
                 min(TIME_GRID_POINTS, EXACT_BAND_EVALUATIONS // max(len(ledgers), 1)))
    grid = time_grid(max(run.virtual_time, last_release), points)
    groups = {str(row.get("client_id")): str(row.get("group") or "?") for row in run.clients}
    by_relation: dict[str, list[ClientLedger]] = {}
    for ledger in ledgers:
        by_relation.setdefault(ledger.sampling, []).append(ledger)
    panels = []
    for sampling, members in sorted(by_relation.items(), key=lambda item: item[0] != "poisson"):
        shown, labels = members, dict[str, str]()
        if len(ledgers) * len(grid) > EXACT_BAND_EVALUATIONS:
            own = {lg.client_id: final[lg.client_id] for lg in members}
            for quantile in QUANTILES:
                (cid,) = quantile_clients(own, [quantile])
                name = {0.0: "min", 1.0: "max"}.get(quantile, f"{quantile:.0%} quantile")
                labels[cid] = f"{labels[cid]}, {name}" if cid in labels else name
            shown = [lg for lg in members if lg.client_id in labels]
        panels.append(EpsilonPanel(
            sampling, epsilon_history(shown, grid, delta, cache), len(members), labels,
            frozenset(groups.get(lg.client_id, "?") for lg in members),
            {lg.client_id: final[lg.client_id] for lg in members},
            {lg.client_id: groups[lg.client_id] for lg in members if lg.client_id in groups},
            frozenset(groups.values())))
    paths = [
        draw_accuracy(run, run.plot_dir / "accuracy.png"),
        draw_epsilon(run, panels, run.plot_dir / "epsilon.png"),
        draw_tradeoff(run, ledgers, final, run.plot_dir / "tradeoff.png"),
    ]
    return Drawn(paths, final, accountant_names(ledgers), delta)


def draw_all(run_dir: str | Path) -> list[Path]:
    """Draw ``accuracy.png``, ``epsilon.png`` and ``tradeoff.png`` into ``run_dir/plots``.

    Raises:
        ConfigError: ``run_dir`` is not a readable run directory.
    """
    return draw_run(RunDirectory.load(run_dir)).paths
