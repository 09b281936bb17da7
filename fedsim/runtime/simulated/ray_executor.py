"""The batched training passes on Ray workers (``fedsim run --executor ray``; extra ``fedsim[ray]``).

The virtual-time kernel, the actors, the network, the ledgers and the server stay in one
deterministic process. Only the batched DP-SGD passes move: :class:`RayRoundBatcher` is the
run's :class:`~fedsim.training.rounds.RoundQueue` (a :class:`~fedsim.training.batched.RoundBatcher`
whose pass is remote). At start each of ``workers`` Ray actors (:class:`ShardWorker`) receives
the data shard of its clients (client ``i`` of the population goes to worker ``i mod workers``)
and a copy of the model; a pass sends each worker, per round of its clients, the parameter
vector, the batch's record indices, the noise key and the clipping norm and noise std, and the
worker runs the same phases (gather, noise, forward, clip factors, scatter) on its shard.

Same scenario and seed, same outputs: every draw is made in the kernel's process, as the
batcher reads the pass's rounds (:attr:`~fedsim.training.rounds.PendingRound.draws`: the values
drawn at a round's start), before any job is sent, and a round's arithmetic in
a batched pass depends on that round's rows and parameters alone (its products use its own
block, every other phase is row by row), so splitting a pass between workers does not change
any round's values. Which rounds are computed alone (a pass of one round, rounds the batched
pass does not cover) is decided in the kernel's process exactly as in-process, and those run
there. Workers run one torch thread each (as the scenario's ``torch_threads`` default).
Tested: ledgers and metrics byte-identical to the in-process run on a local Ray
(``tests/runtime/test_ray_executor.py``).
"""

from __future__ import annotations

import logging
import math
import socket
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
from torch import nn

from fedsim.errors import ConfigError
from fedsim.runtime.allocator import allocator_choice, keep_freed_memory
from fedsim.training.batched import PassResult, RoundBatcher
from fedsim.training.gaussian import NoiseKey
from fedsim.training.persample import LossFn, per_example_cross_entropy
from fedsim.training.rounds import StepDraws

if TYPE_CHECKING:
    from fedsim.runtime.population import Population

__all__ = ["RayRoundBatcher", "ShardWorker", "ray_available", "ray_batcher"]


def ray_available() -> bool:
    """Whether the optional ``ray`` package is installed (``pip install 'fedsim[ray]'``)."""
    try:
        import ray  # noqa: F401
    except ImportError:
        return False
    return True


def _ray() -> Any:
    try:
        import ray
    except ImportError:
        raise ConfigError("--executor ray needs the ray package: pip install 'fedsim[ray]'") from None
    return ray


@dataclass(frozen=True)
class _ShardClient:
    """A client's records on a worker: ``features[rows]`` of the worker's shard."""

    rows: torch.Tensor
    features: torch.Tensor
    labels: torch.Tensor
    loss_fn: LossFn

    def rows_of(self, indices: torch.Tensor) -> torch.Tensor:
        return self.rows.index_select(0, indices)


@dataclass(frozen=True)
class _RemotePending:
    trainer: _ShardClient


@dataclass(frozen=True)
class _RemoteJob:
    """What :meth:`RoundBatcher._pass` reads of a job (one segment of a round), rebuilt on the
    worker."""

    pending: _RemotePending
    params: np.ndarray
    indices: torch.Tensor
    draws: StepDraws
    size: int
    first: bool
    clip: float
    scale: float
    std: float


_ALIGNMENT = 64


def _placed(params: np.ndarray, alignment: int) -> np.ndarray:
    """``params`` copied to an address with the given remainder modulo 64 bytes.

    A round of one example multiplies by its weights with a matrix-vector kernel whose
    summation order depends on where the weights lie relative to a cache line (measured: a
    received model, a view at an odd offset of its message, gives other last bits than a fresh
    copy). The worker places each vector as the kernel's process held it, so the pass computes
    exactly what it computes in-process."""
    raw = np.empty(params.nbytes + _ALIGNMENT, dtype=np.uint8)
    start = (alignment - raw.ctypes.data) % _ALIGNMENT
    placed = np.frombuffer(raw, dtype=np.float32, count=params.size, offset=start)
    placed[...] = params
    return placed


