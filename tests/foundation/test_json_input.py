"""JSON someone else wrote fails one way (fedsim.json_input), and the commands that read it say
so instead of printing a traceback (an attacker's review: a 4 KB ledger line of nested ``[``
gave RecursionError in fedsim ledger check, report and account --ledger; an integer of 5,000
digits in a ledger header a ValueError traceback)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from fedsim.cli import main
from fedsim.errors import ConfigError
from fedsim.json_input import parse_json
from fedsim.privacy.events import GaussianStep
from fedsim.privacy.ledger import PrivacyLedger

NESTED = "[" * 2000 + "]" * 2000  # 4 KB: under the ledger line limit
HUGE = '{"format": "x", "n": ' + "9" * 5000 + "}"


@pytest.mark.parametrize("text", [NESTED, HUGE, "{", "[1,]", b'{"a": "\xc3"}'])
def test_every_failure_is_a_json_decode_error(text: str | bytes) -> None:
    with pytest.raises(json.JSONDecodeError) as raised:
        parse_json(text)
    if isinstance(text, bytes):  # (said as what it is, not as an overlong number)
        assert raised.value.msg == "not UTF-8 text"


def test_a_parse_constants_own_refusal_passes_unchanged() -> None:
    def refuse(name: str) -> float:
        raise ConfigError(f"{name} is not a number")

    with pytest.raises(ConfigError, match="NaN is not a number"):
        parse_json('{"a": NaN}', parse_constant=refuse)
    assert parse_json('{"a": [1, 2]}') == {"a": [1, 2]}


def _ledger(path: Path) -> Path:
    ledger = PrivacyLedger.open(path, client_id="c-000", sampling="poisson", budget=None)
    ledger.spend([GaussianStep("poisson", 0.01, 1.1)], time=1.0, round=0)
    ledger.close()
    return path


@pytest.mark.parametrize("where", ["record", "header"])
def test_ledger_commands_refuse_a_nested_or_huge_line_with_a_message(
        tmp_path: Path, where: str, capsys: pytest.CaptureFixture[str]) -> None:
    path = _ledger(tmp_path / "c-000.jsonl")
    lines = path.read_bytes().splitlines(keepends=True)
    if where == "record":
        lines.append(NESTED.encode() + b"\n")
    else:
        lines[0] = HUGE.encode() + b"\n"
    path.write_bytes(b"".join(lines))
    for argv in (["ledger", "check", str(path)], ["account", "--ledger", str(path)]):
        code = main(argv)
        assert code not in (0, None), argv
        err = capsys.readouterr().err
        assert "Traceback" not in err and "RecursionError" not in err, err
