"""One client, all of MNIST: the Dong, Roth & Su run A setting ("Gaussian Differential Privacy", Fig. 7).

n = 60000, fixed-size batches m = 256 without replacement (replace-one neighbours, noise
N(0, (2 C sigma)^2)), sigma = 1.3, 15 epochs (T = 15 n / m steps), the classic DP MNIST CNN
(tanh), plain SGD on the DP gradient Ubar/m. Defaults lr = 0.15, C = 1.0 (the TF Privacy
tutorial's values, within the issue's range lr 0.15-0.25, C 1.0-1.5). DRS report 95.0% test
accuracy and 0.285-GDP by the CLT (eps 1.07 at delta 1e-5); their runs used TF Privacy, whose
noise is C sigma, while fedsim's fixed-size batches add 2 C sigma as the replace-one analysis
requires, so the same sigma is noisier here. Measured on a loaded CPU: lr 0.15 / C 1.0
reached 95.4-95.5%, lr 0.25 / C 1.5 plateaued near 94% and ended at 93.4%.

Prints eps at delta = 1e-5 from fedsim's PLD accountant (a guarantee, exact composition of
C_q(G_{1/sigma})^{(x)T}) and from the GDP CLT (an approximation), and writes
benchmarks/results/mnist_centralized.json.

    python benchmarks/mnist_centralized.py            # the full run (minutes on CPU)
    python benchmarks/mnist_centralized.py --quick    # a smoke run on a subset
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import _common  # noqa: F401 - first: this checkout's fedsim on sys.path (see _common)
import numpy as np
import torch

from fedsim.data import load_dataset
from fedsim.privacy import schedules
from fedsim.privacy.accountant import make_accountant
from fedsim.training import (
    LocalTrainer,
    build_model,
    evaluate,
    flat_params,
    load_flat_params,
)

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import centralized_dp_sgd, epoch_ends, provenance, write_json  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--data", default=None,
        help="mnist.npz or a directory with it (default: where `dataset: {name: mnist}` finds "
        "it: $FEDSIM_DATA_DIR, the user cache, else a verified download)"
    )
    parser.add_argument("--epochs", type=float, default=15.0)
    parser.add_argument("--batch-size", type=int, default=256)
    parser.add_argument("--sigma", type=float, default=1.3)
    parser.add_argument("--clip", type=float, default=1.0)
    parser.add_argument("--lr", type=float, default=0.15)
    parser.add_argument("--delta", type=float, default=1e-5)
    parser.add_argument(
        "--sampling",
        default="fixed",
        choices=("fixed", "poisson"),
        help="fixed-size batches, replace-one, noise 2 C sigma (DRS Alg. 1; default) or Poisson "
        "batches, add/remove, noise C sigma (the mechanism TF Privacy's moments accountant assumes)",
    )
    parser.add_argument(
        "--init",
        default="glorot",
        choices=("glorot", "torch"),
        help="CNN initialisation: PyTorch's defaults or Keras' (Glorot uniform, zero bias)",
    )
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--device", default="cpu", help="cpu (default) or cuda")
    parser.add_argument("--quick", action="store_true", help="10000 training records, 1 epoch")
    parser.add_argument(
        "--out", default=str(ROOT / "benchmarks" / "results" / "mnist_centralized.json")
    )
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)

    train_x, train_y, test_x, test_y = load_dataset("mnist", path=args.data)
    if args.quick:
        train_x, train_y, args.epochs = train_x[:10000], train_y[:10000], 1.0
    device = torch.device(args.device)
    model = build_model("dp_mnist_cnn", init=args.init).to(device)
    generator = torch.Generator(device="cpu").manual_seed(args.seed)
    n = len(train_x)
    steps = round(args.epochs * n / args.batch_size)
    steps_per_epoch = n / args.batch_size
    schedule = schedules.constant(steps, args.sigma, args.clip)
    trainer = LocalTrainer(
        model,
        train_x,
        train_y,
        batch_size=args.batch_size,
        sampling=args.sampling,
        clip=schedule,
        noise=schedule,
        generator=generator,
    )
    history = []
    started = time.perf_counter()

    def evaluate_at(step: int, params: np.ndarray) -> None:
        load_flat_params(model, params)
        accuracy, loss = evaluate(model, test_x, test_y)
        seconds = time.perf_counter() - started
        history.append({"step": step, "accuracy": accuracy, "test_loss": loss, "seconds": seconds})
        print(
            f"step {step}/{steps} epoch {step / steps_per_epoch:.2f} "
            f"test accuracy {accuracy:.4f} loss {loss:.4f} ({seconds:.0f} s)",
            flush=True,
        )

    centralized_dp_sgd(
        trainer,
        flat_params(model),
        lr=args.lr,
        steps=steps,
        evaluate_at=set(epoch_ends(steps, steps_per_epoch)),
        on_evaluate=evaluate_at,
    )
    seconds = time.perf_counter() - started
    q = args.batch_size / n
    events = schedule.steps(args.sampling, q)
    assert events == (trainer.planned_steps(0)[0].times(steps),)
    epsilon_pld = float(make_accountant("pld", events).epsilon(args.delta))
    epsilon_clt = float(make_accountant("gdp-clt", events).epsilon(args.delta))
    summary = {
        "accuracy": history[-1]["accuracy"],
        "epochs": args.epochs,
        "steps": steps,
        "sigma": args.sigma,
        "batch_size": args.batch_size,
        "sampling": args.sampling,
        "neighbouring": "replace-one" if args.sampling == "fixed" else "add/remove",
        "clip": args.clip,
        "lr": args.lr,
        "model": "dp_mnist_cnn",
        "init": args.init,
        "n": n,
        "epsilon_pld": epsilon_pld,
        "epsilon_gdp_clt": epsilon_clt,
        "delta": args.delta,
        "seconds": seconds,
        "threads": args.threads,
        "device": args.device,
        "quick": args.quick,
        "seed": args.seed,
        "history": history,
        "commit": provenance(),
    }
    print(
        f"test accuracy {summary['accuracy']:.4f}; eps(delta={args.delta:g}) pld {epsilon_pld:.4f} "
        f"(guarantee), gdp-clt {epsilon_clt:.4f} (approximation); {seconds:.0f} s"
    )
    if not args.quick:
        write_json(Path(args.out), summary)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
