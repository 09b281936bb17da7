"""What every plot of fedsim shares: a figure, its file, its styles.

A figure is drawn with the Agg backend on a private Figure object (no pyplot state) at a fixed
dpi and written with no software/time stamp in the PNG metadata, so the same inputs always give
byte-identical files; a file is replaced, never written through (:func:`save_png`). A run's
styles: each neighbouring relation's title, budget lines' styles, curves' dashes, and each
group's colour and dash, the same on every plot of the run (:func:`group_styles`). An
interrupted run says so in its titles and with a line where it stopped.
"""

from __future__ import annotations

import textwrap
from collections.abc import Iterable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.text import Text

from fedsim.privacy.epsilon_text import epsilon_text
from fedsim.reporting.rundir import RunDirectory

if TYPE_CHECKING:  # (ledgers imports this module)
    from fedsim.reporting.ledgers import TunedPrivacy

DPI = 100
FIGSIZE = (7.5, 4.5)
LEGEND_LABEL_CHARS = 42
"""A legend label beside the axes is wrapped at this many characters."""
TITLE_NAME_CHARS = 60
"""A name in a title (a run's scenario's) is cut to this many characters, with an ellipsis."""
MAX_TITLE_LINES = 4
"""A title wrapped onto more lines than this is cut there, with an ellipsis."""

# PNG metadata: matplotlib writes its version as "Software" unless told not to.
PNG_METADATA: dict[str, Any] = {"Software": None}

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


def new_figure(figsize: tuple[float, float] = FIGSIZE, rows: int = 1) -> tuple[Figure, list[Any]]:
    """A figure of ``rows`` axes one above the other, on its own Agg canvas."""
    figure = Figure(figsize=figsize, dpi=DPI)
    FigureCanvasAgg(figure)
    return figure, [figure.add_subplot(rows, 1, row + 1) for row in range(rows)]


def save(figure: Figure, path: Path, *, left: float = 0.09, right: float = 0.9,
         bottom: float = 0.1, top: float = 0.93, hspace: float = 0.35) -> Path:
    """Lay ``figure`` out in these margins (fractions of its size) and write it as ``path``
    (:func:`save_png`), its directory made."""
    path.parent.mkdir(parents=True, exist_ok=True)
    # Every text is plain: names, ids and titles come from files a run directory may have
    # been handed over with, and a '$' made matplotlib parse mathtext (a review's nested
    # '$x^{^{...}}$' as a scenario name crashed the report with a RecursionError).
    for text in figure.findobj(Text):
        text.set_parse_math(False)
    # Fixed margins (room for legends beside the axes): as good as tight_layout for these
    # figures, at a fraction of its cost, but for long tick labels (0.6025 on an axis fitted
    # to close values), which would push the axis label out of the figure: widened to fit.
    top -= _wrap_title(figure)
    figure.subplots_adjust(left=left, right=right, bottom=bottom, top=top, hspace=hspace)
    spill = _left_spill(figure)
    if spill > 0:
        figure.subplots_adjust(left=min(left + spill + LABEL_PAD, right - 0.2))
    return save_png(figure, path)


def _wrap_title(figure: Figure) -> float:
    """Wrap the figure's title and its axes' titles onto more lines where one is wider than
    the figure (a stranger: an interrupted run's title was cut at both edges); returns the
    share of the figure's height the added lines take, to lower the axes by."""
    titles = [t for t in [getattr(figure, "_suptitle", None),  # (matplotlib keeps it there)
                          *(axes.title for axes in figure.axes)]
              if t is not None and t.get_text()]
    if not titles:
        return 0.0
    # A text's width needs the renderer, not a draw of the figure (save's fixed margins are
    # there to spare the draws tight_layout makes)
    renderer = figure.canvas.get_renderer()  # type: ignore[attr-defined]
    room = 0.96 * figure.bbox.width
    added = 0.0
    for title in titles:
        width = title.get_window_extent(renderer).width
        if width <= room:
            continue
        text = title.get_text()
        lines = textwrap.wrap(text, max(20, int(len(text) * room / width)))
        if len(lines) > MAX_TITLE_LINES:  # (more would leave the axes no room: see title_name)
            lines = [*lines[:MAX_TITLE_LINES - 1], lines[MAX_TITLE_LINES - 1] + " \u2026"]
        title.set_text("\n".join(lines))
        line_height = float(title.get_fontsize()) * 1.25 / 72 / figure.get_figheight()
        added = max(added, (len(lines) - 1) * line_height)
    return added


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


def title_name(run: RunDirectory) -> str:
    """``run``'s scenario name as a title shows it: at most :data:`TITLE_NAME_CHARS`
    characters, a longer one cut with an ellipsis (a review's 2,000-character name, read from
    summary.json, was wrapped onto more lines than the figure has room for: matplotlib raised
    "bottom cannot be >= top"). The report's text prints it whole."""
    name = run.scenario_name
    return name if len(name) <= TITLE_NAME_CHARS else name[:TITLE_NAME_CHARS - 1] + "\u2026"


def interruption_note(run: RunDirectory) -> str:
    """" (interrupted by SIGINT: partial run)" for an interrupted run, else ""."""
    return f" (interrupted by {run.interrupted}: partial run)" if run.interrupted else ""


def tuning_note(run: RunDirectory, tuned: TunedPrivacy | None = None) -> str:
    """For a private tuning's trial (its summary's ``private_tuning``, fedsim sweep
    --private-tuning), what its eps plot must say: the release's privacy is the tuned eps, not
    the curves' (a plot copied from the released trial understated it), its largest as
    ``fedsim report`` states it (:func:`~fedsim.reporting.ledgers.tuned_privacy`: from the
    sweep's tuning ledgers where they are beside the trial, else summary.json's, said so), and
    any other trial is no release; "" for any other run. ``tuned``: the release's tuned eps
    where the caller has read it already (read here if not given)."""
    from fedsim.reporting.ledgers import tuned_privacy

    tuning = run.tuning
    if tuning is None:
        return ""
    if not tuning.release:
        return " - NOT A RELEASE: a private tuning's trial, not to be published"
    if tuned is None:
        tuned = tuned_privacy(run, tuning)
    highest = max(tuned.epsilons.values(), default=tuning.tuned_max)
    said = "" if highest is None else f", max {epsilon_text(highest)}"
    where = "its tuning ledgers" if tuned.verified else "summary.json, unverified"
    return (f" - the release of a private tuning: its privacy is the tuned eps{said} "
            f"({where}), above these curves")


def mark_interruption(axes: Any, run: RunDirectory, colour: str = "tab:red",
                      label: str | None = None) -> None:
    """A vertical line where an interrupted run stopped (nothing for a finished run)."""
    if run.interrupted:
        axes.axvline(run.virtual_time, color=colour, linestyle=(0, (4, 2)), linewidth=1.2,
                     label=label or f"interrupted by {run.interrupted}")
