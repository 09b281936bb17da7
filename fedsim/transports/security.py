"""Broker credentials and access control for one run: passwords, mosquitto files, secrets.

Access policy (enforced by the broker's ACL, and again by the server endpoint, which checks
that the client id inside a payload is the one in its topic):

* a client may publish only to ``updates/<its id>``, ``status/<its id>`` and ``hello/<its
  id>``, and read only ``global`` and ``acks/<its id>``;
* the server reads ``updates/+``, ``status/+``, ``hello/+`` and ``partials/+`` and writes
  ``global``, ``acks/+``, ``close`` and ``receipts/+``;
* aggregation node ``k`` (user ``fedsim-aggregator-k``, with ``aggregators``) reads
  ``updates/<client>`` of exactly the clients routed to it
  (:func:`~fedsim.transports.topics.aggregator_of`), ``global``, ``close`` and
  ``receipts/aggregator-k``, and writes ``partials/aggregator-k`` and ``acks/aggregator-k/+``
  (it passes on the server's receipts; a client reads ``acks/<its aggregator>/<its id>`` only,
  so what it writes there for another aggregator's client reaches nobody); no client may write
  any ``partials``, ``receipts`` or ``acks`` topic or read ``close``;
* anonymous connections are refused (``allow_anonymous false``);
* a connection's MQTT client id is its username (``use_username_as_clientid true``), so nobody
  can take over another's session (connecting with the server's client id used to kick the
  server off and destroy its queued messages).

Passwords are random (``secrets.token_urlsafe``, 192 bits), stored in clear only in the secrets
files (mode 0600) that processes read their own credentials from: ``secrets.json`` holds
everyone's (for ``fedsim launch``, whose processes run on one machine as one user), and the
folder :data:`PROCESS_SECRETS_DIR` beside it one file per process holding that process's
credentials alone (:meth:`RunSecrets.per_process`), so a process given only its own file
(a container, another machine) can log in as nobody else. The broker gets a mosquitto 2
password file in its PBKDF2-SHA512 format (``user:$7$<iterations>$<salt b64>$<hash b64>``,
the format ``mosquitto_passwd`` writes), computed here with :func:`hashlib.pbkdf2_hmac` so no
mosquitto tools are needed; it and the ACL are written with mode 0600 (the broker must run as
their owner: ``chown 1883:1883`` them for the eclipse-mosquitto container).

**What the broker may drop.** QoS 1 messages queued for a disconnected persistent session (the
server's, while it restarts or falls behind) beyond ``max_queued_messages`` or
``max_queued_bytes`` are dropped silently by mosquitto; so is everything in memory when a broker
without persistence restarts, and the retained model with it. :func:`queue_limit` bounds the
server's backlog (:data:`SERVER_BACKLOG`: a longer queue only makes every update in it stale);
clients resend what the server never acknowledged, and the server's ``dropped_in_flight``
column counts what was released but never arrived.
"""

from __future__ import annotations

import base64
import hashlib
import json
import math
import os
import secrets
import stat
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

from fedsim.atomic import replace_together, write_atomically
from fedsim.errors import CodecError, ConfigError
from fedsim.json_input import parse_json
from fedsim.protocol.codec import check_client_id
from fedsim.transports.topics import Topics, aggregator_of

