"""``fedsim report DIR``: redraw a run's plots and print a short summary of it.

The privacy numbers are recomputed from the clients' ledgers (each client's own guarantee
about its own data set, at the scenario's delta, under the ledger's enforcing accountant:
always a guarantee, ``pld`` or ``rdp``) and checked against ``clients.csv``; the CLT mu
values of ``clients.csv`` are printed with a warning that they are approximations.
"""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING, Any

from fedsim.clock import seconds_text
from fedsim.config import limits
from fedsim.errors import ConfigError
from fedsim.reporting.rundir import RunDirectory, TuningRole
from fedsim.reporting.stops import stop_counts
from fedsim.reporting.values import accuracy, finite_number, printable, relative_gap, spread
from fedsim.runtime.run_outputs import CLIENTS_FILE, require_writable_dir

if TYPE_CHECKING:  # matplotlib and the accountants load only when the command runs
    from fedsim.reporting.ledgers import TunedPrivacy
    from fedsim.reporting.plots import Drawn

# clients.csv and a fresh computation from the ledger may differ by the accountant's
# numerical noise (e.g. a different discretisation); beyond this they disagree.
CSV_RELATIVE_TOLERANCE = 1e-3


DESCRIPTION = (
    "Redraw a run directory's plots and print a short summary of the run. The privacy numbers "
    "are recomputed from the clients' ledgers and checked against clients.csv."
)


def register(subparsers: Any) -> argparse.ArgumentParser:
    parser = subparsers.add_parser(
        "report",
        help="Redraw a run directory's plots and summarise the run.",
        description=DESCRIPTION,
    )
    parser.add_argument("run_dir", metavar="DIR",
                        help="A run directory written by fedsim run or fedsim launch (for "
                             "several, use fedsim compare).")
    # More directories are taken only to point at compare (the usage line shows one: DIR).
    parser.add_argument("more_dirs", nargs="*", default=[], help=argparse.SUPPRESS)
    parser.set_defaults(func=run)
    return parser


def run(args: argparse.Namespace) -> int:
    from fedsim.reporting.plots import draw_run

    if args.more_dirs:
        every = " ".join([args.run_dir, *args.more_dirs])
        raise ConfigError("report reads one run directory; to put several side by side run "
                          f"`fedsim compare {every}` (a table and overlaid accuracy and "
                          "epsilon plots)")
    directory = RunDirectory.load(args.run_dir)
    require_writable_dir(directory.plot_dir, "plots directory")
    tuned = _tuned(directory)  # (before the plots: a damaged tuning ledger stops the report)
    drawn = draw_run(directory, tuned)
    for line in summary_lines(directory, drawn, tuned):
        print(printable(line, limit=100_000))  # (a handed-over file's terminal escapes)
    return 0


def _updates(value: Any) -> str:
    """``summary.updates``: a count, or counts by fate (received, applied, stale, ...)."""
    if isinstance(value, dict):
        return ", ".join(f"{key} {count}" for key, count in value.items())
    return "?" if value is None else str(value)


def _tuned(run: RunDirectory) -> TunedPrivacy | None:
    """A private tuning's release's tuned eps, verified (None: ``run`` is no release)."""
    from fedsim.reporting.ledgers import tuned_privacy

    tuning = run.tuning
    return tuned_privacy(run, tuning) if tuning is not None and tuning.release else None


def _final_accuracy_text(run: RunDirectory, final: float) -> str:
    """``final`` as the final model's accuracy, or, where the run never evaluated its final
    model (:attr:`RunDirectory.unevaluated_final`), as the last evaluation's, of the version
    it was."""
    if (versions := run.unevaluated_final) is not None:
        return (f"last evaluated {final:.4f} (model version {versions[0]}; the final model, "
                f"version {versions[1]}, was not evaluated)")
    return f"final {final:.4f}"


