"""Private hyperparameter search for ``fedsim sweep --private-tuning {nb,poisson}``
(Papernot & Steinke, "Hyperparameter Tuning with Renyi Differential Privacy", ICLR 2022).

The tuned mechanism: draw K from a public distribution (truncated negative binomial or Poisson
with mean ``--tuning-mean``), run K trials of the scenario, each with a candidate drawn
uniformly from the grid, and release only the best trial (by its final accuracy). Its bound
(:func:`fedsim.privacy.rdp.selection_rdp`) needs, for every client, each candidate's per-trial
mechanism, bounded BEFORE any trial runs (:func:`trial_steps`): the client's releases before
round one plus its group's ``rounds`` (or, without ``rounds``, as many rounds as its budget
admits by the ledger's own rule), never what a trial happened to spend.

K and the candidates are drawn from the operating system's entropy (:func:`draw_trials`), not
from the scenario seed: the theorems bound the release of the best trial *when K is unknown*;
an adversary who knows K (e.g. from the public seed) faces a fixed-K best-of-K mechanism, whose
cost grows like K-fold composition. The candidates' draws would reveal K too. For the same
reason only the selected trial's candidate and result are the release: the other trials, their
scores and K are simulator diagnostics that a deployment keeps secret.

Every client gets a tuning ledger (``tuning/ledgers/<client>.jsonl``, accountant ``rdp``)
holding one :class:`~fedsim.privacy.events.TunedSelection`, written before the first trial.
Its eps is the client's honest total: it already covers every trial, so the trials' own steps
are not composed beside it (the trial runs' ledgers still give each trial's own eps).
"""

from __future__ import annotations

import math
import random
import secrets
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
from scipy import stats

from fedsim.errors import ConfigError
from fedsim.privacy.epsilon_text import epsilon_text
from fedsim.privacy.events import GaussianStep, TunedSelection
from fedsim.privacy.tuning import PoissonTrials, TrialDistribution, TruncatedNegativeBinomial
from fedsim.runtime.run_outputs import TUNING_LEDGER_DIR as TUNING_LEDGER_DIR  # (a report's too)

_MAX_TRIALS = 100_000
_ROUNDS_CAP = 1 << 20
_ENTROPY = random.SystemRandom()
"""K's and the candidates' source: the operating system's entropy (``os.urandom``)."""


def trial_distribution(kind: str, mean: float, eta: float = 0.0) -> TrialDistribution:
    """K's distribution for ``--private-tuning``: ``nb`` the truncated negative binomial
    ``D_{eta, gamma}`` with E[K] = ``mean`` (eta = 0: the logarithmic distribution), ``poisson``
    Poisson(``mean``)."""
    if kind == "nb":
        return TruncatedNegativeBinomial.with_mean(eta, mean)
    if kind == "poisson":
        return PoissonTrials(mean)
    raise ConfigError(f"--private-tuning must be nb or poisson, got {kind!r}")


def selection_of(trials: TrialDistribution,
                 candidates: Sequence[Sequence[GaussianStep]]) -> TunedSelection:
    """The privacy event of a tuning with K ~ ``trials`` over ``candidates``' per-trial steps."""
    if isinstance(trials, TruncatedNegativeBinomial):
        return TunedSelection("negative_binomial", (trials.eta, trials.gamma),
                              tuple(tuple(c) for c in candidates))
    return TunedSelection("poisson", (trials.mu,), tuple(tuple(c) for c in candidates))


def draw_trials(trials: TrialDistribution) -> int:
    """K, drawn by inversion from one uniform of the operating system's entropy
    (:data:`_ENTROPY`; never the scenario seed: see the module docstring)."""
    uniform = _ENTROPY.random()
    start, total = (1 if isinstance(trials, TruncatedNegativeBinomial) else 0), 0.0
    while start < _MAX_TRIALS:
        k = np.arange(start, start + 1024)
        pmf = trials.pmf(k) if isinstance(trials, TruncatedNegativeBinomial) \
            else stats.poisson.pmf(k, trials.mu)
        cumulative = total + np.cumsum(pmf)
        hit = np.flatnonzero(cumulative >= uniform)
        if hit.size:
            return int(k[hit[0]])
        total, start = float(cumulative[-1]), start + 1024
    raise ConfigError(f"drew more than {_MAX_TRIALS} trials; choose a smaller --tuning-mean")


