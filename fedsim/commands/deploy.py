"""``fedsim deploy SCENARIO [--out DIR]``: broker credentials and access control for a run.

Writes to ``--out`` (default ``deploy/generated``):

* ``secrets.json`` (mode 0600): a random password for the server and for every client of the
  scenario; ``fedsim server``/``client`` read their own with ``--secrets``;
* ``secrets/<username>.json`` (mode 0600): one file a process, holding only its own password
  (``secrets/fedsim-server.json``, ``secrets/<client id>.json``,
  ``secrets/fedsim-aggregator-<k>.json``): give each process its own, and it can log in as
  nobody else;
* ``passwd``: the mosquitto password file (PBKDF2-SHA512 hashes);
* ``acl``: each client may write only its own ``updates``/``status`` topics and read only the
  global model and its own receipts; the server reads all updates/statuses and the
  aggregators' partials and writes the model, the receipts and the window closes; aggregator
  ``k`` (``--aggregators K`` or the scenario's ``aggregators.count``; its own password) reads
  the updates of the clients routed to it, the model and the closes, and writes only its own
  partials; nothing else;
* ``mosquitto.conf``: one authenticated listener, anonymous access denied, client ids bound to
  usernames, the queue sized for the run, the files above as the broker sees them
  (``--broker-config-dir``, ``/mosquitto/config`` in the eclipse-mosquitto container);
* TLS by default: ``ca.crt`` (a fresh CA, its key never written), ``broker.crt`` and
  ``broker.key`` (0600) for the names in ``--tls-host``, and a TLS-only listener on port 8883;
  processes connect with ``mqtts://HOST:8883 --tls-ca ca.crt``. ``--tls-cert``/``--tls-key``
  use certificates of your own instead; plain MQTT only with ``--plain``.

``passwd`` and ``acl`` are mode 0600 too: the broker must run as their owner (``--broker-user``;
for the container ``chown 1883:1883`` them). See docs/SECURITY.md for what all this protects.

Client ids are the scenario's (``<group>-<index>``); ``--client-id`` lists them instead.

Run again into an ``--out`` that holds a deployment, it replaces every password (and the CA)
and prints a ``REPLACED`` line: the broker and every process need the new files.

``--compose FILE`` also writes a docker-compose file for the scenario: the eclipse-mosquitto
broker with these files, the server, and one service per client (each with its own state
volume), running the same ``fedsim server``/``fedsim client`` command lines as
``fedsim launch`` does with local processes; each container gets its own per-process secrets
file and no other. The repository's ``docker-compose.yml`` is
``fedsim deploy scenarios/quickstart.yaml --set aggregators.count=2 --compose docker-compose.yml``
(see deploy/README.md); with ``--compose`` the broker's files are where its container sees them
(``--broker-config-dir`` ``/mosquitto/config`` and ``--persistence-dir`` ``/mosquitto/data`` by
default).
"""

from __future__ import annotations

import argparse
import os
import shlex
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from fedsim.errors import ConfigError
from fedsim.runtime.deployed.options import add_allow_factory_option, add_set_option

BROKER_IMAGE = "eclipse-mosquitto:2.0.18"
BROKER_UID = 1883  # the mosquitto user of the eclipse-mosquitto image
FEDSIM_IMAGE = "fedsim:latest"
FEDSIM_UID = 10001  # the fedsim user of the Dockerfile (ARG FEDSIM_UID)
CONTAINER_SECRETS = "/run/secrets/fedsim"
CONTAINER_CA = "/run/secrets/fedsim-ca"
CONTAINER_STATE = "/state"
CONTAINER_RUNS = "/runs"
BROKER_CONFIG_DIR = "/mosquitto/config"  # where the compose file's broker mounts --out
BROKER_DATA_DIR = "/mosquitto/data"  # its broker-data volume
COMPOSE_WAIT_FOR_CLIENTS = 600.0


DESCRIPTION = (
    "Generate the broker's passwords, access control list and configuration for a run, and with "
    "--compose a docker-compose file."
)


