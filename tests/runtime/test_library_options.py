"""Adaptive clipping and local-SGD a_h (per_example_steps) from a scenario file, with their
privacy accounting checked against an independent computation."""

from __future__ import annotations

import copy
import csv
import math
from pathlib import Path
from typing import Any

import pytest
import torch

from fedsim.config import LoadedScenario, parse_scenario
from fedsim.errors import ConfigError
from fedsim.runtime.population import build_population
from fedsim.runtime.simulated.simulation import run_scenario

torch.set_num_threads(1)

SIGMA, COUNT_STD, BATCH = 1.1, 4.0, 16


def _scenario(**group: Any) -> dict[str, Any]:
    return {
        "name": "options", "seed": 6, "stop": {"virtual_seconds": 30.0},
        "dataset": {"name": "synthetic", "num_samples": 480, "num_test_samples": 100,
                    "num_features": 6, "num_classes": 3},
        "model": {"name": "logreg"},
        "clients": {"groups": [{"name": "g", "count": 3, "data_share": 1.0,
                                "batch_size": BATCH, "clip": 1.0, "noise": SIGMA, "rounds": 8,
                                "speed": 0.01, **group}]},
        "server": {"window": 0.5},
    }


def _run(data: dict[str, Any], out: Path):
    return run_scenario(LoadedScenario(parse_scenario(data), None), out, keep_history=True)


def _eps(out: Path) -> list[str]:
    with open(out / "clients.csv", encoding="utf-8") as handle:
        return [row["epsilon"] for row in csv.DictReader(handle)]


def test_adaptive_clipping_from_yaml_moves_the_clip_at_the_same_privacy(tmp_path: Path) -> None:
    data = _scenario(adaptive_clip={"target_quantile": 0.3, "learning_rate": 0.5,
                                    "count_noise_std": COUNT_STD})
    population = build_population(LoadedScenario(parse_scenario(data), None))
    trainer = population.trainer(population.plans[0])
    assert trainer.adaptive_clip.count_noise_std == COUNT_STD
    # Independent: the sum (sensitivity C, noise s C) and the centred count (sensitivity 1/2,
    # noise sigma_b) are two Gaussian releases, mu^2 = (1/s)^2 + (1/(2 sigma_b))^2 (Dong, Roth
    # & Su, Cor. 3.3); the group's sigma is the pair's effective multiplier 1/mu.
    s = trainer.sum_sigma(SIGMA)
    assert math.hypot(1 / s, 0.5 / COUNT_STD) == pytest.approx(1 / SIGMA, rel=1e-12)
    adaptive = _run(data, tmp_path / "adaptive")
    plain = _run(_scenario(), tmp_path / "plain")
    clips = {r.clip for c in adaptive.clients.values() for r in c.released_rounds()}
    assert len(clips) > 3  # it moved
    assert {r.clip for c in plain.clients.values() for r in c.released_rounds()} == {1.0}
    # The ledgers hold the same events: the same eps per client.
    assert _eps(tmp_path / "adaptive") == _eps(tmp_path / "plain")


def test_adaptive_clipping_is_validated() -> None:
    too_small = _scenario(adaptive_clip={"count_noise_std": 0.4})  # needs > sigma / 2 = 0.55
    with pytest.raises(ConfigError, match=r"clients.groups\[0\].adaptive_clip"):
        build_population(LoadedScenario(parse_scenario(too_small), None))
    with pytest.raises(ConfigError, match="constant clip"):
        parse_scenario(_scenario(adaptive_clip={"count_noise_std": 4.0},
                                 clip={"kind": "decay", "initial": 1.0, "final_ratio": 0.5}))


def test_local_sgd_a_h_from_yaml_costs_one_step_per_dp_step(tmp_path: Path) -> None:
    data = _scenario(per_example_steps=3, per_example_lr=0.2)
    population = build_population(LoadedScenario(parse_scenario(data), None))
    trainer = population.trainer(population.plans[0])
    assert (trainer.per_example_steps, trainer.per_example_lr) == (3, 0.2)
    local = _run(data, tmp_path / "local")
    single = _run(copy.deepcopy(_scenario()), tmp_path / "single")
    assert local.final_params.tolist() != single.final_params.tolist()  # a different a_h
    for client in local.clients.values():
        steps = [record.step for record in client.ledger.records]
        q = BATCH / client.plan.public_samples
        assert [(s.q, s.sigma, s.count) for s in steps] == [(q, SIGMA, 1)] * 8
    assert _eps(tmp_path / "local") == _eps(tmp_path / "single")
