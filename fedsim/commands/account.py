"""``fedsim account``: the privacy of a DP-SGD run (or of a recorded / planned ledger).

Answers one of: eps at --delta (default); delta at --epsilon; the smallest sigma for
--target-epsilon; with --max-steps, the largest number of steps for --target-epsilon.

Sampling schemes measure different things (never compare one with the other's numbers):
``poisson`` = add/remove neighbours, noise C sigma; ``fixed`` = batches of exactly m,
replace-one neighbours, noise 2 C sigma (Dong-Roth-Su Thm 5.1). ``gdp-clt`` is a CLT
approximation and is labelled as such; ``pld`` (default) and ``rdp`` are guarantees.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path
from typing import Any, cast

from fedsim.errors import ConfigError
from fedsim.privacy.answers import ACCOUNTANT_CHOICES, DEFAULT_DELTA, AccountAnswer, account


def _count(text: str) -> int:
    """An integer flag that may be written 1e6 (but must be a whole number)."""
    try:
        value = int(text)
    except ValueError:
        try:
            number = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
        if not (math.isfinite(number) and number == math.floor(number)):
            raise argparse.ArgumentTypeError(f"not a whole number: {text!r}") from None
        value = int(number)
    return value


DESCRIPTION = (
    "Answer a privacy question about DP-SGD: epsilon at --delta (the default), delta at "
    "--epsilon, the smallest sigma for --target-epsilon, or with --max-steps the most steps for "
    "--target-epsilon. The two sampling schemes measure different things, so never compare "
    "one's numbers with the other's: poisson means add/remove neighbours and noise C sigma, "
    "fixed means batches of exactly m, replace-one neighbours and noise 2 C sigma."
)


def register(subparsers: Any) -> argparse.ArgumentParser:
    parser = subparsers.add_parser(
        "account", help="Answer a privacy question about DP-SGD: epsilon, delta, sigma or steps.",
        description=DESCRIPTION)
    what = parser.add_argument_group("the mechanism")
    what.add_argument("--sampling", choices=("poisson", "fixed"), default=None,
                      help="Poisson sampling (add/remove neighbours) or fixed-size batches "
                           "(replace-one neighbours); default: a --ledger's own scheme, "
                           "else poisson.")
    what.add_argument("--q", type=float, help="The sampling rate q = m/N.")
    what.add_argument("--batch-size", type=_count, metavar="M",
                      help="The batch size m (with --dataset-size).")
    what.add_argument("--dataset-size", type=_count, metavar="N", help="The data set size N.")
    what.add_argument("--sigma", type=float, help="The noise multiplier sigma.")
    what.add_argument("--steps", type=_count, metavar="T", help="The number of steps T.")
    what.add_argument("--epochs", type=float,
                      help="The number of epochs; the steps are ceil(epochs / q).")
    what.add_argument("--ledger", metavar="FILE",
                      help="A JSON list of steps {sampling, q, sigma, count}, an object with "
                           "'steps', or a fedsim ledger (JSON lines); it replaces --q, --sigma "
                           "and --steps.")
    ask = parser.add_argument_group("the question")
    ask.add_argument("--delta", type=float, default=DEFAULT_DELTA,
                     help="The delta to answer epsilon at (default 1e-5).")
    ask.add_argument("--accountant", choices=ACCOUNTANT_CHOICES, default="pld",
                     help="The accountant: pld (privacy loss distributions, the default) or "
                          "rdp (Renyi DP) give guarantees; gdp-clt is the central limit "
                          "theorem's approximation and is labelled as one.")
    ask.add_argument("--epsilon", type=float, help="Answer delta at this epsilon instead.")
    ask.add_argument("--target-epsilon", type=float,
                     help="Answer the smallest sigma that meets this epsilon (or the most "
                          "steps, with --max-steps).")
    ask.add_argument("--max-steps", action="store_true",
                     help="With --target-epsilon and --sigma, answer the largest number of "
                          "steps.")
    ask.add_argument("--group-size", type=_count, default=1, metavar="G",
                     help="Answer for groups of G records: the least of the generic group "
                          "bounds (Dong, Roth and Su, Gaussian Differential Privacy, Theorem "
                          "2.14, on the accountant's curve and on RDP's) and, for pld with "
                          "Poisson sampling, the tight mixture-of-Gaussians bound (Ganesh "
                          "2024); its 'bound' says which.")
    out = parser.add_argument_group("output")
    out.add_argument("--plot", metavar="FILE.png",
                     help="Draw the trade-off curve and its Gaussian DP fit into this image file: "
                          "PNG, or the format its suffix names (.pdf, .svg, ...).")
    out.add_argument("--json", action="store_true", help="Print the answer as one JSON object.")
    parser.set_defaults(func=run)
    return cast(argparse.ArgumentParser, parser)


# -- the answer ------------------------------------------------------------------------------------
def run(args: argparse.Namespace) -> int:
    answer = account(
        sampling=args.sampling, q=args.q, batch_size=args.batch_size,
        dataset_size=args.dataset_size, sigma=args.sigma, steps=args.steps, epochs=args.epochs,
        ledger=args.ledger, delta=args.delta, accountant=args.accountant, epsilon=args.epsilon,
        target_epsilon=args.target_epsilon, max_steps=args.max_steps,
        group_size=args.group_size, curve=args.plot is not None)
    result = answer.as_dict()
    for warning in answer.warnings or ():  # (also in --json's "warnings")
        print(f"warning: {warning}", file=sys.stderr)
    if args.plot is not None:
        plot(Path(args.plot), answer)
        result["plot"] = args.plot
    _print(result, as_json=args.json)
    return 0


def plot(path: Path, answer: AccountAnswer) -> None:
    """Draw ``answer``'s trade-off curve (asked with ``curve=True``) and its GDP fit into
    ``path`` (PNG); :class:`ConfigError` if it cannot be written."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from fedsim.privacy import gdp

    if answer.curve is None:
        raise ConfigError("no trade-off curve to plot: answer with curve=True")
    image_format = plot_format(path)
    alphas, mu = answer.curve.alphas, answer.mu
    fig, ax = plt.subplots(figsize=(5, 5))
    curve_of = answer.curve.name or (answer.bound if answer.group_size > 1 and answer.bound
                                     else answer.accountant)
    label = (f"{curve_of} "
             f"({'guarantee' if answer.is_guarantee else 'CLT approximation'})"
             + (f", groups of {answer.group_size}" if answer.group_size > 1 else ""))
    ax.plot(alphas, answer.curve.betas, label=label, color="tab:blue")
    if mu is not None and answer.accountant != "gdp-clt":
        ax.plot(alphas, gdp.gdp_tradeoff(alphas, mu), "--", color="tab:red",
                label=f"G_mu, mu = {mu:.3f} (GDP fit)")
    ax.plot([0, 1], [1, 0], ":", color="grey", label="no privacy loss")
    ax.set_xlabel("type I error alpha")
    ax.set_ylabel("type II error beta")
    ax.set_xlim(0, 1)
    ax.set_ylim(0, 1)
    ax.set_title(plot_title(answer), fontsize=9)
    ax.legend(fontsize=8)
    try:
        fig.savefig(path, dpi=120, bbox_inches="tight", format=image_format)
    except OSError as exc:
        raise ConfigError(f"--plot {path}: {exc.strerror}") from None
    finally:
        plt.close(fig)


