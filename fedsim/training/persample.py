"""Per-sample gradient norms and clipped gradient sums in one forward and one backward pass.

DP-SGD needs, for a batch, ``sum_i clip(g_i, C)`` where ``g_i`` is example ``i``'s gradient
and ``clip(g, C) = g * min(1, C / ||g||)``. Materialising every ``g_i`` costs ``B x P``
memory (for the MLP 784-256-10 at B=256: 208 MB per step), which is what makes naive DP-SGD
tens of times slower than SGD on CPU. This module follows the *book-keeping* idea
(Bu et al. 2023, "Differentially private optimization on large model at small cost"; ghost
norms of Goodfellow 2015 and Li et al. 2022):

1. one forward pass records each trainable layer's input ``a`` (hooks);
2. one backward pass asks autograd only for the gradients ``g`` with respect to the layers'
   *outputs* (the parameter gradients are never formed);
3. from ``(a, g)`` each layer yields every example's squared gradient norm, without the
   per-example gradient where the layer's structure allows it:

   * ``Linear`` on (B, d): ``||g_i a_i^T||^2 = ||g_i||^2 ||a_i||^2``; on sequences (B, T, d)
     the ghost norm ``sum_{t,s} (a_t.a_s)(g_t.g_s)`` when ``2 T^2 < d_in d_out``, else the
     per-example gradient;
   * ``Conv2d`` (zero padding): the input is unfolded (im2col); per-example gradients are
     ``B x C_out x C_in k^2`` (small for convolutions) unless the ghost norm over output
     positions is cheaper (``L^2 (k + C_out) < L C_out k``);
   * ``Embedding``: ``sum_{t,s} [idx_t = idx_s] g_t.g_s``;
   * ``GroupNorm``/``LayerNorm`` affine weights: per-example gradients (one value per channel);
   * any other module with parameters: per-example gradients by ``torch.func.vmap`` over
     ``vjp`` of that module alone, at the recorded input and output gradient (exact for any
     module that treats examples independently);

4. the clipping factors ``c_i = min(1, C / (||g_i|| + 1e-6))`` weight a second, cheap
   contraction per layer (``(c * g)^T a`` for ``Linear``) that gives the clipped sum.

The result equals the clipped sum from a loop of single-example backward passes up to
floating-point summation order (tested in float64). Shared modules (called several times in
one forward pass) are supported: their uses are summed per example before the norm is taken.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn
from torch.func import functional_call, vjp, vmap

from fedsim.errors import ModelError
from fedsim.training.models import check_dp_compatible

LossFn = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]
"""``loss_fn(outputs, targets) -> per-example losses`` of shape (B,)."""

# Opacus and TF Privacy use the same stabiliser; c_i * ||g_i|| < C holds strictly.
CLIP_EPSILON = 1e-6


def per_example_cross_entropy(outputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(outputs, targets, reduction="none")


@dataclass
class _Use:
    """One call of a layer in the forward pass: its positional inputs and its output."""

    inputs: tuple[Any, ...]
    output: torch.Tensor
    grad: torch.Tensor | None = None


@dataclass
class _Layer:
    module: nn.Module
    params: list[nn.Parameter]  # direct, trainable parameters, in module order
    kind: str
    uses: list[_Use] = field(default_factory=list)


# ---------------------------------------------------------------------------------------
# per-layer rules: each returns (squared norms (B,), weighted_sum(c, outs)), where
# weighted_sum adds sum_i c_i g_i of each direct parameter into outs (views shaped like them)
# ---------------------------------------------------------------------------------------
WeightedSum = Callable[[torch.Tensor, list[torch.Tensor]], None]


def _cat(parts: list[torch.Tensor], dim: int) -> torch.Tensor:
    return parts[0] if len(parts) == 1 else torch.cat(parts, dim)


def _row_sq_norms(per_example: torch.Tensor) -> torch.Tensor:
    # A fused reduction: no B x P temporary for the squares.
    return torch.linalg.vector_norm(per_example.flatten(1), dim=1).square()


def _per_example_rule(per_example: list[torch.Tensor]) -> tuple[torch.Tensor, WeightedSum]:
    """Norms and weighted sum from materialised per-example gradients (B, *param.shape)."""
    sq = sum(_row_sq_norms(p) for p in per_example)

    def weighted(c: torch.Tensor, outs: list[torch.Tensor]) -> None:
        for out, p in zip(outs, per_example, strict=True):
            out.add_(torch.tensordot(c, p, dims=1))

    return sq, weighted


def clip_factors(norms: torch.Tensor, clip: float | torch.Tensor) -> torch.Tensor:
    """The clipping rule: ``min(1, C / (||g_i|| + CLIP_EPSILON))`` per example (a new tensor)."""
    return (clip / (norms + CLIP_EPSILON)).clamp_(max=1.0)


def linear_sq_norms(
    a: torch.Tensor, g: torch.Tensor, has_weight: bool = True, has_bias: bool = True
) -> torch.Tensor:
    """Squared per-example gradient norms of a ``Linear`` layer on (B, d_in) -> (B, d_out),
    from its inputs ``a`` and output gradients ``g``: ``||g_i||^2 (||a_i||^2 + 1)`` with a bias."""
    sq = torch.linalg.vector_norm(g, dim=1).square_()
    if has_weight:
        a_sq = torch.linalg.vector_norm(a, dim=1).square_()
        sq = a_sq.add_(1.0).mul_(sq) if has_bias else a_sq.mul_(sq)
    return sq


def _linear_single_step(
    a: torch.Tensor, g: torch.Tensor, has_weight: bool, has_bias: bool
) -> tuple[torch.Tensor, WeightedSum]:
    """``Linear`` on (B, d_in) -> (B, d_out): the norms of :func:`linear_sq_norms`."""
    sq = linear_sq_norms(a, g, has_weight, has_bias)

    def weighted(c: torch.Tensor, outs: list[torch.Tensor]) -> None:
        cg = g * c.unsqueeze(1)
        if has_weight:  # in place: no P-sized temporary, no copy
            outs[0].addmm_(cg.t(), a)
        if has_bias:
            outs[-1].add_(cg.sum(0))

    return sq, weighted


def _linear_rule(layer: _Layer) -> tuple[torch.Tensor, WeightedSum]:
    module = layer.module
    assert isinstance(module, nn.Linear)
    has_weight = module.weight.requires_grad
    has_bias = module.bias is not None and module.bias.requires_grad
    first = layer.uses[0]
    if len(layer.uses) == 1 and first.inputs[0].dim() == 2:
        # The common case, one call on (B, d): no reshapes. Few tensor ops matter here: each
        # costs microseconds of dispatch, as much as the arithmetic of a small model's step.
        a, g = first.inputs[0], first.grad
        return _linear_single_step(a, g, has_weight, has_bias)
    batch = first.output.shape[0]
    # Every use becomes positions along one sequence axis: (B, T, d).
    a = _cat([u.inputs[0].reshape(batch, -1, module.in_features) for u in layer.uses], 1)
    g = _cat([u.grad.reshape(batch, -1, module.out_features) for u in layer.uses], 1)
    steps = a.shape[1]
    if steps == 1:
        return _linear_single_step(a[:, 0], g[:, 0], has_weight, has_bias)

    per_example: list[torch.Tensor] = []
    sq = torch.zeros(batch, dtype=g.dtype, device=g.device)
    if has_weight:
        if 2 * steps * steps < module.in_features * module.out_features:
            sq = sq + (torch.bmm(a, a.transpose(1, 2)) * torch.bmm(g, g.transpose(1, 2))).sum(
                (1, 2)
            )
        else:
            per_example.append(torch.einsum("bto,bti->boi", g, a))
            sq = sq + _row_sq_norms(per_example[0])
    g_sum = g.sum(1)
    if has_bias:
        sq = sq + g_sum.pow(2).sum(1)

    def weighted_seq(c: torch.Tensor, outs: list[torch.Tensor]) -> None:
        if has_weight:
            if per_example:
                outs[0].add_(torch.tensordot(c, per_example[0], dims=1))
            else:
                outs[0].addmm_(
                    (g * c[:, None, None]).reshape(-1, module.out_features).t(),
                    a.reshape(-1, module.in_features),
                )
        if has_bias:
            outs[-1].add_(torch.tensordot(c, g_sum, dims=1))

    return sq, weighted_seq


def _patches(module: nn.Conv2d, x: torch.Tensor) -> torch.Tensor:
    """im2col as (B, L, G, C_in/G * kh * kw): one strided copy, positions-major.

    The channel-major patch order matches the weight layout (C_out, C_in/G, kh, kw). This is
    about twice as fast on CPU as ``F.unfold`` and leaves the patches ready for ``bmm``.
    """
    ph, pw = module.padding  # type: ignore[misc]
    if ph or pw:
        x = F.pad(x, (pw, pw, ph, ph))
    batch, channels, height, width = x.shape
    kh, kw = module.kernel_size
    sh, sw = module.stride
    dh, dw = module.dilation
    oh = (height - dh * (kh - 1) - 1) // sh + 1
    ow = (width - dw * (kw - 1) - 1) // sw + 1
    st = x.stride()
    view = x.as_strided(
        (batch, oh, ow, channels, kh, kw),
        (st[0], st[2] * sh, st[3] * sw, st[1], st[2] * dh, st[3] * dw),
    )
    return view.reshape(batch, oh * ow, module.groups, -1)


def _conv2d_rule(layer: _Layer) -> tuple[torch.Tensor, WeightedSum]:
    module = layer.module
    assert isinstance(module, nn.Conv2d)
    batch = layer.uses[0].output.shape[0]
    groups = module.groups
    cout = module.out_channels // groups
    a = _cat([_patches(module, u.inputs[0]) for u in layer.uses], 1)  # (B, L, G, K)
    g = _cat([u.grad.reshape(batch, groups, cout, -1) for u in layer.uses], -1)  # (B, G, O, L)
    positions, k = a.shape[1], a.shape[3]
    has_weight = module.weight.requires_grad
    has_bias = module.bias is not None and module.bias.requires_grad
    bias_pe = g.sum(-1).reshape(batch, -1) if has_bias else None
    # Ghost norms need two L x L Gram matrices plus a second contraction for the clipped sum.
    # Measured on CPU (B=256, second conv of the DP MNIST CNN, L=25, K=256, O=32, ghost FLOPs
    # 12% lower): per-example gradients 7.7 ms, ghost 11.7 ms; so ghost only when 4x cheaper.
    ghost = 4 * positions * positions * (k + cout) < positions * cout * k
    if has_weight and not ghost:
        if groups == 1:
            weight_pe = torch.bmm(g[:, 0], a[:, :, 0])
        else:
            weight_pe = torch.einsum("bgol,blgk->bgok", g, a)
        per_example = [weight_pe.reshape(batch, *module.weight.shape)]
        if bias_pe is not None:
            per_example.append(bias_pe)
        return _per_example_rule(per_example)

    sq = torch.zeros(batch, dtype=g.dtype, device=g.device)
    if has_weight:
        gram_a = torch.einsum("blgk,bmgk->bglm", a, a)
        gram_g = torch.einsum("bgol,bgom->bglm", g, g)
        sq = sq + (gram_a * gram_g).sum((1, 2, 3))
    if bias_pe is not None:
        sq = sq + bias_pe.pow(2).sum(1)

    def weighted(c: torch.Tensor, outs: list[torch.Tensor]) -> None:
        if has_weight:
            outs[0].add_(
                torch.einsum("bgol,blgk->gok", g * c[:, None, None, None], a).reshape(
                    module.weight.shape
                )
            )
        if bias_pe is not None:
            outs[-1].add_(torch.tensordot(c, bias_pe, dims=1))

    return sq, weighted


def _embedding_rule(layer: _Layer) -> tuple[torch.Tensor, WeightedSum]:
    module = layer.module
    assert isinstance(module, nn.Embedding)
    batch = layer.uses[0].output.shape[0]
    idx = _cat([u.inputs[0].reshape(batch, -1) for u in layer.uses], 1)
    g = _cat([u.grad.reshape(batch, -1, module.embedding_dim) for u in layer.uses], 1)
    if module.padding_idx is not None:  # the padding row receives no gradient
        g = g * (idx != module.padding_idx).unsqueeze(-1).to(g.dtype)
    same_row = (idx.unsqueeze(2) == idx.unsqueeze(1)).to(g.dtype)
    sq = (same_row * torch.bmm(g, g.transpose(1, 2))).sum((1, 2))

    def weighted(c: torch.Tensor, outs: list[torch.Tensor]) -> None:
        outs[0].index_add_(
            0, idx.reshape(-1), (g * c[:, None, None]).reshape(-1, module.embedding_dim)
        )

    return sq, weighted


def _norm_affine_rule(layer: _Layer) -> tuple[torch.Tensor, WeightedSum]:
    module = layer.module
    batch = layer.uses[0].output.shape[0]
    weight_pe: torch.Tensor | None = None
    bias_pe: torch.Tensor | None = None
    for use in layer.uses:
        x, g = use.inputs[0], use.grad
        if isinstance(module, nn.GroupNorm):
            x_hat = F.group_norm(x, module.num_groups, eps=module.eps)
            dims = tuple(range(2, x.dim()))  # sum over positions, keep channels
        else:
            assert isinstance(module, nn.LayerNorm)
            x_hat = F.layer_norm(x, module.normalized_shape, eps=module.eps)
            dims = tuple(range(1, x.dim() - len(module.normalized_shape)))
        w = (g * x_hat).sum(dims) if dims else g * x_hat
        b = g.sum(dims) if dims else g
        weight_pe = w if weight_pe is None else weight_pe + w
        bias_pe = b if bias_pe is None else bias_pe + b
    assert weight_pe is not None and bias_pe is not None
    per_example = []
    if module.weight is not None and module.weight.requires_grad:
        per_example.append(weight_pe.reshape(batch, *module.weight.shape))
    if module.bias is not None and module.bias.requires_grad:
        per_example.append(bias_pe.reshape(batch, *module.bias.shape))
    return _per_example_rule(per_example)


def _one_example_vjp(
    module: nn.Module, names: list[str], in_dims: tuple[int | None, ...]
) -> Callable[..., tuple[torch.Tensor, ...]]:
    """g -> d<module(x), g>/d params for one example (vmap adds the batch dimension back)."""

    def one_example(
        params: dict[str, torch.Tensor], grad: torch.Tensor, *args: Any
    ) -> tuple[torch.Tensor, ...]:
        batched = tuple(a.unsqueeze(0) if d == 0 else a for a, d in zip(args, in_dims, strict=True))
        _, pullback = vjp(lambda q: functional_call(module, q, batched), params)
        (grads,) = pullback(grad.unsqueeze(0))
        return tuple(grads[n] for n in names)

    return one_example


def _generic_rule(layer: _Layer, engine: PerSampleEngine) -> tuple[torch.Tensor, WeightedSum]:
    """Per-example gradients of the layer's direct parameters by vmap over vjp of the layer."""
    module = layer.module
    names = [n for n, p in module.named_parameters(recurse=False) if p.requires_grad]
    params = {n: getattr(module, n).detach() for n in names}
    batch = layer.uses[0].output.shape[0]
    totals: list[torch.Tensor] | None = None
    for use in layer.uses:
        in_dims = tuple(
            0 if isinstance(a, torch.Tensor) and a.dim() > 0 and a.shape[0] == batch else None
            for a in use.inputs
        )

        with engine._paused():
            per_use = vmap(_one_example_vjp(module, names, in_dims), in_dims=(None, 0, *in_dims))(
                params, use.grad, *use.inputs
            )
        totals = (
            list(per_use)
            if totals is None
            else [t + u for t, u in zip(totals, per_use, strict=True)]
        )
    assert totals is not None
    return _per_example_rule(totals)


