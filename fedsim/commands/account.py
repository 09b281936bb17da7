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
from pathlib import Path
from typing import Any, cast

from fedsim.errors import ConfigError, PrivacyError

ACCOUNTANT_CHOICES = ("pld", "rdp", "gdp-clt")
# Bounds that keep every answer finite in time and memory (larger values are refused).
MAX_STEPS = 10**12
MAX_EPSILON = 700.0  # e^eps must be a double
MAX_GROUP_SIZE = 10_000
MAX_LEDGER_BYTES = 256 * 2**20
# A pld answer is compared with rdp's for histories of at most this many distinct kinds of
# step (rdp costs one quadrature per kind, ~30 ms); longer mixes ask rdp only where pld has
# no finite answer.
COMPARE_KINDS = 64


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
    what.add_argument("--sampling", choices=("poisson", "fixed"), default="poisson",
                      help="Poisson sampling (add/remove neighbours) or fixed-size batches "
                           "(replace-one neighbours).")
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
    ask.add_argument("--delta", type=float, default=1e-5,
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
                     help="Answer for groups of G records (Dong, Roth and Su, Gaussian "
                          "Differential Privacy, Theorem 2.14).")
    out = parser.add_argument_group("output")
    out.add_argument("--plot", metavar="FILE.png",
                     help="Draw the trade-off curve and its Gaussian DP fit into this PNG file.")
    out.add_argument("--json", action="store_true", help="Print the answer as one JSON object.")
    parser.set_defaults(func=run)
    return cast(argparse.ArgumentParser, parser)


# -- input checking ------------------------------------------------------------------------------
def _conflict(args: argparse.Namespace, *names: str) -> None:
    given = [n for n in names if getattr(args, n.lstrip("-").replace("-", "_")) not in (None, False)]
    if len(given) > 1:
        raise ConfigError(f"conflicting flags: {' and '.join(given)}")


def _resolve(args: argparse.Namespace) -> dict[str, Any]:  # noqa: C901, PLR0912 - one check per option combination, each with its own message
    """Validate flags and return the mechanism: q, sigma, steps (or ledger steps)."""
    _conflict(args, "--q", "--batch-size")
    _conflict(args, "--steps", "--epochs")
    _conflict(args, "--epsilon", "--target-epsilon")
    _conflict(args, "--steps", "--max-steps")
    _conflict(args, "--epochs", "--max-steps")
    if args.ledger is not None:
        for flag in ("q", "batch_size", "sigma", "steps", "epochs", "target_epsilon"):
            if getattr(args, flag) is not None:
                raise ConfigError(f"conflicting flags: --ledger and --{flag.replace('_', '-')}")
    if args.max_steps and args.target_epsilon is None:
        raise ConfigError("--max-steps needs --target-epsilon")
    if args.target_epsilon is not None and not args.max_steps and args.sigma is not None:
        raise ConfigError("conflicting flags: --target-epsilon answers sigma; drop --sigma "
                          "(or add --max-steps to answer the number of steps)")
    if not 0 < args.delta < 1:
        raise ConfigError(f"--delta must be in (0, 1), got {args.delta}")
    for flag in ("epsilon", "target_epsilon"):
        value = getattr(args, flag)
        if value is not None and not (math.isfinite(value) and 0 < value <= MAX_EPSILON):
            raise ConfigError(f"--{flag.replace('_', '-')} must be a number in (0, "
                              f"{MAX_EPSILON:g}] (e^eps must be a double), got {value}")
    if not 1 <= args.group_size <= MAX_GROUP_SIZE:
        raise ConfigError(f"--group-size must be in 1..{MAX_GROUP_SIZE}, got {args.group_size}")
    if args.ledger is not None:
        return {"ledger_steps": _load_ledger(Path(args.ledger), args.sampling)}

    if args.batch_size is not None or args.dataset_size is not None:
        if args.batch_size is None or args.dataset_size is None:
            raise ConfigError("--batch-size and --dataset-size go together")
        if not 1 <= args.batch_size <= args.dataset_size:
            raise ConfigError(f"need 1 <= --batch-size <= --dataset-size, got "
                              f"{args.batch_size} and {args.dataset_size}")
        if args.q is None:
            args.q = args.batch_size / args.dataset_size
    if args.q is None:
        raise ConfigError("give --q, or --batch-size and --dataset-size (or --ledger)")
    if not (math.isfinite(args.q) and 0 < args.q <= 1):
        raise ConfigError(f"q must be in (0, 1], got {args.q}")
    if args.sigma is not None and not (math.isfinite(args.sigma) and args.sigma > 0):
        raise ConfigError(f"--sigma must be > 0, got {args.sigma}")
    if args.sigma is None and args.target_epsilon is None:
        raise ConfigError("give --sigma (or --target-epsilon to answer it)")
    if args.max_steps and args.sigma is None:
        raise ConfigError("--max-steps needs --sigma")
    if args.epochs is not None:
        if not (math.isfinite(args.epochs) and args.epochs > 0):
            raise ConfigError(f"--epochs must be > 0, got {args.epochs}")
        # Dong-Roth-Su count T = epochs * N / m steps; a partial last step is still a release.
        per_epoch = (args.dataset_size / args.batch_size if args.batch_size is not None
                     else 1.0 / args.q)
        if not args.epochs * per_epoch <= MAX_STEPS:
            raise ConfigError(f"--epochs {args.epochs:g} is {args.epochs * per_epoch:.3g} "
                              f"steps; at most {MAX_STEPS:.0e} are accounted")
        args.steps = math.ceil(args.epochs * per_epoch - 1e-9)
    if not args.max_steps:
        if args.steps is None:
            raise ConfigError("give --steps or --epochs")
        if not 1 <= args.steps <= MAX_STEPS:
            raise ConfigError(f"T must be in 1..{MAX_STEPS:.0e}, got {args.steps}")
    return {}


