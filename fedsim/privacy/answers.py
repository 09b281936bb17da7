"""The answers of ``fedsim account`` (and :func:`fedsim.account`) as typed library calls.

:func:`account` validates one privacy question about DP-SGD and answers it as an
:class:`AccountAnswer`: eps at delta (the default), delta at eps, the smallest sigma for a
target eps (:func:`fedsim.privacy.calibration.calibrate_sigma`), or the most steps for a target
eps (:func:`fedsim.privacy.calibration.max_steps`), each optionally for groups of records: for
a guarantee the least of the generic group bounds (Dong, Roth & Su, "Gaussian Differential
Privacy", Theorem 2.14, on the accountant's curve and on RDP's, composed on ``1 - f`` where a
group's small type I errors keep their digits) and, for ``pld`` under Poisson sampling
(add/remove), the tight mixture-of-Gaussians bound of the group's own pair (Ganesh 2024,
:mod:`fedsim.privacy.group_mixture`); ``bound`` names which (:mod:`fedsim.privacy.group_answers`).
Fixed-size batches (replace-one) keep the generic bounds, as the answer's ``note`` says. A
target eps or the most steps for a group is met by the group. The command parses flags into
these keyword arguments and formats the answer; the Python API passes its keywords straight in.

Sampling schemes measure different things (never compare one's numbers with the other's):
``poisson`` = add/remove neighbours, noise C sigma; ``fixed`` = batches of exactly m,
replace-one neighbours, noise 2 C sigma (Dong-Roth-Su Thm 5.1). ``pld`` and ``rdp`` answer
guarantees, and ``pld`` answers the smallest of the guarantees' (its ``bound`` names which);
``gdp-clt`` is the central limit theorem's approximation (Dong-Roth-Su Thm 3.5), labelled as
one, with its certified Berry-Esseen distance ``clt_gamma``.

Error messages name the command's flags (``--delta``, ...): the API's keyword of each is the
flag's name with ``_`` for ``-``.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field, fields, replace
from os import PathLike
from pathlib import Path
from typing import Any, Literal

import numpy as np

from fedsim.atomic import TooLarge, read_regular
from fedsim.config import limits
from fedsim.errors import AccountantOutOfRange, ConfigError, LedgerError, PrivacyError
from fedsim.json_input import parse_json
from fedsim.privacy import calibration, fdp, gdp
from fedsim.privacy.accountant import GUARANTEES, Accountant, make_accountant, smallest_epsilon
from fedsim.privacy.events import NEIGHBOURING_RELATION, SAMPLING_SCHEMES, GaussianStep, Sampling
from fedsim.privacy.group_answers import (
    MIXTURE,
    group_alphas,
    group_calibrate_sigma,
    group_complements,
    group_delta,
    group_epsilon,
    group_max_steps,
    group_mixture,
)
from fedsim.privacy.group_mixture import MixtureBound

AccountantChoice = Literal["pld", "rdp", "gdp-clt"]
ACCOUNTANT_CHOICES: tuple[AccountantChoice, ...] = ("pld", "rdp", "gdp-clt")
# Bounds that keep every answer finite in time and memory (larger values are refused).
MAX_STEPS = 10**12
MAX_EPSILON = 700.0  # e^eps must be a double
MAX_GROUP_SIZE = 10_000
MAX_LEDGER_BYTES = limits.MAX_LEDGER_BYTES  # (a steps file too: the ledger's cap)
# A pld answer is compared with rdp's for histories of at most this many distinct kinds of
# step (rdp costs one quadrature per kind, ~30 ms); longer mixes ask rdp only where pld has
# no finite answer.
COMPARE_KINDS = 64
DEFAULT_DELTA = 1e-5
# A group's calibrated sigma to this relative tolerance (each eps of a group costs about a
# second: its curve on 26,000 points and RDP's; one record's is to 1e-4).
GROUP_REL_TOL = 1e-3
CLT_NOTE = "CLT approximation, not a guarantee (it can under-report)"
FIXED_GROUP_NOTE = ("fixed-size batches (replace-one): generic group bounds only (Dong-Roth-Su "
                    "Thm 2.14 on the pld and rdp curves); the tight mixture bound is for "
                    "Poisson sampling")


@dataclass(frozen=True)
class TradeoffCurve:
    """The answered history's trade-off curve for the asked group (alpha grid, beta lower
    bounds): what ``--plot`` draws. ``name``: which bound's curve, where it is not the
    answer's ``bound`` (a group's: the pointwise best of all its bounds' curves)."""

    alphas: np.ndarray
    betas: np.ndarray
    name: str | None = None


