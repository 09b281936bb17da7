"""``fedsim run``'s Ray flags checked before anything is written (a stranger's misconfigured
runs hung for minutes or left a half-made run directory that refused the rerun)."""

from __future__ import annotations

import socket
import time
from pathlib import Path
from typing import Any

import pytest
import yaml

from fedsim.cli import main
from fedsim.commands import run as run_command
from fedsim.errors import ConfigError
from fedsim.runtime.simulated.ray_executor import ray_available

TINY = {
    "name": "ray-flags", "seed": 1, "stop": {"windows": 2},
    "dataset": {"name": "synthetic", "num_samples": 200, "num_test_samples": 50,
                "num_features": 4, "num_classes": 2},
    "model": {"name": "logreg"},
    "clients": {"groups": [{"name": "a", "count": 2, "batch_size": 8, "clip": 1.0,
                            "noise": 1.0, "speed": 0.01}]},
    "server": {"window": 1.0},
}


def _run(tmp_path: Path, *flags: str) -> tuple[int, Path]:
    scenario = tmp_path / "tiny.yaml"
    scenario.write_text(yaml.safe_dump(TINY), encoding="utf-8")
    out = tmp_path / "run"
    code = main(["run", str(scenario), "--no-plots", "--quiet", "--out", str(out), *flags])
    return code, out


def _free_loopback_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])  # closed on leaving: nothing listens there


@pytest.mark.parametrize("flags", [
    ("--executor", "ray", "--ray-workers", "0"),
    ("--ray-workers", "3"),  # without --executor ray: refused, not ignored
    ("--address", "127.0.0.1:1"),
])
def test_bad_ray_flags_are_refused_before_a_run_directory_is_made(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], flags: tuple[str, ...]) -> None:
    if flags[0] == "--executor" and not ray_available():
        pytest.skip("ray is not installed")
    code, out = _run(tmp_path, *flags)
    assert code == 2 and not out.exists()
    assert "--ray-workers" in capsys.readouterr().err or "--address" in str(flags)


@pytest.mark.skipif(not ray_available(), reason="ray is not installed")
def test_an_unreachable_address_fails_at_once_and_leaves_no_directory(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    address = f"127.0.0.1:{_free_loopback_port()}"
    started = time.monotonic()
    code, out = _run(tmp_path, "--executor", "ray", "--address", address)
    assert time.monotonic() - started < 20
    assert code == 2 and not out.exists()
    assert f"--address {address}: no Ray cluster answers there" in capsys.readouterr().err


def test_a_run_that_fails_at_start_removes_the_directory_it_made(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def failing(args: Any) -> Any:
        def make(population: Any) -> Any:
            raise ConfigError("the workers could not start")
        return make

    monkeypatch.setattr(run_command, "_batcher", failing)
    code, out = _run(tmp_path)
    assert code == 2 and not out.exists()
    # A directory that was there before is left as it was.
    out.mkdir()
    (out / "notes.txt").write_text("mine", encoding="utf-8")
    code, out = _run(tmp_path)
    assert code == 2 and (out / "notes.txt").read_text(encoding="utf-8") == "mine"


def test_a_run_that_failed_after_charging_a_round_keeps_its_directory(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The clean-up removes no privacy record: a failure after any ledger recorded a spend
    (here before the first window's line) leaves the run directory, ledgers and all."""
    from fedsim.runtime.simulated import simulation

    real = simulation.run_scenario

    def charged_then_failed(loaded: Any, out: Path, **kwargs: Any) -> Any:
        ledger = out / "ledgers" / "c-000.jsonl"
        ledger.parent.mkdir(parents=True, exist_ok=True)
        ledger.write_bytes(b'{"format": "fedsim-ledger/2"}\n{"time": 0.1, "round": 0}\n')
        (out / "metrics.jsonl").touch()
        raise ConfigError("the workers failed after the first rounds")

    monkeypatch.setattr(simulation, "run_scenario", charged_then_failed)
    code, out = _run(tmp_path)
    assert code == 2 and (out / "ledgers" / "c-000.jsonl").exists()
    # ... a record cut short counts too, and a header alone does not
    monkeypatch.setattr(simulation, "run_scenario", real)
    from fedsim.privacy.ledger_open import holds_records

    header_only, cut = tmp_path / "h.jsonl", tmp_path / "c.jsonl"
    header_only.write_bytes(b'{"format": "fedsim-ledger/2"}\n')
    cut.write_bytes(b'{"format": "fedsim-ledger/2"}\n{"time": 0.')
    assert not holds_records(header_only) and holds_records(cut)
    assert holds_records(tmp_path / "unreadable-because-absent.jsonl")
