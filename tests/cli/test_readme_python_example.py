"""The README's Python example runs as written, from the repository root (a stranger ran it
verbatim and got ``NameError: name 'scenario_dict_or_yaml' is not defined``)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


def _python_example() -> str:
    readme = (REPO / "README.md").read_text(encoding="utf-8")
    section = readme[readme.index("## From Python"):]
    start = section.index("```python\n") + len("```python\n")
    return section[start:section.index("```", start)]


@pytest.mark.slow
def test_the_readmes_python_example_runs_as_written(tmp_path: Path) -> None:
    script = tmp_path / "example.py"
    script.write_text(_python_example(), encoding="utf-8")
    done = subprocess.run([sys.executable, str(script)], cwd=REPO, capture_output=True,
                          text=True, timeout=600, check=False,
                          env={**os.environ, "PYTHONPATH": str(REPO)})
    assert done.returncode == 0, done.stderr[-3000:]
    accuracy, windows = done.stdout.splitlines()[0].split()
    assert 0.5 < float(accuracy) <= 1.0  # four separable classes
    # The override took: 30 virtual s of 0.25 s windows, no budget spent before (as it said)
    assert int(windows) == 120
    assert "phone-000" in done.stdout.splitlines()[1]
    # fedsim.account's eps for (q 0.01, sigma 1.1, 1000 steps): the same call, in this process
    import fedsim

    assert float(done.stdout.splitlines()[2]) == fedsim.account(q=0.01, sigma=1.1,
                                                                steps=1000)["epsilon"]