class ShardWorker:
    """One worker's clients' data and the batched pass over their rounds (a Ray actor)."""

    def __init__(self, model: nn.Module, features: torch.Tensor, labels: torch.Tensor,
                 offsets: dict[int, tuple[int, int]], threads: int = 1,
                 loss_fn: LossFn = per_example_cross_entropy, own_process: bool = False) -> None:
        if own_process:  # a Ray worker's process is the worker's: keep freed memory for reuse
            keep_freed_memory()
        torch.set_num_threads(threads)
        self.batcher = RoundBatcher(model)
        self.clients = {
            key: _ShardClient(torch.arange(start, stop, dtype=torch.int64), features, labels,
                              loss_fn)
            for key, (start, stop) in offsets.items()
        }

    def records(self) -> int:
        """Records held (for the driver's check and the docs' sizing)."""
        return sum(len(c.rows) for c in self.clients.values())

    def run_pass(self, jobs: Sequence[tuple[int, tuple[np.ndarray, int], torch.Tensor,
                                            tuple[int, int], bool, float, float, float]]
                 ) -> tuple[list[np.ndarray], list[int], list[int], list[float], list[bool]]:
        """The batched pass over ``jobs``: (client, (params, alignment), record indices, noise
        key, first segment of its round, clip, scale, std) each; returns the updates, unclipped
        counts, counts of examples with a non-finite gradient norm, loss sums and finiteness."""
        remote = [
            _RemoteJob(_RemotePending(self.clients[key]), _placed(params, alignment), indices,
                       StepDraws(indices, NoiseKey(*noise), None), len(indices), first, clip,
                       scale, std)
            for key, (params, alignment), indices, noise, first, clip, scale, std in jobs
        ]
        updates, within, nonfinite, losses, finite, owners = self.batcher._pass(remote)  # type: ignore[arg-type]
        return ([u.numpy() if owner is None else owner for u, owner in zip(updates, owners,
                                                                            strict=True)],
                within, nonfinite, losses, finite)


class RayRoundBatcher(RoundBatcher):
    """A :class:`RoundBatcher` whose batched passes run on Ray workers holding the data shards."""

    def __init__(self, model: nn.Module, features: torch.Tensor, labels: torch.Tensor,
                 client_rows: Sequence[np.ndarray], *, workers: int = 2,
                 address: str | None = None, threads: int = 1,
                 loss_fn: LossFn = per_example_cross_entropy) -> None:
        super().__init__(model)
        _check_workers(workers)
        allocator_choice()  # a bad FEDSIM_ALLOCATOR is this call's ConfigError, not a worker's
        ray = _ray()
        if not ray.is_initialized():
            # Ray's INFO lines ("Started a local Ray instance") are not the run's: a run's
            # output is its own progress and files (--quiet left them printed, a stranger).
            if address is None:
                ray.init(num_cpus=workers, include_dashboard=False, log_to_driver=False,
                         logging_level=logging.WARNING)
            else:
                _connect(ray, address)
        self._ray = ray
        self.workers = workers
        # A client is found by the first of its (disjoint) rows.
        self._owner = np.full(len(features), -1, dtype=np.int64)
        shards: list[list[int]] = [[] for _ in range(workers)]
        for client, rows in enumerate(client_rows):
            self._owner[rows] = client
            shards[client % workers].append(client)
        self._rows = [np.asarray(rows, dtype=np.int64) for rows in client_rows]
        remote_class = ray.remote(num_cpus=threads)(ShardWorker)
        self._actors = []
        for clients in shards:
            offsets: dict[int, tuple[int, int]] = {}
            start = 0
            for client in clients:
                offsets[client] = (start, start + len(self._rows[client]))
                start += len(self._rows[client])
            shard = (torch.from_numpy(np.concatenate([self._rows[c] for c in clients]))
                     if clients else torch.zeros(0, dtype=torch.int64))
            self._actors.append(remote_class.remote(
                model, features.index_select(0, shard), labels.index_select(0, shard), offsets,
                threads, loss_fn, own_process=True))
        self._clients: dict[int, tuple[object, int]] = {}
        self.remote_passes = 0

    def _client_of(self, trainer: Any) -> int:
        known = self._clients.get(id(trainer))
        if known is not None and known[0] is trainer:
            return known[1]
        rows = getattr(trainer, "rows", None)
        if rows is None or len(rows) == 0:
            raise ConfigError("the ray executor needs trainers that hold row indices")
        client = int(self._owner[int(rows[0])])
        if client < 0 or not np.array_equal(self._rows[client], rows.numpy()):
            raise ConfigError("a trainer's records are not one client's records")
        self._clients[id(trainer)] = (trainer, client)
        return client

    def _pass(self, jobs: Sequence[Any]) -> PassResult:
        per_worker: list[list[int]] = [[] for _ in self._actors]
        payloads: list[list[tuple[Any, ...]]] = [[] for _ in self._actors]
        for position, job in enumerate(jobs):
            client = self._client_of(job.pending.trainer)
            worker = client % self.workers
            per_worker[worker].append(position)
            noise = job.draws.noise
            params = np.asarray(job.params, dtype=np.float32)
            payloads[worker].append((client, (params, params.ctypes.data % _ALIGNMENT),
                                     job.indices, (noise.seed, noise.gamma), job.first,
                                     job.clip, job.scale, job.std))
        futures = {w: self._actors[w].run_pass.remote(p) for w, p in enumerate(payloads) if p}
        updates: list[torch.Tensor | None] = [None] * len(jobs)
        owners: list[np.ndarray | None] = [None] * len(jobs)
        within = [0] * len(jobs)
        nonfinite = [0] * len(jobs)
        losses = [math.nan] * len(jobs)
        finite = [False] * len(jobs)
        for worker, future in futures.items():
            w_updates, w_within, w_nonfinite, w_losses, w_finite = self._ray.get(future)
            for k, position in enumerate(per_worker[worker]):
                owner = owners[position] = np.array(w_updates[k])  # the worker's, copied
                updates[position] = torch.from_numpy(owner)
                within[position], losses[position] = w_within[k], w_losses[k]
                nonfinite[position] = w_nonfinite[k]
                finite[position] = w_finite[k]
        self.remote_passes += 1
        return updates, within, nonfinite, losses, finite, owners  # type: ignore[return-value]

    def shutdown(self) -> None:
        """Stop the workers (the Ray session stays for the caller)."""
        for actor in self._actors:
            self._ray.kill(actor)
        self._actors = []


