"""The per-sample engine: clipped per-example gradient sums of one model, batch by batch.

One hooked forward pass and one backward pass to the layers' outputs serve every layer with a
fast rule (:mod:`~fedsim.training.persample.rules`); the parameters of every other layer (and
of layers whose parameters are shared or read outside their ``forward``) get per-example
gradients from the torch.func fallback (:mod:`~fedsim.training.persample.fallback`). The
squared norms of both are summed per example, the clipping factors ``c_i`` are computed once
(:func:`~fedsim.training.persample.clipping.clip_factors`) and weight every part's sum.

Checks, so that a model that breaks the per-example contract fails with a reason instead of
releasing a wrong sensitivity: the static ones of
:func:`~fedsim.training.models.check_dp_compatible` when the engine is built; on the first
batch, the forward probe of :func:`~fedsim.training.models.check_forward_is_per_example` and
an attribution check (the per-example gradients of the fast layers sum to autograd's batch
gradient; a layer whose parameters are also used elsewhere fails it and moves to the
fallback); on every batch, no parameter or buffer may change during ``forward``.

With random layers (dropout) the hooked pass and the fallback draw their randomness apart; each
example's clipped vector still depends on that example (and fresh randomness) alone, so the
sensitivity bound holds.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn
from torch.func import functional_call, vmap

from fedsim.errors import ModelError
from fedsim.logging import get_logger
from fedsim.training.models import (
    changed_state,
    check_dp_compatible,
    check_forward_is_per_example,
    tensor_state,
)
from fedsim.training.persample import fallback
from fedsim.training.persample.base import Layer, Use, WeightedSum
from fedsim.training.persample.base import per_example_rule as _per_example_rule
from fedsim.training.persample.chain import (
    chain_applies,
    chain_modules,
    chain_outputs,
    chain_state,
    flattens_input,
    linear_chain,
)
from fedsim.training.persample.clipping import LossFn, clip_factors, per_example_cross_entropy
from fedsim.training.persample.rules import (
    RULES,
    fast_path,
    group_norm_statistics,
    linear_rows_rule,
)

__all__ = ["ClippedSum", "PerSampleEngine", "engine_for"]

_log = get_logger("fedsim.training.persample")

# Total output values of the fast layers in one pass from which their rules run during the
# backward pass (see PerSampleEngine._forward_backward): 4 MB of float32 gradients.
_EARLY_RULES_MIN_VALUES = 1 << 20

# Tolerance of the first batch's attribution check, relative to the gradients compared: far
# above float32 summation-order noise, far below a missing use of a parameter.
_ATTRIBUTION_RTOL = 1e-3


@dataclass(frozen=True)
class ClippedSum:
    """Result of :meth:`PerSampleEngine.clipped_sum` for one physical batch."""

    flat_sum: torch.Tensor
    """``scale * sum_i clip(g_i, C)`` as one flat vector in :meth:`PerSampleEngine.parameters`
    order, added to what ``out`` held when one was passed (it is then that tensor)."""
    norms: torch.Tensor
    """Unclipped per-example gradient norms, shape (B,)."""
    loss_sum: float
    """Sum of the per-example losses (not privatised: keep it local)."""


def _rng_devices(params: Sequence[torch.Tensor]) -> list[int]:
    return sorted(
        {
            p.device.index if p.device.index is not None else torch.cuda.current_device()
            for p in params
            if p.device.type == "cuda"
        }
    )


class PerSampleEngine:
    """Per-example clipped gradient sums for one model (see the module docstring).

    ``fast_paths=False`` sends every parameter through the torch.func fallback (the reference
    the benchmarks compare the fast rules with). Hooks are attached only while a batch is
    computed, so a model can be shared by many clients (load their parameters, compute, move
    on). Use :func:`engine_for` to reuse one engine per model object.
    """

    def __init__(self, model: nn.Module, *, fast_paths: bool = True) -> None:
        check_dp_compatible(model)
        self.model = model
        self._fast_paths = fast_paths
        self._all_params = list(model.parameters())
        self._names = {id(p): n for n, p in model.named_parameters()}
        self._clone_outputs = any(getattr(m, "inplace", False) for m in model.modules())
        self._capturing = False
        # Each parameter's place in a flat vector: start, stop, its shape (None: a vector).
        self._spans: dict[int, tuple[int, int, torch.Size | None]] = {}
        offset = 0
        for p in self._all_params:
            self._spans[id(p)] = (offset, offset + p.numel(), None if p.dim() == 1 else p.shape)
            offset += p.numel()
        self.num_params = offset
        self._derive()

    def _derive(self) -> None:
        """The fast layers, the fallback's parameters and the chain, from the parameters that
        train now (recorded in ``_trainable``); the next batch is checked as a first one."""
        model, fast_paths = self.model, self._fast_paths
        self._trainable = tuple(p.requires_grad for p in self._all_params)
        direct: list[tuple[nn.Module, list[nn.Parameter]]] = []
        owners: dict[int, int] = {}
        for module in model.modules():
            params = [p for p in module.parameters(recurse=False) if p.requires_grad]
            if params:
                direct.append((module, params))
                for p in params:
                    owners[id(p)] = owners.get(id(p), 0) + 1
        if not direct:
            raise ModelError("the model has no trainable parameters")
        self._layers: list[Layer] = []
        self._fallback_ids: set[int] = set()
        for module, params in direct:
            kind = fast_path(module) if fast_paths else None
            if kind is None or any(owners[id(p)] > 1 for p in params):  # shared: fallback
                self._fallback_ids.update(id(p) for p in params)
            else:
                self._layers.append(Layer(module, params, kind))
        self._checked = False
        chain = linear_chain(model) if fast_paths else None
        self._chain = chain
        """The model as a chain of Linear layers and activations (computed directly, see
        :mod:`~fedsim.training.persample.chain`), or None."""
        self._chain_flattens = flattens_input(model)
        self._chain_modules = chain_modules(model, chain) if chain is not None else []
        self._chain_state = chain_state(self._chain_modules)
        """The chain as recognised (:func:`~fedsim.training.persample.chain.chain_state`)."""
        self._chain_linears = [
            (m, list(m.parameters()), m.bias is not None) for m in chain or ()
            if type(m) is nn.Linear
        ]
        """The chain's Linear layers: (module, its parameters in order, whether it has a bias)."""

    def _follow_trainable(self) -> None:
        """Derive the layers, fallback and chain again when a parameter was frozen or unfrozen
        since they were derived: what they hold, the first-batch check's verdict included, is
        of the parameters that trained then (a frozen one still went through the fallback or
        the check; an unfrozen one got no gradient). About 1 us a parameter a batch."""
        if tuple(p.requires_grad for p in self._all_params) != self._trainable:
            self._derive()

    def parameters(self) -> list[nn.Parameter]:
        """All model parameters, in the order of the flat vectors."""
        return self._all_params

    @property
    def fallback_parameters(self) -> list[str]:
        """Names of the parameters whose per-example gradients come from the torch.func path."""
        return [self._names[id(p)] for p in self._all_params if id(p) in self._fallback_ids]

    # -- the hooked pass ------------------------------------------------------------------

    def _hook(self, layer: Layer) -> Callable[..., torch.Tensor | None]:
        def record(module: nn.Module, args: tuple[Any, ...], output: Any) -> torch.Tensor | None:
            if not self._capturing:
                return None
            if not isinstance(output, torch.Tensor):
                raise ModelError(
                    f"{type(module).__name__} returns {type(output).__name__}; per-sample clipping needs a tensor output"
                )
            layer.uses.append(
                Use(
                    tuple(a.detach() if isinstance(a, torch.Tensor) else a for a in args),
                    output,
                    stats=group_norm_statistics(module, output) if layer.kind == "norm" else None,
                )
            )
            # Differentiate by the recorded tensor; hand a copy downstream so that an in-place
            # op there (ReLU(inplace=True)) cannot rewrite the recorded one.
            return output.clone() if self._clone_outputs else output

        return record

    def _forward_backward(
        self,
        features: torch.Tensor,
        targets: torch.Tensor,
        loss_fn: LossFn,
        also: Sequence[torch.Tensor] = (),
    ) -> tuple[float, tuple[torch.Tensor | None, ...]]:
        """Hooked forward, one backward to the fast layers' outputs (and to ``also``, whose
        gradients are returned); sets every used layer's :attr:`Layer.result`. The caller
        clears the uses.

        A layer called once gets its rule applied by a hook on its output, as soon as the
        backward pass has that output's gradient, which is then dropped: held until the end,
        the output gradients of every layer (52 MB a step for the GroupNorm CNN at B=256)
        were memory plain SGD never holds at once, and the allocator, handed it back at the
        end of each step, faulted it in again in the next (11,000-13,000 page faults and
        20-40 ms of system time a step, plain SGD none). Only the outputs no other layer's
        output lies upstream of are asked for (:func:`_asked_for`); every other one's
        gradient is computed on the way to them. Below :data:`_EARLY_RULES_MIN_VALUES` output
        values in all (the MLP 784-256-10's 68,000 at B=256) every output is asked for and the
        rules run after the pass: the graph walk and the hooks cost more there (about 30 us,
        1% of that model's step) than holding the gradients does.
        """
        batch = features.shape[0]
        handles = [layer.module.register_forward_hook(self._hook(layer)) for layer in self._layers]
        state = tensor_state(self.model)
        try:
            self._capturing = True
            with torch.enable_grad():
                outputs = self.model(features)
                self._capturing = False
                refusal = changed_state(self.model, state)
                if refusal is not None:
                    raise ModelError(refusal)
                losses = loss_fn(outputs, targets)
                if losses.shape != (batch,):
                    raise ModelError(
                        f"loss_fn must return per-example losses of shape ({batch},), got {tuple(losses.shape)}"
                    )
                total = losses.sum()
                uses = [use for layer in self._layers for use in layer.uses]
                early = sum(use.output.numel() for use in uses) >= _EARLY_RULES_MIN_VALUES
                if early:
                    asked = self._rules_during_backward(uses, total)
                else:  # small: every gradient held to the end, no graph walk
                    asked = [use for use in uses if use.output.requires_grad]
                del uses
                wrt = [u.output for u in asked]
                grads = torch.autograd.grad(total, wrt + list(also), allow_unused=True)
                del wrt
                if not early:
                    for use, grad in zip(asked, grads, strict=False):
                        use.grad = None if grad is None else grad.detach()
        finally:
            self._capturing = False
            for handle in handles:
                handle.remove()
        self._rules_after_backward()
        return float(total.detach()), grads[len(asked) :]

    def _rules_after_backward(self) -> None:
        """The rule of every used layer that has no result yet (shared, a small model, or no
        gradient reached it: then its gradient is zero)."""
        for layer in self._layers:
            if layer.uses and layer.result is None:
                for use in layer.uses:
                    if use.grad is None:
                        use.grad = torch.zeros_like(use.output)
                layer.result = RULES[layer.kind](layer)

    def _rules_during_backward(self, uses: list[Use], total: torch.Tensor) -> list[Use]:
        """Hook every used layer's outputs (its rule for a layer called once, else keep the
        gradient); return the uses to ask the backward pass for (:func:`_asked_for`)."""
        for layer in self._layers:
            if len(layer.uses) == 1 and layer.uses[0].output.requires_grad:
                layer.uses[0].output.register_hook(_apply_rule(layer))
            else:  # shared: the rule sums its uses per example once all are in
                for use in layer.uses:
                    if use.output.requires_grad:
                        use.output.register_hook(_keep_grad(use))
        return _asked_for(uses, total)

    def _clear(self) -> None:
        for layer in self._layers:
            layer.uses = []
            layer.result = None

    # -- the first batch's checks ----------------------------------------------------------

    def _first_batch_checks(
        self, features: torch.Tensor, targets: torch.Tensor, loss_fn: LossFn
    ) -> None:
        with torch.random.fork_rng(devices=_rng_devices(self._all_params)):
            check_forward_is_per_example(self.model, features)
            if self._layers:
                self._check_attribution(features, targets, loss_fn)
        self._checked = True

    def _check_attribution(
        self, features: torch.Tensor, targets: torch.Tensor, loss_fn: LossFn
    ) -> None:
        """Move to the fallback every fast layer whose per-example gradients do not sum to the
        batch gradient (its parameters are also used outside its ``forward``).

        A utility check, not a privacy one: the released sum is built from the rules'
        per-example gradients alone, each a function of one example and clipped to ``C``, so a
        missed use would bias the gradient without raising the sensitivity. A false alarm
        costs only speed (the fallback is exact).
        """
        fast = [p for layer in self._layers for p in layer.params]
        spread: dict[int, float] = {}  # per layer: the sum of the examples' gradient norms
        try:
            _, true = self._forward_backward(features, targets, loss_fn, also=fast)
            scratch = self._flat_zeros()
            ones = torch.ones(features.shape[0], dtype=scratch.dtype, device=scratch.device)
            for layer in self._layers:
                if layer.result is not None:
                    layer_sq, weighted = layer.result
                    weighted(ones, self._views(scratch, layer.params))
                    spread[id(layer)] = float(layer_sq.clamp_min(0).sqrt().sum())
        finally:
            self._clear()
        exact = {
            id(p): torch.zeros_like(p) if g is None else g for p, g in zip(fast, true, strict=True)
        }
        moved: list[Layer] = []
        for layer in self._layers:
            for p, summed in zip(layer.params, self._views(scratch, layer.params), strict=True):
                g = exact[id(p)].reshape(summed.shape)
                # Summation-order noise grows with the summed terms, not with their sum.
                tol = _ATTRIBUTION_RTOL * (
                    float(g.norm()) + float(summed.norm()) + 0.1 * spread.get(id(layer), 0.0)
                )
                if float((summed - g).norm()) > tol + 1e-12:
                    moved.append(layer)
                    break
        if moved:
            _log.warning(
                "per-sample fast path replaced by the torch.func fallback",
                modules=[
                    n for n, m in self.model.named_modules() if any(m is x.module for x in moved)
                ],
                reason="their parameters are also used outside their forward (e.g. tied weights)",
            )
            self._layers = [layer for layer in self._layers if layer not in moved]
            self._chain = None  # not the chain it looks like: its batches take the hooked pass
            self._fallback_ids.update(id(p) for layer in moved for p in layer.params)

    # -- results ---------------------------------------------------------------------------

    def _flat_zeros(self) -> torch.Tensor:
        param = self._all_params[0]
        return torch.zeros(self.num_params, dtype=param.dtype, device=param.device)

    def _empty_batch_sum(self, out: torch.Tensor | None) -> ClippedSum:
        """An empty (Poisson) batch contributes nothing: a zero sum and no norms."""
        param = self._all_params[0]
        return ClippedSum(
            self._flat_zeros() if out is None else out,
            torch.zeros(0, dtype=param.dtype, device=param.device),
            0.0,
        )

    def clipped_sum(
        self,
        features: torch.Tensor,
        targets: torch.Tensor,
        clip: float,
        loss_fn: LossFn = per_example_cross_entropy,
        *,
        scale: float = 1.0,
        out: torch.Tensor | None = None,
    ) -> ClippedSum:
        """Forward + backward once; return ``scale`` times the clipped sum, the norms, the loss sum.

        With ``out`` (a flat vector of :attr:`num_params` values) the scaled clipped sum is
        added into it in place and ``out`` is returned as ``flat_sum``: DP-SGD draws the noise
        first and accumulates the gradients into it, which saves two passes over ``P`` values.
        """
        batch = features.shape[0]
        if batch == 0:
            return self._empty_batch_sum(out)
        self._follow_trainable()
        if not self._checked:
            self._first_batch_checks(features, targets, loss_fn)
        chain = self._chain
        if chain is not None and chain_applies(self._chain_modules, self._chain_state,
                                               self._chain_flattens, features.dim()):
            return self._chain_clipped_sum(chain, features, targets, clip, loss_fn, scale, out)
        sq: torch.Tensor | None = None
        parts: list[tuple[list[nn.Parameter], WeightedSum]] = []
        loss_sum = 0.0
        try:
            if self._layers:
                loss_sum, _ = self._forward_backward(features, targets, loss_fn)
                for layer in self._layers:
                    if layer.result is None:  # not used in this forward pass: zero gradient
                        continue
                    layer_sq, weighted = layer.result
                    sq = layer_sq if sq is None else sq + layer_sq
                    parts.append((layer.params, weighted))
            if self._fallback_ids:
                params = [p for p in self._all_params if id(p) in self._fallback_ids]
                per_example, losses = fallback.per_example_gradients(
                    self.model, [self._names[id(p)] for p in params], features, targets, loss_fn
                )
                layer_sq, weighted = _per_example_rule(per_example)
                sq = layer_sq if sq is None else sq + layer_sq
                parts.append((params, weighted))
                if not self._layers:
                    loss_sum = float(losses.sum())
            return self._clip_and_sum(batch, clip, sq, parts, loss_sum, scale, out)
        finally:
            self._clear()

    def _chain_clipped_sum(
        self,
        chain: list[nn.Module],
        features: torch.Tensor,
        targets: torch.Tensor,
        clip: float,
        loss_fn: LossFn,
        scale: float,
        out: torch.Tensor | None,
    ) -> ClippedSum:
        """:meth:`clipped_sum` of a chain model (:mod:`~fedsim.training.persample.chain`): the
        same products, backward pass, rules and clipping as the hooked pass, in the same order
        (equal to the bit), without hooks, module calls, the parameters' graph or the check
        that forward changes no state (a chain has none to change). On a small model's step
        those are a large share of the time (the MLP 784-256-10's at B=256: about 0.1 of a
        plain SGD step)."""
        batch = features.shape[0]
        logits, inputs, outputs = chain_outputs(chain, features)
        with torch.enable_grad():
            losses = loss_fn(logits, targets)
            if losses.shape != (batch,):
                raise ModelError(
                    f"loss_fn must return per-example losses of shape ({batch},), got {tuple(losses.shape)}"
                )
            total = losses.sum()
            grads = torch.autograd.grad(total, outputs, allow_unused=True)
        sq: torch.Tensor | None = None
        parts: list[tuple[list[nn.Parameter], WeightedSum]] = []
        for (_, params, has_bias), a, g, output in zip(
            self._chain_linears, inputs, grads, outputs, strict=True
        ):
            # autograd.grad's results are out of any graph (no create_graph): no detach.
            layer_sq, weighted = linear_rows_rule(
                a, torch.zeros_like(output) if g is None else g, True, has_bias)
            sq = layer_sq if sq is None else sq.add_(layer_sq)  # sq: this pass's own tensor
            parts.append((params, weighted))
        return self._clip_and_sum(batch, clip, sq, parts, total.item(), scale, out,
                                  nonnegative=True)

    def clipped_local_updates(
        self,
        features: torch.Tensor,
        targets: torch.Tensor,
        clip: float,
        steps: int,
        lr: float,
        loss_fn: LossFn = per_example_cross_entropy,
        *,
        scale: float = 1.0,
        out: torch.Tensor | None = None,
    ) -> ClippedSum:
        """Clipped sum of per-example *local updates* ``a_h = (w - w_h) / lr``.

        ``w_h`` is ``steps`` SGD steps (step size ``lr``) on example ``h`` alone, each from the
        model's current ``w`` (van Dijk & Nguyen, sec. 2: any ``a_h`` that depends on one example and
        on ``w`` keeps the sensitivity bound). ``steps == 1`` gives the gradient. Computed with
        ``torch.func.vmap`` over the examples, so it materialises ``B x P`` values: bound the
        memory with a smaller physical batch. ``loss_sum`` is the loss at ``w``. ``scale`` and
        ``out`` as in :meth:`clipped_sum`.
        """
        batch = features.shape[0]
        if batch == 0:
            return self._empty_batch_sum(out)
        self._follow_trainable()
        if not self._checked:
            self._first_batch_checks(features, targets, loss_fn)
        names = [n for n, p in self.model.named_parameters()]
        trainable = {n for n, p in self.model.named_parameters() if p.requires_grad}
        start = {n: p.detach() for n, p in self.model.named_parameters()}
        model = self.model

        def loss_of(
            params: dict[str, torch.Tensor], x: torch.Tensor, y: torch.Tensor
        ) -> torch.Tensor:
            return loss_fn(functional_call(model, params, (x.unsqueeze(0),)), y.unsqueeze(0)).sum()

        def local_update(
            params: dict[str, torch.Tensor], x: torch.Tensor, y: torch.Tensor
        ) -> torch.Tensor:
            current = dict(params)
            for _ in range(steps):
                grads = torch.func.grad(loss_of)(current, x, y)
                current = {
                    n: current[n] - lr * grads[n] if n in trainable else current[n] for n in names
                }
            return torch.cat([((params[n] - current[n]) / lr).reshape(-1) for n in names])

        with torch.enable_grad():
            rows = vmap(local_update, in_dims=(None, 0, 0))(start, features, targets)  # (B, P)
            with torch.no_grad():
                loss_sum = float(loss_fn(model(features), targets).sum())
        norms = torch.linalg.vector_norm(rows, dim=1)
        factors = clip_factors(norms, clip, scale)
        flat = self._flat_zeros() if out is None else out
        flat.addmv_(rows.t(), factors)
        return ClippedSum(flat, norms, loss_sum)

    def _clip_and_sum(
        self,
        batch: int,
        clip: float,
        sq: torch.Tensor | None,
        parts: list[tuple[list[nn.Parameter], WeightedSum]],
        loss_sum: float,
        scale: float,
        out: torch.Tensor | None,
        *,
        nonnegative: bool = False,
    ) -> ClippedSum:
        """Clip with the norms ``sqrt(sq)`` and add each part's weighted sum into ``out``.
        ``nonnegative``: ``sq`` holds no negative value (nan aside) and is the caller's own
        tensor, so it is neither clamped nor copied (each tensor op costs microseconds)."""
        param = self._all_params[0]
        if sq is None:
            sq = torch.zeros(batch, dtype=param.dtype, device=param.device)
        norms = (sq if nonnegative else sq.clamp_min(0)).sqrt_()
        factors = clip_factors(norms, clip, scale)
        flat = self._flat_zeros() if out is None else out
        for params, weighted in parts:
            weighted(factors, self._views(flat, params))
        return ClippedSum(flat, norms, loss_sum)

    def _views(self, flat: torch.Tensor, params: list[nn.Parameter]) -> list[torch.Tensor]:
        views = []
        for param in params:
            start, stop, shape = self._spans[id(param)]
            views.append(flat[start:stop] if shape is None else flat[start:stop].view(shape))
        return views


