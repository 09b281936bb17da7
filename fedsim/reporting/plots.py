"""The plots of a run directory: accuracy, per-client epsilon over time, trade-off curves.

:func:`draw_all` reads a run directory (see :mod:`fedsim.reporting.rundir`) and writes

* ``plots/accuracy.png``: held-out accuracy against virtual time, the server step size on a
  secondary axis;
* ``plots/epsilon.png``: each client's epsilon at the scenario's delta against virtual time,
  from its ledger; with many clients, a few representative clients over the min / median /
  max band; the budget as a dashed line;
* ``plots/tradeoff.png``: the trade-off curves (type I error alpha against type II error beta)
  of a few clients from their accountant (a lower bound on the true curve for ``pld``),
  against the Gaussian-DP curve G_mu fitted to them, and the piecewise-linear curve of the
  single (eps, delta) pair they report (Dong, Roth & Su, Prop. 2.5 / Def. 2.3).

Every number is each client's own guarantee about its own data set (per client, per
sample); the neighbouring relation is the one of the client's sampling scheme (Poisson:
add/remove; fixed-size: replace-one).

Figures are drawn with the Agg backend on private Figure objects (no pyplot state) at a
fixed dpi and with no software/time stamp in the PNG metadata, so the same run directory
always gives byte-identical files.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
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
        key = (accountant.name, tuple(sorted(settings.items())), grouped)
        if key not in self.values:
            fresh = make_accountant(accountant.name, grouped, **settings)
            self.values[key] = float(fresh.epsilon(self.delta))
        return self.values[key]


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


def final_epsilons(ledgers: Sequence[ClientLedger], cache: EpsilonCache) -> dict[str, float]:
    """Each client's epsilon at ``cache.delta`` over its whole ledger."""
    return {lg.client_id: cache.epsilon(lg.accountant, (s for _, s in lg.steps)) for lg in ledgers}


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
def _new_figure(figsize: tuple[float, float] = FIGSIZE) -> tuple[Figure, Any]:
    figure = Figure(figsize=figsize, dpi=DPI)
    FigureCanvasAgg(figure)
    return figure, figure.add_subplot(1, 1, 1)


def _save(figure: Figure, path: Path, left: float = 0.09, right: float = 0.9) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    # Fixed margins (room for a secondary axis on the right): as good as tight_layout for these
    # single-panel figures, at a fraction of its cost.
    figure.subplots_adjust(left=left, right=right, bottom=0.1, top=0.93)
    figure.savefig(path, dpi=DPI, format="png", metadata=PNG_METADATA)
    return path


def draw_accuracy(run: RunDirectory, path: Path) -> Path:
    """Held-out accuracy against virtual time, the server step size on a secondary axis."""
    figure, axes = _new_figure()
    evaluated = [m for m in run.metrics if isinstance(m.get("accuracy"), int | float)]
    if evaluated:
        axes.plot(
            [m["time"] for m in evaluated],
            [m["accuracy"] for m in evaluated],
            color="tab:blue",
            marker="." if len(evaluated) < 60 else None,
            label="held-out accuracy",
        )
    else:
        axes.text(
            0.5, 0.5, "no window was evaluated", ha="center", va="center", transform=axes.transAxes
        )
    axes.set_xlabel("virtual time (s)")
    axes.set_ylabel("accuracy", color="tab:blue")
    axes.set_ylim(0.0, 1.0)
    axes.grid(True, alpha=0.3)
    stepped = [m for m in run.metrics if isinstance(m.get("step_size"), int | float)]
    if stepped:
        twin = axes.twinx()
        twin.step(
            [m["time"] for m in stepped],
            [m["step_size"] for m in stepped],
            where="post",
            color="tab:orange",
            alpha=0.8,
            label="server step size",
        )
        twin.set_ylabel("server step size", color="tab:orange")
        twin.set_ylim(bottom=0.0)
        handles, labels = axes.get_legend_handles_labels()
        twin_handles, twin_labels = twin.get_legend_handles_labels()
        axes.legend(handles + twin_handles, labels + twin_labels, fontsize=8, loc="lower right")
    axes.set_title(f"{run.scenario_name}: accuracy over virtual time")
    return _save(figure, path)


