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
        "other-activations": (nn.Sequential(nn.Flatten(), nn.Linear(12, 8), nn.ELU(2.0),
                                            nn.Linear(8, 8), nn.SiLU(), nn.Linear(8, 8),
                                            nn.Softplus(3.0, 0.5), nn.Identity(),
                                            nn.Linear(8, 10), nn.GELU("tanh")), (12,)),
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
    hooked_passes: list[int] = []
    original = PerSampleEngine._forward_backward

    def counted(self: PerSampleEngine, *args: object, **kwargs: object) -> object:
        hooked_passes.append(1 if self is hooked else 0)
        return original(self, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(PerSampleEngine, "_forward_backward", counted)
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
        # (an overflowing record's nan/inf activations reach the sum here: clipped_sum has no
        # recompute without it, noisy_gradient does)
        torch.testing.assert_close(sums[0].flat_sum, sums[1].flat_sum, rtol=0, atol=0,
                                   equal_nan=True)
        torch.testing.assert_close(sums[0].norms, sums[1].norms, rtol=0, atol=0, equal_nan=True)
        assert sums[0].loss_sum == sums[1].loss_sum
    assert any(r.nonfinite for r in released) == (7 in indices.tolist())
    # The warm-up batch, then per clip three physical batches and one clipped sum (and, where
    # the overflowing record's activations are not finite, three more without it).
    assert len(passes) in (1 + 3 * (3 + 1), 1 + 3 * (3 + 1 + 3))
    # The hooked pass ran for the hooked engine's batches only, as many as the chain's.
    assert hooked_passes == [1] * (len(passes) - 1)


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
    constant_bias = nn.Linear(12, 10)
    del constant_bias.bias
    constant_bias.bias = torch.zeros(10)  # a plain tensor: not a parameter the chain trains
    own_forward = nn.Sequential(nn.Flatten(), nn.Linear(12, 10))
    own_forward[1].forward = lambda x: x[:, :10] * 3  # type: ignore[method-assign]
    refused = {
        "constant bias": nn.Sequential(nn.Flatten(), constant_bias),
        "an instance's own forward": own_forward,
        "activation with a parameter": nn.Sequential(nn.Flatten(), nn.Linear(12, 10), nn.PReLU()),
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


def test_a_model_changed_after_its_engine_was_built_takes_the_hooked_pass() -> None:
    """The engine recognises the chain once; a layer frozen, replaced or appended, a bias
    removed or a forward overridden afterwards sends the batch through the hooked pass, which
    follows the model (a frozen weight gets no gradient there)."""
    def changes() -> dict[str, object]:
        return {
            "freeze a weight": lambda m: m.net[0].weight.requires_grad_(False),
            "replace an activation": lambda m: m.net.__setitem__(1, nn.Sigmoid()),
            "append an activation": lambda m: m.net.append(nn.Tanh()),
            "remove a bias": lambda m: setattr(m.net[2], "bias", None),
            "override a forward": lambda m: setattr(m.net[1], "forward", lambda x: x * 0.5),
        }

    x, y = torch.randn(6, 12), torch.randint(0, 10, (6,))
    for name, change in changes().items():
        torch.manual_seed(0)
        model = build_model("mlp", in_features=12, hidden=(8,))
        direct, hooked = _engines(model, (12,))
        before = direct.clipped_sum(x, y, 1.0).flat_sum.clone()
        change(model)  # type: ignore[operator]
        after = direct.clipped_sum(x, y, 1.0).flat_sum
        assert torch.equal(after, hooked.clipped_sum(x, y, 1.0).flat_sum), name
        assert not torch.equal(after, before), name
    torch.manual_seed(0)
    model = build_model("mlp", in_features=12, hidden=(8,))
    direct, _ = _engines(model, (12,))
    model.net[0].weight.requires_grad_(False)
    assert float(direct.clipped_sum(x, y, 1.0).flat_sum[: 8 * 12].abs().sum()) == 0.0


def test_a_layer_frozen_before_the_engines_first_batch() -> None:
    """An engine built, then a weight frozen before its first batch: the first-batch check
    asks autograd only for trainable parameters (asking for the frozen one raised), keeps
    the fast path, and the sum equals that of an engine built after the change."""
    x, y = torch.randn(6, 12), torch.randint(0, 10, (6,))
    torch.manual_seed(0)
    model = build_model("mlp", in_features=12, hidden=(8,))
    early = PerSampleEngine(model)
    model.net[0].weight.requires_grad_(False)
    late = PerSampleEngine(model)
    got = early.clipped_sum(x, y, 1.0).flat_sum
    assert torch.equal(got, late.clipped_sum(x, y, 1.0).flat_sum)
    assert float(got[: 8 * 12].abs().sum()) == 0.0 and float(got[8 * 12:].abs().sum()) > 0
    assert early.fallback_parameters == []


def test_low_precision_parameters_are_refused() -> None:
    """Clipping in float16/bfloat16 rounds a contribution up to about 1% above C."""
    from fedsim.errors import ModelError

    for dtype in (torch.float16, torch.bfloat16):
        with pytest.raises(ModelError, match="float32 or float64"):
            PerSampleEngine(build_model("mlp", in_features=12, hidden=(8,)).to(dtype))
    model = build_model("mlp", in_features=12, hidden=(8,)).double()
    assert linear_chain(model) is not None
    PerSampleEngine(model).clipped_sum(torch.randn(3, 12, dtype=torch.float64),
                                      torch.tensor([1, 2, 3]), 1.0)


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
