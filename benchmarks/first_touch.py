"""What memory costs the simulator on this machine: a page's first touch, and a pass over a
model-sized vector from memory against from the cache.

    python benchmarks/first_touch.py [--gigabytes 1,8]

For each size, a fresh anonymous mapping is written one byte a page (``touch``: a page fault
each), then another mapping of the same size at once (``touch again``: the pages the kernel
just got back), then one populated by ``madvise(MADV_POPULATE_WRITE)`` (Linux 5.14+: the
kernel faults every page in one call). Under a hypervisor that backs guest memory on first
touch and takes freed memory back (free page reporting), the first figure is what a large
run's growth costs, and it depends on what ran minutes before. Then ``np.multiply`` of a
101,770-value float32 vector (the MNIST MLP's model: an update or a client's model) into one
output, 2,000 times: each time a different vector (read from memory) or the same one (from
the cache). Results in ``benchmarks/results/first_touch.json`` with the commit.
"""

from __future__ import annotations

import argparse
import json
import mmap
import os
import platform
import resource
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import commit  # noqa: E402

RESULTS = Path(__file__).resolve().parent / "results" / "first_touch.json"
PAGE = mmap.PAGESIZE
MADV_POPULATE_WRITE = 23  # linux/mman.h; mmap has no constant for it before Python 3.13
MODEL_VALUES = 101_770


def _usage() -> tuple[float, float, int]:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime, usage.ru_stime, usage.ru_minflt


def _mapping_row(size: int, how: str) -> dict[str, Any]:
    mapping = mmap.mmap(-1, size, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    try:
        view = np.frombuffer(mapping, dtype=np.uint8)
        cpu, system, faults = _usage()
        if how == "populate":
            mapping.madvise(MADV_POPULATE_WRITE)
        else:
            view[::PAGE] = 1
        cpu_after, system_after, faults_after = _usage()
        del view
    finally:
        mapping.close()
    pages = size // PAGE
    return {"how": how, "gigabytes": size / 2**30, "pages": pages,
            "minor_faults": faults_after - faults, "cpu_seconds": round(cpu_after - cpu, 3),
            "system_seconds": round(system_after - system, 3),
            "us_a_page": round(1e6 * (cpu_after - cpu) / pages, 3)}


def _vector_pass_ms(vectors: list[np.ndarray], cold: bool) -> float:
    out = np.empty(MODEL_VALUES, np.float32)
    scale = np.float32(0.5)
    started = time.perf_counter()
    for k in range(len(vectors)):
        np.multiply(vectors[k] if cold else vectors[0], scale, out=out)
    return 1e3 * (time.perf_counter() - started) / len(vectors)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gigabytes", default="1,8",
                        help="comma-separated sizes of the mappings (GiB)")
    args = parser.parse_args()
    load_before = os.getloadavg()
    rows = []
    for gigabytes in (float(g) for g in args.gigabytes.split(",")):
        size = int(gigabytes * 2**30) // PAGE * PAGE
        for how in ("touch", "touch again", "populate"):
            try:
                row = _mapping_row(size, how)
            except OSError as exc:  # an older kernel without MADV_POPULATE_WRITE
                row = {"how": how, "gigabytes": gigabytes, "error": str(exc)}
            print(json.dumps(row), flush=True)
            rows.append(row)
    rng = np.random.default_rng(0)
    vectors = [rng.standard_normal(MODEL_VALUES, dtype=np.float32) for _ in range(2000)]
    passes = {"from_memory_ms": [round(_vector_pass_ms(vectors, True), 4) for _ in range(3)],
              "from_cache_ms": [round(_vector_pass_ms(vectors, False), 4) for _ in range(3)]}
    print(json.dumps(passes), flush=True)
    RESULTS.write_text(json.dumps({
        "code": commit(), "machine": platform.machine(), "processor": platform.processor(),
        "cpus": os.cpu_count(), "loadavg_before": [round(x, 2) for x in load_before],
        "loadavg_after": [round(x, 2) for x in os.getloadavg()],
        "mappings": rows, "model_vector_pass": passes,
    }, indent=2) + "\n", encoding="utf-8")


if __name__ == "__main__":
    main()
