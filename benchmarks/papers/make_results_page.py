"""Generate docs/RESULTS.md from the raw results in benchmarks/results/papers/*.json.

The page is a pure function of those files (no timestamps, no machine names), so the page and
the data cannot disagree: ``--check`` exits 1 when the committed page is out of date, and the
test suite runs that check.

Each result file is either a list of row objects or an object with ``rows`` (a list of row
objects) and optionally ``command``, ``commit`` (the commit and fedsim version that made it,
printed on the page), ``plot`` / ``plots``, ``paper``, ``note`` / ``notes``,
``comparison`` (rows of {claim, paper, ours}), ``group_by`` (a column: one table per value)
and ``curves`` (plot data, not shown). In a row,
a key ``paper_X`` is the paper's value of the column ``X`` and is shown next to it. A result
whose file does not exist yet gets one line naming the command that produces it.

Run: ``python benchmarks/papers/make_results_page.py`` (``--check`` to verify only).
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
RESULTS_DIR = REPO / "benchmarks" / "results" / "papers"
PAGE = REPO / "docs" / "RESULTS.md"


@dataclass(frozen=True)
class ResultSpec:
    """One reproduction: its result file and what the page says before the data."""

    stem: str
    title: str
    paper: str
    claim: str
    command: str  # shown when the file does not say which command wrote it
    plots: tuple[str, ...] = ()
    setup: str = ""  # how ours differs from the paper's setup, where the rows do not say
    records: str = ""  # the folder (in the results folder) of the training records it reuses


RESULTS: tuple[ResultSpec, ...] = (
    ResultSpec(
        "drs_mnist",
        "Dong, Roth & Su: DP-SGD on MNIST, runs A / B / C",
        'Dong, Roth & Su, "Gaussian Differential Privacy" (its Noisy SGD section)',
        "1 client, fixed-size batches m = 256 of n = 60000 (replace-one): accuracy 95.0 / 96.6 / "
        "97.0 %, CLT mu 0.285 / 0.737 / 1.554, eps at delta = 1e-5.",
        # every row is a full-length run: --full reuses the committed training records
        # (benchmarks/results/papers/drs_mnist_runs/) and retrains only what is missing
        "python benchmarks/papers/drs_mnist.py --full",
        ("docs/img/drs_mnist_tradeoff.png",),
        records="drs_mnist_runs",
        setup="every row trains fedsim's DP MNIST CNN (dp_mnist_cnn, through "
              "benchmarks/mnist_centralized.py): the layers of the TF Privacy tutorial's CNN "
              "(26,010 parameters) with tanh activations where TF Privacy's uses ReLU.",
    ),
    ResultSpec(
        "asoodeh_rounds",
        "Asoodeh et al.: how many more rounds the optimal RDP conversion allows",
        'Asoodeh, Liao, Calmon, Kosut & Sankar, "A Better Bound Gives a Hundred Rounds: '
        'Enhanced Privacy Guarantees via f-Divergences"',
        "Converting RDP to (eps, delta) optimally allows more steps at the same budget than the "
        "classic conversion (\"often hundreds more\" for DP-SGD); the exact/tight accountant "
        "allows more still.",
        "python benchmarks/papers/asoodeh_rounds.py",
        ("docs/img/asoodeh_rounds.png",),
    ),
    ResultSpec(
        "du_dynamic",
        "Du et al.: dynamic DP-SGD (sensitivity decay, growing mu_t)",
        'Du et al., "Dynamic Differential-Privacy Preserving SGD"',
        "MNIST at eps = 1.2: the dynamic method loses 2.49 % accuracy against non-DP; "
        "federated at eps = 1: 1.72 %.",
        "python benchmarks/papers/du_dynamic.py",
        ("docs/img/du_dynamic.png",),
        records="du_dynamic_runs",
    ),
    ResultSpec(
        "vandijk_async",
        "van Dijk & Nguyen: the asynchronous design with 100 heterogeneous clients",
        'van Dijk & Nguyen, "Considerations on the Theory of Training Models with Differential '
        'Privacy"',
        "Poisson vs fixed-size sampling at equal per-client eps, staleness wait, broadcast "
        "interval, message loss, and the batch-size thought experiment.",
        "python benchmarks/papers/vandijk_async.py",
        ("docs/img/vandijk_async.png",),
        setup="Poisson against fixed-size batches compares equal numbers under different "
              "neighbouring relations, as van Dijk & Nguyen compare them: Poisson eps is about "
              "adding or removing one record, fixed-size eps about replacing one (two such "
              "steps), so equal eps is not the same promise.",
    ),
    ResultSpec(
        "async_policies",
        "Asynchronous aggregation (windows / FedBuff / FedAsync) and the interrupt rule",
        "van Dijk & Nguyen's interrupt service routine; FedBuff (Nguyen et al. 2022); FedAsync (Xie et "
        "al. 2019)",
        "one heterogeneous population (30 clients, three speed classes, label-skewed data) at "
        "equal per-client eps = 2: accuracy against virtual time for time windows, FedBuff and "
        "FedAsync, and for the interrupt rules switch and snapshot, 3 seeds each.",
        "python benchmarks/papers/async_policies.py",
        ("docs/img/async_policies.png",),
    ),
    ResultSpec(
        "compression_study",
        "Compressed updates: accuracy against bytes on the wire",
        "van Dijk & Nguyen, footnote 1 (\"the client will only transmit a sparsification or "
        "lossy compression of U-bar where small entries are discarded\")",
        "sparsified or quantised updates, applied after the noise, cost no privacy; what they "
        "cost in accuracy for what they save in bytes is measured here on the shipped "
        "heterogeneous scenario (hetero-100), 3 seeds, at equal eps.",
        "python benchmarks/papers/compression_study.py",
        ("docs/img/compression_study.png",),
    ),
    ResultSpec(
        "dp_pca_study",
        "DP principal components before training (Analyze Gauss)",
        "van Dijk & Nguyen (\"PCA can be made differentially private ... DP-SGD can be seen as "
        "a post-processing after PCA\"); Dwork, Talwar, Thakurta & Zhang 2014 (Analyze Gauss)",
        "a per-client DP release of the records' second moment, charged to the client's ledger "
        "and composed with its DP-SGD steps, gives a projection close to non-private PCA; here: "
        "its quality against the exact top components, and the dp-pca scenario's accuracy and "
        "eps against the same scenario on raw features.",
        "python benchmarks/papers/dp_pca_study.py",
        ("docs/img/dp_pca_study.png",),
    ),
    ResultSpec(
        "private_tuning_study",
        "Private hyperparameter search: the tuning's total eps beside each trial's",
        'Papernot & Steinke, "Hyperparameter Tuning with Renyi Differential Privacy" (ICLR '
        "2022); van Dijk & Nguyen, Appendix D (\"the additional privacy leakage due to the "
        "search\")",
        "a random number K of trials (truncated negative binomial or Poisson) and the best "
        "released costs a bounded multiple of one trial's RDP; fedsim charges that bound to "
        "every client's ledger before the first trial.",
        "python benchmarks/papers/private_tuning_study.py",
        ("docs/img/private_tuning_study.png",),
    ),
    ResultSpec(
        "clt_certified",
        "A certified error for the CLT: gamma beside mu on the DRS settings",
        'Dong, Roth & Su, "Gaussian Differential Privacy" (Thm 3.5, Cor. 5.6: Berry-Esseen '
        "for composition)",
        "after T steps the true trade-off curve lies within gamma of G_mu (in the band "
        "[G_mu(a + gamma) - gamma, G_mu(a - gamma) + gamma]); fedsim reports gamma beside the CLT "
        "mu. Checked here against the PLD accountant's curve on runs A, B and C.",
        "python benchmarks/papers/clt_certified.py",
        ("docs/img/clt_certified.png",),
    ),
    ResultSpec(
        "clip_tied_study",
        "Du et al.'s clip-tied noise allocation against constant noise",
        'Du et al., "Dynamic Differential-Privacy Preserving SGD" (mu_t from C_t: noise std '
        "proportional to sqrt(C_t))",
        "tying the noise to a decaying clip spends the same budget better than a constant "
        "schedule; here: the shipped du-allocation scenario against constant sigma, growing mu "
        "and no decay at all, each calibrated for the same (eps, delta).",
        "python benchmarks/papers/clip_tied_study.py",
        ("docs/img/clip_tied_study.png",),
    ),
)

_DRS_LEGACY = ("trained before training records carried their commit; retraining is the paper's "
               "epochs of DP-SGD over 60000 images, hours on a CPU. The rows take their accuracy "
               "from them; the privacy columns are recomputed by the commit above")
_DU_LEGACY = ("trained before training records carried their commit; retraining a seed is 20 "
              "epochs of five variants over 60000 images, about 35 minutes on a free CPU core. "
              "The centralized rows (accuracy and privacy columns) come from them as they are")
# Training records without a ``commit`` field and why they are still used (a path relative to
# the results folder). The page prints the reason; a record retrained by today's scripts names
# its commit and leaves this list (tests/papers/test_results_current.py keeps it exact).
LEGACY_RECORDS: dict[str, str] = {
    "drs_mnist_runs/run_A.json": _DRS_LEGACY,
    "drs_mnist_runs/run_A_poisson.json": _DRS_LEGACY,
    "drs_mnist_runs/run_B.json": _DRS_LEGACY,
    "drs_mnist_runs/run_C.json": _DRS_LEGACY,
    "du_dynamic_runs/centralized_seed0.json": _DU_LEGACY,
    "du_dynamic_runs/centralized_seed1.json": _DU_LEGACY,
}

HEADER = """# Reproduced results

