"""Process resources at scale (issue 18). File descriptors: a held ledger keeps two open, so
a run checks RLIMIT_NOFILE before it opens its ledgers, raises the soft limit when the hard one
allows, and otherwise writes every ledger under one directory lock, with the same run
directory (the allocator: tests/runtime/test_allocator.py)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from fedsim.config import LoadedScenario, parse_scenario
from fedsim.runtime.simulated.memory import (
    DESCRIPTOR_RESERVE,
    DESCRIPTORS_PER_LEDGER,
    ledger_handles_fit,
)
from fedsim.runtime.simulated.simulation import run_scenario

resource = pytest.importorskip("resource")
ROOT = Path(__file__).resolve().parents[2]
CLIENTS = 60  # 2 x 60 + 256 = 376 descriptors wanted


def _needed(ledgers: int) -> int:
    return ledgers * DESCRIPTORS_PER_LEDGER + DESCRIPTOR_RESERVE


def test_the_soft_limit_is_raised_when_the_hard_limit_allows() -> None:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and hard < _needed(100):
        pytest.skip(f"hard limit {hard} too low for this check")
    resource.setrlimit(resource.RLIMIT_NOFILE, (64, hard))
    try:
        assert ledger_handles_fit(100)
        assert resource.getrlimit(resource.RLIMIT_NOFILE) == (_needed(100), hard)
        assert ledger_handles_fit(10)  # already fits: left as it is
        assert resource.getrlimit(resource.RLIMIT_NOFILE)[0] == _needed(100)
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


def test_more_ledgers_than_the_hard_limit_allows_do_not_fit() -> None:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard == resource.RLIM_INFINITY:
        pytest.skip("no hard limit on open files here")
    assert not ledger_handles_fit(hard)
    assert resource.getrlimit(resource.RLIMIT_NOFILE) == (soft, hard)  # untouched


def scenario() -> dict[str, Any]:
    group: dict[str, Any] = {"count": CLIENTS // 2, "data_share": 0.5, "clip": 1.0,
                             "local_lr": 0.5, "batch_size": 2, "noise": 1.0,
                             "speed": {"kind": "uniform", "low": 0.01, "high": 0.03}}
    return {
        "name": "many-ledgers", "seed": 3, "stop": {"virtual_seconds": 2.0},
        "dataset": {"name": "synthetic", "num_samples": 600, "num_test_samples": 100,
                    "num_features": 8, "num_classes": 3},
        "model": {"name": "mlp", "options": {"hidden": [8]}},
        "clients": {"groups": [{**group, "name": "a", "sampling": "poisson",
                                "budget": {"epsilon": 3.0, "delta": 1e-5}},
                               {**group, "name": "b", "sampling": "fixed"}]},
        "server": {"window": 0.5},
    }


_CHILD = """
import json, resource, sys
from pathlib import Path
import fedsim.runtime.simulated.run_ledgers as run_ledgers
import fedsim.runtime.simulated.simulation as simulation
from fedsim.config import LoadedScenario, parse_scenario
resource.setrlimit(resource.RLIMIT_NOFILE, (300, 300))  # below 2 x 60 + 256
taken = []
class Recording(run_ledgers.DirectoryLock):
    def __init__(self, directory):
        taken.append(str(directory))
        super().__init__(directory)
run_ledgers.DirectoryLock = Recording
loaded = LoadedScenario(parse_scenario(json.loads(sys.argv[1])), None)
result = simulation.run_scenario(loaded, Path(sys.argv[2]))
print(json.dumps({"locks": taken, "applied": result.summary["updates"]["applied"]}))
"""


def _ledgers(out: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted((out / "ledgers").iterdir())}


@pytest.mark.slow
def test_a_run_beyond_the_hard_limit_writes_its_ledgers_under_one_directory_lock(
        tmp_path: Path) -> None:
    data = scenario()
    held = run_scenario(LoadedScenario(parse_scenario(data), None), tmp_path / "held")
    child = subprocess.run(
        [sys.executable, "-c", _CHILD, json.dumps(data), str(tmp_path / "locked")],
        capture_output=True, text=True, timeout=300, check=False,
        env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"})
    assert child.returncode == 0, child.stderr[-2000:]
    report = json.loads(child.stdout.strip().splitlines()[-1])
    assert report["locks"] == [str(tmp_path / "locked" / "ledgers")]
    assert report["applied"] == held.summary["updates"]["applied"] > 0
    ledgers = _ledgers(tmp_path / "locked")
    assert len(ledgers) == 2 * CLIENTS  # every ledger and its mark
    assert ledgers == _ledgers(tmp_path / "held")
    for name in ("metrics.jsonl", "clients.csv"):
        assert (tmp_path / "locked" / name).read_bytes() == (tmp_path / "held" / name).read_bytes()


def test_long_lived_objects_are_spared_for_the_run_and_handed_back() -> None:
    """Within the block what existed at its start, and what existed when the set-up called
    back, is in the collector's permanent generation; all of it is handed back at the end (or
    if the block raises); where something else froze objects first, nothing is changed."""
    import gc

    from fedsim.runtime.simulated.memory import long_lived_spared

    assert gc.get_freeze_count() == 0
    with long_lived_spared() as spare_set_up:
        frozen = gc.get_freeze_count()
        assert frozen > 0
        made = [[k] for k in range(1000)]  # tracked containers made during the set-up
        spare_set_up()
        # (frozen objects freed meanwhile by reference counting lower the count: a fresh
        # clone's run read 999 more for the 1,000 made; without the call, none more)
        assert gc.get_freeze_count() >= frozen + len(made) // 2
    assert gc.get_freeze_count() == 0
    with pytest.raises(RuntimeError), long_lived_spared():
        raise RuntimeError("the run failed")
    assert gc.get_freeze_count() == 0
    gc.freeze()
    try:
        # Frozen objects can still be freed by reference counting meanwhile (the count then
        # falls): nothing is added, and theirs are left frozen (an unfreeze would give 0).
        before = gc.get_freeze_count()
        with long_lived_spared() as spare_set_up:
            spare_set_up()
            assert 0 < gc.get_freeze_count() <= before
        assert 0 < gc.get_freeze_count() <= before
    finally:
        gc.unfreeze()


def test_a_simulation_hands_every_object_back_to_the_collector(tmp_path: Path) -> None:
    """After a run nothing stays frozen: a library call leaves the caller's collector as it
    found it."""
    import gc

    from tests.runtime.test_simulation import scenario

    run_scenario(LoadedScenario(parse_scenario(scenario()), None), tmp_path / "run",
                 message_only=True)
    assert gc.get_freeze_count() == 0
