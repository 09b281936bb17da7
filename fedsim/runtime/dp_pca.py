"""DP principal components in a run: every client's ``dp_pca`` release, charged to its ledger
before the first round, and the one projection everybody trains on.

**What is released.** Before round 0 each client releases ``sum_i x_i x_i^T + E`` over its own
records (each record's features clipped to norm ``c``; ``E`` symmetric Gaussian; "Analyze
Gauss", Dwork, Talwar, Thakurta & Zhang 2014; :func:`fedsim.training.dp_pca.dp_second_moment`:
sensitivity ``c^2`` under Poisson sampling's add/remove relation, ``sqrt(2) c^2`` under
fixed-size batches' replace-one). The release is one ledger event ``GaussianStep(sampling,
q = 1, sigma)`` at round :data:`NORMALISATION_ROUND` (the round of every release before the
first one), charged durably before the first round; by adaptive composition (Dong, Roth & Su
2022, Thm 3.2) the client's run is ``G_{1/sigma} (x) C_q(G_{1/sigma_t})^{(x) T}``-DP under
its relation, and its accountant (PLD or RDP) composes the two; a group's DP-SGD noise
``target`` is calibrated for the rounds composed with the release
(:func:`fedsim.privacy.group_schedules.make_schedule`).

**Why one shared projection.** The global model needs one input space: a projection per client
would give every client's coordinates a different meaning. The released matrices are summed
and the top-``k`` eigenvectors of the sum are the projection every client trains on and the
server evaluates its held-out set with (paper 000: "DP-SGD can be seen as a post-processing
after PCA"). The sum and its eigenvectors are post-processing of the clients' DP releases:
no client pays for another's, and each client's DP-SGD steps see the projection as public.
Gathering the matrices needs every client before round 0, which the simulated runtime does
here; a deployed run would need them sent to the server first, so deployment refuses
``dp_pca`` (:mod:`fedsim.runtime.deployed.guarantees`).

**With dp_normalisation** (project, then standardise): the projection is taken of the raw
records as above; each client then releases the moments of its *projected* coordinates and
standardises them (:mod:`fedsim.runtime.normalisation`, charged by its trainer at round
:data:`NORMALISATION_ROUND` too), and the server standardises its projected held-out set by
that set's own moments (:meth:`Population.project`), so clients and server transform inputs
the same way. The two releases are two events on the ledger, composed with the steps by its
accountant like any others (the projection the second one sees is post-processing of the
releases: adaptive composition), and a noise ``target`` is calibrated for both
(:func:`~fedsim.privacy.group_schedules.release_steps`).

**Budget.** :func:`check_pca_budget` refuses a scenario whose release alone exceeds a group's
budget (or its noise target) before anything runs; a ledger that still refuses the charge
(:class:`~fedsim.errors.BudgetExhausted`) is logged, that client's matrix is left out of the
sum (it released nothing) and its ledger stops it at its first round.

**Output.** The projection is written beside the ledgers (:data:`PCA_FILE`, its ``basis``:
d x k) after every charge. A run directory is never reused (its ledgers would continue), and a
population whose features were projected cannot run again (the new run's ledgers would lack
the release): :func:`release_projection` refuses it.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import torch

from fedsim.atomic import write_atomically
from fedsim.config.schema import ClientGroup, Scenario
from fedsim.errors import BudgetExhausted, ConfigError
from fedsim.logging import get_logger
from fedsim.privacy.events import GaussianStep
from fedsim.privacy.group_schedules import pca_sigma, pca_steps, release_steps
from fedsim.privacy.ledger import NORMALISATION_ROUND, PrivacyLedger
from fedsim.runtime.normalisation import check_release_budget
from fedsim.training.dp_pca import Projection, dp_second_moment, top_components

if TYPE_CHECKING:
    from fedsim.runtime.population import Population

__all__ = ["PCA_FILE", "check_pca_budget", "pca_components", "release_projection"]

PCA_FILE = "dp-pca.npz"
"""The shared projection's file, in the ledgers' directory."""

_log = get_logger("fedsim.runtime.dp_pca")


def pca_components(scenario: Scenario) -> int | None:
    """The number of components every group keeps (None: the scenario has no ``dp_pca``; the
    schema makes it every group's or none's, with one ``components``)."""
    config = scenario.clients.groups[0].dp_pca
    return None if config is None else config.components


def check_pca_budget(group: ClientGroup, where: str) -> None:
    """Raise :class:`ConfigError` if the group's DP-PCA release alone (with a
    ``dp_normalisation``: the two releases together) costs more than its budget or its noise
    target."""
    both = group.dp_normalisation is not None
    check_release_budget(group, release_steps(group) if both else pca_steps(group),
                         f"{where}.dp_pca" + (" with its dp_normalisation" if both else ""),
                         "raise its noise (or lower its target's epsilon)")


def release_projection(population: Population, ledgers: Mapping[str, PrivacyLedger],
                       directory: Path, *, message_only: bool = False) -> Projection | None:
    """Every client's DP-PCA release charged to its ledger in ``ledgers`` (by client id) and
    the shared projection of their sum, kept in ``directory`` (module docstring); None
    without ``dp_pca``, or for a message-only run (charged, nothing computed). Noise from the
    simulator's stream ``client/<id>/dp-pca``."""
    components = pca_components(population.scenario)
    if components is None:
        return None
    if population.pca_released:
        raise ConfigError("dp_pca: this population's releases were made for another run; "
                          "build the population again")
    if message_only:
        for plan in population.plans:
            _spend(ledgers[plan.client_id], pca_steps(plan.group)[0], plan.client_id)
        return None
    total: torch.Tensor | None = None
    for plan in population.plans:
        group = plan.group
        assert group.dp_pca is not None and (sigma := pca_sigma(group)) is not None
        index = torch.from_numpy(np.asarray(plan.indices, dtype=np.int64))
        matrix, step = dp_second_moment(
            population.train_x.index_select(0, index), sampling=group.sampling,
            noise_multiplier=sigma, clip=group.dp_pca.clip,
            generator=population.tree.torch("client", plan.client_id, "dp-pca"))
        if _spend(ledgers[plan.client_id], step, plan.client_id):
            total = matrix if total is None else total + matrix
    if total is None:
        raise ConfigError("dp_pca: no client had the budget to release its matrix")
    projection = top_components(total, components)
    _save(directory / PCA_FILE, projection)
    return projection


def _spend(ledger: PrivacyLedger, step: GaussianStep, client_id: str) -> bool:
    """Charge the release; False (logged) when the client's budget has no room for it."""
    try:
        ledger.spend([step], time=ledger.last_time, round=NORMALISATION_ROUND)
    except BudgetExhausted as exc:
        _log.warning("dp_pca_release_refused", client_id=client_id, reason=str(exc))
        return False
    return True


def _save(path: Path, projection: Projection) -> None:
    """The shared projection beside the ledgers (an output: a lost file on power failure
    costs nothing, the run never reads it back)."""
    write_atomically(path, lambda file: np.savez(file, basis=projection.basis.numpy()),
                     durability="file")
