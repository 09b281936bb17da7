"""``fedsim data fetch mnist``: download MNIST into the cache, verified by sha256.

``fedsim data where mnist`` prints where MNIST is (or would be) looked for, in order.
Sources, hashes and the search order are in :mod:`fedsim.training.data`.
"""

from __future__ import annotations

import argparse
from typing import Any

from fedsim.errors import ConfigError

DATASETS = ("mnist",)


DESCRIPTION = (
    "Download data sets into the cache and show where they are looked for."
)


def register(subparsers: Any) -> argparse.ArgumentParser:
    parser = subparsers.add_parser(
        "data", help="Download data sets and show where they are looked for.",
        description=DESCRIPTION,
    )
    actions = parser.add_subparsers(dest="action", metavar="ACTION")
    fetch = actions.add_parser(
        "fetch", help="Download a data set into the cache, verified by its sha256 hash.",
        description="Download a data set into the cache, verified by its sha256 hash.")
    fetch.add_argument("dataset", choices=DATASETS, help="The data set to download.")
    fetch.add_argument(
        "--dir", help="The directory to download into (by default $FEDSIM_DATA_DIR or the user "
        "cache)."
    )
    fetch.add_argument(
        "--force", action="store_true", help="Download even if a verified copy exists."
    )
    where = actions.add_parser(
        "where", help="Print the places a data set is looked for, in order.",
        description="Print the places a data set is looked for, in order.")
    where.add_argument("dataset", choices=DATASETS, help="The data set to look for.")
    where.add_argument("--path", help="An explicit path, as a scenario gives it.")
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