_RULES: dict[str, Callable[[_Layer], tuple[torch.Tensor, WeightedSum]]] = {
    "linear": _linear_rule,
    "conv2d": _conv2d_rule,
    "embedding": _embedding_rule,
    "norm": _norm_affine_rule,
}


def _classify(module: nn.Module) -> str:
    if type(module) is nn.Linear:
        return "linear"
    if (
        type(module) is nn.Conv2d
        and module.padding_mode == "zeros"
        and not isinstance(module.padding, str)
    ):
        return "conv2d"
    if type(module) is nn.Embedding:
        if module.max_norm is not None:
            raise ModelError(
                "Embedding with max_norm rewrites its weights during forward; not supported by DP-SGD"
            )
        if module.scale_grad_by_freq:
            raise ModelError(
                "Embedding(scale_grad_by_freq=True) scales gradients by batch-wide frequencies, "
                "which mixes examples; use scale_grad_by_freq=False"
            )
        return "embedding"
    if type(module) in (nn.GroupNorm, nn.LayerNorm):
        return "norm"
    return "generic"


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


class PerSampleEngine:
    """Per-example clipped gradient sums for one model (see the module docstring).

    Hooks are attached only while :meth:`clipped_sum` runs, so a model can be shared by many
    clients (load their parameters, compute, move on). Use :func:`engine_for` to reuse one
    engine per model object.
    """

    def __init__(self, model: nn.Module) -> None:
        check_dp_compatible(model)
        self.model = model
        self._layers: list[_Layer] = []
        seen: dict[int, str] = {}
        for name, module in model.named_modules():
            params = [p for p in module.parameters(recurse=False) if p.requires_grad]
            if not params:
                continue
            for p in params:
                if id(p) in seen:
                    raise ModelError(
                        f"parameter shared between modules {seen[id(p)]!r} and {name!r}; "
                        "per-sample clipping needs each parameter in one module"
                    )
                seen[id(p)] = name
            self._layers.append(_Layer(module, params, _classify(module)))
        if not self._layers:
            raise ModelError("the model has no trainable parameters")
        self._clone_outputs = any(getattr(m, "inplace", False) for m in model.modules())
        self._capturing = False
        self._all_params = list(model.parameters())
        self._offsets: dict[int, tuple[int, int]] = {}
        offset = 0
        for p in self._all_params:
            self._offsets[id(p)] = (offset, offset + p.numel())
            offset += p.numel()
        self.num_params = offset

    def parameters(self) -> list[nn.Parameter]:
        """All model parameters, in the order of the flat vectors."""
        return self._all_params

    class _Pause:
        def __init__(self, engine: PerSampleEngine) -> None:
            self.engine, self.before = engine, engine._capturing

        def __enter__(self) -> None:
            self.engine._capturing = False

        def __exit__(self, *exc: object) -> None:
            self.engine._capturing = self.before

    def _paused(self) -> PerSampleEngine._Pause:
        return PerSampleEngine._Pause(self)

    def _hook(self, layer: _Layer) -> Callable[..., torch.Tensor | None]:
        def record(module: nn.Module, args: tuple[Any, ...], output: Any) -> torch.Tensor | None:
            if not self._capturing:
                return None
            if not isinstance(output, torch.Tensor):
                raise ModelError(
                    f"{type(module).__name__} returns {type(output).__name__}; per-sample clipping needs a tensor output"
                )
            layer.uses.append(
                _Use(tuple(a.detach() if isinstance(a, torch.Tensor) else a for a in args), output)
            )
            # Differentiate by the recorded tensor; hand a copy downstream so that an in-place
            # op there (ReLU(inplace=True)) cannot rewrite the recorded one.
            return output.clone() if self._clone_outputs else output

        return record

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
        handles = [layer.module.register_forward_hook(self._hook(layer)) for layer in self._layers]
        try:
            self._capturing = True
            with torch.enable_grad():
                outputs = self.model(features)
                self._capturing = False
                losses = loss_fn(outputs, targets)
                if losses.shape != (batch,):
                    raise ModelError(
                        f"loss_fn must return per-example losses of shape ({batch},), got {tuple(losses.shape)}"
                    )
                uses = [use for layer in self._layers for use in layer.uses]
                total = losses.sum()
                grads = torch.autograd.grad(total, [u.output for u in uses], allow_unused=True)
            for use, grad in zip(uses, grads, strict=True):
                use.grad = torch.zeros_like(use.output) if grad is None else grad.detach()
            return self._clip_and_sum(batch, clip, float(total.detach()), scale, out)
        finally:
            self._capturing = False
            for handle in handles:
                handle.remove()
            for layer in self._layers:
                layer.uses = []

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
        model's current ``w`` (paper 000, sec. 2: any ``a_h`` that depends on one example and
        on ``w`` keeps the sensitivity bound). ``steps == 1`` gives the gradient. Computed with
        ``torch.func.vmap`` over the examples, so it materialises ``B x P`` values: bound the
        memory with a smaller physical batch. ``loss_sum`` is the loss at ``w``. ``scale`` and
        ``out`` as in :meth:`clipped_sum`.
        """
        batch = features.shape[0]
        if batch == 0:
            return self._empty_batch_sum(out)
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
        factors = clip_factors(norms, clip).mul_(scale)
        flat = self._flat_zeros() if out is None else out
        flat.addmv_(rows.t(), factors)
        return ClippedSum(flat, norms, loss_sum)

    def _clip_and_sum(
        self, batch: int, clip: float, loss_sum: float, scale: float, out: torch.Tensor | None
    ) -> ClippedSum:
        param = self._all_params[0]
        sq: torch.Tensor | None = None
        pending: list[tuple[_Layer, WeightedSum]] = []
        for layer in self._layers:
            if not layer.uses:  # not used in this forward pass: zero gradient
                continue
            if layer.kind == "generic":
                layer_sq, weighted = _generic_rule(layer, self)
            else:
                layer_sq, weighted = _RULES[layer.kind](layer)
            sq = layer_sq if sq is None else sq + layer_sq
            pending.append((layer, weighted))
        if sq is None:
            sq = torch.zeros(batch, dtype=param.dtype, device=param.device)
        norms = sq.clamp_min(0).sqrt_()
        factors = clip_factors(norms, clip)
        if scale != 1.0:
            factors.mul_(scale)
        flat = self._flat_zeros() if out is None else out
        for layer, weighted in pending:
            weighted(factors, [self._flat_view(flat, p) for p in layer.params])
        return ClippedSum(flat, norms, loss_sum)

    def _flat_view(self, flat: torch.Tensor, param: nn.Parameter) -> torch.Tensor:
        start, stop = self._offsets[id(param)]
        part = flat[start:stop]
        return part if param.dim() == 1 else part.view(param.shape)


_ENGINES: weakref.WeakKeyDictionary[nn.Module, PerSampleEngine] = weakref.WeakKeyDictionary()


def engine_for(model: nn.Module) -> PerSampleEngine:
    """The (cached) engine of ``model``: many clients sharing one model object share it."""
    engine = _ENGINES.get(model)
    if engine is None:
        engine = PerSampleEngine(model)
        _ENGINES[model] = engine
    return engine


def _or_zeros(grad: torch.Tensor | None, param: torch.Tensor) -> torch.Tensor:
    return torch.zeros_like(param) if grad is None else grad


def naive_per_example_gradients(
    model: nn.Module,
    features: torch.Tensor,
    targets: torch.Tensor,
    loss_fn: LossFn = per_example_cross_entropy,
) -> torch.Tensor:
    """Reference: per-example gradients (B, P) from one backward pass per example.

    Slow and memory-hungry by design; tests compare the fast engine against it.
    """
    params = list(model.parameters())
    trainable = [p for p in params if p.requires_grad]
    rows: list[torch.Tensor] = []
    for i in range(features.shape[0]):
        loss = loss_fn(model(features[i : i + 1]), targets[i : i + 1]).sum()
        grads = dict(
            zip(
                map(id, trainable),
                torch.autograd.grad(loss, trainable, allow_unused=True),
                strict=True,
            )
        )
        rows.append(torch.cat([_or_zeros(grads.get(id(p)), p).reshape(-1) for p in params]))
    return torch.stack(rows)


def clip_rows(rows: torch.Tensor, clip: float) -> torch.Tensor:
    """Clip each row of ``rows`` to norm ``clip`` with the engine's factors (for references)."""
    norms = rows.norm(dim=1)
    return rows * clip_factors(norms, clip)[:, None]


__all__: Sequence[str] = (
    "CLIP_EPSILON",
    "ClippedSum",
    "clip_factors",
    "linear_sq_norms",
    "LossFn",
    "PerSampleEngine",
    "clip_rows",
    "engine_for",
    "naive_per_example_gradients",
    "per_example_cross_entropy",
)
