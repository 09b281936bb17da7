"""Dong, Roth & Su ("Gaussian Differential Privacy", Fig. 7): DP-SGD on MNIST, runs A / B / C.

One client holds all n = 60000 MNIST training images; every step takes a fixed-size batch of
m = 256 without replacement, so neighbouring data sets differ by replacing one record and the
noise is N(0, (2 C sigma)^2) on the clipped sum (DRS Alg. 1). The runs:

    run  epochs  sigma  lr    C     paper accuracy  paper CLT mu  paper moments accountant eps
    A    15      1.3    0.25  1.5   95.0 %          0.285         1.19
    B    60      1.1    0.15  1.0   96.6 %          0.737         3.01
    C    45      0.7    0.25  1.5   97.0 %          1.554         7.1

For each run the script reports, for the FULL schedule T = epochs * n / m (accounting is cheap):

* ``mu_clt``: DRS Cor. 5.4 (fixed size, replace-one), an asymptotic approximation;
* ``eps_gdp_clt``: eps at delta = 1e-5 of that mu (DRS Cor. 2.13), an approximation;
* ``eps_pld``: eps of C_q(G_{1/sigma})^{(x)T} (DRS Thm 5.1) from fedsim's PLD accountant, a
  guarantee for the scheme that was run;
* ``eps_rdp``: RDP with the classic conversion for the scheme that was run (fixed size,
  replace-one, Wang-Balle-Kasiviswanathan bound), a guarantee;
* ``eps_rdp_ma``: RDP with the classic conversion for Poisson sampling and add/remove
  neighbours, which is what the paper's moments accountant (TensorFlow Privacy) computed.

and the test accuracy of a training run, made by ``benchmarks/mnist_centralized.py`` (the
training code is reused, not copied). The CPU default trains a reduced number of epochs per run
(``full: false`` in the output; the privacy columns still describe the full schedule); ``--full``
trains the paper's epochs (``--device cuda`` on a GPU). A finished full run A of
``benchmarks/mnist_centralized.py`` (``benchmarks/results/mnist_centralized.json``) is reused
instead of retraining.

    python benchmarks/papers/drs_mnist.py                        # privacy + reduced training
    python benchmarks/papers/drs_mnist.py --full --device cuda   # the paper's epochs
    python benchmarks/papers/drs_mnist.py --no-train             # privacy and plot only

Writes benchmarks/results/papers/drs_mnist.json (its rows and commit), the training records under
benchmarks/results/papers/drs_mnist_runs/, and docs/img/drs_mnist_tradeoff.png.
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib.util
import json
import math
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from _common import provenance, pyplot  # first: this checkout's fedsim (see _common)

from fedsim.privacy.accountant import make_accountant
from fedsim.privacy.events import GaussianStep
from fedsim.privacy.fdp import eps_delta_tradeoff
from fedsim.privacy.gdp import clt_mu, gdp_epsilon, gdp_tradeoff

REPO = Path(__file__).resolve().parents[2]
RESULTS = REPO / "benchmarks" / "results" / "papers"
RUN_RECORDS = RESULTS / "drs_mnist_runs"
CENTRALIZED_RESULT = REPO / "benchmarks" / "results" / "mnist_centralized.json"
PLOT = REPO / "docs" / "img" / "drs_mnist_tradeoff.png"
NUM_TRAIN = 60_000
BATCH_SIZE = 256
DELTA = 1e-5


@dataclass(frozen=True)
class DrsRun:
    """One column of DRS Fig. 7 with the paper's printed values."""

    name: str
    epochs: int
    sigma: float
    lr: float
    clip: float
    reduced_epochs: int  # what the CPU default trains
    paper_accuracy: float  # percent
    paper_mu_clt: float
    paper_eps_ma: float  # moments accountant (TF Privacy), delta = 1e-5

    @property
    def steps(self) -> int:
        return round(self.epochs * NUM_TRAIN / BATCH_SIZE)

    @property
    def full_step(self) -> GaussianStep:
        """The full schedule as the scheme that was run: fixed size, replace-one."""
        return GaussianStep("fixed", BATCH_SIZE / NUM_TRAIN, self.sigma, self.steps)


