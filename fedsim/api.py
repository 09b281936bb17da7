"""fedsim's Python API: load a scenario, simulate it, account for privacy (docs/API.md).

    import fedsim
    result = fedsim.simulate("scenarios/quickstart.yaml", seed=1,
                             overrides={"clients.groups[*].noise.sigma": 1.5})
    print(result.final_accuracy, result.epsilon_max)

:func:`simulate` runs exactly what ``fedsim run`` runs (the same population builder and
virtual-time run), with optionally your own model (an ``nn.Module`` factory) and your own data
(numpy arrays). With ``out=None`` nothing stays on disk: the clients' privacy ledgers are
durable files by design (a ledger is written before each release), so the run writes its
directory into a temporary directory, reads the results back into the :class:`RunResult`,
and removes it. :func:`account` answers what ``fedsim account`` answers, through the same
library call (:func:`fedsim.privacy.answers.account`).
"""

from __future__ import annotations

import copy
import json
import statistics
import tempfile
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from numbers import Integral, Real
from os import PathLike
from pathlib import Path
from typing import Any

import torch
from torch import nn

from fedsim.config.loading import LoadedScenario, apply_overrides, parse_scenario
from fedsim.config.loading import load_scenario as _load_file
from fedsim.config.schema import Scenario
from fedsim.errors import ConfigError
from fedsim.privacy.answers import DEFAULT_DELTA, AccountantChoice
from fedsim.privacy.answers import account as answer_question
from fedsim.privacy.events import Sampling

__all__ = ["ClientPrivacy", "RunResult", "account", "load_scenario", "simulate"]

ScenarioSource = str | PathLike[str] | Mapping[str, Any] | Scenario | LoadedScenario
Overrides = str | Sequence[str | tuple[str, Any]] | Mapping[str, Any] | None
OVERRIDES_LABEL = "overrides"
"""What errors call an override given from Python (the command line's are ``--set``)."""


@dataclass(frozen=True)
class ClientPrivacy:
    """One client's privacy at the end of a run (a row of ``clients.csv``).

    ``epsilon``: its guarantee at the scenario's ``privacy.delta`` (pld accountant), about its
    own data set. ``mu``: the CLT approximation of its GDP mu (not a guarantee).
    ``budget_left``: epsilon left of its budget (None without a budget).
    """

    client_id: str
    group: str
    epsilon: float
    mu: float
    budget_epsilon: float | None
    budget_left: float | None
    rounds: int
    steps: int
    state: str
    stop_reason: str
    stopped_at: float | None
    stop_kind: str | None = None
    """Why it stopped, typed (:class:`fedsim.runtime.actors.stops.ClientStopKind`'s value);
    None while it could still train."""
    budget_delta: float | None = None
    """The delta its budget holds at (None without a budget): a group's budget may be at
    another delta than ``privacy.delta``, the delta of ``epsilon``."""


@dataclass
class RunResult:
    """What :func:`simulate` returns.

    ``windows``: one row per server window (the lines of ``metrics.jsonl``: ``window``,
    ``time``, ``accuracy`` (None where not evaluated), ``loss``, ``received``, ``applied``,
    ...). ``summary``: ``summary.json``. ``run_dir``: the run directory, or None when
    ``out=None``. ``model``: the model with the final global parameters loaded.
    """

    final_accuracy: float | None
    best_accuracy: float | None
    windows: list[dict[str, Any]]
    clients: list[ClientPrivacy]
    summary: dict[str, Any]
    run_dir: Path | None
    model: nn.Module
    wall_seconds: float
    scenario: Scenario = field(repr=False)

    @property
    def delta(self) -> float:
        return float(self.summary["privacy"]["delta"])

    @property
    def virtual_time(self) -> float:
        return float(self.summary["virtual_time"])

    @property
    def epsilons(self) -> dict[str, float]:
        """Client id -> epsilon at :attr:`delta`."""
        return {c.client_id: c.epsilon for c in self.clients}

    @property
    def epsilon_min(self) -> float | None:
        return min(self.epsilons.values(), default=None)

    @property
    def epsilon_median(self) -> float | None:
        values = list(self.epsilons.values())
        return float(statistics.median(values)) if values else None

    @property
    def epsilon_max(self) -> float | None:
        return max(self.epsilons.values(), default=None)


# ---------------------------------------------------------------------------------------------
# Scenarios


OVERRIDE_FORMS = ("'path=value', a list of them, a list of (path, value) pairs or a mapping "
                  "{path: value}")


