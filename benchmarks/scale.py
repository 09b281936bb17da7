"""Scale: clients -> start-up seconds, peak RSS, simulated seconds per wall second, and
per-sample gradients per CPU second against the single loop.

The scenario is ``hetero-100`` scaled up (issue 18): the same three groups (60% edge, 30% office,
10% datacenter) with ``--set``-style counts, the MLP 784-128-10, batch sizes 1, 2 and 4 (a
client of 10^4 holds a handful of records), IID partitions where Dirichlet cannot fill every
client (more than 100 clients). MNIST's 60,000 records cannot give 10^5 clients one record
each: from 20,000 clients up the data are a synthetic 10-class Gaussian mixture with 4
records per client, every group partitioned IID. fedsim generates at most 5e7 values
(``limits.MAX_SYNTHETIC_VALUES``), so the features are as many as fit, at most 120
(:func:`scaled_features`), and the message-only rows' model is the one-hidden-layer MLP whose
parameter count is nearest 784-128-10's 101,770 (:func:`same_size_hidden`): 120-777-10 up to
10^5 clients (101,797: the same message size and model vectors), 12-4424-10 at 10^6 (4 x 10^6
records of 12 features; 101,762 parameters).

The training row of 10^5 clients (2 virtual s) uses a smaller model, the MLP 120-32-10 (4,202
parameters, a 16.4 KB vector). Every training client holds its own local model (the vector it
trains) from its first round on: 10^5 of them are the run's state, not bookkeeping, and 10^5
x 400 KB of 101,770-parameter local models are 40 GB, which no 16 GB bound holds whatever the
rest costs; at 4,202 parameters they are 1.6 GB.

Rows (each size in its own subprocess, with a time bound, so a size that does not fit
cannot take the others down and peak RSS is the size's own):

* ``train``: training on, hetero-100's speeds and one-second windows. The single loop
  (:class:`simulator._SingleLoop`: each group's first client, its posture, one torch thread)
  runs interleaved with the simulation, catching up at every window end, so a change in the
  shared machine's load hits both arms alike; the ratio is per CPU second.
* ``train-large``: the same with rounds of 8, 16 and 32 gradients (edge, office, datacenter)
  on synthetic data, 40 records a client and the MLP 120-777-10: how the ratio depends on how
  much gradient work a round carries against its fixed protocol work.
* ``message``: training replaced by its virtual duration (zero updates, the same privacy
  events, ledgers, codec and network), the cross-device variant of ``benchmarks/simulator.py``
  (10 s per sample gradient, a window a minute, a broadcast every five).

Every row records the load average next to it (the machine is shared). Run directories go to
/dev/shm when present (the ledgers' fsyncs then measure the simulator, not the disk).

``--floor`` measures the simulator against the floor of its own work at 1,000 training clients
(issue 24): the same run's CPU per round beside the plain-torch cost of that run's work in the
same process, interleaved window by window (:class:`_Floor`: per-sample gradients of the same
MLP in batches of 256 with ``torch.func``, and per round one Gaussian vector of the model's
size, one norm, one copy and one add); ``floor / simulator`` is the ratio (target >= 0.8).
``--floor --profile`` runs it once more under cProfile and prints where each ms of a round
goes (docs/SCALE.md).

``--cold-loop N`` runs the single loop with a model vector per client (N clients' groups, each
round its client's vector, the moved model written back) against one vector a group, warm and
cold alternating: what holding a model per client costs the loop itself (``cold_loop`` in
scale.json).

``--per-client N,M`` measures what one message-only client holds (issue 24 item 5): Python
allocations under ``tracemalloc`` at the first window's end of message-only runs of N and M
clients (each in its own process, under the directory lock as from 9,870 clients, the
population built before tracing), their difference over M - N by file and by line.

``--breakdown N`` measures where memory goes at N training clients (resident size by phase,
what the clients hold at the end, and Python/numpy allocations by source line under
tracemalloc); run it with ``PYTHONPATH`` at another checkout to measure that code.

    python benchmarks/scale.py [--sizes 100,1000,10000,100000] [--timeout S]
    python benchmarks/scale.py --breakdown 1000 [--label NAME]
    python benchmarks/scale.py --per-client 2000,4000
    python benchmarks/scale.py --floor [--virtual-seconds 3] [--profile]
    python benchmarks/scale.py --cold-loop 1000
    python benchmarks/scale.py --ray [--ray-scenarios hetero-100,10000]   # docs/RAY.md

Every mode takes ``--allocator keep`` (the default: the process's allocator keeps freed memory
for reuse, as every ``fedsim`` command's does; :mod:`fedsim.runtime.allocator`) or ``system``
(glibc's defaults, a library caller's process), also for the rows' subprocesses and Ray's
workers (``FEDSIM_ALLOCATOR``); the rows of the plan, ``--ray``, ``--floor`` and
``--breakdown`` record which.

writes (updates) ``benchmarks/results/scale.json``.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import platform
import resource
import subprocess
import sys
import time
import tracemalloc
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import numpy as np  # noqa: E402
import torch  # noqa: E402
from _common import add_allocator_option, commit, rss_mb, set_allocator  # noqa: E402

from fedsim.config import LoadedScenario, load_scenario, parse_scenario  # noqa: E402
from fedsim.runtime.population import build_population  # noqa: E402
from fedsim.runtime.simulated.simulation import run_scenario  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
RESULTS = REPO / "benchmarks" / "results" / "scale.json"
BATCH_SIZES = (1, 2, 4)  # edge, office, datacenter
# ``train-large``: the same groups with rounds of 8-32 gradients, on synthetic data with 40
# records a client (MNIST's 60,000 records give 10^4 clients 6 each).
LARGE_BATCH_SIZES = (8, 16, 32)
LARGE_RECORDS_PER_CLIENT = 40
# (clients, mode, virtual seconds, time bound in s): what the default run measures.
PLAN: list[tuple[int, str, float, int]] = [
    (100, "train", 20.0, 600),
    (1000, "train", 4.0, 900),
    (10000, "train", 1.5, 1500),
    (10000, "train-large", 1.5, 1500),
    (1000, "message", 600.0, 600),
    (10000, "message", 300.0, 900),
    (100000, "message", 60.0, 1800),
    (100000, "train", 2.0, 3600),
    (1000000, "message", 60.0, 5400),
]
REFERENCE_PARAMETERS = 101_770
"""784-128-10's parameter count: a message-only row's model is the MLP nearest it."""
RECORDS_PER_CLIENT = 4
"""Synthetic records a client from 20,000 clients up."""
LARGE_TRAINING_HIDDEN = 32
"""The hidden width of the 10^5 training row's MLP 120-32-10 (see the module docstring)."""
LARGE_TRAINING_FROM = 50_000
"""Training rows of this many clients or more use :data:`LARGE_TRAINING_HIDDEN`."""


