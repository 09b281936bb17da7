"""What a restarted server continues from: its state between windows (:class:`ServerSnapshot`,
taken by :meth:`~fedsim.runtime.actors.server.ServerActor.snapshot`, written and read by the
deployed server's checkpoint, :mod:`fedsim.runtime.deployed.checkpoint`), and the check a
snapshot passes before a server takes it.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from fedsim.errors import ConfigError
from fedsim.runtime.actors.client_book import BookState
from fedsim.runtime.actors.integrity import bad_model

__all__ = ["ServerSnapshot", "check_snapshot"]


@dataclass(frozen=True, eq=False)
class ServerSnapshot:
    """Everything a restarted server needs to continue where :meth:`ServerActor.snapshot` was
    taken: the model and its version, the client book (what was judged of each client, its
    status, the published versions and kept invitations: :mod:`~fedsim.runtime.actors.client_book`),
    the window count and clock time, the step-size schedule's and participation generator's
    state and the last evaluation. Updates waiting in the current window are not part of it."""

    params: np.ndarray
    version: int
    windows_closed: int
    time: float
    book: BookState
    step_size_state: dict[str, float | int]
    rng_state: dict[str, object]
    last_accuracy: float | None
    evaluated_version: int
    last_evaluation: tuple[float, float]
    incarnations: tuple[str, ...] = ()
    optimizer_state: dict[str, np.ndarray] = field(default_factory=dict)
    aggregator_marks: dict[str, int] = field(default_factory=dict)
    """The clients named to the aggregation nodes with their marks
    (:class:`~fedsim.runtime.actors.partials.CloseNotes`): a restarted server names them
    again."""
    version_ceiling: int | None = None
    """No version above it was published before a later snapshot (None: ``version``); a
    restored server renews its version above it (:meth:`ServerActor.renew_version`)."""


def check_snapshot(snapshot: ServerSnapshot, size: int) -> None:
    """Raise :class:`ConfigError` unless ``snapshot``'s model is one a server of ``size``
    parameters can continue from (its size; finite and bounded: :func:`bad_model`)."""
    if snapshot.params.shape != (size,):
        raise ConfigError(f"snapshot has {snapshot.params.size} parameters, the model {size}")
    problem = bad_model(np.asarray(snapshot.params), size)
    if problem:
        raise ConfigError(f"snapshot's model is unusable: {problem}")