# Keys of AccountAnswer.as_dict() present even when None (a ledger of mixed steps has no one q).
_ALWAYS = ("accountant", "sampling", "neighbouring_relation", "is_guarantee", "delta",
           "group_size", "q", "sigma", "steps", "epsilon")


@dataclass(frozen=True)
class AccountAnswer:
    """One answer of ``fedsim account`` (fields None where the question did not ask them).

    ``epsilon`` / ``delta``: the pair answered (for ``target_epsilon`` questions ``epsilon``
    is the target). ``steps``: the history's length (the answer with ``max_steps``).
    ``bound``: which guarantee gave the smallest eps / delta / most steps (``pld`` or ``rdp``;
    for a group also ``pld+rdp``, the pointwise best of their generic group curves, and
    ``mixture``, the tight bound of a Poisson group; for a group's calibrated sigma or most
    steps, the bound that met the target).
    ``mu``: the GDP mu (the CLT's for ``gdp-clt``, else the smallest G_mu below the curve).
    """

    accountant: AccountantChoice
    sampling: Sampling
    neighbouring_relation: str
    is_guarantee: bool
    delta: float
    group_size: int
    q: float | None
    sigma: float | None
    steps: int
    epsilon: float
    note: str | None = None
    distinct_steps: int | None = None
    steps_classic: int | None = None
    steps_optimal: int | None = None
    steps_pld: int | None = None
    steps_rdp: int | None = None
    bound: str | None = None
    epsilon_classic: float | None = None
    epsilon_optimal: float | None = None
    delta_classic: float | None = None
    delta_optimal: float | None = None
    mu: float | None = None
    mu_kind: str | None = None
    clt_gamma: float | None = None
    curve: TradeoffCurve | None = field(default=None, compare=False, repr=False)
    warnings: tuple[str, ...] | None = None
    """What the answer cannot see (a ledger without its high-water mark: a cut file would
    not show, so the eps may be below what was released); None: nothing."""

    def as_dict(self) -> dict[str, Any]:
        """The command's ``--json`` object (before non-finite numbers become null)."""
        out: dict[str, Any] = {}
        for item in fields(self):
            value = getattr(self, item.name)
            if item.name != "curve" and (value is not None or item.name in _ALWAYS):
                out[item.name] = value
        return out


def account(
    *,
    sampling: Sampling | None = None,
    q: float | None = None,
    batch_size: int | None = None,
    dataset_size: int | None = None,
    sigma: float | None = None,
    steps: int | None = None,
    epochs: float | None = None,
    ledger: str | PathLike[str] | None = None,
    delta: float = DEFAULT_DELTA,
    accountant: AccountantChoice = "pld",
    epsilon: float | None = None,
    target_epsilon: float | None = None,
    max_steps: bool = False,
    group_size: int = 1,
    curve: bool = False,
) -> AccountAnswer:
    """Answer one privacy question about DP-SGD (see the module docstring).

    The mechanism is ``q`` (or ``batch_size`` / ``dataset_size``), ``sigma`` and ``steps`` (or
    ``epochs``), or a ``ledger`` file of steps. ``sampling`` None: the ledger's own scheme, or
    Poisson without a ledger; a scheme given must be the ledger's. With ``curve`` the answer
    carries the trade-off curve (and, for a guarantee, its GDP fit even for a ``max_steps``
    question).
    Raises :class:`ConfigError` for a question that cannot be answered (conflicting or
    out-of-range values, a damaged ledger, a release beyond double precision).
    """
    if sampling is not None and sampling not in SAMPLING_SCHEMES:
        raise ConfigError(f"account: sampling must be one of {list(SAMPLING_SCHEMES)}, got "
                          f"{sampling!r}")
    if accountant not in ACCOUNTANT_CHOICES:
        raise ConfigError(f"account: accountant must be one of {list(ACCOUNTANT_CHOICES)}, got "
                          f"{accountant!r}")
    _check_question(q=q, batch_size=batch_size, sigma=sigma, steps=steps, epochs=epochs,
                    ledger=ledger, delta=delta, epsilon=epsilon, target_epsilon=target_epsilon,
                    max_steps=max_steps, group_size=group_size)
    history: list[GaussianStep] | None = None
    warnings: tuple[str, ...] | None = None
    if ledger is not None:
        history, warnings = load_steps(Path(ledger), sampling)
        sampling = history[0].sampling  # (load_steps: one scheme, the one asked if any)
    else:
        sampling = "poisson" if sampling is None else sampling
        q, steps = _mechanism(q=q, batch_size=batch_size, dataset_size=dataset_size,
                              sigma=sigma, steps=steps, epochs=epochs,
                              target_epsilon=target_epsilon, max_steps=max_steps)
    try:
        answer = _answer(sampling, accountant, history, q, sigma, steps, delta=delta,
                         epsilon=epsilon, target_epsilon=target_epsilon, max_steps=max_steps,
                         group=group_size, curve=curve)
    except PrivacyError as exc:  # a question the accountants cannot answer: bad input here
        raise ConfigError(str(exc)) from None
    return answer if warnings is None else replace(answer, warnings=warnings)


