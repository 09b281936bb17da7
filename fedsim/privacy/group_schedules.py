"""A client group's DP posture: its clipping and noise schedule, built from its scenario
section (the schedules themselves, and their calibration, are :mod:`fedsim.privacy.schedules`).

The schedule is a :class:`fedsim.privacy.schedules.Schedule` indexed by round: the trainer
reads ``clip(t)`` and ``sigma(t)`` at ``t = round index`` and every one of the round's
``local_steps`` DP-SGD steps (at q = m/N) uses them. Kinds:

* clip ``constant``: C_t = C. ``decay`` (sensitivity decay, Du et al.):
  C_t = C_0 rho_c^{t/T} over the group's T rounds.
* noise ``constant``: sigma_t = sigma. ``target``: the smallest constant sigma such that the
  group's T rounds (composed with its DP data normalisation or DP-PCA release, if any) are
  (eps, delta)-DP under the group's accountant
  (:func:`fedsim.privacy.calibration.calibrate_sigma`, the same numerical guarantee the ledger
  enforces). ``growing_mu`` (Du et al.): mu_t = mu_0 g^{t/T}, sigma_t = 1/mu_t, with mu_0
  solved so the T rounds meet (eps, delta) under the group's accountant
  (:func:`fedsim.privacy.schedules.solve_growing_mu`), or - labelled as the CLT approximation -
  so that the heterogeneous GDP CLT meets ``mu_total``
  (:func:`fedsim.privacy.schedules.clt_growing_mu`). ``clip_tied`` (Du et al.'s allocation):
  mu_t proportional to sqrt(C_t), its factor solved the same two ways
  (:func:`fedsim.privacy.schedules.clip_tied`).

A schedule with a horizon raises for rounds past it; the client actor stops ("done") at the
group's ``rounds`` and never asks beyond.
"""

from __future__ import annotations

from functools import lru_cache

from fedsim.config.schema import (
    ClientGroup,
    ClipTiedNoise,
    ConstantClip,
    ConstantNoise,
    DecayClip,
    GrowingMuNoise,
    TargetNoise,
)
from fedsim.errors import ConfigError
from fedsim.privacy import calibration as privacy_calibration
from fedsim.privacy.events import GaussianStep, Sampling
from fedsim.privacy.schedules import Schedule, clip_tied, clt_growing_mu, solve_growing_mu

__all__ = ["calibrate_sigma", "make_schedule", "normalisation_steps", "pca_sigma", "pca_steps",
           "release_steps"]


def normalisation_steps(group: ClientGroup) -> tuple[GaussianStep, ...]:
    """The group's DP data normalisation release as privacy events (empty without one): one
    unsampled (q = 1) Gaussian release of noise multiplier ``noise_multiplier`` under the
    group's neighbouring relation (:mod:`fedsim.training.dp_stats`)."""
    config = group.dp_normalisation
    if config is None:
        return ()
    return (GaussianStep(group.sampling, 1.0, config.noise_multiplier),)


def pca_sigma(group: ClientGroup) -> float | None:
    """The noise multiplier of the group's DP-PCA release (None without ``dp_pca``): as given,
    or, for a target, the smallest sigma whose one unsampled release (q = 1) meets it under the
    group's accountant."""
    config = group.dp_pca
    if config is None:
        return None
    if isinstance(config.noise, float | int):
        return float(config.noise)
    return calibrate_sigma(group.sampling, 1.0, 1, config.noise.epsilon, config.noise.delta,
                           group.accountant)


def pca_steps(group: ClientGroup) -> tuple[GaussianStep, ...]:
    """The group's DP-PCA release as privacy events (empty without one): one unsampled (q = 1)
    Gaussian release of noise multiplier :func:`pca_sigma` under the group's neighbouring
    relation (:mod:`fedsim.training.dp_pca`)."""
    sigma = pca_sigma(group)
    return () if sigma is None else (GaussianStep(group.sampling, 1.0, sigma),)


def release_steps(group: ClientGroup) -> tuple[GaussianStep, ...]:
    """Every release the group's clients make before their first round (a DP data
    normalisation, a DP-PCA), composed with the rounds' steps."""
    return normalisation_steps(group) + pca_steps(group)


