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

import functools
import math
import textwrap
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import matplotlib
import numpy as np

from fedsim.privacy.accountant import make_accountant
from fedsim.reporting.epsilon_history import (
    EXACT_BAND_EVALUATIONS,
    MIN_TIME_GRID_POINTS,
    QUANTILES,
    TIME_GRID_POINTS,
    EpsilonCache,
    EpsilonHistory,
    accountant_names,
    epsilon_history,
    final_epsilons,
    quantile_clients,
    representative_clients,
    time_grid,
)
from fedsim.reporting.figures import (
    BUDGET_STYLES,
    CURVE_STYLES,
    FIGSIZE,
    LEGEND_LABEL_CHARS,
    LEGEND_OUTSIDE,
    RELATION_TITLES,
    group_styles,
    interruption_note,
    mark_interruption,
    new_figure,
    save,
    title_name,
    tuning_note,
)
from fedsim.reporting.ledgers import ClientLedger, TunedPrivacy, read_ledgers
from fedsim.reporting.rundir import RunDirectory
from fedsim.reporting.tradeoff_plot import draw_tradeoff
from fedsim.reporting.values import accuracy

# Clients drawn individually; beyond this the epsilon plot shows a band and representatives.
MAX_INDIVIDUAL_CLIENTS = 8


def accuracy_limits(values: Sequence[float]) -> tuple[float, float]:
    """The accuracy axis fitted to ``values`` with a margin of 8 % of their range (at least
    0.01), kept within [0, 1], so that 0.73-0.88 is not flattened on a fixed 0-1 axis."""
    low, high = min(values), max(values)
    margin = max(0.08 * (high - low), 0.01)
    return max(0.0, low - margin), min(1.0, high + margin)


def final_point(run: RunDirectory) -> tuple[float, float, int] | None:
    """(time, accuracy, version) of the final model's evaluation at the run's end (None: an
    interrupted or older run, where ``final_accuracy`` is a periodic evaluation's)."""
    final = accuracy(run.summary.get("final_accuracy"))
    version = run.summary.get("final_evaluated_version")
    if run.interrupted or final is None or not isinstance(version, int) \
            or run.unevaluated_final is not None or version != run.summary.get("final_version"):
        return None
    return run.virtual_time, final, version


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
    figure, (axes,) = new_figure((FIGSIZE[0], FIGSIZE[1] + 0.5))
    evaluated = [m for m in run.metrics if accuracy(m.get("accuracy")) is not None]
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
    axes.set_title(f"{title_name(run)}: accuracy over {run.time_name}{interruption_note(run)}",
                   fontsize=11)
    return save(figure, path, bottom=0.24)


def _budgets(run: RunDirectory, groups: set[str] | None = None) -> dict[float, list[str]]:
    """Each distinct budget eps in clients.csv (of ``groups``, if given), with its groups; a
    group whose budget holds at another delta than the plot's (the run's) says which ("phone
    at delta = 0.001": its curve, at the run's delta, may then cross the line)."""
    found: dict[float, set[str]] = {}
    for row in run.clients:
        value = row.get("budget_epsilon")
        group = str(row.get("group") or "?")
        if groups is not None and group not in groups:
            continue
        delta = row.get("budget_delta")
        if isinstance(delta, int | float) and delta != run.delta:
            group = f"{group} at delta = {delta:g}"
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
                     # wrapped: the legend beside the axes has a third of the width (a
                     # stranger's budget at other deltas ran off the figure)
                     label=textwrap.fill(f"budget eps = {budget:g} ({', '.join(groups)})",
                                         LEGEND_LABEL_CHARS))
        at = sum(budget * (1 - AT_BUDGET) <= eps <= budget for eps in final.values())
        if at > 1:
            axes.annotate(f"{at} clients end at eps = {budget:g}", xy=(0.99, budget),
                          xycoords=("axes fraction", "data"), xytext=(0, 3),
                          textcoords="offset points", ha="right", va="bottom", fontsize=8,
                          color=colour,
                          bbox={"boxstyle": "round,pad=0.15", "fc": "white", "ec": "none",
                                "alpha": 0.8})