# -- input checking ------------------------------------------------------------------------------
def _check_question(*, q: float | None, batch_size: int | None, sigma: float | None,  # noqa: C901
                    steps: int | None, epochs: float | None, ledger: object, delta: float,
                    epsilon: float | None, target_epsilon: float | None, max_steps: bool,
                    group_size: int) -> None:
    """Refuse conflicting or out-of-range values that do not depend on the mechanism."""
    given = {"--q": q, "--batch-size": batch_size, "--steps": steps, "--epochs": epochs,
             "--epsilon": epsilon, "--target-epsilon": target_epsilon,
             "--max-steps": max_steps or None}
    for pair in (("--q", "--batch-size"), ("--steps", "--epochs"),
                 ("--epsilon", "--target-epsilon"), ("--steps", "--max-steps"),
                 ("--epochs", "--max-steps")):
        if all(given[name] is not None for name in pair):
            raise ConfigError(f"conflicting flags: {' and '.join(pair)}")
    if ledger is not None:
        for flag, value in (("q", q), ("batch-size", batch_size), ("sigma", sigma),
                            ("steps", steps), ("epochs", epochs),
                            ("target-epsilon", target_epsilon)):
            if value is not None:
                raise ConfigError(f"conflicting flags: --ledger and --{flag}")
    if max_steps and target_epsilon is None:
        raise ConfigError("--max-steps needs --target-epsilon")
    if target_epsilon is not None and not max_steps and sigma is not None:
        raise ConfigError("conflicting flags: --target-epsilon answers sigma; drop --sigma "
                          "(or add --max-steps to answer the number of steps)")
    if not 0 < delta < 1:
        raise ConfigError(f"--delta must be in (0, 1), got {delta}")
    for flag, value in (("epsilon", epsilon), ("target-epsilon", target_epsilon)):
        if value is not None and not (math.isfinite(value) and 0 < value <= MAX_EPSILON):
            raise ConfigError(f"--{flag} must be a number in (0, {MAX_EPSILON:g}] (e^eps must "
                              f"be a double), got {value}")
    if not 1 <= group_size <= MAX_GROUP_SIZE:
        raise ConfigError(f"--group-size must be in 1..{MAX_GROUP_SIZE}, got {group_size}")


def _mechanism(*, q: float | None, batch_size: int | None,  # noqa: C901, PLR0912 - one check per combination, each with its own message
               dataset_size: int | None, sigma: float | None, steps: int | None,
               epochs: float | None, target_epsilon: float | None,
               max_steps: bool) -> tuple[float, int | None]:
    """(q, steps) of a mechanism given by flags, validated (steps None for ``max_steps``)."""
    if batch_size is not None or dataset_size is not None:
        if batch_size is None or dataset_size is None:
            raise ConfigError("--batch-size and --dataset-size go together")
        if not 1 <= batch_size <= dataset_size:
            raise ConfigError(f"need 1 <= --batch-size <= --dataset-size, got "
                              f"{batch_size} and {dataset_size}")
        if q is None:
            q = batch_size / dataset_size
    if q is None:
        raise ConfigError("give --q, or --batch-size and --dataset-size (or --ledger)")
    if not (math.isfinite(q) and 0 < q <= 1):
        raise ConfigError(f"--q must be in (0, 1], got {q}")
    if sigma is not None and not (math.isfinite(sigma) and sigma > 0):
        raise ConfigError(f"--sigma must be a finite number > 0, got {sigma}")
    if sigma is None and target_epsilon is None:
        raise ConfigError("give --sigma (or --target-epsilon to answer it)")
    if max_steps and sigma is None:
        raise ConfigError("--max-steps needs --sigma")
    if epochs is not None:
        if not (math.isfinite(epochs) and epochs > 0):
            raise ConfigError(f"--epochs must be a finite number > 0, got {epochs}")
        # Dong-Roth-Su count T = epochs * N / m steps; a partial last step is still a release.
        per_epoch = (dataset_size / batch_size if batch_size is not None and
                     dataset_size is not None else 1.0 / q)
        if not epochs * per_epoch <= MAX_STEPS:
            raise ConfigError(f"--epochs {epochs:g} is {epochs * per_epoch:.3g} steps; at most "
                              f"{MAX_STEPS:.0e} are accounted")
        steps = math.ceil(epochs * per_epoch - 1e-9)
    if not max_steps:
        if steps is None:
            raise ConfigError("give --steps or --epochs")
        if not 1 <= steps <= MAX_STEPS:
            raise ConfigError(f"--steps (T) must be in 1..{MAX_STEPS:.0e}, got {steps}")
    return q, steps


