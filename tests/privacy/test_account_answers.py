"""The library under `fedsim account` (issue 28 item 4): :func:`fedsim.privacy.answers.account`
answers with a typed, frozen :class:`AccountAnswer` that is the command's ``--json`` object, and
:func:`fedsim.account` passes its keywords straight to it."""

from __future__ import annotations

import dataclasses
import json
import math
from pathlib import Path
from typing import Any

import pytest

import fedsim
from fedsim.cli import main
from fedsim.errors import ConfigError
from fedsim.privacy.accountant import make_accountant
from fedsim.privacy.answers import AccountAnswer, account
from fedsim.privacy.events import GaussianStep

# (library keywords, the same question as flags): every kind of question and accountant
GRID: list[Any] = [
    {"q": 0.01, "sigma": 1.1, "steps": 1000},
    {"q": 0.01, "sigma": 1.1, "steps": 1000, "sampling": "fixed", "epsilon": 1.5},
    {"q": 0.01, "sigma": 1.1, "steps": 1000, "accountant": "rdp"},
    {"q": 0.01, "sigma": 1.1, "steps": 1000, "accountant": "rdp", "epsilon": 2.0},
    {"q": 0.01, "sigma": 1.1, "steps": 1000, "accountant": "gdp-clt"},
    {"q": 0.01, "sigma": 1.1, "steps": 1000, "accountant": "gdp-clt", "group_size": 3},
    {"q": 0.01, "sigma": 1.0, "steps": 100, "group_size": 2},
    {"q": 0.01, "sigma": 1.0, "steps": 100, "group_size": 2, "epsilon": 2.0},
    {"q": 0.01, "steps": 500, "target_epsilon": 1.0},
    {"q": 0.01, "sigma": 1.0, "target_epsilon": 2.0, "max_steps": True},
    pytest.param({"q": 0.01, "sigma": 1.0, "target_epsilon": 2.0, "max_steps": True,
                  "accountant": "rdp"}, marks=pytest.mark.slow, id="max-steps-rdp"),
    {"batch_size": 256, "dataset_size": 60000, "epochs": 3.0, "sigma": 1.1, "delta": 1e-6},
    {"q": 0.5, "sigma": 0.3, "steps": 1000, "delta": 1e-12},
]


def flags(keywords: dict[str, Any]) -> list[str]:
    argv: list[str] = []
    for name, value in keywords.items():
        flag = "--" + name.replace("_", "-")
        argv += [flag] if value is True else [flag, str(value)]
    return argv


def cli_json(capsys: pytest.CaptureFixture[str], argv: list[str]) -> dict[str, Any]:
    capsys.readouterr()
    assert main(["account", *argv, "--json"]) == 0
    return dict(json.loads(capsys.readouterr().out))


def strict(result: dict[str, Any]) -> dict[str, Any]:
    """What --json prints of a result: non-finite numbers become null, listed in 'infinite'."""
    infinite = sorted(k for k, v in result.items() if isinstance(v, float) and not math.isfinite(v))
    clean = {k: (None if k in infinite else v) for k, v in result.items()}
    if infinite:
        clean["infinite"] = infinite
    return clean


@pytest.mark.parametrize("keywords", GRID,
                         ids=lambda k: ",".join(f"{n}={v}" for n, v in k.items()))
def test_the_typed_answer_is_the_commands_json(keywords: dict[str, Any],
                                               capsys: pytest.CaptureFixture[str]) -> None:
    answer = account(**keywords)
    assert isinstance(answer, AccountAnswer) and isinstance(answer.steps, int)
    assert isinstance(answer.epsilon, float) and isinstance(answer.delta, float)
    printed = cli_json(capsys, flags(keywords))
    printed.pop("note_infinite", None)
    assert strict(answer.as_dict()) == printed
    assert fedsim.account(**keywords) == answer.as_dict()
    with pytest.raises(dataclasses.FrozenInstanceError):
        answer.epsilon = 0.0  # type: ignore[misc]


def test_epsilon_is_the_smallest_guarantee_and_names_it() -> None:
    answer = account(q=0.01, sigma=1.1, steps=1000)
    steps = [GaussianStep("poisson", 0.01, 1.1, 1000)]
    by = {name: make_accountant(name, steps).epsilon(1e-5) for name in ("pld", "rdp")}
    assert answer.bound == min(by, key=lambda name: by[name])
    assert answer.epsilon == pytest.approx(by[answer.bound], rel=1e-12)
    assert answer.is_guarantee and answer.neighbouring_relation == "add/remove"


def test_gdp_clt_answer_is_dong_roth_sus_mu_with_its_certified_gamma() -> None:
    # Dong, Roth & Su, Cor. 5.4: mu = q sqrt(T (e^{1/sigma^2} - 1)) for Poisson sampling
    answer = account(q=0.01, sigma=1.1, steps=1000, accountant="gdp-clt")
    assert answer.mu == pytest.approx(0.01 * math.sqrt(1000 * math.expm1(1 / 1.1**2)), rel=1e-9)
    assert answer.clt_gamma is not None and 0.0 < answer.clt_gamma
    assert not answer.is_guarantee and answer.note is not None and answer.bound is None
    group = account(q=0.01, sigma=1.1, steps=1000, accountant="gdp-clt", group_size=3)
    assert group.mu == pytest.approx(3 * answer.mu) and group.clt_gamma is None


def test_most_steps_and_calibrated_sigma_meet_the_target() -> None:
    most = account(q=0.01, sigma=1.0, target_epsilon=2.0, max_steps=True, accountant="rdp")
    assert most.steps == most.steps_optimal and most.steps_classic is not None
    assert most.steps_classic <= most.steps_optimal and most.epsilon == 2.0
    sigma = account(q=0.01, steps=500, target_epsilon=1.0).sigma
    assert sigma is not None
    assert make_accountant("pld", [GaussianStep("poisson", 0.01, sigma, 500)]).epsilon(1e-5) <= 1.0


def test_the_curve_is_carried_only_when_asked(tmp_path: Path) -> None:
    plain = account(q=0.01, sigma=1.0, target_epsilon=2.0, max_steps=True)
    assert plain.curve is None and plain.mu is None
    drawn = account(q=0.01, sigma=1.0, target_epsilon=2.0, max_steps=True, curve=True)
    assert drawn.curve is not None and drawn.mu is not None
    assert drawn.curve.alphas.shape == drawn.curve.betas.shape
    assert drawn == dataclasses.replace(plain, mu=drawn.mu, mu_kind=drawn.mu_kind)
    from fedsim.commands.account import plot

    with pytest.raises(ConfigError, match="curve=True"):
        plot(tmp_path / "x.png", plain)


@pytest.mark.parametrize(("keywords", "message"), [
    ({"q": 0.01, "sigma": 1.0}, "give --steps or --epochs"),
    ({"q": 0.01, "sigma": 1.0, "steps": 10, "sampling": "uniform"}, "sampling must be one of"),
    ({"q": 0.01, "sigma": 1.0, "steps": 10, "accountant": "moments"}, "accountant must be one"),
    ({"q": 0.01, "batch_size": 3, "sigma": 1.0, "steps": 3}, "--q and --batch-size"),
    ({"q": 0.5, "sigma": 0.3, "steps": 1000, "accountant": "gdp-clt"}, "beyond"),
])
def test_a_question_it_cannot_answer_is_a_config_error(keywords: dict[str, Any],
                                                       message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        account(**keywords)
