"""``fedsim ledger``: check a client's privacy ledger, or repair a damaged one.

``check FILE`` verifies the hash chain and the high-water mark (exit 0), or says what is wrong
(exit 2): a ledger shorter than its mark, or different at the mark's count, and a missing or
unreadable mark (without it a cut cannot be detected) are problems. ``repair FILE`` rewrites a ledger that is refused, keeping every readable record and
adding a substitute step for each acknowledged record it cannot verify (a repair it refuses,
saying why: exit 2): a repair may only add
spending, never remove it (see :mod:`fedsim.privacy.ledger_repair`).
"""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path
from typing import Any, cast

from fedsim.atomic import read_regular
from fedsim.errors import ConfigError, LedgerError
from fedsim.json_input import parse_json


def register(subparsers: Any) -> argparse.ArgumentParser:
    parser = subparsers.add_parser(
        "ledger", help="Check or repair a client's privacy ledger.",
        description="Check a client's privacy ledger (its hash chain and high-water mark), or "
        "repair a refused one; a repair only ever adds spending, never removes it.")
    actions = parser.add_subparsers(dest="action", metavar="ACTION", required=True,
                                    parser_class=type(parser))
    check = actions.add_parser(
        "check", help="Verify a ledger's hash chain and high-water mark.",
        description="Verify a ledger's hash chain and high-water mark, and say what it spent "
        "against its budget. The exit status is 0 when the file is intact, within its budget "
        "or not (the last line says which; --json: ok and intact, over_budget), and 2 when it "
        "is refused.")
    check.add_argument("file", metavar="FILE", help="The ledger file (JSON lines).")
    check.add_argument("--json", action="store_true", help="Print the answer as one JSON object.")
    check.set_defaults(func=run_check)
    repair = actions.add_parser(
        "repair", help="Make a refused ledger valid again, only ever adding spending.",
        description="Make a refused ledger valid again: every readable record is kept, each "
        "record that cannot be verified is charged as the most expensive step the "
        "high-water mark recorded (or --lost-step, if dearer), and the damaged file is kept "
        "beside it.")
    repair.add_argument("file", metavar="FILE", help="The ledger file (JSON lines).")
    repair.add_argument("--lost-step", nargs=2, type=float, metavar=("Q", "SIGMA"),
                        help="The step charged for each record that cannot be verified: at "
                             "least as expensive as any the client released (largest q, "
                             "smallest sigma). By default the most expensive step the "
                             "high-water mark recorded; needed for a ledger whose mark has the "
                             "old format (fedsim-hwm/1) or was lost.")
    repair.add_argument("--assume-lost", type=int, metavar="N",
                        help="The records lost beyond what the file shows, when it has no usable "
                             "high-water mark or one slot of it is damaged (the records the "
                             "client's last spend wrote; 0: you vouch that it is complete).")
    repair.add_argument("--no-releases", action="store_true",
                        help="Vouch that the client made no release before round one (DP "
                             "normalisation, DP-PCA): needed when the ledger's first records "
                             "are lost, --lost-step's q is below 1 and its mark has the old "
                             "format (a new mark's ceiling covers the releases).")
    repair.add_argument("--header", metavar="JSON",
                        help="The client's header, for a ledger that lost its own (emptied, or "
                             "line 1 damaged): a JSON object with client_id, sampling, "
                             "accountant and budget ({\"epsilon\": E, \"delta\": D} or null).")
    repair.add_argument("--dry-run", action="store_true", help="Say what would change without changing anything.")
    repair.add_argument("--json", action="store_true", help="Print the answer as one JSON object.")
    repair.set_defaults(func=run_repair)
    return cast(argparse.ArgumentParser, parser)


def _header(path: Path) -> dict[str, Any]:
    try:
        first = read_regular(path, 4096).split(b"\n", 1)[0]  # (a FIFO would block)
        header = parse_json(first.decode("utf-8"))
    except OSError as exc:
        raise ConfigError(f"{path}: {exc.strerror}") from None
    except (UnicodeDecodeError, json.JSONDecodeError):
        header = None
    if not isinstance(header, dict) or not isinstance(header.get("format"), str):
        # (a record where the header was: its line deleted, an attacker's review)
        raise ConfigError(f"{path}: line 1: not a ledger header")
    return header


def _lost_header(path: Path) -> dict[str, Any]:
    """The file's header, or an error saying to give it with --header."""
    try:
        return _header(path)
    except ConfigError as exc:
        raise ConfigError(f"{exc} (the file was emptied or its first line damaged): give the "
                          f"client's header with --header JSON (client_id, sampling, accountant, "
                          f"budget)") from None