def _load_ledger(path: Path, sampling: str) -> list[Any]:  # noqa: C901, PLR0912 - one refusal per kind of damage
    """Steps from a JSON list / ``{"steps": [...]}`` file or a fedsim ledger (JSON lines,
    verified like the client's own: header, hash chain, high-water mark if present)."""
    from fedsim.errors import LedgerError
    from fedsim.privacy.events import GaussianStep
    from fedsim.privacy.ledger import read_ledger_steps

    try:
        with path.open("rb") as handle:
            data = handle.read(MAX_LEDGER_BYTES + 1)
    except OSError as exc:
        raise ConfigError(f"--ledger {path}: {exc.strerror}") from None
    if len(data) > MAX_LEDGER_BYTES:
        raise ConfigError(f"--ledger {path}: larger than {MAX_LEDGER_BYTES // 2**20} MB")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = data[: exc.start].count(b"\n") + 1
        raise ConfigError(f"--ledger {path}: line {line}: not UTF-8 text") from None
    try:
        obj = json.loads(text, parse_constant=_no_constant)
    except json.JSONDecodeError:
        obj = None  # perhaps JSON lines
    except ValueError as exc:  # NaN / Infinity
        raise ConfigError(f"--ledger {path}: {exc}") from None
    if obj is None or (isinstance(obj, dict) and "format" in obj):
        # a fedsim ledger: JSON lines, a header then chained records
        try:
            steps = list(read_ledger_steps(path))
        except (LedgerError, ConfigError) as exc:
            raise ConfigError(f"--ledger: {exc}") from None
    else:
        items = obj.get("steps") if isinstance(obj, dict) else obj
        if not isinstance(items, list):
            raise ConfigError(f"--ledger {path}: expected a list of steps or {{'steps': [...]}}")
        try:
            steps = [GaussianStep.from_json(item) for item in items]
        except ConfigError as exc:
            raise ConfigError(f"--ledger {path}: {exc}") from None
    if not steps:
        raise ConfigError(f"--ledger {path}: no steps")
    total = sum(s.count for s in steps)
    if total > MAX_STEPS:
        raise ConfigError(f"--ledger {path}: {total:.3g} steps; at most {MAX_STEPS:.0e} are "
                          f"accounted")
    schemes = {s.sampling for s in steps}
    if len(schemes) > 1:
        raise ConfigError(f"--ledger {path} mixes poisson and fixed steps")
    if schemes != {sampling}:
        raise ConfigError(f"--ledger {path} has {schemes.pop()} steps but --sampling is {sampling}")
    return steps


def _no_constant(name: str) -> float:
    raise ValueError(f"{name} is not a number")


# -- the answers -----------------------------------------------------------------------------------
def run(args: argparse.Namespace) -> int:
    _print(answer(args), as_json=args.json)
    return 0


def answer(args: argparse.Namespace) -> dict[str, Any]:
    """The command's answer as a dict (also :func:`fedsim.account`); draws ``--plot``."""
    try:
        return _answer(args)
    except PrivacyError as exc:  # a question the accountants cannot answer: bad input here
        raise ConfigError(str(exc)) from None


