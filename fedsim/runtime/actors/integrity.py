"""What the server checks before an update, a status or a mixed model is trusted.

Any client may be malicious (docs/SECURITY.md). The server knows every client's DP posture from
the scenario (clip ``C_t``, noise multiplier ``sigma_t``, expected batch size ``m``, sampling
scheme, data size ``N``, local steps ``k``, round limit), so it knows how large an honest
update can be, and refuses anything larger before it reaches the mix.

**The norm bound** (:func:`update_norm_bound`). A round of ``k`` DP-SGD steps releases
``u = sum_j (S_j + Z_j) / m`` with ``S_j`` the sum of the step's clipped per-example gradients
(``||S_j|| <= |B_j| C``) and ``Z_j ~ N(0, (s C sigma)^2 I_d)`` its noise, ``s = 1`` for Poisson
(add/remove, sensitivity C) and ``s = 2`` for fixed-size batches (replace-one, sensitivity 2C).
By the triangle inequality ``||u|| <= (C sum_j |B_j| + ||sum_j Z_j||) / m``. Two tail events,
each allowed probability ``p/2``:

* **batch sizes.** Fixed size: ``sum_j |B_j| = k m`` exactly. Poisson with the public rate
  ``q = m/N`` (N the *declared* size; the real one may exceed it by the neighbouring record):
  ``sum_j |B_j|`` is at most Binomial(``k (N+1)``, ``q``), mean ``mu = k m (N+1)/N``; the
  multiplicative Chernoff bound
  ``P(X >= (1+d) mu) <= exp(-d^2 mu / (2 + d))`` (Mitzenmacher & Upfal, Thm 4.4) is ``p/2`` at
  ``d = (x + sqrt(x^2 + 8 mu x)) / (2 mu)``, ``x = ln(2/p)``; and never more than
  ``k (N+1)``.
* **noise.** ``sum_j Z_j ~ N(0, k (s C sigma)^2 I_d)``, so ``||sum_j Z_j||^2 / (k (s C
  sigma)^2)`` is chi-square with ``d`` degrees of freedom, and Laurent & Massart (2000, Lemma 1)
  give ``P(chi2_d >= d + 2 sqrt(d x) + 2 x) <= exp(-x)``, here with ``x = ln(2/p)``.

So an honest update exceeds the bound with probability at most ``p`` (union bound);
:data:`FAILURE_PROBABILITY` is ``1e-12`` per update: a run of a million updates rejects an
honest one with probability below ``1e-6``. The bound says nothing about direction: a malicious
client can still push the model anywhere *within* it, every round (see docs/SECURITY.md).

**Compressed updates** (the group's ``compression:``). The server judges the decoded vector.
Sparsification (top-k, threshold) only zeroes coordinates, so the decoded norm is at most the
update's and the bound stands. Stochastic quantisation moves each coordinate by an error
``e_i`` in ``(-h, h)``, zero-mean and independent given the update ``x`` (public randomness),
``h = (max x - min x) / (2^b - 1) <= 2 ||x||_inf / (2^b - 1)``, so
``||x + e||^2 = ||x||^2 + 2 <x, e> + ||e||^2`` is bounded by :func:`quantised_norm_bound`: the
norm bound R above, ``||x||_inf <= (C B + s_inf) / m`` with ``s_inf`` the Gaussian maximum
over ``d`` coordinates (``P(|Z_i| >= t std) <= 2 exp(-t^2/2)``, union bound), Hoeffding's
inequality for ``sum e_i^2`` (terms in ``[0, h^2]``, means at most ``h^2/4``) and for
``<x, e>`` (terms in intervals of length ``|x_i| h``); five events, each at ``p/4`` or less
(the batch-size bound of ``||x||_inf`` at ``p/8``, its Gaussian maximum at ``p/8``).

**The mixed model** (:func:`check_model`): finite, every parameter within
:data:`MAX_PARAMETER` in magnitude, and no further from the previous model than the accepted
updates allow (``s_t sum_i lambda_i eta_i bound_i``, float32 rounding aside); a model failing
any of it is never applied, checkpointed or broadcast. Under momentum, Adam and Yogi the
limit is the server optimizer's own bound on one step from its state before it, given the
direction's bound ``sum_i lambda_i eta_i bound_i`` (geometric momentum; Adam/Yogi per
coordinate, :mod:`fedsim.aggregation.optimizers`), so no optimizer lets a step go further than
bounded updates can take it.

These are pure functions of public scenario values; they cost no privacy.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Literal

import numpy as np

from fedsim.config import limits
from fedsim.config.compression import QuantiseCompression, ThresholdCompression
from fedsim.config.schema import ClientGroup
from fedsim.privacy.events import sensitivity
from fedsim.privacy.schedules import Schedule
from fedsim.protocol.codec import read_only_root
from fedsim.protocol.compression import least_kept
from fedsim.protocol.norms import vector_norm
from fedsim.training.dpsgd import noise_std
from fedsim.training.local import sum_noise_multiplier

__all__ = [
    "FAILURE_PROBABILITY",
    "bad_model",
    "MAX_PARAMETER",
    "MAX_ROUND_GAP",
    "ClientLimits",
    "Rejections",
    "batch_size_bound",
    "check_model",
    "client_limits",
    "least_sparse_count",
    "noise_norm_bound",
    "quantised_norm_bound",
    "update_norm_bound",
    "window_refusals",
]

FAILURE_PROBABILITY = 1e-12
"""Probability that an honest update exceeds :func:`update_norm_bound` (per update)."""
MAX_PARAMETER = 1e6
"""A global model with a parameter beyond this magnitude is treated as diverged and refused
(float32 holds 3.4e38; no model fedsim trains has weights anywhere near 1e6)."""
MAX_ROUND_GAP = 4 * limits.MAX_UNACKNOWLEDGED
"""How far beyond the highest round the server knows of a client's next update may be (1024):
its outbox holds at most :data:`~fedsim.config.limits.MAX_UNACKNOWLEDGED` (256)
unacknowledged updates, so a larger gap cannot come from an honest client (and a forged
``round = 10**12`` never enters the client book)."""


def batch_size_bound(
    sampling: Literal["poisson", "fixed"],
    batch_size: float,
    num_samples: int,
    steps: int,
    failure_probability: float,
) -> float:
    """An upper bound on the total realised batch size of ``steps`` steps, exceeded with
    probability at most ``failure_probability``: ``steps * m`` for fixed-size batches; for
    Poisson the Chernoff bound of the module docstring on Binomial(``steps (N+1)``, ``m / N``)
    (``N = num_samples``, the declared size), capped at ``steps (N+1)``."""
    if sampling == "fixed":
        return float(steps * batch_size)
    mean = steps * batch_size * (num_samples + 1) / num_samples
    x = math.log(1.0 / failure_probability)
    excess = (x + math.sqrt(x * x + 8.0 * mean * x)) / (2.0 * mean)
    return min((1.0 + excess) * mean, float(steps * (num_samples + 1)))


def noise_norm_bound(dim: int, std: float, failure_probability: float) -> float:
    """``r`` with ``P(||Z|| >= r) <= failure_probability`` for ``Z ~ N(0, std^2 I_dim)``
    (Laurent & Massart's chi-square tail, module docstring)."""
    x = math.log(1.0 / failure_probability)
    return std * math.sqrt(dim + 2.0 * math.sqrt(dim * x) + 2.0 * x)


def update_norm_bound(
    *,
    sampling: Literal["poisson", "fixed"],
    clip: float,
    sigma: float,
    batch_size: float,
    num_samples: int,
    dim: int,
    steps: int = 1,
    failure_probability: float = FAILURE_PROBABILITY,
) -> float:
    """The largest L2 norm an honest round's update ``u`` (the sum of ``steps`` noisy
    ``Ubar / m``) reaches except with probability ``failure_probability`` (module docstring:
    ``(C B + r) / m``, B the batch-size bound and r the noise-norm bound, each at half the
    probability)."""
    half = failure_probability / 2.0
    total_batch = batch_size_bound(sampling, batch_size, num_samples, steps, half)
    noise = noise_norm_bound(dim, math.sqrt(steps) * sensitivity(sampling, clip) * sigma, half)
    return (clip * total_batch + noise) / batch_size


def quantised_norm_bound(
    *,
    sampling: Literal["poisson", "fixed"],
    clip: float,
    sigma: float,
    batch_size: float,
    num_samples: int,
    dim: int,
    bits: int,
    steps: int = 1,
    failure_probability: float = FAILURE_PROBABILITY,
) -> float:
    """The largest L2 norm an honest round's update reaches after unbiased stochastic
    quantisation to ``bits`` bits, except with probability ``failure_probability`` (module
    docstring, "Compressed updates")."""
    quarter = failure_probability / 4.0
    norm = update_norm_bound(sampling=sampling, clip=clip, sigma=sigma, batch_size=batch_size,
                             num_samples=num_samples, dim=dim, steps=steps,
                             failure_probability=quarter)
    total_batch = batch_size_bound(sampling, batch_size, num_samples, steps, quarter / 2.0)
    sensitivity = clip if sampling == "poisson" else 2.0 * clip
    std = math.sqrt(steps) * sensitivity * sigma
    peak = std * math.sqrt(2.0 * math.log(2.0 * max(dim, 1) / (quarter / 2.0)))
    largest = min(norm, (clip * total_batch + peak) / batch_size)  # ||x||_inf <= ||x||_2 too
    step = 2.0 * largest / ((1 << bits) - 1)
    x = math.log(1.0 / quarter)
    error_sq = dim * step * step / 4.0 + step * step * math.sqrt(dim * x / 2.0)
    cross = norm * step * math.sqrt(x / 2.0)
    return math.sqrt(norm * norm + 2.0 * cross + error_sq)


@dataclass(frozen=True)
class ClientLimits:
    """What the server may expect of one client's messages (from the public scenario).

    ``clip(r)`` and ``sigma(r)`` are the client's clip and noise multiplier in round ``r``;
    ``max_rounds`` its round limit (None: until its budget ends); ``quantise_bits`` the bits
    of its stochastic quantisation (None: none; :func:`quantised_norm_bound`)."""

    sampling: Literal["poisson", "fixed"]
    batch_size: float
    num_samples: int
    dim: int
    clip: Callable[[int], float]
    sigma: Callable[[int], float]
    steps: int = 1
    max_rounds: int | None = None
    quantise_bits: int | None = None
    _cache: dict[tuple[float, float], float] = field(default_factory=dict, compare=False)

    def norm_bound(self, round_index: int) -> float:
        """:func:`update_norm_bound` for round ``round_index`` (cached per (clip, sigma))."""
        key = (float(self.clip(round_index)), float(self.sigma(round_index)))
        bound = self._cache.get(key)
        if bound is None:
            if self.quantise_bits is None:
                bound = update_norm_bound(
                    sampling=self.sampling, clip=key[0], sigma=key[1],
                    batch_size=self.batch_size, num_samples=self.num_samples, dim=self.dim,
                    steps=self.steps,
                )
            else:
                bound = quantised_norm_bound(
                    sampling=self.sampling, clip=key[0], sigma=key[1],
                    batch_size=self.batch_size, num_samples=self.num_samples, dim=self.dim,
                    steps=self.steps, bits=self.quantise_bits,
                )
            self._cache[key] = bound
        return bound


def client_limits(group: ClientGroup, num_samples: int, schedule: Schedule, dim: int) -> ClientLimits:
    """The :class:`ClientLimits` of a scenario client of ``group`` with ``num_samples`` records,
    its calibrated clip/noise ``schedule`` and a model of ``dim`` parameters.

    Under adaptive clipping the clip moves with the client's private data, so the bound uses
    its public ceiling ``max_clip`` (the clip never exceeds it) and the sum's own noise
    multiplier (raised above the group's effective sigma to pay for the noisy count)."""
    clip: Callable[[int], float] = schedule.clip
    sigma: Callable[[int], float] = schedule.sigma
    ceiling = group.adaptive_clip_ceiling()
    if ceiling is not None and group.adaptive_clip is not None:
        count_std = group.adaptive_clip.count_noise_std
        clip = lambda r: ceiling  # noqa: E731
        sigma = lambda r: sum_noise_multiplier(  # noqa: E731
            float(schedule.sigma(r)), count_std, group.sampling)
    return ClientLimits(
        sampling=group.sampling, batch_size=float(group.batch_size), num_samples=num_samples,
        dim=dim, clip=clip, sigma=sigma, steps=group.local_steps,
        max_rounds=group.rounds,
        quantise_bits=(group.compression.bits
                       if isinstance(group.compression, QuantiseCompression) else None),
    )


def least_sparse_count(group: ClientGroup, schedule: Schedule, dim: int) -> int:
    """The fewest coordinates an honest sparse frame of a client of ``group`` (its calibrated
    ``schedule``, a model of ``dim`` parameters) keeps, except with probability
    :data:`FAILURE_PROBABILITY`: 0 unless the group compresses by ``threshold``; then
    :func:`~fedsim.protocol.compression.least_kept` of the last DP-SGD step's noise on
    ``Ubar / m``, ``s C_t sigma_t / m`` per coordinate, independent of everything else the
    round released (the earlier steps' noise moves only the model the last step starts from),
    at its least over the schedule (``C_t sigma_t`` is monotone in ``t``: its ends). Under
    adaptive clipping the clip has no public floor: 0 (no bound)."""
    if not isinstance(group.compression, ThresholdCompression) or group.adaptive_clip is not None:
        return 0
    product = schedule.sigma_0 * schedule.clip_0
    least_product = min(product, product * schedule.rho_c / schedule.rho_mu)
    # (the noise's std on Ubar / m, its one definition, at the least product C_t sigma_t)
    std = noise_std(group.sampling, 1.0, least_product, float(group.batch_size))
    return least_kept(group.compression.threshold, std, dim, FAILURE_PROBABILITY)


update_norm = vector_norm
"""The L2 norm in float64 (a float32 sum of squares of 3.4e38 values would overflow): the
codec's :func:`~fedsim.protocol.norms.vector_norm`, which a decoded update carries already."""


_last_verdict: tuple[object, tuple[int, tuple[int, ...], tuple[int, ...], str], int | None,
                    str] | None = None
"""The latest verdict on a model whose values cannot change (see :func:`bad_model`): the
immutable memory it is a view of, where in it (address, shape, strides, dtype), the size
asked about, and the verdict."""


def bad_model(params: np.ndarray, size: int | None) -> str:
    """Why a received global model must not be trained on, or '': the wrong length, not finite,
    or a parameter beyond :data:`MAX_PARAMETER` (a client skips such a model and waits).

    A broadcast reaches every client of the simulated network as one message (a read-only
    view of the frame's ``bytes``, or a sent array its sender gave up, read-only), each
    client a view of it: the verdict on such values, which do not change, is kept for
    the next client asking about the same values (the same immutable memory, address, shape,
    strides and dtype) and size. One entry, which holds that memory. (Kept by the array
    itself, a network that hands each client the frame's bytes to decode, ``wire_bytes``,
    gave each its own view, and every client paid a pass over the model.)"""
    global _last_verdict
    root = read_only_root(params)
    if not isinstance(root, bytes | np.ndarray):  # values that can change: asked every time
        return _model_problem(params, size)
    where = (int(params.__array_interface__["data"][0]), params.shape, params.strides,
             params.dtype.str)
    last = _last_verdict
    if last is not None and last[0] is root and last[1] == where and last[2] == size:
        return last[3]
    verdict = _model_problem(params, size)
    _last_verdict = (root, where, size, verdict)
    return verdict


def _model_problem(params: np.ndarray, size: int | None) -> str:
    """:func:`bad_model`'s check itself."""
    if size is not None and params.size != size:
        return f"{params.size} parameters, the model has {size}"
    if not params.size:
        return ""
    # Two reductions and no temporary: max and min propagate NaN, so both are finite exactly
    # when every value is, and then the largest magnitude is max(max, -min) (a float's
    # negation is exact). (isfinite + abs + max made two 0.4 MB temporaries; a client checks
    # every global model it receives.)
    high, low = float(params.max()), float(params.min())
    if not (math.isfinite(high) and math.isfinite(low)):
        return "not finite"
    largest = max(high, -low)
    if largest > MAX_PARAMETER:
        return f"a parameter of magnitude {largest:.3g} exceeds {MAX_PARAMETER:g}"
    return ""


def check_model(new: np.ndarray, old: np.ndarray, max_move: float | None) -> str:
    """Why the mixed model ``new`` must not replace ``old``, or '' if it may: not finite, a
    parameter beyond :data:`MAX_PARAMETER`, or further than ``max_move`` from ``old``."""
    problem = bad_model(new, old.size)
    if problem:
        return f"the mixed model: {problem}"
    if max_move is not None:
        moved = update_norm(np.asarray(new, np.float64) - np.asarray(old, np.float64))
        # float32 rounding of the result: at most half an ulp per parameter.
        slack = 1e-6 * (update_norm(old) + max_move) + 1e-30
        if moved > max_move + slack:
            return f"the mix moved the model by {moved:.4g}, more than the {max_move:.4g} allowed"
    return ""


def window_refusals(stats: object, before: dict[str, int]) -> tuple[dict[str, int], dict[str, int]]:
    """What a transport endpoint refused since ``before`` (its ``refused_by_kind`` counters
    then), and the counters now."""
    now = dict(getattr(stats, "refused_by_kind", {}))
    return {k: v - before.get(k, 0) for k, v in now.items() if v != before.get(k, 0)}, now


@dataclass
class Rejections:
    """Rejections counted by kind (one ``metrics.jsonl`` column per window)."""

    counts: dict[str, int] = field(default_factory=dict)

    def add(self, kind: str, count: int = 1) -> None:
        self.counts[kind] = self.counts.get(kind, 0) + count

    def total(self) -> int:
        return sum(self.counts.values())

    def as_dict(self) -> dict[str, int]:
        return {str(kind): n for kind, n in sorted(self.counts.items())}

    def take(self, most: int) -> dict[str, int]:
        """At most ``most`` of the counts in all (kinds in name order), as :meth:`as_dict`
        gives them; they are removed, the rest stay (an aggregator's partial reports no more
        than the server finds plausible, :func:`~fedsim.runtime.actors.partials.
        rejection_allowance`, and the next one the rest)."""
        taken: dict[str, int] = {}
        left = most
        for kind, count in self.as_dict().items():
            share = min(count, left)
            if share <= 0:
                break
            taken[kind], left = share, left - share
            if share == count:
                del self.counts[kind]
            else:
                self.counts[kind] = count - share
        return taken
