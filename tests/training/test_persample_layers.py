"""Each per-sample path on its own and mixed, against single-example backward passes (float64).

For every layer type with a fast rule (Linear, Conv2d, Embedding, LayerNorm, GroupNorm) the
model holds that layer's parameters alone, and the engine is run twice: with its fast rule and
with every parameter sent through the torch.func fallback. Mixed models add layers without a
fast rule (a custom module with its own ``nn.Parameter``, PReLU, MultiheadAttention with the
batch in its input's second dimension) and parameters used by more than one module.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from fedsim.training.persample import PerSampleEngine, clip_rows, naive_per_example_gradients
from fedsim.training.persample import convolution as conv_module
from fedsim.training.persample import engine as engine_module


@pytest.fixture(autouse=True, params=[False, True], ids=["rules_after", "rules_during"])
def _rules_during_backward(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> None:
    """Every case twice: the rules run after the backward pass (small models) and during it,
    from hooks on the layers' outputs, with only the most upstream outputs asked for."""
    monkeypatch.setattr(engine_module, "_EARLY_RULES_MIN_VALUES", 0 if request.param else 1 << 62)


@pytest.fixture(autouse=True)
def _float64() -> None:
    previous = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    yield
    torch.set_default_dtype(previous)


class MeanOver(nn.Module):
    """Mean over the given dimensions (no parameters): turns feature maps into class scores."""

    def __init__(self, *dims: int) -> None:
        super().__init__()
        self.dims = dims

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x.mean(self.dims)


class Twice(nn.Module):
    """One module called twice in a forward pass (its uses are summed per example)."""

    def __init__(self, inner: nn.Module, *mean_dims: int) -> None:
        super().__init__()
        self.inner = inner
        self.dims = mean_dims

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = torch.tanh(self.inner(torch.tanh(self.inner(x))))
        return h.mean(self.dims) if self.dims else h


def _randomise(model: nn.Module) -> nn.Module:
    """Random affine weights (a norm layer starts at weight 1, bias 0: too special a point)."""
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(torch.randn_like(p))
    return model


