"""Cost of one DP-SGD step against a plain SGD step: fedsim vs Opacus 1.6, batch 256.

Models: the classic DP MNIST CNN (26k parameters), the MLP 784-256-10 (203k) and the GroupNorm
CNN of ``scenarios/cifar10-groupnorm.yaml`` (read from that file, on 3x32x32 inputs). Variants:

* ``plain``: forward, mean cross-entropy, backward, SGD update (no privacy);
* ``fedsim``: :func:`fedsim.training.dpsgd.noisy_gradient` (per-example norms by book-keeping,
  clip, sum, Gaussian noise, divide by m) plus the SGD update (one ``_foreach_add_``);
* ``opacus_hooks`` / ``opacus_functorch`` / ``opacus_ghost``: Opacus' ``make_private`` with
  that ``grad_sample_mode`` (ghost = fast gradient clipping), one ``optimizer.step()``;
* ``minimal`` (the MLP only, asked for by name): the same DP step written by hand in the fewest
  torch ops called from Python (:func:`_minimal_dp_step`), none of the engine's checks or
  generality: a reference point for the engine's overhead on the machine measured;
  ``minimal_noiseless`` the same without the Gaussian draw (a zero vector instead; not DP):
  what the noise costs inside the step.

Each (model, variant, threads) runs in its own process, so ``peak_rss_mb`` (ru_maxrss) is that
variant's own peak. The machine is shared with other work, so each process alternates blocks
of the variant with blocks of plain SGD and ``ratio_vs_plain`` is the median ratio of adjacent
blocks (step time / plain step time, same model and threads); ``samples_per_s`` is from the
median block. ``cpu_ratio_vs_plain`` is the same median of ratios with the process's CPU time
(``time.process_time``) in place of wall time: other processes' share of the CPUs leaves it
alone, so on a loaded machine it is the steadier figure (at one thread it counts the same work).
With ``--passes`` > 1 the pass with the lowest ratio is kept.
Writes benchmarks/results/dp_step.json: a list of {model, variant, threads, samples_per_s,
ratio_vs_plain, cpu_ratio_vs_plain, peak_rss_mb, allocator, commit, dirty, loadavg_start,
loadavg_end}: ``allocator`` is ``keep`` when the workers' allocator keeps freed memory as every
fedsim command's process does (:mod:`fedsim.runtime.allocator`; the default) and ``system``
for glibc's defaults (``--allocator system``: what a library caller gets, and what is measured
where there is no glibc); ``commit`` is ``git rev-parse HEAD`` of the code measured, ``dirty``
whether tracked files differed from it, ``loadavg_*`` the machine's ``os.getloadavg()`` (1, 5,
15 min) when that row's process started and ended. fedsim rows add ``noise_vs_plain``, the Gaussian draw alone (one
value per parameter, :mod:`fedsim.training.gaussian`) against the plain step, measured the same
way, ``noise_kernel``: ``compiled`` when the sampler's C kernel ran, ``torch`` when its
torch fallback did (no C compiler), and ``conv_kernel``: ``compiled`` when convolutions' per-example
gradients could take the compiled direct kernel (:mod:`fedsim.training.persample.direct`),
``torch`` when only torch's routes ran (no compiler or AVX2, or ``FEDSIM_PURE_TORCH_CONV=1``,
which measures those routes side by side).

    python benchmarks/dp_step.py              # threads 1 and 2, 2 passes
    python benchmarks/dp_step.py --quick      # short blocks, 1 pass, threads 1
    python benchmarks/dp_step.py --models mlp --variants plain,fedsim,minimal --threads 1
    FEDSIM_BENCH_TREE=/path/to/old/checkout python benchmarks/dp_step.py --out old.json

The fedsim measured is this checkout's (``sys.path``), or ``FEDSIM_BENCH_TREE``'s; each worker
checks that it imported that one, and ``commit`` names that tree's HEAD.

Notes (what the figures are made of) are in docs/SCALE.md, "The DP-SGD step".
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import resource
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
# The fedsim measured: this tree's (not an installed copy's), or FEDSIM_BENCH_TREE's (an old
# checkout, for side-by-side runs); its commit is what every row names.
TREE = Path(os.environ.get("FEDSIM_BENCH_TREE", str(ROOT))).resolve()
sys.path.insert(0, str(TREE))
MODELS = ("dp_mnist_cnn", "mlp", "groupnorm_cnn")
GROUPNORM_SCENARIO = ROOT / "scenarios" / "cifar10-groupnorm.yaml"
VARIANTS = ("plain", "fedsim", "opacus_hooks", "opacus_functorch", "opacus_ghost")
EXTRA_VARIANTS = ("minimal", "minimal_noiseless")  # asked for by name (--variants), the MLP only
BATCH = 256
CLIP, SIGMA, LR = 1.0, 1.0, 0.1


def _build(model_name: str):  # noqa: ANN202 - torch imported lazily in the worker
    from fedsim.training import build_model

    if model_name == "mlp":
        return build_model(model_name, hidden=(256,))
    if model_name == "groupnorm_cnn":  # the scenario's model, options and all
        from fedsim.config.loading import load_scenario

        spec = load_scenario(GROUPNORM_SCENARIO).scenario.model
        assert spec.name == model_name, spec
        return build_model(spec.name, **spec.options)
    return build_model(model_name)


def _input_shape(model_name: str) -> tuple[int, ...]:
    return (BATCH, 3, 32, 32) if model_name == "groupnorm_cnn" else (BATCH, 1, 28, 28)


def code_version() -> dict[str, Any]:
    """The commit of the tree measured and whether its tracked files differed from it."""
    def git(*args: str) -> str:
        done = subprocess.run(["git", *args], capture_output=True, text=True, cwd=TREE, check=False)
        return done.stdout.strip() if done.returncode == 0 else ""

    commit = git("rev-parse", "HEAD") or "unknown"
    return {"commit": commit, "dirty": bool(git("status", "--porcelain", "--untracked-files=no"))}


def _step_function(model_name: str, variant: str) -> Callable[[], None]:
    import torch
    import torch.nn.functional as F

    torch.manual_seed(0)
    model = _build(model_name)
    x = torch.rand(*_input_shape(model_name))
    y = torch.randint(0, 10, (BATCH,))
    if variant == "plain":
        optimizer = torch.optim.SGD(model.parameters(), lr=LR)

        def plain() -> None:
            optimizer.zero_grad(set_to_none=True)
            F.cross_entropy(model(x), y).backward()
            optimizer.step()

        return plain
    if variant == "fedsim":
        from fedsim.training.dpsgd import noisy_gradient
        from fedsim.training.persample import engine_for

        engine = engine_for(model)
        params = engine.parameters()
        generator = torch.Generator().manual_seed(0)
        indices = torch.arange(BATCH)

        def fedsim_step() -> None:
            release = noisy_gradient(
                engine,
                x,
                y,
                indices,
                sampling="fixed",
                clip=CLIP,
                noise_multiplier=SIGMA,
                expected_batch_size=BATCH,
                generator=generator,
                max_physical_batch=BATCH,
            )
            with torch.no_grad():  # the in-place SGD update, as one multi-tensor op
                torch._foreach_add_(params, _views(release.gradient, params), alpha=-LR)

        return fedsim_step
    if variant in EXTRA_VARIANTS:
        return _minimal_dp_step(model, x, y, noise=variant == "minimal")

    from opacus import PrivacyEngine
    from torch.utils.data import DataLoader, TensorDataset

    mode = variant.removeprefix("opacus_")
    loader = DataLoader(TensorDataset(x, y), batch_size=BATCH)
    optimizer = torch.optim.SGD(model.parameters(), lr=LR)
    engine = PrivacyEngine()
    made = engine.make_private(
        module=model,
        optimizer=optimizer,
        data_loader=loader,
        noise_multiplier=SIGMA,
        max_grad_norm=CLIP,
        poisson_sampling=False,
        grad_sample_mode=mode,
        criterion=torch.nn.CrossEntropyLoss(),
    )
    if mode == "ghost":
        private, dp_optimizer, criterion, _ = made
    else:
        private, dp_optimizer, _ = made
        criterion = torch.nn.CrossEntropyLoss()

    def opacus_step() -> None:
        dp_optimizer.zero_grad(set_to_none=True)
        criterion(private(x), y).backward()
        dp_optimizer.step()

    return opacus_step


def _minimal_dp_step(model, x, y, noise: bool = True) -> Callable[[], None]:  # noqa: ANN001
    """The MLP's DP-SGD step (``nn.Sequential`` of ``Linear`` with bias and ``ReLU``, run in
    registration order) written by hand in the fewest torch ops called from Python: the same
    noise (fedsim's sampler, fixed-size sampling's std ``2 C sigma / m``), the batch gathered,
    a forward with the parameters out of the graph (the first Linear's output a leaf of it),
    one backward to the Linears' outputs, ghost norms, clipping factors, each layer's clipped
    sum added into the noise (``addmm_`` for the weight, ``addmv_`` for the bias), the update.
    The noise std and the clipping factors come from fedsim's one definition of each
    (:func:`~fedsim.training.dpsgd.noise_std`, :func:`~fedsim.training.persample.clip_factors`);
    it releases what fedsim's step releases, to the bit (tested). Left out: fedsim's checks,
    hooks and generality, the counts and the loss sum a step returns. A reference point for the engine's overhead on the machine
    measured, not a lower bound (fused or compiled code could go below it), and not a step to
    use. ``noise=False`` (``minimal_noiseless``) starts from a zero vector instead of the
    Gaussian draw: not DP at all, it shows what the rest of the step costs."""
    import torch
    import torch.nn.functional as F

    from fedsim.training.dpsgd import noise_std
    from fedsim.training.gaussian import gaussian_noise
    from fedsim.training.persample import clip_factors

    layers = [m for m in model.modules() if not list(m.children())]
    if not all(type(m) in (torch.nn.Linear, torch.nn.ReLU) for m in layers) or any(
        type(m) is torch.nn.Linear and m.bias is None for m in layers
    ):
        raise ValueError("the minimal step is written for Linear (with bias) / ReLU networks (the MLP)")
    linears = [m for m in layers if isinstance(m, torch.nn.Linear)]
    params = [p for m in linears for p in (m.weight, m.bias)]
    size = sum(p.numel() for p in params)
    generator = torch.Generator().manual_seed(0)
    indices = torch.arange(BATCH)
    scale = 1.0 / BATCH  # the released sum is divided by m, as noisy_gradient does
    std = noise_std("fixed", CLIP, SIGMA, BATCH)  # the one sensitivity rule: 2C for fixed size

    def minimal() -> None:
        with torch.no_grad():
            flat = gaussian_noise(size, std, generator, params[0]) if noise else torch.zeros(size)
            h = x.index_select(0, indices).flatten(1)
            labels = y.index_select(0, indices)
        inputs, outputs = [], []
        with torch.enable_grad():
            for module in layers:
                if isinstance(module, torch.nn.Linear):
                    inputs.append(h.detach())
                    h = torch.addmm(module.bias.detach(), h, module.weight.detach().t())
                    if not h.requires_grad:
                        h.requires_grad_()
                    outputs.append(h)
                else:
                    h = torch.relu(h)
            total = F.cross_entropy(h, labels, reduction="none").sum()
            grads = torch.autograd.grad(total, outputs)
        with torch.no_grad():
            sq = None
            for a, g in zip(inputs, grads, strict=True):
                part = torch.linalg.vector_norm(g, dim=1).square_().mul_(
                    torch.linalg.vector_norm(a, dim=1).square_().add_(1.0))
                sq = part if sq is None else sq.add_(part)
            factors = clip_factors(sq.sqrt_(), CLIP, scale)
            views = _views(flat, params)
            for k, (a, g) in enumerate(zip(inputs, grads, strict=True)):
                views[2 * k].addmm_((g * factors.unsqueeze(1)).t(), a)
                views[2 * k + 1].addmv_(g.t(), factors)
            torch._foreach_add_(params, views, alpha=-LR)

    return minimal


def _noise_draw(model_name: str) -> Callable[[], None]:
    """The Gaussian draw alone, as fedsim's step makes it (one value per parameter)."""
    import torch

    from fedsim.training.gaussian import gaussian_noise

    params = list(_build(model_name).parameters())
    size, like = sum(p.numel() for p in params), params[0].detach()
    generator = torch.Generator().manual_seed(1)

    def draw() -> None:
        gaussian_noise(size, 1.0, generator, like)

    return draw


def _block_time(step: Callable[[], None], block: int) -> float:
    return _block_times(step, block)[0]


def _block_times(step: Callable[[], None], block: int) -> tuple[float, float]:
    """Wall and process CPU seconds per step over ``block`` steps."""
    started, cpu = time.perf_counter(), time.process_time()
    for _ in range(block):
        step()
    return (time.perf_counter() - started) / block, (time.process_time() - cpu) / block


def worker(
    model_name: str, variant: str, threads: int, seconds: float, allocator: str = "keep"
) -> dict[str, Any]:
    """Time one configuration in this process, paired with plain SGD; print one JSON line.

    ``allocator``: ``keep`` sets the allocator as fedsim's commands do (both arms run in this
    process under it), ``system`` leaves glibc's defaults.

    The machine is shared, so the ratio is the median of ratios of *adjacent* blocks
    (variant block, plain block, ...), which cancels slow drifts in the available CPU.
    ``peak_rss_mb`` is read before the plain model is built, so it is the variant's own.
    """
    import torch

    import fedsim

    if not Path(fedsim.__file__).resolve().is_relative_to(TREE):
        raise RuntimeError(f"measuring {fedsim.__file__}, not the tree {TREE}")
    import _common

    allocator = _common.set_allocator(allocator)
    load_start = os.getloadavg()
    torch.set_num_threads(threads)
    step = _step_function(model_name, variant)
    for _ in range(2):  # warm-up (allocations, lazy initialisation)
        step()
    single = _block_time(step, 1)
    block = max(1, min(20, int(0.5 / max(single, 1e-6))))  # ~0.5 s blocks
    first = _block_time(step, block)
    peak_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB on Linux
    plain = step if variant == "plain" else _step_function(model_name, "plain")
    for _ in range(2):
        plain()
    plain_block = max(1, min(200, int(block * single / max(_block_time(plain, 1), 1e-6))))
    times, ratios, cpu_ratios = [first], [], []
    deadline = time.perf_counter() + seconds
    while len(ratios) < 3 or (time.perf_counter() < deadline and len(ratios) < 40):
        variant_time, variant_cpu = _block_times(step, block)
        plain_time, plain_cpu = _block_times(plain, plain_block)
        times.append(variant_time)
        ratios.append(variant_time / plain_time)
        cpu_ratios.append(variant_cpu / max(plain_cpu, 1e-9))
    step_time = statistics.median(times)
    measured = {
        "step_s": step_time,
        "samples_per_s": BATCH / step_time,
        "ratio_vs_plain": statistics.median(ratios),
        "cpu_ratio_vs_plain": statistics.median(cpu_ratios),
        "peak_rss_mb": peak_mb,
        "loadavg_start": [round(v, 2) for v in load_start],
        "allocator": allocator,
    }
    if variant == "fedsim":
        # How much of the ratio is the noise draw alone.
        from fedsim.training.gaussian import native_kernel_available

        try:
            from fedsim.training.persample.direct import direct_kernel_available
        except ImportError:  # an older tree (FEDSIM_BENCH_TREE) without the kernel
            def direct_kernel_available() -> bool:
                return False

        noise = _noise_draw(model_name)
        noise_ratios = [
            _block_time(noise, block) / _block_time(plain, plain_block) for _ in range(5)
        ]
        measured["noise_vs_plain"] = statistics.median(noise_ratios)
        measured["noise_kernel"] = "compiled" if native_kernel_available() else "torch"
        measured["conv_kernel"] = "compiled" if direct_kernel_available() else "torch"
    measured["loadavg_end"] = [round(v, 2) for v in os.getloadavg()]
    return measured


def run_worker(
    model_name: str, variant: str, threads: int, seconds: float, allocator: str = "keep"
) -> dict[str, Any]:
    command = [
        sys.executable,
        __file__,
        "--worker",
        model_name,
        variant,
        str(threads),
        str(seconds),
        allocator,
    ]
    done = subprocess.run(command, capture_output=True, text=True, cwd=ROOT, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"{model_name}/{variant} failed:\n{done.stderr[-2000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def _available(variants: list[str]) -> list[str]:
    """``variants`` less the Opacus ones when Opacus is not installed (said on stdout)."""
    if importlib.util.find_spec("opacus") is not None:
        return variants
    skipped = [v for v in variants if v.startswith("opacus_")]
    if skipped:
        print(f"opacus is not installed: {', '.join(skipped)} not measured", flush=True)
    return [v for v in variants if not v.startswith("opacus_")]


def _views(flat, params) -> list:  # noqa: ANN001 - torch imported lazily
    """Each parameter's view of the flat vector ``flat`` (parameters in order), shaped like it."""
    views, offset = [], 0
    for p in params:
        views.append(flat[offset : offset + p.numel()].view_as(p))
        offset += p.numel()
    return views


def _check_choices(parser: argparse.ArgumentParser, models: list[str], variants: list[str]) -> None:
    unknown = (set(models) - set(MODELS)) | (set(variants) - set(VARIANTS) - set(EXTRA_VARIANTS))
    if unknown:
        parser.error(f"unknown models or variants: {sorted(unknown)} (models: {', '.join(MODELS)}; "
                     f"variants: {', '.join(VARIANTS + EXTRA_VARIANTS)})")
    if set(variants) & set(EXTRA_VARIANTS) and set(models) != {"mlp"}:
        parser.error("the minimal variants are written for the MLP: use --models mlp")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="1 pass, 1 thread, short timing")
    parser.add_argument("--threads", default="1,2", help="comma-separated torch thread counts")
    parser.add_argument("--passes", type=int, default=2)
    parser.add_argument(
        "--seconds", type=float, default=6.0, help="timing budget per configuration"
    )
    parser.add_argument("--models", default=",".join(MODELS))
    parser.add_argument("--variants", default=",".join(VARIANTS))
    parser.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "dp_step.json"))
    import _common  # after TREE is first on sys.path (it checks the same)

    _common.add_allocator_option(parser)
    parser.add_argument(
        "--worker",
        nargs=5,
        metavar=("MODEL", "VARIANT", "THREADS", "SECONDS", "ALLOCATOR"),
        help=argparse.SUPPRESS,
    )
    args = parser.parse_args(argv)
    if args.worker:
        model_name, variant, threads, seconds, allocator = args.worker
        print(json.dumps(worker(model_name, variant, int(threads), float(seconds), allocator)))
        return 0
    if args.quick:
        args.threads, args.passes, args.seconds = "1", 1, 1.5
    version = code_version()
    thread_counts = [int(t) for t in args.threads.split(",")]
    models, variants = args.models.split(","), args.variants.split(",")
    _check_choices(parser, models, variants)
    variants = _available(variants)
    best: dict[tuple[str, str, int], dict[str, Any]] = {}
    for _ in range(args.passes):
        for threads in thread_counts:
            for model_name in models:
                for variant in variants:
                    key = (model_name, variant, threads)
                    measured = run_worker(model_name, variant, threads, args.seconds,
                                          args.allocator)
                    if key not in best or measured["ratio_vs_plain"] < best[key]["ratio_vs_plain"]:
                        best[key] = measured
                    print(
                        f"{model_name:13s} {variant:17s} threads={threads} "
                        f"{measured['samples_per_s']:10.0f} samples/s  x{measured['ratio_vs_plain']:.2f}  "
                        f"cpu x{measured['cpu_ratio_vs_plain']:.2f}  "
                        f"peak {measured['peak_rss_mb']:.0f} MB  load {measured['loadavg_start'][0]:.1f}",
                        flush=True,
                    )
    rows = [
        {
            "model": model_name,
            "variant": variant,
            "threads": threads,
            "samples_per_s": round(measured["samples_per_s"], 1),
            "ratio_vs_plain": round(measured["ratio_vs_plain"], 3),
            "cpu_ratio_vs_plain": round(measured["cpu_ratio_vs_plain"], 3),
            "peak_rss_mb": round(measured["peak_rss_mb"], 1),
            "allocator": measured["allocator"],
            **version,
            "loadavg_start": measured["loadavg_start"],
            "loadavg_end": measured["loadavg_end"],
            **(
                {
                    "noise_vs_plain": round(measured["noise_vs_plain"], 3),
                    "noise_kernel": measured["noise_kernel"],
                    "conv_kernel": measured["conv_kernel"],
                }
                if "noise_vs_plain" in measured
                else {}
            ),
        }
        for (model_name, variant, threads), measured in best.items()
    ]
    for row in rows:
        print(json.dumps(row))
    if not args.quick:
        Path(args.out).write_text(json.dumps(rows, indent=2) + "\n")
        print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