def _answer(args: argparse.Namespace) -> dict[str, Any]:  # noqa: C901, PLR0912, PLR0915 - one branch per accountant's report
    import numpy as np

    from fedsim.privacy import calibration, fdp
    from fedsim.privacy.accountant import make_accountant
    from fedsim.privacy.events import NEIGHBOURING_RELATION, GaussianStep

    mechanism = _resolve(args)
    name = args.accountant
    result: dict[str, Any] = {
        "accountant": name, "sampling": args.sampling,
        "neighbouring_relation": NEIGHBOURING_RELATION[args.sampling],
        "is_guarantee": name != "gdp-clt", "delta": args.delta, "group_size": args.group_size,
    }
    if name == "gdp-clt":
        result["note"] = "CLT approximation, not a guarantee (it can under-report)"

    if args.max_steps:
        result.update(q=args.q, sigma=args.sigma, epsilon=args.target_epsilon)
        if name == "rdp":
            for conversion in ("classic", "optimal"):
                def measure(acc: Any, d: float, c: str = conversion) -> float:
                    return float(getattr(acc, f"epsilon_{c}")(d))

                result[f"steps_{conversion}"] = calibration.max_steps(
                    name, args.sampling, args.q, args.sigma, args.target_epsilon, args.delta,
                    measure=measure)
            result["steps"] = result["steps_optimal"]
        else:
            result["steps"] = calibration.max_steps(
                name, args.sampling, args.q, args.sigma, args.target_epsilon, args.delta)
            if name == "pld":  # the most steps any guarantee allows (see _smallest_bound)
                from fedsim.privacy import rdp

                result["steps_pld"] = result["steps"]
                result["steps_rdp"] = min(rdp.max_steps(
                    GaussianStep(args.sampling, args.q, args.sigma), args.target_epsilon,
                    args.delta), calibration.MAX_STEPS_LIMIT)
                result["bound"] = "rdp" if result["steps_rdp"] > result["steps_pld"] else "pld"
                result["steps"] = max(result["steps_pld"], result["steps_rdp"])
        steps = [GaussianStep(args.sampling, args.q, args.sigma, max(result["steps"], 1))]
    elif args.target_epsilon is not None:
        result.update(q=args.q, steps=args.steps, epsilon=args.target_epsilon)
        result["sigma"] = calibration.calibrate_sigma(
            name, args.sampling, args.q, args.steps, args.target_epsilon, args.delta)
        steps = [GaussianStep(args.sampling, args.q, result["sigma"], args.steps)]
    elif "ledger_steps" in mechanism:
        steps = mechanism["ledger_steps"]
        kinds = {(s.q, s.sigma) for s in steps}
        one = next(iter(kinds)) if len(kinds) == 1 else (None, None)
        result.update(q=one[0], sigma=one[1], steps=sum(s.count for s in steps),
                      distinct_steps=len(kinds))
    else:
        steps = [GaussianStep(args.sampling, args.q, args.sigma, args.steps)]
        result.update(q=args.q, sigma=args.sigma, steps=args.steps)

    accountant = make_accountant(name, steps)
    group = args.group_size
    need_curve = name != "gdp-clt" and (group > 1 or args.plot or not args.max_steps)
    alphas = fdp.default_alphas(20001 if group > 1 else 2001)
    if group > 1:
        # (1 - f)^{o g} is tangent to eps's line at alpha ~ e^-eps delta: far below 1e-9 for a
        # group eps of 20 or more, so the grid reaches the smallest doubles' scale (a floor at
        # 1e-15 made every group eps above about 20 infinite)
        alphas = np.unique(np.concatenate([alphas, np.logspace(-300.0, -9.0, 6000)]))
    betas = accountant.tradeoff(alphas) if need_curve or name == "gdp-clt" else None
    if name == "gdp-clt":
        from fedsim.privacy.gdp import GDPCLTAccountant

        assert isinstance(accountant, GDPCLTAccountant)
        result["mu"] = accountant.mu * group
        result["mu_kind"] = "clt"
        if group == 1:  # certified: the true curve lies within gamma of G_mu (Berry-Esseen)
            from fedsim.privacy.clt_error import clt_band

            result["clt_gamma"] = clt_band(steps, accountant.mu).gamma
    elif betas is not None:
        group_betas = fdp.group_tradeoff(alphas, betas, group) if group > 1 else betas
        try:
            # fitted where 1 - beta is resolved in doubles (not on the far group grid)
            fit = alphas >= 1e-15
            result["mu"] = fdp.fit_gdp_mu(alphas[fit], group_betas[fit])
            result["mu_kind"] = "fit (smallest mu with G_mu below the curve)"
        except ConfigError:  # the curve is 0 on the whole grid: eps is still answered
            result["mu_kind"] = "none: the trade-off curve is 0 on the alpha grid (no GDP fit)"

    if args.epsilon is not None:
        result["epsilon"] = args.epsilon
        result["delta"] = _answer_delta(accountant, args.epsilon, group, alphas, betas, result)
    elif not args.max_steps and args.target_epsilon is None:
        result["epsilon"] = _answer_epsilon(accountant, args.delta, group, alphas, betas, result)

    if args.plot:
        _plot(Path(args.plot), alphas, betas if betas is not None else accountant.tradeoff(alphas),
              result)
        result["plot"] = args.plot
    return result


