"""A forked process's name as ``ps`` and ``top`` show it.

``fedsim launch`` forks its server, aggregation nodes and clients from itself (torch is
imported once), so each child's command line is the launcher's own: ``ps`` showed the same
``fedsim launch SCENARIO`` a dozen times and nobody could tell the server from a client (a
stranger's review). A forked child names itself here: its command line (``ps aux``, ``pgrep
-f``) becomes ``fedsim ROLE NAME``, written over the launcher's in the memory the kernel reads
``/proc/PID/cmdline`` from (as the ``setproctitle`` package does, through ``/proc/self/mem``),
and its short name (``ps -o comm``, ``top``: at most 15 bytes) becomes NAME. Linux only; where
the kernel or a container's policy refuses, the title stays as it was (nothing else depends on
it). Only the role and the name go in, never an argument that could carry a credential.
"""

from __future__ import annotations

import sys
from pathlib import Path

__all__ = ["name_this_process"]

_PR_SET_NAME = 15
_COMM_BYTES = 15
"""The kernel's limit on a task's short name, less its terminating NUL."""
_ARG_START_FIELD = 48
"""``arg_start`` in ``/proc/PID/stat`` (proc(5)); ``arg_end`` follows it."""


def name_this_process(title: str, short: str) -> bool:
    """Show this process as ``title`` in its command line (cut to the launcher's command
    line's length) and as ``short`` (cut to 15 bytes) in its short name; False where that is
    not possible (not Linux, no ``/proc``, a policy refusing writes to ``/proc/self/mem``)."""
    if not sys.platform.startswith("linux"):
        return False
    import ctypes

    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_NAME, ctypes.c_char_p(_cut(short, _COMM_BYTES)), 0, 0, 0)
        # Fields after the parenthesised name (which may hold spaces, or any bytes) start at
        # field 3: read as bytes (a review's non-ASCII name failed a text read).
        fields = Path("/proc/self/stat").read_bytes().rsplit(b")", 1)[1].split()
        start = int(fields[_ARG_START_FIELD - 3])
        end = int(fields[_ARG_START_FIELD - 2])
        if end - start < 2:
            return False
        # Padded with NULs to the area's end, whose last byte stays NUL: the kernel then
        # reads the command line up to the first NUL, not on into the environment.
        data = _cut(title, end - start - 1).ljust(end - start, b"\0")
        with open("/proc/self/mem", "r+b", buffering=0) as memory:
            memory.seek(start)
            memory.write(data)
    except (OSError, ValueError, IndexError, AttributeError):
        return False
    return True


def _cut(text: str, size: int) -> bytes:
    """``text`` in UTF-8, cut to at most ``size`` bytes at a character's boundary."""
    return text.encode()[:size].decode(errors="ignore").encode()
