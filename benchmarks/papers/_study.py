"""What every study script of the results page shares: its output options, how it saves its
figure and where it writes its results JSON before regenerating docs/RESULTS.md."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]


def add_output_arguments(parser: argparse.ArgumentParser, *, results: Path, plot: Path,
                         runs: Path | None = None) -> None:
    """``--runs`` (where ``runs`` is given), ``--results``, ``--plot`` and ``--no-page``."""
    if runs is not None:
        parser.add_argument("--runs", type=Path, default=runs)
    parser.add_argument("--results", type=Path, default=results)
    parser.add_argument("--plot", type=Path, default=plot)
    parser.add_argument("--no-page", action="store_true", help="do not regenerate docs/RESULTS.md")


def save_figure(fig: Any, path: Path) -> None:
    """Lay out, write (100 dpi) and close ``fig``."""
    import matplotlib.pyplot as plt

    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=100)
    plt.close(fig)


def plot_field(path: Path) -> str | None:
    """The plot's path as the results JSON records it: relative to the repository, or None."""
    return str(path.relative_to(REPO)) if path.is_relative_to(REPO) else None


def publish(document: dict[str, Any], target: Path, *, page: bool) -> None:
    """Write ``document`` to ``target``, print its notes, and regenerate docs/RESULTS.md."""
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text(json.dumps(document, indent=1) + "\n")
    print("\n".join(document["notes"]))
    if page:
        import make_results_page

        make_results_page.main([])
