"""A scenario that names a factory makes this machine import and call Python code: without the
explicit opt-in (``--allow-factory``, ``allow_factories=True``) no command runs it (issue 25,
finding 8). Each attack names a harmful callable (``subprocess:call``, ``os:system``) that
would create a file; the file must not appear and the refusal must name the opt-in."""

from __future__ import annotations

import textwrap
from pathlib import Path
from typing import Any

import pytest
import yaml

import fedsim
from fedsim.cli import main
from fedsim.config import load_scenario
from fedsim.errors import ConfigError
from fedsim.runtime.deployed.options import DeploymentOptions
from fedsim.runtime.deployed.process_commands import process_commands
from fedsim.runtime.population import build_population


def _scenario(model: dict[str, Any], dataset: dict[str, Any]) -> dict[str, Any]:
    return {
        "name": "factory-attack", "seed": 0, "stop": {"windows": 2},
        "dataset": dataset, "model": model,
        "clients": {"groups": [{"name": "a", "count": 2, "data_share": 0.5, "batch_size": 8,
                                "clip": 1.0, "noise": 1.0, "speed": 0.001}]},
        "server": {"window": 1.0},
    }


def _attacks(target: Path) -> dict[str, dict[str, Any]]:
    """Scenarios whose factory, if called, creates ``target``."""
    return {
        "model-subprocess": _scenario(
            {"factory": "subprocess:call", "options": {"args": ["touch", str(target)]}},
            {"name": "synthetic"}),
        "model-os-system": _scenario(
            {"factory": "os:system", "options": {"command": f"touch {target}"}},
            {"name": "synthetic"}),
        "dataset-os-system": _scenario(
            {"name": "logreg"},
            {"factory": "os:system", "options": {"command": f"touch {target}"}}),
        "loss-os-system": _scenario(
            {"name": "logreg", "loss": "os:system", "loss_options": {"command": f"touch {target}"}},
            {"name": "synthetic"}),
    }


ATTACKS = ["model-subprocess", "model-os-system", "dataset-os-system", "loss-os-system"]


@pytest.fixture
def attack_file(tmp_path: Path, request: pytest.FixtureRequest) -> tuple[Path, Path]:
    target = tmp_path / "pwned"
    file = tmp_path / "attack.yaml"
    file.write_text(yaml.safe_dump(_attacks(target)[request.param]), encoding="utf-8")
    return file, target


COMMANDS = {
    "run": lambda f, d: ["run", str(f), "--out", str(d / "run"), "--no-plots"],
    "sweep": lambda f, d: ["sweep", str(f), "--out", str(d / "sweep"), "--no-plots"],
    "launch": lambda f, d: ["launch", str(f), "--out", str(d / "launch"), "--no-plots"],
    "deploy": lambda f, d: ["deploy", str(f), "--out", str(d / "deploy"), "--plain"],
    "server": lambda f, d: ["server", "--scenario", str(f), "--state", str(d / "server"),
                            "--broker", "mqtt://u:p@127.0.0.1:9"],
    # a deployed client reading the server's scenario
    "client": lambda f, d: ["client", "--scenario", str(f), "--client-id", "a-000",
                            "--state", str(d / "client"), "--broker", "mqtt://u:p@127.0.0.1:9"],
}


@pytest.mark.parametrize("attack_file", ATTACKS, indirect=True)
@pytest.mark.parametrize("command", sorted(COMMANDS))
def test_no_command_runs_a_factory_without_the_opt_in(
    attack_file: tuple[Path, Path], command: str, tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    file, target = attack_file
    status = main(COMMANDS[command](file, tmp_path))
    err = capsys.readouterr().err
    assert not target.exists()
    assert status == 2 and "--allow-factory" in err and "Traceback" not in err, err
    assert not (tmp_path / command / "scenario.resolved.yaml").exists()


@pytest.mark.parametrize("attack_file", ATTACKS, indirect=True)
def test_validate_neither_imports_nor_calls_a_factory(
    attack_file: tuple[Path, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    file, target = attack_file
    assert main(["validate", str(file)]) == 0
    out = capsys.readouterr().out
    assert not target.exists()
    assert "not run:" in out and "--allow-factory" in out and "skipped:" in out
    data_factory = "factory" in yaml.safe_load(file.read_text())["dataset"]
    skipped = "the data, partition" if data_factory else "the model checks"
    assert skipped in out, out
    # With the opt-in the same command does run it: the gate is what stopped it above (a data
    # set factory, code that may fetch its data, runs only when the data is checked too).
    main(["validate", str(file), "--allow-factory", *(["--check-data"] if data_factory else [])])
    capsys.readouterr()
    assert target.exists()


def test_validate_still_checks_the_data_when_only_the_model_is_a_factory(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    tree = _attacks(tmp_path / "pwned")["model-subprocess"]
    tree["clients"]["groups"][0]["batch_size"] = 10**6  # more than any client holds
    file = tmp_path / "s.yaml"
    file.write_text(yaml.safe_dump(tree), encoding="utf-8")
    assert main(["validate", str(file)]) == 2
    assert "batch_size" in capsys.readouterr().err and not (tmp_path / "pwned").exists()


@pytest.mark.parametrize("attack_file", ATTACKS, indirect=True)
def test_the_python_api_refuses_a_named_factory_without_the_opt_in(
    attack_file: tuple[Path, Path]
) -> None:
    file, target = attack_file
    with pytest.raises(ConfigError, match="allow_factories=True"):
        fedsim.simulate(file, progress=False)
    with pytest.raises(ConfigError, match="--allow-factory"):
        build_population(load_scenario(file))
    with pytest.raises(ConfigError, match="allow_factories=True"):  # a dict is no different
        fedsim.simulate(yaml.safe_load(file.read_text()), progress=False)
    assert not target.exists()


LEGITIMATE = textwrap.dedent('''
    import torch

    CALLS = []

    def net(num_classes, input_shape):
        CALLS.append(num_classes)
        return torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(input_shape[0], num_classes))
''')


@pytest.mark.slow
def test_with_the_opt_in_a_legitimate_factory_runs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "opt_in_models.py").write_text(LEGITIMATE, encoding="utf-8")
    monkeypatch.syspath_prepend(str(tmp_path))
    tree = _scenario({"factory": "opt_in_models:net"}, {"name": "synthetic"})
    file = tmp_path / "s.yaml"
    file.write_text(yaml.safe_dump(tree), encoding="utf-8")
    assert main(["run", str(file), "--out", str(tmp_path / "no"), "--no-plots"]) == 2
    assert "--allow-factory" in capsys.readouterr().err
    assert main(["run", str(file), "--out", str(tmp_path / "run"), "--no-plots",
                 "--allow-factory"]) == 0
    assert (tmp_path / "run" / "summary.json").exists()
    result = fedsim.simulate(file, progress=False, allow_factories=True)
    assert result.summary["windows"] == 2
    import opt_in_models  # the module the runs imported

    assert len(opt_in_models.CALLS) == 2


def test_the_opt_in_reaches_every_launched_process() -> None:
    options = DeploymentOptions(broker="mqtt://broker:1883", run="r", allow_factories=True)
    assert DeploymentOptions.from_argv(options.argv()).allow_factories
    commands = process_commands("s.yaml", ["a-000"], options=options, state_root="st", out="o")
    assert all("--allow-factory" in argv for argv in commands.values()), commands
    plain = process_commands("s.yaml", ["a-000"], options=DeploymentOptions(
        broker="mqtt://broker:1883", run="r"), state_root="st", out="o")
    assert not any("--allow-factory" in argv for argv in plain.values())