def _override_lines(overrides: Overrides) -> list[str]:
    """``overrides`` as ``--set`` lines; a :class:`ConfigError` naming the accepted forms for
    anything else."""
    if overrides is None:
        return []
    if isinstance(overrides, Mapping):
        return [_pair_line(path, value, f"{OVERRIDES_LABEL}[{path!r}]")
                for path, value in overrides.items()]
    if isinstance(overrides, str):
        return [overrides]
    if not isinstance(overrides, Sequence):
        raise ConfigError(f"{OVERRIDES_LABEL}: expected {OVERRIDE_FORMS}, got "
                          f"{type(overrides).__name__}")
    lines = []
    for index, item in enumerate(overrides):
        where = f"{OVERRIDES_LABEL}[{index}]"
        if isinstance(item, str):
            lines.append(item)
        elif isinstance(item, Sequence) and len(item) == 2:
            lines.append(_pair_line(item[0], item[1], where))
        else:
            raise ConfigError(f"{where}: expected 'path=value' or a (path, value) pair "
                              f"(overrides take {OVERRIDE_FORMS}), got {item!r}")
    return lines


def _pair_line(path: object, value: object, where: str) -> str:
    """A (path, value) override as a ``--set`` line: a JSON value is a YAML value, so the
    value reaches the tree unchanged."""
    if not isinstance(path, str):
        raise ConfigError(f"{where}: the path must be a string such as 'stop.windows', got "
                          f"{type(path).__name__} {path!r}")
    try:
        text = json.dumps(value, default=_plain_value, allow_nan=True)
    except (TypeError, ValueError):
        raise ConfigError(f"{where}: {path}'s value must be a YAML value (number, string, "
                          f"bool, None, list or mapping), got {type(value).__name__}") from None
    return f"{path}={text}"


def _plain_value(value: object) -> object:
    """A numpy scalar or array (``.tolist()``) as the Python value it holds."""
    tolist = getattr(value, "tolist", None)
    if callable(tolist):
        return tolist()
    raise TypeError(type(value).__name__)


def load_scenario(source: ScenarioSource, overrides: Overrides = None, *,
                  allow_factories: bool = False) -> LoadedScenario:
    """A validated scenario from a YAML file, a plain dict (as YAML would give), a
    :class:`Scenario` or a :class:`LoadedScenario`, with ``overrides`` applied in order
    (``["path=value", ...]`` as ``--set`` takes them, ``[(path, value), ...]`` or
    ``{"path": value}``; paths may use ``[*]`` and ``[name]``). Relative paths in a dict resolve against the current directory.
    ``allow_factories``: opt in to running the ``model.factory`` / ``dataset.factory`` it
    names (a :class:`LoadedScenario` given with the opt-in keeps it).

    Raises :class:`~fedsim.config.loading.ScenarioError` (a :class:`ConfigError`) listing
    every problem.
    """
    lines = _override_lines(overrides)
    if isinstance(source, str | PathLike):
        return _load_file(Path(source), lines, allow_factories=allow_factories,
                          label=OVERRIDES_LABEL)
    if isinstance(source, LoadedScenario):
        allow_factories = allow_factories or source.allow_factories
        if not lines:
            return replace(source, allow_factories=allow_factories)  # its lines kept
        tree, origin = source.scenario.model_dump(mode="json"), source.source
    elif isinstance(source, Scenario):
        if not lines:
            return LoadedScenario(source, None, allow_factories)
        tree, origin = source.model_dump(mode="json"), None
    elif isinstance(source, Mapping):
        tree, origin = copy.deepcopy(dict(source)), None
    else:
        raise ConfigError(f"scenario: expected a file path, a dict or a Scenario, got "
                          f"{type(source).__name__}")
    tree, written = apply_overrides(tree, lines, OVERRIDES_LABEL)
    scenario = parse_scenario(tree, source=str(origin or "<scenario>"), written=written,
                              label=OVERRIDES_LABEL)
    return LoadedScenario(scenario, origin, allow_factories)


# ---------------------------------------------------------------------------------------------
# Simulating


