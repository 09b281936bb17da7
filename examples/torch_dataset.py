"""Your own torch Dataset, from Python and from a scenario's ``dataset: {factory: ...}``.

A map-style ``torch.utils.data.Dataset`` of small grey images (stripes in one of four
directions, drawn on the fly with noise), split among clients by label shards (each client sees
two directions), trained with DP-SGD by a small CNN with GroupNorm. fedsim reads each Dataset
once into tensors; any map-style Dataset whose items are ``(image, label)`` works the same way
(torchvision's with ``transform=ToTensor()`` too).

Run:  python examples/torch_dataset.py          (under a minute on one CPU core)
      FEDSIM_EXAMPLE_TINY=1 python examples/torch_dataset.py   (a few seconds)
Paste into a notebook cell as it is (the factory part needs the function in an importable
module: here, this file).
"""

import os

import numpy as np
import torch
from torch import nn
from torch.utils.data import Dataset

import fedsim

TINY = os.environ.get("FEDSIM_EXAMPLE_TINY") == "1"


class Stripes(Dataset):
    """``count`` 12x12 images: label k is a stripe pattern at 45k degrees, plus noise."""

    def __init__(self, count, seed):
        rng = np.random.default_rng(seed)
        self.labels = rng.integers(0, 4, count)
        self.phases = rng.uniform(0, 2 * np.pi, count)
        self.noise = rng.standard_normal((count, 12, 12)).astype(np.float32) * 0.5

    def __len__(self):
        return len(self.labels)

    def __getitem__(self, i):
        angle = np.pi / 4 * self.labels[i]
        rows, cols = np.mgrid[0:12, 0:12]
        wave = np.sin(1.5 * (np.cos(angle) * cols + np.sin(angle) * rows) + self.phases[i])
        image = torch.from_numpy(wave.astype(np.float32) + self.noise[i]).unsqueeze(0)
        return image, int(self.labels[i])  # (1, 12, 12) float tensor, integer class


def stripes(train=2000, test=400, seed=0):
    """A data set factory: fedsim calls it with the scenario's options (and its seed)."""
    return Stripes(train, seed), Stripes(test, seed + 1)


class SmallCNN(nn.Module):
    def __init__(self, num_classes):
        super().__init__()
        self.body = nn.Sequential(
            nn.Conv2d(1, 8, 3, padding=1), nn.GroupNorm(2, 8), nn.ReLU(), nn.MaxPool2d(2),
            nn.Flatten(), nn.Linear(8 * 6 * 6, num_classes))

    def forward(self, x):
        return self.body(x)


def federation():
    return {
        "name": "torch-dataset",
        "seed": 0,
        "stop": {"virtual_seconds": 8 if TINY else 60},
        "model": {"factory": "torch_dataset:SmallCNN"},  # this file's class, from YAML too
        "clients": {"groups": [
            {"name": "lab", "count": 4, "data_share": 1.0, "batch_size": 32,
             "partition": {"scheme": "shards", "shards_per_client": 2},
             "clip": 1.0, "noise": {"sigma": 1.0}, "local_lr": 0.5, "speed": 0.005,
             "budget": {"epsilon": 4.0, "delta": 1e-5}},
        ]},
        "server": {"window": 0.5, "eval_every": 4},
    }


if __name__ == "__main__":
    sizes = {"train": 800, "test": 200} if TINY else {"train": 4000, "test": 1000}

    # 1. From Python: pass the (train, test) Datasets.
    train, test = stripes(**sizes)
    # The model is named as a factory in the scenario: this file's own code, so opt in.
    result = fedsim.simulate(federation(), dataset=(train, test), progress=not TINY,
                             allow_factories=True)
    print(f"from Python: final accuracy {result.final_accuracy:.3f} after "
          f"{result.virtual_time:.1f} virtual s; eps per client "
          + ", ".join(f"{c.epsilon:.2f}" for c in result.clients))

    # 2. From a scenario: name the factory (package.module:function) and its options; this is
    #    what a YAML file says as  dataset: {factory: "torch_dataset:stripes", options: {...}}
    scenario = {**federation(), "dataset": {"factory": "torch_dataset:stripes",
                                            "options": {**sizes, "seed": 0}}}
    again = fedsim.simulate(scenario, progress=not TINY, allow_factories=True)
    print(f"from the factory: final accuracy {again.final_accuracy:.3f} "
          f"(the same data and seed: {'identical' if again.windows == result.windows else 'DIFFERENT'})")

    # The trained model is yours: evaluate it on the Dataset.
    images = torch.stack([test[i][0] for i in range(len(test))])
    labels = np.array([test[i][1] for i in range(len(test))])
    with torch.no_grad():
        predictions = result.model(images).argmax(1).numpy()
    print(f"accuracy on the test Dataset {np.mean(predictions == labels):.3f}")
