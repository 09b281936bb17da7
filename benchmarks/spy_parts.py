"""Where a scaled training run's time goes, by part of the simulator, from a py-spy profile.

    py-spy record -r 250 -f raw -o run16.txt -- python benchmarks/spy_parts.py run 1000 16
    py-spy record -r 250 -f raw -o run4.txt -- python benchmarks/spy_parts.py run 1000 4
    python benchmarks/spy_parts.py parts run4.txt run16.txt
    python benchmarks/spy_parts.py alone 10 400 [--keep-alive 1400]

``run`` simulates hetero-100 scaled to N training clients (benchmarks/scale.py's scenario)
for S virtual seconds, without the single loop the plan rows interleave, and prints its CPU
seconds, rounds and rounds a batched pass. ``parts`` reads py-spy's raw (collapsed) stacks and gives each part's
share of the samples, and with two profiles the difference of the longer and the shorter run
in ms a round: the steady state, without start-up and the first window's first touches
(py-spy pauses the process to sample it, so its ms are a little above a run's own).
Session 48's profiles: ``benchmarks/results/spy_session48``.
"""

from __future__ import annotations

import argparse
import collections
import gzip
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

# First frame name (substring) that decides a stack's part, checked in this order.
PARTS: tuple[tuple[str, str], ...] = (
    ("build_population", "start-up"), ("_warm", "start-up"),
    ("RoundBatcher.flush", "batched pass"), ("begin_round", "round's draws"),
    ("apply_local_step", "local step"), ("PrivacyLedger.can_spend", "ledger check"),
    ("PrivacyLedger.spend", "ledger spend"), ("ClientActor._stop", "client stop"),
    ("SimulatedClientEndpoint.publish", "client publish"),
    ("ServerActor._fold_inbox", "server fold"), ("close_window", "server close"),
    ("ServerActor._receive_forever", "server receipt"), ("evaluate", "evaluation"),
    ("SimulatedNetwork._deliver", "network delivery"), ("too_stale", "client staleness"),
    ("ClientActor", "client, other"), ("ServerActor", "server, other"),
    ("SimulatedNetwork", "network, other"), ("_run_once", "event loop"),
)


def part_samples(path: Path) -> collections.Counter[str]:
    """Samples of each part in py-spy's raw output at ``path`` (gzipped if it ends in .gz;
    ``other``: none matched)."""
    counts: collections.Counter[str] = collections.Counter()
    text = (gzip.decompress(path.read_bytes()).decode() if path.suffix == ".gz"
            else path.read_text(encoding="utf-8"))
    for line in text.splitlines():
        stack, _, samples = line.rpartition(" ")
        frames = [frame.split(" (")[0] for frame in stack.split(";")]
        part = next((name for key, name in PARTS if any(key in f for f in frames)), "other")
        counts[part] += int(samples)
    return counts


def _run(clients: int, virtual_seconds: float) -> None:
    import torch
    from scale import _scratch_dir, build_population, run_scenario, scaled
    from simulator import _TrainingTotals, _Untimed

    torch.set_num_threads(1)
    loaded = scaled(clients, virtual_seconds, cross_device=False)
    population = build_population(loaded)
    training = _TrainingTotals(clocks=_Untimed())  # type: ignore[arg-type]
    with _scratch_dir() as scratch:
        result = run_scenario(loaded, Path(scratch) / "run", population=population,
                              wrap_trainer=training.wrap)
        timing = json.loads((Path(scratch) / "run" / "timing.json").read_text(encoding="utf-8"))
    passes = max(1, timing["batched_passes"])
    print(json.dumps({"clients": clients, "virtual_seconds": virtual_seconds,
                      "cpu_seconds": round(result.cpu_seconds, 3), "rounds": training.rounds,
                      "sample_grads": result.sample_grads,
                      "rounds_batched": timing["rounds_batched"], "batched_passes": passes,
                      "rounds_a_pass": round(timing["rounds_batched"] / passes, 1)}))


def _alone(clients_per_group: int, rounds: int, keep_alive: int) -> None:
    """fedsim's batched path with nothing around it (scale.py's ``batched_rounds_ms``),
    timed over the second half of ``rounds`` rounds a client, with ``keep_alive`` updates held
    on as a run's updates in flight are."""
    import torch
    from scale import batched_rounds_ms, build_population, scaled

    torch.set_num_threads(1)
    population = build_population(scaled(1000, 3.0, cross_device=False))
    parts = batched_rounds_ms(population, clients_per_group, rounds, keep_alive=keep_alive,
                              timed_from=rounds // 2 + 1)
    print(json.dumps({"clients_per_group": clients_per_group, "rounds": rounds,
                      "keep_alive": keep_alive,
                      "ms_a_round": {name: round(ms, 4) for name, ms in parts.items()}}))


def _parts(paths: list[Path], rate: float, rounds: list[int]) -> None:
    counts = [part_samples(p) for p in paths]
    for path, count in zip(paths, counts, strict=True):
        total = sum(count.values())
        print(f"{path}: {total} samples")
        for name, n in count.most_common():
            print(f"  {100 * n / total:5.1f}%  {name}")
    if len(paths) == 2 and len(rounds) == 2:
        extra = rounds[1] - rounds[0]
        print(f"steady state ({paths[1]} minus {paths[0]}, {extra} rounds), ms a round:")
        for name in sorted(set(counts[1]) | set(counts[0]),
                           key=lambda n: counts[0][n] - counts[1][n]):
            print(f"  {1e3 * (counts[1][name] - counts[0][name]) / rate / extra:7.4f}  {name}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    commands = parser.add_subparsers(dest="command", required=True)
    run = commands.add_parser("run", help="the scaled run alone, to profile")
    run.add_argument("clients", type=int)
    run.add_argument("virtual_seconds", type=float)
    alone = commands.add_parser("alone", help="the batched path alone (scale.py's "
                                "batched_rounds_ms), its second half timed")
    alone.add_argument("clients_per_group", type=int)
    alone.add_argument("rounds", type=int)
    alone.add_argument("--keep-alive", type=int, default=0,
                       help="updates held on, as a run's in flight")
    parts = commands.add_parser("parts", help="each part's share of py-spy's raw profiles")
    parts.add_argument("profiles", type=Path, nargs="+")
    parts.add_argument("--rate", type=float, default=250.0, help="py-spy's samples a second")
    parts.add_argument("--rounds", type=int, nargs=2, metavar=("SHORT", "LONG"),
                       help="the two runs' rounds (printed by run): the steady state's ms")
    args = parser.parse_args()
    if args.command in ("run", "alone"):
        import logging

        logging.disable(logging.WARNING)
        if args.command == "run":
            _run(args.clients, args.virtual_seconds)
        else:
            _alone(args.clients_per_group, args.rounds, args.keep_alive)
    else:
        _parts(args.profiles, args.rate, args.rounds or [])


if __name__ == "__main__":
    main()