def simulate(
    scenario: ScenarioSource,
    *,
    seed: int | None = None,
    out: str | PathLike[str] | None = None,
    overrides: Overrides = None,
    model: Callable[..., nn.Module] | None = None,
    dataset: Any = None,
    progress: bool | None = None,
    tensorboard: str | PathLike[str] | None = None,
    plots: bool = True,
    allow_factories: bool = False,
    loss: Callable[[torch.Tensor, torch.Tensor], torch.Tensor] | None = None,
    fix_batchnorm: bool = False,
) -> RunResult:
    """Simulate ``scenario`` under virtual time (as ``fedsim run``) and return its results.

    Args:
        scenario: a YAML path, a dict, a :class:`Scenario` or a :class:`LoadedScenario`.
        seed: replaces the scenario's seed.
        out: the run directory to write (it must not hold a run); None: a temporary one,
            removed before returning (``RunResult.run_dir`` is then None).
        overrides: ``--set``-style overrides (see :func:`load_scenario`).
        model: a factory returning a ``torch.nn.Module``, called with ``input_shape`` and
            ``num_classes`` if it takes them (and ``options`` from the scenario's ``model``
            section, which it otherwise replaces); checked for DP compatibility.
        dataset: ``x_train, y_train, x_test, y_test`` arrays (a mapping with those keys or a
            4-tuple; see :mod:`fedsim.data.arrays`), or a ``(train, test)`` pair of
            map-style torch Datasets (read once into tensors; see
            :mod:`fedsim.data.factory_data`); replaces the scenario's data set (recorded
            as ``name: arrays`` without a path). Partitions work on it as on MNIST.
        progress: True shows a progress bar on stderr, False none, None (default) only
            when stderr is a terminal.
        tensorboard: also write TensorBoard scalars to this directory (needs the
            ``fedsim[tensorboard]`` extra).
        plots: draw the run directory's plots (only when ``out`` is given).
        allow_factories: run the ``model.factory`` / ``dataset.factory`` the scenario names
            (Python code it makes this process import and call); a scenario naming one is
            refused without it. Your own ``model`` and ``dataset`` arguments need no opt-in.
        loss: the training loss, ``loss(outputs, targets)`` -> one value per example
            (``reduction='none'``; checked on a probe batch), instead of cross-entropy or
            the scenario's ``model.loss``.
        fix_batchnorm: replace the model's BatchNorm layers by GroupNorm (as
            ``model.fix_batchnorm: true``) instead of refusing the model.
    """
    from fedsim.data.factory_data import user_data
    from fedsim.reporting.tensorboard import tensorboard_during
    from fedsim.runtime.run_outputs import require_new_run_dir, require_writable_dir
    from fedsim.runtime.simulated.simulation import build_population, run_scenario
    from fedsim.training import load_flat_params
    from fedsim.training.preflight import preflight_warnings

    if out is not None:
        require_new_run_dir(out, "out")  # before any work (run_scenario checks again)
    if tensorboard is not None:
        require_writable_dir(tensorboard, "tensorboard")

    lines = _override_lines(overrides)
    if seed is not None:  # validated as the scenario's seed field (a whole number >= 0)
        lines.append(_pair_line("seed", seed, "seed"))
    if model is not None:
        if not callable(model):
            raise ConfigError(f"model: expected a callable returning a torch.nn.Module, got "
                              f"{type(model).__name__}")
        # neither name nor factory: the model comes from Python (options are kept)
        lines += ["model.name=null", "model.factory=null"]
    data = None
    if dataset is not None:
        data = user_data(dataset, where="dataset (from Python)")
        lines += ["dataset.name=arrays", "dataset.path=null", "dataset.factory=null",
                  "dataset.options={}"]
    loaded = load_scenario(scenario, lines, allow_factories=allow_factories)
    if tensorboard is not None:
        from fedsim.reporting.tensorboard import require_tensorboard

        require_tensorboard()
    population = build_population(loaded, model_factory=model, data=data, loss=loss,
                                  fix_batchnorm=fix_batchnorm)
    preflight_warnings(population.plans)  # as `fedsim run`: logged before anything trains
    with tempfile.TemporaryDirectory(prefix="fedsim-run-") as scratch:
        run_dir = Path(out) if out is not None else Path(scratch) / "run"
        with tensorboard_during(tensorboard, run_dir) as to_tensorboard:  # per window
            result = _run(loaded, population, run_dir, progress, run_scenario, to_tensorboard)
        from fedsim.reporting.stops import log_stops

        log_stops(result.summary["stopped"])
        if out is not None and plots:
            from fedsim.reporting.plots import draw_all

            draw_all(run_dir)
        outcome = _collect(result, run_dir, loaded.scenario, kept=out is not None)
    trained = population.model
    with torch.no_grad():
        load_flat_params(trained, result.final_params)
    outcome.model = trained
    return outcome


def _plain_numbers(*, numbers: Mapping[str, object], counts: Mapping[str, object]
                   ) -> dict[str, Any]:
    """:func:`account`'s numeric arguments as the types its command's flags parse to (float,
    int; a numpy scalar is one), or a :class:`ConfigError` naming the argument (``q="0.01"``
    was a TypeError from deep inside the accountant). The ranges are the library call's to
    check."""
    plain: dict[str, Any] = {}
    for name, value in numbers.items():
        if value is not None and (isinstance(value, bool) or not isinstance(value, Real)):
            raise ConfigError(f"{name}: expected a number, got {type(value).__name__} {value!r}")
        plain[name] = None if value is None else float(value)
    for name, value in counts.items():
        if value is not None and (isinstance(value, bool) or not isinstance(value, Integral)):
            raise ConfigError(f"{name}: expected a whole number, got {type(value).__name__} "
                              f"{value!r}")
        plain[name] = None if value is None else int(value)
    return plain


