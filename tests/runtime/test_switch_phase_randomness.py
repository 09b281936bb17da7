"""Where the interrupt rule's phase offsets come from (issue 23, part 1): in the simulator from
the scenario's seed tree (same seed, same phases; another seed, others), in a deployed client
process from OS entropy (nothing the server knows, the scenario seed included, reproduces
them), exactly as that client's batches and noise."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from fedsim.config import LoadedScenario, parse_scenario
from fedsim.runtime.deployed.client_process import training_generator
from fedsim.runtime.population import Population, build_population
from fedsim.training import LocalTrainer
from fedsim.training.rounds import draw_phase_offsets


def _population(seed: int, randomness: str = "os_entropy") -> Population:
    data: dict[str, Any] = {
        "name": "phases", "seed": seed, "stop": {"virtual_seconds": 10.0},
        "dataset": {"name": "synthetic", "num_samples": 300, "num_test_samples": 50,
                    "num_features": 5, "num_classes": 3},
        "model": {"name": "logreg"},
        "clients": {"groups": [{"name": "g", "count": 2, "data_share": 1.0, "batch_size": 8,
                                "clip": 1.0, "noise": 1.1, "rounds": 4, "speed": 0.01}]},
        "server": {"window": 0.5},
        "privacy": {"deployed_randomness": randomness},
    }
    return build_population(LoadedScenario(parse_scenario(data), None))


def _simulated(population: Population, client: int = 0) -> LocalTrainer:
    trainer = population.trainer(population.plans[client])
    assert isinstance(trainer, LocalTrainer)
    return trainer


def _deployed(population: Population, client: int = 0) -> LocalTrainer:
    """The trainer as a client process builds it (:func:`fedsim.runtime.deployed.client_process.run_client`)."""
    plan = population.plans[client]
    trainer = population.trainer(plan, generator=training_generator(population, plan.client_id, 0))
    assert isinstance(trainer, LocalTrainer)
    return trainer


def test_the_simulators_phases_come_from_the_seed_tree() -> None:
    first, again, other = _population(4), _population(4), _population(5)
    offsets = _simulated(first).phase_offsets
    assert torch.equal(offsets, _simulated(again).phase_offsets)
    assert not torch.equal(offsets[:50], _simulated(other).phase_offsets[:50])
    assert not torch.equal(offsets[:50], _simulated(first, 1).phase_offsets[:50])
    plan = first.plans[0]
    stream = first.tree.torch("client", plan.client_id, "train")
    assert torch.equal(offsets, draw_phase_offsets(len(plan.indices), stream))


def test_a_deployed_clients_phases_come_from_os_entropy(monkeypatch: pytest.MonkeyPatch) -> None:
    population = _population(4)
    one, two = _deployed(population), _deployed(population)
    assert not torch.equal(one.phase_offsets, two.phase_offsets)
    assert not torch.equal(one.phase_offsets, _simulated(population).phase_offsets)
    # Keyed by os.urandom alone: the same entropy under two scenario seeds gives the same
    # phases; they are the phase stream of a generator seeded with those bytes.
    entropy = bytes(range(8))
    monkeypatch.setattr("fedsim.training.dpsgd.os.urandom", lambda n: entropy[:n])
    fixed = [_deployed(_population(seed)).phase_offsets for seed in (4, 5)]
    size = min(len(p) for p in fixed)
    assert torch.equal(fixed[0][:size], fixed[1][:size])
    stream = torch.Generator().manual_seed(int.from_bytes(entropy, "little"))
    assert torch.equal(fixed[0], draw_phase_offsets(len(fixed[0]), stream))


def test_seeded_not_private_deployment_replays_the_simulators_phases() -> None:
    population = _population(4, "seeded_not_private")
    assert torch.equal(_deployed(population).phase_offsets,
                       _simulated(population).phase_offsets)
