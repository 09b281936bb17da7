"""The options every deployed process shares, as one frozen object that converts to and from
command-line arguments.

``fedsim server``, ``fedsim client`` and ``fedsim launch`` register them with
:meth:`DeploymentOptions.add_arguments` and read them back with
:meth:`DeploymentOptions.from_args`; the launcher and the compose writer turn them into the
child processes' command lines with :meth:`DeploymentOptions.argv` (and
:meth:`DeploymentOptions.server_argv`), so one option is spelled in one place. Nothing here
imports the MQTT stack (the command-line parser is built on every ``fedsim`` call).
"""

from __future__ import annotations

import argparse
import math
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path

from fedsim.config.factories import ALLOW_FLAG
from fedsim.errors import ConfigError

__all__ = ["FINAL_STATUS_WAIT", "FLUSH_TIMEOUT", "LAUNCH_WAIT_FOR_CLIENTS", "DeploymentOptions",
           "add_allow_factory_option", "add_set_option"]

FLUSH_TIMEOUT = 10.0
"""Wall seconds a stopping client waits, by default, for the server's receipts of the updates
it sent (``fedsim client --flush-timeout``; a launcher stopping its processes gives its
clients this long and more before it stops the server)."""

FINAL_STATUS_WAIT = 10.0
"""Wall seconds a server that ended the run waits, by default, for the final statuses of the
clients still running (``fedsim server --final-status-wait``): a client answers the end at
once, or, behind an aggregator, after up to 5 s for its relayed receipts
(``client_process.RELAYED_RECEIPTS_WAIT``). The wait ends as soon as every one has answered."""

# How long a launched server waits for every client before its first window (wall seconds).
LAUNCH_WAIT_FOR_CLIENTS = 600.0


def add_set_option(parser: argparse.ArgumentParser) -> None:
    """``--set PATH=VALUE`` (repeatable; ``args.overrides``): scenario overrides."""
    parser.add_argument(
        "--set",
        dest="overrides",
        action="append",
        default=[],
        metavar="PATH=VALUE",
        help="Override one scenario setting with a YAML value, for example "
        "stop.windows=10; repeatable.",
    )


def add_allow_factory_option(parser: argparse.ArgumentParser) -> None:
    """``--allow-factory`` (``args.allow_factories``): the opt-in to running the model and data
    set factories the scenario names (:mod:`fedsim.config.factories`)."""
    parser.add_argument(
        ALLOW_FLAG,
        dest="allow_factories",
        action="store_true",
        help="Run the model.factory and dataset.factory the scenario names: Python code "
        "imported and called on this machine (refused without this flag; read the scenario "
        "and its module first).",
    )