def scaled_features(records: int) -> int:
    """As many features as fedsim generates for ``records`` synthetic records, at most 120."""
    from fedsim.config.limits import MAX_SYNTHETIC_VALUES

    return min(120, MAX_SYNTHETIC_VALUES // records)


def same_size_hidden(features: int, classes: int = 10) -> int:
    """The hidden width of the MLP ``features``-h-``classes`` whose parameter count,
    ``(features + 1) h + (h + 1) classes``, is nearest :data:`REFERENCE_PARAMETERS`."""
    return round((REFERENCE_PARAMETERS - classes) / (features + 1 + classes))


def _fedsim_is_this_checkout() -> bool:
    """Whether the imported fedsim is this checkout's (not, say, an editable install of another
    tree: run with ``PYTHONPATH`` at the checkout's root)."""
    import fedsim

    return Path(fedsim.__file__).resolve().parents[1] == REPO


def _peak_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def scaled(clients: int, virtual_seconds: float, *, cross_device: bool,
           large_batches: bool = False) -> LoadedScenario:
    """hetero-100 scaled to ``clients`` (see the module docstring)."""
    base = load_scenario(REPO / "scenarios" / "hetero-100.yaml")
    tree = base.scenario.model_dump(mode="json")
    groups = tree["clients"]["groups"]
    scale = clients / sum(g["count"] for g in groups)
    sizes = LARGE_BATCH_SIZES if large_batches else BATCH_SIZES
    for group, batch_size in zip(groups, sizes, strict=True):
        group["count"] = max(1, round(group["count"] * scale))
        group["batch_size"] = batch_size
        if group.get("partition", {}).get("scheme") == "dirichlet" and clients > 100:
            group["partition"] = {"scheme": "iid"}
        if cross_device:
            group["speed"] = {"kind": "lognormal", "median": 10.0, "sigma": 0.5}
            group.pop("availability", None)
    groups[-1]["count"] += clients - sum(g["count"] for g in groups)
    if large_batches:
        tree["dataset"] = {"name": "synthetic", "num_samples": LARGE_RECORDS_PER_CLIENT * clients,
                           "num_test_samples": 1000, "num_features": 120, "num_classes": 10}
        tree["model"] = {"name": "mlp", "options": {"hidden": [777]}}
        for group in groups:
            group["partition"] = {"scheme": "iid"}
    elif clients > 20000:
        # fedsim generates at most 5e7 values of synthetic data: as many features as fit, and
        # the MLP of 784-128-10's parameter count (the same message size and model vectors),
        # or for many training clients a small one (see the module docstring).
        records = RECORDS_PER_CLIENT * clients
        features = scaled_features(records)
        small = not cross_device and clients >= LARGE_TRAINING_FROM
        hidden = LARGE_TRAINING_HIDDEN if small else same_size_hidden(features)
        tree["dataset"] = {"name": "synthetic", "num_samples": records,
                           "num_test_samples": 1000, "num_features": features,
                           "num_classes": 10}
        tree["model"] = {"name": "mlp", "options": {"hidden": [hidden]}}
        for group in groups:  # 4 records a client: log-normal sizes would leave some below m
            group["partition"] = {"scheme": "iid"}
    tree["stop"] = {"virtual_seconds": virtual_seconds}
    if cross_device:
        tree["server"].update(window=60.0, broadcast_every=5)
    return LoadedScenario(parse_scenario(tree), base.source)


SCRATCH: Path | None = Path("/dev/shm") if Path("/dev/shm").is_dir() else None
"""Where run directories go (``--scratch``): /dev/shm when present, so the ledgers' fsyncs
measure the simulator, not the disk. At 10^6 clients the ledgers alone take about 8 GB (two
files a client, a 4 KB page each), which memory-backed /dev/shm adds to the process's own
resident size: that row runs with ``--scratch`` on a disk."""


def _use_scratch(path: Path | None) -> list[str]:
    """Put run directories under ``path`` (None: the default); the arguments that tell a
    row's subprocess the same."""
    global SCRATCH
    if path is None:
        return []
    SCRATCH = path
    return ["--scratch", str(path)]


def _scratch_dir() -> Any:
    import tempfile

    return tempfile.TemporaryDirectory(dir=SCRATCH, prefix="fedsim-scale-")


def measure(clients: int, mode: str, virtual_seconds: float) -> dict[str, Any]:
    """One row: start-up, peak RSS, simulated s per wall s and (training) the ratio."""
    from simulator import interleaved_arms, released_per_group

    load_before = os.getloadavg()
    rss_imports = rss_mb()
    started = time.perf_counter()
    loaded = scaled(clients, virtual_seconds, cross_device=mode == "message",
                    large_batches=mode == "train-large")
    population = build_population(loaded)
    population_seconds = time.perf_counter() - started
    rss_population = rss_mb()
    single = training = on_window = None
    if mode.startswith("train"):
        # The run's rounds are counted, not timed: the row reads the run's CPU as a whole.
        single, training, on_window = interleaved_arms(population, time_training=False)
    usage_before = resource.getrusage(resource.RUSAGE_SELF)
    with _scratch_dir() as scratch:
        result = run_scenario(loaded, Path(scratch) / "run", population=population,
                              message_only=mode == "message", on_window=on_window,
                              wrap_trainer=training.wrap if training is not None else None)
    usage_after = resource.getrusage(resource.RUSAGE_SELF)
    setup = getattr(result, "setup_seconds", float("nan"))
    row: dict[str, Any] = {
        "clients": clients,
        "mode": mode,
        "dataset": loaded.scenario.dataset.name,
        "num_features": loaded.scenario.dataset.num_features
        if loaded.scenario.dataset.name == "synthetic" else None,
        "model_parameters": int(population.initial_params.size),
        "batch_sizes": [group.batch_size for group in loaded.scenario.clients.groups],
        "virtual_seconds": result.summary["virtual_time"],
        "startup_seconds": round(population_seconds + setup, 3),
        "population_seconds": round(population_seconds, 3),
        "setup_seconds": round(setup, 3),
        "peak_rss_mb": round(_peak_mb()),
        "rss_after_imports_mb": round(rss_imports),
        "rss_after_population_mb": round(rss_population),
        "end_rss_mb": round(rss_mb()),
        "updates_received": result.summary["updates"]["received"],
        "cpu_seconds": round(result.cpu_seconds, 2),
        "wall_seconds": round(result.wall_seconds, 2),
        # First touches of the memory the run grows into (both arms; the loop's are few):
        # on a KVM guest about 3.7 us a 4 KB page (docs/SCALE.md, session 45).
        "minor_page_faults": usage_after.ru_minflt - usage_before.ru_minflt,
        "system_cpu_seconds": round(usage_after.ru_stime - usage_before.ru_stime, 2),
        "fedsim_is_this_checkout": _fedsim_is_this_checkout(),
    }
    loop_wall = single.clocks.wall if single is not None else 0.0
    loop_cpu = single.clocks.cpu if single is not None else 0.0
    run_wall = result.wall_seconds - loop_wall - setup
    row["simulated_s_per_wall_s"] = round(result.summary["virtual_time"] / run_wall, 3)
    if single is not None and training is not None:
        released = released_per_group(result)
        sim_cpu = result.cpu_seconds - loop_cpu
        single.catch_up(released)
        done = sum(single.done.values())
        row.update({
            "sample_grads": result.sample_grads,
            "single_loop_sample_grads": done,
            "sample_grads_per_cpu_s": round(result.sample_grads / sim_cpu, 1),
            "single_loop_sample_grads_per_cpu_s": round(done / single.clocks.cpu, 1),
            "ratio": round((result.sample_grads / sim_cpu) / (done / single.clocks.cpu), 4),
            "rounds": training.rounds,
        })
    row["loadavg_before"] = [round(x, 2) for x in load_before]
    row["loadavg_after"] = [round(x, 2) for x in os.getloadavg()]
    return row


FLOOR_BATCH = 256
"""Per-sample gradients of the floor are computed in batches of this many samples."""


class _Floor:
    """The plain-torch floor of a run's work (see the module docstring): caught up with the
    run's sample gradients and rounds at every window's end, its CPU seconds counted apart."""

    def __init__(self, population: Any) -> None:
        from torch.func import functional_call, grad, vmap

        model = population.model
        names = [name for name, _ in model.named_parameters()]
        self.params = {name: p.detach().clone() for name, p in model.named_parameters()}
        self.dim = sum(p.numel() for p in self.params.values())

        def loss(params: dict[str, torch.Tensor], x: torch.Tensor, y: torch.Tensor) -> Any:
            out = functional_call(model, params, (x.unsqueeze(0),))
            return torch.nn.functional.cross_entropy(out, y.unsqueeze(0))

        self.per_sample = vmap(grad(loss), in_dims=(None, 0, 0))
        self.x, self.y = population.train_x, population.train_y
        self.names = names
        self.generator = torch.Generator().manual_seed(0)
        self.w = torch.zeros(self.dim)
        self.grads = self.rounds = 0
        self.cpu = 0.0

    def catch_up(self, grads: int, rounds: int) -> None:
        started = time.process_time()
        while self.grads < grads:
            count = min(FLOOR_BATCH, grads - self.grads)
            first = (self.grads * 7919) % max(1, len(self.x) - count)
            gradients = self.per_sample(self.params, self.x[first:first + count],
                                        self.y[first:first + count])
            torch.cat([g.reshape(count, -1) for g in gradients.values()], dim=1).sum(0)
            self.grads += count
        while self.rounds < rounds:
            noise = torch.randn(self.dim, generator=self.generator)
            float(torch.linalg.vector_norm(noise))
            copy = noise.clone()
            self.w.add_(copy)
            self.rounds += 1
        self.cpu += time.process_time() - started


def floor_row(clients: int, virtual_seconds: float) -> dict[str, Any]:
    """The simulator's CPU per round at ``clients`` training clients beside the floor of the
    same work, measured interleaved in one process (see the module docstring)."""
    from simulator import _TrainingTotals, _Untimed, _warm_imports

    load_before = os.getloadavg()
    loaded = scaled(clients, virtual_seconds, cross_device=False)
    population = build_population(loaded)
    _warm_imports(population)
    floor = _Floor(population)
    floor.catch_up(FLOOR_BATCH, 10)  # torch.func's first call compiles its transforms
    floor.grads = floor.rounds = 0
    floor.cpu = 0.0
    training = _TrainingTotals(clocks=_Untimed())  # type: ignore[arg-type]

    def on_window(_line: dict[str, Any]) -> None:
        floor.catch_up(sum(training.per_group.values()), training.rounds)

    with _scratch_dir() as scratch:
        result = run_scenario(loaded, Path(scratch) / "run", population=population,
                              on_window=on_window, wrap_trainer=training.wrap)
    floor.catch_up(sum(training.per_group.values()), training.rounds)
    sim_cpu = result.cpu_seconds - floor.cpu
    return {
        "clients": clients, "mode": "floor",
        "virtual_seconds": result.summary["virtual_time"],
        "rounds": training.rounds, "sample_grads": sum(training.per_group.values()),
        "simulator_cpu_seconds": round(sim_cpu, 2),
        "floor_cpu_seconds": round(floor.cpu, 2),
        "simulator_ms_per_round": round(1e3 * sim_cpu / training.rounds, 3),
        "floor_ms_per_round": round(1e3 * floor.cpu / training.rounds, 3),
        "floor_over_simulator": round(floor.cpu / sim_cpu, 3),
        "fedsim_is_this_checkout": _fedsim_is_this_checkout(),
        "loadavg_before": [round(x, 2) for x in load_before],
        "loadavg_after": [round(x, 2) for x in os.getloadavg()],
    }


def _cpu_timed(function: Callable[..., Any], spent: dict[str, float],
               key: str) -> Callable[..., Any]:
    """``function`` adding the process CPU seconds of each call to ``spent[key]``."""

    def timed(*args: Any, **kwargs: Any) -> Any:
        started = time.process_time()
        try:
            return function(*args, **kwargs)
        finally:
            spent[key] += time.process_time() - started

    return timed


BOUND_PASS_CLIENTS = 128
"""Clients a group in :func:`batched_rounds_ms` (three groups: three passes of the batcher's
128 rounds a round)."""
BOUND_PASS_ROUNDS = 12


def batched_rounds_ms(population: Any, clients_per_group: int, rounds_per_client: int, *,
                      keep_alive: int = 0, timed_from: int = 1) -> dict[str, float]:
    """CPU ms per round of fedsim's batched pass with nothing around it: ``clients_per_group``
    clients of each group (the loop's mix: as many rounds a group), each with its own model
    vector, begin a round (its draws), are computed together by a
    :class:`~fedsim.training.batched.RoundBatcher` in passes of its size (noise and clipped
    sums written into the released updates) and step locally (``w - eta u`` in place), for
    ``rounds_per_client`` rounds after one untimed round (first touches). No ledger, codec,
    network, server or event loop: what the simulator's own batched path costs a round
    (``total``), and its parts (``draws``: beginning the rounds; ``pass``: the batched passes
    and taking their results; ``local_step``). ``keep_alive``: the last that many updates are
    held on (as a run's updates in flight are) instead of freed at once; ``timed_from``: the
    first round timed (later, to leave out the first touches of what is held)."""
    from fedsim.protocol.norms import measured_for_sender
    from fedsim.training.batched import RoundBatcher
    from fedsim.training.local_step import apply_local_step

    # Each update measured while in cache, as the simulation's batcher does (the sealed
    # protocol of loop_bound_row then takes that norm).
    batcher = RoundBatcher(population.model, measure=measured_for_sender)
    clients: list[tuple[Any, np.ndarray, float]] = []
    per_group: dict[str, int] = {}
    for plan in population.plans:
        if per_group.get(plan.group.name, 0) < clients_per_group:
            per_group[plan.group.name] = per_group.get(plan.group.name, 0) + 1
            clients.append((population.trainer(plan, batcher=batcher),
                            population.initial_params.copy(), float(plan.group.local_lr)))
    spent = dict.fromkeys(("draws", "pass", "local_step"), 0.0)
    alive: collections.deque[np.ndarray] = collections.deque(maxlen=max(1, keep_alive))
    for round_index in range(rounds_per_client + 1):
        started = time.process_time()
        pending = [trainer.begin_round(w, round_index) for trainer, w, _ in clients]
        begun = time.process_time()
        batcher.flush()
        results = [round_.result() for round_ in pending]
        computed = time.process_time()
        for k, ((trainer, w, eta), result) in enumerate(zip(clients, results, strict=True)):
            if not result.zero_update:
                clients[k] = (trainer, apply_local_step(w, result.update, eta, in_place=True), eta)
                if keep_alive:
                    alive.append(result.update)
        if round_index >= timed_from:  # (the first round touches vectors and buffers first)
            spent["draws"] += begun - started
            spent["pass"] += computed - begun
            spent["local_step"] += time.process_time() - computed
    rounds = len(clients) * (rounds_per_client + 1 - timed_from)
    parts = {name: 1e3 * seconds / rounds for name, seconds in spent.items()}
    return {**parts, "total": sum(parts.values())}


def loop_bound_row(clients: int, rounds_per_group: int = 400) -> dict[str, Any]:
    """The highest training ratio to the single loop that *any* simulator running fedsim's
    protocol could reach at ``clients`` training clients (issue 24's 1.0 target), measured.

    The single loop (:class:`simulator._SingleLoop`: each group's first client, its own
    posture) runs ``rounds_per_group`` rounds a group; its CPU per round is split into the
    per-sample engine's clipped sum (forward, backward, norms and the weighted sum into the
    noise: all that batching rounds together could save, taken as saved entirely) and the
    rest of its round (the sampling, the noise, the update and the local step: what every
    round needs whoever computes it) less the copy of the round's parameters into the model
    (``loop_param_load_ms_per_round``: a batched pass reads each round's vector in place;
    ``highest_possible_ratio_with_param_load`` keeps it, the bound as first published). A
    simulator must add the protocol's own per-message work
    (:func:`simulator.protocol_floor_ms`: the client's durable ledger append, the update
    encoded, decoded and checked, its share of the server's float64 mix; not the local step,
    which the loop also makes), so its round costs at least ``rest - load + protocol`` even
    with gradients for free and no event loop, network model or actors:
    ``ratio <= loop / (rest - load + protocol)``. Every group runs as many rounds here, where
    a run's rounds follow its groups' sizes: the loop's rounds average more examples than the run's
    (the clipped sum changes little at 1-4 examples).

    Gradients are not free, though: ``highest_ratio_with_fedsims_pass`` puts fedsim's own
    batched path in their place (:func:`batched_rounds_ms`: the rounds' draws, the batched
    pass with its noise, the local step; the same mix of groups), ``loop / (batched +
    protocol)``: the most a simulator built on today's batched pass could reach with no event
    loop, network model, actors or first touches of its run's state. The protocol there is
    the deployed one (frames encoded and decoded); the in-process network hands an update
    over sealed instead (its header checked, no frame bytes written, the norm the pass
    measured): ``highest_ratio_with_fedsims_pass_sealed`` is the same bound with that
    protocol (``sealed_protocol_ms_per_round``), the one a simulator need not go below.
    """
    from simulator import _SingleLoop, _warm_imports, protocol_floor_ms

    from fedsim.training.persample import engine_for

    load_before = os.getloadavg()
    loaded = scaled(clients, 3.0, cross_device=False)
    population = build_population(loaded)
    _warm_imports(population)
    single = _SingleLoop(population)
    engine = engine_for(population.model)
    spent = {"clipped_sum": 0.0, "param_load": 0.0}
    timed_sum = _cpu_timed(engine.clipped_sum, spent, "clipped_sum")
    engine.clipped_sum = timed_sum  # type: ignore[method-assign]
    # The loop copies each round's parameters into its model; a batched pass reads every
    # round's vector in place (fedsim.training.batched), so that copy is the loop's own work.
    from fedsim.training import local as local_module

    untimed_load = local_module.load_flat_params
    local_module.load_flat_params = _cpu_timed(untimed_load, spent, "param_load")
    try:
        single.catch_up(dict.fromkeys(single.loops, 50))  # warm: first batches' checks
        spent["clipped_sum"], spent["param_load"], single.clocks.cpu = 0.0, 0.0, 0.0
        rounds_before = sum(single.rounds.values())
        grads_before = sum(single.done.values())
        for name in single.loops:  # rounds_per_group more rounds each, as gradients
            while single.rounds[name] < rounds_per_group + 50:
                single.catch_up({name: single.done[name] + 1})
    finally:
        local_module.load_flat_params = untimed_load
    rounds = sum(single.rounds.values()) - rounds_before
    if not spent["clipped_sum"]:
        raise RuntimeError("the loop's trainers did not use the population's engine")
    loop_ms = 1e3 * single.clocks.cpu / rounds
    gradients_ms = 1e3 * spent["clipped_sum"] / rounds
    protocol = protocol_floor_ms(population, updates_per_window=100)
    protocol_ms = protocol["total"] - protocol["local_step"]
    simulated = protocol_floor_ms(population, updates_per_window=100, sealed=True)
    simulated_ms = simulated["total"] - simulated["local_step"]
    rest_ms = loop_ms - gradients_ms
    load_ms = 1e3 * spent["param_load"] / rounds
    batched = batched_rounds_ms(population, BOUND_PASS_CLIENTS, BOUND_PASS_ROUNDS)
    batched_ms = batched["total"]
    return {
        "clients": clients, "mode": "loop_bound", "rounds": rounds,
        "sample_grads": sum(single.done.values()) - grads_before,
        "loop_ms_per_round": round(loop_ms, 4),
        "loop_clipped_sum_ms_per_round": round(gradients_ms, 4),
        "loop_rest_ms_per_round": round(rest_ms, 4),
        "protocol_ms_per_round": round(protocol_ms, 4),
        "protocol_parts_ms": protocol,
        "loop_param_load_ms_per_round": round(load_ms, 4),
        "highest_possible_ratio": round(loop_ms / (rest_ms - load_ms + protocol_ms), 3),
        "highest_possible_ratio_with_param_load": round(loop_ms / (rest_ms + protocol_ms), 3),
        "batched_clients_per_group": BOUND_PASS_CLIENTS,
        "batched_ms_per_round": round(batched_ms, 4),
        "batched_parts_ms": {name: round(ms, 4) for name, ms in batched.items()},
        "highest_ratio_with_fedsims_pass": round(loop_ms / (batched_ms + protocol_ms), 3),
        "sealed_protocol_ms_per_round": round(simulated_ms, 4),
        "sealed_protocol_parts_ms": simulated,
        "highest_ratio_with_fedsims_pass_sealed": round(loop_ms / (batched_ms + simulated_ms), 3),
        "fedsim_is_this_checkout": _fedsim_is_this_checkout(),
        "loadavg_before": [round(x, 2) for x in load_before],
        "loadavg_after": [round(x, 2) for x in os.getloadavg()],
    }


def peak_state(clients: int, virtual_seconds: float) -> dict[str, Any]:
    """What a training run holds as it grows to its peak: every ``clients / 4`` local steps, how
    many clients hold a moved model of their own (a local step made it; the rest share the
    received global), how many of those moved once since their global, how many released
    updates are still alive (on the simulated links, in the server's inbox, waiting for their
    round's end) and the resident size. Each is a 400 KB vector here, touched for the first
    time when the run first needs that many (docs/SCALE.md, session 48)."""
    import weakref

    from fedsim.runtime.actors.client import ClientActor

    actors: dict[int, Any] = {}
    updates: list[Any] = []
    steps = [0]
    samples: list[dict[str, Any]] = []
    every = max(1, clients // 4)
    step_locally = ClientActor._step_locally

    def counted(self: Any, result: Any, round_index: int) -> None:
        actors[id(self)] = self
        if not result.zero_update:
            updates.append(weakref.ref(result.update))
        step_locally(self, result, round_index)
        steps[0] += 1
        if steps[0] % every == 0:
            own = [a for a in actors.values() if a.w is not None and a.w is not a.held_global]
            updates[:] = [u for u in updates if u() is not None]
            samples.append({
                "virtual_time": round(self.clock.now(), 4), "moved_models": len(own),
                "moved_once": sum(1 for a in own if a.rounds_since_global == 1),
                "updates_alive": len(updates), "rss_mb": round(rss_mb())})

    loaded = scaled(clients, virtual_seconds, cross_device=False)
    population = build_population(loaded)
    ClientActor._step_locally = counted  # type: ignore[method-assign]
    try:
        with _scratch_dir() as scratch:
            run_scenario(loaded, Path(scratch) / "run", population=population)
    finally:
        ClientActor._step_locally = step_locally  # type: ignore[method-assign]
    return {"clients": clients, "virtual_seconds": virtual_seconds,
            "vector_mb": round(population.initial_params.nbytes / 2**20, 3),
            "samples": samples, "peak_rss_mb": round(_peak_mb())}


def profile_rounds(clients: int, virtual_seconds: float, top: int = 40) -> dict[str, Any]:
    """The same run as :func:`floor_row` (without the floor) under cProfile with a CPU-time
    timer: CPU ms per round by function (own time) and the heaviest cumulative entries."""
    import cProfile
    import pstats

    from simulator import _TrainingTotals, _Untimed, _warm_imports

    loaded = scaled(clients, virtual_seconds, cross_device=False)
    population = build_population(loaded)
    _warm_imports(population)
    training = _TrainingTotals(clocks=_Untimed())  # type: ignore[arg-type]
    profile = cProfile.Profile(time.process_time)
    with _scratch_dir() as scratch:
        profile.enable()
        run_scenario(loaded, Path(scratch) / "run", population=population,
                     wrap_trainer=training.wrap)
        profile.disable()
    stats = pstats.Stats(profile).stats  # type: ignore[attr-defined]
    rounds = max(1, training.rounds)

    def where(key: tuple[str, int, str]) -> str:
        file, line, name = key
        short = file.split("fedsim/", 1)[-1] if "fedsim/" in file else Path(file).name
        return f"{short}:{line}({name})"

    own = sorted(((t, c, where(k)) for k, (_, c, t, _, _) in stats.items()), reverse=True)
    cumulative = sorted(((t, c, where(k)) for k, (_, c, _, t, _) in stats.items()), reverse=True)
    total = sum(t for t, _, _ in own)
    return {
        "clients": clients, "virtual_seconds": virtual_seconds, "rounds": training.rounds,
        "profiled_cpu_seconds": round(total, 2),
        "ms_per_round_profiled": round(1e3 * total / rounds, 3),
        "own_ms_per_round": [{"ms": round(1e3 * t / rounds, 4), "calls": c, "where": w}
                             for t, c, w in own[:top]],
        "cumulative_ms_per_round": [{"ms": round(1e3 * t / rounds, 4), "calls": c, "where": w}
                                    for t, c, w in cumulative[:top]],
    }


def ray_row(scenario: str, executor: str, virtual_seconds: float) -> dict[str, Any]:
    """One executor row: ``scenario`` (``hetero-100`` or a client count of the scaled
    scenario) run in-process (``local``) or with its batched passes on ``ray-N`` local workers."""
    load_before = os.getloadavg()
    if scenario == "hetero-100":
        base = load_scenario(REPO / "scenarios" / "hetero-100.yaml")
        tree = base.scenario.model_dump(mode="json")
        tree["stop"] = {"virtual_seconds": virtual_seconds}
        loaded = LoadedScenario(parse_scenario(tree), base.source)
    else:
        loaded = scaled(int(scenario), virtual_seconds, cross_device=False)
    population = build_population(loaded)
    make = None
    if executor.startswith("ray-"):
        import ray

        from fedsim.runtime.simulated.ray_executor import ray_batcher

        workers = int(executor.split("-")[1])
        ray.init(num_cpus=workers, include_dashboard=False, log_to_driver=False)
        make = ray_batcher(workers=workers)
    with _scratch_dir() as scratch:
        result = run_scenario(loaded, Path(scratch) / "run", population=population,
                              make_batcher=make)
    run_wall = result.wall_seconds - result.setup_seconds
    return {
        "scenario": scenario, "executor": executor,
        "virtual_seconds": result.summary["virtual_time"],
        "wall_seconds": round(result.wall_seconds, 2),
        "setup_seconds": round(result.setup_seconds, 2),
        "driver_cpu_seconds": round(result.cpu_seconds, 2),
        "sample_grads": result.sample_grads,
        "sample_grads_per_wall_s": round(result.sample_grads / run_wall, 1),
        "simulated_s_per_wall_s": round(result.summary["virtual_time"] / run_wall, 4),
        "final_params_sha256": __import__("hashlib").sha256(result.final_params.tobytes()).hexdigest(),
        "loadavg_before": [round(x, 2) for x in load_before],
        "loadavg_after": [round(x, 2) for x in os.getloadavg()],
    }


def breakdown(clients: int, virtual_seconds: float) -> dict[str, Any]:
    """Where memory goes at ``clients`` training clients (see the module docstring)."""
    import numpy as np

    load_before = os.getloadavg()
    phases = {"imports": rss_mb()}
    loaded = scaled(clients, virtual_seconds, cross_device=False)
    population = build_population(loaded)
    phases["population"] = rss_mb()
    marks: dict[str, Any] = {}

    def on_window(line: dict[str, Any]) -> None:
        if "first_window" not in marks:
            marks["first_window"] = rss_mb()
            marks["peak_by_first_window"] = _peak_mb()
        marks["snapshot"] = tracemalloc.take_snapshot()
        marks["last"] = rss_mb()

    tracemalloc.start(1)
    with _scratch_dir() as scratch:
        result = run_scenario(loaded, Path(scratch) / "run", population=population,
                              on_window=on_window)
        tracemalloc.stop()
        shared = population.train_x
        copies = sum(int(c.trainer.trainer.features.nbytes + c.trainer.trainer.labels.nbytes)
                     for c in result.clients.values()
                     if hasattr(c.trainer, "trainer") and c.trainer.trainer.features is not shared)
        moved: dict[int, int] = {}
        held: dict[int, int] = {}
        for client in result.clients.values():
            actor = client.actor
            if actor is None:
                continue
            if actor.w is not None and actor.w is not actor.held_global:
                moved[id(actor.w)] = actor.w.nbytes
            if actor.held_global is not None:
                base = actor.held_global.base if actor.held_global.base is not None else actor.held_global
                held[id(base)] = actor.held_global.nbytes
        generators = sum(1 for c in result.clients.values() if hasattr(c.trainer, "trainer"))
    by_file: dict[str, float] = {}
    by_line: list[tuple[float, int, str]] = []
    for stat in marks["snapshot"].statistics("lineno"):
        frame = stat.traceback[0]
        name = frame.filename.split("fedsim/", 1)[-1] if "fedsim/" in frame.filename else \
            Path(frame.filename).name
        by_file[name] = by_file.get(name, 0.0) + stat.size / 2**20
        by_line.append((stat.size / 2**20, stat.count, f"{name}:{frame.lineno}"))
    by_line.sort(reverse=True)
    params = population.initial_params.size
    return {
        "clients": clients,
        "virtual_seconds": result.summary["virtual_time"],
        "rss_mb": {"after_imports": round(phases["imports"]),
                   "after_population": round(phases["population"]),
                   "after_first_window": round(marks["first_window"]),
                   "peak_by_first_window": round(marks["peak_by_first_window"]),
                   "at_last_window": round(marks["last"]), "peak": round(_peak_mb())},
        "held_at_the_end_mb": {
            "data_set_shared": round((population.train_x.nbytes + population.train_y.nbytes) / 2**20, 1),
            "per_client_data_copies": round(copies / 2**20, 1),
            "moved_local_models": round(sum(moved.values()) / 2**20, 1),
            "moved_local_models_count": len(moved),
            "distinct_held_global_models": len(held),
            "held_global_models": round(sum(held.values()) / 2**20, 1),
            "torch_generators_estimate": round(generators * 2.6 / 1024, 1),
        },
        "model_vector_kb": round(params * 4 / 1024, 1),
        "tracemalloc_live_mb_by_file": {k: round(v, 1) for k, v in
                                        sorted(by_file.items(), key=lambda kv: -kv[1])[:12]},
        "tracemalloc_top_lines": [{"mb": round(mb, 1), "blocks": n, "where": where}
                                  for mb, n, where in by_line[:10]],
        "cpu_seconds": round(result.cpu_seconds, 2),
        "wall_seconds": round(result.wall_seconds, 2),
        "loadavg_before": [round(x, 2) for x in load_before],
        "loadavg_after": [round(x, 2) for x in os.getloadavg()],
        "numpy": np.__version__,
    }


def client_allocations(clients: int) -> dict[str, int]:
    """Bytes ``tracemalloc`` sees live, by ``file:line``, at the first window's end of a
    message-only run of ``clients`` (under the directory lock; see ``--per-client``)."""
    import gc

    from fedsim.runtime.simulated import run_ledgers

    run_ledgers.ledger_handles_fit = lambda _ledgers: False  # as from 9,870 clients
    loaded = scaled(clients, 61.0, cross_device=True)
    population = build_population(loaded)
    snapshots: list[tracemalloc.Snapshot] = []

    def on_window(_line: dict[str, Any]) -> None:
        if not snapshots:
            gc.collect()
            snapshots.append(tracemalloc.take_snapshot())

    tracemalloc.start(1)
    with _scratch_dir() as scratch:
        run_scenario(loaded, Path(scratch) / "run", population=population, message_only=True,
                     on_window=on_window)
    tracemalloc.stop()
    lines: dict[str, int] = {}
    for stat in snapshots[0].statistics("lineno"):
        frame = stat.traceback[0]
        name = frame.filename.split("fedsim/", 1)[-1] if "fedsim/" in frame.filename else \
            Path(frame.filename).name
        lines[f"{name}:{frame.lineno}"] = stat.size
    return lines


def per_client(sizes: tuple[int, int]) -> dict[str, Any]:
    """One message-only client's share of the Python allocations (see ``--per-client``)."""
    small, large = (_subprocess(["--allocations-one", str(n)], 1200) for n in sizes)
    if "lines" not in small or "lines" not in large:
        return {"failed": True, "runs": [small, large]}
    share = {k: (large["lines"].get(k, 0) - small["lines"].get(k, 0)) / (sizes[1] - sizes[0])
             for k in set(small["lines"]) | set(large["lines"])}
    by_file: dict[str, float] = {}
    for key, value in share.items():
        by_file[key.rsplit(":", 1)[0]] = by_file.get(key.rsplit(":", 1)[0], 0.0) + value
    top = sorted(share.items(), key=lambda kv: -kv[1])
    return {
        "clients": list(sizes),
        "bytes_a_client": round(sum(share.values())),
        "by_file": {k: round(v) for k, v in sorted(by_file.items(), key=lambda kv: -kv[1])[:20]},
        "top_lines": {k: round(v) for k, v in top[:25]},
        "code": commit(),
        "loadavg": [round(x, 2) for x in os.getloadavg()],
    }


def _subprocess(args: list[str], timeout: int) -> dict[str, Any]:
    command = [sys.executable, str(Path(__file__).resolve()), *args]
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=timeout, check=False)
    except subprocess.TimeoutExpired:
        return {"timed_out": True, "timeout_s": timeout, "loadavg": list(os.getloadavg())}
    lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
    if done.returncode != 0 or not lines:
        return {"failed": True, "returncode": done.returncode, "stderr_tail": done.stderr[-2000:]}
    return json.loads(lines[-1])


def _load_results() -> dict[str, Any]:
    if RESULTS.exists():
        return json.loads(RESULTS.read_text(encoding="utf-8"))
    return {}


def _save(document: dict[str, Any]) -> None:
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps(document, indent=2) + "\n", encoding="utf-8")


