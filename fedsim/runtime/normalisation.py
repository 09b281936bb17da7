"""DP data normalisation in a run: a client group's ``dp_normalisation`` released, charged and
applied before the client's first round.

**What is released.** Before round 0 the client computes per-feature means and standard
deviations of its records with the Gaussian mechanism (:func:`fedsim.training.dp_stats.
dp_feature_moments`: each record's (features, squares) clipped jointly to L2 norm ``B``; under
Poisson sampling (add/remove neighbours) the record count is released with them, sensitivity
``sqrt(2) B``; under fixed-size batches (replace-one, N public) sensitivity ``2 B``; noise
``N(0, (sensitivity sigma)^2)`` per coordinate) and standardises its features with them. The
moments never leave the client, but every later update depends on them, so the analysis treats
them as published: by adaptive composition (Dong, Roth & Su 2022, Thm 2.7 for the Gaussian
mechanism's ``G_{1/sigma}``, Thm 3.2 for adaptive composition) the run is ``G_{1/sigma}
(x) C_q(G_{1/sigma_t})^{(x) T}``-DP under the client's relation - each DP-SGD step still clips
every (standardised) example's gradient to ``C`` given the moments. The release is one ledger
event ``GaussianStep(sampling, q = 1, sigma)`` at round :data:`NORMALISATION_ROUND`, charged
durably before the first round like any other release, and the client's accountant (PLD or RDP)
composes it with the rounds' steps; a noise ``target`` is calibrated for the rounds composed
with it (:func:`fedsim.privacy.group_schedules.make_schedule`).

**Budget.** :func:`check_normalisation_budget` refuses a scenario whose release alone exceeds a
group's budget (or its noise target) before anything runs; a resumed ledger without room for it
raises :class:`~fedsim.errors.BudgetExhausted` for that client only.

**Restarts.** The moments are kept beside the ledger (``<id>.moments.npz``, written after the
charge); a restarted client loads them. If the ledger holds the release but the file is gone
(a crash between the two writes), the client releases again and pays again (the safe
direction): a deployed client's noise comes from OS entropy and cannot be replayed.

**Evaluation.** Each client standardises its own records; the server standardises its held-out
set by that set's own exact moments (its own data: no privacy involved), so the global model is
trained and evaluated on one input scale (hence every group normalises, or none).
"""

from __future__ import annotations

import io
import math
import zipfile
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import torch

from fedsim.atomic import TooLarge, read_regular, write_atomically
from fedsim.config.schema import ClientGroup, Scenario, TargetNoise
from fedsim.errors import ConfigError, LedgerError
from fedsim.privacy.accountant import make_accountant, make_accountant_class
from fedsim.privacy.events import GaussianStep
from fedsim.privacy.group_schedules import normalisation_steps
from fedsim.privacy.ledger import ENFORCEMENT_FALLBACK, NORMALISATION_ROUND, PrivacyLedger
from fedsim.runtime.rng import SeedTree
from fedsim.training.dp_stats import FeatureMoments, dp_feature_moments, exact_moments

if TYPE_CHECKING:
    from fedsim.runtime.population import ClientPlan

__all__ = [
    "NORMALISATION_ROUND",
    "check_normalisation_budget",
    "check_release_budget",
    "held_out_features",
    "moments_file",
    "normalisation_generator",
    "normalised_features",
]


def moments_file(ledger_path: Path) -> Path:
    """Where a client keeps its released moments: beside its ledger."""
    return ledger_path.with_name(ledger_path.stem + ".moments.npz")


def normalisation_generator(tree: SeedTree, client_id: str, randomness: str) -> torch.Generator:
    """The release's noise: the simulator's stream ``client/<id>/dp-normalisation``, or, for a
    deployed client by default (``os_entropy``), a generator seeded from the operating system."""
    if randomness == "os_entropy":
        from fedsim.training.dpsgd import secure_generator

        return secure_generator()
    return tree.torch("client", client_id, "dp-normalisation")


def check_normalisation_budget(group: ClientGroup, where: str) -> None:
    """Raise :class:`ConfigError` if the group's normalisation release alone costs more than its
    budget or its noise target (under the accountant that enforces its budget)."""
    check_release_budget(group, normalisation_steps(group), f"{where}.dp_normalisation",
                         "raise its noise_multiplier")