@lru_cache(maxsize=256)
def calibrate_sigma(sampling: Sampling, q: float, steps: int, epsilon: float, delta: float,
                    accountant: str = "pld", prior: tuple[GaussianStep, ...] = ()) -> float:
    """Smallest sigma (to 1e-4 relative) with eps(delta) <= epsilon for ``steps`` identical
    subsampled Gaussian steps composed with the releases ``prior`` (a DP data normalisation)
    under ``accountant`` (:func:`fedsim.privacy.calibration.calibrate_sigma`, cached: every
    client of a group asks the same question)."""
    return privacy_calibration.calibrate_sigma(accountant, sampling, q, steps, epsilon, delta,
                                               prior=prior)


@lru_cache(maxsize=256)
def _growing_mu(noise: GrowingMuNoise, rounds: int, sampling: Sampling, q: float, local_steps: int,
                accountant: str, clip_0: float, rho_c: float) -> Schedule:
    """Solved once per group and q (cached: every client of a group asks the same question)."""
    if noise.mu_total is not None:
        return clt_growing_mu(noise.mu_total, rounds, noise.growth, sampling, q, clip_0=clip_0,
                              rho_c=rho_c, steps_per_index=local_steps)
    assert noise.epsilon is not None and noise.delta is not None
    return solve_growing_mu(noise.epsilon, noise.delta, rounds, noise.growth, sampling, q,
                            accountant=accountant, clip_0=clip_0, rho_c=rho_c,
                            steps_per_index=local_steps)


@lru_cache(maxsize=256)
def _clip_tied(noise: ClipTiedNoise, rounds: int, sampling: Sampling, q: float, local_steps: int,
               accountant: str, clip_0: float, rho_c: float) -> Schedule:
    """Solved once per group and q (cached like :func:`_growing_mu`)."""
    return clip_tied(rounds, sampling, q, clip_0=clip_0, rho_c=rho_c, epsilon=noise.epsilon,
                     delta=noise.delta, mu_total=noise.mu_total, accountant=accountant,
                     steps_per_index=local_steps)


def make_schedule(group: ClientGroup, *, q: float, where: str) -> Schedule:
    """The clip and noise schedule of one client of ``group`` whose batch fraction is ``q``
    (one object: the trainer reads ``clip(t)`` and ``sigma(t)`` from it)."""
    rounds = group.rounds  # None only for constant clip and noise (the schema checks this)
    clip_config = group.clip
    if isinstance(clip_config, ConstantClip):
        clip_0, rho_c = clip_config.value, 1.0
    elif isinstance(clip_config, DecayClip):
        clip_0, rho_c = clip_config.initial, clip_config.final_ratio
    else:
        raise ConfigError(f"{where}.clip: unsupported clip kind {clip_config!r}")
    noise_config = group.noise
    q = round(q, 12)  # one cache entry per group, whatever float noise the caller's q has
    if isinstance(noise_config, ConstantNoise):
        schedule = Schedule(rounds, noise_config.sigma, clip_0, 1.0, rho_c)
    elif isinstance(noise_config, TargetNoise):
        assert rounds is not None
        # The rounds share the target with the group's releases before round 0, if any.
        sigma = calibrate_sigma(group.sampling, q, rounds * group.local_steps,
                                noise_config.epsilon, noise_config.delta, group.accountant,
                                release_steps(group))
        schedule = Schedule(rounds, sigma, clip_0, 1.0, rho_c)
    elif isinstance(noise_config, GrowingMuNoise):
        assert rounds is not None
        schedule = _growing_mu(noise_config, rounds, group.sampling, q, group.local_steps,
                               group.accountant, clip_0, rho_c)
    elif isinstance(noise_config, ClipTiedNoise):
        assert rounds is not None
        schedule = _clip_tied(noise_config, rounds, group.sampling, q, group.local_steps,
                              group.accountant, clip_0, rho_c)
    else:
        raise ConfigError(f"{where}.noise: unsupported noise kind {noise_config!r}")
    return schedule