def trial_name(label: str, taken: set[str]) -> str:
    """A trial's directory name, ``trial-<8 hex>-<label>``, from the operating system's
    entropy and not in ``taken``: an index (``trial-003``) would tell whoever sees the
    released trial that at least four ran, and K must stay secret (module docstring)."""
    while True:
        name = f"trial-{secrets.token_hex(4)}-{label}"
        if name not in taken:
            return name


def draw_candidate(count: int) -> int:
    """A candidate's index, uniform over ``count``, from the operating system's entropy."""
    return _ENTROPY.randrange(count)


def trial_steps(scenario: str, overrides: Sequence[str],
                allow_factories: bool = False) -> dict[str, tuple[GaussianStep, ...]]:
    """Per client, every step one trial of the scenario (with ``overrides``) may release,
    known before it runs: the releases before round one and the per-round steps of the
    client's plan (the trainer's own :meth:`planned_steps`) for its group's ``rounds``, or,
    without ``rounds`` (a constant posture), for as many rounds as fit in its budget by the
    ledger's own rule (the ledger refuses any further round). A group with neither cannot be
    bounded and is refused."""
    from fedsim.config import load_scenario
    from fedsim.data.load import scenario_data
    from fedsim.privacy.accountant import make_accountant, make_accountant_class
    from fedsim.privacy.budget import Budget, largest_fitting_prefix
    from fedsim.privacy.group_schedules import release_steps
    from fedsim.privacy.ledger import ENFORCEMENT_FALLBACK
    from fedsim.runtime.population import VirtualDurationTrainer, client_plans
    from fedsim.runtime.rng import SeedTree

    loaded = load_scenario(scenario, list(overrides), allow_factories=allow_factories)
    tree = SeedTree(loaded.scenario.seed)
    found = scenario_data(loaded.scenario.dataset, base_dir=loaded.base_dir,
                          seed=tree.integer("dataset"))
    plans = client_plans(loaded, tree, found.tensors[1].numpy(), found.train_writers)
    out: dict[str, tuple[GaussianStep, ...]] = {}
    for plan in plans:
        group = plan.group
        trainer = VirtualDurationTrainer(plan, 0, seed=0)  # planned steps only
        before = release_steps(group)
        rounds = group.rounds or 0
        if group.rounds is None:
            if group.budget is None:
                raise ConfigError(
                    f"group {group.name!r}: private tuning needs each trial's releases bounded "
                    f"before it runs; give the group `rounds` or a budget")
            name = group.accountant if make_accountant_class(group.accountant).is_guarantee \
                else ENFORCEMENT_FALLBACK
            held = make_accountant(name, before)
            budget = Budget(group.budget.epsilon, group.budget.delta)
            one = trainer.planned_steps(0)  # no rounds: a constant posture (the schema's rule)
            count = 64
            while (rounds := largest_fitting_prefix(held, [one] * count, budget)) == count:
                count *= 2
                if count > _ROUNDS_CAP:
                    raise ConfigError(f"group {group.name!r}: its budget admits more than "
                                      f"{_ROUNDS_CAP} rounds; give it `rounds`")
        steps = [*before, *(s for r in range(rounds) for s in trainer.planned_steps(r))]
        out[plan.client_id] = tuple(steps)
    return out


