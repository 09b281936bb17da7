"""Checks before a run that save a wasted one: what can be known from the scenario, the partition
and the privacy accountant before any client trains.

* :func:`check_model_size`: the model is built on torch's ``meta`` device (shapes only, no
  memory) and refused when a layer is empty or negative, when it has more than
  :data:`~fedsim.config.limits.MAX_MODEL_PARAMETERS` parameters, or when its parameters do not
  fit in one network message (4 bytes each within ``network.max_message_bytes``);
* :func:`batch_problem`: every client of a group holds at least ``batch_size`` records
  (q = m/N <= 1), else a problem at the group's ``batch_size`` saying how many clients fall
  short and which batch size works (the caller lists every group's, as loading lists a file's:
  :meth:`fedsim.config.LoadedScenario.problems_error`);
* :func:`preflight_warnings`: clients whose budget cannot pay for a single round, found with
  the same accountant and rule the ledger enforces (so the warning is exact, not a guess);
  :func:`trains_nobody`: no client of any group can (``fedsim validate`` refuses the file).

Runs and ``fedsim validate`` call these; warnings go to the structlog log and to validate's
output.
"""

from __future__ import annotations

import warnings
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from functools import lru_cache
from typing import Any, NamedTuple, Protocol

import numpy as np
import torch

from fedsim.config import limits
from fedsim.config.schema import ClientGroup, FieldProblem
from fedsim.errors import FedsimError, ModelError
from fedsim.logging import get_logger
from fedsim.privacy.accountant import make_accountant, make_accountant_class
from fedsim.privacy.events import GaussianStep
from fedsim.privacy.ledger import ENFORCEMENT_FALLBACK
from fedsim.privacy.schedules import Schedule
from fedsim.training.models import MODELS

__all__ = ["batch_problem", "check_model_size", "first_round_fits", "preflight_warnings",
           "trains_nobody"]

_log = get_logger("fedsim.preflight")
_TENSOR_HEADER_ALLOWANCE = 64 * 1024  # the message header around a model's float32 values


class PlanLike(Protocol):
    """What the checks read of a client's plan (:class:`fedsim.runtime.simulated.simulation.ClientPlan`)."""

    @property
    def group(self) -> ClientGroup: ...

    @property
    def num_samples(self) -> int: ...

    @property
    def schedule(self) -> Schedule: ...


def check_model_size(name: str | None, options: Mapping[str, Any], *,
                     max_message_bytes: int) -> int:
    """The number of parameters of registered model ``name`` built with ``options``, or a
    :class:`ModelError` naming ``model.options`` when it cannot be trained here.

    Built on the ``meta`` device: shapes without memory, so a width of 2e9 costs nothing to
    check. Unknown names and wrong argument names are left to :func:`build_model`'s errors.
    """
    model = _meta_model(name, options)
    if model is None:
        return 0
    total = 0
    for param_name, param in model.named_parameters():
        if param.numel() == 0:
            raise ModelError(
                f"model.options: {name} with {dict(options)} has an empty parameter "
                f"{param_name} of shape {tuple(param.shape)}; every layer width must be >= 1")
        total += param.numel()
    if total > limits.MAX_MODEL_PARAMETERS:
        raise ModelError(
            f"model.options: {name} with {dict(options)} has {total:,} parameters, more than "
            f"the {limits.MAX_MODEL_PARAMETERS:,} fedsim trains (DP-SGD holds per-example "
            "gradients of a whole physical batch and the simulation several copies of the "
            "model)")
    needed = 4 * total + _TENSOR_HEADER_ALLOWANCE
    if needed > max_message_bytes:
        raise ModelError(
            f"model.options: {name} with {dict(options)} has {total:,} parameters, "
            f"{needed:,} bytes as a message, above network.max_message_bytes = "
            f"{max_message_bytes:,}; a model that does not fit in one message can never be "
            "broadcast (raise network.max_message_bytes or shrink the model)")
    return total


def _meta_model(name: str | None, options: Mapping[str, Any]) -> torch.nn.Module | None:
    """The registered model on the meta device; None when it is not a registered model or its
    argument names are wrong (the real build then says so)."""
    factory = MODELS.get(name) if name is not None else None
    if factory is None:
        return None
    for key, value in options.items():
        if isinstance(value, list) and len(value) > limits.MAX_MODEL_LAYERS:
            raise ModelError(f"model.options.{key}: {len(value)} items, more than the "
                             f"{limits.MAX_MODEL_LAYERS} layers a model may have")
    try:
        with torch.random.fork_rng(devices=[]), torch.device("meta"), warnings.catch_warnings():
            warnings.simplefilter("ignore")  # "zero-element tensors": reported by the caller
            return factory(**options)
    except TypeError:
        return None  # bad argument names: build_model says which
    except FedsimError:
        raise
    except Exception as exc:  # any shape the layers refuse (negative, zero groups, overflow)
        raise ModelError(f"model.options: {name} cannot be built with {dict(options)}: "
                         f"{type(exc).__name__}: {exc}; every layer size must be a whole "
                         f"number >= 1, the model at most {limits.MAX_MODEL_PARAMETERS:,} "
                         "parameters") from None


