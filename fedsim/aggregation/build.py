"""The aggregation objects a scenario's ``server:`` section describes."""

from __future__ import annotations

from fedsim.aggregation.optimizers import Adaptive, Momentum, ServerOptimizer, Sgd
from fedsim.aggregation.policies import (
    AggregationPolicy,
    ConstantStaleness,
    FedAsync,
    FedBuff,
    HingeStaleness,
    PolynomialStaleness,
    StalenessWeight,
    TimeWindows,
)
from fedsim.config.aggregation import ServerOptimizerConfig, StalenessWeighting
from fedsim.config.schema import Server

__all__ = ["make_optimizer", "make_policy", "make_staleness_weight"]


def make_staleness_weight(config: StalenessWeighting) -> StalenessWeight:
    if config.kind == "polynomial":
        return PolynomialStaleness(config.a)
    if config.kind == "hinge":
        return HingeStaleness(config.a, config.b)
    return ConstantStaleness()


def make_policy(server: Server) -> AggregationPolicy:
    """``server.aggregation`` with ``server.staleness_weight``."""
    weight = make_staleness_weight(server.staleness_weight)
    config = server.aggregation
    if config.kind == "fedbuff":
        return FedBuff(config.buffer_size, weight)
    if config.kind == "fedasync":
        return FedAsync(config.alpha, weight)
    return TimeWindows(weight)


def make_optimizer(config: ServerOptimizerConfig) -> ServerOptimizer:
    if config.kind == "momentum":
        return Momentum(config.beta1)
    if config.kind in ("adam", "yogi"):
        return Adaptive(config.kind, config.beta1, config.beta2, config.tau)
    return Sgd()