def check_release_budget(group: ClientGroup, steps: Sequence[GaussianStep], where: str,
                         remedy: str) -> None:
    """Raise :class:`ConfigError` (naming ``where`` and saying ``remedy``) if the release
    ``steps`` before round 0 alone cost more than the group's budget or its noise target
    (under the accountant that enforces its budget)."""
    if not steps:
        return
    name = group.accountant if make_accountant_class(group.accountant).is_guarantee \
        else ENFORCEMENT_FALLBACK
    limits = []
    if group.budget is not None:
        limits.append(("budget", group.budget.epsilon, group.budget.delta))
    if isinstance(group.noise, TargetNoise):
        limits.append(("noise target", group.noise.epsilon, group.noise.delta))
    for label, epsilon, delta in limits:
        spent = make_accountant(name, steps).epsilon(delta)
        if spent > epsilon:
            raise ConfigError(
                f"{where}: its release alone costs eps={spent:.4g} at delta={delta:g}, more "
                f"than the {label}'s eps={epsilon:g}; {remedy}")


def held_out_features(scenario: Scenario, features: torch.Tensor) -> torch.Tensor:
    """The server's held-out features: standardised by their own exact moments (std floored at
    the groups' smallest ``min_std``) when the clients normalise theirs, else as given."""
    configs = [g.dp_normalisation for g in scenario.clients.groups if g.dp_normalisation]
    if not configs:
        return features
    return exact_moments(features, min_std=min(c.min_std for c in configs)).apply(features)


def normalised_features(plan: ClientPlan, features: torch.Tensor | None, ledger: PrivacyLedger,
                        generator: torch.Generator) -> torch.Tensor | None:
    """The client's features standardised by its released moments (``features`` as given
    without ``dp_normalisation``). The first call charges the release to ``ledger`` and keeps
    the moments beside it; later calls (a restart) load them. ``features`` None (a message-only
    run): the release is charged, nothing is computed."""
    config = plan.group.dp_normalisation
    if config is None:
        return features
    path = moments_file(ledger.path)
    charged = ledger.recorded(NORMALISATION_ROUND)
    if features is None:
        if not charged:
            ledger.spend(normalisation_steps(plan.group), time=ledger.last_time,
                         round=NORMALISATION_ROUND)
        return None
    if charged and path.exists():
        moments = _load(path, features)
    else:
        moments, step = dp_feature_moments(
            features, sampling=plan.group.sampling, noise_multiplier=config.noise_multiplier,
            bound=config.bound, generator=generator, min_std=config.min_std)
        ledger.spend([step], time=ledger.last_time, round=NORMALISATION_ROUND)
        _save(path, moments)
    return moments.apply(features)


def _save(path: Path, moments: FeatureMoments) -> None:
    """Durability ``"file"``: the ledger, fsynced before this write, records the release; if a
    power failure loses this file, the next start finds the release charged and no moments, and
    re-releases them (charged again: :func:`feature_moments`), which over-counts, never under.
    (A simulated run's ledger is written through, not fsynced: a power failure loses that run
    whole, and its directory is never run again.)"""
    write_atomically(
        path, lambda file: np.savez(file, mean=moments.mean.numpy(), std=moments.std.numpy()),
        durability="file")


def _moments_bytes(features: torch.Tensor) -> int:
    """The most bytes a moments file of ``features`` takes (two float64 arrays of a record's
    shape, and the archive's headers)."""
    return 2 * 8 * math.prod(features.shape[1:]) + 64 * 1024


def _load(path: Path, features: torch.Tensor) -> FeatureMoments:
    try:  # (a regular file of a bounded size: a FIFO in its place hung the client's start)
        data = read_regular(path, refuse_over=_moments_bytes(features))
        with np.load(io.BytesIO(data), allow_pickle=False) as stored:
            mean, std = stored["mean"], stored["std"]
    except TooLarge as exc:
        raise LedgerError(f"{path}: {exc}; stored moments are never that large") from None
    except (OSError, ValueError, KeyError, EOFError, zipfile.BadZipFile) as exc:
        raise LedgerError(f"{path}: the stored moments cannot be read ({type(exc).__name__}: "
                          f"{exc}); remove the file to release them again (charged again: "
                          f"over-counted, never under)") from None
    shape = tuple(features.shape[1:])
    if mean.shape != shape or std.shape != shape or not (
            np.isfinite(mean).all() and np.isfinite(std).all() and (std > 0).all()):
        raise LedgerError(f"{path}: stored moments do not fit features of shape {shape} "
                          f"(finite means and finite positive deviations)")
    return FeatureMoments(torch.from_numpy(mean).to(features.dtype),
                          torch.from_numpy(std).to(features.dtype))