SERVER_USERNAME = "fedsim-server"
AGGREGATOR_USER_PREFIX = "fedsim-"
"""An aggregator's username is its id with this prefix (``fedsim-aggregator-0``)."""
OBSERVER_USERNAME = "fedsim-observer"
"""An optional read-only user (updates and statuses), for audits and tests; off by default."""
PBKDF2_ITERATIONS = 1_000
"""The PBKDF2-HMAC-SHA512 rounds of the broker's password file (mosquitto's ``$7$`` format;
``mosquitto_passwd`` itself writes 101). Stretching protects guessable passwords; these are
192-bit random secrets (:func:`generate_secrets`), which no count makes more or less
guessable. What the count does set is the broker's CPU for every login, a wrong password for a
known username included (usernames are client ids, which topics name): measured with
``benchmarks/login_cost.py``, 84-104 ms a wrong-password CONNECT at OWASP's 210,000 (the earlier
default: about ten such CONNECTs a second, from anyone who reaches the listener, took a whole
broker core) and 0.5 ms at 1,000; hashing a run's file took 0.17 s a client at 210,000
(10^5 clients: 4.7 hours), 0.5 ms at 1,000. ``fedsim deploy --pbkdf2-iterations`` sets
another count."""
MAX_PBKDF2_ITERATIONS = 10_000_000
"""The most rounds a password file may ask for: at 0.5 us a round, 5 s of the broker's CPU a
login (above it a login would be a denial of service of its own; OpenSSL itself refuses
2^31)."""
PARALLEL_HASHING_FROM = 64
"""From this many users the password file is hashed on a thread per CPU
(:func:`hashlib.pbkdf2_hmac` releases the GIL)."""
HASHING_CHUNK = 256
"""At most this many users hashed by one task of the thread pool."""
_SALT_BYTES = 12
DEFAULT_QUEUED_BYTES = 1 << 30
"""``max_queued_bytes`` when nothing sizes it from the model (``fedsim deploy`` does)."""


@dataclass(frozen=True)
class Credentials:
    username: str
    password: str


PROCESS_SECRETS_DIR = "secrets"
"""The folder, beside ``secrets.json``, of the per-process secrets files: one a process, named
by its username (:func:`process_secrets_name`), holding its credentials alone."""


def aggregator_username(aggregator_id: str) -> str:
    """The broker username of aggregation node ``aggregator_id`` (``fedsim-aggregator-0``)."""
    return AGGREGATOR_USER_PREFIX + aggregator_id


def process_secrets_name(username: str) -> str:
    """The per-process secrets file of the process that logs in as ``username``, relative to
    the folder of ``secrets.json`` (``secrets/fedsim-server.json``, ``secrets/<client
    id>.json``, ``secrets/fedsim-aggregator-0.json``). Usernames are unique (the broker's
    password file needs them so), and client and aggregator ids match
    :data:`~fedsim.protocol.headers.CLIENT_ID_PATTERN` (:func:`generate_secrets` checks them):
    no ``/``, no leading dot, so a name cannot leave the folder."""
    return f"{PROCESS_SECRETS_DIR}/{username}.json"


