"""Models that DP-SGD can train, and the check that a model is per-sample separable.

DP-SGD clips each example's gradient separately, so the per-example loss must depend on that
example alone. Modules that mix examples inside a batch (BatchNorm and friends) break this:
one record then changes every clipped gradient of the batch and the sensitivity bound ``C``
(Poisson, add/remove) or ``2C`` (fixed size, replace-one) no longer holds (van Dijk & Nguyen, sec. on
normalisation). :func:`check_dp_compatible` rejects them; GroupNorm, LayerNorm and
InstanceNorm without running statistics are per-sample and allowed.

Models are built by name through :func:`build_model`, or from the user's own factory
(``model: {factory: "package.module:function", options: {...}}`` in a scenario, or a callable
from Python) through :func:`build_scenario_model`, which also probes the model on the data.
"""

from __future__ import annotations

import inspect
import math
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from fedsim.config.factories import call_factory, resolve_factory, search_places
from fedsim.config.factory import FACTORY_PATTERN  # noqa: F401 - re-exported
from fedsim.errors import ConfigError, ModelError

if TYPE_CHECKING:
    from fedsim.config.model import Model as ModelSpec

# Module types whose output for one example depends on other examples of the batch.
_BATCH_MIXING: tuple[type[nn.Module], ...] = (
    nn.modules.batchnorm._BatchNorm,  # BatchNorm1d/2d/3d, their Lazy forms, SyncBatchNorm
    nn.SyncBatchNorm,
)


def _static_refusal(module: nn.Module) -> str | None:
    """Why ``module`` cannot be trained with per-sample clipping, or None."""
    if isinstance(module, _BATCH_MIXING):
        return (
            "normalises with statistics of the whole batch, so one example's output depends on "
            "every other example, and its running statistics are updated by forward and released "
            "with the model without noise; use GroupNorm or LayerNorm instead, or let fedsim "
            "replace it by GroupNorm (model.fix_batchnorm: true, or simulate(fix_batchnorm=True))"
        )
    if isinstance(module, nn.modules.instancenorm._InstanceNorm) and module.track_running_stats:
        return (
            "track_running_stats=True updates running statistics from every batch in forward "
            "and releases them with the model without noise; use track_running_stats=False, "
            "GroupNorm or LayerNorm"
        )
    if isinstance(module, nn.Embedding | nn.EmbeddingBag):
        if module.max_norm is not None:
            return "max_norm rewrites the weights during forward; use max_norm=None"
        if module.scale_grad_by_freq:
            return (
                "scale_grad_by_freq=True scales gradients by batch-wide frequencies, which mixes "
                "examples; use scale_grad_by_freq=False"
            )
    for name, param in module.named_parameters(recurse=False):
        if isinstance(param, nn.parameter.UninitializedParameter):
            return (
                f"parameter {name!r} is not initialised yet (a lazy module); give its sizes or "
                "run one forward pass before handing the model over"
            )
    return None


def check_dp_compatible(model: nn.Module, where: str = "model") -> None:
    """Raise :class:`ModelError` if a module of ``model`` breaks per-example independence.

    Static checks by module type and settings: every BatchNorm variant, InstanceNorm with
    ``track_running_stats`` (running statistics are a function of the whole batch and are
    released with the model), Embedding(Bag) with ``max_norm`` (forward rewrites the weights)
    or ``scale_grad_by_freq`` (batch-wide gradient scaling), lazy modules not yet initialised.
    Behaviour no type reveals (a custom module that reads other examples or updates a buffer
    in forward) is caught by :func:`check_forward_is_per_example` on example inputs.
    """
    for name, module in model.named_modules():
        reason = _static_refusal(module)
        if reason is not None:
            raise ModelError(
                f"{where}: module {name or '<root>'!r} ({type(module).__name__}) cannot be "
                f"trained with per-sample DP: {reason}"
            )
    for name, param in model.named_parameters():
        if param.is_floating_point() and torch.finfo(param.dtype).eps > _FLOAT32_EPS:
            # Norms, factors and sums rounded to 8-11 bits put a clipped contribution up to
            # about 1% above C (measured in bfloat16): the noise would be calibrated to less
            # than the sensitivity.
            raise ModelError(
                f"{where}: parameter {name!r} is {param.dtype}; per-sample clipping needs "
                "float32 or float64 parameters (in lower precision a clipped example's "
                "contribution can exceed the clipping norm)"
            )


_FLOAT32_EPS = torch.finfo(torch.float32).eps

State = list[tuple[str, dict[str, Any], str, torch.Tensor, int]]


