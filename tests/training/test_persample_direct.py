"""The compiled per-example convolution kernel (fedsim.training.persample.direct): its values
against an independent definition, against single-example backward passes through the engine,
its independence from the thread count, its shape checks, and the torch routes it falls back to.
"""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from fedsim.training import native
from fedsim.training.persample import (
    PerSampleEngine,
    clip_rows,
    direct,
    naive_per_example_gradients,
)
from fedsim.training.persample import convolution as conv_module

needs_kernel = pytest.mark.skipif(
    not direct.direct_kernel_available(), reason="no C compiler, or no AVX2 + FMA, here"
)


def _independent(x: torch.Tensor, g: torch.Tensor, conv: nn.Conv2d) -> torch.Tensor:
    """Per-example weight gradients by autograd, one example at a time (float64), as the
    weight's (B, C_out, C_in, kh, kw)."""
    rows = []
    for xb, gb in zip(x.double(), g.double(), strict=True):
        weight = conv.weight.detach().double().requires_grad_(True)
        out = F.conv2d(xb[None], weight, None, conv.stride, conv.padding, conv.dilation)
        (grad,) = torch.autograd.grad(out, weight, gb[None])
        rows.append(grad)
    return torch.stack(rows)


# (C_in, side, C_out, kernel, stride, padding, dilation): the two CNNs' layers, and shapes
# that take every tile (4, 2, 1 blocks of 8 channels, or of 16 where the CPU has AVX-512, then
# a last block of 8) with short last tiles.
CASES = [
    (1, 28, 16, (8, 8), (2, 2), (3, 3), (1, 1)),  # DP MNIST CNN conv 1
    (16, 13, 32, (4, 4), (2, 2), (0, 0), (1, 1)),  # DP MNIST CNN conv 2
    (3, 12, 16, (3, 3), (1, 1), (1, 1), (1, 1)),  # GroupNorm CNN conv 1's shape, smaller image
    (5, 9, 56, (2, 3), (1, 2), (2, 0), (2, 1)),  # 7 blocks: 4 + 2 + 1; 30 weights a channel
    (2, 7, 8, (7, 1), (3, 1), (3, 0), (1, 1)),  # one block; a kernel taller than it is wide
    (4, 6, 24, (1, 1), (1, 1), (0, 0), (1, 1)),  # 1 x 1
    (3, 8, 80, (3, 3), (1, 1), (1, 1), (1, 1)),  # 10 blocks of 8, 5 of 16: 4 + 1
    (7, 10, 72, (5, 5), (1, 1), (2, 2), (1, 1)),  # 4 blocks of 16 and one of 8; 175 weights
]


@needs_kernel
@pytest.mark.parametrize("case", CASES, ids=[f"case{i}" for i in range(len(CASES))])
@pytest.mark.parametrize("batch", [1, 5])
def test_the_kernel_equals_single_example_weight_gradients(
    case: tuple[int, int, int, tuple[int, int], tuple[int, int], tuple[int, int], tuple[int, int]],
    batch: int,
) -> None:
    c_in, side, c_out, kernel, stride, padding, dilation = case
    torch.manual_seed(3)
    conv = nn.Conv2d(c_in, c_out, kernel, stride=stride, padding=padding, dilation=dilation)
    x = torch.randn(batch, c_in, side, side + 1)
    with torch.no_grad():
        g = torch.randn_like(conv(x))
    padded = F.pad(x, (padding[1], padding[1], padding[0], padding[0])).contiguous()
    out = torch.full((batch, conv.weight.numel()), float("nan"))  # every value is written
    direct.direct_weight_per_example(padded, g, out, kernel, stride, dilation)
    got = out.double().reshape(batch, c_in, *kernel, c_out).movedim(-1, 1)
    torch.testing.assert_close(got, _independent(x, g, conv), rtol=1e-4, atol=1e-4)