def summary_lines(run: RunDirectory, drawn: Drawn,
                  tuned: TunedPrivacy | None = None) -> list[str]:
    """The textual summary ``fedsim report`` prints (one item per line; ``tuned``: the
    release's tuned eps where ``run`` is a private tuning's release, read here if not
    given)."""
    summary = run.summary
    lines = [
        f"run {run.path}: scenario {run.scenario_name}, seed {summary.get('seed', '?')}, "
        f"{summary.get('windows', len(run.metrics))} windows, "
        f"{seconds_text(run.virtual_time)} s {run.time_name}, updates {_updates(summary.get('updates'))}"
    ]
    final = accuracy(summary.get("final_accuracy"))
    best = accuracy(summary.get("best_accuracy"))
    evaluated = [a for m in run.metrics if (a := accuracy(m.get("accuracy"))) is not None]
    stated = final is not None
    if final is None and evaluated:
        final = evaluated[-1]
    if best is None and evaluated:
        best = max(evaluated)
    lines.append(
        "accuracy: "
        + (
            (f"{_final_accuracy_text(run, final)}" if stated else
             f"last evaluated {final:.4f} (summary.json states no final accuracy)")
            + f", best {best:.4f}"
            if final is not None and best is not None
            else "not evaluated"
        )
    )

    stopped = stop_counts(
        row.get("stop_kind")
        for row in run.clients
        if row.get("stopped_at") is not None or row.get("stop_reason")
    )
    stop_text = ", ".join(f"{n} {kind}" for kind, n in sorted(stopped.items(),
                                                             key=lambda item: (-item[1], item[0])))
    if run.clients or run.server_view or (run.path / CLIENTS_FILE).is_file():
        lines.append(
            f"clients: {len(run.clients)}; stopped {sum(stopped.values())}"
            + (f" ({stop_text})" if stop_text else "")
        )
    else:  # (a stranger read "clients: 0; stopped 0" above eps "over 10 clients")
        lines.append(f"clients: no {CLIENTS_FILE} in this run directory: their states and "
                     "stops are unknown")

    from fedsim.reporting.compare import accuracy_gaps, summary_gaps
    from fedsim.reporting.ledgers import ledger_gaps

    warnings: list[str] = ledger_gaps(run) + [f"warning: {gap}" for gap in accuracy_gaps(run)]
    final_eps = drawn.final_epsilon
    tuning = run.tuning
    if tuning is not None:  # a trial of `fedsim sweep --private-tuning`
        lines += tuning_lines(tuning, tuned or _tuned(run), warnings)
    if final_eps:
        own = _privacy_lines(drawn)
        if tuning is not None and tuning.release:
            own = [f"{line} (this trial alone: not the release's privacy)" for line in own]
        lines += own
        if run.server_view:  # its clients' statuses against their ledgers copied in
            from fedsim.reporting.server_view import status_disagreements

            warnings += status_disagreements(run.clients, final_eps)
        else:  # clients.csv and summary.json report eps under pld, whatever the ledgers' own
            warnings += _csv_disagreements(run, drawn.pld_epsilon)
            warnings += [f"warning: {gap}"
                         for gap in summary_gaps(run, drawn.pld_epsilon.values())]
    else:
        lines.append("privacy: no client ledgers in this run directory")
    mus = [mu for row in run.clients if (mu := finite_number(row.get("mu_clt"))) is not None]
    if mus:
        # Two mu a client: this one, from the CLT, and the trade-off plot's "GDP fit" (the
        # smallest mu whose mu-GDP (eps, delta) pairs hold for the accountant at every delta
        # from MIN_DELTA to 1 - 1e-9, fdp.fit_gdp_mu_accountant): a stranger took them for one.
        lines.append(f"CLT mu (approximation; not the trade-off plot's GDP-fit mu, whose "
                     f"(eps, delta) pairs the accountant guarantees for delta from "
                     f"{limits.MIN_DELTA:g} to 1 - 1e-9): {spread(mus)}")
        warnings.append(
            "warning: CLT mu values are approximations (Dong, Roth & Su, Gaussian "
            "Differential Privacy, Cor. 5.4; Bu et al. 2020), not guarantees"
        )
    lines.append("plots: " + ", ".join(str(p) for p in drawn.paths))
    explanation = summary.get("explanation")
    if isinstance(explanation, str) and explanation.strip():
        lines.append(explanation.strip())
    return lines + warnings


def _privacy_lines(drawn: Drawn) -> list[str]:
    """The clients' eps spread; one line per neighbouring relation where clients of both
    sampling schemes ran (a stranger read one spread over add/remove and replace-one
    guarantees, which the plots keep apart), each client's relation from its own ledger's
    header (clients.csv's row may be gone, or say otherwise)."""
    from fedsim.privacy.events import by_relation

    final_eps = drawn.final_epsilon
    groups = by_relation((drawn.sampling.get(client), eps) for client, eps in final_eps.items())
    head = f"privacy ({drawn.accountant}, delta = {drawn.delta:g})"
    if len(groups) == 1:
        return [f"{head}: eps {spread(final_eps.values())} over {len(final_eps)} clients"]
    return [f"{head}, {relation} neighbours: eps {spread(values)} over {len(values)} clients"
            for relation, values in groups.items()]


def _csv_disagreements(run: RunDirectory, final_eps: dict[str, float]) -> list[str]:
    problems = []
    for client_id, from_ledger in sorted(final_eps.items()):
        row = run.client(client_id)
        in_csv = finite_number(row.get("epsilon")) if row else None
        if in_csv is None:
            continue
        if abs(relative_gap(in_csv, from_ledger)) > CSV_RELATIVE_TOLERANCE:
            problems.append(
                f"warning: client {client_id}: clients.csv says eps {in_csv:.6g}, "
                f"its ledger gives {from_ledger:.6g}"
            )
    return problems


def tuning_lines(tuning: TuningRole, tuned: TunedPrivacy | None,
                 warnings: list[str]) -> list[str]:
    """What a private tuning's trial is (``summary.json`` ``private_tuning``): the release,
    whose privacy is the tuned eps ``tuned`` (:func:`~fedsim.reporting.ledgers.tuned_privacy`:
    recomputed from the sweep's tuning ledgers where they are beside it, the summary's figures
    checked against them; the words ``fedsim compare`` prints too), or a trial that must not be
    published. What is unverified or disagrees is appended to ``warnings``."""
    if not tuning.release or tuned is None:
        return [f"NOT A RELEASE: a private tuning's trial that was not selected (selected: "
                f"{tuning.selected or 'none'}); it must not be published"]
    warnings += [f"warning: {problem}" for problem in tuned.problems]
    if not tuned.epsilons:
        return [tuned.statement]
    return [f"{tuned.statement}; this trial is the tuning's release"]
