"""The command line of every process of a deployed run (:func:`process_commands`): the one
source of them, which :class:`~fedsim.runtime.deployed.launcher.Launcher` runs as local
processes and ``fedsim deploy --compose`` writes into a compose file; and which command lines
the earlier parts of a resumed launch ran (:func:`earlier_commands`, ``processes.json``)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from fedsim.errors import ConfigError
from fedsim.runtime.deployed.options import DeploymentOptions

__all__ = ["earlier_commands", "process_commands"]


def process_commands(
    scenario_file: str | Path,
    client_ids: Sequence[str],
    *,
    options: DeploymentOptions,
    state_root: str | Path,
    out: str | Path,
    overrides: Sequence[str] = (),
    aggregators: Sequence[str] = (),
) -> dict[str, list[str]]:
    """The command line of every process of a deployed run, clients first, then the
    ``aggregators``, then ``server``: ``fedsim client ... --state <state_root>/<id>``,
    ``fedsim aggregator ... --aggregator-id <id> --state <state_root>/<id>`` and ``fedsim
    server ... --state <state_root>/server --out <out>``. The one source of these command lines: :class:`Launcher`
    runs them as local processes, ``fedsim deploy --compose`` puts them (with container paths)
    into the compose file. ``options`` (which must name the broker and the run) are passed to
    every process as :meth:`DeploymentOptions.argv` writes them; ``overrides``
    (``PATH=VALUE``) become ``--set`` options."""
    if options.broker is None or options.run is None:
        raise ConfigError("the processes of a deployed run need a broker URL and a run name")
    common = ["--scenario", str(scenario_file), *options.argv()]
    for override in overrides:
        common += ["--set", override]
    state = Path(state_root)
    commands = {
        client_id: ["fedsim", "client", *common, "--client-id", client_id,
                    "--state", str(state / client_id)]
        for client_id in client_ids
    }  # fmt: skip
    for aggregator_id in aggregators:
        commands[aggregator_id] = ["fedsim", "aggregator", *common, "--aggregator-id",
                                   aggregator_id, "--state", str(state / aggregator_id)]
    commands["server"] = [
        "fedsim", "server", *common, "--state", str(state / "server"), "--out", str(out),
        *options.server_argv(),
    ]  # fmt: skip
    return commands


def earlier_commands(earlier: dict[str, Any], command: list[str]) -> list[list[str]]:
    """The command lines an earlier part's record (``processes.json``'s entry) names, its own
    last, that differ from the one before them and from ``command`` (this part's), the broker's
    URL aside (:func:`_but_broker`): a resumed launch keeps what every part ran. Entries that
    are not lists of strings (a damaged file) are left out."""

    def valid(value: object) -> bool:
        return isinstance(value, list) and all(isinstance(v, str) for v in value)

    listed = earlier.get("earlier_commands")
    found = [list(c) for c in listed if valid(c)] if isinstance(listed, list) else []
    last = earlier.get("command")
    if valid(last):
        found.append(list(last))  # type: ignore[arg-type]
    kept: list[list[str]] = []
    for line in found:
        if not kept or _but_broker(kept[-1]) != _but_broker(line):
            kept.append(line)
    if kept and _but_broker(kept[-1]) == _but_broker(command):
        kept.pop()
    return kept


def _but_broker(command: list[str]) -> list[str]:
    """``command`` without its ``--broker URL``: a launch's private broker takes a free port
    at every start, so a resumed part's command differs from the last in it alone (an
    attacker's review saw every resume add every process's command line)."""
    out: list[str] = []
    skip = False
    for word in command:
        if skip:
            skip = False
        elif word == "--broker":
            skip = True
        elif not word.startswith("--broker="):
            out.append(word)
    return out
