"""``device: cpu | cuda | mps | auto``: the choice, the clear error for a missing device, and
that the model, the clients' records and the batched pass land on the device asked for
(checked with ``torch.device("cpu")`` here; the cuda tests run where a GPU is present)."""

from __future__ import annotations

import math

import numpy as np
import pytest
import structlog
import torch
import yaml
from scipy import stats

from fedsim.cli import main
from fedsim.config import LoadedScenario, parse_scenario
from fedsim.errors import ConfigError
from fedsim.runtime.population import build_population
from fedsim.runtime.simulated.simulation import run_scenario
from fedsim.training import devices
from fedsim.training.batched import RoundBatcher
from fedsim.training.devices import Accelerators, resolve_device
from fedsim.training.gaussian import (
    NoiseKey,
    fill_gaussian,
    fill_noise,
    gaussian_noise,
    reference_pairs,
    reference_rows,
    tail_key,
)

NONE, CUDA, MPS = Accelerators(False, False), Accelerators(True, False), Accelerators(False, True)
GPU = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


def _scenario(device: str = "cpu") -> dict[str, object]:
    return {
        "seed": 1, "device": device, "stop": {"windows": 6},
        "dataset": {"name": "synthetic", "num_samples": 600, "num_test_samples": 100},
        "model": {"name": "mlp", "options": {"hidden": [8]}},
        "server": {"window": 1.0},
        "clients": {"groups": [{"name": "a", "count": 4, "data_share": 1.0, "batch_size": 16,
                                "clip": 1.0, "noise": 1.0, "speed": 0.001}]},
    }


def test_auto_takes_cuda_then_mps_then_cpu_and_logs_the_choice() -> None:
    with structlog.testing.capture_logs() as logs:
        assert resolve_device("auto", present=Accelerators(True, True)) == torch.device("cuda")
        assert resolve_device("auto", present=MPS) == torch.device("mps")
        assert resolve_device("auto", present=NONE) == torch.device("cpu")
    chosen = [e["device"] for e in logs if e["event"] == "device chosen"]
    assert chosen == ["cuda", "mps", "cpu"]
    assert resolve_device("cpu", present=CUDA) == torch.device("cpu")  # asked for: kept
    assert resolve_device("cuda", present=CUDA) == torch.device("cuda")


@pytest.mark.parametrize("name, present", [("cuda", NONE), ("cuda", MPS), ("mps", CUDA)])
def test_a_missing_device_is_a_clear_config_error(name: str, present: Accelerators) -> None:
    with pytest.raises(ConfigError, match=f"device: {name} was requested but .*device: auto"):
        resolve_device(name, present=present)
    with pytest.raises(ConfigError, match="not one of"):
        resolve_device("tpu")


def test_a_fake_missing_cuda_fails_the_run_with_one_clear_line(
    tmp_path: object, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    path = tmp_path / "s.yaml"  # type: ignore[operator]
    path.write_text(yaml.safe_dump(_scenario()), encoding="utf-8")
    code = main(["run", str(path), "--device", "cuda", "--no-plots",
                 "--out", str(tmp_path / "run")])  # type: ignore[operator]
    err = capsys.readouterr().err
    assert code == 2 and "fedsim run: error: device: cuda was requested but" in err
    assert "Traceback" not in err
    with pytest.raises(ConfigError, match="device: Input should be .cpu., .cuda., .mps. or .auto."):
        parse_scenario({**_scenario(), "device": "gpu"})


def test_tensors_land_on_the_device_asked_for() -> None:
    cpu = torch.device("cpu")
    population = build_population(LoadedScenario(parse_scenario(_scenario("cpu")), None))
    assert population.device == cpu
    assert {p.device for p in population.model.parameters()} == {cpu}
    trainer = population.trainer(population.plans[0])
    assert trainer.features.device == cpu and trainer.labels.device == cpu
    assert RoundBatcher(population.model).device == cpu
    update = torch.empty(10, device=cpu)
    key = NoiseKey(0x1234, 0x9E3779B97F4A7C15)
    fill_noise(update, key, 2.0)  # on the CPU: the compiled kernel, the same values
    expected = torch.empty(10)
    fill_gaussian(expected, key, 2.0)
    assert torch.equal(update, expected)


@pytest.mark.slow
def test_auto_without_an_accelerator_runs_on_the_cpu_exactly_as_cpu(
    tmp_path: object, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(devices.Accelerators, "detect", classmethod(lambda cls: NONE))
    runs = [run_scenario(LoadedScenario(parse_scenario(_scenario(d)), None),
                         tmp_path / d)  # type: ignore[operator]
            for d in ("cpu", "auto")]
    assert runs[0].summary["updates"]["applied"] > 0
    np.testing.assert_array_equal(runs[0].final_params, runs[1].final_params)


# ----------------------------------------------------------------------------- on a GPU
@GPU
def test_noise_on_the_gpu_is_the_cpu_samplers_distribution_and_fresh_each_step() -> None:
    generator = torch.Generator().manual_seed(3)  # CPU generator: keys as on the CPU
    keys = [NoiseKey.draw(generator) for _ in range(2)]
    on_gpu = [gaussian_noise(1_000_000, 1.0, k, torch.zeros(1, device="cuda")) for k in keys]
    assert all(v.device.type == "cuda" for v in on_gpu)
    on_cpu = gaussian_noise(1_000_000, 1.0, keys[0], torch.zeros(1))
    torch.testing.assert_close(on_gpu[0].cpu(), on_cpu, rtol=1e-5, atol=1e-5)
    first, second = (v.double().cpu().numpy() for v in on_gpu)
    assert stats.kstest(first, "norm").pvalue > 0.01
    assert abs(first.std() - 1) < 5 * math.sqrt(0.5 / first.size)
    assert abs(np.corrcoef(first, second)[0, 1]) < 5 / math.sqrt(first.size)


@GPU
def test_a_block_of_draws_on_the_gpu_gives_each_keys_own_draw_to_the_bit() -> None:
    # The batched pass off the CPU draws all its rounds' noise at once (reference_rows); a
    # row is its key's draw alone on the same device, and the CPU's values up to rounding.
    keys = [NoiseKey(0x0123456789ABCDEF, 0x9E3779B97F4A7C15), tail_key(4099, 3000, 0x3A5C_71E9),
            NoiseKey(11, 0x5851F42D4C957F2D)]
    stds = [1.0, 0.5, 3.0]
    rows = reference_rows(keys, stds, 4099, "cuda")
    for row, key, std in zip(rows, keys, stds, strict=True):
        assert torch.equal(row, reference_pairs(4099, key.seed, key.gamma, std, "cuda"))
        torch.testing.assert_close(row.cpu(), gaussian_noise(8198, std, key, torch.zeros(1)),
                                   rtol=1e-5, atol=1e-5)


@GPU
def test_a_run_on_the_gpu_matches_the_cpu_run(tmp_path: object) -> None:
    runs = [run_scenario(LoadedScenario(parse_scenario(_scenario(d)), None),
                         tmp_path / d)  # type: ignore[operator]
            for d in ("cpu", "cuda")]
    assert runs[1].summary["updates"]["applied"] == runs[0].summary["updates"]["applied"]
    np.testing.assert_allclose(runs[1].final_params, runs[0].final_params, rtol=1e-3, atol=1e-4)