def register(subparsers: Any) -> argparse.ArgumentParser:
    parser = subparsers.add_parser(
        "deploy",
        help="Generate the broker's passwords, access control and configuration for a scenario.",
        description=DESCRIPTION,
    )
    parser.add_argument("scenario", nargs="?", metavar="SCENARIO", help="The scenario YAML file.")
    parser.add_argument(
        "--client-id",
        dest="client_ids",
        action="append",
        default=[],
        metavar="ID",
        help="A client id, instead of the scenario's clients; repeatable.",
    )
    parser.add_argument(
        "--run", metavar="NAME", help="The run's name in the MQTT topics (by default the scenario name)."
    )
    parser.add_argument("--out", default="deploy/generated", metavar="DIR",
                        help="The output directory (default deploy/generated).")
    parser.add_argument(
        "--aggregators", type=int, metavar="K",
        help="Credentials, ACL roles (and with --compose services) for K aggregation nodes (the "
        "same as --set aggregators.count=K; by default the scenario's aggregators.count).",
    )
    parser.add_argument(
        "--port", type=int, help="The broker's port (by default 8883 with TLS, 1883 with --plain)."
    )
    parser.add_argument(
        "--bind", default="0.0.0.0", metavar="ADDRESS", help="The broker's listen address (default 0.0.0.0)."
    )
    parser.add_argument(
        "--broker-config-dir",
        metavar="DIR",
        help="Where the broker sees the --out directory (by default its absolute "
        "path; with --compose /mosquitto/config, where the eclipse-mosquitto container "
        "mounts it).",
    )
    parser.add_argument(
        "--persistence-dir",
        metavar="DIR",
        help="The broker's persistence directory, for example /mosquitto/data/ (a path on "
        "this machine, without --broker-config-dir, is created for the broker's user); by "
        "default none (with --compose /mosquitto/data, the broker-data volume).",
    )
    parser.add_argument(
        "--max-packet-bytes",
        type=int,
        metavar="N",
        help="The broker's packet size limit in bytes (by default sized from the scenario's "
        "model: its update plus a header allowance; without a scenario, mosquitto's own).",
    )
    parser.add_argument(
        "--tls-cert", metavar="FILE", help="The broker's TLS certificate (its path as the broker sees it)."
    )
    parser.add_argument("--tls-key", metavar="FILE", help="The broker's TLS private key.")
    parser.add_argument(
        "--tls-ca", metavar="FILE", help="A CA file to verify client certificates with (optional)."
    )
    parser.add_argument(
        "--tls-host",
        dest="tls_hosts",
        action="append",
        default=[],
        metavar="NAME",
        help="A host name or IP address in the generated broker certificate; repeatable (by "
        "default broker, localhost and 127.0.0.1).",
    )
    parser.add_argument(
        "--plain",
        action="store_true",
        help="An unencrypted listener: passwords and updates travel in clear, so only on "
        "trusted networks.",
    )
    parser.add_argument(
        "--pbkdf2-iterations", type=int, default=None, metavar="N",
        help="PBKDF2 rounds of the broker's password file (default 1,000: the passwords are "
        "192-bit random, so more rounds only cost the broker CPU at every login, a wrong one "
        "included).",
    )
    parser.add_argument(
        "--broker-user", metavar="NAME", help="The user mosquitto runs as (the user option of mosquitto.conf)."
    )
    parser.add_argument(
        "--compose",
        metavar="FILE",
        help="Also write a docker-compose file for the scenario (needs SCENARIO).",
    )
    parser.add_argument(
        "--time-scale",
        type=float,
        default=1.0,
        metavar="X",
        help="The time scale of the composed server and clients (default 1.0).",
    )
    add_set_option(parser)
    add_allow_factory_option(parser)
    parser.set_defaults(func=run)
    return parser