def load_steps(path: Path, sampling: Sampling | None  # noqa: C901, PLR0912 - one refusal per kind of damage
               ) -> tuple[list[GaussianStep], tuple[str, ...] | None]:
    """Steps from a JSON list / ``{"steps": [...]}`` file or a fedsim ledger (JSON lines,
    verified like the client's own: header, hash chain, high-water mark if present), all of
    one scheme, ``sampling``'s when given; :class:`ConfigError` names the damage. With them,
    warnings of what the steps cannot show (a ledger without a valid high-water mark, as
    ``fedsim report`` warns: a stranger's cut ledger without its mark read eps 0.86 for
    1.08, unwarned), or None."""
    from fedsim.privacy.ledger import read_ledger_steps
    from fedsim.privacy.ledger_mark import read_found_mark

    warnings: tuple[str, ...] | None = None

    try:  # a regular file (a FIFO hung here: an attacker's review), sized before it is read
        data = read_regular(path, refuse_over=MAX_LEDGER_BYTES)
    except TooLarge:
        raise ConfigError(f"--ledger {path}: larger than {MAX_LEDGER_BYTES // 2**20} MiB, "
                          f"more than any ledger holds; not read") from None
    except OSError as exc:
        raise ConfigError(f"--ledger {path}: {exc.strerror}") from None
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = data[: exc.start].count(b"\n") + 1
        raise ConfigError(f"--ledger {path}: line {line}: not UTF-8 text") from None
    try:
        obj = parse_json(text, parse_constant=_no_constant)
    except json.JSONDecodeError:
        obj = None  # perhaps JSON lines
    except ValueError as exc:  # NaN / Infinity
        raise ConfigError(f"--ledger {path}: {exc}") from None
    if obj is None or (isinstance(obj, dict) and "format" in obj):
        # a fedsim ledger: JSON lines, a header then chained records
        try:
            steps = list(read_ledger_steps(path))
            if read_found_mark(path) is None:
                warnings = (f"{path} has no valid high-water mark (missing, empty or damaged): "
                            f"records cut from its end would not show, so this eps may be "
                            f"below what was released (`fedsim ledger check {path}`)",)
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
    if sampling is not None and schemes != {sampling}:
        raise ConfigError(f"--ledger {path} has {schemes.pop()} steps but sampling is {sampling} "
                          f"(leave sampling out to take the ledger's)")
    return steps, warnings


def _no_constant(name: str) -> float:
    raise ValueError(f"{name} is not a number")


