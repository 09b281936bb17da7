"""``fedsim schema``: print the JSON Schema of scenario files (for editor completion)."""

from __future__ import annotations

import argparse
import json
from typing import Any

from fedsim.config import scenario_json_schema

DESCRIPTION = (
    "Print the JSON Schema of scenario files, for editors that complete and check YAML."
)


def register(subparsers: Any) -> argparse.ArgumentParser:
    parser = subparsers.add_parser("schema", help="Print the JSON Schema of scenario files.",
                                   description=DESCRIPTION)
    parser.set_defaults(func=run)
    return parser


def run(args: argparse.Namespace) -> int:
    print(json.dumps(scenario_json_schema(), indent=2, sort_keys=True))
    return 0