def plot_format(path: Path) -> str:
    """The image format ``--plot`` writes ``path`` in: its suffix's where matplotlib writes
    that format (``.png``, ``.pdf``, ``.svg``, ...), PNG for a name without a suffix, the file
    always at ``path`` itself. :class:`ConfigError` for a directory or another suffix (a
    stranger's ``--plot curve.txt`` ended in matplotlib's traceback, and ``--plot DIR`` wrote
    ``DIR.png`` beside the directory while the answer named ``DIR``)."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    if path.is_dir():
        raise ConfigError(f"--plot {path}: is a directory; name the image file "
                          f"(for example {path / 'tradeoff.png'})")
    suffix = path.suffix.lower().lstrip(".")
    if not suffix:
        return "png"
    formats = FigureCanvasAgg.get_supported_filetypes()
    if suffix not in formats:
        raise ConfigError(f"--plot {path}: cannot draw a .{suffix} image; name a .png file "
                          f"(or one of .{', .'.join(sorted(formats))})")
    return suffix


_LABEL_WIDTH = len("epsilon_optimal: ")
"""The column of every value in the table for people (its longest label, a colon, a space)."""


def plot_title(answer: AccountAnswer) -> str:
    """The trade-off plot's title: the posture, and its eps at delta, said to be the CLT's
    approximation where it is one (a stranger read a ``gdp-clt`` eps in the title as a
    guarantee; only the legend said otherwise)."""
    return (f"{answer.sampling} ({answer.neighbouring_relation}), eps = {answer.epsilon:.4g} "
            f"at delta = {answer.delta:.2g}"
            + ("" if answer.is_guarantee else " (CLT approximation, not a guarantee)"))


def _print(result: dict[str, Any], *, as_json: bool) -> None:
    if as_json:  # strict JSON: a non-finite number becomes null, with a note
        infinite = sorted(k for k, v in result.items()
                          if isinstance(v, float) and not math.isfinite(v))
        clean = {k: (None if k in infinite else v) for k, v in result.items()}
        if infinite:
            clean["infinite"] = infinite
            clean["note_infinite"] = ("no finite value: delta is below what the accountant "
                                      "resolves, or the mechanism gives no privacy")
        print(json.dumps(clean, sort_keys=True, allow_nan=False))
        return
    kind = "guarantee" if result["is_guarantee"] else "APPROXIMATION (CLT), not a guarantee"
    # (one column for every value: a stranger found these two rows at another width)
    print(f"{'accountant:':<{_LABEL_WIDTH}}{result['accountant']} ({kind})")
    print(f"{'sampling:':<{_LABEL_WIDTH}}{result['sampling']} "
          f"({result['neighbouring_relation']} neighbours)")
    for key in ("q", "sigma", "steps", "distinct_steps", "steps_classic", "steps_optimal",
                "steps_pld", "steps_rdp", "bound", "group_size", "epsilon", "epsilon_classic",
                "epsilon_optimal", "delta", "delta_classic", "delta_optimal", "mu", "mu_kind",
                "clt_gamma", "note", "plot"):
        if result.get(key) is not None:
            value = result[key]
            text = f"{value:.6g}" if isinstance(value, float) else str(value)
            print(f"{key + ':':<{_LABEL_WIDTH}}{text}")