def _answer_epsilon(accountant: Any, delta: float, group: int, alphas: Any, betas: Any,
                    result: dict[str, Any]) -> float:
    """eps at delta; for ``pld`` the smallest of the guarantees' (named in ``bound``)."""
    from fedsim.privacy import fdp, gdp
    from fedsim.privacy.accountant import smallest_epsilon

    if accountant.name == "gdp-clt":
        return gdp.gdp_epsilon(delta, result["mu"])
    if group > 1:
        return fdp.epsilon_from_tradeoff(alphas, fdp.group_tradeoff(alphas, betas, group), delta)
    if accountant.name == "rdp":
        result["epsilon_classic"] = accountant.epsilon_classic(delta)
        result["epsilon_optimal"] = accountant.epsilon_optimal(delta)
        return float(accountant.epsilon(delta))
    epsilon, result["bound"] = smallest_epsilon(
        accountant, delta, only_if_infinite=accountant.kinds > COMPARE_KINDS)
    return float(epsilon)


def _answer_delta(accountant: Any, epsilon: float, group: int, alphas: Any, betas: Any,
                  result: dict[str, Any]) -> float:
    """delta at eps; for ``pld`` the smallest of the guarantees' (named in ``bound``)."""
    from fedsim.privacy import fdp, gdp
    from fedsim.privacy.accountant import GUARANTEES, make_accountant

    if accountant.name == "gdp-clt":
        return gdp.gdp_delta(epsilon, result["mu"])
    if group > 1:
        return fdp.delta_from_tradeoff(alphas, fdp.group_tradeoff(alphas, betas, group), epsilon)
    if accountant.name == "rdp":
        result["delta_classic"] = accountant.delta_classic(epsilon)
        result["delta_optimal"] = accountant.delta(epsilon)
        return float(accountant.delta(epsilon))
    # the smallest guarantee's delta, like smallest_epsilon's eps
    deltas = {accountant.name: float(accountant.delta(epsilon))}
    if accountant.kinds <= COMPARE_KINDS or deltas[accountant.name] >= 1.0:
        deltas.update({name: float(make_accountant(name, accountant.steps).delta(epsilon))
                       for name in GUARANTEES if name != accountant.name})
    result["bound"] = min(deltas, key=lambda name: deltas[name])
    return deltas[result["bound"]]


def _plot(path: Path, alphas: Any, betas: Any, result: dict[str, Any]) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from fedsim.privacy import fdp, gdp

    group = result["group_size"]
    curve = fdp.group_tradeoff(alphas, betas, group) if group > 1 and \
        result["accountant"] != "gdp-clt" else betas
    if result["accountant"] == "gdp-clt" and group > 1:
        curve = gdp.gdp_tradeoff(alphas, result["mu"])
    mu = result.get("mu")
    fig, ax = plt.subplots(figsize=(5, 5))
    label = f"{result['accountant']} ({'guarantee' if result['is_guarantee'] else 'CLT approximation'})"
    ax.plot(alphas, curve, label=label, color="tab:blue")
    if mu is not None and result["accountant"] != "gdp-clt":
        ax.plot(alphas, gdp.gdp_tradeoff(alphas, mu), "--", color="tab:red",
                label=f"G_mu, mu = {mu:.3f} (GDP fit)")
    ax.plot([0, 1], [1, 0], ":", color="grey", label="no privacy loss")
    ax.set_xlabel("type I error alpha")
    ax.set_ylabel("type II error beta")
    ax.set_xlim(0, 1)
    ax.set_ylim(0, 1)
    ax.set_title(f"{result['sampling']} ({result['neighbouring_relation']}), "
                 f"eps = {result.get('epsilon', float('nan')):.4g} at delta = {result['delta']:.2g}",
                 fontsize=9)
    ax.legend(fontsize=8)
    try:
        fig.savefig(path, dpi=120, bbox_inches="tight")
    except OSError as exc:
        raise ConfigError(f"--plot {path}: {exc.strerror}") from None
    finally:
        plt.close(fig)


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
    print(f"accountant: {result['accountant']} ({kind})")
    print(f"sampling:   {result['sampling']} ({result['neighbouring_relation']} neighbours)")
    for key in ("q", "sigma", "steps", "distinct_steps", "steps_classic", "steps_optimal",
                "steps_pld", "steps_rdp", "bound", "group_size", "epsilon", "epsilon_classic",
                "epsilon_optimal", "delta", "delta_classic", "delta_optimal", "mu", "mu_kind",
                "clt_gamma", "plot"):
        if result.get(key) is not None:
            value = result[key]
            text = f"{value:.6g}" if isinstance(value, float) else str(value)
            print(f"{key + ':':<16}{text}")