def _client_ids_and_run(
        args: argparse.Namespace) -> tuple[list[str], str, tuple[int, int] | None, int]:
    """The client ids, the run name, the largest message of the run and the broker's
    ``max_queued_bytes`` (None: not known), and the number of aggregators (``--aggregators``,
    else the scenario's ``aggregators.count``)."""
    if args.scenario and args.client_ids:
        raise ConfigError("give a SCENARIO or --client-id, not both")
    if args.aggregators is not None and args.aggregators < 0:
        raise ConfigError(f"--aggregators must be >= 0, got {args.aggregators}")
    if args.client_ids:
        if not args.run:
            raise ConfigError("--client-id needs --run (there is no scenario to name the run)")
        return list(args.client_ids), args.run, None, args.aggregators or 0
    if args.aggregators is not None:  # one spelling of the count: the scenario's
        args.overrides = [*args.overrides, f"aggregators.count={args.aggregators}"]
    if not args.scenario:
        raise ConfigError("give a SCENARIO file (or --client-id ... --run NAME)")
    from fedsim.config import load_scenario
    from fedsim.config.factories import require_allowed
    from fedsim.runtime.deployed.deployment import broker_queue_bytes, largest_message
    from fedsim.runtime.deployed.guarantees import require_public_slots
    from fedsim.runtime.population import build_population, client_ids

    # Sizing the broker's limits builds the model: a factory runs only with the opt-in.
    loaded = load_scenario(args.scenario, args.overrides, allow_factories=args.allow_factories)
    scenario = loaded.scenario
    require_allowed(scenario, loaded.allow_factories)  # also what the composed processes run
    require_public_slots(scenario)
    ids = client_ids(scenario)
    sizes = None
    if args.max_packet_bytes is None:  # sized from the model, as the processes size theirs
        size = int(build_population(loaded).initial_params.size)
        sizes = largest_message(scenario, size), broker_queue_bytes(scenario, size, len(ids))
    return ids, args.run or scenario.name, sizes, scenario.aggregators.count


def _listener_tls(args: argparse.Namespace) -> tuple[Any, str | None, dict[str, Any]]:
    """The listener's TLS settings, the CA file processes trust (None: their own choice) and
    the files to write for them (a fresh CA and broker certificate; written by the caller
    once everything else is ready, so a refused or interrupted deploy keeps the old ones)."""
    from fedsim.transports.certificates import (
        BROKER_CERT,
        BROKER_KEY,
        CA_CERT,
        DEFAULT_TLS_HOSTS,
        tls_file_contents,
    )
    from fedsim.transports.security import ListenerTls

    if bool(args.tls_cert) != bool(args.tls_key):
        raise ConfigError("--tls-cert and --tls-key go together")
    if args.plain:
        if args.tls_cert or args.tls_hosts:
            raise ConfigError("--plain and the --tls-* options exclude each other")
        return None, None, {}
    if args.tls_cert:
        return ListenerTls(certfile=args.tls_cert, keyfile=args.tls_key, cafile=args.tls_ca), None, {}
    contents = tls_file_contents(args.tls_hosts or DEFAULT_TLS_HOSTS)
    seen_as = (args.broker_config_dir or str(Path(args.out).resolve())).rstrip("/")
    listener = ListenerTls(
        certfile=f"{seen_as}/{BROKER_CERT}", keyfile=f"{seen_as}/{BROKER_KEY}",
        cafile=args.tls_ca,
    )
    return listener, str(Path(args.out) / CA_CERT), contents


