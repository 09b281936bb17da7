"""benchmarks/device.py where no GPU is: it records that nothing was measured (with the commit
and the machine's load) but keeps a measurement already there, and ``--profile`` writes its two
profiles of a run on the device."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from fedsim.training import devices
from tests.scripts import BENCHMARKS, load_script


def test_without_a_gpu_the_result_says_nothing_was_measured(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    bench = load_script(BENCHMARKS / "device.py", "bench_device")
    monkeypatch.setattr(devices.Accelerators, "detect",
                        classmethod(lambda cls: devices.Accelerators(False, False)))
    out = tmp_path / "device.json"
    assert bench.main(["--out", str(out)]) == 0
    record = json.loads(out.read_text())
    assert record["measured"] is False and record["device"] is None
    assert "no GPU here" in record["reason"]
    assert "fedsim" in record["commit"] and len(record["loadavg_start"]) == 3
    # a measurement made on a GPU is not erased by a later run without one
    measured = {"benchmark": "device", "measured": True, "ratio": 0.438}
    out.write_text(json.dumps(measured))
    assert bench.main(["--out", str(out)]) == 0
    assert json.loads(out.read_text()) == measured


@pytest.mark.slow
def test_the_profile_mode_writes_both_profiles_of_a_run(tmp_path: Path) -> None:
    bench = load_script(BENCHMARKS / "device.py", "bench_device")
    assert bench.main(["--device", "cpu", "--profile", str(tmp_path)]) == 0
    cprofile = (tmp_path / "cprofile_cpu.txt").read_text()
    assert cprofile.startswith("wall ") and "run_scenario" in cprofile
    assert "aten::addmm" in (tmp_path / "torchprof_cpu.txt").read_text()