def tuning_ledgers(out: Path, clients: dict[str, TunedSelection], delta: float,
                   budget_epsilon: float | None) -> dict[str, float]:
    """Write each client's tuning ledger (accountant ``rdp``, one selection, before any trial)
    and return its eps at ``delta``. With ``budget_epsilon`` a client whose selection does
    not fit is refused before anything is written."""
    from fedsim.privacy.accountant import make_accountant
    from fedsim.privacy.ledger import Budget, PrivacyLedger

    totals = {client: make_accountant("rdp", [selection]).epsilon(delta)
              for client, selection in clients.items()}
    over = {c: e for c, e in totals.items() if budget_epsilon is not None and e > budget_epsilon}
    if over:
        worst = max(over, key=lambda c: over[c])
        raise ConfigError(f"--tuning-budget {budget_epsilon:g}: the tuned total of {len(over)} "
                          f"client(s) exceeds it (largest: {worst}, eps {over[worst]:.6g} at "
                          f"delta {delta:g}); use fewer rounds, more noise or a smaller "
                          f"--tuning-mean")
    budget = Budget(budget_epsilon, delta) if budget_epsilon is not None else None
    for client, selection in clients.items():
        sampling = selection.sampling or "poisson"
        with PrivacyLedger.open(out / TUNING_LEDGER_DIR / f"{client}.jsonl", client_id=client,
                                sampling=sampling, budget=budget, accountant="rdp") as ledger:
            ledger.spend_selection(selection, time=0.0, round=-1)
            totals[client] = ledger.epsilon(delta)
    return totals


def over_budgets(scenario: str, candidates: Sequence[Sequence[str]],
                 selections: dict[str, TunedSelection],
                 allow_factories: bool = False) -> str | None:
    """One sentence on the clients whose tuned eps, at their budget's delta, exceeds their
    group's budget eps (its smallest over the ``candidates``' overrides); None if none does
    (the sweep refuses such a tuning without ``--tuning-budget``, and notes it with one).
    Each trial keeps to the budgets, the tuning as a whole need not (a stranger's release spent
    4.8 against budgets of 2.5 and 3, and its explanation said no client exceeded one)."""
    from fedsim.config import load_scenario
    from fedsim.privacy.accountant import make_accountant

    budgets: dict[str, tuple[float, float]] = {}
    for overrides in candidates:
        loaded = load_scenario(scenario, list(overrides), allow_factories=allow_factories)
        for group in loaded.scenario.clients.groups:
            if group.budget is None:
                continue
            for client in group.client_ids():
                if client not in budgets or group.budget.epsilon < budgets[client][0]:
                    budgets[client] = (group.budget.epsilon, group.budget.delta)
    over = {}
    for client, (epsilon, delta) in budgets.items():
        if client in selections:
            tuned = make_accountant("rdp", [selections[client]]).epsilon(delta)
            if tuned > epsilon:
                over[client] = (tuned, epsilon, delta)
    if not over:
        return None
    worst = max(over, key=lambda c: over[c][0] / over[c][1])
    tuned, epsilon, delta = over[worst]
    return (f"the tuning spends more than the budget of {len(over)} of {len(budgets)} "
            f"client(s) with one (largest: {worst}, tuned eps {epsilon_text(tuned)} against "
            f"its budget {epsilon:g} at delta {delta:g}): each trial kept to the budgets, the "
            f"tuning as a whole does not")


def best_trial(rows: Sequence[dict[str, Any]]) -> int | None:
    """Index of the trial with the highest final accuracy (the first among ties), None if no
    trial finished with one."""
    scored = [(row.get("final_accuracy"), -i) for i, row in enumerate(rows)
              if row.get("status") == "ok" and isinstance(row.get("final_accuracy"), float)
              and math.isfinite(row["final_accuracy"])]
    return -max(scored)[1] if scored else None


