"""Your own model and your own data, from Python: a small network on numpy arrays, split
among clients with label skew (Dirichlet), trained with DP-SGD under per-client budgets.

Run:  python examples/custom_model_and_data.py          (about a minute on one CPU core)
      FEDSIM_EXAMPLE_TINY=1 python examples/custom_model_and_data.py   (a few seconds)
Paste into a notebook cell as it is.
"""

import os

import numpy as np
import torch
from torch import nn

import fedsim

TINY = os.environ.get("FEDSIM_EXAMPLE_TINY") == "1"


# 1. Your data: any arrays x_train (N, ...), y_train (N,) integer labels 0..K-1, x_test, y_test.
def make_blobs(n, seed, features=16, classes=4):
    rng = np.random.default_rng(seed)
    labels = rng.integers(0, classes, n)
    centres = np.random.default_rng(0).standard_normal((classes, features)) * 0.5
    return (centres[labels] + rng.standard_normal((n, features))).astype(np.float32), labels


x_train, y_train = make_blobs(4000 if TINY else 8000, seed=1)
x_test, y_test = make_blobs(300 if TINY else 2000, seed=2)
data = {"x_train": x_train, "y_train": y_train, "x_test": x_test, "y_test": y_test}


# 2. Your model: a factory fedsim calls with the data's input shape and class count.
class SmallNet(nn.Module):
    def __init__(self, input_shape, num_classes):
        super().__init__()
        self.body = nn.Sequential(nn.Flatten(), nn.Linear(int(np.prod(input_shape)), 32),
                                  nn.LayerNorm(32), nn.Tanh(), nn.Linear(32, num_classes))

    def forward(self, x):
        return self.body(x)


# 3. The federation, as a plain dict (the same keys as a scenario YAML file; no dataset or
#    model section: they come from Python).
scenario = {
    "name": "custom-model-and-data",
    "seed": 0,
    "stop": {"virtual_seconds": 20 if TINY else 200},
    "clients": {"groups": [
        {"name": "hospital", "count": 4, "data_share": 0.6, "batch_size": 32,
         "partition": {"scheme": "dirichlet", "alpha": 1.0},
         "clip": 1.0, "noise": {"sigma": 1.0}, "local_lr": 0.5, "speed": 0.002,
         "budget": {"epsilon": 3.0, "delta": 1e-5}},
        {"name": "clinic", "count": 4, "data_share": 0.4, "batch_size": 16,
         "partition": {"scheme": "unequal", "size_sigma": 0.5},
         "clip": 1.0, "noise": {"sigma": 1.3}, "local_lr": 0.5, "speed": 0.005,
         "budget": {"epsilon": 2.0, "delta": 1e-5}},
    ]},
    "server": {"window": 0.5, "eval_every": 4},
}

result = fedsim.simulate(scenario, model=SmallNet, dataset=data, progress=not TINY)

print(f"final accuracy {result.final_accuracy:.3f} (best {result.best_accuracy:.3f}) after "
      f"{result.virtual_time:.1f} virtual s")
for client in result.clients:
    left = "-" if client.budget_left is None else f"{client.budget_left:.3f}"
    print(f"  {client.client_id:14} eps {client.epsilon:.3f}  budget left {left}  "
          f"{client.stop_reason or client.state}")

# The trained model is yours: evaluate it on anything.
with torch.no_grad():
    predictions = result.model(torch.from_numpy(x_test)).argmax(1).numpy()
print(f"re-evaluated accuracy {np.mean(predictions == y_test):.3f}")