# -- the answers -----------------------------------------------------------------------------------
def _history(sampling: Sampling, name: AccountantChoice, history: list[GaussianStep] | None,
             q: float | None, sigma: float | None, count: int | None, *, delta: float,
             target_epsilon: float | None, max_steps: bool, group: int
             ) -> tuple[dict[str, Any], list[GaussianStep], float | None, float | None]:
    """The history a question is about (the most steps, or a calibrated sigma, found first),
    what was found on the way, and its one q and sigma (None for a ledger of several)."""
    found: dict[str, Any] = {}
    if max_steps:
        assert q is not None and sigma is not None and target_epsilon is not None
        found = _most_steps(name, sampling, q, sigma, target_epsilon, delta, group)
        return found, [GaussianStep(sampling, q, sigma, max(found["steps"], 1))], q, sigma
    if target_epsilon is not None:
        assert q is not None and count is not None
        if group == 1:
            sigma = calibration.calibrate_sigma(name, sampling, q, count, target_epsilon, delta)
        else:  # met by the group, not by one record
            sigma, bound = group_calibrate_sigma(name, sampling, q, count, target_epsilon, delta,
                                                 group, compare_kinds=COMPARE_KINDS,
                                                 rel_tol=GROUP_REL_TOL)
            if bound is not None:
                found["bound"] = bound
        return found, [GaussianStep(sampling, q, sigma, count)], q, sigma
    if history is not None:
        kinds = {(s.q, s.sigma) for s in history}
        q, sigma = next(iter(kinds)) if len(kinds) == 1 else (None, None)
        found["distinct_steps"] = len(kinds)
        return found, history, q, sigma
    assert q is not None and sigma is not None and count is not None
    return found, [GaussianStep(sampling, q, sigma, count)], q, sigma


def _answer(sampling: Sampling, name: AccountantChoice,
            history: list[GaussianStep] | None, q: float | None, sigma: float | None,
            count: int | None, *, delta: float, epsilon: float | None,
            target_epsilon: float | None, max_steps: bool, group: int,
            curve: bool) -> AccountAnswer:
    found, steps, q, sigma = _history(sampling, name, history, q, sigma, count, delta=delta,
                                      target_epsilon=target_epsilon, max_steps=max_steps,
                                      group=group)
    count = sum(s.count for s in steps) if not max_steps else found["steps"]

    accountant = make_accountant(name, steps)
    if group > 1 and name != "gdp-clt":
        drawn = _group_answer(accountant, group, found, delta=delta, epsilon=epsilon,
                              target_epsilon=target_epsilon, asked=not max_steps
                              and target_epsilon is None, curve=curve)
    else:
        drawn = _record_answer(accountant, steps, group, found, delta=delta, epsilon=epsilon,
                               target_epsilon=target_epsilon, max_steps=max_steps, curve=curve)
    note = _note(name, sampling, group)
    if max_steps and count == 0:  # (a stranger read a bare "steps: 0", exit 0, as an answer)
        none = (f"no step fits: one step of q = {q:g}, sigma = {sigma:g} already spends more "
                f"than eps {target_epsilon:g} at delta {delta:g}")
        note = none if note is None else f"{none}; {note}"
    return AccountAnswer(
        accountant=name, sampling=sampling, neighbouring_relation=NEIGHBOURING_RELATION[sampling],
        is_guarantee=name != "gdp-clt", group_size=group, q=q, sigma=sigma,
        note=note, curve=drawn, **{**found, "steps": count})


def _note(name: AccountantChoice, sampling: Sampling, group: int) -> str | None:
    """The answer's note: the CLT's, or for a fixed-size group which bounds it has."""
    if name == "gdp-clt":
        return CLT_NOTE
    return FIXED_GROUP_NOTE if group > 1 and sampling == "fixed" else None


def _record_answer(accountant: Accountant, steps: list[GaussianStep], group: int,
                   found: dict[str, Any], *, delta: float, epsilon: float | None,
                   target_epsilon: float | None, max_steps: bool,
                   curve: bool) -> TradeoffCurve | None:
    """One record's answer (and ``gdp-clt``'s for a group) into ``found``; the curve asked."""
    eps_alone = not (group > 1 or curve or epsilon is not None or max_steps
                     or target_epsilon is not None)
    alphas, betas = _curve_if_represented(accountant, group, found, eps_alone=eps_alone,
                                          curve=curve or not max_steps or group > 1)
    if accountant.name == "gdp-clt":
        found.update(_clt(accountant, steps, group))
        if curve:  # G_mu for the group's mu, the composed curve for one record
            betas = (gdp.gdp_tradeoff(alphas, found["mu"]) if group > 1
                     else accountant.tradeoff(alphas))
    elif betas is not None:
        found.update(_gdp_fit(accountant, group, alphas, betas))
    if epsilon is not None:
        found.update(_delta_at(accountant, epsilon, group, alphas, betas, found.get("mu")))
    elif not max_steps and target_epsilon is None:
        found.update(_epsilon_at(accountant, delta, group, alphas, betas, found.get("mu")))
    else:
        found.update(epsilon=target_epsilon, delta=delta)
    return TradeoffCurve(alphas, betas) if curve and betas is not None else None


