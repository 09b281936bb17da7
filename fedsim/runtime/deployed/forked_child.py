"""A ``fedsim`` command run in a child forked from the launcher (:class:`ForkedChild`), which
has already imported fedsim and torch: tens of seconds saved per process on a busy machine
against a fresh interpreter (:class:`fedsim.runtime.deployed.launcher.Launcher`, ``fork=True``)."""

from __future__ import annotations

import multiprocessing
import os
import runpy
import signal
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path

from fedsim.atomic import open_log
from fedsim.runtime.deployed.process_title import name_this_process
from fedsim.transports.child_process import stop_with_parent

__all__ = ["ForkedChild"]


class ForkedChild:
    """A child forked from the launcher, which has already imported fedsim and torch (tens of
    seconds on a busy machine, per process), running ``fedsim <argv>``. Same interface as the
    parts of :class:`subprocess.Popen` the launcher uses."""

    def __init__(self, argv: list[str], log: Path, env: Mapping[str, str], name: str) -> None:
        context = multiprocessing.get_context("fork")
        self._process = context.Process(target=_child_main,
                                        args=(argv, str(log), dict(env), os.getpid(), name),
                                        daemon=False)
        self._process.start()
        assert self._process.pid is not None  # set by start()
        self.pid: int = self._process.pid

    def poll(self) -> int | None:
        return self._process.exitcode

    def wait(self, timeout: float | None = None) -> int:
        self._process.join(timeout)
        if self._process.exitcode is None:
            raise subprocess.TimeoutExpired(f"fedsim process {self.pid}", timeout or 0.0)
        return self._process.exitcode

    def send_signal(self, sig: int) -> None:
        if self._process.exitcode is None:
            os.kill(self.pid, sig)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)


def _child_main(argv: list[str], log: str, env: dict[str, str], parent: int,
                name: str) -> None:
    """Entry point of a forked child: in a process group of its own (:meth:`Launcher.start`),
    stopped with SIGTERM if the launcher (``parent``) dies first (Linux), shown by ``ps`` as
    ``fedsim ROLE NAME`` (not the launcher's command line), output to its log, then what
    ``python -m fedsim <argv>`` runs (the package's ``__main__``, as in a child started with
    ``fork=False``), with the environment variables ``env`` set."""
    os.setpgid(0, 0)
    stop_with_parent(parent)
    role = argv[0] if argv else "process"
    name_this_process(f"fedsim {role}" + ("" if name == role else f" {name}"), name)
    os.environ.update(env)
    fd = open_log(Path(log))
    sys.stdout.flush()
    sys.stderr.flush()
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    os.close(fd)
    # The parent's sys.stdout/stderr may not be fds 1/2 (pytest's capture, a notebook).
    sys.stdout = open(1, "w", buffering=1, encoding="utf-8", closefd=False)
    sys.stderr = open(2, "w", buffering=1, encoding="utf-8", closefd=False)
    sys.argv = ["fedsim", *argv]
    code: str | int | None = 0
    try:
        runpy.run_module("fedsim", run_name="__main__", alter_sys=True)
    except SystemExit as exc:
        code = exc.code
    sys.stdout.flush()
    sys.stderr.flush()
    sys.exit(code)
