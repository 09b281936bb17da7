"""`fedsim account` and `--ledger` on bad input (issue 13 item 8): a clear error and exit 2, or
the answer, never a traceback; bounded time and memory (the accountant refuses compositions
wider than its FFT limit instead of allocating them)."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from fedsim.cli import main
from fedsim.privacy import gdp
from fedsim.privacy.events import GaussianStep
from fedsim.privacy.ledger import Budget, PrivacyLedger
from fedsim.privacy.pld import PLDAccountant

MECH = ["--q", "0.01", "--sigma", "1"]


def refused(capsys: pytest.CaptureFixture[str], *argv: str) -> str:
    try:
        code = main(["account", *argv])
    except SystemExit as exc:  # argparse's own errors (a malformed number)
        code = int(exc.code or 0)
    assert code == 2
    captured = capsys.readouterr()
    assert "Traceback" not in captured.err and captured.out == ""
    return captured.err


@pytest.mark.parametrize(("argv", "message"), [
    (["--q", "0.01", "--sigma", "1e-300", "--steps", "100"], "too small to account"),
    ([*MECH, "--steps", "1e21"], r"--steps \(T\) must be in 1\.\.1e\+12"),
    ([*MECH, "--epochs", "1e300"], "at most 1e\\+12"),
    (["--accountant", "gdp-clt", "--q", "0.01", "--sigma", "0.05", "--steps", "100"],
     "no meaningful privacy"),
    ([*MECH, "--target-epsilon", "1e300", "--max-steps"], r"in \(0, 700\]"),
    ([*MECH, "--steps", "10", "--group-size", "100000"], "group-size must be in"),
    ([*MECH, "--steps", "2.5"], "not a whole number"),
])
def test_refused_with_a_clear_error(capsys: pytest.CaptureFixture[str], argv: list[str],
                                    message: str) -> None:
    import re

    assert re.search(message, refused(capsys, *argv))


def test_group_size_4_is_answered(capsys: pytest.CaptureFixture[str]) -> None:
    """Was an OverflowError (e^eps in the group curve's delta)."""
    assert main(["account", *MECH, "--steps", "1000", "--group-size", "4", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    one = PLDAccountant([GaussianStep("poisson", 0.01, 1.0, 1000)]).epsilon(1e-5)
    # a group of 4 is less private than one record
    assert math.isfinite(out["epsilon"]) and out["epsilon"] > one


def test_a_long_run_is_answered_not_refused(capsys: pytest.CaptureFixture[str]) -> None:
    """Was "the curve has no grid point": eps is the API's answer. The GDP fit, which reads
    the privacy profile rather than the (here 0) curve on the alpha grid, now exists and
    its eps at 1e-5 is no smaller than the accountant's."""
    assert main(["account", *MECH, "--steps", "1e6", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    api = PLDAccountant([GaussianStep("poisson", 0.01, 1.0, 10**6)]).epsilon(1e-5)
    assert out["epsilon"] == api and round(api, 2) == 139.18
    assert out["mu_kind"].startswith("fit (")
    assert gdp.gdp_epsilon(1e-5, out["mu"]) >= api


def test_json_is_strict_when_eps_is_infinite(capsys: pytest.CaptureFixture[str]) -> None:
    # no noise at double precision: no accountant has a finite eps (at delta 1e-300 pld has
    # none, but rdp's is finite and is the answer since issue 23)
    assert main(["account", "--accountant", "rdp", "--q", "0.01", "--sigma", "1e-300",
                 "--steps", "1000", "--json"]) == 0
    text = capsys.readouterr().out

    def no_constants(name: str) -> float:
        raise AssertionError(f"{name} in JSON output")

    out = json.loads(text, parse_constant=no_constants)
    assert out["epsilon"] is None and "epsilon" in out["infinite"]


# -- --ledger files ---------------------------------------------------------------------------------
def _steps_file(tmp_path: Path, text: str | bytes) -> str:
    path = tmp_path / "steps.json"
    path.write_bytes(text if isinstance(text, bytes) else text.encode())
    return str(path)


@pytest.mark.parametrize(("content", "message"), [
    (b'\xff\xfe[{"sampling": "poisson"}]', "line 1: not UTF-8"),
    (b'[{"sampling": "poisson", "q": 0.01, "sigma": 1.0},\n\xff]', "line 2: not UTF-8"),
    ('[{"sampling": "poisson", "q": 0.01, "sigma": 1.0, "count": 1e20}]', "count must be"),
    ('[{"sampling": "poisson", "q": 0.01, "sigma": 1.0, "count": 100000000000000000000}]',
     "at most 1e\\+12"),
    ('[{"sampling": "poisson", "q": true, "sigma": 1.0}]', "q must be"),
    ('[{"sampling": "poisson", "q": 0.01, "sigma": NaN}]', "NaN is not a number"),
    ("[]", "no steps"),
])
def test_bad_step_files(tmp_path: Path, capsys: pytest.CaptureFixture[str], content: str | bytes,
                        message: str) -> None:
    import re

    assert re.search(message, refused(capsys, "--ledger", _steps_file(tmp_path, content)))


def _ledger(tmp_path: Path) -> Path:
    path = tmp_path / "c1.jsonl"
    with PrivacyLedger.open(path, client_id="c1", sampling="poisson",
                            budget=Budget(5.0, 1e-5)) as ledger:
        for r in range(3):
            ledger.spend(GaussianStep("poisson", 0.01, 1.0), time=float(r), round=r)
    return path


def test_a_ledger_is_read_like_the_client_reads_it(tmp_path: Path,
                                                   capsys: pytest.CaptureFixture[str]) -> None:
    path = _ledger(tmp_path)
    assert main(["account", "--ledger", str(path), "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["steps"] == 3
    assert out["epsilon"] == PLDAccountant([GaussianStep("poisson", 0.01, 1.0, 3)]).epsilon(1e-5)
    assert "warnings" not in out


@pytest.mark.parametrize("mark", ["deleted", "both slots damaged"])
def test_a_ledger_without_a_valid_mark_is_answered_with_a_warning(
        tmp_path: Path, mark: str, capsys: pytest.CaptureFixture[str]) -> None:
    """A stranger cut a ledger to its first records and deleted its mark: `account --ledger`
    printed the smaller eps (0.86 for 1.08) with no word, where `ledger check` refuses and the
    report warns. The answer now carries the warning (stderr, and --json's "warnings")."""
    from fedsim.privacy.ledger_mark import mark_path

    path = _ledger(tmp_path)
    if mark == "deleted":
        lines = path.read_bytes().splitlines(keepends=True)
        path.write_bytes(b"".join(lines[:-1]))  # the last record cut, unseen without a mark
        mark_path(path).unlink()
    else:
        data = bytearray(mark_path(path).read_bytes())
        data[20] ^= 1
        data[256 + 20] ^= 1
        mark_path(path).write_bytes(bytes(data))
    assert main(["account", "--ledger", str(path), "--json"]) == 0
    captured = capsys.readouterr()
    [warning] = json.loads(captured.out)["warnings"]
    assert "no valid high-water mark" in warning and "may be below" in warning
    assert "warning: " in captured.err and "no valid high-water mark" in captured.err


@pytest.mark.parametrize("damage", ["no-header", "damaged-key", "q-true", "count-1e20"])
def test_damaged_ledgers_are_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                     damage: str) -> None:
    """Was: a file without its header lost its first record silently, a record with a damaged
    key was skipped and ``"q": true`` read as 1."""
    path = _ledger(tmp_path)
    lines = path.read_text().splitlines()
    if damage == "no-header":
        lines = lines[1:]
    elif damage == "damaged-key":
        lines[2] = lines[2].replace('"step"', '"stpe"')
    elif damage == "q-true":
        lines[2] = lines[2].replace('"q": 0.01', '"q": true')
    else:
        lines[2] = lines[2].replace('"count": 1', '"count": 1e20')
    path.write_text("\n".join(lines) + "\n")
    err = refused(capsys, "--ledger", str(path))
    assert "line 1" in err if damage == "no-header" else "line 3" in err


def test_a_composition_wider_than_the_pld_computes_is_answered_by_rdp(
        capsys: pytest.CaptureFixture[str]) -> None:
    """10^11 steps: the PLD refuses to allocate the composition (bounded memory) and the
    answer is the smallest guarantee that can represent it, RDP's (it was refused outright;
    since an attacker's ledger, a history the PLD cannot represent is bounded by the others)."""
    assert main(["account", *MECH, "--steps", "1e11", "--json"]) == 0
    answer = json.loads(capsys.readouterr().out)
    assert answer["bound"] == "rdp" and math.isfinite(answer["epsilon"])
    assert answer["mu_kind"].startswith("none: the PLD cannot represent this history")
