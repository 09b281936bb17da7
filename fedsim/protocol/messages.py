"""The messages actors exchange. The byte encoding is in :mod:`fedsim.protocol.codec`.

Parameters and updates travel as flat float32 vectors (the model's parameters concatenated in
``named_parameters()`` order); shapes are checked against the model on decode.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

import numpy as np

PROTOCOL_VERSION = 1


@dataclass(frozen=True, eq=False)
class ClientUpdate:
    """One noised local round: ``delta`` is Ubar/m (already clipped, noised, averaged).

    ``(client_id, round)`` identifies the update; the server applies each at most once.
    ``base_version`` is the global model version the round was computed on.
    """

    client_id: str
    round: int
    base_version: int
    delta: np.ndarray
    batch_size: float  # m (expected batch size for Poisson)
    num_samples: int  # the client's data set size N
    sent_at: float = 0.0  # sender's clock, for latency metrics only


@dataclass(frozen=True, eq=False)
class GlobalModel:
    """A global model broadcast by the server; clients ignore versions older than theirs."""

    version: int
    params: np.ndarray
    sent_at: float = 0.0


ClientState = Literal["training", "waiting", "budget_exhausted", "offline", "done", "crashed"]


@dataclass(frozen=True)
class ClientStatus:
    """A client's self-report: its state and what its ledger says it has spent."""

    client_id: str
    state: ClientState
    rounds: int
    epsilon: float
    delta: float
    detail: str = ""
    sent_at: float = 0.0
    extra: dict[str, float] = field(default_factory=dict)


Message = ClientUpdate | GlobalModel | ClientStatus