@dataclass(frozen=True)
class RunSecrets:
    """The credentials of one run: everyone's (``secrets.json``), or one process's alone (its
    per-process file: the others are absent, ``server`` None unless it is the server's).
    ``clients`` maps client id -> credentials."""

    run: str
    server: Credentials | None
    clients: dict[str, Credentials]
    aggregators: dict[str, Credentials] = field(default_factory=dict)
    """Aggregator id -> credentials (none without aggregation nodes)."""
    source: Path | None = field(default=None, compare=False)
    """The file they were read from (:func:`load_secrets`), named in errors."""

    def for_server(self) -> Credentials:
        if self.server is None:
            raise self._missing("the server")
        return self.server

    def for_aggregator(self, aggregator_id: str) -> Credentials:
        try:
            return self.aggregators[aggregator_id]
        except KeyError:
            raise self._missing(f"aggregator {aggregator_id!r}") from None

    def for_client(self, client_id: str) -> Credentials:
        try:
            return self.clients[client_id]
        except KeyError:
            raise self._missing(f"client {client_id!r}") from None

    def holders(self) -> list[str]:
        """Whose credentials these are (``server``, ``client ID``, ``aggregator ID``)."""
        return ((["the server"] if self.server is not None else [])
                + [f"client {c!r}" for c in self.clients]
                + [f"aggregator {a!r}" for a in self.aggregators])

    def _missing(self, whose: str) -> ConfigError:
        where = f"secrets file {self.source}" if self.source is not None else "the secrets"
        message = f"{where} of run {self.run!r} holds no credentials for {whose}"
        holders = self.holders()
        if len(holders) == 1:  # a per-process file: another process's, or given to the wrong one
            message += (f": it is {holders[0]}'s own file, and a process can log in only with "
                        f"its own ({PROCESS_SECRETS_DIR}/<its username>.json, or secrets.json)")
        elif whose.startswith("aggregator"):
            message += " (fedsim deploy writes them for the scenario's aggregators.count)"
        return ConfigError(message)

    def per_process(self) -> dict[str, RunSecrets]:
        """One :class:`RunSecrets` a process, holding its credentials alone, by the name of
        its per-process file (:func:`process_secrets_name`). Usernames that differ only in
        case are refused: on a case-insensitive file system (macOS, Windows) their files
        would be one, and one process would get another's credentials."""
        run, server = self.run, self.for_server()
        alone = [(server.username, RunSecrets(run, server, {}))]
        alone += [(creds.username, RunSecrets(run, None, {c: creds}))
                  for c, creds in self.clients.items()]
        alone += [(creds.username, RunSecrets(run, None, {}, {a: creds}))
                  for a, creds in self.aggregators.items()]
        folded = Counter(username.casefold() for username, _ in alone)
        clashing = sorted(u for u, _ in alone if folded[u.casefold()] > 1)
        if clashing:
            raise ConfigError(f"usernames that are one file name on a case-insensitive file "
                              f"system cannot each have a secrets file: {clashing[:6]}")
        return {process_secrets_name(username): one for username, one in alone}


def generate_secrets(run: str, client_ids: Iterable[str],
                     aggregators: Sequence[str] = ()) -> RunSecrets:
    """Fresh random credentials; each client's username is its id (ids are unique), each
    aggregator's its id with :data:`AGGREGATOR_USER_PREFIX` (:func:`aggregator_username`).
    Client and aggregator ids must match :data:`~fedsim.protocol.headers.CLIENT_ID_PATTERN`:
    they name topics, ACL users and per-process secrets files."""
    Topics(run)  # validates the run name
    ids = list(client_ids)
    for client_id in [*ids, *aggregators]:
        try:
            check_client_id(client_id)
        except CodecError as exc:
            raise ConfigError(str(exc)) from None
    repeated = sorted(c for c, n in Counter(ids).items() if n > 1)
    if repeated:
        raise ConfigError(f"client ids must be unique, repeated: {repeated}")
    for reserved in (SERVER_USERNAME, OBSERVER_USERNAME):
        if reserved in ids:
            raise ConfigError(f"{reserved!r} is reserved for the server and its observer")
    taken = sorted(c for c in ids if c.startswith(AGGREGATOR_USER_PREFIX))
    if aggregators and taken:
        raise ConfigError(f"client ids starting with {AGGREGATOR_USER_PREFIX!r} are reserved "
                          f"for aggregators: {taken[:5]}")
    return RunSecrets(
        run=run,
        server=Credentials(SERVER_USERNAME, secrets.token_urlsafe(24)),
        clients={c: Credentials(c, secrets.token_urlsafe(24)) for c in ids},
        aggregators={a: Credentials(aggregator_username(a), secrets.token_urlsafe(24))
                     for a in aggregators},
    )


def mosquitto_password_hash(
    password: str, *, iterations: int = PBKDF2_ITERATIONS, salt: bytes | None = None
) -> str:
    """The ``$7$`` (PBKDF2-HMAC-SHA512, 64-byte key) hash mosquitto 2 verifies passwords with."""
    salt = secrets.token_bytes(_SALT_BYTES) if salt is None else salt
    digest = hashlib.pbkdf2_hmac("sha512", password.encode(), salt, iterations)
    b64 = base64.b64encode
    return f"$7${iterations}${b64(salt).decode()}${b64(digest).decode()}"