@dataclass(frozen=True)
class DeploymentOptions:
    """How a deployed process reaches the broker and runs scenario time.

    ``time_scale``: wall seconds per scenario second. ``max_backoff``: the longest wait between
    reconnection attempts (wall seconds). ``wait_for_clients``: the server waits up to this long
    for every client before its first window (0: start at once). ``json_logs``: JSON log lines
    (None: when stderr is not a terminal). ``broker``: ``mqtt[s]://[user:password@]HOST[:PORT]``
    (None: ``$FEDSIM_BROKER``). ``secrets_file``: the credentials file ``fedsim deploy`` writes
    (None: ``$FEDSIM_SECRETS``). ``run``: the run name in the MQTT topics (None: the secrets
    file's, else the scenario's). ``tls_*``: client-side TLS for ``mqtts://``.
    ``allow_factories``: the opt-in to running the scenario's factories (``--allow-factory``).
    """

    time_scale: float = 1.0
    max_backoff: float = 10.0
    wait_for_clients: float = 0.0
    json_logs: bool | None = None
    broker: str | None = None
    secrets_file: str | None = None
    run: str | None = None
    tls_ca: str | None = None
    tls_cert: str | None = None
    tls_key: str | None = None
    tls_insecure: bool = False
    allow_factories: bool = False
    wait_on_resume: bool = False
    """The server waits for its clients (``wait_for_clients``) when it resumes from a
    checkpoint too: a resumed launch restarts every client with it (a server restarted under
    running clients must not wait for statuses they have sent already)."""
    final_status_wait: float = FINAL_STATUS_WAIT
    """The server's bound on its wait, after it ended the run, for the final statuses of the
    clients still running (wall seconds; 0: none waited for)."""

    def __post_init__(self) -> None:
        if not (math.isfinite(self.time_scale) and self.time_scale > 0):
            raise ConfigError(f"--time-scale must be a positive number, got {self.time_scale!r}")
        if not (math.isfinite(self.max_backoff) and self.max_backoff > 0):
            raise ConfigError(
                f"--max-backoff must be a positive number of seconds, got {self.max_backoff}"
            )
        if not (math.isfinite(self.wait_for_clients) and self.wait_for_clients >= 0):
            raise ConfigError(
                f"--wait-for-clients must be a number of seconds >= 0, got {self.wait_for_clients}"
            )
        if not (math.isfinite(self.final_status_wait) and self.final_status_wait >= 0):
            # (finite: no client may hold a finished server for ever)
            raise ConfigError(f"--final-status-wait must be a number of seconds >= 0, got "
                              f"{self.final_status_wait}")

    # -- to argv ----------------------------------------------------------------------------
    def argv(self) -> list[str]:
        """The options every process's command line carries (``--wait-for-clients``, the
        server's own, is :meth:`server_argv`)."""
        args: list[str] = []
        if self.broker is not None:
            args += ["--broker", self.broker]
        if self.run is not None:
            args += ["--run", self.run]
        args += ["--time-scale", repr(float(self.time_scale))]
        args += ["--max-backoff", repr(float(self.max_backoff))]
        if self.json_logs is not None:
            args.append("--json-logs" if self.json_logs else "--no-json-logs")
        if self.secrets_file is not None:
            args += ["--secrets", self.secrets_file]
        for flag, value in (
            ("--tls-ca", self.tls_ca),
            ("--tls-cert", self.tls_cert),
            ("--tls-key", self.tls_key),
        ):
            if value is not None:
                args += [flag, value]
        if self.tls_insecure:
            args.append("--tls-insecure")
        if self.allow_factories:
            args.append(ALLOW_FLAG)
        return args

    def server_argv(self) -> list[str]:
        return (["--wait-for-clients", repr(float(self.wait_for_clients))]
                + (["--wait-on-resume"] if self.wait_on_resume else [])
                + (["--final-status-wait", repr(float(self.final_status_wait))]
                   if self.final_status_wait != FINAL_STATUS_WAIT else []))

    def with_absolute_paths(self) -> DeploymentOptions:
        """The same options with the secrets and TLS files as absolute paths (for processes
        that may start elsewhere)."""

        def absolute(path: str | None) -> str | None:
            return str(Path(path).resolve()) if path is not None else None

        return replace(
            self,
            secrets_file=absolute(self.secrets_file),
            tls_ca=absolute(self.tls_ca),
            tls_cert=absolute(self.tls_cert),
            tls_key=absolute(self.tls_key),
        )

    # -- from argv --------------------------------------------------------------------------
    @staticmethod
    def add_arguments(
        parser: argparse.ArgumentParser, *, wait_for_clients: float | None = None,
        launcher: bool = False,
    ) -> None:
        """Register the options (and ``--set``) on ``parser``; ``wait_for_clients``: the default
        of ``--wait-for-clients``, for the commands that start a server (None: not offered);
        ``launcher``: ``fedsim launch``'s, which starts a private broker without ``--broker``
        (it reads no ``$FEDSIM_BROKER``) and names the run after the scenario (no ``--run``:
        a stranger's launch --help offered both, as the other commands take them)."""
        parser.add_argument(
            "--broker",
            metavar="URL",
            help="The broker, as mqtt://[user:password@]HOST[:PORT] or mqtts://... (by "
            + ("default a private mosquitto on 127.0.0.1, started and stopped by this command; "
               "$FEDSIM_BROKER is not read)." if launcher else "default $FEDSIM_BROKER)."),
        )
        parser.add_argument(
            "--secrets",
            metavar="FILE",
            help="The credentials file written by fedsim deploy (by default "
            "$FEDSIM_SECRETS); not needed if the broker URL has user:password.",
        )
        if not launcher:
            parser.add_argument(
                "--run",
                metavar="NAME",
                help="The run's name in the MQTT topics (by default the secrets file's run, "
                "else the scenario name).",
            )
        parser.add_argument(
            "--time-scale",
            type=float,
            default=1.0,
            metavar="X",
            help="Wall seconds per scenario second (default 1.0; smaller is faster).",
        )
        parser.add_argument(
            "--max-backoff",
            type=float,
            default=10.0,
            metavar="SECONDS",
            help="The longest wait between reconnection attempts, in seconds (default 10).",
        )
        if wait_for_clients is not None:
            parser.add_argument(
                "--wait-for-clients",
                type=float,
                default=wait_for_clients,
                metavar="SECONDS",
                help="Before the first window, wait up to this long for every client to "
                f"connect (default {wait_for_clients:g}"
                + ("" if wait_for_clients else ": start at once")
                + "; not when resuming from a checkpoint, unless --wait-on-resume).",
            )
            parser.add_argument(
                "--wait-on-resume",
                action="store_true",
                help="Wait for the clients when resuming from a checkpoint too (fedsim launch "
                "--resume restarts every client with the server).",
            )
            parser.add_argument(
                "--final-status-wait",
                type=float,
                default=FINAL_STATUS_WAIT,
                metavar="SECONDS",
                help="Once the run has ended, wait up to this long for the final statuses of "
                f"the clients still running (default {FINAL_STATUS_WAIT:g}; it stops as soon "
                "as every one has answered).",
            )
        add_set_option(parser)
        add_allow_factory_option(parser)
        parser.add_argument(
            "--json-logs",
            action=argparse.BooleanOptionalAction,
            default=None,
            help="Write log lines as JSON (by default exactly when stderr is not a terminal).",
        )
        parser.add_argument(
            "--tls-ca", metavar="FILE", help="The CA bundle for mqtts:// (by default the system's)."
        )
        parser.add_argument("--tls-cert", metavar="FILE", help="The client certificate for mqtts://.")
        parser.add_argument("--tls-key", metavar="FILE", help="The client certificate's key for mqtts://.")
        parser.add_argument(
            "--tls-insecure", action="store_true", help="Skip certificate checks (for testing only)."
        )

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> DeploymentOptions:
        """The options of a namespace parsed by a parser :meth:`add_arguments` set up."""
        return cls(
            time_scale=args.time_scale,
            max_backoff=args.max_backoff,
            wait_for_clients=getattr(args, "wait_for_clients", 0.0),
            json_logs=args.json_logs,
            broker=args.broker,
            secrets_file=args.secrets,
            run=getattr(args, "run", None),
            tls_ca=args.tls_ca,
            tls_cert=args.tls_cert,
            tls_key=args.tls_key,
            tls_insecure=args.tls_insecure,
            allow_factories=args.allow_factories,
            wait_on_resume=getattr(args, "wait_on_resume", False),
            final_status_wait=getattr(args, "final_status_wait", FINAL_STATUS_WAIT),
        )

    @classmethod
    def from_argv(cls, argv: Sequence[str]) -> DeploymentOptions:
        """The options in a command line (:meth:`argv` + :meth:`server_argv`); other
        arguments are ignored."""
        parser = argparse.ArgumentParser(add_help=False)
        cls.add_arguments(parser, wait_for_clients=0.0)
        args, _ = parser.parse_known_args(list(argv))
        return cls.from_args(args)