def _most_steps(name: AccountantChoice, sampling: Sampling, q: float, sigma: float,
               target_epsilon: float, delta: float, group: int) -> dict[str, Any]:
    """The most steps T with eps(delta) <= ``target_epsilon`` (``steps``), by
    :func:`fedsim.privacy.calibration.max_steps`. For ``rdp`` both conversions' answers
    (``steps_classic``, ``steps_optimal``; ``steps`` is the optimal one); for ``pld`` the most
    any guarantee allows (``steps_pld``, ``steps_rdp``; ``bound`` names the larger). For groups
    of records the group's eps (:func:`~fedsim.privacy.group_answers.group_measure`, every
    guarantee's curve)."""
    if group > 1:
        steps, bound = group_max_steps(name, sampling, q, sigma, target_epsilon, delta, group,
                                       compare_kinds=COMPARE_KINDS)
        return {"steps": steps} if bound is None else {"steps": steps, "bound": bound}
    if name == "rdp":
        found: dict[str, Any] = {}
        for conversion in ("classic", "optimal"):
            def measure(acc: Accountant, d: float, c: str = conversion) -> float:
                return float(getattr(acc, f"epsilon_{c}")(d))

            found[f"steps_{conversion}"] = calibration.max_steps(
                name, sampling, q, sigma, target_epsilon, delta, measure=measure)
        return {**found, "steps": found["steps_optimal"]}
    steps = calibration.max_steps(name, sampling, q, sigma, target_epsilon, delta)
    if name != "pld":
        return {"steps": steps}
    from fedsim.privacy import rdp

    by_rdp = min(rdp.max_steps(GaussianStep(sampling, q, sigma), target_epsilon, delta),
                 calibration.MAX_STEPS_LIMIT)
    return {"steps_pld": steps, "steps_rdp": by_rdp, "bound": "rdp" if by_rdp > steps else "pld",
            "steps": max(steps, by_rdp)}


def _curve(accountant: Accountant, group: int, *,
           curve: bool) -> tuple[np.ndarray, np.ndarray | None]:
    """The alpha grid and (for a guarantee, where asked) the group's trade-off curve on it
    (Dong-Roth-Su Thm 2.14 for groups)."""
    alphas = group_alphas() if group > 1 else fdp.default_alphas(2001)
    if accountant.name == "gdp-clt" or not curve:
        return alphas, None
    betas = accountant.tradeoff(alphas)
    return alphas, fdp.group_tradeoff(alphas, betas, group) if group > 1 else betas


def _curve_if_represented(accountant: Accountant, group: int, found: dict[str, Any], *,
                          eps_alone: bool, curve: bool) -> tuple[np.ndarray, np.ndarray | None]:
    """:func:`_curve`; where the accountant cannot represent the history and only eps is
    asked (``eps_alone``), no curve (``found`` says so) and eps is the smallest other
    guarantee's (:func:`~fedsim.privacy.accountant.smallest_epsilon`; an attacker's ledger was
    refused here where RDP bounds it)."""
    try:
        return _curve(accountant, group, curve=curve)
    except AccountantOutOfRange:
        if not eps_alone:
            raise  # these answers are the PLD curve's own
        found["mu_kind"] = ("none: the PLD cannot represent this history (no GDP fit); eps is "
                            "the smallest other guarantee's")
        return fdp.default_alphas(2001), None


def _clt(accountant: Accountant, steps: list[GaussianStep], group: int) -> dict[str, Any]:
    """The CLT's mu (times the group size, Dong-Roth-Su Cor. 2.15) and, for one record, the
    certified Berry-Esseen distance of the composed curve from G_mu."""
    from fedsim.privacy.gdp import GDPCLTAccountant

    assert isinstance(accountant, GDPCLTAccountant)
    found: dict[str, Any] = {"mu": accountant.mu * group, "mu_kind": "clt"}
    if group == 1:
        from fedsim.privacy.clt_error import clt_band

        found["clt_gamma"] = clt_band(steps, accountant.mu).gamma
    return found


# What the GDP fit guarantees (the JSON's mu_kind; docs/API.md quotes it).
GDP_FIT_KIND = (f"fit (smallest mu whose mu-GDP (eps, delta) pairs all hold for the accountant "
                f"at every delta from {limits.MIN_DELTA:g} to 1 - 1e-9: delta_mu(eps) >= the "
                f"accountant's delta(eps) there)")