Each section below reproduces a headline result of one of the source papers. The numbers are
generated from the raw outputs in `benchmarks/results/papers/`; this page is generated from
them by `python benchmarks/papers/make_results_page.py` (do not edit it by hand). Privacy
numbers are per client, at the stated delta; CLT values are approximations, `pld` and `rdp`
values are guarantees.
"""


# -- formatting -----------------------------------------------------------------------------------
def format_value(value: Any) -> str:  # noqa: PLR0911 - one return per kind of cell, in the table's order
    """A table cell: floats as written when they have at most 4 significant digits, else
    rounded to 4; integers exact; lists and objects as compact JSON; booleans as yes/no;
    missing as a dash."""
    if value is None:
        return "-"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        if not math.isfinite(value):
            return str(value)
        shortest = repr(value)
        mantissa = shortest.lower().split("e")[0].replace("-", "").replace(".", "").strip("0")
        if len(mantissa) <= 4:
            return shortest  # as printed by whoever wrote it (keeps 95.0 and 0.285 as is)
        if value != 0 and (abs(value) < 1e-3 or abs(value) >= 1e6):
            return f"{value:.3g}"
        return f"{value:.4g}"
    if isinstance(value, str):
        return value.replace("|", "\\|").replace("\n", " ")
    return json.dumps(value, separators=(", ", ": "), sort_keys=True).replace("|", "\\|")


def column_order(rows: Sequence[Mapping[str, Any]]) -> list[str]:
    """Columns in order of first appearance, each ``paper_X`` moved just before ``X``."""
    seen: list[str] = []
    for row in rows:
        seen.extend(key for key in row if key not in seen)
    ordered = [key for key in seen if not key.startswith("paper_") or key[6:] not in seen]
    for key in seen:
        if key.startswith("paper_") and key[6:] in seen:
            ordered.insert(ordered.index(key[6:]), key)
    return ordered


def header_name(column: str) -> str:
    if column.startswith("paper_"):
        return f"{column[6:]} (paper)"
    return column


def markdown_table(rows: Sequence[Mapping[str, Any]], columns: Sequence[str] | None = None) -> str:
    columns = list(columns) if columns is not None else column_order(rows)
    lines = ["| " + " | ".join(header_name(c) for c in columns) + " |",
             "|" + "|".join("---" for _ in columns) + "|"]
    lines += ["| " + " | ".join(format_value(row.get(c)) for c in columns) + " |" for row in rows]
    return "\n".join(lines)


def render_rows(rows: Sequence[Mapping[str, Any]]) -> list[str]:
    """A table of ``rows``; with more than three rows, columns that hold the same value in
    every row are stated once above the table instead."""
    columns = column_order(rows)
    constant: list[str] = []
    if len(rows) > 3:
        constant = [c for c in columns
                    if len({json.dumps(r.get(c), sort_keys=True) for r in rows}) == 1]
    parts = []
    if constant:
        parts += ["Same in every row: " + ", ".join(
            f"{header_name(c)} = {format_value(rows[0].get(c))}" for c in constant), ""]
    parts += [markdown_table(rows, [c for c in columns if c not in constant]), ""]
    return parts


# -- one section ----------------------------------------------------------------------------------
def _as_document(data: Any, path: Path) -> dict[str, Any]:
    if isinstance(data, list):
        return {"rows": data}
    if isinstance(data, dict):
        return data
    raise ValueError(f"{path}: expected a JSON list of rows or an object, got {type(data).__name__}")


def _rows(document: Mapping[str, Any], path: Path) -> list[dict[str, Any]]:
    rows = document.get("rows", [])
    if not isinstance(rows, list) or not all(isinstance(r, dict) for r in rows):
        raise ValueError(f"{path}: 'rows' must be a list of objects")
    return rows


def _listify(value: Any) -> list[str]:
    if value is None:
        return []
    if isinstance(value, str):
        return [value]
    return [str(v) for v in value]


def _section_head(spec: ResultSpec) -> list[str]:
    """The section's title, the paper and its claim, and how ours differs (where it does)."""
    head = [f"## {spec.title}", "", f"Source: {spec.paper}. Paper: {spec.claim}", ""]
    return head + ([f"Ours: {spec.setup}", ""] if spec.setup else [])