def batch_problem(index: int, group: ClientGroup, sizes: Sequence[int]) -> FieldProblem | None:
    """The problem of group ``index`` when its partition leaves a client with fewer than
    ``batch_size`` records (q = m/N > 1: no batch can be drawn), saying how many fall short
    and what works; None when every client holds a batch."""
    smallest = min(sizes)
    if group.batch_size <= smallest:
        return None
    short = sum(1 for size in sizes if size < group.batch_size)
    return FieldProblem(
        ("clients", "groups", index, "batch_size"),
        f"{group.batch_size} exceeds the records of {short} "
        f"of the group's {len(sizes)} clients (the smallest holds {smallest}; q = m/N would be "
        f"> 1, so they could never train); use batch_size <= {smallest}, raise data_share or "
        "lower count")


def first_round_fits(group: ClientGroup, num_samples: int, sigma: float) -> bool:
    """Whether a client of ``group`` holding ``num_samples`` records can release its first round
    within its budget: the ledger's own rule (its accountant, or the enforcing fallback for an
    approximation, composed over the round's steps and compared at the budget's delta)."""
    budget = group.budget
    if budget is None:
        return True
    return _fits(group.accountant, group.sampling, group.batch_size / num_samples, sigma,
                 group.local_steps, budget.epsilon, budget.delta)


@lru_cache(maxsize=4096)
def _fits(accountant: str, sampling: str, q: float, sigma: float, steps: int, epsilon: float,
          delta: float) -> bool:
    """One accountant evaluation per distinct question (groups often ask the same one)."""
    enforcing = accountant if make_accountant_class(accountant).is_guarantee \
        else ENFORCEMENT_FALLBACK
    step = GaussianStep(sampling, q, sigma, steps)  # type: ignore[arg-type]
    return make_accountant(enforcing, [step]).epsilon(delta) <= epsilon


def _smallest_affording(group: ClientGroup, sizes: np.ndarray, sigma: float) -> int | None:
    """The smallest size in ``sizes`` (sorted, distinct) whose first round fits, or None.

    A larger data set means a smaller q = m/N and so a cheaper round, hence bisection."""
    if first_round_fits(group, int(sizes[0]), sigma):
        return int(sizes[0])  # the usual case: every client can, one evaluation
    if not first_round_fits(group, int(sizes[-1]), sigma):
        return None
    low, high = -1, len(sizes) - 1  # sizes[high] fits; sizes[low] (if any) does not
    while high - low > 1:
        middle = (low + high) // 2
        if first_round_fits(group, int(sizes[middle]), sigma):
            high = middle
        else:
            low = middle
    return int(sizes[high])


class _GroupFirstRounds(NamedTuple):
    """Which clients of one group can release a first round within its budget."""

    name: str
    position: int  # in the scenario's groups
    group: ClientGroup
    sizes: np.ndarray  # each client's records
    sigma: float  # its first round's noise multiplier
    smallest: int | None  # the fewest records that afford it (None: no client's)

    @property
    def broke(self) -> int:
        """How many of the group's clients cannot afford a round."""
        return int(len(self.sizes) if self.smallest is None else (self.sizes < self.smallest).sum())


def _first_rounds(plans: Iterable[PlanLike]) -> list[_GroupFirstRounds]:
    """Per group, in the scenario's order, who can afford a first round: the one rule of
    :func:`preflight_warnings` and :func:`trains_nobody` (a group without a budget: all)."""
    by_group: dict[str, list[PlanLike]] = defaultdict(list)
    for plan in plans:
        by_group[plan.group.name].append(plan)
    found = []
    for position, (name, members) in enumerate(by_group.items()):
        group = members[0].group
        sizes = np.array([p.num_samples for p in members])
        sigma = float(members[0].schedule.sigma(0))
        smallest = (int(sizes.min()) if group.budget is None
                    else _smallest_affording(group, np.unique(sizes), sigma))
        found.append(_GroupFirstRounds(name, position, group, sizes, sigma, smallest))
    return found


def trains_nobody(plans: Iterable[PlanLike]) -> bool:
    """Whether no client at all can release a first round (every group has a budget, and no
    client of any group can pay for one round within it): a run would train nothing."""
    groups = _first_rounds(plans)
    return bool(groups) and all(g.smallest is None for g in groups)


def preflight_warnings(plans: Iterable[PlanLike], *, log: bool = True) -> list[str]:
    """Warnings (one line each) about clients that cannot train at all, also logged as
    structlog warnings when ``log``: per group, the clients whose budget cannot pay for one
    round."""
    lines = []
    for found in _first_rounds(plans):
        group, budget, smallest, broke = found.group, found.group.budget, found.smallest, found.broke
        if broke == 0 or budget is None:
            continue
        fix = ("no client of the group can (raise budget.epsilon or noise)" if smallest is None
               else f"a client needs at least {smallest} records at batch_size "
                    f"{group.batch_size}")
        line = (f"clients.groups[{found.position}]: {broke} of {len(found.sizes)} clients cannot "
                f"afford a single round within budget eps={budget.epsilon:g} at "
                f"delta={budget.delta:g} (sigma {found.sigma:.4g}, {group.local_steps} step(s) "
                f"per round, {group.accountant} accountant) and will never train; {fix}")
        if log:
            _log.warning("clients cannot afford a round", group=found.name, clients=broke,
                         of=len(found.sizes), smallest_affording=smallest, detail=line)
        lines.append(line)
    return lines