def mark_trials(dirs: Sequence[str], best: int | None, totals: dict[str, float],
                delta: float) -> None:
    """Say in each trial's own outputs what it is: the selected trial (the release) gets the
    tuned eps (``summary.json``: ``private_tuning`` and ``privacy.release``; ``clients.csv``: a
    ``tuned_epsilon`` column), since its own ledgers' eps omit the other trials and the
    selection (a researcher read the release's privacy from ``fedsim report`` on it, 2.3x
    low); every other trial says it is no release and must not be published."""
    from fedsim.reporting.plots import draw_all
    from fedsim.reporting.rundir import PLOT_DIR
    from fedsim.runtime.run_outputs import CLIENTS_FILE, SUMMARY_FILE, read_json, write_json

    selected = None if best is None else Path(dirs[best]).name
    ledgers = f"../{TUNING_LEDGER_DIR.as_posix()}"
    for index, directory in enumerate(dirs):
        trial = Path(directory)
        summary = read_json(trial / SUMMARY_FILE)
        if not summary:  # (a trial that failed before writing one)
            continue
        block, sentence = _tuning_block(index == best, selected, totals, delta, ledgers)
        summary["private_tuning"] = block
        if index == best:
            privacy = summary.get("privacy")
            if isinstance(privacy, dict):
                privacy["release"] = {key: block[key] for key in (
                    "epsilon_min", "epsilon_median", "epsilon_max", "accountant", "ledgers",
                    "note")}
            _add_tuned_column(trial / CLIENTS_FILE, totals)
        summary["explanation"] = f"{sentence} {summary.get('explanation') or ''}".strip()
        write_json(trial / SUMMARY_FILE, summary)
        if (trial / PLOT_DIR).is_dir():  # drawn with the trial: again, saying what it is
            draw_all(trial)


def _tuning_block(release: bool, selected: str | None, totals: dict[str, float], delta: float,
                  ledgers: str) -> tuple[dict[str, Any], str]:
    """A trial's ``summary.json`` ``private_tuning`` block and its explanation's sentence."""
    if not release:
        note = (f"NOT A RELEASE: a trial of a private hyperparameter tuning that was not "
                f"selected ({'none was' if selected is None else f'{selected} was'}); it must "
                f"not be published (nor its score, nor how many trials ran): the tuned eps "
                f"bounds only the selected trial's release")
        return {"release": False, "selected": False, "selected_trial": selected,
                "note": note}, note + "."
    values = sorted(totals.values())
    tuned_max = values[-1] if values else None
    note = (f"The release of a private hyperparameter tuning: its privacy is the tuned eps "
            f"(rdp, max {epsilon_text(values[-1])} at delta {delta:g}; per client: clients.csv "
            f"tuned_epsilon, the sweep's tuning ledgers {ledgers}), which covers every trial "
            f"and the selection. privacy.epsilon_min/median/max and clients.csv's epsilon are "
            f"this trial's own and understate the release's privacy" if values else
            "The release of a private hyperparameter tuning with no client")
    block = {"release": True, "selected": True, "selected_trial": selected, "delta": delta,
             "accountant": "rdp", "ledgers": ledgers,
             "epsilon_min": values[0] if values else None,
             "epsilon_median": float(np.median(values)) if values else None,
             "epsilon_max": tuned_max, "tuned_epsilon": dict(sorted(totals.items())),
             "note": note}
    return block, note + "."


def _add_tuned_column(path: Path, totals: dict[str, float]) -> None:
    """``clients.csv`` with a last column ``tuned_epsilon``: each client's tuned eps (its
    ``epsilon`` column stays the trial's own, as its ledger gives it)."""
    import csv
    import io

    from fedsim.atomic import write_atomically

    if not path.is_file():
        return
    rows = list(csv.reader(io.StringIO(path.read_text(encoding="utf-8"), newline="")))
    if not rows or "client_id" not in rows[0]:
        return
    at = rows[0].index("client_id")
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow([*rows[0], "tuned_epsilon"])
    for row in rows[1:]:
        total = totals.get(row[at]) if len(row) > at else None
        writer.writerow([*row, "" if total is None else repr(float(total))])
    write_atomically(path, out.getvalue(), durability="file")
