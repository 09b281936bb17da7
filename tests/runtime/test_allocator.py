"""The process's allocator (fedsim.runtime.allocator): fedsim's processes keep freed memory
for the next training step instead of faulting it in again, free heap pages are given back
when many are free, and a user's own allocator settings are left alone."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from fedsim.errors import ConfigError
from fedsim.runtime import allocator
from fedsim.runtime.allocator import (
    free_heap_bytes,
    keep_freed_memory,
    release_free_memory,
    user_tuned,
)

ROOT = Path(__file__).resolve().parents[2]

# A step's worth of tensors at the same sizes every step (as a training step allocates
# activations and gradients): eight blocks of 16 MB, touched, freed, again; minor page faults
# of the repeats, counted after the first.
_STEPS = """
import json, resource, sys
import numpy as np
from fedsim.runtime.allocator import keep_freed_memory
kept = keep_freed_memory() if sys.argv[1] == "keep" else None
def step():
    blocks = [np.ones(4 * 2**20, dtype=np.float32) for _ in range(8)]
    return sum(float(b[::4096].sum()) for b in blocks)
step()
before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
for _ in range(10):
    step()
faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before
print(json.dumps({"kept": kept, "faults_per_step": faults / 10}))
"""


def _glibc_mallopt() -> bool:
    return allocator._MALLOPT is not None


def _steps(mode: str, **env: str) -> dict[str, float]:
    clean = {k: v for k, v in os.environ.items()
             if not k.startswith("MALLOC_") and k not in ("GLIBC_TUNABLES", "FEDSIM_ALLOCATOR")}
    done = subprocess.run([sys.executable, "-c", _STEPS, mode], capture_output=True, text=True,
                          timeout=120, check=False,
                          env={**clean, "PYTHONPATH": str(ROOT), **env})
    assert done.returncode == 0, done.stderr[-2000:]
    result: dict[str, float] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


def test_kept_freed_memory_is_not_faulted_in_again_each_step() -> None:
    """glibc's adaptive thresholds give part of a 128 MB step's freed heap back to the system
    and the next step faults it in again (4,122 pages a step here, every step); with the
    thresholds fixed nothing is faulted in after the first step (0)."""
    if not _glibc_mallopt():
        pytest.skip("no glibc mallopt here: the allocator is left as it is")
    default = _steps("default")
    kept = _steps("keep")
    assert kept["kept"] is True
    assert default["faults_per_step"] > 2_000, default  # 8 MB or more faulted in again
    assert kept["faults_per_step"] < 100, kept


def test_a_users_own_allocator_settings_are_left_alone() -> None:
    assert not user_tuned({})
    assert not user_tuned({"FEDSIM_ALLOCATOR": "keep", "GLIBC_TUNABLES": "glibc.pthread.x=1"})
    for env in ({"MALLOC_TRIM_THRESHOLD_": "0"}, {"MALLOC_ARENA_MAX": "2"},
                {"MALLOC_PERTURB_": "165"},
                {"GLIBC_TUNABLES": "glibc.malloc.trim_threshold=0"},
                {"FEDSIM_ALLOCATOR": "system"}):
        assert user_tuned(env), env
        assert keep_freed_memory(env) is False, env
    with pytest.raises(ConfigError, match="FEDSIM_ALLOCATOR must be 'keep' or 'system'"):
        keep_freed_memory({"FEDSIM_ALLOCATOR": "jemalloc"})
    if _glibc_mallopt():  # and a process told to leave it alone faults as glibc does
        left = _steps("keep", FEDSIM_ALLOCATOR="system")
        assert left["kept"] is False and left["faults_per_step"] > 2_000, left


def test_every_fedsim_command_keeps_freed_memory(monkeypatch: pytest.MonkeyPatch) -> None:
    """The command line sets it (its process is fedsim's); a library call does not
    (tests/api/test_library_allocator.py)."""
    from fedsim import cli

    calls: list[object] = []
    monkeypatch.setattr(allocator, "keep_freed_memory", lambda *a: calls.append(a) or True)
    assert cli.main(["validate", str(ROOT / "scenarios" / "quickstart.yaml")]) == 0
    assert calls == [()]


def test_a_bad_allocator_choice_is_a_clear_command_error(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from fedsim import cli

    monkeypatch.setenv("FEDSIM_ALLOCATOR", "tcmalloc")
    assert cli.main(["validate", str(ROOT / "scenarios" / "quickstart.yaml")]) == 2
    assert "FEDSIM_ALLOCATOR must be 'keep' or 'system'" in capsys.readouterr().err


def test_free_heap_pages_are_given_back_only_when_many_are_free() -> None:
    """Trimming at every window on a small population made the next rounds fault their pages
    in again (about 15% of hetero-100's CPU): below the threshold nothing is trimmed."""
    before = free_heap_bytes()
    if before is None:
        pytest.skip("the allocator's free bytes are unknown here (not glibc >= 2.33)")
    assert release_free_memory(threshold=before + 2**40, live_multiple=0) is False
    assert release_free_memory(threshold=0, live_multiple=0) is True
    after = free_heap_bytes()
    assert after is not None and after <= before + 2**20


@pytest.mark.parametrize(("free_mb", "used_mb", "trims"), [
    (800, 550, False),  # a window's traffic at 1,000 clients: the next window's memory
    (1_200, 500, True),  # more than twice the live heap free: fragmentation
    (300, 100, True),
    (200, 10, False),  # under TRIM_FREE_BYTES
])
def test_the_free_heap_is_trimmed_past_twice_the_live_heap(
    monkeypatch: pytest.MonkeyPatch, free_mb: int, used_mb: int, trims: bool,
) -> None:
    from fedsim.runtime import allocator

    calls: list[int] = []
    info = allocator._MallInfo2()
    info.fordblks, info.uordblks = free_mb * 2**20, used_mb * 2**20
    monkeypatch.setattr(allocator, "_INFO", lambda: info)
    monkeypatch.setattr(allocator, "_TRIM", lambda pad: calls.append(pad) or 1)
    assert allocator.release_free_memory() is trims
    assert calls == ([0] if trims else [])


def test_a_refused_mmap_threshold_leaves_the_trim_threshold_alone(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Where glibc refuses the 32 MB mmap threshold (a 32-bit glibc's largest is smaller),
    neither threshold is changed: not half of the policy."""
    seen: list[tuple[int, int]] = []

    def refusing(param: int, value: int) -> int:
        seen.append((param, value))
        return 0 if param == allocator._M_MMAP_THRESHOLD else 1

    monkeypatch.setattr(allocator, "_MALLOPT", refusing)
    assert keep_freed_memory({}) is False
    assert seen == [(allocator._M_MMAP_THRESHOLD, allocator.MMAP_THRESHOLD_BYTES)]
