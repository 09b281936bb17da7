"""Why a simulated round's small steps cost more than the single loop's (issue 24): the same
call, warm and right after a pass over model-sized vectors.

    python benchmarks/cold_calls.py calls [--repeats 3000]
    python benchmarks/cold_calls.py situ [--clients 1000] [--virtual-seconds 4]

``calls`` times small operations a simulated round makes - a Poisson batch and a noise key
from a client's own ``torch.Generator`` (one of 1,000), a fixed-size batch (``randperm``),
the ledger's system calls on /dev/shm (``stat``, an appending ``write``, a ``pwrite``, a
signal handler swapped and put back), numpy's ``flatnonzero`` on 60 uniforms, and a pure
Python loop of 100 additions - each back to back (``warm``) and right after an in-place
``np.add`` over 1, 3 or 6 distinct 101,770-value float32 vectors (a client's model or update:
0.4, 1.2 or 2.4 MB streamed, what a round's local step and the server's fold stream between
its small steps). The single loop runs one client a group, so its vectors and every library's
code stay in the caches; the simulator holds a model a client and streams a cold one each
round.

``situ`` times the same kinds of calls inside the scaled hetero-100 run
(``benchmarks/spy_parts.py run``, no single loop) by wrapping them, per call and per round.

Results in ``benchmarks/results/cold_calls.json`` (``calls`` and ``situ`` entries) with the
commit and the machine.
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import functools
import io
import json
import os
import platform
import signal
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import numpy as np  # noqa: E402
import torch  # noqa: E402
from _common import commit, write_json  # noqa: E402

RESULTS = Path(__file__).resolve().parent / "results" / "cold_calls.json"
MODEL_VALUES = 101_770
STREAMED = (0, 1, 3, 6)
"""Model-sized vectors streamed before each call (0: warm)."""
_BLOCK = 100


def _small_calls(scratch: Path) -> dict[str, Callable[[int], object]]:
    """The calls to time, each taking the repetition's index (to pick a client)."""
    generators = [torch.Generator() for _ in range(1000)]
    for seed, generator in enumerate(generators):
        generator.manual_seed(seed)
    appended = os.open(scratch / "records", os.O_WRONLY | os.O_CREAT | os.O_APPEND)
    mark_path = str(scratch / "mark")
    mark = os.open(mark_path, os.O_RDWR | os.O_CREAT)
    record, mark_bytes = b"r" * 120, b"m" * 64
    uniforms = np.random.default_rng(0).random(60)

    def handler(_signum: int, _frame: object) -> None:
        pass

    def swap(_k: int) -> None:
        previous = signal.signal(signal.SIGINT, handler)
        signal.signal(signal.SIGINT, previous)

    def python_loop(_k: int) -> int:
        total = 0
        for i in range(100):
            total += i
        return total

    return {
        "torch.rand(30), a client's generator":
            lambda k: torch.rand(30, generator=generators[k % 1000]).numpy(),
        "torch.randint(4 words), a client's generator":
            lambda k: torch.randint(0, 1 << 32, (4,), generator=generators[k % 1000],
                                    dtype=torch.int64).tolist(),
        "torch.randperm(180)[:4]": lambda k: torch.randperm(180, generator=generators[k % 1000])[:4],
        "np.flatnonzero(60 uniforms < q)": lambda _k: np.flatnonzero(uniforms < 0.05),
        "os.stat": lambda _k: os.stat(mark_path),
        "os.write (120 B, append)": lambda _k: os.write(appended, record),
        "os.pwrite (64 B)": lambda _k: os.pwrite(mark, mark_bytes, 0),
        "signal handler swapped and back": swap,
        "Python loop of 100 additions": python_loop,
    }