def _ray_rows(which: str, allocator: str) -> None:
    document = _load_results()
    rows = []
    for scenario, seconds, bound in (("hetero-100", 20.0, 600), ("10000", 0.3, 900)):
        if scenario not in which.split(","):
            continue
        for executor in ("local", "ray-1", "ray-2"):
            row = _subprocess(["--ray-one", scenario, executor, str(seconds),
                               "--allocator", allocator], bound)
            row.update(scenario=scenario, executor=executor, time_bound_s=bound)
            print(json.dumps(row), flush=True)
            rows.append(row)
            document["ray"] = rows
            _save(document)


def _floor_rows(clients: int, virtual_seconds: float, *, profile: bool, allocator: str) -> None:
    floor = floor_row(clients, virtual_seconds)
    floor["code"] = commit()
    floor["allocator"] = allocator
    from fedsim.aggregation import scaled_add
    from fedsim.protocol import norms

    # The compiled kernels the simulator ran with (FEDSIM_PURE_NUMPY_NORM=1 / _ADD=1: numpy's)
    floor["norm_kernel"] = norms._kernel() is not None
    floor["mix_kernel"] = scaled_add._kernel() is not None
    print(json.dumps(floor), flush=True)
    profiled = None
    if profile:
        profiled = profile_rounds(clients, virtual_seconds)
        profiled["code"] = floor["code"]
        print(json.dumps(profiled, indent=1), flush=True)
    # Read the results file only now: a row takes minutes, and what others wrote meanwhile stays.
    document = _load_results()
    document.setdefault("floor", []).append(floor)
    if profiled is not None:
        document["floor_profile"] = profiled
    _save(document)


