"""One DP-SGD step: sample a batch, clip per-example gradients, sum, add Gaussian noise.

Neighbouring relations and noise (van Dijk & Nguyen, sec. "probabilistic mini-batch"; Abadi et al.
2016; Dong, Roth & Su 2022, Alg. 1 and Thm 5.1):

* ``"poisson"``: each record joins the batch independently with probability ``q = m/N``;
  neighbours differ by adding or removing one record, so the clipped sum ``U`` moves by at
  most ``C`` and the step adds ``N(0, (C sigma)^2 I)``;
* ``"fixed"``: exactly ``m`` records without replacement; neighbours differ by replacing one
  record, ``U`` moves by at most ``2C`` and the step adds ``N(0, (2 C sigma)^2 I)``.

Either way the step is ``C_q(G_{1/sigma})`` under its own relation, recorded as one
:class:`~fedsim.privacy.events.GaussianStep`. The released update is ``Ubar / m`` with ``m``
the *expected* batch size (for Poisson batches dividing by the realised size would leak it).

Bounded memory: a batch is processed in physical chunks of at most ``max_physical_batch``
examples; clipping is per example, so the chunked clipped sum equals the unchunked one up to
floating-point summation order, and the noise is drawn once per logical step.

Randomness (batch selection and noise) comes from an injected ``torch.Generator``, so
simulations replay exactly; the noise itself is drawn by :mod:`fedsim.training.gaussian`
(a counter-based sampler keyed by that generator, parallel on the CPU).
:func:`secure_generator` seeds one from the operating system's CSPRNG; torch's Mersenne
Twister is not itself a CSPRNG and floating-point Gaussian samplers are subject to Mironov's
(2012) attacks, which this does not address.
"""

from __future__ import annotations

import functools
import math
import os
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

import numpy as np
import torch

from fedsim.errors import ConfigError
from fedsim.privacy.events import SAMPLING_SCHEMES, GaussianStep, Sampling, sensitivity
from fedsim.training.gaussian import NoiseKey, gaussian_noise
from fedsim.training.persample import LossFn, PerSampleEngine, per_example_cross_entropy


@runtime_checkable
class ClipSchedule(Protocol):
    """Anything with ``clip(t) -> C_t`` (fedsim.privacy.schedules provides these)."""

    def clip(self, t: int) -> float: ...


@runtime_checkable
class NoiseSchedule(Protocol):
    """Anything with ``sigma(t) -> sigma_t``, the noise multiplier of release ``t``."""

    def sigma(self, t: int) -> float: ...


def check_sampling(sampling: str) -> Sampling:
    if sampling not in SAMPLING_SCHEMES:
        raise ConfigError(f"sampling must be one of {SAMPLING_SCHEMES}, got {sampling!r}")
    return sampling


def noise_std(
    sampling: Sampling, clip: float, noise_multiplier: float, expected_batch_size: float
) -> float:
    """Std of the noise on the released ``Ubar / m``: ``sensitivity * sigma / m``."""
    return sensitivity(sampling, clip) * noise_multiplier * (1.0 / expected_batch_size)


def secure_generator(device: str | torch.device = "cpu") -> torch.Generator:
    """A generator seeded with 64 bits from ``os.urandom`` (not replayable by design)."""
    generator = torch.Generator(device=device)
    generator.manual_seed(int.from_bytes(os.urandom(8), "little"))
    return generator


def poisson_threshold(rate: float) -> float:
    """The largest multiple of ``2^-24`` not above ``rate``: the threshold a float32 uniform is
    compared with. torch's float32 uniforms are ``k 2^-24`` (``k`` uniform in ``[0, 2^24)``), so
    ``u < t`` holds with probability exactly ``t`` for such a ``t``. Compared with ``rate``
    itself (rounded to float32), a record was taken with probability up to ``2^-24`` above it
    (0.01 became 0.0100000501): a sampling rate the accountant, given ``rate``, undercounts."""
    if not 0.0 <= rate <= 1.0:
        raise ValueError(f"rate must be in [0, 1], got {rate}")
    return math.floor(rate * 2**24) / 2**24


