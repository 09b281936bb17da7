"""``fedsim.simulate`` in someone else's program writes nothing of its own to stdout, no
progress bar off a terminal and no log lines unless the program asks for them (through the
standard library's ``logging``): the docs/API.md snippet, in a subprocess with pipes."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from tests.api.conftest import TINY

REPO = Path(__file__).resolve().parents[2]
MARK = "--- logging configured ---"

# docs/API.md's snippet (a scenario that stops its clients on their budgets, so that a run
# logs "client stopped" lines at info), run twice: as it is, then after the program asks
# the standard library for info lines.
SNIPPET = f"""
import logging, sys
import fedsim

def run():
    result = fedsim.simulate(sys.argv[1], seed=1,
                             overrides={{"clients.groups[*].noise.sigma": 1.5,
                                         "clients.groups[*].budget.epsilon": 2.0}})
    print(result.final_accuracy, result.epsilon_median, result.epsilon_max)
    print(len(result.windows), [c.state for c in result.clients])

run()
print({MARK!r}, file=sys.stderr, flush=True)
logging.basicConfig(level=logging.INFO, stream=sys.stderr)
run()
"""


@pytest.mark.slow
def test_simulate_writes_only_the_callers_prints(tmp_path: Path) -> None:
    scenario = tmp_path / "tiny.yaml"
    scenario.write_text(yaml.safe_dump(TINY), encoding="utf-8")
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    done = subprocess.run([sys.executable, "-c", SNIPPET, str(scenario)], capture_output=True,
                          text=True, timeout=300, check=False, cwd=tmp_path, env=env)
    assert done.returncode == 0, done.stderr
    # stdout: exactly the program's four prints (the same run twice, so the same lines).
    lines = done.stdout.splitlines()
    assert len(lines) == 4 and lines[:2] == lines[2:]
    assert "budget_exhausted" in lines[1]
    # stderr: nothing (no bar, no info or debug line) until the program configures logging;
    # then the run's info lines through the standard library, and still no bar.
    before, after = done.stderr.split(MARK + "\n")
    assert before == ""
    logged = after.splitlines()
    assert logged and all(line.startswith(("INFO:fedsim.", "WARNING:fedsim.")) for line in logged)
    assert any("client stopped" in line for line in logged)
    assert "\r" not in done.stderr