def cold_loop_rows(clients: int, gradients_per_group: int = 4000,
                   repeats: int = 2) -> list[dict[str, Any]]:
    """What holding a model per client costs the single loop itself (issue 24): the loop as
    the rows run it (:class:`simulator._SingleLoop`: one model vector a group, warm) against
    the same loop whose rounds cycle over as many distinct vectors as the group has clients,
    each round writing its client's moved model back (cold: 400 KB a round read and written
    that no cache holds at 10^3 clients). Each vector is touched once before the timing (the
    first touches are the simulator's first-window cost, measured by the rows' page faults).
    Alternating warm and cold, ``repeats`` times; CPU per gradient of ``gradients_per_group``
    gradients a group."""
    from simulator import _SingleLoop, _warm_imports, loop_round

    loaded = scaled(clients, 4.0, cross_device=False)
    torch.set_num_threads(loaded.scenario.torch_threads)  # as the simulation runs
    population = build_population(loaded)
    _warm_imports(population)
    loop = _SingleLoop(population)
    sizes = {name: plan.group.count for name, (_, plan) in loop.loops.items()}
    rows = []
    for repeat in range(repeats):
        for cold in (False, True):
            cpu = 0.0
            grads = rounds = 0
            for name, (trainer, plan) in loop.loops.items():
                count = sizes[name] if cold else 1
                vectors = [population.initial_params.copy() for _ in range(count)]
                for k in range(count):  # every vector touched once, untimed
                    vectors[k], _ = loop_round(trainer, plan, vectors[k], k)
                done = r = 0
                started = time.process_time()
                while done < gradients_per_group:
                    k = r % count
                    vectors[k], round_grads = loop_round(trainer, plan, vectors[k], count + r)
                    done, r = done + round_grads, r + 1
                cpu += time.process_time() - started
                grads, rounds = grads + done, rounds + r
            rows.append({"clients": clients, "repeat": repeat, "cold": cold,
                         "vectors": sum(sizes.values()) if cold else len(sizes),
                         "sample_grads": grads, "rounds": rounds, "cpu_seconds": round(cpu, 3),
                         "sample_grads_per_cpu_s": round(grads / cpu, 1),
                         "cpu_ms_per_round": round(1e3 * cpu / rounds, 4)})
            print(json.dumps(rows[-1]), flush=True)
    return rows


