"""``fedsim data fetch mnist``: download MNIST into the cache, verified by sha256.

``fedsim data where mnist`` prints where MNIST is (or would be) looked for, in order.
Sources, hashes and the search order are in :mod:`fedsim.training.data`.
"""

from __future__ import annotations

import argparse
from typing import Any

from fedsim.errors import ConfigError

DATASETS = ("mnist",)


def register(subparsers: Any) -> argparse.ArgumentParser:
    parser = subparsers.add_parser(
        "data", help="download and locate data sets", description=__doc__.splitlines()[0]
    )
    actions = parser.add_subparsers(dest="action", metavar="ACTION")
    fetch = actions.add_parser("fetch", help="download a data set into the cache (sha256-verified)")
    fetch.add_argument("dataset", choices=DATASETS)
    fetch.add_argument(
        "--dir", help="target directory (default: $FEDSIM_DATA_DIR or the user cache)"
    )
    fetch.add_argument(
        "--force", action="store_true", help="download even if a verified copy exists"
    )
    where = actions.add_parser("where", help="print the places a data set is looked for, in order")
    where.add_argument("dataset", choices=DATASETS)
    where.add_argument("--path", help="an explicit path, as scenarios give it")
    parser.set_defaults(func=run)
    return parser


def run(args: argparse.Namespace) -> int:
    from fedsim.training import data

    if args.action == "fetch":
        directory = args.dir or (data.mnist_search_path()[0])
        path = data.fetch_mnist(directory, force=args.force)
        print(path)
        return 0
    if args.action == "where":
        for place in data.mnist_search_path(args.path):
            found = "found" if data.find_mnist(place) else "absent"
            print(f"{place}\t{found}")
        return 0
    raise ConfigError("usage: fedsim data {fetch,where} mnist")
