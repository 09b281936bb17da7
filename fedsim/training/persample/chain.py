"""Models that are a chain of ``Linear`` layers and elementwise activations: recognised once,
then computed without hooks, module calls or a parameter graph.

For such a model every quantity the per-sample engine needs is known from the structure: the
input of Linear layer ``k`` is the activation of the layer before it, its per-example squared
gradient norm is ``||g_i||^2 (||a_i||^2 + 1)`` (:func:`~fedsim.training.persample.rules.
linear_sq_norms`), and its clipped sum is ``(c * g)^T a``. :func:`linear_chain` says whether a
model is one (its exact types, not subclasses: a subclass may compute something else); the
per-sample engine (:mod:`~fedsim.training.persample.engine`) then runs the chain directly,
and the simulator's :class:`~fedsim.training.batched.RoundBatcher` computes many clients'
rounds of it in one pass. Either way the products are those ``nn.Linear`` itself runs
(``addmm(b, a, W^T)``) and the backward pass is autograd's: the engine's values are the hooked
pass's to the bit, the batched pass's equal them up to summation order (both tested).

Why the sensitivity bound holds whatever the model (a record added, removed or replaced moves
the clipped sum by at most ``C`` or ``2C``, :mod:`fedsim.training.dpsgd`): each example's
contribution is ``c_i (g_i a_i^T, g_i)`` per Linear layer and its clipping factor ``c_i`` comes
from the exact norm of that same quantity, ``sum_k ||g_ik||^2 (||a_ik||^2 + 1)`` (Goodfellow
2015, "Efficient per-example gradient computations"); with elementwise activations ``a_i`` and
``g_i`` depend on example ``i`` alone. A model that is not the chain it is taken for would get
a wrong gradient (utility), not a larger contribution; hence the checks below are exact types
and a state compared before each batch, not privacy checks.

A chain's forward cannot change a parameter or buffer (no module of it has buffers or
writes its input: in-place activations are not chains), and a module with hooks is left to
the hooked pass, which runs them.
"""

from __future__ import annotations

import torch
from torch import nn
from torch.nn.modules import module as _module

from fedsim.training.models import MLP, LogisticRegression

__all__ = [
    "ELEMENTWISE", "any_hooks", "chain_applies", "chain_modules", "chain_outputs", "chain_state", "flattens_input",
    "linear_chain",
]

ELEMENTWISE: tuple[type[nn.Module], ...] = (
    nn.ReLU, nn.Tanh, nn.Sigmoid, nn.GELU, nn.ELU, nn.LeakyReLU, nn.SiLU, nn.Softplus,
    nn.Identity,
)
"""Activations applied value by value (each example's output depends on its input alone)."""


def linear_chain(model: nn.Module) -> list[nn.Module] | None:
    """The modules of ``model`` as a chain of ``Linear`` layers and elementwise activations,
    or None when the model is anything else.

    A chain: fedsim's :class:`~fedsim.training.models.MLP` or
    :class:`~fedsim.training.models.LogisticRegression` (their own ``forward``, on
    ``x.flatten(1)``), or an ``nn.Sequential`` of the layers, optionally after ``nn.Flatten()``
    (without it, a chain only for inputs of shape (B, d): :func:`flattens_input`); of exactly
    these types, activations not in place, every parameter a trainable Linear weight or bias
    in chain order, all on one device, no buffers.
    """
    chain = _candidate(model)
    return chain if chain is not None and _is_chain(model, chain) else None


def _candidate(model: nn.Module) -> list[nn.Module] | None:
    """The modules ``model`` would run in order if it is a chain (by its type alone)."""
    if type(model) is MLP and type(model.net) is nn.Sequential:
        return list(model.net)
    if type(model) is LogisticRegression:
        return [model.linear]
    if type(model) is nn.Sequential:
        return list(model)[1:] if flattens_input(model) else list(model)
    return None


def _is_chain(model: nn.Module, chain: list[nn.Module]) -> bool:
    linear = [m for m in chain if type(m) is nn.Linear]
    params = list(model.parameters())
    return bool(linear) and not any(
        type(m) is not nn.Linear and (type(m) not in ELEMENTWISE or getattr(m, "inplace", False))
        for m in chain
    ) and not any(  # a weight or bias that is not the layer's registered parameter
        list(m.children()) or m._parameters.get("weight") is not m.weight
        or "bias" not in m._parameters or m._parameters["bias"] is not m.bias
        for m in linear
    ) and not any(  # an instance's own forward: not its type's
        "forward" in vars(m) for m in chain_modules(model, chain)
    ) and [id(p) for p in params] == [  # none outside the chain, in another order, or shared
        id(p) for m in linear for p in m.parameters()
    ] and all(p.requires_grad for p in params) and len({p.device for p in params}) == 1 \
        and not any(True for _ in model.buffers())


