"""What one server step moves the model by: the direction of the accepted updates (a time
window's, or an on-arrival policy's buffer) and of the aggregation nodes' groups, each with its
coefficient, and the bound that direction cannot exceed (:func:`check_model` holds the new
model to it through the server optimizer).

Pure functions of the server's settings (mixing strategy, aggregation policy, the population's
total weight) and its current version: :class:`~fedsim.runtime.actors.server.ServerActor`
applies what they return. The coefficient of update ``i`` is ``S(s_i) lambda_i``: its mixing
weight ``lambda_i`` (normalised over the mix, or over the population's ``total``) times the
policy's staleness factor at ``s_i = version - base_version``; an aggregation node's group
of one base version gets ``S(s) / total`` on its weighted sum (linear policies).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from fedsim.aggregation import AcceptedUpdate, MixingStrategy
from fedsim.aggregation.mixing import descent_direction, normalised_weights
from fedsim.aggregation.policies import AggregationPolicy, staleness_of
from fedsim.runtime.actors.partials import PartialGroup

__all__ = ["Mix", "direction_bound", "mix_updates", "mix_with_partials"]

Bounded = tuple[AcceptedUpdate, float | None]
"""An accepted update and the bound on its norm (None: its client's posture is not known)."""


@dataclass(frozen=True, eq=False)
class Mix:
    """A step's direction (float64), the bound on its norm (None: some part's bound is not
    known) and the ``(client_id, round, base_version)`` of every update in it."""

    direction: np.ndarray
    bound: float | None
    entries: list[tuple[str, int, int]]


def mix_updates(strategy: MixingStrategy, policy: AggregationPolicy, total: float | None,
                version: int, accepted: list[Bounded]) -> Mix:
    """The direction of ``accepted`` (at least one): weights normalised over them, or over
    ``total`` (the population's weight; None: over the mix), through the staleness factors.
    Overflow is left in the direction, for the step's check to refuse."""
    updates = [a for a, _ in accepted]
    factors = policy.factors(normalised_weights(strategy, updates, total),
                             staleness_of(version, [a.base_version for a in updates]))
    with np.errstate(over="ignore", invalid="ignore"):  # refused by the step's check
        direction = descent_direction(updates, factors)
    return Mix(direction, direction_bound(updates, factors, [b for _, b in accepted]),
               [(a.client_id, a.round, a.base_version) for a in updates])


def mix_with_partials(strategy: MixingStrategy, policy: AggregationPolicy,
                      total: float | None, version: int, size: int,
                      accepted: list[Bounded], groups: list[PartialGroup]) -> Mix:
    """A time window's direction with direct updates (possibly none) and aggregation nodes'
    ``groups``: each group's weighted sum gets ``S(s) / total`` (``total`` None: the direct
    updates' raw weights plus the groups' weights)."""
    updates = [a for a, _ in accepted]
    if total is None:
        raw = strategy.weights(updates) if updates else np.zeros(0)
        total = float(np.sum(raw)) + sum(g.weight for g in groups)
    direction = np.zeros(size, dtype=np.float64)
    bound: float | None = 0.0
    entries = []
    if updates:
        factors = policy.factors(normalised_weights(strategy, updates, total),
                                 staleness_of(version, [a.base_version for a in updates]))
        with np.errstate(over="ignore", invalid="ignore"):  # refused by the step's check
            direction += descent_direction(updates, factors)
        bound = direction_bound(updates, factors, [b for _, b in accepted])
        entries = [(a.client_id, a.round, a.base_version) for a in updates]
    for base, summed, _, group_bound, group_entries in groups:
        factor = float(policy.factors(np.array([1.0 / total]), staleness_of(version, [base]))[0])
        with np.errstate(over="ignore", invalid="ignore"):
            direction += factor * summed.astype(np.float64)
        bound = None if bound is None or group_bound is None \
            else bound + abs(factor) * group_bound
        entries.extend((e.client_id, e.round, e.base_version) for e in group_entries)
    return Mix(direction, bound, entries)


def direction_bound(accepted: list[AcceptedUpdate], factors: np.ndarray,
                    bounds: list[float | None]) -> float | None:
    """``D = sum_i |c_i| eta_i bound_i`` bounds the direction for its coefficients ``c_i``;
    the optimizer before the step turns it into a move bound (SGD: ``|s_t| D``; see
    :mod:`fedsim.aggregation.optimizers`). None: a client's bound is unknown."""
    known = [b for b in bounds if b is not None]
    if len(known) < len(bounds):
        return None
    return sum(abs(float(c)) * abs(u.step_size) * b
               for c, u, b in zip(factors, accepted, known, strict=True))