def _cold_loop_rows(clients: int, allocator: str) -> None:
    load_before = os.getloadavg()
    rows = cold_loop_rows(clients)
    document = _load_results()
    document.setdefault("cold_loop", []).append({
        "code": commit(), "allocator": allocator, "rows": rows,
        "loadavg_before": [round(x, 2) for x in load_before],
        "loadavg_after": [round(x, 2) for x in os.getloadavg()]})
    _save(document)


def _loop_bound_rows(clients: int, allocator: str) -> None:
    row = loop_bound_row(clients)
    row["code"] = commit()
    row["allocator"] = allocator
    print(json.dumps(row), flush=True)
    document = _load_results()  # after the row, as _floor_rows
    document.setdefault("loop_bound", []).append(row)
    _save(document)


def _floor_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--loop-bound", type=int, metavar="CLIENTS",
                        help="the highest ratio to the single loop any simulator running the "
                             "protocol could reach at CLIENTS training clients")
    parser.add_argument("--cold-loop", type=int, metavar="CLIENTS",
                        help="the single loop with a model vector per client against one a "
                             "group (what per-client state costs the loop itself)")
    parser.add_argument("--floor", action="store_true",
                        help="simulator vs the floor of its work at 1,000 training clients")
    parser.add_argument("--floor-clients", type=int, default=1000)
    parser.add_argument("--profile", action="store_true", help="with --floor: a cProfile run")