def _run(loaded: LoadedScenario, population: Any, run_dir: Path, progress: bool | None,
         run_scenario: Callable[..., Any],
         also: Callable[[dict[str, Any]], None] = lambda line: None) -> Any:
    """The run, with the bar ``fedsim run`` shows: in virtual seconds, its total the run's
    horizon (:func:`fedsim.reporting.horizon.run_horizon`: the first of the stops, the budgets'
    end estimated), corrected as the windows come as ``fedsim run`` corrects it."""
    from fedsim.reporting.horizon import RunBar
    from fedsim.reporting.progress import RunProgress, log_evaluation

    shown = RunBar(loaded.scenario, population.plans)
    with RunProgress(shown.horizon.seconds, unit="time", enabled=progress) as bar:
        def on_window(line: dict[str, Any]) -> None:
            shown.on_window(bar, line)
            log_evaluation(line)
            also(line)  # e.g. TensorBoard scalars as the run goes

        result = run_scenario(loaded, run_dir, on_window=on_window, population=population)
        shown.on_end(bar, result.summary)
        return result


def _collect(result: Any, run_dir: Path, scenario: Scenario, *, kept: bool) -> RunResult:
    """The run's results as the simulation computed them (not read back from the run
    directory, whose CSV cells cannot hold an unbounded epsilon: it stays ``inf`` here)."""
    clients = [
        ClientPrivacy(
            client_id=str(row["client_id"]), group=str(row["group"]),
            epsilon=float(row["epsilon"]), mu=float(row["mu_clt"]),
            budget_epsilon=row["budget_epsilon"], budget_left=row["remaining_epsilon"],
            rounds=int(row["rounds"]), steps=int(row["steps"]),
            state=str(row["state"]), stop_reason=str(row["stop_reason"]),
            stopped_at=row["stopped_at"],
            stop_kind=None if row["stop_kind"] is None else str(row["stop_kind"]),
            budget_delta=row["budget_delta"],
        )
        for row in result.client_rows
    ]
    summary = result.summary
    return RunResult(
        final_accuracy=summary.get("final_accuracy"),
        best_accuracy=summary.get("best_accuracy"),
        windows=[dict(m) for m in result.metrics],
        clients=clients,
        summary=summary,
        run_dir=run_dir.resolve() if kept else None,
        model=nn.Identity(),  # replaced by the trained model
        wall_seconds=result.wall_seconds,
        scenario=scenario,
    )


# ---------------------------------------------------------------------------------------------
# Accounting


def account(
    *,
    sampling: Sampling | None = None,
    q: float | None = None,
    batch_size: int | None = None,
    dataset_size: int | None = None,
    sigma: float | None = None,
    steps: int | None = None,
    epochs: float | None = None,
    ledger: str | PathLike[str] | None = None,
    delta: float | None = None,
    accountant: AccountantChoice | None = None,
    epsilon: float | None = None,
    target_epsilon: float | None = None,
    max_steps: bool = False,
    group_size: int | None = None,
    plot: str | PathLike[str] | None = None,
) -> dict[str, Any]:
    """What ``fedsim account`` answers, as a dict (its ``--json`` object), through the same
    library call (:func:`fedsim.privacy.answers.account`, whose typed answer this is as a dict).

    Each argument is the command's flag of the same name (``batch_size`` is
    ``--batch-size``, ...); an argument left None takes the command's default. Examples::

        fedsim.account(q=0.01, sigma=1.1, steps=1000)["epsilon"]      # eps at delta 1e-5
        fedsim.account(q=0.01, steps=1000, target_epsilon=3.0)["sigma"]
        fedsim.account(ledger="runs/x/ledgers/phone-000.jsonl")

    Raises :class:`ConfigError` for a combination the command refuses.
    """
    from fedsim.commands.account import plot as draw

    plain = _plain_numbers(
        numbers={"q": q, "sigma": sigma, "epochs": epochs, "epsilon": epsilon,
                 "target_epsilon": target_epsilon,
                 "delta": DEFAULT_DELTA if delta is None else delta},
        counts={"batch_size": batch_size, "dataset_size": dataset_size, "steps": steps,
                "group_size": 1 if group_size is None else group_size})
    answer = answer_question(
        sampling=sampling, ledger=ledger, accountant="pld" if accountant is None else accountant,
        max_steps=bool(max_steps), curve=plot is not None, **plain)
    result = answer.as_dict()
    if plot is not None:
        draw(Path(plot), answer)
        result["plot"] = str(plot)
    return result
