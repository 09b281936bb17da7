"""Process resources at scale: file descriptors for many ledgers, and the cyclic collector's
walk over a large population. (Freed memory, kept for the next step and given back at each
window's end when much is free: :mod:`fedsim.runtime.allocator`.)

File descriptors: a held ledger keeps two open (its file and its locked high-water mark), so
a simulation of N clients needs 2N + a few under ``RLIMIT_NOFILE`` (often 1,024 soft; this
project's CI machine: 20,000). :func:`ledger_handles_fit` raises the soft limit up to the hard
one when that is enough; when it is not, the simulation writes its ledgers under one
directory lock instead (:class:`fedsim.privacy.ledger_directory_lock.DirectoryLock`: one descriptor for
all, the same files and the same one-writer guarantee).

The cyclic garbage collector: a run's long-lived objects (the population, its ledgers and
accountants, the actors) number millions at 10^3-10^5 clients, and each full collection walks
all of them to find none garbage (0.9 s of a 1,000-client message-only run's 3.9 CPU s, 72
collections). :func:`long_lived_spared` moves what exists into the collector's permanent
generation (``gc.freeze``) for the run and back when it ends; reference counting still frees
everything that is not in a cycle, and cyclic garbage is collected among the run's new objects
as before, or after the run for the spared ones.
"""

from __future__ import annotations

import gc
from collections.abc import Callable, Iterator
from contextlib import contextmanager

from fedsim.logging import get_logger

try:
    import resource
except ImportError:  # pragma: no cover - not POSIX
    resource = None  # type: ignore[assignment]

__all__ = ["DESCRIPTORS_PER_LEDGER", "DESCRIPTOR_RESERVE", "LIVE_SPEED_STREAMS_UP_TO",
           "ledger_handles_fit", "long_lived_spared", "speed_streams_parked"]

_log = get_logger("fedsim.runtime.simulated.memory")

DESCRIPTORS_PER_LEDGER = 2
"""A held ledger's open files: the ledger (append) and its high-water mark (with the lock)."""
DESCRIPTOR_RESERVE = 256
"""Descriptors left for everything else (imports, the run directory's files, a data loader)."""


LIVE_SPEED_STREAMS_UP_TO = 65_536
"""Populations up to this size keep each client's speed stream as its own generator (about
1.1 KB a client, 72 MB at this size); larger ones park it (about 150 bytes, a state swap a
draw: :class:`fedsim.runtime.rng.ParkedStream`). The draws are the same either way."""


def speed_streams_parked(clients: int) -> bool:
    """Whether a simulation of ``clients`` clients parks their speed streams."""
    return clients > LIVE_SPEED_STREAMS_UP_TO


def ledger_handles_fit(ledgers: int) -> bool:
    """Whether ``ledgers`` held ledgers fit under ``RLIMIT_NOFILE`` with
    :data:`DESCRIPTOR_RESERVE` to spare, raising the soft limit up to the hard limit when that
    is enough (logged). False: they do not (the caller uses a directory lock instead)."""
    needed = ledgers * DESCRIPTORS_PER_LEDGER + DESCRIPTOR_RESERVE
    if resource is None:  # pragma: no cover - not POSIX: no such limit to query
        return True
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY or needed <= soft:
        return True
    if hard != resource.RLIM_INFINITY and needed > hard:
        _log.info("ledgers share one directory lock", ledgers=ledgers, needed=needed,
                  soft_limit=soft, hard_limit=hard)
        return False
    try:
        resource.setrlimit(resource.RLIMIT_NOFILE, (needed, hard))
    except (ValueError, OSError):
        return False
    _log.info("raised the open-file limit for the ledgers", ledgers=ledgers, soft_limit=needed,
              hard_limit=hard)
    return True


@contextmanager
def long_lived_spared() -> Iterator[Callable[[], None]]:
    """Within the block the cyclic collector skips every object that existed at its start
    (``gc.freeze``); the callable it yields spares those made since too (call it once a run's
    set-up is done). They are handed back to the collector (``gc.unfreeze``) when the block
    ends. Where something else has frozen objects already, it does nothing (an unfreeze would
    release those too)."""
    if gc.get_freeze_count():
        yield lambda: None
        return
    gc.freeze()
    try:
        yield gc.freeze
    finally:
        gc.unfreeze()
