"""TensorBoard scalars are written as the run goes, window by window, so a long run can be
watched (issue 27, finding 10); the per-client epsilon curves follow when it ends."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path
from typing import Any

import pytest
import torch

from fedsim.config import LoadedScenario, parse_scenario
from fedsim.reporting.tensorboard import LiveExport, tensorboard_during
from fedsim.runtime.simulated.simulation import run_scenario

torch.set_num_threads(1)

SCENARIO = {
    "name": "tb-live", "seed": 4, "stop": {"windows": 9},
    "dataset": {"name": "synthetic", "num_samples": 400, "num_test_samples": 100,
                "num_features": 6, "num_classes": 3},
    "model": {"name": "logreg"},
    "clients": {"groups": [
        {"name": "a", "count": 2, "data_share": 1.0, "batch_size": 16, "clip": 1.0,
         "noise": 1.0, "speed": 0.01, "budget": {"epsilon": 5.0, "delta": 1e-5}}]},
    "server": {"window": 1.0, "eval_every": 3},
}


class FakeWriter:
    """Records every call in order (the test's stand-in for SummaryWriter)."""

    def __init__(self, log_dir: Path) -> None:
        self.log_dir = log_dir
        self.calls: list[tuple[Any, ...]] = []

    def add_scalar(self, tag: str, scalar_value: float, global_step: int | None = None,
                   walltime: float | None = None) -> None:
        self.calls.append(("scalar", tag, scalar_value, global_step, walltime))

    def flush(self) -> None:
        self.calls.append(("flush",))

    def close(self) -> None:
        self.calls.append(("close",))


def test_each_window_is_written_and_flushed_when_it_closes(tmp_path: Path) -> None:
    writers: list[FakeWriter] = []

    def make(log_dir: Path) -> FakeWriter:
        writers.append(FakeWriter(log_dir))
        return writers[-1]

    live = LiveExport(tmp_path / "tb", make_writer=make)
    (writer,) = writers
    seen_at_window: dict[int, int] = {}

    def on_window(line: dict[str, Any]) -> None:
        live.window(line)
        seen_at_window[line["window"]] = len(writer.calls)

    out = tmp_path / "run"
    run_scenario(LoadedScenario(parse_scenario(SCENARIO), None), out, on_window=on_window)
    metrics = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    for line in metrics:  # by the time window k was reported, its scalars were flushed
        window = line["window"]
        done = writer.calls[:seen_at_window[window]]
        assert done[-1] == ("flush",)
        written = {(c[1], c[3]): c[2] for c in done if c[0] == "scalar"}
        assert written[("window/applied", window)] == line["applied"]
        assert written[("window/time", window)] == line["time"]
        if line["accuracy"] is not None:
            assert written[("window/accuracy", window)] == line["accuracy"]
        assert ("window/accuracy", window + 1) not in written  # nothing from the future
    assert not any(c[0] == "scalar" and c[1].startswith("epsilon") for c in writer.calls)
    live.finish(out)
    tags = {c[1] for c in writer.calls if c[0] == "scalar"}
    assert {"epsilon/a-000", "epsilon/a-001", "epsilon_summary/max"} <= tags
    assert writer.calls[-1] == ("close",)


@pytest.mark.skipif(importlib.util.find_spec("tensorboard") is None,
                    reason="the fedsim[tensorboard] extra is not installed")
def test_the_event_file_holds_the_windows_while_the_run_goes(tmp_path: Path) -> None:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    logs, out = tmp_path / "tb", tmp_path / "run"
    read_during: dict[int, list[int]] = {}

    def steps() -> list[int]:
        events = EventAccumulator(str(logs))
        events.Reload()
        tags = events.Tags()["scalars"]
        return [e.step for e in events.Scalars("window/applied")] if "window/applied" in tags \
            else []

    with tensorboard_during(logs, out) as to_tensorboard:
        def on_window(line: dict[str, Any]) -> None:
            to_tensorboard(line)
            if line["window"] in (2, 5):  # a watcher reading the files mid-run
                read_during[line["window"]] = steps()

        run_scenario(LoadedScenario(parse_scenario(SCENARIO), None), out, on_window=on_window)
    assert read_during == {2: [1, 2], 5: [1, 2, 3, 4, 5]}
    events = EventAccumulator(str(logs))
    events.Reload()
    assert [e.step for e in events.Scalars("window/applied")] == list(range(1, 10))
    assert "epsilon/a-000" in events.Tags()["scalars"]  # added when the run ended