def _records(spec: ResultSpec, results_dir: Path, repo: Path) -> list[str]:
    """What made each file in the section's records folder: its ``commit``, or why a record
    without one is still used (:data:`LEGACY_RECORDS`)."""
    folder = results_dir / spec.records
    files = sorted(folder.glob("*.json")) if spec.records and folder.is_dir() else []
    if not files:
        return []
    lines = [f"Files reused from `{_relative(folder, repo)}/`:", ""]
    unrecorded: dict[str, list[str]] = {}  # reason -> the records without a commit
    for path in files:
        made_by = json.loads(path.read_text(encoding="utf-8")).get("commit")
        if made_by:
            lines.append(f"- `{path.name}`: made by {made_by}.")
        else:
            reason = LEGACY_RECORDS.get(f"{spec.records}/{path.name}", "no reason given")
            unrecorded.setdefault(reason, []).append(f"`{path.name}`")
    lines += [f"- {', '.join(names)}: made by: not recorded ({reason})."
              for reason, names in unrecorded.items()]
    return [*lines, ""]


def render_section(spec: ResultSpec, results_dir: Path, repo: Path) -> str:
    path = results_dir / f"{spec.stem}.json"
    relative = _relative(path, repo)
    parts = _section_head(spec)
    if not path.is_file():
        parts += [f"*Not generated yet:* `{spec.command}` writes `{relative}`.", ""]
        return "\n".join(parts)
    document = _as_document(json.loads(path.read_text(encoding="utf-8")), path)
    command = document.get("command", spec.command)
    parts += [f"Regenerate: `{command}` (raw output: `{relative}`).", ""]
    made_by = document.get("commit")
    parts += [f"Made by: {made_by}." if made_by else
              "Made by: not recorded (these figures predate the results' commit field; the "
              "code may have changed since: regenerate them with the command above).", ""]
    parts += _records(spec, results_dir, repo)
    for note in _listify(document.get("note")) + _listify(document.get("notes")):
        parts += [f"> {note}", ""]
    comparison = document.get("comparison")
    if isinstance(comparison, list) and comparison:
        parts += ["Paper against ours:", "", markdown_table(comparison), ""]
    rows = _rows(document, path)
    group_by = document.get("group_by")
    if isinstance(group_by, str):
        groups = list(dict.fromkeys(str(r.get(group_by)) for r in rows))
        for group in groups:
            members = [{k: v for k, v in r.items() if k != group_by} for r in rows
                       if str(r.get(group_by)) == group]
            members = [{k: v for k, v in r.items()
                        if any(m.get(k) is not None for m in members)} for r in members]
            parts += [f"### {group_by} = {group}", "", *render_rows(members)]
    elif rows:
        parts += render_rows(rows)
    scalars = {k: v for k, v in document.items()
               if k not in {"rows", "command", "plot", "plots", "note", "notes", "comparison",
                            "curves", "paper", "group_by", "commit"}
               and not isinstance(v, list | dict)}
    if scalars:
        parts += ["Settings: " + ", ".join(f"{k} = {format_value(v)}"
                                            for k, v in scalars.items()), ""]
    plots = _listify(document.get("plot")) + _listify(document.get("plots"))
    for plot in plots or list(spec.plots):
        image = repo / plot
        if image.is_file():
            parts += [f"![{spec.stem}]({_relative(image, repo / 'docs')})", ""]
        else:
            parts += [f"*Plot `{plot}` not generated yet* (`{command}` draws it).", ""]
    return "\n".join(parts)


