"""The deployed processes' command lines: bad input is a clear error (exit 2), never a
traceback, and the commands the launcher runs parse as valid fedsim invocations."""

from __future__ import annotations

from pathlib import Path

import pytest

from fedsim.cli import build_parser, main
from fedsim.config import load_scenario
from fedsim.errors import ConfigError
from fedsim.runtime.deployed.options import DeploymentOptions
from fedsim.runtime.deployed.process_commands import earlier_commands, process_commands
from fedsim.runtime.population import client_ids

SCENARIO = Path(__file__).with_name("four_clients.yaml")


def test_every_launched_command_is_a_valid_fedsim_invocation(tmp_path: Path) -> None:
    ids = client_ids(load_scenario(SCENARIO).scenario)
    commands = process_commands(
        SCENARIO,
        ids,
        options=DeploymentOptions(
            broker="mqtt://broker:1883",
            run="deploy-four",
            secrets_file=str(tmp_path / "secrets.json"),
            time_scale=0.5,
            tls_ca="/certs/ca.pem",
            tls_insecure=True,
        ),
        state_root="/state",
        out="/out",
    )
    assert list(commands) == [*ids, "server"]
    parser = build_parser()
    for name, argv in commands.items():
        assert argv[0] == "fedsim"
        args = parser.parse_args(argv[1:])
        assert args.command == ("server" if name == "server" else "client")
        assert args.time_scale == 0.5 and args.broker == "mqtt://broker:1883"
        assert args.state == f"/state/{name}"
        assert args.tls_ca == "/certs/ca.pem" and args.tls_insecure
        if name != "server":
            assert args.client_id == name


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (
            ["client", "--client-id", "nobody", "--broker", "mqtt://127.0.0.1:9"],
            "'nobody' is not a client of scenario 'deploy-four'",
        ),
        (
            ["client", "--client-id", "c-000", "--broker", "http://127.0.0.1:9"],
            "must start with mqtt:// or mqtts://",
        ),
        (
            ["server", "--time-scale", "-1", "--broker", "mqtt://127.0.0.1:9"],
            "--time-scale must be a positive number",
        ),
        (["server", "--run", "bad/run", "--broker", "mqtt://127.0.0.1:9"], "run name 'bad/run'"),
        (["server"], "no broker"),
    ],
)
def test_bad_input_is_a_clear_error(
    argv: list[str], message: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys
) -> None:
    monkeypatch.delenv("FEDSIM_BROKER", raising=False)
    monkeypatch.delenv("FEDSIM_SECRETS", raising=False)
    code = main([*argv, "--scenario", str(SCENARIO), "--state", str(tmp_path / "state")])
    assert code == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err


def test_launch_refuses_a_directory_that_holds_ledgers(tmp_path: Path, capsys) -> None:
    (tmp_path / "ledgers").mkdir()
    (tmp_path / "ledgers" / "c-000.jsonl").write_text("{}\n")
    assert main(["launch", str(SCENARIO), "--out", str(tmp_path)]) == 2
    assert "already holds a run's ledgers" in capsys.readouterr().err


@pytest.mark.parametrize(
    "options",
    [
        DeploymentOptions(),
        DeploymentOptions(
            time_scale=0.25,
            max_backoff=3.0,
            wait_for_clients=12.5,
            json_logs=False,
            broker="mqtts://u:p@host:8883",
            secrets_file="/run/secrets.json",
            run="r1",
            tls_ca="/ca.pem",
            tls_cert="/c.pem",
            tls_key="/k.pem",
            tls_insecure=True,
        ),
        DeploymentOptions(json_logs=True, broker="mqtt://b:1883"),
    ],
)
def test_deployment_options_round_trip_through_argv(options: DeploymentOptions) -> None:
    argv = options.argv() + options.server_argv()
    assert DeploymentOptions.from_argv(argv) == options
    # ... and through the server command's own parser.
    args = build_parser().parse_args(["server", "--scenario", str(SCENARIO), *argv])
    assert DeploymentOptions.from_args(args) == options


@pytest.mark.parametrize(
    ("field", "value", "message"),
    [
        ("time_scale", 0.0, "--time-scale must be a positive number"),
        ("max_backoff", float("nan"), "--max-backoff must be a positive number"),
        ("wait_for_clients", -1.0, "--wait-for-clients must be a number of seconds >= 0"),
    ],
)
def test_deployment_options_refuse_bad_values(field: str, value: float, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        DeploymentOptions(**{field: value})


def test_client_commands_do_not_take_the_servers_option() -> None:
    argv = DeploymentOptions(broker="mqtt://b:1").argv()
    args = build_parser().parse_args(
        ["client", "--scenario", str(SCENARIO), "--client-id", "c-000", *argv]
    )
    assert not hasattr(args, "wait_for_clients")
    assert DeploymentOptions.from_args(args).wait_for_clients == 0.0


def test_a_resumed_launch_keeps_every_parts_command_line() -> None:
    """processes.json keeps the command lines of a resumed launch's earlier parts that differ
    from the last one's (it kept only the last part's); a damaged entry adds nothing."""
    first = ["fedsim", "client", "s.yaml", "--time-scale", "1.0"]
    second = ["fedsim", "client", "s.yaml", "--time-scale", "0.5"]
    assert earlier_commands({"command": first}, first) == []
    assert earlier_commands({"command": first}, second) == [first]
    assert earlier_commands({"command": second, "earlier_commands": [first]}, first) == [
        first, second]
    assert earlier_commands({"command": second, "earlier_commands": [first]}, second) == [first]
    assert earlier_commands({"command": first, "earlier_commands": [first]}, second) == [first]
    damaged = {"command": "fedsim client", "earlier_commands": [[1, 2], "x", first]}
    assert earlier_commands(damaged, second) == [first]
    assert earlier_commands({"earlier_commands": 7}, second) == []
    # A private broker's port changes at every start: not a command of its own.
    on_port = [*first, "--broker", "mqtt://127.0.0.1:40001"]
    assert earlier_commands({"command": on_port}, [*first, "--broker",
                                                    "mqtt://127.0.0.1:40002"]) == []
    assert earlier_commands({"command": on_port}, [*second, "--broker=mqtt://h:1"]) == [on_port]