def run(args: argparse.Namespace) -> int:
    from tqdm import tqdm

    from fedsim.atomic import replace_together
    from fedsim.transports.security import (
        AGGREGATOR_USER_PREFIX,
        PBKDF2_ITERATIONS,
        SERVER_USERNAME,
        PasswordHashing,
        check_iterations,
        packet_limit,
        write_broker_files,
    )

    if args.port is None:
        args.port = 1883 if args.plain else 8883
    if not 0 < args.port < 65536:
        raise ConfigError(f"--port {args.port} is not a TCP port")
    if args.max_packet_bytes is not None and args.max_packet_bytes <= 0:
        raise ConfigError("--max-packet-bytes must be positive")
    iterations = check_iterations(
        PBKDF2_ITERATIONS if args.pbkdf2_iterations is None else args.pbkdf2_iterations,
        "--pbkdf2-iterations")
    from fedsim.transports.topics import aggregator_ids

    ids, run_name, sizes, count = _client_ids_and_run(args)
    aggregators = aggregator_ids(count)
    max_packet_bytes = args.max_packet_bytes
    max_queued_bytes = None
    if sizes is not None:
        # Every packet fits one message of the run; a session's queue at most the server's
        # bounded backlog of them (queue_limit) and the partials it holds (broker_queue_bytes).
        max_packet_bytes, max_queued_bytes = packet_limit(sizes[0]), sizes[1]
    if args.compose and not args.scenario:
        raise ConfigError("--compose needs a SCENARIO")
    if args.compose:
        # The composed broker reads --out at BROKER_CONFIG_DIR: this machine's paths in its
        # mosquitto.conf left a broker that could not open its password file (a stranger's
        # `fedsim deploy S --compose F`, as this module's docstring had it).
        args.broker_config_dir = args.broker_config_dir or BROKER_CONFIG_DIR
        args.persistence_dir = args.persistence_dir or BROKER_DATA_DIR
    # Checked before anything is written: the containers must find the scenario in the image.
    image = image_scenario_path(Path(args.scenario)) if args.compose else None
    tls, ca_file, tls_files = _listener_tls(args)
    persistence_dir = args.persistence_dir
    if persistence_dir is not None and args.broker_config_dir is None:
        # Host paths (no --broker-config-dir): the directory is made here, for the broker.
        persistence_dir = str(prepare_persistence_dir(Path(persistence_dir)))
    # A stranger ran deploy again into the same --out and was not told that every password
    # and the CA were new: the broker and the processes given the first files could no
    # longer meet. (Replacing them stays allowed: it is how credentials are rotated.)
    replaced = (Path(args.out) / "secrets.json").exists()
    # A bar on a terminal only (disable=None): hashing takes minutes from about 10^5 clients.
    with tqdm(total=1 + len(ids) + len(aggregators), desc="hashing passwords",
              unit="password", disable=None, leave=False) as bar:
        files = write_broker_files(
            Path(args.out),
            run_name,
            ids,
            port=args.port,
            bind_address=args.bind,
            broker_config_dir=args.broker_config_dir,
            persistence_dir=persistence_dir,
            max_packet_bytes=max_packet_bytes,
            max_queued_bytes=max_queued_bytes,
            tls=tls,
            run_as_user=args.broker_user,
            aggregators=aggregators,
            hashing=PasswordHashing(iterations, on_hashed=bar.update),
            per_process=True,
        )
    if tls_files:  # the broker files are in place: its certificates follow them at once
        replace_together({Path(args.out) / name: content for name, content in tls_files.items()},
                         durability="file")
    scheme = "mqtt" if tls is None else "mqtts"
    # The processes must run the scenario these files were made for: its --set lines (and
    # --aggregators' count) too (a stranger's printed commands left them out, and no
    # aggregator's command was printed).
    trust = f" --tls-ca {ca_file}" if ca_file else ""
    trust += "".join(f" --set {shlex.quote(override)}" for override in args.overrides)
    print(
        f"run {run_name!r}: {len(ids)} clients + server"
        + (f" + {len(aggregators)} aggregators" if aggregators else "") + "\n"
        f"  {files.config}\n  {files.password_file}\n  {files.acl_file}\n"
        f"  {files.secrets_file}  (mode 0600: every process's clear-text password, keep it "
        "private)\n"
        f"  {files.process_secrets_dir}/  (one file a process, mode 0600, its own password "
        "alone: give each process only its own)\n"
        + (f"  {ca_file}  (the run's CA: processes trust only it)\n" if ca_file else "")
        + ("  WARNING: --plain: passwords and updates travel unencrypted\n" if tls is None else "")
        + (f"  REPLACED: {args.out} held a deployment's credentials; every password"
           + (" and the CA are" if tls_files else " is") + " new: restart the broker with "
           "these files and give every process its new secrets file"
           + (" and ca.crt" if tls_files else "") + "\n" if replaced else "")
        + (f"  packets limited to {max_packet_bytes:,} bytes (max_packet_size)\n"
           if max_packet_bytes is not None else
           "  WARNING: no packet size limit (give --max-packet-bytes or a SCENARIO)\n")
        + (f"broker:  mosquitto -c {files.config}  (as the owner of passwd and acl, which "
           "only their owner may read; started as root, mosquitto first switches to the user "
           "mosquitto: chown mosquitto the files, or start it as their owner)\n"
           if args.broker_config_dir is None else
           # its paths are the broker's own (the container's): no command here runs it
           f"broker:  reads {files.config} at {args.broker_config_dir}/mosquitto.conf (the "
           "paths in it are the broker's; with --compose, the compose file's broker service, "
           "whose header says which files to chown)\n")
        + f"server:  fedsim server --scenario SCENARIO --broker {scheme}://HOST:{args.port} "
        f"--secrets {files.process_secrets_file(SERVER_USERNAME)}{trust} --state STATE/server "
        "--out RUN_DIR "
        f"--wait-for-clients {COMPOSE_WAIT_FOR_CLIENTS:g}  (waits for every client before "
        "its first window)\n"
        f"client:  fedsim client --scenario SCENARIO --client-id ID --broker "
        f"{scheme}://HOST:{args.port} --secrets {files.process_secrets_file('ID')}{trust} "
        "--state STATE/ID  "
        "(each client's own state directory: its ledger and unacknowledged updates)"
        + (f"\naggregator:  fedsim aggregator --scenario SCENARIO --aggregator-id ID --broker "
           f"{scheme}://HOST:{args.port} --secrets "
           f"{files.process_secrets_file(f'{AGGREGATOR_USER_PREFIX}ID')}{trust} "
           f"--state STATE/ID  (ID: {', '.join(aggregators)})" if aggregators else ""),
        file=sys.stdout,
    )
    if args.compose:
        assert image is not None
        compose, (root, scenario) = Path(args.compose), image
        generated = os.path.relpath(Path(args.out).resolve(), compose.resolve().parent)
        compose.write_text(
            compose_text(
                scenario,
                run_name,
                ids,
                build_context=os.path.relpath(root, compose.resolve().parent),
                generated_dir=generated,
                port=args.port,
                time_scale=args.time_scale,
                overrides=args.overrides,
                tls_ca=ca_file is not None,
                allow_factories=args.allow_factories,
                aggregators=aggregators,
            )
        )
        print(f"compose: {compose} ({len(ids)} client services"
              + (f", {len(aggregators)} aggregator services)" if aggregators else ")"))
    return 0