def _floor_modes(args: argparse.Namespace, allocator: str) -> bool:
    """``--loop-bound``, ``--cold-loop`` or ``--floor``; False: none was asked for."""
    if args.loop_bound:
        _loop_bound_rows(args.loop_bound, allocator)
        return True
    if args.cold_loop:
        _cold_loop_rows(args.cold_loop, allocator)
        return True
    if args.floor:
        _floor_rows(args.floor_clients, args.virtual_seconds, profile=args.profile,
                    allocator=allocator)
        return True
    return False


def _per_client_arguments(parser: argparse.ArgumentParser) -> None:
    """``--per-client`` and the rows' own subprocesses' arguments."""
    parser.add_argument("--ray-one", nargs=3, help=argparse.SUPPRESS)
    parser.add_argument("--one", nargs=3, metavar=("CLIENTS", "MODE", "VIRTUAL_SECONDS"),
                        help=argparse.SUPPRESS)
    parser.add_argument("--per-client", metavar="N,M",
                        help="one message-only client's Python allocations (tracemalloc, M vs N)")
    parser.add_argument("--allocations-one", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--peak-state", type=int, metavar="CLIENTS",
                        help="what a training run holds on its way to its peak (moved models, "
                        "updates alive, resident size) over --virtual-seconds")


def _per_client_modes(args: argparse.Namespace) -> bool:
    """``--peak-state``, ``--per-client`` (and its subprocesses); False: none was asked for."""
    if args.peak_state:
        result = {**peak_state(args.peak_state, args.virtual_seconds), "code": commit()}
        print(json.dumps(result))
        document = _load_results()
        document.setdefault("peak_state", []).append(result)
        _save(document)
        return True
    if args.allocations_one:
        print(json.dumps({"lines": client_allocations(args.allocations_one)}))
        return True
    if not args.per_client:
        return False
    small, large = (int(n) for n in args.per_client.split(","))
    result = per_client((small, large))
    print(json.dumps(result, indent=1))
    document = _load_results()
    document["per_client_memory"] = result
    _save(document)
    return True