SERVER_BACKLOG = 1000
"""The updates the broker queues for the server beyond those in flight, whatever the number
of clients (docs/DEPLOYMENT.md, "Overload"). The queue is first in, first out: a backlog of
``B`` updates makes every update wait ``B / rate`` seconds at the server's ingest rate, and an
update that waited longer than the staleness horizon is refused as stale however much it cost.
Sized for every client's whole outbox (26,000 for 100 clients), the queue filled when 100
clients offered 3,000 updates/s without waiting for receipts, and the applied rate fell from
1,573 to 15 updates/s within 40 s; bounded to about what a loopback server judges in a second,
the applied rate held at the server's capacity and the broker dropped the excess at its door
(``benchmarks/deployed_soak.py --overload``)."""


def queue_limit(num_clients: int) -> int:
    """``max_queued_messages`` for a run: :data:`SERVER_BACKLOG`, or four messages a client
    (statuses) if more. What it drops costs time, not updates (unless a resend comes more than
    ``max_staleness`` versions late, when it is given up): the clients resend what the
    server never acknowledged, and the server counts what never arrived (``dropped_in_flight``)."""
    return max(SERVER_BACKLOG, 4 * num_clients)


MQTT_PACKET_SLACK = 1024
"""Bytes an MQTT PUBLISH adds around its payload: the fixed header (at most 5), the topic (2 +
at most 150 for fedsim's ``fedsim/<run>/<kind>/<client>``) and the packet id (2)."""


def packet_limit(message_bytes: int) -> int:
    """The broker's ``max_packet_size`` for fedsim messages of at most ``message_bytes``: a
    larger packet is refused by the broker, which disconnects its sender, before anyone reads
    it (issue 25, finding 2: fifteen 60 MiB messages froze a server whose limit was 64 MiB)."""
    return message_bytes + MQTT_PACKET_SLACK


@dataclass(frozen=True)
class PasswordHashing:
    """How the broker's password file is hashed: ``iterations`` PBKDF2 rounds
    (:data:`PBKDF2_ITERATIONS`), and ``on_hashed(n)`` told of every ``n`` passwords done."""

    iterations: int = PBKDF2_ITERATIONS
    on_hashed: Callable[[int], None] | None = None


def check_iterations(iterations: int, what: str = "PBKDF2 iterations") -> int:
    """``iterations`` if it is a count a password file may use
    (1..:data:`MAX_PBKDF2_ITERATIONS`), else a ConfigError naming ``what``."""
    if isinstance(iterations, bool) or not isinstance(iterations, int) or \
            not 1 <= iterations <= MAX_PBKDF2_ITERATIONS:
        raise ConfigError(f"{what} must be between 1 and {MAX_PBKDF2_ITERATIONS:,}, "
                          f"got {iterations}")
    return iterations


def password_file_text(
    run_secrets: RunSecrets,
    *,
    hashing: PasswordHashing = PasswordHashing(),
    extra: Sequence[Credentials] = (),
) -> str:
    """mosquitto's password file for the run's users (one ``user:$7$...`` line each, in the
    order server, clients, aggregators, ``extra``), at ``hashing.iterations`` rounds.
    ``hashing.on_hashed(n)`` is told, in the calling thread, each time ``n`` more passwords
    are hashed (a progress bar: a run's file is the
    work of minutes at 10^6 clients). From :data:`PARALLEL_HASHING_FROM` users the hashing
    runs on a thread per CPU this process may use, in chunks of at most :data:`HASHING_CHUNK`
    users, four or more a thread (a future per user would hold 2 KB each, about 2 GB at 10^6)."""
    iterations, on_hashed = check_iterations(hashing.iterations), hashing.on_hashed
    users = [run_secrets.for_server(), *run_secrets.clients.values(),
             *run_secrets.aggregators.values(), *extra]

    def lines(chunk: Sequence[Credentials]) -> str:
        return "".join(f"{u.username}:{mosquitto_password_hash(u.password, iterations=iterations)}\n"
                       for u in chunk)

    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    # Chunks of at most HASHING_CHUNK, and at least four a thread: every CPU busy to the end.
    size = len(users) if len(users) < PARALLEL_HASHING_FROM else \
        max(1, min(HASHING_CHUNK, math.ceil(len(users) / (4 * cpus))))
    chunks = [users[k:k + size] for k in range(0, len(users), size)]
    workers = min(len(chunks), cpus)
    parts: list[str] = []
    with ThreadPoolExecutor(max_workers=max(1, workers)) as pool:
        # pool.map keeps the users' order: a future per chunk, the progress told as each
        # chunk is joined.
        for chunk, text in zip(chunks, pool.map(lines, chunks), strict=True):
            parts.append(text)
            if on_hashed is not None:
                on_hashed(len(chunk))
    return "".join(parts)


