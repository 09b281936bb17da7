"""``benchmarks/dp_step.py``'s ``minimal`` variant is the same DP step as fedsim's.

The variant bounds what any per-sample engine can reach (docs/SCALE.md, "The DP-SGD step"), so
it must compute what fedsim's step computes - the same noise, clipping and update - or its
figure bounds nothing. Both steps start from the same model and generator seeds.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

import pytest
import torch

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"


@pytest.fixture(scope="module")
def dp_step() -> ModuleType:
    sys.path.insert(0, str(BENCHMARKS))
    try:
        spec = importlib.util.spec_from_file_location("dp_step_under_test", BENCHMARKS / "dp_step.py")
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        return module
    finally:
        sys.path.remove(str(BENCHMARKS))


def _parameters(step: object) -> list[torch.nn.Parameter]:
    for cell in getattr(step, "__closure__", None) or ():
        value = cell.cell_contents
        if isinstance(value, list) and value and isinstance(value[0], torch.nn.Parameter):
            return value
    raise AssertionError("no parameter list in the step's closure")


def test_minimal_step_releases_what_fedsims_step_releases(dp_step: ModuleType) -> None:
    fedsim_step = dp_step._step_function("mlp", "fedsim")
    minimal_step = dp_step._step_function("mlp", "minimal")
    ours, theirs = _parameters(fedsim_step), _parameters(minimal_step)
    start = [p.detach().clone() for p in ours]
    for _ in range(3):
        fedsim_step()
        minimal_step()
    moved = max(float((p.detach() - s).abs().max()) for p, s in zip(ours, start, strict=True))
    assert moved > 1e-3  # the steps did move the model
    for p, q in zip(ours, theirs, strict=True):
        torch.testing.assert_close(p.detach(), q.detach(), rtol=1e-5, atol=1e-6)


def test_minimal_step_refuses_other_models(
    dp_step: ModuleType, monkeypatch: pytest.MonkeyPatch
) -> None:
    with pytest.raises(ValueError, match="Linear / ReLU"):
        dp_step._step_function("dp_mnist_cnn", "minimal")
    monkeypatch.syspath_prepend(str(BENCHMARKS))  # main imports benchmarks/_common.py
    with pytest.raises(SystemExit):
        dp_step.main(["--models", "dp_mnist_cnn", "--variants", "minimal", "--quick"])