def _plan_rows(args: argparse.Namespace, scratch: list[str]) -> None:
    """The plan's rows of the sizes and modes asked, each in its own subprocess, saved as
    they finish."""
    sizes = {int(s) for s in args.sizes.split(",")} if args.sizes else None
    modes = set(args.modes.split(","))
    document = _load_results()
    # A row replaces the row of its size, mode and commit; earlier commits' rows stay (the
    # README's table cites them).
    rows = {(r["clients"], r["mode"], r.get("code")): r for r in document.get("rows", [])}
    for clients, mode, virtual_seconds, bound in PLAN:
        if (sizes is not None and clients not in sizes) or mode not in modes:
            continue
        bound = args.timeout or bound
        print(f"{clients} clients, {mode}, {virtual_seconds} virtual s (bound {bound} s)",
              flush=True)
        row = _subprocess(["--one", str(clients), mode, str(virtual_seconds), *scratch,
                           "--allocator", args.allocator], bound)
        row.setdefault("clients", clients)
        row.setdefault("mode", mode)
        row["time_bound_s"] = bound
        row["code"] = commit()
        print(json.dumps(row), flush=True)
        rows[(clients, mode, row["code"])] = row
        document["rows"] = list(rows.values())
        document.update({
            "python": platform.python_version(), "torch": torch.__version__,
            "cpus": os.cpu_count(), "machine": platform.machine(),
            "targets": {"train_10000_ratio": 0.9, "clients_100000_peak_rss_mb": 8192},
            "scenario": "hetero-100 scaled (see benchmarks/scale.py)",
        })
        _save(document)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", help="comma-separated client counts to run from the plan")
    parser.add_argument("--modes", default="train,message,train-large")
    parser.add_argument("--timeout", type=int, help="override every row's time bound (s)")
    parser.add_argument("--breakdown", type=int, metavar="N")
    parser.add_argument("--label", default="this checkout")
    parser.add_argument("--virtual-seconds", type=float, default=3.0)
    _floor_arguments(parser)
    parser.add_argument("--ray", action="store_true",
                        help="executor rows: in-process vs 1 and 2 local Ray workers")
    parser.add_argument("--ray-scenarios", default="hetero-100,10000")
    _per_client_arguments(parser)
    parser.add_argument("--scratch", type=Path,
                        help="directory for run directories (default /dev/shm when present)")
    add_allocator_option(parser)
    args = parser.parse_args()
    allocator = set_allocator(args.allocator)
    scratch = _use_scratch(args.scratch)
    torch.set_num_threads(1)
    import logging

    from fedsim.logging import configure_logging

    configure_logging(True)
    logging.disable(logging.WARNING)
    if args.ray_one:
        row = ray_row(args.ray_one[0], args.ray_one[1], float(args.ray_one[2]))
        print(json.dumps({**row, "allocator": allocator}))
        return
    if args.ray:
        _ray_rows(args.ray_scenarios, allocator)
        return
    if args.one:
        row = measure(int(args.one[0]), args.one[1], float(args.one[2]))
        print(json.dumps({**row, "allocator": allocator}))
        return
    if _per_client_modes(args):
        return
    if _floor_modes(args, allocator):
        return
    if args.breakdown:
        result = {**breakdown(args.breakdown, args.virtual_seconds), "allocator": allocator}
        print(json.dumps(result))
        document = _load_results()
        document.setdefault("memory_breakdown", {})[args.label] = result
        _save(document)
        return
    _plan_rows(args, scratch)


if __name__ == "__main__":
    main()