def measure_calls(repeats: int) -> dict[str, Any]:
    """Each call's mean microseconds warm and after each streamed size (interleaved)."""
    torch.set_num_threads(1)
    vectors = [np.ones(MODEL_VALUES, dtype=np.float32) for _ in range(2 * max(STREAMED))]
    table: dict[str, dict[str, float]] = {}
    stream_us: dict[int, float] = {}
    with tempfile.TemporaryDirectory(dir="/dev/shm" if os.path.isdir("/dev/shm") else None) as d:
        calls = _small_calls(Path(d))
        for name, call in calls.items():
            totals = dict.fromkeys(STREAMED, 0)
            # Blocks of 100 calls a size, the sizes alternating (the machine's load hits all
            # alike); in the warm block every call but the first follows the same call.
            for block in range(0, repeats, _BLOCK):
                for streamed in STREAMED:
                    for k in range(block, block + _BLOCK):
                        started = time.perf_counter_ns()
                        for j in range(streamed):
                            w, u = vectors[2 * j], vectors[2 * j + 1]
                            np.add(w, u, out=w)
                        between = time.perf_counter_ns()
                        call(k)
                        totals[streamed] += time.perf_counter_ns() - between
                        if streamed:
                            stream_us[streamed] = stream_us.get(streamed, 0.0) + (
                                between - started) / 1e3
            repeats = -(-repeats // _BLOCK) * _BLOCK
            table[name] = {("warm" if s == 0 else f"after {0.4 * s:.1f} MB"):
                           round(totals[s] / repeats / 1e3, 2) for s in STREAMED}
    sweeps = repeats * len(calls)
    return {"microseconds_a_call": table,
            "stream_microseconds": {f"{0.4 * s:.1f} MB": round(us / sweeps, 1)
                                    for s, us in stream_us.items()},
            "repeats": repeats}


def measure_situ(clients: int, virtual_seconds: float) -> dict[str, Any]:
    """The wrapped calls' microseconds inside a scaled run (per call and per round)."""
    import spy_parts

    from fedsim.aggregation import mixing
    from fedsim.config import distributions
    from fedsim.privacy import ledger
    from fedsim.protocol import codec
    from fedsim.runtime.actors import client
    from fedsim.training import gaussian, local

    spent: collections.Counter[str] = collections.Counter()
    calls: collections.Counter[str] = collections.Counter()

    def timed(label: str, function: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(function)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            started = time.perf_counter_ns()
            try:
                return function(*args, **kwargs)
            finally:
                spent[label] += time.perf_counter_ns() - started
                calls[label] += 1
        return wrapper

    draw = gaussian.NoiseKey.draw.__func__  # type: ignore[attr-defined]
    wrapped: list[tuple[Any, str, str]] = [
        (local, "sample_batch", "the round's batch (sample_batch)"),
        (client, "apply_local_step", "the local step"),
        (client, "given_up_norm", "the client's norm check"),
        (ledger.PrivacyLedger, "spend", "the ledger's spend"),
        (ledger.PrivacyLedger, "can_spend", "the ledger's check"),
        (codec, "seal", "the seal"),
        (mixing, "add_scaled", "the server's mix of one update"),
        (distributions.LogNormal, "sample", "a latency draw"),
    ]
    for owner, name, label in wrapped:
        setattr(owner, name, timed(label, getattr(owner, name)))
    gaussian.NoiseKey.draw = classmethod(timed("the noise key", draw))  # type: ignore[assignment]
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        spy_parts._run(clients, virtual_seconds)
    per_round = max(1, int(json.loads(printed.getvalue().splitlines()[-1])["rounds"]))
    return {"clients": clients, "virtual_seconds": virtual_seconds, "rounds": per_round,
            "calls": {label: {"calls": calls[label],
                              "microseconds_a_call": round(spent[label] / calls[label] / 1e3, 1),
                              "microseconds_a_round": round(spent[label] / per_round / 1e3, 1)}
                      for label in sorted(spent, key=lambda k: -spent[k])}}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("mode", choices=("calls", "situ"))
    parser.add_argument("--repeats", type=int, default=3000)
    parser.add_argument("--clients", type=int, default=1000)
    parser.add_argument("--virtual-seconds", type=float, default=4.0)
    args = parser.parse_args()
    load_before = os.getloadavg()
    entry = (measure_calls(args.repeats) if args.mode == "calls"
             else measure_situ(args.clients, args.virtual_seconds))
    entry.update({"commit": commit(), "machine": platform.machine(),
                  "processor": platform.processor(), "loadavg_before": list(load_before),
                  "loadavg_after": list(os.getloadavg())})
    document: dict[str, Any] = {}
    if RESULTS.exists():
        document = json.loads(RESULTS.read_text(encoding="utf-8"))
    document[args.mode] = entry
    write_json(RESULTS, document)
    print(json.dumps(entry, indent=2))


if __name__ == "__main__":
    main()