def _apply_rule(layer: Layer) -> Callable[[torch.Tensor], None]:
    """A tensor hook on a once-called layer's output: its rule, from the gradient just in."""

    def hook(grad: torch.Tensor) -> None:
        layer.uses[0].grad = grad.detach()
        layer.result = RULES[layer.kind](layer)
        # The rule keeps what its weighted sum needs; the recorded input, output and gradient
        # go now, so autograd frees each activation once its backward has run (as in plain
        # SGD), not at the end of the step.
        layer.uses = []

    return hook


def _keep_grad(use: Use) -> Callable[[torch.Tensor], None]:
    def hook(grad: torch.Tensor) -> None:
        use.grad = grad.detach()

    return hook


def _asked_for(uses: list[Use], total: torch.Tensor) -> list[Use]:
    """The uses whose outputs the backward pass must be asked for: those with no other use's
    output upstream of them in the autograd graph of ``total``. Every other use's output lies
    on a path from ``total`` to one of these, so its gradient is computed on the way (and its
    hook fires); one the loss does not depend on gets none (a zero gradient)."""
    nodes = {id(u.output.grad_fn) for u in uses if u.output.grad_fn is not None}
    below: dict[int, bool] = {}  # node id -> a use's node lies strictly upstream of it
    root = total.grad_fn
    if root is not None:
        stack: list[tuple[Any, bool]] = [(root, False)]
        while stack:
            node, expanded = stack.pop()
            key = id(node)
            if expanded:
                below[key] = any(
                    id(child) in nodes or below.get(id(child), False)
                    for child, _ in node.next_functions
                    if child is not None
                )
                continue
            if key in below:
                continue
            below[key] = False  # in progress (the graph is acyclic)
            stack.append((node, True))
            stack.extend(
                (child, False)
                for child, _ in node.next_functions
                if child is not None and id(child) not in below
            )
    return [
        u
        for u in uses
        if u.output.grad_fn is not None and not below.get(id(u.output.grad_fn), False)
    ]


_ENGINES: weakref.WeakKeyDictionary[nn.Module, PerSampleEngine] = weakref.WeakKeyDictionary()


def engine_for(model: nn.Module) -> PerSampleEngine:
    """The (cached) engine of ``model``: many clients sharing one model object share it."""
    engine = _ENGINES.get(model)
    if engine is None:
        engine = PerSampleEngine(model)
        _ENGINES[model] = engine
    return engine
