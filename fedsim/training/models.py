"""Models that DP-SGD can train, and the check that a model is per-sample separable.

DP-SGD clips each example's gradient separately, so the per-example loss must depend on that
example alone. Modules that mix examples inside a batch (BatchNorm and friends) break this:
one record then changes every clipped gradient of the batch and the sensitivity bound ``C``
(Poisson, add/remove) or ``2C`` (fixed size, replace-one) no longer holds (van Dijk & Nguyen, sec. on
normalisation). :func:`check_dp_compatible` rejects them; GroupNorm, LayerNorm and
InstanceNorm without running statistics are per-sample and allowed.

Models are built by name through :func:`build_model`, which is how scenarios refer to them.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from fedsim.errors import ModelError

# Module types whose output for one example depends on other examples of the batch.
_BATCH_MIXING: tuple[type[nn.Module], ...] = (
    nn.modules.batchnorm._BatchNorm,
    nn.SyncBatchNorm,
)


def check_dp_compatible(model: nn.Module) -> None:
    """Raise :class:`ModelError` if ``model`` mixes examples of a batch.

    Rejects every BatchNorm variant and InstanceNorm with ``track_running_stats`` (its running
    statistics are a function of the whole batch and are released with the model).
    """
    for name, module in model.named_modules():
        mixing = isinstance(module, _BATCH_MIXING) or (
            isinstance(module, nn.modules.instancenorm._InstanceNorm) and module.track_running_stats
        )
        if mixing:
            where = name or "<root>"
            raise ModelError(
                f"module {where!r} ({type(module).__name__}) mixes examples within a batch, so "
                "per-sample clipping no longer bounds one record's influence; use GroupNorm or "
                "LayerNorm instead"
            )


class LogisticRegression(nn.Module):
    """Multinomial logistic regression on flattened inputs."""

    def __init__(self, in_features: int = 784, num_classes: int = 10) -> None:
        super().__init__()
        self.linear = nn.Linear(in_features, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.linear(x.flatten(1))


class MLP(nn.Module):
    """Fully connected network on flattened inputs, tanh or ReLU hidden layers."""

    def __init__(
        self,
        in_features: int = 784,
        hidden: tuple[int, ...] | list[int] = (256,),
        num_classes: int = 10,
        activation: str = "relu",
    ) -> None:
        super().__init__()
        acts: dict[str, Callable[[], nn.Module]] = {"relu": nn.ReLU, "tanh": nn.Tanh}
        if activation not in acts:
            raise ModelError(f"activation must be one of {sorted(acts)}, got {activation!r}")
        layers: list[nn.Module] = []
        width = in_features
        for h in hidden:
            layers += [nn.Linear(width, int(h)), acts[activation]()]
            width = int(h)
        layers.append(nn.Linear(width, num_classes))
        self.net = nn.Sequential(*layers)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x.flatten(1))


class DPMnistCNN(nn.Module):
    """The classic DP MNIST CNN (TensorFlow Privacy tutorial; Abadi et al. 2016; Dong, Roth & Su).

    conv 16 8x8 stride 2 pad 3 -> tanh -> maxpool 2/1 -> conv 32 4x4 stride 2 -> tanh ->
    maxpool 2/1 -> fc 32 -> tanh -> fc 10; 26,010 parameters for 1x28x28 inputs.

    ``init="torch"`` (default) keeps PyTorch's initialisation; ``"glorot"`` initialises like
    the Keras layers of the TF Privacy tutorial (Glorot-uniform weights, zero biases).
    """

    def __init__(self, in_channels: int = 1, num_classes: int = 10, init: str = "torch") -> None:
        super().__init__()
        if init not in ("glorot", "torch"):
            raise ModelError(f"init must be 'glorot' or 'torch', got {init!r}")
        self.features = nn.Sequential(
            nn.Conv2d(in_channels, 16, 8, stride=2, padding=3),
            nn.Tanh(),
            nn.MaxPool2d(2, 1),
            nn.Conv2d(16, 32, 4, stride=2),
            nn.Tanh(),
            nn.MaxPool2d(2, 1),
        )
        self.classifier = nn.Sequential(
            nn.Flatten(), nn.Linear(32 * 4 * 4, 32), nn.Tanh(), nn.Linear(32, num_classes)
        )
        if init == "glorot":
            for module in self.modules():
                if isinstance(module, nn.Conv2d | nn.Linear):
                    nn.init.xavier_uniform_(module.weight)
                    nn.init.zeros_(module.bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.dim() == 3:  # (B, 28, 28) -> (B, 1, 28, 28)
            x = x.unsqueeze(1)
        return self.classifier(self.features(x))


class GroupNormCNN(nn.Module):
    """A small CNN for 32x32 images with GroupNorm (per-sample, hence DP-compatible)."""

    def __init__(
        self, in_channels: int = 3, num_classes: int = 10, width: int = 32, groups: int = 8
    ) -> None:
        super().__init__()

        def block(cin: int, cout: int) -> list[nn.Module]:
            return [
                nn.Conv2d(cin, cout, 3, padding=1),
                nn.GroupNorm(groups, cout),
                nn.ReLU(),
                nn.AvgPool2d(2),
            ]

        self.features = nn.Sequential(
            *block(in_channels, width), *block(width, 2 * width), *block(2 * width, 2 * width)
        )
        self.classifier = nn.Sequential(nn.Flatten(), nn.Linear(2 * width * 4 * 4, num_classes))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.classifier(self.features(x))


MODELS: dict[str, Callable[..., nn.Module]] = {
    "logreg": LogisticRegression,
    "mlp": MLP,
    "dp_mnist_cnn": DPMnistCNN,
    "groupnorm_cnn": GroupNormCNN,
}


def build_model(name: str, **kwargs: Any) -> nn.Module:
    """Instantiate the registered model ``name`` and check that DP-SGD can train it."""
    if name not in MODELS:
        raise ModelError(f"unknown model {name!r}; known models: {sorted(MODELS)}")
    try:
        model = MODELS[name](**kwargs)
    except TypeError as exc:
        raise ModelError(f"bad arguments for model {name!r}: {exc}") from None
    check_dp_compatible(model)
    return model
