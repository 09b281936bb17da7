"""A record whose gradient is not finite contributes zero, and its round is still released
(finding R5 of tests/runtime/test_review_s7.py): on every per-sample path, alone and batched.

The reference is independent of the rule under test: the same step over the batch *without*
that record, from the same noise key, divided by the same expected batch size m."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from structlog.testing import capture_logs

from fedsim.privacy import schedules
from fedsim.training import LocalTrainer, build_model, flat_params
from fedsim.training.batched import RoundBatcher
from fedsim.training.dpsgd import noisy_gradient
from fedsim.training.gaussian import NoiseKey
from fedsim.training.persample import PerSampleEngine

BAD = 3  # the index of the record with the huge feature
# 1e30 in one feature (the first layer's weights at 1, so the loss is not saturated): finite
# activations and gradient entries ~1e30, whose squared norm overflows float32 (max 3.4e38)
# on every path. 3e38 in every feature with the first layer's weights at 1: the
# activations overflow (4 * 3e38 = inf), so its gradients are nan on every path.
HUGE = [1e30, 3e38]


def _data(huge: float, n: int = 20) -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(5)
    x = torch.randn(n, 4, generator=generator)
    y = torch.randint(0, 3, (n,), generator=generator)
    if huge > 1e38:
        x[BAD] = huge
    else:
        x[BAD, 0] = huge
    return x, y


class _Scale(torch.nn.Module):
    """A layer with no fast path: its parameter goes through the torch.func fallback."""

    def __init__(self) -> None:
        super().__init__()
        self.weight = torch.nn.Parameter(torch.full((3,), 1.5))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * self.weight


def _model(kind: str) -> torch.nn.Module:
    torch.manual_seed(0)
    if kind == "mlp":
        model = build_model("mlp", in_features=4, hidden=[6], num_classes=3, activation="tanh")
    elif kind == "fallback":
        model = torch.nn.Sequential(torch.nn.Linear(4, 3), _Scale())
    else:
        model = torch.nn.Linear(4, 3)
    first = next(m for m in model.modules() if isinstance(m, torch.nn.Linear))
    with torch.no_grad():
        first.weight.fill_(1.0)  # 3e38 in every feature overflows it (see HUGE)
    return model


@pytest.mark.parametrize("huge", HUGE)
@pytest.mark.parametrize("path", ["linear", "mlp", "fallback", "torch_func_only", "local_steps",
                                  "chunked"])
def test_a_non_finite_example_contributes_zero_to_the_noisy_sum(path: str, huge: float) -> None:
    model = _model(path if path in ("mlp", "fallback") else "linear")
    engine = PerSampleEngine(model, fast_paths=path != "torch_func_only")
    x, y = _data(huge)
    options = {"per_example_steps": 2} if path == "local_steps" else {}
    if path == "chunked":
        options["max_physical_batch"] = 6
    key = NoiseKey.draw(torch.Generator().manual_seed(9))
    every = torch.arange(len(x))

    def step(indices: torch.Tensor) -> object:
        return noisy_gradient(engine, x, y, indices, sampling="fixed", clip=1.0,
                              noise_multiplier=1.0, expected_batch_size=20.0,
                              generator=torch.Generator().manual_seed(1), noise_key=key,
                              **options)

    got = step(every)
    want = step(every[every != BAD])
    assert torch.isfinite(got.gradient).all()
    assert (got.batch_size, got.nonfinite, want.nonfinite) == (20, 1, 0)
    assert got.within_clip == want.within_clip
    torch.testing.assert_close(got.gradient, want.gradient, rtol=1e-5, atol=1e-6)
    # The noise is there: the same records without noise give a different vector.
    assert float((got.gradient - want.gradient).norm()) < 1e-4 * float(want.gradient.norm())


def _trainer(model: torch.nn.Module, huge: float | None, seed: int) -> LocalTrainer:
    x, y = _data(huge if huge is not None else 1.0)
    if huge is None:
        x[BAD, 0] = 0.5
    schedule = schedules.constant(100, 1.0, 1.0)
    return LocalTrainer(model, x, y, batch_size=20, sampling="fixed", clip=schedule,
                        noise=schedule, generator=torch.Generator().manual_seed(seed))


@pytest.mark.parametrize("huge", HUGE)
def test_a_round_with_a_non_finite_record_is_released_alone_and_batched(huge: float) -> None:
    """Every record is in every round (fixed size m = N): the bad client's round is finite,
    charged as planned, counted (client-side) and logged once; computed in a batch with other
    clients' rounds it equals the round computed alone, and theirs are untouched."""
    model = _model("linear")
    params = flat_params(model)
    together = [_trainer(model, huge, 1), _trainer(model, None, 2), _trainer(model, None, 3)]
    alone = [_trainer(model, huge, 1), _trainer(model, None, 2), _trainer(model, None, 3)]
    batcher = RoundBatcher(model)
    with capture_logs() as logs:
        for round_index in range(3):
            pending = [t.begin_round(params, round_index, batcher) for t in together]
            for p, trainer in zip(pending, alone, strict=True):
                got, want = p.result(), trainer.run_round(params, round_index)
                assert np.isfinite(got.update).all()
                assert got.steps == want.steps == trainer.planned_steps(round_index)
                np.testing.assert_allclose(got.update, want.update, rtol=1e-5, atol=1e-6)
                assert got.nonfinite_examples == want.nonfinite_examples
            assert [p.result().nonfinite_examples for p in pending] == [1, 0, 0]
    warnings = [e for e in logs if e["log_level"] == "warning" and "non-finite" in e["event"]]
    assert len(warnings) == 2  # once per trainer (the batched one and the alone one)


def test_normal_rounds_count_no_non_finite_example() -> None:
    model = _model("mlp")
    trainer = _trainer(model, None, 4)
    result = trainer.run_round(flat_params(model), 0)
    assert result.nonfinite_examples == 0 and np.isfinite(result.update).all()


def test_a_split_round_with_a_non_finite_record_is_released() -> None:
    """``interrupt: switch``: a round split by a model arriving mid-round. Its later segments
    add into the first's noisy sum, so a nan there is undone by computing the step again
    without that record: the update does not depend on the bad record's value (1e30 in one
    feature, no recompute needed; 3e38 in all, nan activations, recomputed), as long as its
    norm is not finite."""
    updates = []
    for huge in HUGE:
        model = _model("linear")
        w0 = flat_params(model)
        trainer = _trainer(model, huge, 6)
        pending = trainer.begin_round(w0, 0)
        pending.switch(0.5, w0 + np.float32(0.01))
        result = pending.result()
        assert len(pending.segments) == 2
        assert np.isfinite(result.update).all() and result.nonfinite_examples == 1
        assert result.steps == trainer.planned_steps(0)
        updates.append(result.update)
    np.testing.assert_allclose(updates[0], updates[1], rtol=1e-5, atol=1e-6)
