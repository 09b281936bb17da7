"""Processes a run starts that must not outlive their starter.

The launcher (``fedsim launch``) starts every process of a run, and its private mosquitto, in
a process group of its own, so that a terminal's Ctrl-C (SIGINT to the foreground group)
reaches the launcher alone, which then stops them in the order that loses nothing. Out of
reach of a signal to the launcher's group, they are bound to it instead: the kernel sends each
SIGTERM when the launcher dies first (Linux's ``PR_SET_PDEATHSIG``; elsewhere nothing binds
them). A program that is not Python (mosquitto) is started through this module
(:func:`bound_argv`), which binds itself and then becomes the program (``exec``: same PID).
"""

from __future__ import annotations

import os
import signal
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import NoReturn

__all__ = ["bound_argv", "bound_env", "stop_with_parent"]

_PR_SET_PDEATHSIG = 1


def stop_with_parent(parent: int) -> None:
    """Have the kernel send this process SIGTERM when its parent dies (Linux; nothing
    elsewhere). A parent already gone (``os.getppid()`` is no longer ``parent``) stops it at
    once."""
    if not sys.platform.startswith("linux"):
        return
    import ctypes

    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, int(signal.SIGTERM), 0, 0, 0)
    except (OSError, AttributeError):  # no prctl to ask
        return
    if os.getppid() != parent:
        os.kill(os.getpid(), signal.SIGTERM)


def bound_argv(argv: Sequence[str]) -> list[str]:
    """The command that runs ``argv`` bound to this process (:func:`stop_with_parent`), as
    the same PID (run it with :func:`bound_env`)."""
    return [sys.executable, "-m", __name__, str(os.getpid()), *argv]


def bound_env(env: Mapping[str, str]) -> dict[str, str]:
    """``env`` with this package findable by :func:`bound_argv`'s interpreter (however this
    process found it: an install, ``PYTHONPATH`` or its working directory)."""
    root = str(Path(__file__).resolve().parents[2])
    path = env.get("PYTHONPATH", "")
    return {**env, "PYTHONPATH": os.pathsep.join(filter(None, [root, path]))}


def _run_bound(args: list[str]) -> NoReturn:
    parent, program, *rest = args
    stop_with_parent(int(parent))
    os.execvp(program, [program, *rest])


if __name__ == "__main__":
    _run_bound(sys.argv[1:])