RUNS: tuple[DrsRun, ...] = (
    DrsRun("A", 15, 1.3, 0.25, 1.5, 15, 95.0, 0.285, 1.19),
    DrsRun("B", 60, 1.1, 0.15, 1.0, 20, 96.6, 0.737, 3.01),
    DrsRun("C", 45, 0.7, 0.25, 1.5, 15, 97.0, 1.554, 7.1),
)


def load_centralized_benchmark() -> ModuleType:
    """benchmarks/mnist_centralized.py as a module (its training loop)."""
    path = REPO / "benchmarks" / "mnist_centralized.py"
    spec = importlib.util.spec_from_file_location("mnist_centralized", path)
    if spec is None or spec.loader is None:
        raise ImportError(f"cannot load {path}")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up while being built
    spec.loader.exec_module(module)
    return module


# -- privacy ------------------------------------------------------------------------------
def privacy_numbers(run: DrsRun, delta: float = DELTA, sampling: str = "fixed") -> dict[str, float]:
    """All privacy columns for the run's full schedule, for the scheme that was run: fixed
    size and replace-one (DRS Alg. 1), or Poisson and add/remove (TF Privacy's mechanism)."""
    step = dataclasses.replace(run.full_step, sampling=sampling)
    mu = clt_mu([step])  # DRS Cor. 5.4 (fixed size) / Bu et al. 2020 (Poisson)
    moments = GaussianStep("poisson", step.q, step.sigma, step.count)
    return {
        "mu_clt": float(mu),
        "eps_gdp_clt": float(gdp_epsilon(delta, mu)),
        "eps_pld": float(make_accountant("pld", [step]).epsilon(delta)),
        "eps_rdp": float(make_accountant("rdp", [step]).epsilon_classic(delta)),
        "eps_rdp_ma": float(make_accountant("rdp", [moments]).epsilon_classic(delta)),
    }


def tradeoff_curves(run: DrsRun, numbers: dict[str, float], alpha: np.ndarray) -> dict[str, list[float]]:
    return {
        "alpha": alpha.tolist(),
        "fdp_pld": make_accountant("pld", [run.full_step]).tradeoff(alpha).tolist(),
        "gdp_clt": np.asarray(gdp_tradeoff(alpha, numbers["mu_clt"])).tolist(),
        "moments_accountant": eps_delta_tradeoff(alpha, numbers["eps_rdp_ma"], DELTA).tolist(),
        "rdp_fixed": eps_delta_tradeoff(alpha, numbers["eps_rdp"], DELTA).tolist(),
    }


