"""``benchmarks/dp_step.py``'s ``minimal`` variant is the same DP step as fedsim's.

The variant bounds what any per-sample engine can reach (docs/SCALE.md, "The DP-SGD step"), so
it must compute what fedsim's step computes - the same noise, clipping and update - or its
figure bounds nothing. Both steps start from the same model and generator seeds.
"""

from __future__ import annotations

from pathlib import Path
from types import ModuleType

import pytest
import torch

from tests.scripts import load_script

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"


@pytest.fixture(scope="module")
def dp_step() -> ModuleType:
    return load_script(BENCHMARKS / "dp_step.py", "dp_step_under_test")


def _parameters(step: object) -> list[torch.nn.Parameter]:
    for cell in getattr(step, "__closure__", None) or ():
        value = cell.cell_contents
        if isinstance(value, list) and value and isinstance(value[0], torch.nn.Parameter):
            return value
    raise AssertionError("no parameter list in the step's closure")


@pytest.mark.parametrize("clip", [1.0, 7.5])
def test_minimal_step_releases_what_fedsims_step_releases(
    dp_step: ModuleType, monkeypatch: pytest.MonkeyPatch, clip: float
) -> None:
    """To the bit. At C = 1 every example of the first steps is clipped (norms 6.6-8.3); at
    C = 7.5 about half are not, so the factors' clamp at ``1/m`` decides too."""
    monkeypatch.setattr(dp_step, "CLIP", clip)
    fedsim_step = dp_step._step_function("mlp", "fedsim")
    minimal_step = dp_step._step_function("mlp", "minimal")
    ours, theirs = _parameters(fedsim_step), _parameters(minimal_step)
    for _ in range(3):
        fedsim_step()
        minimal_step()
    for p, q in zip(ours, theirs, strict=True):
        assert torch.equal(p.detach(), q.detach())


def test_minimal_step_refuses_other_models(
    dp_step: ModuleType, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(ValueError, match="Linear"):
        dp_step._step_function("dp_mnist_cnn", "minimal")
    monkeypatch.syspath_prepend(str(BENCHMARKS))  # main imports benchmarks/_common.py
    with pytest.raises(SystemExit) as refused:
        dp_step.main(["--models", "dp_mnist_cnn", "--variants", "minimal", "--quick"])
    assert refused.value.code == 2
    assert "written for the MLP" in capsys.readouterr().err


def test_noiseless_minimal_step_is_the_clipped_step_without_noise(dp_step: ModuleType) -> None:
    """``minimal_noiseless`` (the floor's measurement) differs from ``minimal`` by the noise
    alone: its update is the engine's scaled clipped sum, to the bit."""
    from fedsim.training.persample import PerSampleEngine

    step = dp_step._step_function("mlp", "minimal_noiseless")
    torch.manual_seed(0)  # as _step_function builds its model and batch
    model = dp_step._build("mlp")
    x = torch.rand(*dp_step._input_shape("mlp"))
    y = torch.randint(0, 10, (dp_step.BATCH,))
    expected = PerSampleEngine(model).clipped_sum(
        x, y, dp_step.CLIP, scale=1.0 / dp_step.BATCH).flat_sum
    step()
    with torch.no_grad():
        for p, update in zip(model.parameters(), dp_step._views(expected, list(model.parameters())),
                             strict=True):
            p.add_(update, alpha=-dp_step.LR)
    for p, q in zip(model.parameters(), _parameters(step), strict=True):
        assert torch.equal(p.detach(), q.detach())