def flattens_input(model: nn.Module) -> bool:
    """Whether the chain model ``model`` flattens its input (``x.flatten(1)``) before its
    first layer; one that does not computes the chain only on inputs of shape (B, d)."""
    if type(model) is nn.Sequential:
        first = model[0] if len(model) else None
        return type(first) is nn.Flatten and (first.start_dim, first.end_dim) == (1, -1)
    return True


def chain_modules(model: nn.Module, chain: list[nn.Module]) -> list[nn.Module]:
    """Every module a call of ``model`` runs through: the model, its containers, the chain."""
    return list(dict.fromkeys([*model.modules(), *chain]))


def chain_state(modules: list[nn.Module]) -> tuple[object, ...]:
    """What computing a chain directly relies on, for each of ``modules`` (from
    :func:`chain_modules`): its submodules, its parameters and whether they train, whether it
    holds buffers, whether an instance attribute overrides its ``forward``. Taken when the
    chain is recognised and compared before each batch: a model changed since (a layer
    frozen, replaced or appended, a bias removed) is no longer known to be that chain, and its
    batches go through the hooked pass, which follows the model. (Identities are compared by
    ``id``: the engine keeps every recognised module and parameter alive, so none is reused.)"""
    return tuple(
        (
            tuple(map(id, m._modules.values())),
            tuple(map(id, m._parameters.values())),
            tuple(p.requires_grad for p in m._parameters.values() if p is not None),
            bool(m._buffers),
            "forward" in vars(m),
        )
        for m in modules
    )


def chain_applies(
    modules: list[nn.Module], state: tuple[object, ...], flattens: bool, features_dim: int
) -> bool:
    """Whether a chain recognised with ``state`` (:func:`chain_state` of ``modules``) may be
    computed directly for a batch of ``features_dim``-dimensional inputs: inputs it flattens or
    of shape (B, d), no hook, and the model unchanged since. The one rule for the engine and
    the simulator's batched pass."""
    return (flattens or features_dim == 2) and not any_hooks(modules) \
        and chain_state(modules) == state


def any_hooks(modules: list[nn.Module]) -> bool:
    """Whether a hook (of one of ``modules``, or a global one) would run in a call of the
    model: the chain computed directly would skip it, so the hooked pass must run instead."""
    if (_module._global_forward_hooks or _module._global_forward_pre_hooks
            or _module._global_backward_hooks or _module._global_backward_pre_hooks):
        return True
    return any(
        m._forward_hooks or m._forward_pre_hooks or m._backward_hooks or m._backward_pre_hooks
        for m in modules
    )


def chain_outputs(
    chain: list[nn.Module], features: torch.Tensor
) -> tuple[torch.Tensor, list[torch.Tensor], list[torch.Tensor]]:
    """The chain's output on ``features`` (B, ...) with autograd recording only from the
    first Linear layer's output on, each Linear layer's input (detached) and output.

    Each product is ``nn.Linear``'s own (``addmm(b, a, W^T)``, the weights detached: no
    parameter gradient is ever formed); the activations run as modules (their exact
    semantics). The first Linear layer's output is a leaf that requires grad, so one
    ``autograd.grad`` of the loss with respect to the outputs gives every layer's ``g``.
    """
    inputs: list[torch.Tensor] = []
    outputs: list[torch.Tensor] = []
    h = features.flatten(1)
    with torch.enable_grad():
        for module in chain:
            if type(module) is not nn.Linear:
                h = module.forward(h)  # no hooks (any_hooks), so forward is the call
                continue
            assert isinstance(module, nn.Linear)
            a = h.detach()
            inputs.append(a)
            weight = module.weight.detach()
            if module.bias is not None:
                h = torch.addmm(module.bias.detach(), h, weight.t())
            else:
                h = h.mm(weight.t())
            if not h.requires_grad:
                h.requires_grad_()
            outputs.append(h)
    return h, inputs, outputs
