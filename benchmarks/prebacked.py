"""The 10^4-client training row with its memory backed before the run: what the guest's first
use of memory costs the ratio against the single loop (issue 24).

    python benchmarks/prebacked.py [--clients 10000] [--virtual-seconds 1.5] [--gigabytes 11]
                                   [--arms plain,kept,prebacked]

Each arm is ``benchmarks/scale.py``'s plan row (``measure``: hetero-100 scaled, the single
loop interleaved, the ratio per CPU second) in its own subprocess:

* ``plain``: the row as the plan runs it.
* ``kept``: the heap never gives memory back (glibc's trim threshold at its largest and the
  simulation's window-end ``malloc_trim`` left out): the control for ``prebacked``, the same
  allocator policy without the memory touched beforehand.
* ``prebacked``: as ``kept``, and before the measured run (outside its CPU seconds) the
  process takes ``--gigabytes`` of heap in 1 MiB blocks, writes a byte a page and frees them,
  so that the run's vectors come from pages the guest has already backed.

On a KVM guest that backs its memory on first touch (benchmarks/first_touch.py: 7.9-12 us a
page in a fresh mapping against 2.0-2.5 in memory just used), ``prebacked`` minus ``kept``
is what the first use of the run's state costs, which no simulator holding that state can
avoid on a fresh guest. Appends its rows to ``benchmarks/results/scale.json``
(``prebacked``) with the commit.
"""

from __future__ import annotations

import argparse
import ctypes
import ctypes.util
import json
import mmap
import resource
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import commit, set_allocator, write_json  # noqa: E402

RESULT = Path(__file__).resolve().parent / "results" / "scale.json"
BLOCK = 2**20
_M_TRIM_THRESHOLD = -1


def _libc() -> ctypes.CDLL:
    libc = ctypes.CDLL(ctypes.util.find_library("c"))
    libc.malloc.argtypes = [ctypes.c_size_t]
    libc.malloc.restype = ctypes.c_void_p
    libc.free.argtypes = [ctypes.c_void_p]
    libc.mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
    libc.mallopt.restype = ctypes.c_int
    return libc


def keep_heap(libc: ctypes.CDLL) -> None:
    """The heap keeps what is freed: glibc's trim threshold at its largest (-1 as a size_t),
    and the simulation's window-end trim left out."""
    if libc.mallopt(_M_TRIM_THRESHOLD, -1) != 1:
        raise SystemExit("mallopt(M_TRIM_THRESHOLD) refused")
    from fedsim.runtime.simulated import simulation

    simulation.release_free_memory = lambda *args, **kwargs: False  # type: ignore[assignment]


def back_heap(libc: ctypes.CDLL, gigabytes: float) -> dict[str, float]:
    """Take ``gigabytes`` of heap in 1 MiB blocks, write a byte a page, free them all."""
    usage = resource.getrusage(resource.RUSAGE_SELF)
    started = time.perf_counter()
    blocks = []
    page = mmap.PAGESIZE
    for _ in range(int(gigabytes * 2**30 / BLOCK)):
        address = libc.malloc(BLOCK)
        if not address:
            break
        ctypes.memset(address, 1, BLOCK)  # every page written
        blocks.append(address)
    for address in blocks:
        libc.free(address)
    after = resource.getrusage(resource.RUSAGE_SELF)
    return {"backed_gb": round(len(blocks) * BLOCK / 2**30, 2),
            "backing_seconds": round(time.perf_counter() - started, 2),
            "backing_system_seconds": round(after.ru_stime - usage.ru_stime, 2),
            "backing_faults": after.ru_minflt - usage.ru_minflt,
            "page_bytes": page}


def one(arm: str, clients: int, virtual_seconds: float, gigabytes: float) -> dict[str, Any]:
    set_allocator("keep")
    libc = _libc()
    backing: dict[str, float] = {}
    if arm in ("kept", "prebacked"):
        keep_heap(libc)
    if arm == "prebacked":
        backing = back_heap(libc, gigabytes)
    from scale import measure

    row = measure(clients, "train", virtual_seconds)
    return {"arm": arm, **backing, **row}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--clients", type=int, default=10_000)
    parser.add_argument("--virtual-seconds", type=float, default=1.5)
    parser.add_argument("--gigabytes", type=float, default=11.0)
    parser.add_argument("--arms", default="plain,kept,prebacked")
    parser.add_argument("--one", metavar="ARM", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.one:
        print(json.dumps(one(args.one, args.clients, args.virtual_seconds, args.gigabytes)))
        return
    import subprocess

    rows = []
    for arm in args.arms.split(","):
        done = subprocess.run(
            [sys.executable, __file__, "--one", arm, "--clients", str(args.clients),
             "--virtual-seconds", str(args.virtual_seconds), "--gigabytes", str(args.gigabytes)],
            capture_output=True, text=True, check=False)
        lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
        row = json.loads(lines[-1]) if lines else {"arm": arm, "failed": done.returncode,
                                                   "stderr_tail": done.stderr[-2000:]}
        print(json.dumps(row), flush=True)
        rows.append(row)
    results = json.loads(RESULT.read_text()) if RESULT.exists() else {}
    results.setdefault("prebacked", []).append({"code": commit(), "rows": rows})
    write_json(RESULT, results)


if __name__ == "__main__":
    main()