def draw_epsilon(run: RunDirectory, panels: Sequence[EpsilonPanel], path: Path,
                 tuned: TunedPrivacy | None = None) -> Path:
    """Per-client epsilon over virtual time, one panel per neighbouring relation.

    In a panel, up to :data:`MAX_INDIVIDUAL_CLIENTS` groups are drawn one line each (the
    group's median with a min-max band, :func:`_draw_groups`); without groups (no clients.csv)
    up to that many distinct curves one by one (clients with equal curves share one line and
    its label); more as a min-max band, the median and three representatives. If a panel's history holds only the clients at quantiles
    of final epsilon out of a larger population (see :func:`draw_run`), those are drawn, each
    labelled with its quantile, and the legend says so. Budgets are lines of distinct styles;
    legends stand beside the axes. ``tuned``: a private tuning release's tuned eps, for the
    title, where the caller has read it (:func:`~fedsim.reporting.figures.tuning_note`).
    """
    rows = max(len(panels), 1)
    figure, axes_list = new_figure((FIGSIZE[0] + 3.0, 3.6 * rows + 0.6), rows)
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
    figure.suptitle(f"{title_name(run)}: privacy spent per client ({accountant}, delta = "
                    f"{delta:g}){note}{interruption_note(run)}{tuning_note(run, tuned)}", fontsize=11)
    height = 3.6 * rows + 0.6
    return save(figure, path, left=0.07, right=0.66, bottom=0.55 / height,
                 top=1 - 0.8 / height)


def plt_colormap(share: float) -> Any:
    """A colour from blue (least spent) to red (most spent)."""
    return matplotlib.colormaps["coolwarm"](share)


@dataclass(frozen=True)
class Drawn:
    """What :func:`draw_run` produced: the files and the epsilon numbers behind them."""

    paths: list[Path]
    final_epsilon: dict[str, float]  # every client, over its whole ledger
    accountant: str
    delta: float
    sampling: dict[str, str] = field(default_factory=dict)  # each client's, its ledger header's
    ledgers: Sequence[ClientLedger] = field(default=(), repr=False)
    cache: EpsilonCache | None = field(default=None, repr=False)

    @functools.cached_property
    def pld_epsilon(self) -> dict[str, float]:
        """Every client's eps under ``pld`` (what summary.json and clients.csv report, whatever
        accountant its ledger enforces with): ``final_epsilon`` itself where every ledger is
        pld, else computed when first asked (a report's check; a run's own plots never ask)."""
        if self.accountant in ("pld", "none"):
            return self.final_epsilon
        return final_epsilons(self.ledgers, self.cache or EpsilonCache(self.delta),
                              under=make_accountant("pld", []))


def draw_run(run: RunDirectory, tuned: TunedPrivacy | None = None) -> Drawn:
    """Draw the three plots of ``run`` into ``run.plot_dir`` (``tuned``: a private tuning
    release's tuned eps where the caller has read it, else read for the epsilon plot's title).

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
        draw_epsilon(run, panels, run.plot_dir / "epsilon.png", tuned),
        draw_tradeoff(run, ledgers, final, run.plot_dir / "tradeoff.png"),
    ]
    return Drawn(paths, final, accountant_names(ledgers), delta,
                 {ledger.client_id: ledger.sampling for ledger in ledgers}, ledgers, cache)


def draw_all(run_dir: str | Path) -> list[Path]:
    """Draw ``accuracy.png``, ``epsilon.png`` and ``tradeoff.png`` into ``run_dir/plots``.

    Raises:
        ConfigError: ``run_dir`` is not a readable run directory.
    """
    return draw_run(RunDirectory.load(run_dir)).paths
