"""A noise sweep from Python: the same scenario at several noise multipliers and seeds, with
each group's sigma set through the ``[*]`` selector, and the accuracy / privacy trade-off
printed as a table. (``fedsim sweep`` does the same from the command line, with --jobs.)

Run:  python examples/sweep_noise.py
      FEDSIM_EXAMPLE_TINY=1 python examples/sweep_noise.py
"""

import os
import statistics

import fedsim

TINY = os.environ.get("FEDSIM_EXAMPLE_TINY") == "1"

scenario = {
    "name": "sweep-noise",
    "stop": {"windows": 10 if TINY else 60},
    "dataset": {"name": "synthetic", "num_samples": 1000 if TINY else 6000,
                "num_test_samples": 300, "num_features": 20, "num_classes": 4},
    "model": {"name": "mlp", "options": {"hidden": [32]}},
    "clients": {"groups": [
        {"name": "phone", "count": 3, "data_share": 0.5, "batch_size": 32, "clip": 1.0,
         "noise": {"sigma": 1.0}, "speed": 0.003, "local_lr": 0.5},
        {"name": "laptop", "count": 2, "data_share": 0.5, "batch_size": 64, "clip": 1.0,
         "noise": {"sigma": 1.0}, "speed": 0.001, "local_lr": 0.5},
    ]},
    "server": {"window": 0.5},
}

sigmas = [0.8, 1.6] if TINY else [0.6, 0.9, 1.2, 1.8]
seeds = [0] if TINY else [0, 1, 2]
print(f"{'sigma':>6} {'accuracy':>9} {'eps median':>11} {'eps max':>8}")
for sigma in sigmas:
    runs = [fedsim.simulate(scenario, seed=seed, progress=False,
                            overrides={"clients.groups[*].noise.sigma": sigma})
            for seed in seeds]
    accuracy = statistics.mean(r.final_accuracy for r in runs)
    print(f"{sigma:>6.2f} {accuracy:>9.3f} {statistics.mean(r.epsilon_median for r in runs):>11.3f}"
          f" {max(r.epsilon_max for r in runs):>8.3f}")

# The phone group alone at a larger batch, by name:
phones = fedsim.simulate(scenario, progress=False,
                         overrides=["clients.groups[phone].batch_size=64"])
print("phones at batch 64: eps", {c.client_id: round(c.epsilon, 3) for c in phones.clients
                                  if c.group == "phone"})
