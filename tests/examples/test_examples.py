"""Every script in examples/ runs on its tiny settings (FEDSIM_EXAMPLE_TINY=1), from an empty
directory, with nothing beside the clone, and prints what it promises."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = sorted((ROOT / "examples").glob("*.py"))
# A line each example must print (its result), so a script that silently does nothing fails.
EXPECTED = {
    "custom_model_and_data.py": "re-evaluated accuracy",
    "privacy_accounting.py": "steps within eps 2 at sigma 1.0:",
    "sweep_noise.py": "phones at batch 64: eps",
    "torch_dataset.py": "(the same data and seed: identical)",
}


def test_every_example_is_listed() -> None:
    assert sorted(p.name for p in EXAMPLES) == sorted(EXPECTED)


@pytest.mark.slow
@pytest.mark.parametrize("script", EXAMPLES, ids=lambda p: p.name)
def test_example_runs_on_tiny_settings(script: Path, tmp_path: Path) -> None:
    env = {**os.environ, "FEDSIM_EXAMPLE_TINY": "1",
           "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    done = subprocess.run([sys.executable, str(script)], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    assert EXPECTED[script.name] in done.stdout
    assert list(tmp_path.iterdir()) == []  # out=None: nothing left behind