@needs_kernel
def test_the_values_do_not_depend_on_the_thread_count() -> None:
    torch.manual_seed(4)
    padded, g = torch.randn(9, 3, 14, 14), torch.randn(9, 16, 6, 6)
    results = []
    previous = torch.get_num_threads()
    try:
        for threads in (1, 2, 3):
            torch.set_num_threads(threads)
            out = torch.empty(9, 3 * 9 * 16)
            direct.direct_weight_per_example(padded, g, out, (3, 3), (2, 2), (1, 1))
            results.append(out)
    finally:
        torch.set_num_threads(previous)
    assert all(torch.equal(results[0], other) for other in results[1:])


@needs_kernel
def test_inconsistent_shapes_are_refused_before_the_kernel_reads() -> None:
    padded, g, out = torch.zeros(2, 3, 10, 10), torch.zeros(2, 8, 4, 4), torch.zeros(2, 3 * 9 * 8)
    direct.direct_weight_per_example(padded, g, out, (3, 3), (2, 2), (1, 1))  # consistent
    bad = [
        (padded, torch.zeros(2, 8, 5, 4), out, (3, 3), (2, 2), (1, 1)),  # output too tall
        (padded, torch.zeros(3, 8, 4, 4), out, (3, 3), (2, 2), (1, 1)),  # batch differs
        (padded, torch.zeros(2, 12, 4, 4), torch.zeros(2, 3 * 9 * 12), (3, 3), (2, 2), (1, 1)),
        (padded, g, torch.zeros(2, 3 * 9 * 8 - 1), (3, 3), (2, 2), (1, 1)),  # rows too short
        (padded, g, out, (3, 3), (2, 2), (4, 1)),  # dilation reaches past the input
        (padded, g, out, (3, 3), (0, 2), (1, 1)),
        (padded.double(), g, out, (3, 3), (2, 2), (1, 1)),
        (padded.transpose(2, 3), g, out, (3, 3), (2, 2), (1, 1)),  # not contiguous
        # Not pairs of ints: a third value would shift the C function's later arguments (it
        # crashed the process before the check).
        (padded, g, out, (3, 3, 10**6), (2, 2), (1, 1)),
        (padded, g, out, (3,), (2, 2), (1, 1)),
        (padded, g, out, (3, 3), (2.0, 2), (1, 1)),
        (padded, g, out, (3, 3), (2, 2), (True, 1)),
    ]
    for args in bad:
        with pytest.raises(ValueError):
            direct.direct_weight_per_example(*args)


def _dp_mnist_like() -> nn.Module:
    return nn.Sequential(
        nn.Conv2d(1, 16, 8, stride=2, padding=3), nn.Tanh(), nn.MaxPool2d(2, 1),
        nn.Conv2d(16, 32, 4, stride=2), nn.Tanh(), nn.Flatten(), nn.Linear(32 * 5 * 5, 10),
    )


