"""The training loss: cross-entropy by default, or the user's own.

DP-SGD clips each example's gradient, so the loss must give one value per example
(``reduction='none'`` semantics): ``loss_fn(outputs, targets) -> tensor of shape (B,)``, whose
sum the per-sample engine differentiates. A scenario names its own with ``model.loss:
"package.module:function"`` (a factory, called with ``model.loss_options`` and returning the
loss function; imported and called through the same helper as model factories,
:mod:`fedsim.config.factories`), and Python passes one with ``simulate(loss=...)``.
:func:`check_per_example_loss` runs it on a probe batch before anything trains and refuses,
naming the scenario path, a loss that does not return one finite value per example or one
whose value for an example depends on the others.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

import torch
from torch import nn

from fedsim.config.factories import call_factory, resolve_factory, search_places
from fedsim.errors import ConfigError, ModelError
from fedsim.training.persample import LossFn, per_example_cross_entropy

__all__ = ["build_loss", "check_class_outputs", "check_per_example_loss"]


def build_loss(reference: str | None, options: Mapping[str, Any], *,
               loss: LossFn | None = None, base_dir: Path | None = None) -> tuple[LossFn, str]:
    """The run's per-example loss and where it came from (for errors): ``loss`` (a Python
    callable, ``simulate(loss=...)``) if given, else the factory ``reference``
    (``model.loss``) called with ``options`` (``model.loss_options``), else cross-entropy."""
    if loss is not None:
        if not callable(loss):
            raise ConfigError(f"loss: expected a callable (outputs, targets) -> per-example "
                              f"losses, got {type(loss).__name__}")
        return loss, "loss (the Python callable)"
    if reference is None:
        if options:
            raise ConfigError("model.loss_options: given without model.loss")
        return per_example_cross_entropy, "cross-entropy"
    factory = resolve_factory(reference, where="model.loss", search=search_places(base_dir))
    made, call = call_factory(factory, options, where="model.loss")
    if not callable(made):
        raise ConfigError(f"model.loss: {call} returned {type(made).__name__}, not a loss "
                          "function (outputs, targets) -> per-example losses")
    function: Callable[[torch.Tensor, torch.Tensor], torch.Tensor] = made
    return function, "model.loss"


def check_per_example_loss(loss_fn: LossFn, model: nn.Module, sample: torch.Tensor,
                           targets: torch.Tensor, where: str) -> None:
    """Refuse (:class:`ModelError` naming ``where``) a loss that, on ``model``'s outputs for a
    probe batch ``sample`` of at least two examples, does not return a finite tensor of shape
    (B,) that gradients flow through, or whose value for the first example changes when the
    second is left out (a mean, or anything else that mixes examples)."""
    if len(sample) < 2:
        raise ConfigError(f"{where}: the loss probe needs two examples, got {len(sample)}")
    param = next(model.parameters())
    x, y = sample.to(param.device, param.dtype), targets.to(param.device)
    with _evaluating(model), torch.enable_grad():
        values = _call(loss_fn, model(x), y, where)
        if tuple(values.shape) != (len(x),):
            raise ModelError(
                f"{where}: the loss must return one value per example (reduction='none'), "
                f"shape ({len(x)},) for a batch of {len(x)}; it returned shape "
                f"{tuple(values.shape)}")
        if not values.requires_grad:
            raise ModelError(f"{where}: the loss's values do not depend on the model's "
                             "outputs (no gradient flows through them)")
        if not bool(torch.isfinite(values).all()):
            raise ModelError(f"{where}: the loss is not finite on a probe batch")
        alone = _call(loss_fn, model(x[:1]), y[:1], where)
    if tuple(alone.shape) != (1,) or not torch.allclose(alone, values[:1], rtol=1e-4,
                                                        atol=1e-6):
        raise ModelError(f"{where}: the loss of an example depends on the other examples of "
                         "its batch; DP-SGD needs each example's own loss")


def check_class_outputs(model: nn.Module, sample: torch.Tensor,
                         num_classes: int) -> None:
    """Under the default cross-entropy, refuse a model with fewer outputs an example than the
    data has classes: a round whose batch held a larger label would fail mid-run (a probe
    of two examples may not hold one)."""
    with _evaluating(model), torch.no_grad():
        width = model(sample).shape[-1]
    if width < num_classes:
        raise ModelError(f"the model gives {width} values an example, but the data has "
                         f"{num_classes} classes (labels 0 to {num_classes - 1}): cross-entropy "
                         f"needs one output per class")


@contextlib.contextmanager
def _evaluating(model: nn.Module) -> Iterator[None]:
    """``model`` in eval mode within the block (a probe), its own mode back after."""
    was_training = model.training
    model.eval()
    try:
        yield
    finally:
        model.train(was_training)


def _call(loss_fn: LossFn, outputs: torch.Tensor, targets: torch.Tensor,
          where: str) -> torch.Tensor:
    try:
        values = loss_fn(outputs, targets)
    except Exception as exc:
        raise ModelError(f"{where}: the loss raised {type(exc).__name__} on a probe batch: "
                         f"{exc}") from exc
    if not isinstance(values, torch.Tensor):
        raise ModelError(f"{where}: the loss returned {type(values).__name__}, not a tensor")
    return values