def run_check(args: argparse.Namespace) -> int:
    from fedsim.privacy.ledger import Budget, PrivacyLedger
    from fedsim.privacy.ledger_mark import mark_path, read_found_mark

    path = Path(args.file)
    header = _header(path)
    try:
        found = read_found_mark(path)
    except LedgerError as exc:  # damage: exit 2, as every other refusal of check
        raise ConfigError(str(exc)) from None
    mark = None if found is None else found.mark
    if mark is None:  # the chain alone verifies a ledger cut at any line
        raise ConfigError(
            f"{path}: no high-water mark ({mark_path(path).name} is missing, empty or "
            f"unreadable), so a cut or removed records cannot be detected; if you vouch that "
            f"the file is complete, `fedsim ledger repair {path} --assume-lost 0` writes one")
    try:
        budget = Budget.from_json(header.get("budget"))
        ledger = PrivacyLedger.open(path, client_id=str(header.get("client_id")),
                                    sampling=str(header.get("sampling")), budget=budget,
                                    accountant=str(header.get("accountant", "pld")),
                                    read_only=True)
        # (The read-only open refuses what the client's own open refuses: a damaged mark slot
        # and the file at the other's count; an owner's review found check saying ok.)
    except (ConfigError, LedgerError) as exc:
        raise ConfigError(str(exc) if str(path) in str(exc) else f"{path}: {exc}") from None
    with ledger:
        delta = budget.delta if budget is not None else 1e-5
        epsilon = ledger.epsilon(delta)
        result = {"path": str(path), "client_id": ledger.client_id, "records":
                  len(ledger.records), "marked": mark.count, "epsilon": epsilon,
                  "delta": delta, "last_time": ledger.last_time,
                  # The budget it was opened with, and whether its spending is past it (a
                  # repair's substitutes may take it there; a stranger: check said only ok).
                  "budget_epsilon": None if budget is None else budget.epsilon,
                  "over_budget": budget is not None and epsilon > budget.epsilon,
                  # What a repair charges a lost record (None: a mark of the old format).
                  "step_ceiling": None if mark.ceiling is None else mark.ceiling.to_json(),
                  # (a stranger: a flipped newest slot read plain ok) A torn mark write's:
                  # its spend's records were written first, and are counted.
                  "damaged_mark_slot": found is not None and found.other_damaged,
                  # `ok` (kept for scripts) and `intact` mean the same: the file verifies. A
                  # stranger read `ok: True` beside `over_budget: True` as "within budget".
                  "ok": True, "intact": True}
    if args.json:
        _print(result, True)
    else:
        _print_check(result)
    return 0


def _print_check(result: dict[str, Any]) -> None:
    """``check``'s table for people: ``ok`` is shown as ``intact``, and the last line says the
    file's state and its spending against the budget apart, in words."""
    from fedsim.privacy.epsilon_text import epsilon_text, epsilons_apart

    shown = {key: value for key, value in result.items() if key != "ok"}
    budget = result["budget_epsilon"]
    spent_text, budget_text = ((epsilon_text(result["epsilon"]), "") if budget is None
                               else epsilons_apart(result["epsilon"], budget))
    spent = f"eps {spent_text} at delta {result['delta']:g}"
    if budget is None:
        spending = f"and it has no budget ({spent} spent)"
    elif result["over_budget"]:
        spending = f"but it is OVER ITS BUDGET: {spent} spent, above its budget's eps {budget_text}"
    else:
        spending = f"and it is within its budget: {spent} spent of its budget's eps {budget_text}"
    _print(shown, False)
    print(f"The file is intact (its hash chain and high-water mark verify), {spending}.")


def run_repair(args: argparse.Namespace) -> int:
    from fedsim.privacy.events import GaussianStep
    from fedsim.privacy.ledger_repair import repair_ledger

    path = Path(args.file)
    header = None
    if args.header is not None:
        try:
            header = parse_json(args.header)
        except json.JSONDecodeError as exc:
            raise ConfigError(f"--header is not JSON: {exc}") from None
    lost_step = None
    if args.lost_step is not None:
        q, sigma = args.lost_step
        if not all(math.isfinite(v) for v in (q, sigma)):
            raise ConfigError("--lost-step Q SIGMA must be finite numbers")
        source = header if isinstance(header, dict) else _lost_header(path)
        lost_step = GaussianStep(str(source.get("sampling")), q, sigma)  # type: ignore[arg-type]
    try:
        report = repair_ledger(path, lost_step=lost_step, assume_lost=args.assume_lost,
                               dry_run=args.dry_run, header=header, no_releases=args.no_releases)
    except LedgerError as exc:  # a repair refused as asked: exit 2, as every refusal of check
        raise ConfigError(str(exc)) from None
    _print({**report.to_json(), "dry_run": bool(args.dry_run)}, args.json)
    return 0


def _print(result: dict[str, Any], as_json: bool) -> None:
    if as_json:
        print(json.dumps(result, sort_keys=True))
        return
    width = max((len(key) for key in result), default=0) + 2  # the longest key, its colon, a space
    for key, value in result.items():
        if isinstance(value, dict):  # (a step ceiling) key=value, not a Python repr
            value = ", ".join(f"{k}={v}" for k, v in value.items()) or "-"
        print(f"{key + ':':<{width}}{value}")
