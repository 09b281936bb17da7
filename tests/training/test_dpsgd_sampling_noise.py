"""Noise scale per sampling scheme, batch-size laws, and LocalTrainer's contract."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from scipy import stats

from fedsim.data import load_dataset
from fedsim.errors import ConfigError, ModelError
from fedsim.privacy import schedules
from fedsim.privacy.events import GaussianStep
from fedsim.privacy.schedules import Schedule
from fedsim.training import LocalTrainer, build_model, flat_params, secure_generator
from fedsim.training.dpsgd import fixed_size_batch, poisson_batch, poisson_threshold, sample_batch
from fedsim.training.local import AdaptiveClipConfig, sum_noise_multiplier


def Constant(value: float) -> Schedule:  # a constant clip and sigma, horizon 1000
    return schedules.constant(1000, value, value)


def _trainer(
    sampling: str,
    *,
    clip: float = 0.5,
    sigma: float = 1.5,
    n: int = 64,
    batch: int = 16,
    seed: int = 0,
    **kwargs: object,
) -> LocalTrainer:
    x, y, _, _ = load_dataset(
        "synthetic", seed=seed, num_train=n, num_test=1, num_features=5, num_classes=3
    )
    torch.manual_seed(seed)
    model = build_model("logreg", in_features=5, num_classes=3)
    return LocalTrainer(
        model,
        x,
        y,
        batch_size=batch,
        sampling=sampling,
        clip=Constant(clip),
        noise=Constant(sigma),
        generator=torch.Generator().manual_seed(seed),
        **kwargs,
    )


@pytest.mark.parametrize(("sampling", "factor"), [("poisson", 1.0), ("fixed", 2.0)])
def test_noise_std_is_c_sigma_for_poisson_and_2c_sigma_for_fixed(
    sampling: str, factor: float
) -> None:
    trainer = _trainer(sampling)
    params = flat_params(trainer.model)
    noise = []
    for t in range(400):
        state = trainer.generator.get_state()
        result = trainer.run_round(params, t)
        # Replay the same batch to get the exact clipped sum, then isolate the noise.
        replay = torch.Generator().manual_seed(0)
        replay.set_state(state)
        indices = sample_batch(sampling, trainer.num_records, trainer.batch_size, replay)
        exact = trainer.engine.clipped_sum(
            trainer.features[indices], trainer.labels[indices], 0.5
        ).flat_sum
        noise.append(result.update.astype(np.float64) * trainer.batch_size - exact.numpy())
    noise = np.concatenate(noise)  # 400 rounds x 18 coordinates
    expected = factor * 0.5 * 1.5
    # Relative s.e. of a sample std is 1/sqrt(2n) = 0.4% at n = 7200; 3% is > 7 s.e., and the
    # other scheme's value (a factor 2 away) is far outside it.
    assert np.std(noise) == pytest.approx(expected, rel=0.03)
    assert abs(np.mean(noise)) < 5 * expected / math.sqrt(noise.size)


def test_poisson_batch_sizes_follow_binomial() -> None:
    n, q, draws = 400, 0.05, 3000
    generator = torch.Generator().manual_seed(11)
    sizes = np.array([len(poisson_batch(n, q, generator)) for _ in range(draws)])

    def chi2_pvalue(observed: np.ndarray, p: float) -> float:
        edges = np.arange(10, 31)  # pooled tails <=10 and >=30 keep expected counts >= 5
        law = stats.binom(n, p)
        expected = np.diff(np.concatenate([[0.0], law.cdf(edges[:-1]), [1.0]])) * len(observed)
        counts = np.bincount(
            np.clip(np.searchsorted(edges, observed, side="left"), 0, len(edges) - 1),
            minlength=len(edges),
        )
        return float(stats.chisquare(counts, expected).pvalue)

    assert chi2_pvalue(sizes, q) > 1e-3  # fixed seed; a correct sampler fails 0.1% of seeds
    assert chi2_pvalue(sizes, 1.15 * q) < 1e-6  # the test has power against a 15% wrong rate
    assert (sizes == 0).sum() == 0 and len(
        poisson_batch(50, 1e-4, generator)
    ) == 0  # empty batches occur


def test_poisson_batch_takes_exactly_the_records_whose_uniform_is_below_the_threshold() -> None:
    """The indices are torch's ``nonzero(rand < threshold)`` of the same draws (computed in
    numpy since issue 24): the same records, the same dtype, the stream moved alike."""
    for n, q in [(0, 0.5), (1, 1.0), (60, 1 / 60), (61, 2 / 61), (1000, 0.004), (7, 0.9999)]:
        ours, theirs = torch.Generator().manual_seed(n + 5), torch.Generator().manual_seed(n + 5)
        for _ in range(200):
            got = poisson_batch(n, q, ours)
            expected = torch.nonzero(
                torch.rand(n, generator=theirs) < poisson_threshold(q)).flatten()
            assert got.dtype == expected.dtype == torch.int64 and torch.equal(got, expected)
        assert torch.equal(ours.get_state(), theirs.get_state())


def test_a_record_is_never_taken_more_often_than_the_accounted_rate() -> None:
    # torch's float32 uniforms are k 2^-24: the inclusion probability of "u < t" is the count of
    # grid points below t over 2^24, computed here with integers for rates on and off the grid.
    rng = np.random.default_rng(3)
    rates = [0.01, 1 / 3, 0.5, 1.0, 0.0, 2.0**-24, 1.5 * 2.0**-24, *rng.uniform(0, 1, 200)]
    for rate in rates:
        threshold = poisson_threshold(rate)
        below = math.ceil(threshold * 2**24)  # grid points k 2^-24 < threshold
        assert below / 2**24 <= rate < (below + 1) / 2**24 or rate == 1.0
    # The batch is exactly the records whose uniform is below the threshold: a record whose
    # uniform sits on the grid point just below the rate is left out (it was taken before, at
    # a probability of (k + 1) 2^-24 for a rate of (k + 1/2) 2^-24).
    generator = torch.Generator().manual_seed(4)
    uniforms = torch.rand(1000, generator=torch.Generator().manual_seed(4))
    k = int(uniforms[7].item() * 2**24)
    rate = (k + 0.5) * 2.0**-24
    batch = set(poisson_batch(1000, rate, generator).tolist())
    assert batch == {i for i in range(1000) if uniforms[i].item() < k * 2.0**-24}
    assert 7 not in batch
    with pytest.raises(ValueError, match="rate"):
        poisson_threshold(1.5)


def test_fixed_size_batches_are_uniform_without_replacement() -> None:
    generator = torch.Generator().manual_seed(5)
    counts = np.zeros(40)
    for _ in range(2000):
        batch = fixed_size_batch(40, 10, generator).numpy()
        assert len(batch) == 10 and len(set(batch)) == 10
        counts[batch] += 1
    assert stats.chisquare(counts).pvalue > 1e-3


def test_round_reports_its_planned_steps_and_an_empty_poisson_batch_is_pure_noise() -> None:
    trainer = _trainer("poisson", n=64, batch=1)
    planned = trainer.planned_steps(3)
    assert planned == [GaussianStep("poisson", 1 / 64, 1.5)]
    params = flat_params(trainer.model)
    sizes = []
    for t in range(60):
        result = trainer.run_round(params, t)
        assert result.steps == planned
        assert result.update.dtype == np.float32 and result.update.shape == params.shape
        sizes.append(result.batch_sizes[0])
        if result.batch_sizes == [0]:
            assert math.isnan(result.mean_loss) and result.sample_grads == 0
            assert np.abs(result.update).max() > 0  # noise is still added
    assert 0 in sizes


def test_local_steps_return_the_sum_of_the_noisy_gradients() -> None:
    multi = _trainer("fixed", local_steps=3, local_lr=0.2)
    single = _trainer("fixed")
    params = flat_params(multi.model)
    result = multi.run_round(params, 0)
    assert result.steps == [GaussianStep("fixed", 16 / 64, 1.5, 3)]
    assert len(result.batch_sizes) == 3 and result.sample_grads == 48
    total, current = np.zeros_like(params, dtype=np.float64), params
    for _ in range(3):  # the same generator stream, one DP step at a time
        update = single.run_round(current, 0).update
        total += update
        current = (
            (torch.from_numpy(params).double() - 0.2 * torch.from_numpy(total)).float().numpy()
        )
    np.testing.assert_allclose(result.update, total, rtol=1e-5, atol=1e-6)


def test_adaptive_clip_tracks_the_target_quantile_and_costs_the_planned_sigma() -> None:
    trainer = _trainer(
        "poisson",
        clip=100.0,
        sigma=1.0,
        n=400,
        batch=100,
        adaptive_clip=AdaptiveClipConfig(
            target_quantile=0.5, learning_rate=0.3, count_noise_std=5.0
        ),
    )
    params = flat_params(trainer.model)
    for t in range(80):
        result = trainer.run_round(params, t)
        assert result.steps == [GaussianStep("poisson", 0.25, 1.0)]
    norms = trainer.engine.clipped_sum(trainer.features, trainer.labels, 1.0).norms
    fraction_within = float((norms <= trainer.clip_for(80)).double().mean())
    assert result.clip < 10.0  # moved down from 100 by orders of magnitude
    assert fraction_within == pytest.approx(0.5, abs=0.2)


def test_adaptive_sum_noise_follows_andrew_et_al_theorem_1() -> None:
    # z = (sigma_sum^-2 + (2 sigma_b)^-2)^-1/2 for Poisson; (sigma_sum^-2 + sigma_b^-2)^-1/2 fixed.
    sigma_sum = sum_noise_multiplier(1.0, 5.0, "poisson")
    assert (sigma_sum**-2 + (2 * 5.0) ** -2) ** -0.5 == pytest.approx(1.0)
    sigma_sum = sum_noise_multiplier(1.0, 5.0, "fixed")
    assert (sigma_sum**-2 + 5.0**-2) ** -0.5 == pytest.approx(1.0)
    with pytest.raises(ConfigError, match="count_noise_std"):
        sum_noise_multiplier(2.0, 0.9, "poisson")


def test_bad_inputs_raise_fedsim_errors() -> None:
    x, y = torch.zeros(10, 5), torch.zeros(10, dtype=torch.long)
    model = build_model("logreg", in_features=5, num_classes=3)
    good = dict(
        batch_size=4,
        sampling="poisson",
        clip=Constant(1.0),
        noise=Constant(1.0),
        generator=torch.Generator(),
    )
    for change, match in [
        ({"batch_size": 11}, "batch_size"),
        ({"sampling": "shuffle"}, "sampling"),
        ({"local_steps": 0}, "local_steps"),
        ({"local_lr": -1.0}, "local_lr"),
        ({"clip": 1.0}, "clip"),
    ]:
        with pytest.raises(ConfigError, match=match):
            LocalTrainer(model, x, y, **{**good, **change})
    trainer = LocalTrainer(model, x, y, **good)
    with pytest.raises(ModelError, match="parameter vector"):
        trainer.run_round(np.zeros(3, dtype=np.float32), 0)
    with pytest.raises(ConfigError, match="outside"):
        trainer.planned_steps(1000)  # beyond the schedule's horizon


def test_secure_generators_are_seeded_independently() -> None:
    a, b = secure_generator(), secure_generator()
    assert not torch.equal(torch.rand(4, generator=a), torch.rand(4, generator=b))


def test_decaying_clip_and_growing_mu_schedules_drive_each_round() -> None:
    decay = schedules.sensitivity_decay(10, 2.0, clip_0=1.0, rho_c=0.25)
    growing = schedules.Schedule(10, 2.0, 1.0, rho_mu=4.0)
    x, y, _, _ = load_dataset(
        "synthetic", seed=0, num_train=32, num_test=1, num_features=5, num_classes=3
    )
    trainer = LocalTrainer(
        build_model("logreg", in_features=5, num_classes=3),
        x,
        y,
        batch_size=8,
        sampling="poisson",
        clip=decay,
        noise=growing,
        generator=torch.Generator(),
    )
    params = flat_params(trainer.model)
    for t in (0, 5, 9):
        result = trainer.run_round(params, t)
        assert result.clip == pytest.approx(0.25 ** (t / 10))
        assert result.sigma == pytest.approx(2.0 * 4.0 ** (-t / 10))
        assert result.steps == [GaussianStep("poisson", 0.25, growing.sigma(t))]
    assert tuple(s for t in range(10) for s in trainer.planned_steps(t)) == tuple(
        GaussianStep("poisson", 0.25, sigma) for sigma in growing.sigmas()
    )
