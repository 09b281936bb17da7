"""``plots/tradeoff.png``: per neighbouring relation, the trade-off curves (type I error alpha
against type II error beta) of one client per group (the group's median spender; the title says
how many of how many clients), from their accountant (a lower bound on the true curve for
``pld``), against the Gaussian-DP curve G_mu fitted to them, and the piecewise-linear curve of
the single (eps, delta) pair they report (Dong, Roth & Su, "Gaussian Differential Privacy",
Prop. 2.5 / Def. 2.3). A group's client is in the group's colour, as on the epsilon plot.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from fedsim.config.limits import MIN_DELTA
from fedsim.errors import AccountantOutOfRange, ConfigError
from fedsim.privacy.accountant import Accountant, make_accountant
from fedsim.privacy.events import NEIGHBOURING_RELATION
from fedsim.privacy.fdp import (
    default_alphas,
    eps_delta_tradeoff,
    fit_gdp_mu_accountant,
    tradeoff_curve,
)
from fedsim.privacy.gdp import gdp_tradeoff
from fedsim.reporting.epsilon_history import quantile_clients, representative_clients
from fedsim.reporting.figures import (
    DPI,
    GROUP_COLOURS,
    RELATION_TITLES,
    group_styles,
    interruption_note,
    save,
    title_name,
)
from fedsim.reporting.ledgers import ClientLedger
from fedsim.reporting.rundir import RunDirectory

TRADEOFF_CLIENTS = 3

# Dense near alpha = 0, where DP trade-off curves bend (the GDP fit reads the accountant's
# privacy profile instead: the curves of subsampled steps cross G_mu far below this grid).
ALPHA_GRID = default_alphas(801)

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


def _draw_gdp_fit(axes: Any, alphas: np.ndarray, accountant: Accountant, colour: Any,
                  cid: str) -> None:
    """G_mu of :func:`~fedsim.privacy.fdp.fit_gdp_mu_accountant` (none where no mu-GDP
    dominates the accountant's profile down to :data:`~fedsim.config.limits.MIN_DELTA`)."""
    try:
        mu = fit_gdp_mu_accountant(accountant, MIN_DELTA)
    except ConfigError:
        return
    axes.plot(alphas, gdp_tradeoff(alphas, mu), color=colour, linestyle="--", linewidth=1,
              zorder=2.5,
              label=f"  {cid} GDP bound, mu = {mu:.3f} (delta in [{MIN_DELTA:g}, 1-1e-9])")


def draw_tradeoff(run: RunDirectory, ledgers: Sequence[ClientLedger], final: dict[str, float],
                  path: Path) -> Path:
    """Trade-off curves per neighbouring relation (one panel each) of one client per group
    (:func:`tradeoff_clients`: the group's median spender; the title says so) against the GDP
    curve fitted to each (the smallest mu whose mu-GDP (eps, delta) pairs all hold for the
    client's accountant at every delta from :data:`~fedsim.config.limits.MIN_DELTA` to
    ``1 - 1e-9``,
    :func:`~fedsim.privacy.fdp.fit_gdp_mu_accountant`) and the curve of its single
    (eps, delta) pair."""
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
            try:
                alphas, betas = tradeoff_curve(accountant, ALPHA_GRID)
            except AccountantOutOfRange:  # the PLD grid cannot hold it: RDP's curve, labelled
                accountant = make_accountant("rdp", accountant.steps)
                alphas, betas = tradeoff_curve(accountant, ALPHA_GRID)
            betas = np.clip(betas, 0.0, 1.0)
            epsilon = final[cid]
            # Wide and light, below every thin line (zorder): a fitted curve stays visible where
            # it agrees with its own curve, and where it runs inside another group's (a
            # stranger lost phone's fit under laptop's curve, drawn after it).
            relation = {str(k): v for k, v in NEIGHBOURING_RELATION.items()}.get(sampling, "?")
            axes.plot(alphas, betas, color=colour, linewidth=4, alpha=0.45, zorder=1.5,
                      label=f"{name} ({accountant.name}, {relation})")
            _draw_gdp_fit(axes, alphas, accountant, colour, cid)
            axes.plot(alphas, eps_delta_tradeoff(alphas, epsilon, run.delta), color=colour,
                      linestyle=":", linewidth=1.2, zorder=2.5,
                      label=f"  {cid} ({epsilon:.3f}, {run.delta:g})-DP")
        silent = sorted({client_groups[cid] for cid in members if cid in client_groups}
                        - {client_groups[cid] for cid in members
                           if cid in client_groups and final.get(cid, 0.0) > 0})
        if silent and chosen:  # (a stranger saw a group left out without a word)
            axes.plot([], [], " ", label=f"{', '.join(silent)}: no client spent privacy")
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
    figure.suptitle(f"{title_name(run)}: trade-off curves of {shown} of {len(ledgers)} "
                    "clients: per group, the client with the group's median final eps"
                    f"{interruption_note(run)}", fontsize=10)
    return save(figure, path, left=0.6 / width, right=right, bottom=0.1, top=0.86,
                 hspace=0.2)