def plot_tradeoffs(curves: dict[str, dict[str, list[float]]], numbers: dict[str, dict[str, float]],
                   path: Path) -> None:
    """Per run, the trade-off curves of its mechanism (fixed-size batches, replace-one
    neighbours: the paper's NoisySGD) in the top row, and below, on axes of their own, the
    curve the moments accountant reports for Poisson batches (add/remove neighbours): the two
    relations measure different things, so they are never drawn on one axis. The upper-right
    triangle of a trade-off plot is always empty (f(alpha) <= 1 - alpha), so the legends sit
    there, off the curves."""
    plt = pyplot()

    fig, axes = plt.subplots(2, len(curves), figsize=(4.2 * len(curves), 8.6), squeeze=False)
    for column, (name, c) in enumerate(curves.items()):
        n = numbers[name]
        top, bottom = axes[0][column], axes[1][column]
        # Wide and light, so the CLT curve drawn over it shows where the two agree.
        top.plot(c["alpha"], c["fdp_pld"], color="black", lw=4, alpha=0.35,
                 label=f"f-DP, Thm 5.1 (PLD): eps={n['eps_pld']:.2f}")
        top.plot(c["alpha"], c["gdp_clt"], color="tab:red", ls="--", lw=1.3,
                 label=f"GDP by CLT: mu={n['mu_clt']:.3f}")
        top.plot(c["alpha"], c["rdp_fixed"], color="tab:blue", ls=":", lw=1.5,
                 label=f"RDP classic: ({n['eps_rdp']:.2f}, 1e-5)")
        top.set_title(f"run {name}: fixed-size batches,\nreplace-one neighbours", fontsize=10)
        bottom.plot(c["alpha"], c["moments_accountant"], color="tab:blue", ls="--",
                    label=f"moments accountant: ({n['eps_rdp_ma']:.2f}, 1e-5)")
        bottom.set_title(f"run {name}: Poisson batches, add/remove\nneighbours (moments "
                         "accountant)", fontsize=10)
        for ax, eps in ((top, n["eps_rdp"]), (bottom, n["eps_rdp_ma"])):
            corner = (1 - DELTA) / (math.exp(eps) + 1)  # where the (eps, delta) curve bends
            if corner < 0.01:  # it runs along the axes, where the spines hide it: say so
                ax.annotate(f"the ({eps:.2f}, 1e-5) curve runs along the axes:\nits corner is "
                            f"at alpha = beta = {corner:.1e}", xy=(corner, corner),
                            xytext=(0.3, 0.72), fontsize=7, color="tab:blue",
                            arrowprops={"arrowstyle": "->", "color": "tab:blue", "lw": 0.8})
            ax.plot([0, 1], [1, 0], color="grey", lw=0.5)
            ax.set_xlabel("type I error")
            ax.set_ylabel("type II error")
            ax.set_xlim(0, 1)
            ax.set_ylim(0, 1)
            ax.set_aspect("equal")
            ax.legend(fontsize=7, loc="upper right")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110, metadata={"Software": None})
    plt.close(fig)


# -- training -----------------------------------------------------------------------------
def _matches(record: dict[str, Any], run: DrsRun, epochs: float | None,
             sampling: str = "fixed") -> bool:
    return (not record.get("quick", False) and record.get("sigma") == run.sigma
            and record.get("clip") == run.clip and record.get("lr") == run.lr
            and record.get("batch_size") == BATCH_SIZE and record.get("sampling") == sampling
            and (epochs is None or record.get("epochs") == epochs))


def train(run: DrsRun, epochs: float, centralized: ModuleType, *, data: str | None,
          device: str, seed: int, out: Path, sampling: str = "fixed") -> dict[str, Any]:
    """Train run ``run`` for ``epochs`` with mnist_centralized's loop; its record is ``out``."""
    argv = ["--epochs", str(epochs), "--sigma", str(run.sigma), "--clip", str(run.clip),
            "--lr", str(run.lr), "--batch-size", str(BATCH_SIZE), "--seed", str(seed),
            "--device", device, "--out", str(out), "--sampling", sampling]
    if data is not None:
        argv += ["--data", data]
    out.parent.mkdir(parents=True, exist_ok=True)
    status = centralized.main(argv)
    if status != 0:
        raise RuntimeError(f"training run {run.name} failed with status {status}")
    return json.loads(out.read_text())


def training_record(run: DrsRun, records: Path, epochs: float | None) -> dict[str, Any] | None:
    """A finished training record of ``run`` (ours, else helper 3's run A), for ``epochs``
    epochs or, with ``epochs=None``, for any number of epochs."""
    for candidate in (records / f"run_{run.name}.json", CENTRALIZED_RESULT):
        if candidate.is_file():
            record = json.loads(candidate.read_text())
            if _matches(record, run, epochs):
                return record
    return None


