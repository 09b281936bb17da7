"""What a deployed client's durable outbox costs an update (fedsim/transports/durable_outbox.py):
the write that makes each released update durable before it is sent (temporary file, fsync,
rename, directory fsync) and the removal its receipt makes, beside the ledger's own append of
the round (fsynced), for the update sizes of the shipped models.

    python benchmarks/outbox_cost.py [--dir DIR] [--updates 200]

``--dir``: where the outbox and the ledger are written (default: a temporary directory under
the system's; a tmpfs would measure no disk). Writes ``benchmarks/results/outbox_cost.json``:
per size, the median and 90th percentile milliseconds of a keep, a forget and a ledger spend.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import provenance  # noqa: E402

from fedsim.privacy.events import GaussianStep  # noqa: E402
from fedsim.privacy.ledger import Budget, PrivacyLedger  # noqa: E402
from fedsim.protocol import codec  # noqa: E402
from fedsim.protocol.messages import ClientUpdate  # noqa: E402
from fedsim.transports.durable_outbox import DurableOutbox  # noqa: E402

RESULTS = Path(__file__).resolve().parent / "results" / "outbox_cost.json"
# Parameters of the shipped models: logistic regression on MNIST, the quickstart's MLP
# (784-64-10), benchmarks' MLP 784-128-10, a small CNN.
SIZES = {"logreg-mnist": 7_850, "mlp-784-64-10": 50_890, "mlp-784-128-10": 101_770,
         "cnn-1.2M": 1_200_000}


def _quantiles(values: list[float]) -> dict[str, float]:
    ordered = sorted(values)
    return {"median_ms": round(1e3 * statistics.median(ordered), 3),
            "p90_ms": round(1e3 * ordered[int(0.9 * (len(ordered) - 1))], 3)}


def measure(directory: Path, name: str, params: int, updates: int) -> dict[str, object]:
    outbox = DurableOutbox(directory / name / "outbox")
    rng = np.random.default_rng(0)
    payloads = [codec.encode(ClientUpdate("c1", r, 0, rng.standard_normal(params)
                                          .astype(np.float32), 16.0), incarnation="ab" * 8)
                for r in range(min(updates, 8))]
    keeps, forgets, spends = [], [], []
    with PrivacyLedger.open(directory / name / "c1.jsonl", client_id="c1", sampling="poisson",
                            budget=Budget(1e6, 1e-5)) as ledger:
        step = GaussianStep("poisson", 0.01, 1.0)
        for round_ in range(updates):
            start = time.perf_counter()
            ledger.spend(step, time=float(round_), round=round_)
            spends.append(time.perf_counter() - start)
            start = time.perf_counter()
            outbox.keep(round_, payloads[round_ % len(payloads)])
            keeps.append(time.perf_counter() - start)
            start = time.perf_counter()
            outbox.forget(round_)
            forgets.append(time.perf_counter() - start)
    return {"model": name, "params": params, "update_bytes": len(payloads[0]),
            "updates": updates, "keep": _quantiles(keeps), "forget": _quantiles(forgets),
            "ledger_spend": _quantiles(spends)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dir", type=Path, default=None)
    parser.add_argument("--updates", type=int, default=200)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(dir=args.dir) as scratch:
        rows = [measure(Path(scratch), name, params, args.updates)
                for name, params in SIZES.items()]
    with open("/proc/loadavg", encoding="utf-8") as handle:
        load = handle.read().split()[:3]
    document = {"commit": provenance(), "directory": str(args.dir or tempfile.gettempdir()),
                "loadavg_after": load, "rows": rows}
    RESULTS.write_text(json.dumps(document, indent=1) + "\n", encoding="utf-8")
    for row in rows:
        print(json.dumps(row))


if __name__ == "__main__":
    main()
