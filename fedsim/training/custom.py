"""A model from a Python factory (``fedsim.simulate(..., model=factory)``).

The factory is called with the keyword arguments it accepts among ``input_shape`` (one
example's shape, from the data) and ``num_classes`` (the largest label + 1); it must return a
:class:`torch.nn.Module`, which is then checked for DP compatibility
(:func:`~fedsim.training.models.check_dp_compatible`).
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from fedsim.errors import ModelError
from fedsim.training.models import check_dp_compatible


def python_model(factory: Callable[..., nn.Module], train_x: torch.Tensor,
                 num_classes: int) -> nn.Module:
    """``factory(**data)`` checked: an ``nn.Module`` that DP-SGD can train."""
    if not callable(factory):
        raise ModelError(f"model: expected a callable that returns a torch.nn.Module, got "
                         f"{type(factory).__name__}")
    offered: dict[str, Any] = {"input_shape": tuple(train_x.shape[1:]),
                               "num_classes": num_classes}
    try:
        parameters = inspect.signature(factory).parameters
    except (TypeError, ValueError):  # a builtin without a signature: call it bare
        parameters = {}
    takes_any = any(p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters.values())
    kwargs = {k: v for k, v in offered.items() if takes_any or k in parameters}
    try:
        model = factory(**kwargs)
    except Exception as exc:  # the user's code: report it as a model problem
        raise ModelError(f"model: the Python factory raised {type(exc).__name__}: {exc}") from exc
    if isinstance(model, type) or not isinstance(model, nn.Module):
        raise ModelError(f"model: the factory returned {type(model).__name__}, not a "
                         "torch.nn.Module instance")
    check_dp_compatible(model)
    return model