def poisson_batch(num_records: int, rate: float, generator: torch.Generator) -> torch.Tensor:
    """Indices of a Poisson sample: each record independently with probability
    :func:`poisson_threshold` of ``rate`` (at most ``rate``, less by under ``2^-24``).

    The batch size is Binomial(num_records, that probability) and may be 0.
    """
    threshold = poisson_threshold(rate)
    # The comparison and the indices in numpy (the same int64 indices as torch.nonzero's):
    # two torch calls fewer a step, each tens of microseconds when a simulation's thousands
    # of clients leave torch's dispatch cold between their rounds.
    uniforms = torch.rand(num_records, generator=generator).numpy()
    return torch.from_numpy(np.flatnonzero(uniforms < threshold))


def fixed_size_batch(num_records: int, batch_size: int, generator: torch.Generator) -> torch.Tensor:
    """Indices of ``batch_size`` records drawn uniformly without replacement."""
    return torch.randperm(num_records, generator=generator)[:batch_size]


def sample_batch(
    sampling: Sampling, num_records: int, batch_size: int, generator: torch.Generator,
    declared_records: int | None = None,
) -> torch.Tensor:
    """A batch of ``num_records`` records; Poisson at the rate ``m / declared_records`` (the
    public size the rate is fixed by; default: ``num_records``)."""
    if sampling == "poisson":
        return poisson_batch(num_records, batch_size / (declared_records or num_records), generator)
    return fixed_size_batch(num_records, batch_size, generator)


@dataclass(frozen=True)
class NoisyGradient:
    """One DP-SGD step's release and what the client may keep locally."""

    gradient: torch.Tensor
    """``(sum_i clip(g_i, C) + noise) / m``, flat, in the engine's parameter order."""
    batch_size: int
    """Realised number of examples (private: not part of the release)."""
    loss_sum: float
    """Sum of per-example losses (private)."""
    nonfinite: int = 0
    """How many examples had a non-finite gradient norm and contributed zero (private)."""
    dropped: torch.Tensor | None = None
    """Those examples' indices (None when there are none)."""
    norms: tuple[torch.Tensor, ...] = ()
    """The examples' gradient norms, a tensor a physical batch (private; the step's own)."""
    clip: float = math.inf
    """The clipping norm ``C`` the step used."""

    @functools.cached_property
    def within_clip(self) -> int:
        """How many examples had ``||g_i|| <= C`` (private; adaptive clipping noises it).
        Counted when first asked: only adaptive clipping asks, and on a small model the count's
        tensor ops cost about 0.02 of a plain SGD step."""
        return int(sum(norms.le(self.clip).sum() for norms in self.norms))  # one host sync


