"""The fast per-sample engine against a loop of single-example backward passes (float64)."""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch
from torch import nn

from fedsim.errors import ModelError
from fedsim.training.dpsgd import noisy_gradient
from fedsim.training.models import build_model
from fedsim.training.persample import (
    PerSampleEngine,
    clip_rows,
    engine_for,
    naive_per_example_gradients,
)


class SequenceModel(nn.Module):
    """Embedding (with padding), a Linear used twice, LayerNorm, and two layers only the
    generic torch.func path handles (PReLU, Conv1d)."""

    def __init__(self) -> None:
        super().__init__()
        self.embedding = nn.Embedding(20, 8, padding_idx=0)
        self.shared = nn.Linear(8, 8)
        self.norm = nn.LayerNorm(8)
        self.prelu = nn.PReLU()
        self.conv = nn.Conv1d(8, 4, 3)
        self.head = nn.Linear(4, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.shared(torch.tanh(self.shared(self.embedding(x))))
        h = self.prelu(self.norm(h))
        return self.head(self.conv(h.transpose(1, 2)).mean(-1))


class NarrowSequence(nn.Module):
    """Linear on long sequences where per-example gradients beat ghost norms; grouped,
    dilated, strided conv; a frozen layer; an in-place activation."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(4, 6, 3, stride=2, padding=1, dilation=2, groups=2)
        self.frozen = nn.Linear(6, 6)
        self.frozen.weight.requires_grad_(False)
        self.relu = nn.ReLU(inplace=True)
        self.tiny = nn.Linear(6, 2)
        self.head = nn.Linear(2, 5, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.conv(x).flatten(2).transpose(1, 2)  # (B, positions, 6)
        h = self.relu(self.frozen(h))
        return self.head(self.tiny(h).mean(1))


def _cases() -> list[tuple[str, Callable[[], nn.Module], Callable[[int], torch.Tensor], int]]:
    return [
        ("logreg", lambda: build_model("logreg"), lambda b: torch.randn(b, 1, 28, 28), 10),
        ("mlp", lambda: build_model("mlp", hidden=(32, 16)), lambda b: torch.randn(b, 784), 10),
        (
            "dp_mnist_cnn",
            lambda: build_model("dp_mnist_cnn"),
            lambda b: torch.randn(b, 1, 28, 28),
            10,
        ),
        (
            "groupnorm_cnn",
            lambda: build_model("groupnorm_cnn", width=8, groups=4),
            lambda b: torch.randn(b, 3, 32, 32),
            10,
        ),
        ("sequence", SequenceModel, lambda b: torch.randint(0, 20, (b, 6)), 3),
        ("narrow", NarrowSequence, lambda b: torch.randn(b, 4, 9, 9), 5),
        ("conv_ghost", _ghost_conv_model, lambda b: torch.randn(b, 8, 7, 7), 5),
    ]


def _ghost_conv_model() -> nn.Module:
    """The second conv has one output position and 144 x 32 weights: the ghost-norm path."""
    return nn.Sequential(
        nn.Conv2d(8, 16, 3, stride=2),
        nn.Tanh(),
        nn.Conv2d(16, 32, 3),
        nn.Flatten(),
        nn.Linear(32, 5),
    )


@pytest.fixture(autouse=True)
def _float64() -> None:
    previous = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    yield
    torch.set_default_dtype(previous)


@pytest.mark.parametrize(
    ("name", "make", "draw", "classes"), _cases(), ids=[c[0] for c in _cases()]
)
def test_norms_and_clipped_sum_equal_single_example_backward_passes(
    name: str, make: Callable[[], nn.Module], draw: Callable[[int], torch.Tensor], classes: int
) -> None:
    torch.manual_seed(1)
    model = make()
    x, y = draw(6), torch.randint(0, classes, (6,))
    reference = naive_per_example_gradients(model, x, y)
    clip = float(reference.norm(dim=1).median())  # clips about half of them
    result = PerSampleEngine(model).clipped_sum(x, y, clip)
    torch.testing.assert_close(result.norms, reference.norm(dim=1), rtol=1e-10, atol=1e-12)
    torch.testing.assert_close(
        result.flat_sum, clip_rows(reference, clip).sum(0), rtol=1e-10, atol=1e-12
    )


@pytest.mark.parametrize(
    ("name", "make", "draw", "classes"), _cases(), ids=[c[0] for c in _cases()]
)
def test_every_clipped_example_has_norm_at_most_c(
    name: str, make: Callable[[], nn.Module], draw: Callable[[int], torch.Tensor], classes: int
) -> None:
    torch.manual_seed(2)
    model = make()
    engine = engine_for(model)
    x, y = draw(5), torch.randint(0, classes, (5,))
    if x.is_floating_point():
        x = x * 30  # large inputs: large gradients
    for clip in (1e-3, 0.1):
        for i in range(5):
            one = engine.clipped_sum(x[i : i + 1], y[i : i + 1], clip)
            assert one.norms[0] > clip  # the bound is exercised, not vacuous
            assert float(one.flat_sum.norm()) <= clip


def test_chunked_equals_unchunked() -> None:
    torch.manual_seed(3)
    model = build_model("dp_mnist_cnn")
    x, y = torch.randn(23, 1, 28, 28), torch.randint(0, 10, (23,))
    engine = engine_for(model)
    indices = torch.arange(23)
    results = []
    for physical in (23, 5, 1):
        generator = torch.Generator().manual_seed(7)  # same noise draw in each
        results.append(
            noisy_gradient(
                engine,
                x,
                y,
                indices,
                sampling="fixed",
                clip=0.5,
                noise_multiplier=1.0,
                expected_batch_size=23,
                generator=generator,
                max_physical_batch=physical,
            )
        )
    for other in results[1:]:
        torch.testing.assert_close(other.gradient, results[0].gradient, rtol=1e-12, atol=1e-13)
        assert other.within_clip == results[0].within_clip
        assert other.loss_sum == pytest.approx(results[0].loss_sum, rel=1e-12)


def test_engine_is_shared_per_model_and_leaves_no_hooks() -> None:
    model = build_model("mlp", hidden=(8,))
    engine = engine_for(model)
    assert engine_for(model) is engine
    engine.clipped_sum(torch.randn(4, 784), torch.randint(0, 10, (4,)), 1.0)
    assert all(not m._forward_hooks for m in model.modules())


def test_unsupported_models_fail_with_model_errors() -> None:
    with pytest.raises(ModelError, match="BatchNorm"):
        PerSampleEngine(nn.Sequential(nn.Linear(3, 3), nn.BatchNorm1d(3)))
    shared = nn.Linear(3, 3)
    twin = nn.Linear(3, 3)
    twin.weight = shared.weight  # supported: both modules go through the torch.func fallback
    assert PerSampleEngine(nn.Sequential(shared, twin)).fallback_parameters == [
        "0.weight", "0.bias", "1.bias"
    ]
    with pytest.raises(ModelError, match="scale_grad_by_freq"):
        PerSampleEngine(nn.Embedding(5, 2, scale_grad_by_freq=True))
    frozen = nn.Linear(3, 3).requires_grad_(False)
    with pytest.raises(ModelError, match="no trainable parameters"):
        PerSampleEngine(frozen)


@pytest.mark.parametrize("name", ["mlp", "dp_mnist_cnn"])
def test_per_example_local_updates_equal_separate_sgd_runs(name: str) -> None:
    """Paper 000's a_h from several SGD steps on example h alone, each from the same w."""
    torch.manual_seed(4)
    model = build_model(name, hidden=(8,)) if name == "mlp" else build_model(name)
    x, y = torch.randn(4, 1, 28, 28), torch.randint(0, 10, (4,))
    start = torch.nn.utils.parameters_to_vector(model.parameters()).detach()
    rows = []
    for i in range(4):
        copy = build_model(name, hidden=(8,)) if name == "mlp" else build_model(name)
        torch.nn.utils.vector_to_parameters(start.clone(), copy.parameters())  # no aliasing
        optimizer = torch.optim.SGD(copy.parameters(), lr=0.3)
        for _ in range(3):
            optimizer.zero_grad()
            nn.functional.cross_entropy(copy(x[i : i + 1]), y[i : i + 1]).backward()
            optimizer.step()
        rows.append((start - torch.nn.utils.parameters_to_vector(copy.parameters()).detach()) / 0.3)
    reference = torch.stack(rows)
    engine = PerSampleEngine(model)
    result = engine.clipped_local_updates(x, y, 0.5, steps=3, lr=0.3)
    torch.testing.assert_close(result.norms, reference.norm(dim=1), rtol=1e-10, atol=1e-12)
    torch.testing.assert_close(
        result.flat_sum, clip_rows(reference, 0.5).sum(0), rtol=1e-10, atol=1e-12
    )
    single = engine.clipped_local_updates(x, y, 0.5, steps=1, lr=0.3)  # one step = the gradient
    torch.testing.assert_close(single.flat_sum, engine.clipped_sum(x, y, 0.5).flat_sum)


def test_scaled_clip_factors_follow_the_rule_in_float64() -> None:
    """``clip_factors(n, C, scale)`` is ``scale * min(1, C / (n + 1e-6))`` computed in float64
    (at, below and above the clipping norm, for a per-example clip tensor too), and 0 for a
    norm that is not finite."""
    from fedsim.training.persample import clip_factors
    from fedsim.training.persample.clipping import CLIP_EPSILON

    norms = torch.tensor([0.0, 0.3, 1.5 - CLIP_EPSILON, 1.5, 1.6, 4e3, 3e38, float("inf"), float("nan")])
    for clip in (1.5, torch.linspace(0.5, 2.0, len(norms))):
        for scale in (1.0, 1 / 256):
            got = clip_factors(norms, clip, scale)
            c = clip.double() if isinstance(clip, torch.Tensor) else clip
            expected = scale * torch.clamp(c / (norms.double() + CLIP_EPSILON), max=1.0)
            expected = torch.where(torch.isfinite(norms), expected, 0.0)
            assert got.dtype == norms.dtype
            torch.testing.assert_close(got.double(), expected, rtol=2e-7, atol=0.0)


@pytest.mark.parametrize("sampling", ["poisson", "fixed"])
def test_mlp_step_equals_the_reference_sum_for_every_batch_size(sampling: str) -> None:
    """The MLP's Linear rule (norms from ``||g|| ||a||``, bias sum by ``g^T c``, weight sum by one
    ``(c g)^T a`` product into the noise vector) gives ``noise + scale * sum_i clip(g_i)``
    within float32 tolerance of single-example backward passes, for realised batch sizes 0, 1
    and larger (Poisson), as for fixed-size batches."""
    torch.manual_seed(11)
    model = build_model("mlp", in_features=12, num_classes=5, hidden=(9,))
    engine = PerSampleEngine(model)
    features, labels = torch.randn(40, 12) * 3, torch.randint(0, 5, (40,))
    clip, m = 0.7, 8.0
    sizes = (0, 1, 13, 40) if sampling == "poisson" else (8, 8)
    for size in sizes:
        indices = torch.randperm(40)[:size]
        seed = 100 + size
        noise_only = noisy_gradient(
            engine, features[:0], labels[:0], indices[:0], sampling=sampling, clip=clip,
            noise_multiplier=1.0, expected_batch_size=m,
            generator=torch.Generator().manual_seed(seed),
        ).gradient
        release = noisy_gradient(
            engine, features, labels, indices, sampling=sampling, clip=clip, noise_multiplier=1.0,
            expected_batch_size=m, generator=torch.Generator().manual_seed(seed),
            max_physical_batch=16,
        )
        rows = (
            naive_per_example_gradients(model, features[indices], labels[indices]).double()
            if size
            else torch.zeros(0, engine.num_params, dtype=torch.float64)
        )
        expected = noise_only.double() + clip_rows(rows, clip).sum(0) / m
        torch.testing.assert_close(release.gradient.double(), expected, rtol=1e-5, atol=1e-6)
        assert release.batch_size == size
        assert release.within_clip == int((rows.norm(dim=1) <= clip).sum())


def test_the_unclipped_count_asked_late_is_the_steps_own() -> None:
    # within_clip is counted when first asked, from the norms the step kept: later steps on the
    # same engine (other records, another clip) must not change it.
    torch.manual_seed(3)
    model = nn.Sequential(nn.Linear(12, 16), nn.ReLU(), nn.Linear(16, 5))
    engine = PerSampleEngine(model)
    features, labels = torch.randn(64, 12) * 3, torch.randint(0, 5, (64,))
    releases, expected = [], []
    for step, quantile in enumerate((0.3, 0.8, 0.5)):
        indices = torch.arange(step * 20, step * 20 + 20)
        rows = naive_per_example_gradients(model, features[indices], labels[indices]).double()
        clip = float(rows.norm(dim=1).quantile(quantile))  # cuts through this step's norms
        releases.append(noisy_gradient(
            engine, features, labels, indices, sampling="fixed", clip=clip, noise_multiplier=1.0,
            expected_batch_size=20, generator=torch.Generator().manual_seed(step),
            max_physical_batch=8))
        expected.append(int((rows.norm(dim=1) <= clip).sum()))
    assert [r.within_clip for r in releases] == expected
    assert all(0 < count < 20 for count in expected)


class _BiasTwice(nn.Module):
    """fc2's bias also used outside fc2's forward: the attribution check moves fc2 to the
    fallback."""

    def __init__(self) -> None:
        super().__init__()
        self.fc1, self.fc2 = nn.Linear(6, 5), nn.Linear(5, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(torch.tanh(self.fc1(x))) + self.fc2.bias


class _WeightOutside(nn.Module):
    """fc2's weight also used outside fc2's forward."""

    def __init__(self) -> None:
        super().__init__()
        self.fc1, self.fc2 = nn.Linear(6, 3), nn.Linear(3, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = torch.tanh(self.fc1(x))
        return self.fc2(h) + h @ self.fc2.weight.t()


def _batch_gradient(model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    model.zero_grad()
    nn.functional.cross_entropy(model(x), y, reduction="sum").backward()
    return torch.cat([torch.zeros(p.numel()) if p.grad is None else p.grad.reshape(-1)
                      for p in model.parameters()])


def test_the_engine_follows_parameters_frozen_and_unfrozen_after_it_was_built() -> None:
    """The layers, the fallback and the first-batch check are of the parameters that train
    now: a weight frozen after the engine was built gets no gradient, even through the
    fallback (torch.func differentiates what it is given), and the sum equals an engine's
    built after the change; a weight frozen during the first check and unfrozen afterwards is
    checked again (a use outside its layer found: the fallback), so with no clipping the sum
    is the batch gradient (found by an attacker's review: the sum missed the outside use)."""
    x, y = torch.randn(8, 6), torch.randint(0, 3, (8,))
    torch.manual_seed(0)
    model = _BiasTwice()
    early = PerSampleEngine(model)
    model.fc2.weight.requires_grad_(False)
    late = PerSampleEngine(model)
    got = early.clipped_sum(x, y, 1.0)
    want = late.clipped_sum(x, y, 1.0)
    assert torch.equal(got.flat_sum, want.flat_sum) and torch.equal(got.norms, want.norms)
    assert early.fallback_parameters == late.fallback_parameters == ["fc2.bias"]
    start = sum(p.numel() for p in model.fc1.parameters())  # fc2.weight's span follows fc1
    assert float(got.flat_sum[start:start + model.fc2.weight.numel()].abs().sum()) == 0.0
    model.fc2.weight.requires_grad_(True)  # and back: trained again, through the fallback
    again = early.clipped_sum(x, y, 1e9).flat_sum
    torch.testing.assert_close(again, _batch_gradient(model, x, y), rtol=1e-5, atol=1e-5)

    torch.manual_seed(0)
    model = _WeightOutside()
    engine = PerSampleEngine(model)
    model.fc2.weight.requires_grad_(False)
    engine.clipped_sum(x, y, 1e9)  # the first batch's check, fc2.weight frozen
    model.fc2.weight.requires_grad_(True)
    got_sum = engine.clipped_sum(x, y, 1e9).flat_sum
    assert "fc2.weight" in engine.fallback_parameters
    torch.testing.assert_close(got_sum, _batch_gradient(model, x, y), rtol=1e-5, atol=1e-5)


def test_a_model_with_every_parameter_frozen_after_its_engine_was_built_is_refused() -> None:
    model = nn.Sequential(nn.Linear(4, 3))
    engine = PerSampleEngine(model)
    model.requires_grad_(False)
    with pytest.raises(ModelError, match="no trainable parameters"):
        engine.clipped_sum(torch.randn(2, 4), torch.randint(0, 3, (2,)), 1.0)