def prepare_persistence_dir(path: Path, broker_user: str = "mosquitto") -> Path:
    """Create the broker's persistence directory (mode 0700) owned by the user the broker
    writes as, and return its absolute path.

    mosquitto started as root switches to ``broker_user`` (its uid from the user database,
    else :data:`BROKER_UID`, the eclipse-mosquitto image's, for a directory later mounted into
    that container), so as root the directory is given to that user. Started by anyone else,
    mosquitto runs as that user: the directory stays the caller's. Paths the broker sees in a
    container (``--broker-config-dir`` given) are not made here; ``docker-compose.yml`` keeps
    them in a named volume, owned by the image's mosquitto user.
    """
    import pwd

    path = path.expanduser().resolve()
    try:
        path.mkdir(parents=True, exist_ok=True)
        path.chmod(0o700)
        if os.geteuid() == 0:
            try:
                entry = pwd.getpwnam(broker_user)
                uid, gid = entry.pw_uid, entry.pw_gid
            except KeyError:
                uid = gid = BROKER_UID
            os.chown(path, uid, gid)
    except OSError as exc:
        raise ConfigError(f"--persistence-dir {path}: cannot prepare it ({exc.strerror})") from None
    return path


def image_scenario_path(scenario: Path) -> tuple[Path, str]:
    """The fedsim clone the image is built from (the folder with the Dockerfile above
    ``scenario``) and the scenario's path inside the image (relative to its WORKDIR).

    The image holds the clone's ``scenarios/`` folder and nothing else of the host, so a
    scenario elsewhere cannot be found by the containers: that is an error saying so."""
    resolved = scenario.resolve()
    for root in resolved.parents:
        if (root / "Dockerfile").is_file() and (root / "pyproject.toml").is_file():
            inside = resolved.relative_to(root)
            if inside.parts[0] != "scenarios":
                break
            return root, inside.as_posix()
    raise ConfigError(
        f"--compose: {scenario} is not in the scenarios/ folder of a fedsim clone; the image is "
        "built from a clone and holds only its scenarios/ folder, so copy the scenario (and "
        "any data files beside it) into <clone>/scenarios/ and give that path")