NO_GDP_FIT_KIND = (f"none: no mu-GDP dominates the curve down to delta {limits.MIN_DELTA:g} "
                   f"(no GDP fit)")
"""An answer's mu_kind where no GDP fit exists (the curve's or the mixture's)."""


def _gdp_fit(accountant: Accountant, group: int, alphas: np.ndarray,
             betas: np.ndarray) -> dict[str, Any]:
    """The smallest mu whose mu-GDP privacy profile dominates the accountant's down to
    :data:`~fedsim.config.limits.MIN_DELTA` (:func:`fdp.fit_gdp_mu_accountant`; for a group,
    that of the group's curve ``betas``, with ``1 - beta`` rounded up by 1e-15 for the
    digits that ``1 - f`` near 1 loses)."""
    try:
        if group == 1:
            mu = fdp.fit_gdp_mu_accountant(accountant, limits.MIN_DELTA)
        else:
            complement = np.minimum(1.0 - np.asarray(betas, dtype=float) + 1e-15, 1.0)
            mu = fdp.fit_gdp_mu_complement(alphas, complement, limits.MIN_DELTA)
    except ConfigError:  # no mu dominates, or the accountant cannot answer: eps is still answered
        return {"mu_kind": NO_GDP_FIT_KIND}
    return {"mu": mu, "mu_kind": GDP_FIT_KIND}


def _group_curves(accountant: Accountant, group: int, alphas: np.ndarray, *, delta: float,
                  epsilon: float | None) -> dict[str, np.ndarray]:
    """The guarantees' generic group curves as upper bounds on ``1 - f_g``
    (:func:`~fedsim.privacy.group_answers.group_complements`), RDP's asked where the question
    (eps at ``delta``, or delta at ``epsilon``) has no answer from the accountant's own."""
    betas = fdp.group_tradeoff(alphas, accountant.tradeoff(alphas), group)
    if epsilon is not None:
        def vacuous(own: np.ndarray) -> bool:
            return fdp.delta_from_complement(alphas, own, epsilon) >= 1.0
    else:
        def vacuous(own: np.ndarray) -> bool:
            return math.isinf(fdp.epsilon_from_complement(alphas, own, delta))
    return group_complements(accountant, group, alphas, betas, compare_kinds=COMPARE_KINDS,
                             vacuous=vacuous)


def _group_answer(accountant: Accountant, group: int, found: dict[str, Any], *, delta: float,
                  epsilon: float | None, target_epsilon: float | None, asked: bool,
                  curve: bool) -> TradeoffCurve | None:
    """A group's answer into ``found`` for a guarantee: where ``asked`` (eps at ``delta`` or
    delta at ``epsilon``) the least of the generic group curves' and, for ``pld``'s Poisson
    histories, the mixture bound's (:mod:`fedsim.privacy.group_answers`; ``bound`` names it),
    else the calibrated target's (``bound`` set by the search). The GDP fit is of the bound
    named (the mixture's privacy profile, or that curve; a calibration met by a generic
    bound: the accountant's own group curve, as before the mixture). With ``curve``, the
    pointwise best of all the group curves (every one a lower bound on f_g) for the plot."""
    alphas = group_alphas()
    mixture = group_mixture(accountant, group)
    curves: dict[str, np.ndarray] | None = None
    if asked:
        curves = _group_curves(accountant, group, alphas, delta=delta, epsilon=epsilon)
        found.update(_group_value(curves, alphas, mixture, delta=delta, epsilon=epsilon))
    else:
        found.update(epsilon=target_epsilon, delta=delta)
    bound: str | None = found.get("bound")
    if bound == MIXTURE:
        assert mixture is not None
        found.update(_mixture_fit(mixture))
    else:
        fitted = (1.0 - curves[bound] if curves is not None and bound is not None
                  else fdp.group_tradeoff(alphas, accountant.tradeoff(alphas), group))
        found.update(_gdp_fit(accountant, group, alphas, np.clip(fitted, 0.0, 1.0)))
    if not curve:
        return None
    if curves is None:
        curves = _group_curves(accountant, group, alphas, delta=delta, epsilon=None)
    return _best_curve(alphas, curves, mixture)