def difference_note(run: DrsRun, accuracy: float | None, full: bool) -> str:
    if accuracy is None:
        return "not trained yet"
    gap = accuracy - run.paper_accuracy
    if abs(gap) <= 1.0:
        return "within 1 point of the paper"
    if not full:
        return (f"reduced CPU run ({gap:+.1f} points); the paper trains {run.epochs} epochs "
                "(--full --device cuda)")
    return (f"{gap:+.1f} points with the paper's m, sigma, lr, C and epochs: the paper trained "
            "with TF Privacy, which adds noise C sigma to the clipped sum of a shuffled batch "
            "(accounted as Poisson, add/remove); here the batch is a uniformly random fixed-size "
            "subset with replace-one noise 2 C sigma (DRS Alg. 1, the mechanism its mu "
            "certifies), i.e. twice the noise std")


def tuned_record(run: DrsRun) -> dict[str, Any] | None:
    """benchmarks/mnist_centralized.py's own full run when it keeps the run's sigma, m,
    sampling and epochs (hence exactly the run's privacy) but tunes lr and C."""
    if not CENTRALIZED_RESULT.is_file():
        return None
    record = json.loads(CENTRALIZED_RESULT.read_text())
    same_privacy = (not record.get("quick", False) and record.get("sigma") == run.sigma
                    and record.get("batch_size") == BATCH_SIZE and record.get("n") == NUM_TRAIN
                    and record.get("sampling") == "fixed" and record.get("epochs") == run.epochs)
    tuned = (record.get("lr"), record.get("clip")) != (run.lr, run.clip)
    return record if same_privacy and tuned else None


def result_row(run: DrsRun, record: dict[str, Any] | None, numbers: dict[str, float], *,
               tuned: bool = False, sampling: str = "fixed") -> dict[str, Any]:
    """One row of drs_mnist.json; ``tuned``: a record with the run's privacy but its own lr, C;
    ``sampling="poisson"``: the paper's settings under TF Privacy's mechanism."""
    accuracy = None if record is None else round(100.0 * record["accuracy"], 2)
    trained_epochs = None if record is None else record["epochs"]
    full = trained_epochs is not None and trained_epochs >= run.epochs
    lr, clip = (record["lr"], record["clip"]) if tuned and record else (run.lr, run.clip)
    if sampling == "poisson":
        note = ("the mechanism the paper's moments accountant (TF Privacy) assumes: Poisson "
                "batches (rate m/n), add/remove neighbours, noise C sigma on the clipped sum - "
                "half the noise std of the replace-one rows (TF Privacy itself drew shuffled "
                "batches with that noise); its guarantee is for add/remove neighbours, so its "
                "eps is not comparable with theirs (its eps_rdp is the moments accountant's)")
        if accuracy is not None:
            note += f"; {accuracy - run.paper_accuracy:+.1f} points against the paper's accuracy"
        init = None if record is None else record.get("init", "not recorded")
    elif tuned:
        note = (f"benchmarks/mnist_centralized.py's setting: the paper's sigma, m and epochs "
                f"(the same privacy as run {run.name}) with lr {lr} and C {clip} (run B's)")
        init = None if record is None else record.get("init", "not recorded")
    else:
        note = difference_note(run, accuracy, full)
        # records written before mnist_centralized.py had --init used PyTorch's default init
        init = None if record is None else record.get("init", "torch")
    label = run.name
    if tuned:
        label = f"{run.name} (lr {lr}, C {clip})"
    elif sampling == "poisson":
        label = f"{run.name} (Poisson, noise C sigma)"
    return {
        "run": label,
        "sampling": sampling,
        "full": full,
        "epochs": trained_epochs,
        "paper_epochs": run.epochs,
        "sigma": run.sigma,
        "lr": lr,
        "clip": clip,
        "init": init,
        "steps_full": run.steps,
        "accuracy": accuracy,
        "paper_accuracy": run.paper_accuracy,
        # the paper's mu is the CLT of its replace-one analysis (DRS Cor. 5.4), not Poisson's
        "paper_mu_clt": run.paper_mu_clt if sampling == "fixed" else None,
        **{k: round(v, 4) for k, v in numbers.items()},
        "paper_eps_rdp_ma": run.paper_eps_ma,
        "note": note,
    }