def compose_text(
    scenario: str,
    run: str,
    client_ids: Sequence[str],
    *,
    build_context: str = ".",
    generated_dir: str = "deploy/generated",
    port: int = 1883,
    time_scale: float = 1.0,
    overrides: Sequence[str] = (),
    tls_ca: bool = False,
    allow_factories: bool = False,
    aggregators: Sequence[str] = (),
) -> str:
    """A docker-compose file: broker, server, one service per client and one per aggregation
    node (``aggregators``: their ids; ``overrides`` must set the scenario's
    ``aggregators.count`` to their number), as YAML text.

    ``scenario`` is its path inside the image (:func:`image_scenario_path`); ``build_context``
    (the clone the image is built from) and ``generated_dir`` are relative to the compose
    file, which is usually the clone's root (``docker-compose.yml``). Nothing of the host is
    mounted but the broker's generated configuration: data sets come from the image's own
    cache (fetched when the image is built), state, runs and broker persistence live in named
    volumes. Every container runs as a non-root user (fedsim's :data:`FEDSIM_UID`, mosquitto's
    :data:`BROKER_UID`); the volumes start out owned by it because the image holds their mount
    points with that owner. Each container gets its own process's credentials and no one
    else's: its per-process secrets file (``secrets/<username>.json``, from ``fedsim deploy``)
    as the compose secret ``credentials-<username>``, at :data:`CONTAINER_SECRETS`. Compose
    bind-mounts a file secret as it is, with the host file's owner and mode (0600: its
    ``uid``/``gid``/``mode`` are ignored, as they are honoured only for a secret it copies in
    from a variable, which would take one variable a process), so the header tells the user
    to give those files to the containers' user (``chown`` :data:`FEDSIM_UID`), as it tells
    them to give the broker's to :data:`BROKER_UID`.

    ``tls_ca``: the broker listens with the certificate ``fedsim deploy`` made; every process
    connects with ``mqtts://broker:PORT`` and trusts the run's ``ca.crt``, the compose secret
    ``fedsim-ca`` (a public certificate: a file secret, bind-mounted as it is, mode 0644).
    ``allow_factories``: the services run the scenario's factories (``--allow-factory``).
    """
    import yaml

    from fedsim.runtime.deployed.options import DeploymentOptions
    from fedsim.runtime.deployed.process_commands import process_commands
    from fedsim.transports.security import (
        PROCESS_SECRETS_DIR,
        SERVER_USERNAME,
        aggregator_username,
        process_secrets_name,
    )

    # The command lines `fedsim launch` runs, with container paths: each service mounts its
    # own state volume at CONTAINER_STATE and keeps its state in CONTAINER_STATE/<name>.
    commands = process_commands(
        scenario,
        client_ids,
        options=DeploymentOptions(
            broker=f"{'mqtts' if tls_ca else 'mqtt'}://broker:{port}",
            run=run,
            secrets_file=CONTAINER_SECRETS,
            time_scale=time_scale,
            wait_for_clients=COMPOSE_WAIT_FOR_CLIENTS,
            json_logs=True,
            tls_ca=CONTAINER_CA if tls_ca else None,
            allow_factories=allow_factories,
        ),
        state_root=CONTAINER_STATE,
        out=f"{CONTAINER_RUNS}/{run}",
        overrides=overrides,
        aggregators=aggregators,
    )
    # Each process's username: its per-process secrets file, and the one compose secret its
    # container gets.
    usernames = {"server": SERVER_USERNAME, **{c: c for c in client_ids},
                 **{a: aggregator_username(a) for a in aggregators}}
    declared: dict[str, Any] = {
        f"credentials-{user}": {"file": f"./{generated_dir}/{process_secrets_name(user)}"}
        for user in usernames.values()}

    def fedsim_service(name: str, *volumes: str) -> dict[str, Any]:
        # Fresh objects per service: shared ones would become YAML anchors.
        secrets = [{"source": f"credentials-{usernames[name]}", "target": CONTAINER_SECRETS}]
        if tls_ca:
            secrets.append({"source": "fedsim-ca", "target": CONTAINER_CA})
        return {
            "image": FEDSIM_IMAGE,
            "build": build_context,
            "user": f"{FEDSIM_UID}:{FEDSIM_UID}",
            "depends_on": ["broker"],
            "secrets": secrets,
            "restart": "on-failure",
            "command": commands[name],
            "volumes": [f"state-{name}:{CONTAINER_STATE}", *volumes],
        }

    services: dict[str, Any] = {
        "broker": {
            "image": BROKER_IMAGE,
            "user": f"{BROKER_UID}:{BROKER_UID}",
            "command": ["mosquitto", "-c", f"{BROKER_CONFIG_DIR}/mosquitto.conf"],
            "volumes": [f"./{generated_dir}:{BROKER_CONFIG_DIR}:ro",
                        f"broker-data:{BROKER_DATA_DIR}"],
            "restart": "unless-stopped",
        },
        "server": fedsim_service("server", f"runs:{CONTAINER_RUNS}"),
    }
    volumes: dict[str, None] = {"broker-data": None, "runs": None, "state-server": None}
    for name in [*client_ids, *aggregators]:
        services[name] = fedsim_service(name)
        volumes[f"state-{name}"] = None
    document: dict[str, Any] = {
        "name": f"fedsim-{run}",
        "services": services,
        "volumes": volumes,
        "secrets": declared,
    }
    if tls_ca:
        declared["fedsim-ca"] = {"file": f"./{generated_dir}/ca.crt"}
    private = ["passwd", "acl", *(["broker.key"] if tls_ca else [])]
    settings = "".join(f" --set {override}" for override in overrides)  # e.g. aggregators
    header = (
        f"# Generated by `fedsim deploy {scenario}{settings} --compose ...` for run {run!r}.\n"
        f"# First: fedsim deploy {scenario}{settings} --out {generated_dir} "
        f"--broker-config-dir {BROKER_CONFIG_DIR} --persistence-dir {BROKER_DATA_DIR}\n"
        # passwd, acl (and broker.key) are mode 0600: the broker's user must own them.
        f"# Then:  sudo chown {BROKER_UID}:{BROKER_UID} "
        + " ".join(f"{generated_dir}/{name}" for name in private)
        + "\n"
        # Each container's own credentials file is bind-mounted as it is (mode 0600): its
        # user must own it.
        f"#        sudo chown {FEDSIM_UID}:{FEDSIM_UID} {generated_dir}/{PROCESS_SECRETS_DIR}/*.json\n"
        "#        docker compose build && docker compose up\n"
        f"# Results: docker compose cp server:{CONTAINER_RUNS}/{run} ./runs/ && fedsim report "
        f"./runs/{run}\n#          (the server's view; each client's ledger stays in its state "
        "volume)\n"
    )
    return header + yaml.safe_dump(document, sort_keys=False, default_flow_style=None, width=100)