def _budgets(run: RunDirectory) -> dict[float, list[str]]:
    """Each distinct budget eps in clients.csv, with the groups that have it."""
    found: dict[float, set[str]] = {}
    for row in run.clients:
        value = row.get("budget_epsilon")
        if isinstance(value, int | float) and math.isfinite(value):
            found.setdefault(float(value), set()).add(str(row.get("group") or "?"))
    return {budget: sorted(groups) for budget, groups in sorted(found.items())}


def draw_epsilon(run: RunDirectory, history: EpsilonHistory, path: Path, *,
                 population: int | None = None, labels: dict[str, str] | None = None) -> Path:
    """Per-client epsilon over virtual time.

    ``history`` holds every client (``population`` is None or equal to its size): up to
    :data:`MAX_INDIVIDUAL_CLIENTS` are drawn one by one, more as a min-max band, the median
    and three representatives. If ``history`` holds only the clients at quantiles of final
    epsilon out of a larger ``population`` (see :func:`draw_run`), those are drawn, each
    labelled with ``labels[client]`` (its quantile), and the legend says so.
    """
    labels = labels or {}
    figure, axes = _new_figure()
    times, eps = history.times, history.epsilon
    count = len(history.client_ids)
    population = count if population is None else population
    if count == 0:
        axes.text(0.5, 0.5, "no client ledgers in this run", ha="center", va="center",
                  transform=axes.transAxes)
    elif population > count:
        ranks = sorted(history.final().items(), key=lambda item: (item[1], item[0]))
        for rank, (cid, _) in enumerate(ranks):
            row = history.client_ids.index(cid)
            share = rank / max(len(ranks) - 1, 1)
            label = f"{cid} ({labels[cid]})" if cid in labels else cid
            axes.plot(times, eps[row], color=plt_colormap(share), linewidth=1.2, label=label)
        axes.plot([], [], " ", label=f"{count} of {population} clients, at quantiles of final eps")
    elif count <= MAX_INDIVIDUAL_CLIENTS:
        for cid, row in zip(history.client_ids, eps, strict=True):
            axes.plot(times, row, label=cid)
    else:
        axes.fill_between(times, eps.min(axis=0), eps.max(axis=0), color="tab:blue", alpha=0.15,
                          label=f"min-max over {count} clients")
        axes.plot(times, np.median(eps, axis=0), color="tab:blue", linewidth=2, label="median")
        index = {cid: i for i, cid in enumerate(history.client_ids)}
        roles = ("least spent", "median", "most spent")
        for colour, role, cid in zip(("tab:green", "tab:orange", "tab:purple"), roles,
                                     representative_clients(history.final()), strict=False):
            axes.plot(times, eps[index[cid]], color=colour, linewidth=1, linestyle="--",
                      label=f"{cid} ({role})")
    for budget, groups in _budgets(run).items():
        axes.axhline(budget, color="tab:red", linestyle=":", linewidth=1.2,
                     label=f"budget eps = {budget:g} ({', '.join(groups)})")
    axes.set_xlabel("virtual time (s)")
    axes.set_ylabel(f"epsilon at delta = {history.delta:g}")
    axes.set_ylim(bottom=0.0)
    axes.grid(True, alpha=0.3)
    axes.set_title(f"{run.scenario_name}: privacy spent per client ({history.accountant})")
    if axes.get_legend_handles_labels()[0]:
        axes.legend(fontsize=8, loc="upper left")
    return _save(figure, path)


def plt_colormap(share: float) -> Any:
    """A colour from blue (least spent) to red (most spent)."""
    return matplotlib.colormaps["coolwarm"](share)