def tensor_state(model: nn.Module) -> State:
    """Every parameter and buffer of ``model`` with its version counter (in-place writes bump it)."""
    return [
        (where, store, name, tensor, tensor._version)
        for where, module in model.named_modules()
        for store in (module._parameters, module._buffers)
        for name, tensor in store.items()
        if tensor is not None
    ]


def changed_state(model: nn.Module, state: State, where: str = "model") -> str | None:
    """A refusal naming the first parameter or buffer rewritten or replaced since ``state``."""
    for owner, store, name, tensor, version in state:
        if store.get(name) is not tensor or tensor._version != version:
            module = model.get_submodule(owner)
            return (
                f"{where}: module {owner or '<root>'!r} ({type(module).__name__}) changes "
                f"{name!r} during forward: state updated from a batch depends on every example "
                "in it and is released with the model without noise; not DP-compatible"
            )
    return None


# Relative tolerance of the independence probe: far above float32 batch-size effects of the
# kernels (about 1e-6), far below what mixing examples does to an output.
_PROBE_RTOL = 1e-3


def check_forward_is_per_example(
    model: nn.Module, inputs: torch.Tensor, where: str = "model"
) -> None:
    """Forward probe on the first two examples of ``inputs`` (no gradients, RNG untouched).

    Raises :class:`ModelError` if forward rewrites a parameter or buffer, if the model does
    not run on these inputs, or if an example's output differs between the batch of two and
    the example alone (beyond float noise): a module then mixes examples, and per-sample
    clipping would not bound one record's influence. Random models (dropout) are compared in
    eval mode; the model's mode is restored.
    """
    if inputs.dim() == 0 or inputs.shape[0] < 2:
        return
    x = inputs[:2].detach()
    training = model.training
    devices = sorted({p.device.index or 0 for p in model.parameters() if p.device.type == "cuda"})
    try:
        with torch.no_grad(), torch.random.fork_rng(devices=devices):
            state = tensor_state(model)
            together = model(x)
            refusal = changed_state(model, state, where)
            if refusal is not None:
                raise ModelError(refusal)
            if not isinstance(together, torch.Tensor):
                return
            if not torch.equal(together, model(x)):  # random: compare without the randomness
                model.eval()
                together = model(x)
            alone = torch.cat([model(x[:1]), model(x[1:])])
    except ModelError:
        raise
    except Exception as exc:
        raise ModelError(
            f"{where}: the model does not run on the data set's examples (shape "
            f"{tuple(x.shape[1:])}, {x.dtype}): {type(exc).__name__}: {exc}"
        ) from exc
    finally:
        model.train(training)
    if together.shape != alone.shape:
        raise ModelError(
            f"{where}: output of shape {tuple(together.shape)} for two examples but "
            f"{tuple(alone.shape)} for each alone; the first dimension must be the batch"
        )
    scale = float(torch.maximum(together.abs().max(), alone.abs().max()))
    diff = float((together - alone).abs().max())
    if diff > _PROBE_RTOL * scale + 1e-6:
        raise ModelError(
            f"{where}: an example's output changes with the other examples of its batch (by "
            f"{diff:.3g} of {scale:.3g}): a module mixes examples (a batch statistic?), so "
            "per-sample clipping would not bound one record's influence"
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
                    if module.bias is not None:
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


def check_model_options(name: str, options: Mapping[str, Any]) -> None:
    """Raise :class:`ModelError` unless every key of ``options`` is an argument of the
    registered model ``name`` (needs no data: what the data gives, the builder adds)."""
    if name not in MODELS:
        raise ModelError(f"unknown model {name!r}; known models: {', '.join(sorted(MODELS))}")
    parameters = inspect.signature(MODELS[name]).parameters
    unknown = sorted(set(options) - set(parameters))
    if unknown:
        raise ModelError(f"bad arguments for model {name!r}: no option "
                         f"{', '.join(map(repr, unknown))}; its options are "
                         f"{', '.join(parameters)}")


def build_model(name: str, **kwargs: Any) -> nn.Module:
    """Instantiate the registered model ``name`` and check that DP-SGD can train it."""
    check_model_options(name, kwargs)
    try:
        model = MODELS[name](**kwargs)
    except TypeError as exc:
        raise ModelError(f"bad arguments for model {name!r}: {exc}") from None
    check_dp_compatible(model)
    return model


def build_from_factory(
    factory: Callable[..., Any],
    options: Mapping[str, Any],
    *,
    where: str,
    data: Mapping[str, Any] | None = None,
) -> nn.Module:
    """``factory(**options)`` (see :func:`~fedsim.config.factories.call_factory`), checked
    to be an ``nn.Module``; errors name ``where``.

    ``data`` (``num_classes``, ``input_shape``: one example's shape) fills in those keyword
    arguments when the factory takes them by name and ``options`` does not give them.
    """
    model, call = call_factory(factory, options, where=where, data=data)
    if not isinstance(model, nn.Module):
        raise ConfigError(
            f"{where}: {call} returned {type(model).__name__}, not a torch.nn.Module"
        )
    return model


# Opacus's choice (ModuleValidator.fix): at most 32 groups.
MAX_NORM_GROUPS = 32


def replace_batchnorm(model: nn.Module) -> tuple[nn.Module, int]:
    """``model`` with every BatchNorm layer replaced by a GroupNorm over the same channels
    (affine if the BatchNorm was), and how many were replaced. GroupNorm normalises each
    example by its own statistics, so examples no longer mix; the replaced layers' weights
    start fresh (GroupNorm's initialisation), the model must be trained with them.

    The groups (:func:`_norm_groups`): BatchNorm2d/3d (and SyncBatchNorm, the lazy forms) get
    ``gcd(32, C)`` groups as Opacus's ``ModuleValidator.fix`` does (each group holds
    ``C / groups`` channels times every position). BatchNorm1d gets one group: its input is
    often (N, C), where ``gcd(32, C)`` groups would leave one or two values a group (GroupNorm
    on one value a group fails in training, on two it throws most of the signal away), so it is
    normalised over all its C features, as LayerNorm does; on (N, C, L) one group holds
    ``C * L`` values."""
    replaced = 0

    def swap(module: nn.Module) -> nn.Module:
        nonlocal replaced
        if isinstance(module, nn.modules.batchnorm._BatchNorm):  # SyncBatchNorm too
            replaced += 1
            channels = module.num_features
            return nn.GroupNorm(_norm_groups(module, channels), channels,
                                eps=module.eps, affine=module.affine)
        for name, child in module.named_children():
            setattr(module, name, swap(child))
        return module

    return swap(model), replaced


def _norm_groups(batchnorm: nn.Module, channels: int) -> int:
    """The GroupNorm groups replacing ``batchnorm`` (see :func:`replace_batchnorm`)."""
    if isinstance(batchnorm, (nn.BatchNorm1d, nn.LazyBatchNorm1d)):
        return 1
    return math.gcd(MAX_NORM_GROUPS, channels)


def build_scenario_model(
    spec: ModelSpec,
    options: Mapping[str, Any],
    *,
    sample: torch.Tensor | None = None,
    num_classes: int | None = None,
    factory: Callable[..., nn.Module] | None = None,
    base_dir: Path | None = None,
    fix_batchnorm: bool = False,
) -> nn.Module:
    """The scenario's model: ``factory`` (a Python callable) if given, else ``spec.factory``
    (imported now) or the registered ``spec.name``, built with ``options`` and checked for DP
    compatibility, statically and by the forward probe on ``sample`` (a few training examples).
    With ``fix_batchnorm`` (or ``spec.fix_batchnorm``) its BatchNorm layers are first replaced
    by GroupNorm (:func:`replace_batchnorm`).

    Every error is a :class:`ConfigError` (:class:`ModelError` for DP refusals) whose message
    starts with the scenario path it concerns.
    """
    data: dict[str, Any] = {}
    if num_classes is not None:
        data["num_classes"] = num_classes
    if sample is not None:
        data["input_shape"] = tuple(sample.shape[1:])
    if factory is not None:
        model = build_from_factory(factory, options, where="model (the Python factory)", data=data)
    elif spec.factory is not None:
        model = build_from_factory(
            resolve_factory(spec.factory, search=search_places(base_dir)), options, where="model.factory", data=data
        )
    elif spec.name is not None:
        if spec.name not in MODELS:
            raise ModelError(
                f"model.name: unknown model {spec.name!r}; known models: {sorted(MODELS)}"
            )
        try:
            model = build_model(spec.name, **options)
        except ModelError as exc:
            raise ModelError(f"model.options: {exc}") from None
    else:
        raise ConfigError(
            "model: give name (a built-in model) or factory ('package.module:function'), or pass "
            "a model factory from Python"
        )
    if fix_batchnorm or spec.fix_batchnorm:
        model, _ = replace_batchnorm(model)
    check_dp_compatible(model)
    if sample is not None:
        check_forward_is_per_example(model, sample)
    return model