def noisy_gradient(
    engine: PerSampleEngine,
    features: torch.Tensor,
    labels: torch.Tensor,
    indices: torch.Tensor,
    *,
    sampling: Sampling,
    clip: float,
    noise_multiplier: float,
    expected_batch_size: float,
    generator: torch.Generator,
    max_physical_batch: int = 256,
    loss_fn: LossFn = per_example_cross_entropy,
    per_example_steps: int = 1,
    per_example_lr: float = 0.1,
    noise_key: NoiseKey | None = None,
    into: torch.Tensor | None = None,
) -> NoisyGradient:
    """Clip, sum, noise and scale the gradients of the records ``indices`` at the model's w.

    The noise std is ``sensitivity(sampling, clip) * noise_multiplier``; the caller records the
    matching :class:`GaussianStep` (see :class:`~fedsim.training.local.LocalTrainer`).
    With ``per_example_steps > 1`` each example contributes ``a_h``, the update of that many
    SGD steps (``per_example_lr``) on it alone from ``w``, instead of its gradient.
    The noise comes from ``noise_key`` when given (drawn earlier from ``generator``, see
    :class:`~fedsim.training.rounds.PendingRound`), else from ``generator`` now.
    With ``into`` no noise is drawn: the scaled clipped sum is added to ``into`` (a step split
    into segments at different w, see :mod:`fedsim.training.rounds`; the step's noise comes
    with its first segment).
    """
    _check_options(clip, noise_multiplier, max_physical_batch, per_example_steps,
                   per_example_lr)
    param = engine.parameters()[0]
    scale = 1.0 / expected_batch_size
    # Noise first, then every chunk's scaled clipped sum is accumulated into it in place:
    # for small models the O(P) passes cost as much as the backward pass.
    total = into if into is not None else gaussian_noise(
        engine.num_params,
        noise_std(sampling, clip, noise_multiplier, expected_batch_size),
        generator if noise_key is None else noise_key,
        param,
    )
    loss_sum, nonfinite = 0.0, 0
    chunk_norms: list[torch.Tensor] = []
    feature_dtype = param.dtype if features.is_floating_point() else features.dtype
    for start in range(0, len(indices), max_physical_batch):
        chunk = (
            indices if len(indices) <= max_physical_batch
            else indices[start : start + max_physical_batch]
        )
        # index_select: several times faster than advanced indexing for image batches on CPU.
        # The moves are skipped when there is nothing to move: every tensor op costs
        # microseconds of dispatch, which small models feel.
        x = _moved(features.index_select(0, _moved(chunk, features.device)), param.device,
                   feature_dtype)
        y = _moved(labels.index_select(0, _moved(chunk, labels.device)), param.device)
        if per_example_steps == 1:
            part = engine.clipped_sum(x, y, clip, loss_fn, scale=scale, out=total)
        else:
            part = engine.clipped_local_updates(
                x, y, clip, per_example_steps, per_example_lr, loss_fn, scale=scale, out=total
            )
        # One host sync a chunk: the norms' sum, not finite exactly when a norm is not (each
        # is at most sqrt(3.4e38) and a chunk is small). The unclipped count waits until asked.
        norms = part.norms
        loss_sum += part.loss_sum
        if not math.isfinite(float(norms.sum())):  # rare: such an example contributed zero
            nonfinite += int((~torch.isfinite(norms)).sum())
        chunk_norms.append(norms)
    if not nonfinite:
        return NoisyGradient(total, len(indices), loss_sum, norms=tuple(chunk_norms), clip=clip)
    finite = torch.isfinite(torch.cat(chunk_norms)).to(indices.device)
    dropped = indices[~finite]
    if into is None and not bool(torch.isfinite(total).all()):
        # Its factor was 0, but its activations or gradients themselves were not finite
        # (0 * inf is nan): the same step again without it, from the same noise key. (With
        # ``into`` the caller recomputes the whole step: see kept_sums._Step.finite_sum.)
        again = noisy_gradient(
            engine, features, labels, indices[finite], sampling=sampling, clip=clip,
            noise_multiplier=noise_multiplier, expected_batch_size=expected_batch_size,
            generator=generator, max_physical_batch=max_physical_batch, loss_fn=loss_fn,
            per_example_steps=per_example_steps, per_example_lr=per_example_lr,
            noise_key=noise_key)
        return NoisyGradient(again.gradient, len(indices), again.loss_sum, nonfinite, dropped,
                             norms=again.norms, clip=clip)
    return NoisyGradient(total, len(indices), loss_sum, nonfinite, dropped,
                         norms=tuple(chunk_norms), clip=clip)


def _check_options(
    clip: float, noise_multiplier: float, max_physical_batch: int, per_example_steps: int,
    per_example_lr: float,
) -> None:
    if not (math.isfinite(clip) and clip > 0):
        raise ConfigError(f"clipping norm must be finite and > 0, got {clip!r}")
    if not (math.isfinite(noise_multiplier) and noise_multiplier > 0):
        raise ConfigError(f"noise multiplier must be finite and > 0, got {noise_multiplier!r}")
    if max_physical_batch < 1:
        raise ConfigError(f"max_physical_batch must be >= 1, got {max_physical_batch}")
    if (
        isinstance(per_example_steps, bool)
        or not isinstance(per_example_steps, int)
        or per_example_steps < 1
    ):
        raise ConfigError(f"per_example_steps must be an integer >= 1, got {per_example_steps!r}")
    if not (math.isfinite(per_example_lr) and per_example_lr > 0):
        raise ConfigError(f"per_example_lr must be > 0, got {per_example_lr!r}")


def _moved(
    tensor: torch.Tensor, device: torch.device, dtype: torch.dtype | None = None
) -> torch.Tensor:
    if tensor.device == device and (dtype is None or tensor.dtype == dtype):
        return tensor
    return tensor.to(device=device, dtype=dtype)


@functools.lru_cache(maxsize=4096, typed=True)
def step_for(
    sampling: Sampling, num_records: int, batch_size: int, sigma: float, count: int = 1
) -> GaussianStep:
    """The privacy event of ``count`` DP-SGD steps with batch size ``m`` out of ``N`` records.

    Equal arguments (of equal types) give the one (frozen) step: a client's planned rounds,
    its ledger's records and its accountant share it with every client of the same posture
    (issue 24 item 5: 0.35 KB a message-only client at its first window, and one step a
    recorded round); an invalid step still raises every time (errors are not cached)."""
    return GaussianStep(sampling, batch_size / num_records, sigma, count)
