"""Soak the server's client book: many updates judged and recorded, state sampled along the way.

``python benchmarks/book_soak.py [--updates 10000000] [--clients 1000] [--seconds 600]``

Updates from ``--clients`` clients arrive round-robin through the book's verdict and record
(:mod:`fedsim.runtime.actors.client_book`), as a server under a hostile, lossy network sees
them: 1% of rounds are overtaken by the next one (they arrive five of their client's updates
later), 1% arrive twice, 0.1% are never sent (lost: the gap stays until the window passes it),
and one client in a hundred names a round far beyond its own every hundredth update. Fifty
times along the way the run samples its resident set size and writes a real checkpoint of a
server holding the book (:class:`~fedsim.runtime.deployed.checkpoint.ServerCheckpoint`, a
1,000-parameter model, fsynced), recording its size and time. Before the book, the server kept
every judged ``(client, round)``: the checkpoint took 1.85 s at 3x10^5 (issue 25, finding 4);
flat figures here are the point. Stops after ``--seconds`` if the updates do not fit, and says
how many it ran. Writes ``benchmarks/results/book_soak.json``.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import commit, rss_mb, write_json  # noqa: E402

from fedsim.aggregation import ConstantStepSize, UniformWeights  # noqa: E402
from fedsim.clock import WallClock  # noqa: E402
from fedsim.protocol.messages import ClientUpdate  # noqa: E402
from fedsim.runtime.actors.client_book import Kind  # noqa: E402
from fedsim.runtime.actors.server import ClientInfo, ServerActor  # noqa: E402
from fedsim.runtime.deployed.checkpoint import ServerCheckpoint  # noqa: E402

RESULT = Path(__file__).resolve().parent / "results" / "book_soak.json"
DIM = 1000


class _Quiet:
    async def publish(self, message: object) -> None:
        pass

    async def receive(self) -> object:
        raise RuntimeError("nothing is received in the soak")

    async def close(self) -> None:
        pass


class _Traffic:
    """Each client's next round as a hostile, lossy network delivers it (module docstring)."""

    def __init__(self, clients: int) -> None:
        self.next = [0] * clients
        self.overtaken: list[list[tuple[int, int]]] = [[] for _ in range(clients)]
        self.sent = [0] * clients

    def next_round(self, i: int, u: float, v: float) -> int:
        self.sent[i] += 1
        late = self.overtaken[i]
        if late and late[0][0] <= self.sent[i]:
            return late.pop(0)[1]
        if u < 0.01:  # this round is overtaken by the next: sent five updates later
            late.append((self.sent[i] + 5, self.next[i]))
            self.next[i] += 2
            return self.next[i] - 1
        if u < 0.02 and self.next[i]:  # a duplicate of the newest
            return self.next[i] - 1
        if u < 0.021:  # lost: never sent
            self.next[i] += 2
            return self.next[i] - 1
        if i % 100 == 0 and v < 0.01:  # a hostile client names a far round
            return self.next[i] + 5000
        self.next[i] += 1
        return self.next[i] - 1


def soak(updates: int, clients: int, seconds: float, samples: int = 50) -> dict[str, Any]:
    ids = [f"c{i:05d}" for i in range(clients)]
    server = ServerActor(clock=WallClock(), endpoint=_Quiet(), initial_params=np.zeros(DIM),
                         clients={c: ClientInfo(1, 1.0) for c in ids}, window=1.0,
                         strategy=UniformWeights(), step_size=ConstantStepSize(1.0))
    book = server.book
    delta = np.full(DIM, 1e-3, np.float32)
    rng = np.random.default_rng(25)
    traffic = _Traffic(clients)
    verdicts: dict[str, int] = {}
    rows: list[dict[str, Any]] = []
    every = max(1, updates // samples)
    started = time.perf_counter()
    judging = 0.0
    done = 0
    with tempfile.TemporaryDirectory() as state:
        checkpoint = ServerCheckpoint(state, {"run": "book-soak"})
        chunk = 100_000
        while done < updates:
            draws = rng.random((chunk, 2))
            t0 = time.perf_counter()
            for k in range(min(chunk, updates - done)):
                i = (done + k) % clients
                round_ = traffic.next_round(i, float(draws[k, 0]), float(draws[k, 1]))
                update = ClientUpdate(ids[i], round_, 0, delta, 8.0)
                verdict = book.judge(update)
                if verdict.kind is Kind.ACCEPTED:
                    book.record(ids[i], round_)
                verdicts[verdict.kind] = verdicts.get(verdict.kind, 0) + 1
                if (done + k + 1) % every == 0:
                    judging += time.perf_counter() - t0
                    rows.append(_sample(server, checkpoint, done + k + 1, judging))
                    t0 = time.perf_counter()
            judging += time.perf_counter() - t0
            done = min(updates, done + chunk)
            if time.perf_counter() - started > seconds:
                break
        if not rows or rows[-1]["updates"] != done:
            rows.append(_sample(server, checkpoint, done, judging))
    return {"updates_run": done, "updates_asked": updates, "clients": clients,
            "wall_seconds": round(time.perf_counter() - started, 1),
            "judged_per_second": round(done / judging), "verdicts": dict(sorted(verdicts.items())),
            "samples": rows}


def _sample(server: ServerActor, checkpoint: ServerCheckpoint, updates: int,
            judging: float) -> dict[str, Any]:
    t0 = time.perf_counter()
    snapshot = server.snapshot()
    snapshot_s = time.perf_counter() - t0
    checkpoint.save(snapshot)
    return {"updates": updates, "rss_mb": round(rss_mb(), 1),
            "snapshot_ms": round(1e3 * snapshot_s, 3),
            "checkpoint_ms": round(1e3 * checkpoint.seconds[-1], 2),
            "checkpoint_bytes": checkpoint.path.stat().st_size,
            "judging_s": round(judging, 1)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--updates", type=int, default=10_000_000)
    parser.add_argument("--clients", type=int, default=1000)
    parser.add_argument("--seconds", type=float, default=600.0,
                        help="stop after this many wall seconds (the run says how many it ran)")
    parser.add_argument("--out", type=Path, default=RESULT)
    args = parser.parse_args()
    result = soak(args.updates, args.clients, args.seconds)
    first, last = result["samples"][0], result["samples"][-1]
    result["flat"] = {
        "rss_mb_first_last": [first["rss_mb"], last["rss_mb"]],
        "checkpoint_bytes_first_last": [first["checkpoint_bytes"], last["checkpoint_bytes"]],
        "checkpoint_ms_max": max(r["checkpoint_ms"] for r in result["samples"]),
    }
    write_json(args.out, {"benchmark": "book_soak", "commit": commit(), **result})
    print(f"{result['updates_run']:,} updates at {result['judged_per_second']:,}/s; "
          f"flat: {result['flat']}")


if __name__ == "__main__":
    main()
