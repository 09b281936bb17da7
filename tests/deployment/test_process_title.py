"""A launched run's forked processes say who they are in ``ps`` (not the launcher's command
line, which every forked child otherwise shows)."""

from __future__ import annotations

import multiprocessing
import signal
import sys
import time
from pathlib import Path

import pytest

from fedsim.runtime.deployed import forked_child
from fedsim.runtime.deployed.forked_child import ForkedChild
from fedsim.runtime.deployed.process_title import name_this_process

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="Linux's /proc")


def _shown(pid: int, want: str, timeout: float = 10.0) -> tuple[str, str]:
    """``pid``'s command line (NULs as spaces, trailing ones dropped) and short name, read
    until the command line is ``want`` or ``timeout`` passes."""
    deadline = time.monotonic() + timeout
    while True:
        args = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode().rstrip()
        comm = Path(f"/proc/{pid}/comm").read_text().strip()
        if args == want or time.monotonic() > deadline:
            return args, comm
        time.sleep(0.02)


def _fitting(title: str) -> str:
    """``title`` as a forked child of this process can show it: cut to the room of this
    process's own command line (less its last NUL), which the child inherits (`python -m
    pytest -q` leaves 19 bytes)."""
    room = len(Path("/proc/self/cmdline").read_bytes())
    return title.encode()[: room - 1].decode(errors="ignore")


def _named_then_wait(title: str, short: str, told: multiprocessing.Queue) -> None:  # type: ignore[type-arg]
    told.put(name_this_process(title, short))
    time.sleep(30)


def test_a_process_names_itself_within_its_command_lines_room() -> None:
    context = multiprocessing.get_context("fork")
    told = context.Queue()
    long_name = "a-client-id-longer-than-fifteen-bytes"
    child = context.Process(target=_named_then_wait,
                            args=(f"fedsim client {long_name}", long_name, told))
    child.start()
    try:
        assert told.get(timeout=10) is True
        assert child.pid is not None
        args, comm = _shown(child.pid, _fitting(f"fedsim client {long_name}"))
        assert args == _fitting(f"fedsim client {long_name}") and args.startswith("fedsim")
        assert comm == long_name[:15]  # the kernel's limit
    finally:
        child.kill()
        child.join()


def test_a_title_longer_than_the_command_line_is_cut_not_spilled() -> None:
    context = multiprocessing.get_context("fork")
    told = context.Queue()
    room = len(Path("/proc/self/cmdline").read_bytes())
    child = context.Process(target=_named_then_wait, args=("x" * (room + 500), "x", told))
    child.start()
    try:
        assert told.get(timeout=10) is True
        assert child.pid is not None
        raw = Path(f"/proc/{child.pid}/cmdline").read_bytes()
        # Within the original area, ending in its NUL: nothing read from the environment.
        assert raw.rstrip(b"\0") == b"x" * (room - 1)
        assert len(raw) == room
    finally:
        child.kill()
        child.join()


def test_a_launched_child_shows_its_role_and_name(tmp_path: Path,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    # The child is forked from this process: what it would run is replaced by a wait (the
    # title is set before it), so no broker is needed.
    monkeypatch.setattr(forked_child.runpy, "run_module", lambda *a, **k: time.sleep(30))
    children = [
        (ForkedChild(["client", "--client-id", "phone-000"], tmp_path / "phone.log", {},
                     "phone-000"),
         "fedsim client phone-000", "phone-000"),
        (ForkedChild(["server", "--state", "s"], tmp_path / "server.log", {}, "server"),
         "fedsim server", "server"),
    ]
    try:
        for child, title, short in children:
            assert _shown(child.pid, _fitting(title)) == (_fitting(title), short)
    finally:
        for child, _, _ in children:
            child.send_signal(signal.SIGKILL)
            child.wait(10)


def test_a_name_outside_ascii_is_shown_and_cut_at_a_character() -> None:
    """A review's non-ASCII short name made the stat file's text read fail (the title was
    never written), and cuts fell inside a character."""
    context = multiprocessing.get_context("fork")
    told = context.Queue()
    name = "é" * 20
    child = context.Process(target=_named_then_wait, args=(f"fedsim client {name}", name, told))
    child.start()
    try:
        assert told.get(timeout=10) is True
        assert child.pid is not None
        comm = Path(f"/proc/{child.pid}/comm").read_bytes().rstrip(b"\n")
        assert comm == ("é" * 7).encode()  # 14 of the 15 bytes: no half character
        shown = Path(f"/proc/{child.pid}/cmdline").read_bytes().rstrip(b"\0").decode()
        assert shown == f"fedsim client {name}"[: len(shown)] and shown.startswith("fedsim")
    finally:
        child.kill()
        child.join()
