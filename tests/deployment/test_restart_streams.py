"""A deployed client's batches and noise come from OS entropy by default; in the opt-in seeded
mode (not private) a restarted client process never replays noise it already released, and its
first incarnation trains exactly like the simulator's client."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

from fedsim.config import load_scenario
from fedsim.runtime.deployed.client_process import training_generator
from fedsim.runtime.population import build_population

SCENARIO = Path(__file__).with_name("four_clients.yaml")


def _update(population, client_id: str, generator: torch.Generator, round_index: int) -> np.ndarray:
    plan = next(p for p in population.plans if p.client_id == client_id)
    trainer = population.trainer(plan, generator=generator)
    return trainer.run_round(population.initial_params.copy(), round_index).update


def test_by_default_no_two_processes_and_no_seed_share_a_stream() -> None:
    torch.set_num_threads(1)
    population = build_population(load_scenario(SCENARIO))
    simulator = _update(population, "c-001", population.tree.torch("client", "c-001", "train"), 0)
    first = _update(population, "c-001", training_generator(population, "c-001", 0), 0)
    again = _update(population, "c-001", training_generator(population, "c-001", 0), 0)
    assert not np.array_equal(first, simulator) and not np.array_equal(first, again)
    # The compiled noise kernel's keys come from that generator: no two processes share one.
    plan = population.plans[0]
    keys = {population.trainer(plan, generator=training_generator(population, plan.client_id, 0))
            .begin_round(population.initial_params, 0).draws[0].noise for _ in range(3)}
    seeded = population.trainer(plan).begin_round(population.initial_params, 0).draws[0].noise
    assert len(keys) == 3 and seeded not in keys


def test_first_incarnation_matches_the_simulator_and_restarts_draw_fresh_noise() -> None:
    torch.set_num_threads(1)
    population = build_population(
        load_scenario(SCENARIO, ["privacy.deployed_randomness=seeded_not_private"]))
    simulator = _update(population, "c-001", population.tree.torch("client", "c-001", "train"), 0)
    first = _update(population, "c-001", training_generator(population, "c-001", 0), 0)
    np.testing.assert_array_equal(first, simulator)
    # Restarts at rounds 3 and 7 draw different noise from the first incarnation and from each
    # other (same parameters, so any difference is batch and noise); same start, same stream.
    at_3 = _update(population, "c-001", training_generator(population, "c-001", 3), 3)
    at_7 = _update(population, "c-001", training_generator(population, "c-001", 7), 3)
    again_3 = _update(population, "c-001", training_generator(population, "c-001", 3), 3)
    assert not np.array_equal(at_3, first) and not np.array_equal(at_3, at_7)
    np.testing.assert_array_equal(at_3, again_3)
    # Another client's restart stream is its own.
    other = _update(population, "c-002", training_generator(population, "c-002", 3), 3)
    assert not np.array_equal(other, at_3)
