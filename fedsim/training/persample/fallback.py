"""Per-example gradients of any parameters by ``torch.func``: the path for layers without a rule.

``vmap`` over the examples of ``grad`` of one example's loss, the model run by
``functional_call`` on that example alone (a batch of one). Only the parameters asked for are
differentiated; the others enter as constants. This is exact for any model whose output for
an example depends on that example alone (what DP-SGD needs anyway), wherever in the forward
pass the parameters are used: a custom module's own ``nn.Parameter``, weights tied between
modules or read outside their module's ``forward`` (``F.linear(x, self.embedding.weight)``),
layers whose batch is not their input's first dimension (``MultiheadAttention`` with
``batch_first=False``). The cost is a forward and backward pass per example (batched by
vmap) and ``B x P_fallback`` values; the fast rules of :mod:`~fedsim.training.persample.rules`
avoid both, which ``benchmarks/persample_paths.py`` measures.

Random layers (dropout) draw independent randomness per example (``randomness="different"``).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import nn
from torch.func import functional_call, grad, vmap

from fedsim.errors import ModelError
from fedsim.training.persample.clipping import LossFn

__all__ = ["per_example_gradients"]


def per_example_gradients(
    model: nn.Module,
    names: Sequence[str],
    features: torch.Tensor,
    targets: torch.Tensor,
    loss_fn: LossFn,
) -> tuple[list[torch.Tensor], torch.Tensor]:
    """Each example's gradient of its own loss with respect to the parameters ``names``.

    Returns ``([(B, *shape) per name], per-example losses (B,))``. Raises :class:`ModelError`
    naming the reason when torch.func cannot run the model per example.
    """
    params = {n: p.detach() for n, p in model.named_parameters()}
    buffers = {n: b.detach() for n, b in model.named_buffers()}
    chosen = {n: params.pop(n) for n in names}

    def loss_of(
        own: dict[str, torch.Tensor], x: torch.Tensor, y: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        outputs = functional_call(model, ({**params, **own}, buffers), (x.unsqueeze(0),))
        loss = loss_fn(outputs, y.unsqueeze(0)).sum()
        return loss, loss.detach()

    try:
        with torch.enable_grad():
            grads, losses = vmap(
                grad(loss_of, has_aux=True), in_dims=(None, 0, 0), randomness="different"
            )(chosen, features, targets)
    except (RuntimeError, NotImplementedError) as exc:
        raise ModelError(
            f"per-example gradients of {', '.join(names)} (no fast path) need torch.func to run "
            f"the model on one example at a time, which failed: {exc}{_hint(model)}"
        ) from exc
    return [grads[n] for n in names], losses


def _hint(model: nn.Module) -> str:
    """What to change in a model whose failure torch.func is known for."""
    recurrent = sorted({type(m).__name__ for m in model.modules()
                        if isinstance(m, nn.RNN | nn.GRU)})
    if not recurrent:
        return ""
    return (f". {' and '.join(recurrent)} cannot be run one example at a time when it makes its "
            f"own initial hidden state (torch.func cannot batch it): pass one made from the "
            f"input, e.g. `self.gru(x, x.new_zeros(num_layers, x.shape[0], hidden_size))` "
            f"(batch_first; with bidirectional, 2 * num_layers)")