Case = tuple[str, Callable[[], nn.Module], Callable[[int], torch.Tensor], int]
LAYERS: list[Case] = [
    ("linear", lambda: nn.Linear(7, 4), lambda b: torch.randn(b, 7), 4),
    ("linear_nobias", lambda: nn.Linear(7, 4, bias=False), lambda b: torch.randn(b, 7), 4),
    (
        "linear_sequence",  # (B, T, d): the ghost norm over positions
        lambda: nn.Sequential(nn.Linear(6, 5), MeanOver(1)),
        lambda b: torch.randn(b, 3, 6),
        5,
    ),
    (
        "conv2d",
        lambda: nn.Sequential(nn.Conv2d(2, 3, 3, padding=1), MeanOver(2, 3)),
        lambda b: torch.randn(b, 2, 5, 5),
        3,
    ),
    (
        "conv2d_grouped_strided",
        lambda: nn.Sequential(
            nn.Conv2d(4, 6, 3, stride=2, padding=2, dilation=2, groups=2), MeanOver(2, 3)
        ),
        lambda b: torch.randn(b, 4, 7, 7),
        6,
    ),
    (
        "conv2d_one_input_channel",  # im2col and one batched product, not the grouped conv
        lambda: nn.Sequential(nn.Conv2d(1, 3, 4, stride=2, padding=1), MeanOver(2, 3)),
        lambda b: torch.randn(b, 1, 7, 7),
        3,
    ),
    (
        "conv2d_few_positions",  # 4 output positions, 8 channels: im2col into kept buffers
        lambda: nn.Sequential(nn.Conv2d(4, 8, 3, stride=2), MeanOver(2, 3)),
        lambda b: torch.randn(b, 4, 5, 5),
        8,
    ),
    (
        "conv2d_few_positions_padded",  # channels-last im2col with a zero border, dilated
        lambda: nn.Sequential(
            nn.Conv2d(3, 10, (3, 2), stride=(2, 1), padding=(1, 2), dilation=(1, 2)),
            MeanOver(2, 3),
        ),
        lambda b: torch.randn(b, 3, 3, 2),
        10,
    ),
    (
        "conv2d_few_positions_twice",  # two uses of a channels-last im2col layer
        lambda: Twice(nn.Conv2d(3, 3, 3, padding=1), 2, 3),
        lambda b: torch.randn(b, 3, 1, 2),
        3,
    ),
    (
        "conv2d_small_kernel",  # 27 weights a channel <= 2 x 16 channels, 36 positions: positions-last im2col
        lambda: nn.Sequential(nn.Conv2d(3, 16, 3, padding=1), MeanOver(2, 3)),
        lambda b: torch.randn(b, 3, 6, 6),
        16,
    ),
    (
        "conv2d_small_kernel_strided",  # the same route, strided, dilated, a padded border
        lambda: nn.Sequential(
            nn.Conv2d(2, 6, (2, 3), stride=(2, 1), padding=(1, 2), dilation=(2, 1)),
            MeanOver(2, 3),
        ),
        lambda b: torch.randn(b, 2, 7, 5),
        6,
    ),
    (
        "conv2d_small_kernel_twice",  # two uses of a positions-last im2col layer
        lambda: Twice(nn.Conv2d(3, 3, (1, 2), padding=(0, 1)), 2, 3),
        lambda b: torch.randn(b, 3, 4, 4),
        3,
    ),
    (
        "conv2d_ghost",  # one output position, 2 x 2 x 8 x 16 weights: ghost norms
        lambda: nn.Sequential(nn.Conv2d(8, 16, 2), nn.Flatten()),
        lambda b: torch.randn(b, 8, 2, 2),
        16,
    ),
    (
        "embedding",
        lambda: nn.Sequential(nn.Embedding(9, 4), MeanOver(1)),
        lambda b: torch.randint(0, 9, (b, 6)),  # repeated tokens: the [idx_t = idx_s] terms
        4,
    ),
    (
        "embedding_padding",
        lambda: nn.Sequential(nn.Embedding(9, 4, padding_idx=0), MeanOver(1)),
        lambda b: torch.randint(0, 3, (b, 6)),
        4,
    ),
    (
        "conv2d_twice",
        lambda: Twice(nn.Conv2d(3, 3, 3, padding=1), 2, 3),
        lambda b: torch.randn(b, 3, 4, 4),
        3,
    ),
    ("layernorm", lambda: _randomise(nn.LayerNorm(6)), lambda b: torch.randn(b, 6), 6),
    (
        "layernorm_2d_shape",
        lambda: nn.Sequential(_randomise(nn.LayerNorm((3, 4))), MeanOver(1)),
        lambda b: torch.randn(b, 3, 4),
        4,
    ),
    (
        "groupnorm",
        lambda: nn.Sequential(_randomise(nn.GroupNorm(2, 4)), MeanOver(2, 3)),
        lambda b: torch.randn(b, 4, 3, 3),
        4,
    ),
    (
        "groupnorm_offset",  # mean far from 0: the saved statistics' formula still exact
        lambda: nn.Sequential(_randomise(nn.GroupNorm(2, 4)), MeanOver(2, 3)),
        lambda b: 30.0 + 0.5 * torch.randn(b, 4, 3, 3),
        4,
    ),
    (
        "groupnorm_one_group_features",  # what fix_batchnorm makes of BatchNorm1d on (N, C)
        lambda: _randomise(nn.GroupNorm(1, 6)),
        lambda b: torch.randn(b, 6),
        6,
    ),
    (
        "groupnorm_one_group_sequence",  # ... and of BatchNorm1d on (N, C, L)
        lambda: nn.Sequential(_randomise(nn.GroupNorm(1, 4)), MeanOver(2)),
        lambda b: torch.randn(b, 4, 5),
        4,
    ),
    ("layernorm_twice", lambda: Twice(_randomise(nn.LayerNorm(5))), lambda b: torch.randn(b, 5), 5),
    (
        "groupnorm_twice",
        lambda: Twice(_randomise(nn.GroupNorm(2, 4)), 2),
        lambda b: torch.randn(b, 4, 3),
        4,
    ),
]


class Scale(nn.Module):
    """A custom layer with its own parameter (no fast rule)."""

    def __init__(self, width: int) -> None:
        super().__init__()
        self.gain = nn.Parameter(torch.randn(width))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * self.gain + torch.sin(x)