def ray_batcher(*, workers: int = 2, address: str | None = None,
                threads: int = 1) -> Callable[[Population], RayRoundBatcher]:
    """A ``make_batcher`` for :func:`~fedsim.runtime.simulated.simulation.run_scenario`: the population's
    batched passes on ``workers`` Ray actors (a local Ray, or the cluster at ``address``).
    Checked now, before a run directory holds anything: a :class:`ConfigError` without the
    ``ray`` package, for ``workers < 1``, and for an ``address`` where no cluster answers
    (connected to now, within :data:`CONNECT_TIMEOUT_S`)."""
    _check_workers(workers)
    ray = _ray()
    if address is not None and not ray.is_initialized():
        _connect(ray, address)

    def make(population: Population) -> RayRoundBatcher:
        return RayRoundBatcher(population.model, population.train_x, population.train_y,
                               [plan.indices for plan in population.plans], workers=workers,
                               address=address, threads=threads, loss_fn=population.loss_fn)

    return make


CONNECT_TIMEOUT_S = 5.0
"""How long ``--address``'s host may take to accept a connection before the run is refused
(Ray's own connection retries for a minute or more, printing only its C++ warnings)."""


def _check_workers(workers: int) -> None:
    if isinstance(workers, bool) or not isinstance(workers, int) or workers < 1:
        raise ConfigError(f"--ray-workers must be a whole number >= 1, got {workers!r}")


def _connect(ray: Any, address: str) -> None:
    """Connect to the Ray cluster at ``address``, first checking that its ``host:port``
    accepts a TCP connection (a ``ray://`` client address too; ``auto`` and other forms go
    to Ray as they are)."""
    host, _, port = address.removeprefix("ray://").rpartition(":")
    if host and port.isdigit():
        try:
            with socket.create_connection((host.strip("[]"), int(port)), timeout=CONNECT_TIMEOUT_S):
                pass
        except OSError as exc:
            reason = exc.strerror or type(exc).__name__
            raise ConfigError(
                f"--address {address}: no Ray cluster answers there ({reason}); start one with "
                "'ray start --head' and pass the address it prints, or leave --address out "
                "for a local Ray (docs/RAY.md)") from None
    try:
        ray.init(address=address, log_to_driver=False, logging_level=logging.WARNING)
    except (ConnectionError, RuntimeError, ValueError) as exc:
        raise ConfigError(f"--address {address}: cannot connect to Ray there: {exc}") from None
