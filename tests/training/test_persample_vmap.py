"""The DP-SGD step in float32 against an independent ``torch.func`` computation.

For the three benchmark models (``benchmarks/dp_step.py``: the DP MNIST CNN, the MLP 784-256-10,
the GroupNorm CNN of ``scenarios/cifar10-groupnorm.yaml``) and a model with every other layer
kind that has a fast rule (channels-last im2col with a zero border, grouped and ghost-norm
convolutions, Embedding, LayerNorm, a Linear without bias), the per-example gradients are
computed here with ``vmap(grad(...))`` over the examples, clipped with the clipping rule
written out, summed, and the released noisy gradient rebuilt from the same noise key. The
engine must give the same norms and the same release to float32 tolerance, with its rules
run after the backward pass and during it (``_EARLY_RULES_MIN_VALUES``).
"""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.func import functional_call, grad, vmap

from fedsim.training.dpsgd import noise_std, noisy_gradient
from fedsim.training.gaussian import NoiseKey, gaussian_noise
from fedsim.training.models import build_model
from fedsim.training.persample import PerSampleEngine
from fedsim.training.persample import engine as engine_module


class EveryKind(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embedding = nn.Embedding(12, 6, padding_idx=0)
        self.layer_norm = nn.LayerNorm(6)
        self.lift = nn.Linear(6, 2 * 4 * 4, bias=False)
        self.padded = nn.Conv2d(2, 8, 3, stride=2, padding=1)  # 4 positions: im2col
        self.grouped = nn.Conv2d(8, 8, 3, padding=1, groups=2)  # grouped convolution
        self.group_norm = nn.GroupNorm(2, 8)
        self.ghost = nn.Conv2d(8, 16, 2)  # one position: ghost norm
        self.head = nn.Linear(16, 5)
        with torch.no_grad():  # affine weights away from their special starting point
            for norm in (self.layer_norm, self.group_norm):
                norm.weight.normal_()
                norm.bias.normal_()

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        h = torch.tanh(self.layer_norm(self.embedding(tokens).mean(1)))
        h = self.lift(h).view(-1, 2, 4, 4)
        h = torch.tanh(self.group_norm(self.grouped(torch.tanh(self.padded(h)))))
        return self.head(self.ghost(h).flatten(1))


def _groupnorm_cnn() -> nn.Module:
    return build_model("groupnorm_cnn", width=16, groups=4)


MODELS: list[tuple[str, Callable[[], nn.Module], Callable[[int], torch.Tensor], int]] = [
    ("dp_mnist_cnn", lambda: build_model("dp_mnist_cnn"), lambda b: torch.rand(b, 1, 28, 28), 10),
    ("mlp", lambda: build_model("mlp", hidden=(256,)), lambda b: torch.rand(b, 1, 28, 28), 10),
    ("groupnorm_cnn", _groupnorm_cnn, lambda b: torch.rand(b, 3, 32, 32), 10),
    ("every_kind", EveryKind, lambda b: torch.randint(0, 12, (b, 5)), 5),
]


def _per_example_gradients(model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """(B, P) per-example gradients, in ``model.parameters()`` order, by vmap(grad)."""
    params = {n: p.detach() for n, p in model.named_parameters()}

    def loss(p: dict[str, torch.Tensor], xi: torch.Tensor, yi: torch.Tensor) -> torch.Tensor:
        return F.cross_entropy(functional_call(model, p, (xi.unsqueeze(0),)), yi.unsqueeze(0))

    grads = vmap(grad(loss), in_dims=(None, 0, 0))(params, x, y)
    return torch.cat([grads[n].reshape(x.shape[0], -1) for n in params], 1)


@pytest.mark.parametrize("early", [False, True], ids=["rules_after", "rules_during"])
@pytest.mark.parametrize(("name", "make", "draw", "classes"), MODELS, ids=[m[0] for m in MODELS])
def test_norms_and_noisy_clipped_sum_equal_vmap_grad(
    name: str,
    make: Callable[[], nn.Module],
    draw: Callable[[int], torch.Tensor],
    classes: int,
    early: bool,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(engine_module, "_EARLY_RULES_MIN_VALUES", 0 if early else 1 << 62)
    torch.manual_seed(3)
    model = make()
    batch, m, sigma = 12, 12.0, 0.7
    x, y = draw(batch), torch.randint(0, classes, (batch,))
    rows = _per_example_gradients(model, x, y)
    norms = rows.norm(dim=1)
    ordered = norms.sort().values  # half the examples clipped, no norm near the threshold
    clip = float(ordered[batch // 2 - 1] + ordered[batch // 2]) / 2
    factors = torch.clamp(clip / (norms + 1e-6), max=1.0)
    clipped_sum = (rows * factors[:, None]).sum(0)

    engine = PerSampleEngine(model)
    assert engine.fallback_parameters == []  # every parameter on a fast rule
    generator = torch.Generator().manual_seed(9)
    key_source = torch.Generator().manual_seed(9)
    for _ in range(2):  # the first batch runs the checks, the second the plain path
        key = NoiseKey.draw(key_source)
        noise = gaussian_noise(
            engine.num_params, noise_std("poisson", clip, sigma, m), key, rows
        )
        release = noisy_gradient(
            engine, x, y, torch.arange(batch), sampling="poisson", clip=clip,
            noise_multiplier=sigma, expected_batch_size=m, generator=generator,
        )
        part = engine.clipped_sum(x, y, clip)
        torch.testing.assert_close(part.norms, norms, rtol=1e-4, atol=1e-6)
        scale = float(clipped_sum.abs().max())
        torch.testing.assert_close(part.flat_sum, clipped_sum, rtol=1e-4, atol=1e-5 * scale)
        torch.testing.assert_close(
            release.gradient, noise + clipped_sum / m, rtol=1e-4, atol=1e-5 * scale / m
        )
        assert release.within_clip == int((norms <= clip).sum())


class _Recurrent(nn.Module):
    """A GRU or RNN then a Linear head; ``own_state``: the initial hidden state made from the
    input (the hint of the fallback's error), else the one the layer makes itself."""

    def __init__(self, kind: type[nn.RNN] | type[nn.GRU], own_state: bool) -> None:
        super().__init__()
        self.recurrent = kind(4, 8, batch_first=True)
        self.head = nn.Linear(8, 3)
        self.own_state = own_state

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        state = x.new_zeros(1, x.shape[0], 8) if self.own_state else None
        return self.head(self.recurrent(x, state)[0][:, -1])


@pytest.mark.parametrize("kind", [nn.RNN, nn.GRU])
def test_a_recurrent_layer_gets_the_fallback_with_a_state_from_its_input(
        kind: type[nn.RNN] | type[nn.GRU]) -> None:
    """torch.func cannot batch the initial state nn.RNN and nn.GRU make themselves (a
    stranger's GRU failed with a broadcast error and no way out): the error says to pass one
    made from the input, and with it the per-example gradients are each example's own (a loop
    of single-example backward passes)."""
    from fedsim.errors import ModelError
    from fedsim.training.persample.clipping import per_example_cross_entropy
    from fedsim.training.persample.fallback import per_example_gradients

    torch.manual_seed(0)
    x, y = torch.randn(5, 3, 4), torch.randint(0, 3, (5,))
    names = [n for n, _ in _Recurrent(kind, True).named_parameters()]
    with pytest.raises(ModelError, match=rf"{kind.__name__} cannot be run one example at a "
                                         r"time .* pass one made from the input"):
        per_example_gradients(_Recurrent(kind, False), names, x, y, per_example_cross_entropy)
    model = _Recurrent(kind, True)
    grads, _ = per_example_gradients(model, names, x, y, per_example_cross_entropy)
    for i in range(5):
        model.zero_grad()
        per_example_cross_entropy(model(x[i:i + 1]), y[i:i + 1]).sum().backward()
        for name, got in zip(names, grads, strict=True):
            want = dict(model.named_parameters())[name].grad
            assert want is not None
            torch.testing.assert_close(got[i], want, rtol=1e-5, atol=1e-6)