def acl_text(run_secrets: RunSecrets, *, observer: bool = False) -> str:
    """A mosquitto ``acl_file`` granting exactly the policy in the module docstring (and, with
    ``observer``, read access to updates and statuses for :data:`OBSERVER_USERNAME`)."""
    topics = Topics(run_secrets.run)
    lines = [
        f"# fedsim run {run_secrets.run!r}: generated by `fedsim deploy`; anything not listed is denied.",
        "",
        f"user {run_secrets.for_server().username}",
        f"topic read {topics.all_updates}",
        f"topic read {topics.all_status}",
        f"topic read {topics.all_hello}",
        f"topic write {topics.global_model}",
        f"topic write {topics.root}/acks/+",
    ]
    if run_secrets.aggregators:
        lines += [f"topic read {topics.all_partials}", f"topic write {topics.close}",
                  f"topic write {topics.root}/receipts/+"]
    ids = sorted(run_secrets.aggregators)
    for aggregator_id in ids:
        lines += ["", f"user {run_secrets.aggregators[aggregator_id].username}"]
        routed = [c for c in run_secrets.clients if aggregator_of(c, ids) == aggregator_id]
        # The few topics first, its clients' updates last, and the receipts it passes on in one
        # line: mosquitto scans a user's lines in order for each message it checks (with one
        # line per client, 5,000 of them, a receipt cost the broker 100 us of CPU, not 10).
        lines += [
            f"topic write {topics.root}/acks/{aggregator_id}/+",
            f"topic write {topics.partials(aggregator_id)}",
            f"topic read {topics.receipts(aggregator_id)}",
            f"topic read {topics.close}",
            f"topic read {topics.global_model}",
        ]
        lines += [f"topic read {topics.updates(c)}" for c in routed]
    for client_id, creds in run_secrets.clients.items():
        lines += [
            "",
            f"user {creds.username}",
            f"topic write {topics.updates(client_id)}",
            f"topic write {topics.status(client_id)}",
            f"topic write {topics.hello(client_id)}",
            f"topic read {topics.global_model}",
            f"topic read {topics.acks(client_id)}",
        ]
        if ids:
            lines.append(f"topic read {topics.relayed_acks(aggregator_of(client_id, ids), client_id)}")
    if observer:
        lines += [
            "",
            f"user {OBSERVER_USERNAME}",
            f"topic read {topics.all_updates}",
            f"topic read {topics.all_status}",
        ]
    return "\n".join(lines) + "\n"


@dataclass(frozen=True)
class ListenerTls:
    """Broker-side TLS for the listener (it then speaks only TLS: clients use ``mqtts://``).

    Paths are as the broker sees them. ``cafile`` is needed to verify client certificates,
    which ``require_client_certificate`` demands (on top of the password).
    """

    certfile: str
    keyfile: str
    cafile: str | None = None
    require_client_certificate: bool = False


