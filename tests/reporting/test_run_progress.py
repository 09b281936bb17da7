"""RunProgress: hidden off a terminal, shows time/window/accuracy/budget when on."""

from __future__ import annotations

import io

import pytest

from fedsim.errors import ConfigError
from fedsim.reporting.progress import RunProgress


def test_disabled_when_the_stream_is_not_a_terminal() -> None:
    stream = io.StringIO()
    with RunProgress(100.0, stream=stream) as progress:
        assert progress.enabled is False
        progress.update(10.0, 1, accuracy=0.5, min_remaining_epsilon=1.5)
    assert stream.getvalue() == ""
    assert progress.position == 10.0


def test_shows_the_fields_in_virtual_time() -> None:
    stream = io.StringIO()
    with RunProgress(100.0, unit="time", enabled=True, stream=stream) as progress:
        progress.update(12.5, 3, accuracy=0.8125, min_remaining_epsilon=0.75)
        progress.update(20.0, 4)  # not evaluated: the last accuracy stays shown
        assert progress.postfix["acc"] == "0.8125"
        progress.update(150.0, 9, accuracy=0.9)  # past the end: clamped to the total
    final_line = stream.getvalue().rsplit("\r", 1)[-1]  # tqdm throttles; the close draws last
    assert "acc=0.9000" in final_line and "min eps left=0.750" in final_line
    assert "t=150.0s" in final_line and "window=9" in final_line
    assert progress.position == 100.0
    assert "100.0/100.0" in final_line


def test_counts_windows_and_never_moves_back() -> None:
    stream = io.StringIO()
    with RunProgress(10, unit="windows", enabled=True, stream=stream) as progress:
        progress.update(5.0, 4)
        progress.update(3.0, 2)  # a late, older report does not move the bar back
        assert progress.position == 4.0
    assert "4/10" in stream.getvalue()


def test_unknown_total_and_bad_arguments() -> None:
    with RunProgress(None, enabled=True, stream=io.StringIO()) as progress:
        progress.update(7.0, 2, accuracy=0.1)
    assert progress.position == 7.0
    with pytest.raises(ConfigError):
        RunProgress(-1.0)
    with pytest.raises(ConfigError):
        RunProgress(10.0, unit="epochs")  # type: ignore[arg-type]


def test_total_can_change_and_log_lines_go_through_the_bar() -> None:
    from fedsim.logging import configure_logging, get_logger

    stream = io.StringIO()
    configure_logging(json=True)
    with RunProgress(100.0, enabled=True, stream=stream) as progress:
        progress.update(10.0, 1, active_clients=4)
        progress.set_total(20.0)  # the budgets' end became known
        get_logger("probe").info("through the bar", n=1)
        progress.update(20.0, 2, active_clients=0)
        assert progress.postfix["training"] == "0"
    text = stream.getvalue()
    assert "20.0/20.0" in text.rsplit("\r", 1)[-1]
    (line,) = [s for s in text.replace("\r", "\n").splitlines() if "through the bar" in s]
    assert line.startswith("{") and '"n": 1' in line  # a whole line of its own
    with pytest.raises(ConfigError):
        progress.set_total(0.0)


def test_seconds_show_to_a_tenth_and_the_launch_bar_says_scenario_time() -> None:
    """Issue 27, finding 5: a deployed run's bar showed ``160.7273662500029/1200.0``."""
    stream = io.StringIO()
    with RunProgress(1200.0, enabled=True, stream=stream, clock="scenario") as progress:
        progress.update(160.7273662500029, 643)
    text = stream.getvalue()
    assert "160.7/1200.0" in text and "160.727" not in text
    assert text.rsplit("\r", 1)[-1].startswith("scenario time:")
    virtual = io.StringIO()
    with RunProgress(None, enabled=True, stream=virtual) as progress:  # no total
        progress.update(7.3100000001, 2)
    assert "7.3s" in virtual.getvalue() and "7.31" not in virtual.getvalue()
    assert virtual.getvalue().rsplit("\r", 1)[-1].startswith("virtual time:")


def test_a_terminal_of_no_size_still_shows_the_bar() -> None:
    """A stranger's pty that nobody sized (`script`: 0 columns, 0 lines) drew no bar at all:
    tqdm fitted it to 0 columns and hid it below the screen's last line."""
    import fcntl
    import os
    import pty
    import struct
    import termios

    master, slave = pty.openpty()
    try:
        fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 0, 0, 0, 0))
        with os.fdopen(os.dup(slave), "w", encoding="utf-8") as stream:
            assert stream.isatty() and os.get_terminal_size(stream.fileno()).columns == 0
            with RunProgress(4.0, stream=stream) as progress:
                for step in range(1, 5):
                    progress.update(float(step), step, None, None, 2)
        os.set_blocking(master, False)
        shown = b""
        while True:
            try:
                chunk = os.read(master, 65536)
            except BlockingIOError:
                break
            if not chunk:
                break
            shown += chunk
    finally:
        os.close(master)
        os.close(slave)
    assert b"virtual time: 100%" in shown, shown


def test_the_rate_counts_from_where_the_clock_was_started() -> None:
    """A launch's bar was created before its processes started: its rate counted their
    start-up (a stranger's). start_at restarts the clock at the first window, the bar where
    that window put it."""
    now = [1000.0]
    stream = io.StringIO()
    with RunProgress(100.0, enabled=True, stream=stream) as progress:
        bar = progress._bar
        assert bar is not None
        bar._time = lambda: now[0]  # (tqdm reads its clock through this attribute)
        now[0] += 30.0  # the processes start
        progress.start_at(2.0, 2)
        assert progress.position == 2.0
        for step in range(1, 5):  # then 1 scenario s a wall s
            now[0] += 1.0
            progress.update(2.0 + step, 2 + step)
        shown = bar.format_dict
        assert shown["n"] == 6.0 and shown["elapsed"] == 4.0  # not 34
        assert shown["rate"] == pytest.approx(1.0)