def render_page(results_dir: Path = RESULTS_DIR, repo: Path = REPO) -> str:
    """The whole page, from the files in ``results_dir`` (links relative to ``repo/docs``)."""
    sections = [render_section(spec, results_dir, repo) for spec in RESULTS]
    return HEADER + "\n" + "\n".join(sections).rstrip("\n") + "\n"


def _relative(path: Path, root: Path) -> str:
    try:
        return path.resolve().relative_to(root.resolve()).as_posix()
    except ValueError:
        return path.as_posix()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true",
                        help="exit 1 if the page differs from what the data generates")
    parser.add_argument("--results", type=Path, default=RESULTS_DIR)
    parser.add_argument("--page", type=Path, default=PAGE)
    args = parser.parse_args(argv)
    try:
        page = render_page(args.results, REPO)
    except (ValueError, json.JSONDecodeError) as exc:
        print(f"make_results_page: error: {exc}", file=sys.stderr)
        return 2
    if args.check:
        current = args.page.read_text(encoding="utf-8") if args.page.is_file() else ""
        if current != page:
            print(f"{_relative(args.page, REPO)} is out of date: run "
                  "python benchmarks/papers/make_results_page.py", file=sys.stderr)
            return 1
        return 0
    args.page.parent.mkdir(parents=True, exist_ok=True)
    args.page.write_text(page, encoding="utf-8")
    print(f"wrote {_relative(args.page, REPO)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
