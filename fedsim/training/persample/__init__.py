"""Per-sample gradient norms and clipped gradient sums in one forward and one backward pass.

DP-SGD needs, for a batch, ``sum_i clip(g_i, C)`` where ``g_i`` is example ``i``'s gradient
and ``clip(g, C) = g * min(1, C / ||g||)``. Materialising every ``g_i`` costs ``B x P``
memory (for the MLP 784-256-10 at B=256: 208 MB per step), which is what makes naive DP-SGD
tens of times slower than SGD on CPU. This package follows the *book-keeping* idea
(Bu et al. 2023, "Differentially private optimization on large model at small cost"; ghost
norms of Goodfellow 2015 and Li et al. 2022):

1. one forward pass records each trainable layer's input ``a`` (hooks);
2. one backward pass asks autograd only for the gradients ``g`` with respect to the layers'
   *outputs* (the parameter gradients are never formed); on models with large activations
   each layer's rule (step 3) runs from a hook as soon as its ``g`` is in, and its recorded
   tensors are dropped, so memory is freed as plain SGD's backward frees it;
3. from ``(a, g)`` each layer with a fast rule (``Linear``, ``Conv2d``, ``Embedding``,
   ``LayerNorm``, ``GroupNorm``: :mod:`.rules`) yields every example's squared gradient
   norm, without the per-example gradient where the layer's structure allows it; every other
   parameter gets its per-example gradients from ``torch.func`` (``functional_call`` +
   ``vmap`` + ``grad`` on one example at a time: :mod:`.fallback`);
4. the clipping factors ``c_i = min(1, C / (||g_i|| + 1e-6))`` (:mod:`.clipping`) weight a
   second, cheap contraction per layer (``(c * g)^T a`` for ``Linear``) that gives the
   clipped sum (:mod:`.engine`).

The result equals the clipped sum from a loop of single-example backward passes
(:mod:`.reference`) up to floating-point summation order (tested in float64 for each layer
type alone and for mixed models). Shared modules (called several times in one forward pass)
are supported: their uses are summed per example before the norm is taken.

A model that is a chain of ``Linear`` layers and elementwise activations (the MLP, logistic
regression) skips the hooks: the engine runs the chain's products itself, with the same rule,
the same backward pass and the same values (:mod:`.chain`).

Modules: clipping (lowest) <- rules, fallback, reference, chain <- engine.
"""

from collections.abc import Sequence

from fedsim.training.persample.clipping import (
    CLIP_EPSILON,
    LossFn,
    clip_factors,
    clip_rows,
    per_example_cross_entropy,
)
from fedsim.training.persample.engine import ClippedSum, PerSampleEngine, engine_for
from fedsim.training.persample.reference import naive_per_example_gradients
from fedsim.training.persample.rules import linear_sq_norms

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
