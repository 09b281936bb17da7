"""TensorBoard export (the ``fedsim[tensorboard]`` extra): the scalars are the run directory's
numbers, and per-client epsilon is recomputed here from each ledger's steps."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

pytest.importorskip("tensorboard", reason="the fedsim[tensorboard] extra is not installed")

from tensorboard.backend.event_processing.event_accumulator import EventAccumulator  # noqa: E402

import fedsim  # noqa: E402
from fedsim.cli import main  # noqa: E402
from fedsim.privacy.accountant import make_accountant  # noqa: E402
from fedsim.privacy.events import GaussianStep  # noqa: E402


def _scalars(log_dir: Path) -> dict[str, list[tuple[int, float]]]:
    events = EventAccumulator(str(log_dir))
    events.Reload()
    return {tag: [(e.step, e.value) for e in events.Scalars(tag)]
            for tag in events.Tags()["scalars"]}


def test_run_tensorboard_writes_window_and_epsilon_scalars(tiny_scenario: Path,
                                                           tmp_path: Path) -> None:
    out, logs = tmp_path / "run", tmp_path / "tb"
    assert main(["run", str(tiny_scenario), "--out", str(out), "--no-plots",
                 "--tensorboard", str(logs)]) == 0
    scalars = _scalars(logs)
    metrics = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    for field in ("accuracy", "loss", "applied", "received", "active_clients"):
        expected = [(m["window"], m[field]) for m in metrics if m[field] is not None]
        assert [step for step, _ in scalars[f"window/{field}"]] == [w for w, _ in expected]
        assert [value for _, value in scalars[f"window/{field}"]] == pytest.approx(
            [value for _, value in expected], rel=1e-6)  # float32 in the event file
    for ledger in sorted((out / "ledgers").glob("*.jsonl")):
        lines = [json.loads(line) for line in ledger.read_text().splitlines() if line.strip()]
        steps = [GaussianStep.from_json(line["step"]) for line in lines[1:] if "step" in line]
        expected = make_accountant("pld", steps).epsilon(1e-5)
        curve = scalars[f"epsilon/{ledger.stem}"]
        assert curve[-1][1] == pytest.approx(expected, rel=1e-4)  # float32 in the event file
        assert [v for _, v in curve] == sorted(v for _, v in curve)  # spending never falls
        # one point a step, increasing (a stranger saw two values at one step)
        assert [s for s, _ in curve] == sorted({s for s, _ in curve})
    finals = [scalars[f"epsilon/{p.stem}"][-1][1] for p in (out / "ledgers").glob("*.jsonl")]
    assert scalars["epsilon_summary/max"][-1][1] == pytest.approx(max(finals))
    # The final model's evaluation (a stranger's run shorter than eval_every had no accuracy).
    summary = json.loads((out / "summary.json").read_text())
    assert scalars["final/accuracy"] == [(metrics[-1]["window"], pytest.approx(
        summary["final_accuracy"], rel=1e-6))]
    assert scalars["final/loss"][0][1] == pytest.approx(summary["final_loss"], rel=1e-6)


def test_simulate_tensorboard_without_a_run_directory(tiny_scenario: Path, tmp_path: Path) -> None:
    result = fedsim.simulate(tiny_scenario, tensorboard=tmp_path / "tb", progress=False)
    scalars = _scalars(tmp_path / "tb")
    assert result.run_dir is None
    assert scalars["window/accuracy"][-1][1] == pytest.approx(result.final_accuracy)
    assert {tag.split("/")[1] for tag in scalars if tag.startswith("epsilon/")} == {
        c.client_id for c in result.clients}