def _group_value(curves: dict[str, np.ndarray], alphas: np.ndarray,
                 mixture: MixtureBound | None, *, delta: float,
                 epsilon: float | None) -> dict[str, Any]:
    """delta at ``epsilon`` (or eps at ``delta``) for a group: the least of the ``curves``'
    and the ``mixture``'s, and which (``bound``)."""
    if epsilon is not None:
        value, bound = group_delta(curves, alphas, epsilon, mixture)
        return {"delta": value, "bound": bound, "epsilon": epsilon}
    value, bound = group_epsilon(curves, alphas, delta, mixture)
    return {"epsilon": value, "bound": bound, "delta": delta}


def _best_curve(alphas: np.ndarray, curves: dict[str, np.ndarray],
                mixture: MixtureBound | None) -> TradeoffCurve:
    """The pointwise best of the group curves (the smallest upper bound on ``1 - f_g`` at
    each alpha: each is one, so their minimum is too), named by the bounds it is the best
    of."""
    complements = dict(curves)
    if mixture is not None:
        complements[MIXTURE] = mixture.complement(alphas)
    least = np.min(np.stack(list(complements.values())), axis=0)
    names = [name for name in complements if "+" not in name]
    return TradeoffCurve(alphas, np.clip(1.0 - least, 0.0, 1.0),
                         name=f"best of {', '.join(sorted(names))}")


def _mixture_fit(mixture: MixtureBound) -> dict[str, Any]:
    """The GDP fit of the mixture bound's privacy profile (from delta = 1 down to
    :data:`~fedsim.config.limits.MIN_DELTA`, :func:`fdp.fit_gdp_mu_to_profile`)."""
    try:
        epsilons, deltas = mixture.profile(fdp.PROFILE_POINTS)
        mu = fdp.fit_gdp_mu_to_profile(epsilons, deltas)
    except ConfigError:
        return {"mu_kind": NO_GDP_FIT_KIND}
    return {"mu": mu, "mu_kind": GDP_FIT_KIND}


def _epsilon_at(accountant: Accountant, delta: float, group: int, alphas: np.ndarray,
               betas: np.ndarray | None, mu: float | None) -> dict[str, Any]:
    """eps at ``delta`` (``epsilon``); for ``pld`` the smallest of the guarantees' (named in
    ``bound``), for ``rdp`` both conversions', for groups from the group curve ``betas``
    (Dong-Roth-Su Prop. 2.12), for ``gdp-clt`` G_mu's (Cor. 2.13)."""
    if accountant.name == "gdp-clt":
        assert mu is not None
        return {"epsilon": gdp.gdp_epsilon(delta, mu), "delta": delta}
    assert group == 1, "a group's eps is _group_answer's"
    if accountant.name == "rdp":
        from fedsim.privacy.rdp import RDPAccountant

        assert isinstance(accountant, RDPAccountant)
        return {"epsilon_classic": accountant.epsilon_classic(delta),
                "epsilon_optimal": accountant.epsilon_optimal(delta),
                "epsilon": float(accountant.epsilon(delta)), "delta": delta}
    epsilon, bound = smallest_epsilon(accountant, delta,
                                      only_if_infinite=accountant.kinds > COMPARE_KINDS)
    return {"epsilon": float(epsilon), "bound": bound, "delta": delta}


def _delta_at(accountant: Accountant, epsilon: float, group: int, alphas: np.ndarray,
             betas: np.ndarray | None, mu: float | None) -> dict[str, Any]:
    """delta at ``epsilon`` (``delta``), like :func:`_epsilon_at`: for ``pld`` the smallest
    of the guarantees' (named in ``bound``)."""
    if accountant.name == "gdp-clt":
        assert mu is not None
        return {"delta": gdp.gdp_delta(epsilon, mu), "epsilon": epsilon}
    assert group == 1, "a group's delta is _group_answer's"
    if accountant.name == "rdp":
        from fedsim.privacy.rdp import RDPAccountant

        assert isinstance(accountant, RDPAccountant)
        return {"delta_classic": accountant.delta_classic(epsilon),
                "delta_optimal": accountant.delta(epsilon),
                "delta": float(accountant.delta(epsilon)), "epsilon": epsilon}
    deltas = {accountant.name: float(accountant.delta(epsilon))}
    if accountant.kinds <= COMPARE_KINDS or deltas[accountant.name] >= 1.0:
        deltas.update({name: float(make_accountant(name, accountant.steps).delta(epsilon))
                       for name in GUARANTEES if name != accountant.name})
    bound = min(deltas, key=lambda name: deltas[name])
    return {"delta": deltas[bound], "bound": bound, "epsilon": epsilon}