def mosquitto_conf_text(
    *,
    port: int,
    bind_address: str,
    password_file: str,
    acl_file: str,
    persistence_dir: str | None = None,
    max_queued_messages: int = SERVER_BACKLOG,
    max_queued_bytes: int = DEFAULT_QUEUED_BYTES,
    max_packet_bytes: int | None = None,
    log_file: str | None = None,
    run_as_user: str | None = None,
    tls: ListenerTls | None = None,
) -> str:
    """A mosquitto 2 configuration for one authenticated, ACL-restricted listener.

    ``max_queued_messages`` is per client (size it with :func:`queue_limit`; the default, with
    no run to size it for, is :data:`SERVER_BACKLOG`): QoS 1 messages queued beyond it are
    dropped, which costs a resend, not an update (the clients resend what the server never
    acknowledged), while a longer queue would only make every update in it arrive stale. It is
    also bounded in bytes (``max_queued_bytes``). The limits are the same
    for every client (mosquitto has no per-user ones), so what a *client's* session may hold
    is kept small another way: the only QoS 1 messages a client may read are its receipts;
    the global model travels at QoS 0 and QoS 0 messages are not queued for a session that
    is away (``queue_qos0_messages false``, never upgraded: ``upgrade_outgoing_qos false``).
    ``max_packet_bytes``: the largest packet the broker accepts (:func:`packet_limit`).
    ``run_as_user`` is the user a broker started as root switches to (mosquitto's default:
    ``mosquitto``).
    """
    lines = [
        "# Generated by `fedsim deploy`.",
        "per_listener_settings false",
        f"listener {port} {bind_address}",
        *_tls_lines(tls),
        "allow_anonymous false",
        # The client id is the username: nobody can take over (and destroy) another's session.
        "use_username_as_clientid true",
        f"password_file {password_file}",
        f"acl_file {acl_file}",
        f"max_queued_messages {max_queued_messages}",
        # ... but bounded in bytes; beyond it the broker drops, and the clients resend what the
        # server never acknowledged.
        f"max_queued_bytes {max_queued_bytes}",
        # Nothing at QoS 0 (the global model) is kept for a session that is away: a client's
        # abandoned persistent session cannot fill the broker with models (issue 25, finding 10).
        "queue_qos0_messages false",
        "upgrade_outgoing_qos false",
        # The server's persistent session (its queue) is forgotten a week after it left.
        "persistent_client_expiration 7d",
        # Small receipts (acks) must not wait for Nagle's algorithm.
        "set_tcp_nodelay true",
    ]
    if run_as_user is not None:
        lines.append(f"user {run_as_user}")
    if max_packet_bytes is not None:
        lines.append(f"max_packet_size {max_packet_bytes}")
    if persistence_dir is not None:
        lines += ["persistence true", f"persistence_location {persistence_dir.rstrip('/')}/"]
    else:
        lines.append("persistence false")
    if log_file is not None:
        lines += [
            f"log_dest file {log_file}",
            "log_type error",
            "log_type warning",
            "log_type notice",
        ]
    else:
        lines.append("log_dest stderr")
    return "\n".join(lines) + "\n"


def _tls_lines(tls: ListenerTls | None) -> list[str]:
    if tls is None:
        return []
    lines = [f"certfile {tls.certfile}", f"keyfile {tls.keyfile}"]
    if tls.cafile is not None:
        lines.append(f"cafile {tls.cafile}")
    if tls.require_client_certificate:
        if tls.cafile is None:
            raise ConfigError("requiring client certificates needs a CA file to verify them")
        lines.append("require_certificate true")
    return lines


def write_secrets(
    path: str | Path, run_secrets: RunSecrets, *, observer: Credentials | None = None
) -> None:
    """Write the clear-text credentials, readable by the owner only (created with mode 0600)."""
    _write_private(Path(path), secrets_text(run_secrets, observer=observer))


def secrets_text(run_secrets: RunSecrets, *, observer: Credentials | None = None) -> str:
    """The secrets file's JSON (see :func:`load_secrets`): the run's name and the credentials
    it holds (a per-process file's: one process's, no ``server`` unless the server's)."""
    data: dict[str, object] = {"run": run_secrets.run}
    if run_secrets.server is not None:
        data["server"] = vars(run_secrets.server)
    if run_secrets.clients or run_secrets.server is not None:  # secrets.json: always
        data["clients"] = {c: vars(creds) for c, creds in run_secrets.clients.items()}
    if run_secrets.aggregators:
        data["aggregators"] = {a: vars(c) for a, c in run_secrets.aggregators.items()}
    if observer is not None:
        data["observer"] = vars(observer)
    return json.dumps(data, indent=2) + "\n"


