"""fedsim.logging: JSON lines off a terminal, console on one, level filter, idempotence."""

from __future__ import annotations

import json
import logging
import os
import pty
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import structlog

from fedsim.errors import ConfigError
from fedsim.logging import configure_logging, get_logger

SNIPPET = (
    "from fedsim.logging import configure_logging, get_logger; "
    "configure_logging(); get_logger('probe').info('window closed', window=3, accuracy=0.5)"
)


def _lines(text: str) -> list[str]:
    return [line for line in text.splitlines() if line.strip()]


def test_json_lines_when_stderr_is_not_a_terminal(capsys: pytest.CaptureFixture[str]) -> None:
    assert configure_logging() is True  # pytest's captured stderr is not a terminal
    get_logger("runtime", client="c1").info("update sent", round=4, bytes=1024)
    (line,) = _lines(capsys.readouterr().err)
    record = json.loads(line)
    assert record["event"] == "update sent"
    assert record["logger"] == "runtime" and record["client"] == "c1"
    assert record["round"] == 4 and record["bytes"] == 1024
    assert record["level"] == "info"
    assert record["timestamp"].endswith("Z")


def test_console_renderer_when_forced(capsys: pytest.CaptureFixture[str]) -> None:
    assert configure_logging(json=False) is False
    get_logger("runtime").warning("budget low", client="c9")
    (line,) = _lines(capsys.readouterr().err)
    with pytest.raises(json.JSONDecodeError):
        json.loads(line)
    assert "budget low" in line and "c9" in line


def test_level_filter_and_reconfiguration_is_idempotent(capsys: pytest.CaptureFixture[str]) -> None:
    configure_logging(json=True, level="warning")
    configure_logging(json=True, level="warning")  # a second call must not duplicate output
    log = get_logger("x")
    log.info("hidden")
    log.warning("shown")
    lines = _lines(capsys.readouterr().err)
    assert [json.loads(line)["event"] for line in lines] == ["shown"]
    configure_logging(json=True, level="debug")
    log.debug("now visible")
    assert [json.loads(line)["event"] for line in _lines(capsys.readouterr().err)] == ["now visible"]


def test_unknown_level_is_a_config_error() -> None:
    with pytest.raises(ConfigError, match="log level"):
        configure_logging(level="loud")


def test_process_logs_json_to_a_pipe_and_console_to_a_terminal() -> None:
    piped = subprocess.run([sys.executable, "-c", SNIPPET], capture_output=True, text=True,
                           timeout=60, check=True)
    record = json.loads(piped.stderr.strip())
    assert record["event"] == "window closed" and record["window"] == 3
    assert piped.stdout == ""  # logs never go to stdout

    leader, follower = pty.openpty()
    try:
        proc = subprocess.run([sys.executable, "-c", SNIPPET], stderr=follower,
                              stdout=subprocess.DEVNULL, timeout=60, check=True)
        assert proc.returncode == 0
        os.close(follower)
        follower = -1
        output = b""
        while True:
            try:
                chunk = os.read(leader, 4096)
            except OSError:  # the terminal closed: all output read
                break
            if not chunk:
                break
            output += chunk
    finally:
        os.close(leader)
        if follower >= 0:
            os.close(follower)
    text = output.decode("utf-8", "replace")
    assert "window closed" in text
    assert not text.lstrip().startswith("{")  # a console line, not JSON


@pytest.fixture
def unconfigured_structlog() -> Iterator[None]:
    """structlog as a program that never configured it has it; the configuration is restored."""
    was_configured, config = structlog.is_configured(), structlog.get_config()
    structlog.reset_defaults()
    yield
    if was_configured:
        structlog.configure(**config)
    else:
        structlog.reset_defaults()


def test_unconfigured_lines_go_to_the_standard_library(
        unconfigured_structlog: None, capsys: pytest.CaptureFixture[str],
        caplog: pytest.LogCaptureFixture) -> None:
    log = get_logger("fedsim.probe", run="r1")
    with caplog.at_level(logging.INFO, logger="fedsim"):
        log.debug("not asked for", window=1)
        log.info("client stopped", client="c1", reason="budget spent")
        log.bind(window=2).warning("late")
        try:
            raise ValueError("bad")
        except ValueError:
            log.exception("failed")
    assert [(r.name, r.levelno, r.getMessage()) for r in caplog.records] == [
        ("fedsim.probe", logging.INFO, "client stopped client=c1 reason='budget spent' run=r1"),
        ("fedsim.probe", logging.WARNING, "late run=r1 window=2"),
        ("fedsim.probe", logging.ERROR, "failed run=r1"),
    ]
    assert caplog.records[-1].exc_info is not None
    assert caplog.records[-1].exc_info[0] is ValueError
    assert capsys.readouterr().out == ""  # never stdout
    # Configured (the CLI, or the program's own structlog.configure): structlog's way again.
    configure_logging(json=True)
    log.info("configured", window=3)
    assert json.loads(capsys.readouterr().err)["event"] == "configured"


def test_simulate_logs_its_evaluations_at_info_and_prints_nothing(
        unconfigured_structlog: None, tmp_path: Path, capsys: pytest.CaptureFixture[str],
        caplog: pytest.LogCaptureFixture) -> None:
    """docs/API.md: ``logging.basicConfig(level=logging.INFO)`` shows a simulation's progress.
    A stranger's review (session 56) found only the windows' event counts there: the lines for
    each evaluation were the CLI's alone. Both log them through one function now."""
    import fedsim
    from tests.api.conftest import TINY

    with caplog.at_level(logging.INFO, logger="fedsim"):
        result = fedsim.simulate(TINY, out=None, progress=False)
    windows = [r for r in caplog.records if r.name == "fedsim.run" and r.getMessage().startswith(
        "window ")]
    evaluated = [line for line in result.windows if line["accuracy"] is not None]
    assert len(windows) == len(evaluated) > 0
    assert f"accuracy={evaluated[-1]['accuracy']}" in windows[-1].getMessage()
    assert capsys.readouterr().out == ""  # never stdout