@needs_kernel
def test_the_engine_takes_the_kernel_and_equals_single_example_passes(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """float32 (the kernel's dtype): the DP MNIST CNN's convolutions through the engine, every
    convolution by the kernel, against single-example backward passes in float64."""
    calls: list[tuple[int, ...]] = []
    original = conv_module.direct_weight_per_example

    def counted(padded: torch.Tensor, *args: object) -> None:
        calls.append(tuple(padded.shape))
        original(padded, *args)  # type: ignore[arg-type]

    monkeypatch.setattr(conv_module, "direct_weight_per_example", counted)
    torch.manual_seed(8)
    model = _dp_mnist_like()
    engine = PerSampleEngine(model)
    for batch in (6, 3):
        x, y = torch.randn(batch, 1, 28, 28), torch.randint(0, 10, (batch,))
        result = engine.clipped_sum(x, y, 0.5)
        reference = naive_per_example_gradients(copy.deepcopy(model).double(), x.double(), y)
        torch.testing.assert_close(result.flat_sum.double(), clip_rows(reference, 0.5).sum(0),
                                   rtol=2e-4, atol=2e-5)
    assert {shape[1] for shape in calls} == {1, 16}  # both convolutions


class _SharedConv(nn.Module):
    """One convolution called twice in a forward pass (its uses summed per example)."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(8, 8, 3, padding=1)
        self.head = nn.Linear(8, 5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = torch.tanh(self.conv(torch.tanh(self.conv(x))))
        return self.head(h.mean((2, 3)))


@needs_kernel
@pytest.mark.parametrize("layout", ["shared", "channels_last", "view"])
def test_the_kernel_through_the_engine_on_awkward_inputs(layout: str) -> None:
    """A convolution used twice, channels-last inputs and inputs that are offset views, over
    batches of changing sizes through one engine (kept buffers reused), against
    single-example passes in float64."""
    torch.manual_seed(10)
    model = _SharedConv() if layout == "shared" else nn.Sequential(
        nn.Conv2d(8, 16, 3, stride=2, padding=1), nn.Tanh(), nn.Flatten(), nn.Linear(16 * 16, 5))
    engine = PerSampleEngine(model)
    for batch in (5, 9, 2, 9):
        x = torch.randn(batch + 1, 8, 7, 7)[1:] if layout == "view" else torch.randn(batch, 8, 7, 7)
        if layout == "channels_last":
            x = x.contiguous(memory_format=torch.channels_last)
        y = torch.randint(0, 5, (batch,))
        result = engine.clipped_sum(x, y, 0.7)
        reference = naive_per_example_gradients(copy.deepcopy(model).double(), x.double(), y)
        torch.testing.assert_close(result.flat_sum.double(), clip_rows(reference, 0.7).sum(0),
                                   rtol=2e-4, atol=2e-5)


@needs_kernel
def test_without_the_kernel_the_torch_routes_give_the_same_sums(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    torch.manual_seed(9)
    model = _dp_mnist_like()
    x, y = torch.randn(5, 1, 28, 28), torch.randint(0, 10, (5,))
    with_kernel = PerSampleEngine(model).clipped_sum(x, y, 1.0).flat_sum
    monkeypatch.setattr(direct, "_native", lambda: None)
    assert not direct.direct_applies(x, x, 1, 16)
    without = PerSampleEngine(model).clipped_sum(x, y, 1.0).flat_sum
    torch.testing.assert_close(with_kernel, without, rtol=1e-4, atol=1e-5)


def test_the_kernel_is_used_only_where_it_applies(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(direct, "_native", lambda: object())
    x = torch.zeros(2, 3, 5, 5)
    assert direct.direct_applies(x, x, 1, 16)
    assert not direct.direct_applies(x, x, 2, 16)  # grouped convolution
    assert not direct.direct_applies(x, x, 1, 12)  # not a multiple of 8 channels
    assert not direct.direct_applies(x.double(), x.double(), 1, 16)


@needs_kernel
def test_opting_out_or_a_failing_build_leaves_the_torch_routes(
    monkeypatch: pytest.MonkeyPatch, tmp_path: object,
) -> None:
    monkeypatch.setenv("FEDSIM_PURE_TORCH_CONV", "1")
    assert direct._load() is None
    monkeypatch.delenv("FEDSIM_PURE_TORCH_CONV")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))  # no cached build to find
    monkeypatch.setenv("CC", "false")  # exists and always fails
    assert direct._load() is None


def test_only_an_opt_out_value_skips_the_build(monkeypatch: pytest.MonkeyPatch) -> None:
    """``FEDSIM_PURE_TORCH_CONV=0`` (or false, no, off, empty) does not opt out: the build is
    tried; any other value skips it."""
    tried: list[str] = []

    def refuse(compiler: str, source: object, target: object, *recipes: object) -> None:
        tried.append(compiler)
        raise RuntimeError("no build in this test")

    monkeypatch.setattr(native, "_compile", refuse)
    monkeypatch.setattr(native.shutil, "which", lambda name: "cc")  # a compiler or not
    monkeypatch.setattr(native.Path, "is_file", lambda self: False)
    for value, skipped in (("1", True), ("yes", True), ("0", False), ("false", False),
                           ("Off", False), ("", False)):
        tried.clear()
        monkeypatch.setenv("FEDSIM_PURE_TORCH_CONV", value)
        assert direct._load() is None
        assert bool(tried) is not skipped, value


@needs_kernel
def test_a_kernel_that_disagrees_with_its_definition_is_not_used(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(direct, "reference_weight_per_example",
                        lambda *args: torch.zeros(3, 14, 120, dtype=torch.float64))
    assert direct._load() is None