def draw_tradeoff(run: RunDirectory, ledgers: Sequence[ClientLedger], final: dict[str, float],
                  path: Path) -> Path:
    """Trade-off curves of up to three clients (least, median and most spent) against the
    GDP curve fitted to each (the smallest mu with G_mu below the curve on the grid, so the
    client is also mu-GDP there) and the curve of its single (eps, delta) pair."""
    figure, axes = _new_figure(TRADEOFF_FIGSIZE)
    by_id = {ledger.client_id: ledger for ledger in ledgers}
    # One client per distinct spending (clients with equal histories have equal curves).
    spent: dict[str, float] = {}
    for cid, eps in sorted(final.items()):
        if eps > 0 and eps not in spent.values():
            spent[cid] = eps
    chosen = representative_clients(spent, TRADEOFF_CLIENTS)
    axes.plot([0, 1], [1, 0], color="0.6", linewidth=0.8, label="no privacy loss (1 - alpha)")
    colours = ("tab:blue", "tab:green", "tab:purple")
    for colour, cid in zip(colours, chosen, strict=False):
        accountant = by_id[cid].accountant
        alphas, betas = tradeoff_curve(accountant, ALPHA_GRID)
        betas = np.clip(betas, 0.0, 1.0)
        mu = fit_gdp_mu(alphas, betas)
        epsilon = spent[cid]
        relation = NEIGHBOURING_RELATION.get(accountant.sampling or "poisson", "?")
        axes.plot(alphas, betas, color=colour, linewidth=2,
                  label=f"{cid} ({accountant.name}, {relation})")
        axes.plot(alphas, gdp_tradeoff(alphas, mu), color=colour, linestyle="--", linewidth=1,
                  label=f"{cid} GDP fit, mu = {mu:.3f}")
        axes.plot(alphas, eps_delta_tradeoff(alphas, epsilon, run.delta), color=colour,
                  linestyle=":", linewidth=1, label=f"{cid} ({epsilon:.3f}, {run.delta:g})-DP")
    if not chosen:
        axes.text(0.5, 0.5, "no client has spent privacy yet", ha="center", va="center",
                  transform=axes.transAxes)
    axes.set_xlim(0.0, 1.0)
    axes.set_ylim(0.0, 1.0)
    axes.set_aspect("equal")
    axes.set_xlabel("type I error alpha")
    axes.set_ylabel("type II error beta")
    axes.set_title(f"{run.scenario_name}: trade-off curves")
    axes.legend(fontsize=7, loc="upper right")
    return _save(figure, path, left=0.13, right=0.96)


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
    grid; beyond that (hundreds of clients with distinct postures),
    only the clients at the quantiles :data:`QUANTILES` of final epsilon are, so that a report
    stays within seconds; every client's final epsilon is always computed.
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
    shown, labels = ledgers, dict[str, str]()
    if len(ledgers) * len(grid) > EXACT_BAND_EVALUATIONS:
        for quantile in QUANTILES:
            (cid,) = quantile_clients(final, [quantile])
            name = {0.0: "min", 1.0: "max"}.get(quantile, f"{quantile:.0%} quantile")
            labels[cid] = f"{labels[cid]}, {name}" if cid in labels else name
        shown = [lg for lg in ledgers if lg.client_id in labels]
    history = epsilon_history(shown, grid, delta, cache)
    paths = [
        draw_accuracy(run, run.plot_dir / "accuracy.png"),
        draw_epsilon(run, history, run.plot_dir / "epsilon.png", population=len(ledgers),
                     labels=labels),
        draw_tradeoff(run, ledgers, final, run.plot_dir / "tradeoff.png"),
    ]
    return Drawn(paths, final, accountant_names(ledgers), delta)


def draw_all(run_dir: str | Path) -> list[Path]:
    """Draw ``accuracy.png``, ``epsilon.png`` and ``tradeoff.png`` into ``run_dir/plots``.

    Raises:
        ConfigError: ``run_dir`` is not a readable run directory.
    """
    return draw_run(RunDirectory.load(run_dir)).paths