class Mixed(nn.Module):
    """Fast layers around three without a fast rule: Scale, PReLU, MultiheadAttention whose
    input is (T, B, E) (batch_first=False)."""

    def __init__(self) -> None:
        super().__init__()
        self.embedding = nn.Embedding(12, 8)
        self.norm = nn.LayerNorm(8)
        self.scale = Scale(8)
        self.attention = nn.MultiheadAttention(8, 2)
        self.prelu = nn.PReLU(8)
        self.conv = nn.Conv2d(1, 2, 3, padding=1)
        self.group = nn.GroupNorm(1, 2)
        self.head = nn.Linear(8 + 2, 5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.scale(self.norm(self.embedding(x)))  # (B, T, 8)
        seq = h.transpose(0, 1)  # (T, B, 8)
        attended, _ = self.attention(seq, seq, seq, need_weights=False)
        h = self.prelu(attended.transpose(0, 1).mean(1))  # (B, 8)
        picture = self.group(self.conv(h.unsqueeze(1).unsqueeze(-1).expand(-1, 1, 8, 4)))
        return self.head(torch.cat([h, picture.mean((2, 3))], 1))


class TiedByModule(nn.Module):
    """The output layer's weight is the embedding's (registered in two modules)."""

    def __init__(self) -> None:
        super().__init__()
        self.embedding = nn.Embedding(10, 6)
        self.hidden = nn.Linear(6, 6)
        self.out = nn.Linear(6, 10)
        self.out.weight = self.embedding.weight

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.out(torch.tanh(self.hidden(self.embedding(x).mean(1))))


class TiedByFunction(nn.Module):
    """The embedding's weight is also read outside its forward (F.linear in the parent)."""

    def __init__(self) -> None:
        super().__init__()
        self.embedding = nn.Embedding(10, 6)
        self.hidden = nn.Linear(6, 6)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.linear(torch.tanh(self.hidden(self.embedding(x).mean(1))), self.embedding.weight)


def _tokens(b: int) -> torch.Tensor:
    return torch.randint(0, 10, (b, 5))


MIXED: list[tuple[str, Callable[[], nn.Module], Callable[[int], torch.Tensor], int, set[str]]] = [
    (
        "mixed",
        Mixed,
        lambda b: torch.randint(0, 12, (b, 4)),
        5,
        {"scale.gain", "prelu.weight", "attention.in_proj_weight", "attention.in_proj_bias",
         "attention.out_proj.weight", "attention.out_proj.bias"},
    ),
    ("tied_by_module", TiedByModule, _tokens, 10, {"embedding.weight", "out.bias"}),
    ("tied_by_function", TiedByFunction, _tokens, 10, {"embedding.weight"}),
]


def _assert_matches_reference(engine: PerSampleEngine, x: torch.Tensor, y: torch.Tensor) -> None:
    reference = naive_per_example_gradients(engine.model, x, y)
    clip = float(reference.norm(dim=1).median())  # clips about half of them
    result = engine.clipped_sum(x, y, clip, scale=0.5)
    torch.testing.assert_close(result.norms, reference.norm(dim=1), rtol=1e-10, atol=1e-12)
    torch.testing.assert_close(
        result.flat_sum, 0.5 * clip_rows(reference, clip).sum(0), rtol=1e-10, atol=1e-12
    )


@pytest.mark.parametrize(("name", "make", "draw", "classes"), LAYERS, ids=[c[0] for c in LAYERS])
@pytest.mark.parametrize("fast", [True, False], ids=["fast", "fallback"])
def test_each_layer_alone_equals_single_example_backward_passes(
    name: str,
    make: Callable[[], nn.Module],
    draw: Callable[[int], torch.Tensor],
    classes: int,
    fast: bool,
) -> None:
    torch.manual_seed(11)
    model = make()
    engine = PerSampleEngine(model, fast_paths=fast)
    names = [n for n, _ in model.named_parameters()]
    assert engine.fallback_parameters == ([] if fast else names)  # the path under test
    x, y = draw(7), torch.randint(0, classes, (7,))
    _assert_matches_reference(engine, x, y)
    assert engine.fallback_parameters == ([] if fast else names)  # and still after a batch


@pytest.mark.parametrize(
    ("name", "make", "draw", "classes", "fallback"), MIXED, ids=[c[0] for c in MIXED]
)
def test_mixed_models_route_each_parameter_and_equal_the_reference(
    name: str,
    make: Callable[[], nn.Module],
    draw: Callable[[int], torch.Tensor],
    classes: int,
    fallback: set[str],
) -> None:
    torch.manual_seed(12)
    model = make()
    engine = PerSampleEngine(model)
    x, y = draw(6), torch.randint(0, classes, (6,))
    for _ in range(2):  # the first batch runs the checks (and may reroute), the second not
        _assert_matches_reference(engine, x, y)
        assert set(engine.fallback_parameters) == fallback
    if name == "mixed":  # the fast layers kept their rules
        fast = {layer.kind for layer in engine._layers}
        assert fast == {"linear", "conv2d", "embedding", "norm"}


def test_fallback_alone_gives_the_loss_sum_and_respects_frozen_parameters() -> None:
    torch.manual_seed(13)
    model = Mixed()
    model.norm.weight.requires_grad_(False)
    x, y = torch.randint(0, 12, (5,)).reshape(5, 1).repeat(1, 4), torch.randint(0, 5, (5,))
    engine = PerSampleEngine(model, fast_paths=False)
    assert "norm.weight" not in engine.fallback_parameters
    result = engine.clipped_sum(x, y, 1.0)
    with torch.no_grad():
        expected = F.cross_entropy(model(x), y, reduction="sum")
    assert result.loss_sum == pytest.approx(float(expected), rel=1e-12)
    _assert_matches_reference(engine, x, y)
    offset = 0
    for n, p in model.named_parameters():
        if n == "norm.weight":
            assert not result.flat_sum[offset : offset + p.numel()].any()
        offset += p.numel()


class DataDependent(nn.Module):
    """Python control flow on a tensor's value: torch.func cannot vmap it."""

    def __init__(self) -> None:
        super().__init__()
        self.gain = nn.Parameter(torch.ones(3))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * self.gain if float(x.sum()) > 0 else -x * self.gain


def test_a_layer_the_fallback_cannot_run_fails_with_a_model_error_naming_it() -> None:
    from fedsim.errors import ModelError

    engine = PerSampleEngine(nn.Sequential(nn.Linear(3, 3), DataDependent()))
    assert engine.fallback_parameters == ["1.gain"]
    with pytest.raises(ModelError, match="per-example gradients of 1.gain .* torch.func"):
        # Positive inputs: every sub-batch takes the same branch, so the forward probe passes.
        engine.clipped_sum(torch.rand(4, 3), torch.randint(0, 3, (4,)), 1.0)


def test_kept_buffers_serve_batches_of_every_size() -> None:
    """The rules' buffers kept between batches (:func:`~fedsim.training.persample.rules.scratch`)
    give the reference's result for a batch larger, smaller or as large as the ones before
    (Poisson batches vary), and never grow past the largest."""
    torch.manual_seed(5)
    model = nn.Sequential(
        nn.Conv2d(1, 4, 3, stride=2), nn.Tanh(), nn.Conv2d(4, 12, 2), nn.Flatten(), nn.Linear(108, 3)
    )
    engine = PerSampleEngine(model)
    for batch in (5, 2, 7, 7, 3):
        _assert_matches_reference(engine, torch.randn(batch, 1, 9, 9), torch.randint(0, 3, (batch,)))
    kept = [t for layer in engine._layers for t in layer.workspace.values()]
    assert kept and all(t.shape[0] == 7 for t in kept)


@pytest.mark.parametrize("name", ["conv2d_small_kernel", "conv2d_small_kernel_strided",
                                  "conv2d_small_kernel_twice"])
def test_small_kernels_take_the_positions_last_route(
    name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The cases above named for it run through positions-last im2col (not the grouped
    convolution), every use of the layer; the reference check there is of this route."""
    calls: list[tuple[int, ...]] = []
    original = conv_module._patches_positions_last

    def counted(module: nn.Conv2d, x: torch.Tensor,
                store: dict[str, torch.Tensor] | None = None) -> torch.Tensor:
        out = original(module, x, store)
        calls.append(tuple(out.shape))
        return out

    monkeypatch.setattr(conv_module, "_patches_positions_last", counted)
    _, make, draw, classes = next(case for case in LAYERS if case[0] == name)
    torch.manual_seed(13)
    engine = PerSampleEngine(make())
    x, y = draw(5), torch.randint(0, classes, (5,))
    _assert_matches_reference(engine, x, y)
    uses = 2 if name.endswith("twice") else 1
    assert len(calls) >= uses and len(calls) % uses == 0  # the first batch's checks run it too
    assert all(shape[0] == 5 for shape in calls)


# (name, conv, input side, chunk budget in values, the kept buffers' shapes it must leave)
CHUNKED = [
    ("positions_last", lambda: nn.Conv2d(3, 16, 3, padding=1), 6,
     3 * 27 * 36,  # 27 weights a channel <= 32: positions-last; 3 examples of patches
     {"patches_t": (3, 27, 36), "per_example_t": (7, 27, 16)}),
    ("grouped", lambda: nn.Conv2d(3, 4, 3, padding=1), 7,  # 49 positions > 4 channels
     3 * (3 * 7 * 7 + 4 * 7 * 7 + 4 * 27),  # 3 examples' inputs, gradients, weight gradients
     {"grouped": (7, 4 * 27)}),
]


@pytest.mark.parametrize(("name", "make", "side", "budget", "kept"), CHUNKED,
                         ids=[c[0] for c in CHUNKED])
def test_chunked_routes_equal_the_reference(
    name: str, make: Callable[[], nn.Conv2d], side: int, budget: int,
    kept: dict[str, tuple[int, ...]], monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A route that works a few examples at a time (the last chunk shorter) gives
    single-example passes' result for every batch size, and its kept buffers hold one chunk
    (the per-example rows: the largest batch)."""
    monkeypatch.setattr(conv_module, "_CHUNK_VALUES", budget)
    torch.manual_seed(7)
    conv = make()
    engine = PerSampleEngine(nn.Sequential(conv, nn.Tanh(), MeanOver(2, 3)))
    for batch in (5, 2, 7, 3):
        x = torch.randn(batch, 3, side, side)
        _assert_matches_reference(engine, x, torch.randint(0, conv.out_channels, (batch,)))
    workspace = engine._layers[0].workspace
    assert {key: tuple(workspace[key].shape) for key in kept} == kept


def test_group_norm_rule_reads_the_forward_statistics_and_agrees_with_recomputing() -> None:
    """The GroupNorm rule's two ways (the forward's saved mean and 1/std; ``x_hat`` formed
    again) give the same per-example gradients, in float32 too with a mean far from 0."""
    from fedsim.training.persample import rules
    from fedsim.training.persample.base import Layer, Use

    torch.manual_seed(3)
    for dtype, offset, rtol in ((torch.float64, 0.0, 1e-12), (torch.float32, 20.0, 2e-4)):
        module = _randomise(nn.GroupNorm(4, 8)).to(dtype)
        x = offset + torch.randn(5, 8, 6, 6, dtype=dtype)
        output = module(x)
        stats = rules.group_norm_statistics(module, output)
        assert stats is not None  # read from the autograd node, before any backward
        mean, rstd = stats
        grouped = x.reshape(5, 4, -1)
        torch.testing.assert_close(mean, grouped.mean(-1))
        torch.testing.assert_close(rstd, (grouped.var(-1, unbiased=False) + module.eps).rsqrt())
        g = torch.randn_like(output)
        layer = Layer(module, list(module.parameters()), "norm")
        layer.uses = [Use((x,), output, g, stats)]
        with_stats = rules._norm_affine_rule(layer)
        layer.uses = [Use((x,), output, g, None)]
        recomputed = rules._norm_affine_rule(layer)
        torch.testing.assert_close(with_stats[0], recomputed[0], rtol=rtol, atol=0.0)
        outs = [[torch.zeros_like(p) for p in module.parameters()] for _ in range(2)]
        c = torch.rand(5, dtype=dtype)
        with_stats[1](c, outs[0])
        recomputed[1](c, outs[1])
        for a, b in zip(*outs, strict=True):
            torch.testing.assert_close(a, b, rtol=rtol, atol=rtol * float(b.abs().max()))
    # Not a GroupNorm node (no grad, another module): no statistics, the rule recomputes.
    with torch.no_grad():
        assert rules.group_norm_statistics(module, module(x)) is None
    assert rules.group_norm_statistics(nn.LayerNorm(6), nn.LayerNorm(6)(torch.randn(2, 6))) is None