def poisson_row(run: DrsRun, args: argparse.Namespace, centralized: ModuleType,
                records: Path) -> dict[str, Any]:
    """Run ``run`` at the paper's settings and epochs under the mechanism the paper's privacy
    numbers assume (TF Privacy's moments accountant: Poisson batches, noise C sigma), trained
    unless ``--no-train``."""
    numbers = privacy_numbers(run, sampling="poisson")
    out = records / f"run_{run.name}_poisson.json"
    record = None
    if out.is_file() and _matches(json.loads(out.read_text()), run, float(run.epochs), "poisson"):
        record = json.loads(out.read_text())
    if record is None and not args.no_train:
        record = train(run, float(run.epochs), centralized, data=args.data, device=args.device,
                       seed=args.seed, out=out, sampling="poisson")
    return result_row(run, record, numbers, sampling="poisson")


# -- main ---------------------------------------------------------------------------------
def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", default="ABC", help="which runs to train, e.g. A or BC")
    parser.add_argument("--full", action="store_true", help="train the paper's epochs")
    parser.add_argument("--epochs", type=float, default=None,
                        help="train this many epochs per run (overrides the reduced default)")
    parser.add_argument("--no-train", action="store_true",
                        help="privacy numbers and plot only; reuse existing training records")
    parser.add_argument("--data", default=None, help="mnist.npz (default: mnist_centralized's)")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--results", type=Path, default=RESULTS)
    parser.add_argument("--plot", type=Path, default=PLOT)
    parser.add_argument("--poisson-runs", default="A",
                        help="runs also trained under the moments accountant's mechanism "
                        "(Poisson batches, noise C sigma) at the paper's settings and epochs "
                        "('' for none)")
    args = parser.parse_args(argv)

    centralized = load_centralized_benchmark()
    records = args.results / "drs_mnist_runs"
    alpha = np.linspace(0.0, 1.0, 401)
    rows: list[dict[str, Any]] = []
    curves: dict[str, dict[str, list[float]]] = {}
    numbers: dict[str, dict[str, float]] = {}
    for run in RUNS:
        numbers[run.name] = privacy_numbers(run)
        curves[run.name] = tradeoff_curves(run, numbers[run.name], alpha)
        epochs = float(run.epochs if args.full else
                       (args.epochs if args.epochs is not None else run.reduced_epochs))
        record = training_record(run, records, epochs)
        if record is None and not args.no_train and run.name in args.runs.upper():
            record = train(run, epochs, centralized, data=args.data, device=args.device,
                           seed=args.seed, out=records / f"run_{run.name}.json")
        if record is None:
            record = training_record(run, records, None)
        rows.append(result_row(run, record, numbers[run.name]))
        tuned = tuned_record(run)
        if tuned is not None:
            rows.append(result_row(run, tuned, numbers[run.name], tuned=True))
        if run.name in args.poisson_runs.upper():
            rows.append(poisson_row(run, args, centralized, records))
    args.results.mkdir(parents=True, exist_ok=True)
    (args.results / "drs_mnist.json").write_text(
        json.dumps({"commit": provenance(), "rows": rows}, indent=2) + "\n")
    (records).mkdir(parents=True, exist_ok=True)
    (records / "tradeoff_curves.json").write_text(
        json.dumps({"commit": provenance(), "curves": curves}) + "\n")
    plot_tradeoffs(curves, numbers, args.plot)
    for row in rows:
        print(json.dumps({k: row[k] for k in ("run", "full", "epochs", "accuracy", "mu_clt",
                                              "eps_pld", "eps_gdp_clt", "eps_rdp", "eps_rdp_ma")}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
