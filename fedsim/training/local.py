"""A client's local round (van Dijk & Nguyen, Alg. 1): the DP update it sends and the events it costs.

:class:`LocalTrainer` is the contract with the runtime's client actor. It is cheap to build
(one per client); clients whose models share one ``torch.nn.Module`` object also share its
per-sample engine (:func:`~fedsim.training.persample.engine_for`), since every round first
loads the round's parameter vector into the model.

Adaptive clipping follows Andrew et al. 2021 ("Differentially private learning with adaptive
clipping", Alg. 1 and Thm 1): after each DP step the clipping norm moves geometrically towards
the target quantile ``gamma`` of the per-example norms, ``C <- C exp(-eta (b~ - gamma))``,
where ``b~`` is the *noised* fraction of examples with ``||g_i|| <= C``. The count and the
clipped sum are released together; the joint release is a Gaussian mechanism on a vector
whose per-record contribution, scaled by the noise stds, has norm at most
``sqrt(sigma_sum^-2 + (s_b / sigma_b)^2)``, so its cost is recorded as one
:class:`GaussianStep` with the *effective* noise multiplier

    z = (sigma_sum^-2 + (s_b / sigma_b)^2)^(-1/2),

``sigma_b`` the count noise std and ``s_b`` the count's sensitivity: 1/2 for Poisson
(add/remove, bits centred at 1/2 and divided by the expected ``m``, Andrew et al.) and 1 for
fixed-size batches (replace-one flips one bit). The noise schedule's ``sigma(t)`` *is* ``z``,
so the ledger sees the same step with or without adaptive clipping, and the clipped sum is
noised with ``sigma_sum = (z^-2 - (s_b / sigma_b)^2)^(-1/2)``, which needs ``sigma_b > s_b z``.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

import numpy as np
import torch
from torch import nn

from fedsim.errors import ConfigError, ModelError
from fedsim.logging import get_logger
from fedsim.privacy.events import GaussianStep, Sampling
from fedsim.training.dpsgd import (
    ClipSchedule,
    NoiseSchedule,
    NoisyGradient,
    check_sampling,
    noise_std,
    noisy_gradient,
    sample_batch,
    step_for,
)
from fedsim.training.gaussian import NoiseKey, gaussian_noise
from fedsim.training.kept_sums import RoundSums, compute_with_kept_sums, keeps_sums
from fedsim.training.persample import LossFn, engine_for, per_example_cross_entropy
from fedsim.training.rounds import (
    PendingRound,
    RoundQueue,
    RoundResult,
    StepDraws,
    draw_phase_offsets,
    record_phase,
)

_log = get_logger("fedsim.training")

def flat_params(model: nn.Module) -> np.ndarray:
    """All parameters of ``model`` as one float32 vector, in ``model.parameters()`` order."""
    with torch.no_grad():
        return torch.cat(
            [p.detach().reshape(-1).to("cpu", torch.float32) for p in model.parameters()]
        ).numpy()


def load_flat_params(model: nn.Module, vec: np.ndarray) -> None:
    """Overwrite the parameters of ``model`` with the flat vector ``vec``."""
    params = list(model.parameters())
    total = sum(p.numel() for p in params)
    vec = np.asarray(vec)
    if vec.ndim != 1 or vec.size != total:
        raise ModelError(f"parameter vector has shape {vec.shape}, the model needs ({total},)")
    if not np.isfinite(vec).all():
        raise ModelError("parameter vector contains non-finite values")
    offset = 0
    with torch.no_grad():
        for p in params:
            chunk = vec[offset : offset + p.numel()]
            offset += p.numel()
            if p.device.type == "cpu" and p.is_contiguous():
                # Straight into the parameter's memory: one pass, and ``vec`` may be a
                # read-only view of a received message (no defensive copy needed).
                np.copyto(p.detach().numpy().reshape(-1), chunk, casting="same_kind")
            else:
                p.copy_(torch.from_numpy(np.array(chunk)).view_as(p))


def evaluate(
    model: nn.Module, features: torch.Tensor, labels: torch.Tensor, batch_size: int = 1024,
    *, loss_fn: LossFn = per_example_cross_entropy,
) -> tuple[float, float]:
    """(accuracy, mean loss) of ``model`` on a data set (the loss is ``loss_fn``, the run's
    per-example training loss; cross-entropy by default); no gradients."""
    if len(features) == 0:
        raise ConfigError("cannot evaluate on an empty data set")
    param = next(model.parameters())
    correct, loss = 0, 0.0
    was_training = model.training
    model.eval()
    with torch.no_grad():
        for start in range(0, len(features), batch_size):
            x = features[start : start + batch_size].to(param.device, param.dtype)
            y = labels[start : start + batch_size].to(param.device)
            out = model(x)
            loss += float(loss_fn(out, y).sum())
            correct += int((out.argmax(1) == y).sum())
    model.train(was_training)
    return correct / len(features), loss / len(features)


@dataclass(frozen=True)
class AdaptiveClipConfig:
    """Andrew et al. 2021 quantile tracking (see the module docstring).

    Attributes:
        target_quantile: gamma, the fraction of examples meant to be unclipped, in (0, 1).
        learning_rate: eta_C of the geometric update (Andrew et al. use 0.2).
        count_noise_std: sigma_b, std of the noise on the count (Andrew et al.: about m/20).
        max_clip: the public ceiling the clip never exceeds (the server's norm bound uses it).
    """

    target_quantile: float = 0.5
    learning_rate: float = 0.2
    count_noise_std: float = 10.0
    max_clip: float = math.inf

    def __post_init__(self) -> None:
        if not 0.0 < self.target_quantile < 1.0:
            raise ConfigError(f"target_quantile must be in (0, 1), got {self.target_quantile}")
        if not (math.isfinite(self.learning_rate) and self.learning_rate > 0):
            raise ConfigError(f"learning_rate must be > 0, got {self.learning_rate}")
        if not (math.isfinite(self.count_noise_std) and self.count_noise_std > 0):
            raise ConfigError(f"count_noise_std must be > 0, got {self.count_noise_std}")
        if not self.max_clip > 0:
            raise ConfigError(f"max_clip must be > 0, got {self.max_clip}")


def count_sensitivity(sampling: Sampling) -> float:
    """Sensitivity of the released count: 1/2 (Poisson, centred bits), 1 (fixed, replace-one)."""
    return 0.5 if sampling == "poisson" else 1.0


def sum_noise_multiplier(
    effective_sigma: float, count_noise_std: float, sampling: Sampling
) -> float:
    """sigma_sum such that (sum, count) together cost one step of multiplier ``effective_sigma``."""
    count_term = (count_sensitivity(sampling) / count_noise_std) ** 2
    remaining = effective_sigma**-2 - count_term
    if remaining <= 0:
        raise ConfigError(
            f"adaptive clipping: count_noise_std={count_noise_std} leaves no budget for the "
            f"gradient at sigma={effective_sigma}; need count_noise_std > "
            f"{count_sensitivity(sampling) * effective_sigma:g}"
        )
    return remaining**-0.5


class LocalTrainer:
    """One client's DP-SGD rounds on its private ``(features, labels)``.

    With ``local_steps == 1`` a round releases one DP gradient ``a = Ubar/m`` at the given
    parameters ``w``. With ``local_steps == k`` it runs ``k`` DP-SGD steps from ``w`` with
    step size ``local_lr`` (each a fresh batch, each noised, each one :class:`GaussianStep`)
    and returns ``(w - w_k) / local_lr``, the sum of the ``k`` noisy gradients, which is on the
    same scale as a single gradient times ``k``; each intermediate step is post-processing of
    the earlier noisy releases, so the round costs exactly ``k`` steps.

    van Dijk & Nguyen's other variant is ``per_example_steps = s > 1``: each example's ``a_h`` is the
    update of ``s`` SGD steps (``per_example_lr``) on that example alone from ``w``, clipped,
    summed and noised once per DP step: the privacy cost is unchanged (one step per DP step),
    the compute is ``s`` times larger and per-example parameters are materialised.

    ``clip(t)`` and ``sigma(t)`` are read at ``t = round_index``. The model is scratch space:
    each round overwrites its parameters. A round is begun (:meth:`begin_round`: its batches
    and noise keys drawn by :meth:`draw_round`, at once or at its batched pass) and computed
    when its result is taken; :meth:`run_round` does both.
    A round split by a received ``w-hat`` (the interrupt rule ``switch``) computes each record at
    the model of its own phase (:meth:`record_phases`, from :attr:`phase_offsets`).
    """

    def __init__(  # noqa: PLR0913 - keyword-only, one per DP-SGD setting and the data's layout
        self,
        model: torch.nn.Module,
        features: torch.Tensor,
        labels: torch.Tensor,
        *,
        batch_size: int,
        sampling: Literal["poisson", "fixed"],
        clip: ClipSchedule,
        noise: NoiseSchedule,
        local_steps: int = 1,
        local_lr: float | Callable[[int], float] = 0.1,
        max_physical_batch: int = 256,
        generator: torch.Generator,
        adaptive_clip: AdaptiveClipConfig | None = None,
        loss_fn: LossFn = per_example_cross_entropy,
        per_example_steps: int = 1,
        per_example_lr: float = 0.1,
        declared_records: int | None = None,
        rows: torch.Tensor | None = None,
        phase_offsets: torch.Tensor | None = None,
    ) -> None:
        self.sampling: Sampling = check_sampling(sampling)
        if len(features) != len(labels):
            raise ConfigError(f"{len(features)} feature rows but {len(labels)} labels")
        # ``rows``: the client's records are these rows of ``features`` (a data set stored once
        # and shared by every client; a batch's indices are mapped through it).
        if rows is not None and (rows.dtype != torch.int64 or rows.dim() != 1 or (
                len(rows) and not 0 <= int(rows.min()) <= int(rows.max()) < len(features))):
            raise ConfigError(f"rows must be int64 indices into the {len(features)} records")
        self.rows = rows
        records = len(features) if rows is None else len(rows)
        self._num_records = records  # asked at every round's batch draw (Tensor.__len__ is slow)
        # The public size that fixes q = m / N (the real record count may differ by the
        # neighbouring record: nothing may depend on it but the mechanism).
        self.declared_records = int(declared_records or records)
        if records == 0:
            raise ConfigError("a client needs at least one training record")
        if (
            isinstance(batch_size, bool)
            or not isinstance(batch_size, int)
            or not 1 <= batch_size <= records
        ):
            raise ConfigError(
                f"batch_size must be an integer in [1, {records}], got {batch_size!r}"
            )
        if isinstance(local_steps, bool) or not isinstance(local_steps, int) or local_steps < 1:
            raise ConfigError(f"local_steps must be an integer >= 1, got {local_steps!r}")
        # eta(r) between a round's local steps: a constant or the agreed sequence
        self.step_sequence = local_lr if callable(local_lr) else None
        local_lr = float(local_lr(0)) if callable(local_lr) else local_lr
        if not (math.isfinite(local_lr) and local_lr > 0):
            raise ConfigError(f"local_lr must be > 0, got {local_lr!r}")
        if max_physical_batch < 1:
            raise ConfigError(f"max_physical_batch must be >= 1, got {max_physical_batch}")
        if not isinstance(clip, ClipSchedule) or not isinstance(noise, NoiseSchedule):
            raise ConfigError("clip needs a clip(t) method and noise a sigma(t) method")
        self.model = model
        self.features = features
        self.labels = labels
        self.batch_size = batch_size
        self.clip_schedule = clip
        self.noise_schedule = noise
        self.local_steps = local_steps
        self.local_lr = float(local_lr)
        self.max_physical_batch = max_physical_batch
        self.generator = generator
        self.adaptive_clip = adaptive_clip
        self.loss_fn = loss_fn
        self.per_example_steps = per_example_steps
        self.per_example_lr = float(per_example_lr)
        self.engine = engine_for(model)
        if phase_offsets is not None and (phase_offsets.shape != (records,) or not bool(
                ((phase_offsets >= 0) & (phase_offsets < 1)).all())):
            raise ConfigError(f"phase_offsets must be {records} values in [0, 1)")
        # Each record's offset of the interrupt rule (rounds.record_phase), attached to the
        # record: a client whose data carries them passes them; else drawn when first needed.
        self._phase_offsets = None if phase_offsets is None else phase_offsets.to(
            "cpu", torch.float64)
        self._adaptive_norm: float | None = None
        self._warned_nonfinite = False

    @property
    def num_records(self) -> int:
        return self._num_records

    def rows_of(self, indices: torch.Tensor) -> torch.Tensor:
        """The rows of ``features``/``labels`` that a batch's record ``indices`` name."""
        return indices if self.rows is None else self.rows.index_select(0, indices)

    @property
    def phase_offsets(self) -> torch.Tensor:
        """Each record's offset of the interrupt rule (float64, in storage order): those given
        to the constructor, else drawn on first use from the phase stream of ``generator``
        (:func:`~fedsim.training.rounds.draw_phase_offsets`, which draws none of its numbers)."""
        if self._phase_offsets is None:
            self._phase_offsets = draw_phase_offsets(self.num_records, self.generator)
        return self._phase_offsets

    def record_phases(self, indices: torch.Tensor, round_index: int) -> torch.Tensor:
        """When each record of ``indices`` is due in a step of round ``round_index``
        (:func:`~fedsim.training.rounds.record_phase` of its own offset)."""
        return record_phase(self.phase_offsets.index_select(0, indices.cpu()), round_index)

    def planned_steps(self, round_index: int) -> list[GaussianStep]:
        """The privacy events of round ``round_index``, known before it is computed."""
        sigma = float(self.noise_schedule.sigma(round_index))
        return [step_for(self.sampling, self.declared_records, self.batch_size, sigma,
                         self.local_steps)]

    def clip_for(self, round_index: int) -> float:
        """Clipping norm of round ``round_index`` (adaptive clipping: its current norm)."""
        if self.adaptive_clip is None:
            return float(self.clip_schedule.clip(round_index))
        if (
            self._adaptive_norm is None
        ):  # starts from the schedule's value, then tracks the quantile
            self._adaptive_norm = float(self.clip_schedule.clip(round_index))
        return self._adaptive_norm

    def update_adaptive_clip(
        self, within_clip: int, batch_size: int, clip: float, count_noise: NoiseKey
    ) -> None:
        """Move adaptive clipping's norm after a step with ``within_clip`` unclipped examples."""
        config = self.adaptive_clip
        assert config is not None
        noise = float(
            gaussian_noise(1, config.count_noise_std, count_noise, torch.zeros(1, dtype=torch.float64))[0]
        )
        if self.sampling == "poisson":  # centred bits: the unknown realised size is not needed
            fraction = (within_clip - batch_size / 2 + noise) / self.batch_size + 0.5
        else:
            fraction = (within_clip + noise) / self.batch_size
        self._adaptive_norm = min(config.max_clip, clip * math.exp(
            -config.learning_rate * (fraction - config.target_quantile)
        ))

    def lr_for(self, round_index: int) -> float:
        """The local step size of round ``round_index`` (its agreed sequence, or local_lr)."""
        if self.step_sequence is None:
            return self.local_lr
        return float(self.step_sequence(round_index))

    def adaptive_state(self) -> float | None:
        """Adaptive clipping's current norm (None without it or before its first round)."""
        return self._adaptive_norm

    def restore_adaptive_state(self, state: float | None) -> None:
        """Put adaptive clipping's norm back (a discarded compute of a round is undone)."""
        self._adaptive_norm = state

    def sum_sigma(self, sigma: float) -> float:
        """Noise multiplier of the clipped sum for a step of multiplier ``sigma``."""
        if self.adaptive_clip is None:
            return sigma
        return sum_noise_multiplier(sigma, self.adaptive_clip.count_noise_std, self.sampling)

    def begin_round(
        self, params: np.ndarray, round_index: int, batcher: RoundQueue | None = None
    ) -> PendingRound:
        """Begin a round now and compute it later (:meth:`PendingRound.result`).

        Every draw of the round from the generator happens in :meth:`draw_round`, in the order
        a round has always made them: here, or, with a ``batcher``, when the batcher first
        reads them (:attr:`PendingRound.draws`: the rounds of a pass drawn together); either
        way before the client's next round begins, so the values do not depend on when the
        compute runs. ``params`` must not be modified until the round is computed. With a
        ``batcher`` the round is computed together with the other rounds pending there
        (:class:`~fedsim.training.batched.RoundBatcher`).
        """
        steps = self.planned_steps(round_index)
        if batcher is None:
            return PendingRound(self, params, round_index, steps, self.draw_round())
        pending = PendingRound(self, params, round_index, steps, self.draw_round)
        batcher.submit(pending)
        return pending

    def draw_round(self) -> list[StepDraws]:
        """A round's randomness from the generator, per step: the batch, the noise's key,
        adaptive clipping's count-noise key."""
        draws = []
        for _ in range(self.local_steps):
            indices = sample_batch(self.sampling, self.num_records, self.batch_size, self.generator,
                                   self.declared_records)
            noise = NoiseKey.draw(self.generator)
            count = NoiseKey.draw(self.generator) if self.adaptive_clip is not None else None
            draws.append(StepDraws(indices, noise, count))
        return draws

    def run_round(self, params: np.ndarray, round_index: int) -> RoundResult:
        """Compute the round's noisy update from the flat float32 parameter vector ``params``."""
        return self.begin_round(params, round_index).result()

    def compute(self, pending: PendingRound) -> RoundResult:
        """The round ``pending`` computed on its own (one model load, one engine pass a step;
        from its kept sums, where it keeps them)."""
        kept = pending.kept if isinstance(pending.kept, RoundSums) else None
        if kept is not None or len(pending.segments) > 1:
            # A split round that keeps no sums (a simulated client's, a model above the kept
            # budget): the same code, with nothing kept (the rule written once, kept_sums).
            whole = compute_with_kept_sums(self, pending, kept)
            assert whole is not None  # upto 1: the whole round
            return whole
        params, round_index, steps = pending.params, pending.round_index, pending.steps
        sigma = steps[0].sigma
        sum_sigma = self.sum_sigma(sigma)
        load_flat_params(self.model, params)
        # The float64 start point is needed only between local steps: a one-step round (the
        # common case) skips an O(P) conversion and allocation per round.
        start = (
            torch.from_numpy(np.asarray(params, dtype=np.float32).astype(np.float64))
            if self.local_steps > 1
            else None
        )
        accumulated: torch.Tensor | None = None
        batch_sizes: list[int] = []
        loss_sum, clip, nonfinite = 0.0, math.nan, 0
        for step, draws in enumerate(pending.draws):
            clip = self.clip_for(round_index)
            result = self._step(draws.indices, clip, sum_sigma, draws.noise)
            nonfinite += result.nonfinite
            if draws.count_noise is not None:
                self.update_adaptive_clip(result.within_clip, result.batch_size, clip,
                                           draws.count_noise)
            # The first step's gradient is a fresh tensor owned here: it becomes the sum.
            accumulated = (
                result.gradient if accumulated is None else accumulated.add_(result.gradient)
            )
            batch_sizes.append(result.batch_size)
            loss_sum += result.loss_sum
            if step + 1 < self.local_steps:
                assert start is not None
                current = start - self.lr_for(round_index) * accumulated.to("cpu", torch.float64)
                load_flat_params(self.model, current.to(torch.float32).numpy())
        # (w - w_k) / lr equals the sum of the k noisy gradients; returned in float32.
        assert accumulated is not None  # local_steps >= 1
        return self.round_result(pending, accumulated.to("cpu", torch.float32).numpy(),
                                 batch_sizes, clip, loss_sum, nonfinite)

    def sums_for(self, pending: PendingRound) -> RoundSums | None:
        """Empty sums to keep ``pending``'s computes in (:mod:`fedsim.training.kept_sums`), or
        None where they would take more memory than a round may keep."""
        return RoundSums(self.local_steps) if keeps_sums(self.engine.num_params,
                                                         self.local_steps) else None

    def advance(self, pending: PendingRound, upto: float) -> RoundResult | None:
        """Sum ``pending``'s records due before ``upto`` into its kept sums
        (:func:`~fedsim.training.kept_sums.compute_with_kept_sums`); the round's result once
        ``upto`` reaches its end."""
        if isinstance(pending.kept, RoundSums):
            return compute_with_kept_sums(self, pending, pending.kept, upto)
        return None

    def load_params(self, params: np.ndarray) -> None:
        """Load the flat float32 ``params`` into the model the engine differentiates."""
        load_flat_params(self.model, params)

    def zero_gradient(self) -> torch.Tensor:
        """A zero vector of the engine's parameters (dtype, device), to sum gradients into."""
        param = self.engine.parameters()[0]
        return torch.zeros(self.engine.num_params, dtype=param.dtype, device=param.device)

    def clipped_sum_into(self, indices: torch.Tensor, clip: float,
                         into: torch.Tensor) -> NoisyGradient:
        """The scaled clipped sum of the records ``indices`` at the model's w, added to
        ``into`` (no noise)."""
        return self._step(indices, clip, 1.0, None, into=into)

    def step_noise(self, clip: float, sum_sigma: float, key: NoiseKey) -> torch.Tensor:
        """A step's noise on ``Ubar / m`` from its ``key``: what the plain path starts its sum
        from (:func:`~fedsim.training.dpsgd.noisy_gradient`)."""
        return gaussian_noise(
            self.engine.num_params,
            noise_std(self.sampling, clip, sum_sigma, self.batch_size), key,
            self.engine.parameters()[0])

    def _step(
        self, indices: torch.Tensor, clip: float, sum_sigma: float, noise: NoiseKey | None,
        into: torch.Tensor | None = None,
    ) -> NoisyGradient:
        """One step's clipped sum of ``indices`` at the model's w: noised from ``noise``, or,
        with ``into``, added to ``into`` without noise (a later segment of the step)."""
        return noisy_gradient(
            self.engine, self.features, self.labels, self.rows_of(indices),
            sampling=self.sampling, clip=clip, noise_multiplier=sum_sigma,
            expected_batch_size=self.batch_size, generator=self.generator,
            max_physical_batch=self.max_physical_batch, loss_fn=self.loss_fn,
            per_example_steps=self.per_example_steps, per_example_lr=self.per_example_lr,
            noise_key=noise, into=into,
        )

    def round_result(
        self, pending: PendingRound, update: np.ndarray, batch_sizes: list[int], clip: float,
        loss_sum: float, nonfinite: int = 0,
    ) -> RoundResult:
        """The :class:`RoundResult` of ``pending`` once its update is computed (``nonfinite``:
        its examples with a non-finite gradient norm, which contributed zero; logged once)."""
        seen = sum(batch_sizes)
        if nonfinite and not self._warned_nonfinite:
            self._warned_nonfinite = True
            _log.warning("examples with a non-finite gradient contribute zero (the round is "
                         "released as usual)", round=pending.round_index, examples=nonfinite)
        return RoundResult(
            update=update,
            steps=pending.steps,
            batch_sizes=batch_sizes,
            clip=clip,
            sigma=pending.steps[0].sigma,
            mean_loss=loss_sum / seen if seen else math.nan,
            sample_grads=seen,
            nonfinite_examples=nonfinite,
        )