PRIVATE = 0o600
"""Mode of the files that hold secrets or their hashes (the broker runs as their owner)."""


def _write_private(path: Path, text: str) -> None:
    """``text`` into ``path``, mode 0600 from its creation (also when ``path`` existed with
    wider permissions), replaced atomically: never a cut file, never readable by others."""
    path.parent.mkdir(parents=True, exist_ok=True)
    write_atomically(path, text, durability="file", mode=PRIVATE)


def load_secrets(path: str | Path) -> RunSecrets:
    """Read a secrets file written by :func:`write_secrets`: ``secrets.json`` (everyone's
    credentials) or a per-process file (one process's; asking it for another's is a
    ConfigError naming the file). A bad file is a ConfigError."""
    path = Path(path)
    try:
        data = parse_json(path.read_text())
        loaded = RunSecrets(
            run=str(data["run"]),
            server=Credentials(**data["server"]) if "server" in data else None,
            clients={c: Credentials(**creds) for c, creds in data.get("clients", {}).items()},
            aggregators={a: Credentials(**creds)
                         for a, creds in data.get("aggregators", {}).items()},
            source=path,
        )
    except OSError as exc:
        raise ConfigError(f"cannot read secrets file {path}: {exc.strerror}") from None
    except (ValueError, KeyError, TypeError, AttributeError) as exc:
        raise ConfigError(f"secrets file {path} is malformed: {exc!r}") from None
    if not loaded.holders():
        raise ConfigError(f"secrets file {path} holds no credentials")
    return loaded


@dataclass(frozen=True)
class BrokerFiles:
    """Where :func:`write_broker_files` put things."""

    config: Path
    password_file: Path
    acl_file: Path
    secrets_file: Path
    process_secrets_dir: Path
    """The per-process secrets files' folder (:data:`PROCESS_SECRETS_DIR` in ``out_dir``)."""

    def process_secrets_file(self, username: str) -> Path:
        """The per-process secrets file of the process that logs in as ``username``."""
        return self.secrets_file.parent / process_secrets_name(username)


PUBLIC_READ_ONLY = 0o644
"""The broker's configuration: no secret in it, but writable by its owner alone (under a umask
of 000 it was 0666: anyone could rewrite the broker's settings)."""


def _private_folder(folder: Path) -> None:
    """Make ``folder`` (the per-process secrets' folder) a directory of this user's, mode 0700,
    or refuse: a symbolic link there would have the credentials written, and an earlier
    run's ``*.json`` removed, wherever it points (a review planted one), and a folder others
    may write lets them rename their own file over a process's."""
    folder.mkdir(mode=0o700, exist_ok=True)
    found = os.lstat(folder)
    if stat.S_ISLNK(found.st_mode) or not stat.S_ISDIR(found.st_mode):
        raise ConfigError(f"{folder} is not a directory (a symbolic link?): the per-process "
                          f"secrets are written only into a real directory; remove it")
    if hasattr(os, "geteuid") and found.st_uid != os.geteuid():
        raise ConfigError(f"{folder} belongs to another user (uid {found.st_uid}): the "
                          f"per-process secrets are written only into a directory of yours")
    os.chmod(folder, 0o700)  # (mkdir's mode is cut by the umask; an existing one keeps its own)


