"""The per-sample engine's direct path for chains of Linear layers and activations
(fedsim.training.persample.chain): it releases what the hooked pass releases, to the bit, and
it is taken only where the chain is what the model computes."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from fedsim.training import build_model
from fedsim.training.dpsgd import noisy_gradient
from fedsim.training.persample import PerSampleEngine
from fedsim.training.persample import engine as engine_module
from fedsim.training.persample.chain import linear_chain


def _models() -> dict[str, tuple[nn.Module, tuple[int, ...]]]:
    torch.manual_seed(0)
    return {
        "mlp-relu": (build_model("mlp", in_features=12, hidden=(16, 8)), (1, 3, 4)),
        "mlp-tanh": (build_model("mlp", in_features=12, hidden=(7,), activation="tanh"), (12,)),
        "logreg": (build_model("logreg", in_features=12), (3, 4)),
        "sequential": (nn.Sequential(nn.Flatten(), nn.Linear(12, 9), nn.GELU(),
                                     nn.Linear(9, 6, bias=False), nn.LeakyReLU(0.3),
                                     nn.Linear(6, 10), nn.Sigmoid()), (2, 6)),
        "sequential-2d": (nn.Sequential(nn.Linear(12, 5), nn.Linear(5, 10)), (12,)),
    }


def _engines(
    model: nn.Module, shape: tuple[int, ...]
) -> tuple[PerSampleEngine, PerSampleEngine]:
    """The engine as built (its chain path) and one with the chain path turned off, each past
    its first-batch checks on the same clean batch."""
    direct, hooked = PerSampleEngine(model), PerSampleEngine(model)
    assert direct._chain is not None
    hooked._chain = None
    x, y = torch.randn(4, *shape), torch.randint(0, 10, (4,))
    for engine in (direct, hooked):
        engine.clipped_sum(x, y, 1.0)
    assert hooked.fallback_parameters == []
    return direct, hooked


@pytest.mark.parametrize("name", list(_models()))
@pytest.mark.parametrize("sampling", ["fixed", "poisson"])
def test_the_chain_path_releases_what_the_hooked_pass_releases_to_the_bit(
    name: str, sampling: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    passes = _count_chain_passes(monkeypatch)
    model, shape = _models()[name]
    direct, hooked = _engines(model, shape)
    features = torch.randn(40, *shape) * 3
    features[7] = 1e30  # a finite record whose squared norm overflows: factor 0
    labels = torch.randint(0, 10, (40,))
    indices = torch.randperm(40, generator=torch.Generator().manual_seed(1))[:24]
    for clip in (0.05, 1.0, 50.0):  # every example clipped, some, none
        released = [
            noisy_gradient(
                engine, features, labels, indices, sampling=sampling, clip=clip,
                noise_multiplier=1.1, expected_batch_size=20,
                generator=torch.Generator().manual_seed(3), max_physical_batch=10)
            for engine in (direct, hooked)
        ]
        assert torch.equal(released[0].gradient, released[1].gradient)
        assert released[0].within_clip == released[1].within_clip
        assert released[0].loss_sum == released[1].loss_sum
        assert released[0].nonfinite == released[1].nonfinite
        sums = [engine.clipped_sum(features[:9], labels[:9], clip, scale=0.25)
                for engine in (direct, hooked)]
        assert torch.equal(sums[0].flat_sum, sums[1].flat_sum)
        torch.testing.assert_close(sums[0].norms, sums[1].norms, rtol=0, atol=0, equal_nan=True)
        assert sums[0].loss_sum == sums[1].loss_sum
    assert any(r.nonfinite for r in released) == (7 in indices.tolist())
    # The warm-up batch, then per clip three physical batches and one clipped sum.
    assert len(passes) == 1 + 3 * (3 + 1)


def _count_chain_passes(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Calls of the chain path (the direct engine's batches), one entry each."""
    calls: list[int] = []
    original = engine_module.chain_outputs

    def counted(*args: object, **kwargs: object) -> object:
        calls.append(1)
        return original(*args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(engine_module, "chain_outputs", counted)
    return calls


class _Doubling(nn.Module):
    def forward(self, weight: torch.Tensor) -> torch.Tensor:
        return weight * 2


def test_models_that_are_not_chains_of_what_they_compute_are_left_to_the_hooked_pass() -> None:
    class Scaled(nn.Sequential):  # a subclass: its forward may differ from the chain's
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return super().forward(x) * 2

    class Doubled(nn.ReLU):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return super().forward(x) * 2

    shared = nn.Linear(10, 10)
    refused = {
        "subclass": Scaled(nn.Flatten(), nn.Linear(12, 10)),
        "activation subclass": nn.Sequential(nn.Flatten(), nn.Linear(12, 10), Doubled()),
        "in-place activation": nn.Sequential(nn.Flatten(), nn.Linear(12, 10), nn.ReLU(True)),
        "shared layer": nn.Sequential(nn.Flatten(), nn.Linear(12, 10), shared, nn.Tanh(), shared),
        "frozen layer": nn.Sequential(nn.Flatten(), nn.Linear(12, 10).requires_grad_(False),
                                      nn.Linear(10, 10)),
        "not elementwise": nn.Sequential(nn.Flatten(), nn.Linear(12, 10), nn.Softmax(1),
                                         nn.Linear(10, 10)),
        "flatten of another range": nn.Sequential(nn.Flatten(2), nn.Linear(12, 10)),
        "convolution": build_model("dp_mnist_cnn"),
        "parametrized weight": nn.Sequential(nn.Flatten(), torch.nn.utils.parametrize.
                                             register_parametrization(nn.Linear(12, 10), "weight",
                                                                      _Doubling())),
    }
    for name, model in refused.items():
        assert linear_chain(model) is None, name


def test_a_hook_or_inputs_the_chain_does_not_flatten_send_a_batch_through_the_hooked_pass() -> None:
    """A forward hook changes what the model computes (here: halves its logits); with one, the
    engine's result follows the hook. A Sequential without Flatten applies its first Linear to
    the last axis of (B, T, d) inputs, which the chain (on flattened rows) does not compute."""
    torch.manual_seed(0)
    model = build_model("mlp", in_features=12, hidden=(8,))
    direct, hooked = _engines(model, (12,))
    x, y = torch.randn(6, 12), torch.randint(0, 10, (6,))
    before = direct.clipped_sum(x, y, 1.0).flat_sum.clone()
    handle = model.net[-1].register_forward_hook(lambda m, args, out: out * 0.5)
    try:
        with_hook = direct.clipped_sum(x, y, 1.0).flat_sum
        assert torch.equal(with_hook, hooked.clipped_sum(x, y, 1.0).flat_sum)
        assert not torch.equal(with_hook, before)
    finally:
        handle.remove()
    assert torch.equal(direct.clipped_sum(x, y, 1.0).flat_sum, before)

    sequence = nn.Sequential(nn.Linear(4, 10))  # on (B, 3, 4): a Linear per position
    loss = lambda out, t: nn.functional.cross_entropy(out.sum(1), t, reduction="none")  # noqa: E731
    direct, hooked = PerSampleEngine(sequence), PerSampleEngine(sequence)
    hooked._chain = None
    x3 = torch.randn(6, 3, 4)
    assert torch.equal(direct.clipped_sum(x3, y, 1.0, loss).flat_sum,
                       hooked.clipped_sum(x3, y, 1.0, loss).flat_sum)
