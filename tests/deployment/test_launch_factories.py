"""``fedsim launch`` with the user's own model and data factories in a module beside the
scenario file, launched from another directory: every process reads the resolved scenario from
the run directory, yet finds the module where ``fedsim run`` finds it (a real mosquitto on
127.0.0.1, stopped by PID)."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

import pytest

from fedsim.cli import main
from fedsim.config import load_scenario
from fedsim.config.factories import SEARCH_ENV
from fedsim.runtime.simulated.simulation import run_scenario
from fedsim.transports.broker import MOSQUITTO_MISSING, find_mosquitto

pytestmark = [
    pytest.mark.mqtt,
    pytest.mark.slow,
    pytest.mark.skipif(find_mosquitto() is None, reason=MOSQUITTO_MISSING),
]

MODULE = textwrap.dedent('''
    import numpy as np
    import torch

    def load(records, seed):
        rng = np.random.default_rng(seed)
        centres = rng.normal(size=(3, 6)) * 3
        def split(n):
            y = rng.integers(0, 3, size=n)
            return (centres[y] + rng.normal(size=(n, 6))).astype(np.float32), y
        x_train, y_train = split(records)
        x_test, y_test = split(records // 4)
        return {"x_train": x_train, "y_train": y_train, "x_test": x_test, "y_test": y_test}

    def net(num_classes, input_shape):
        return torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(input_shape[0], num_classes))
''')

SCENARIO = textwrap.dedent('''
    name: user-factories
    seed: 3
    stop: {windows: 6}
    dataset: {factory: "user_bits:load", options: {records: 800}}
    model: {factory: "user_bits:net"}
    clients:
      groups:
        - {name: c, count: 2, data_share: 1.0, batch_size: 32, sampling: poisson, clip: 1.0,
           noise: 1.0, local_lr: 0.5, speed: 0.001, staleness: {max_versions_behind: 1},
           budget: {epsilon: 8.0, delta: 1.0e-5}}
    server: {window: 1.0, max_staleness: 3}
''')


def test_launched_processes_find_the_factory_module_beside_the_scenario(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    user = tmp_path / "project"
    user.mkdir()
    (user / "user_bits.py").write_text(MODULE)
    scenario = user / "scenario.yaml"
    scenario.write_text(SCENARIO)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)  # neither the launcher's nor the processes' directory holds it
    monkeypatch.delenv(SEARCH_ENV, raising=False)
    out = tmp_path / "launch"
    code = main(["launch", str(scenario), "--allow-factory", "--out", str(out), "--time-scale", "0.25",
                 "--max-backoff", "1", "--no-plots", "--timeout", "90"])
    logs = {p.name: p.read_text()[-2000:] for p in (out / "logs").glob("*.log")}
    assert code == 0, logs
    summary = json.loads((out / "summary.json").read_text())
    assert summary["windows"] == 6 and summary["updates"]["applied"] > 0
    # The same model and data as the in-process run of the same file.
    simulated = run_scenario(load_scenario(scenario, allow_factories=True), tmp_path / "sim").summary
    assert summary["final_accuracy"] > 0.5 and simulated["final_accuracy"] > 0.5


def test_a_failing_data_factory_stops_the_launch_before_anything_starts(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Every process calls the data factory; the launcher calls it first, so one that fails
    (here: it reads a file relative to a working directory the launch is not in) stops the
    launch with the factory's own error before the broker or any process starts (a
    stranger's started everything, then reported only that the server exited with 2)."""
    user = tmp_path / "project"
    user.mkdir()
    # (a module of its own: the first test's user_bits stays imported in this process)
    (user / "user_files.py").write_text(MODULE + textwrap.dedent('''
        def from_file(name, seed):
            import json
            with open(name) as handle:  # relative to the working directory
                return load(json.load(handle)["records"], seed)
    '''))
    (user / "sizes.json").write_text('{"records": 800}')
    scenario = user / "scenario.yaml"
    scenario.write_text(SCENARIO.replace('{factory: "user_bits:load", options: {records: 800}}',
                                         '{factory: "user_files:from_file", '
                                         'options: {name: sizes.json}}').replace(
                                             '"user_bits:net"', '"user_files:net"'))
    monkeypatch.chdir(tmp_path)  # sizes.json is in project/, not here
    monkeypatch.delenv(SEARCH_ENV, raising=False)
    out = tmp_path / "launch"
    code = main(["launch", str(scenario), "--allow-factory", "--out", str(out),
                 "--no-plots", "--timeout", "60"])
    err = capsys.readouterr().err
    assert code != 0 and "sizes.json" in err and "Traceback" not in err, err
    assert not (out / "logs" / "server.log").exists() and not (out / "broker").exists()