def write_broker_files(  # noqa: PLR0913 - the one writer of a broker's files, replaced together
    out_dir: str | Path,
    run: str,
    client_ids: Sequence[str],
    *,
    port: int = 1883,
    bind_address: str = "0.0.0.0",
    broker_config_dir: str | None = None,
    persistence_dir: str | None = None,
    log_file: str | None = None,
    max_packet_bytes: int | None = None,
    run_as_user: str | None = None,
    tls: ListenerTls | None = None,
    observer: bool = False,
    hashing: PasswordHashing = PasswordHashing(),
    max_queued_messages: int | None = None,
    max_queued_bytes: int | None = None,
    aggregators: Sequence[str] = (),
    per_process: bool = False,
) -> BrokerFiles:
    """Generate credentials and write ``mosquitto.conf``, ``passwd`` and ``acl`` (both 0600),
    ``secrets.json`` (0600; with ``observer`` it also holds the read-only observer's password
    under ``"observer"``), and with ``per_process`` (``fedsim deploy``: processes given their
    own credentials on machines or containers of their own) in the folder
    :data:`PROCESS_SECRETS_DIR` (0700) one secrets file a process (0600) holding its own
    credentials alone (:meth:`RunSecrets.per_process`); files there of users the run no longer
    has are removed. Without it (``fedsim launch``'s private broker: every process on this
    machine, as one user, reads ``secrets.json``) no second copy of the passwords is written.

    ``broker_config_dir`` is where the broker will see ``out_dir`` (``/mosquitto/config`` in the
    eclipse-mosquitto container); by default the absolute path of ``out_dir`` itself. The
    broker's queue is sized for the run (:func:`queue_limit`) unless ``max_queued_messages``;
    ``max_queued_bytes`` (default 1 GiB) bounds it in bytes, per client. ``aggregators``:
    the aggregation nodes' ids (their credentials and ACL role). ``hashing``: the password
    file's PBKDF2 rounds and progress callback.
    """
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    run_secrets = generate_secrets(run, client_ids, aggregators)
    seen_as = (broker_config_dir or str(out.resolve())).rstrip("/")
    files = BrokerFiles(
        config=out / "mosquitto.conf",
        password_file=out / "passwd",
        acl_file=out / "acl",
        secrets_file=out / "secrets.json",
        process_secrets_dir=out / PROCESS_SECRETS_DIR,
    )
    alone = {out / name: (secrets_text(one), PRIVATE)
             for name, one in run_secrets.per_process().items()} if per_process else {}
    watcher = Credentials(OBSERVER_USERNAME, secrets.token_urlsafe(24)) if observer else None
    # Everything computed before the first file is written, and all replaced together
    # (atomic.replace_together): an error, a full disk or an interrupt while hashing (minutes
    # at 10^6 clients) leaves the directory as it was, not new secrets beside an old password
    # file that nobody could log in with. (A file a process: 0.4 ms each, about 7 minutes at
    # 10^6 clients, as long as their hashing.)
    password_text = password_file_text(run_secrets, hashing=hashing,
                                       extra=[watcher] if watcher else [])
    config_text = mosquitto_conf_text(
        port=port,
        bind_address=bind_address,
        password_file=f"{seen_as}/passwd",
        acl_file=f"{seen_as}/acl",
        persistence_dir=persistence_dir,
        log_file=log_file,
        max_packet_bytes=max_packet_bytes,
        run_as_user=run_as_user,
        tls=tls,
        max_queued_messages=max_queued_messages or queue_limit(len(run_secrets.clients)),
        max_queued_bytes=max_queued_bytes or DEFAULT_QUEUED_BYTES,
    )
    if per_process:
        _private_folder(files.process_secrets_dir)
    replace_together({
        files.secrets_file: (secrets_text(run_secrets, observer=watcher), PRIVATE),
        files.password_file: (password_text, PRIVATE),
        files.acl_file: (acl_text(run_secrets, observer=observer), PRIVATE),
        files.config: (config_text, PUBLIC_READ_ONLY),
        **alone,
    }, durability="file")
    for stale in files.process_secrets_dir.glob("*.json") if per_process else ():
        if stale not in alone:  # an earlier run's users
            stale.unlink(missing_ok=True)
    return files
