"""One scenario as separate processes talking through a real MQTT broker: what the processes
share (broker access, the run name, signal supervision).

The deployed runtime, by process:

* :mod:`fedsim.runtime.deployed.server_process` - the server (:func:`~fedsim.runtime.deployed.server_process.serve`);
* :mod:`fedsim.runtime.deployed.client_process` - one client
  (:func:`~fedsim.runtime.deployed.client_process.run_client`);
* :mod:`fedsim.runtime.deployed.aggregator_process` - one aggregation node
  (:func:`~fedsim.runtime.deployed.aggregator_process.run_aggregator`);
* :mod:`fedsim.runtime.deployed.launcher` - every process of a run on this machine, and the collection
  of their files into the run directory ``fedsim run`` writes;
* :mod:`fedsim.runtime.deployed.options` - the options they share (:class:`DeploymentOptions`).

The server and each client process build exactly the actors the simulator builds
(:func:`~fedsim.runtime.assembly.make_server_actor`,
:func:`~fedsim.runtime.assembly.make_client_actor`) from the same seeded
:func:`~fedsim.runtime.population.build_population`, so client ``i`` holds the same records and
the same DP posture in both modes; only the clock (:class:`~fedsim.clock.ScaledClock`, wall
time) and the endpoint (:mod:`fedsim.transports.mqtt`) differ.

**Time.** Scenario time quantities (window length, compute speed, on/off periods, the
``virtual_seconds`` stop) are seconds of *scenario time*; here scenario time runs at
``time_scale`` wall seconds per scenario second (1.0: real time; 0.1: ten times faster, for
short test runs). A round lasts the speed model's cost of its expected batch; the real compute
runs inside it and the update leaves at its end (:mod:`fedsim.runtime.actors.exposure`: send times
must not reveal the realised batch), so heterogeneous clients keep their relative speeds. Each
client's scenario links (``network``) are emulated in front of its endpoint
(:mod:`fedsim.transports.emulated`) and its ``availability.crashes`` in its process
(:mod:`fedsim.runtime.deployed.client_lives`); the aggregation nodes' links are not: the real
broker is the network there. On/off ``availability`` periods are emulated by pausing the
client.

**Crash safety.** A client's ledger lives in its state directory and is resumed, never reset;
it is fsynced before each update is published (the actor's order), so a SIGKILL cannot forget
a released update; the update itself is then kept in the state directory's durable outbox
until the server's receipt (:mod:`fedsim.transports.durable_outbox`), and a restarted client
sends it again. A restarted client continues after its last committed round; every process
draws its batches and noise from OS entropy (in the opt-in, not private, seeded mode: from a
fresh seed stream keyed by that round: replaying the first incarnation's stream would release
the same noise twice). The server writes a checkpoint
(:mod:`fedsim.runtime.deployed.checkpoint`) after every window, on a worker thread, and a global
model leaves only once a durable checkpoint covers its version (its *version ceiling*,
:class:`~fedsim.runtime.deployed.server_process.Checkpoints`); a restarted server resumes model,
version, step size, client book and window count and continues ``metrics.jsonl`` and
``applied.jsonl`` (one line per applied update, for audits) from there. An update is
acknowledged to its client only after a checkpoint that records it (applied, or judged
duplicate or stale, in the client book) is on disk; updates received since the last durable
checkpoint when the server dies were never acknowledged, so their clients resend them (after
``resend_after``, :func:`~fedsim.runtime.deployed.client_process.client_resend_after`) and the
restarted server applies them once: not lost, and not applied twice, since those the
checkpoint's book holds are duplicates. So that clients waiting for a model newer than the
restored one do not wait for their resend, the restarted server re-publishes its model under a
new version above the checkpoint's ceiling
(:meth:`~fedsim.runtime.actors.server.ServerActor.renew_version`).

State directory layout: server ``<state>/server.ckpt``; client ``<state>/ledgers/<id>.jsonl``
and ``<state>/client-<id>.json`` (what the last incarnation reported on exit).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
from collections.abc import AsyncIterator, Callable, Coroutine, Iterable
from pathlib import Path
from typing import Any, Protocol, TypeVar

import torch

from fedsim.config.schema import Scenario
from fedsim.errors import ConfigError
from fedsim.protocol import codec
from fedsim.runtime.actors.integrity import least_sparse_count
from fedsim.runtime.actors.partials import MAX_LATE_PARTIALS
from fedsim.runtime.actors.tasks import unless_stopped
from fedsim.runtime.deployed.options import DeploymentOptions
from fedsim.runtime.population import ClientPlan
from fedsim.transports.mqtt import BrokerSettings, ReconnectPolicy, TlsSettings, parse_broker_url
from fedsim.transports.security import load_secrets, packet_limit, queue_limit
from fedsim.transports.topics import Topics

__all__ = [
    "BROKER_ENV",
    "SECRETS_ENV",
    "broker_for",
    "broker_queue_bytes",
    "largest_message",
    "least_kept_counts",
    "message_limit",
    "partial_limit",
    "reconnect_policy",
    "resolve_broker",
    "run_name",
    "run_process",
]

T = TypeVar("T")

BROKER_ENV = "FEDSIM_BROKER"
SECRETS_ENV = "FEDSIM_SECRETS"


def resolve_broker(
    url: str | None,
    *,
    secrets_file: str | Path | None,
    role: str,
    client_id: str | None = None,
    run: str | None = None,
    tls: TlsSettings | None = None,
) -> tuple[BrokerSettings, str | None]:
    """Broker settings with credentials, and the run name the credentials are for.

    ``url`` (default ``$FEDSIM_BROKER``) may carry ``user:password@``; otherwise the
    credentials of ``role`` (``server``, ``client`` ``client_id`` or ``aggregator``
    ``client_id``, the aggregator's id) come from the secrets file
    written by ``fedsim deploy`` / :func:`fedsim.transports.security.write_secrets` (default
    ``$FEDSIM_SECRETS``): ``secrets.json`` or the process's own file in ``secrets/``, which
    holds nobody else's (asking it for another role's is a ConfigError naming the file).
    Without either the connection is anonymous (refused by brokers set up by fedsim). The
    returned run is the secrets file's, or ``run``; they must agree.
    """
    url = url or os.environ.get(BROKER_ENV)
    if not url:
        raise ConfigError(f"no broker: pass --broker mqtt://HOST:PORT or set ${BROKER_ENV}")
    settings = parse_broker_url(url, tls=tls)
    secrets_file = secrets_file or os.environ.get(SECRETS_ENV) or None
    if secrets_file is None:
        return settings, run
    secrets = load_secrets(secrets_file)
    if run is not None and run != secrets.run:
        raise ConfigError(f"secrets file {secrets_file} is for run {secrets.run!r}, not {run!r}")
    if settings.username is None:
        if role == "server":
            credentials = secrets.for_server()
        elif role == "aggregator":
            credentials = secrets.for_aggregator(str(client_id))
        else:
            credentials = secrets.for_client(str(client_id))
        settings = settings.with_credentials(credentials)
    return settings, secrets.run


def run_name(scenario: Scenario, run: str | None) -> str:
    """``run``, else the scenario's name; refused unless it can name MQTT topics."""
    name = run or scenario.name
    Topics(name)  # validates it (it names MQTT topics)
    return name


def message_limit(scenario: Scenario, num_params: int) -> int:
    """The largest message a deployed process accepts (a server's partials:
    :func:`partial_limit`): a model's size with its header allowance (:func:`~fedsim.protocol.codec.max_message_bytes`), at most
    ``network.max_message_bytes``. Anything larger is refused before it is decoded."""
    return min(scenario.network.max_message_bytes, codec.max_message_bytes(num_params))


def partial_limit(scenario: Scenario, num_params: int) -> int:
    """The largest partial a deployed server accepts from an aggregation node: up to
    :data:`~fedsim.protocol.headers.MAX_PARTIAL_GROUPS` sums with a whole manifest
    (:func:`~fedsim.protocol.codec.max_partial_bytes`), at most ``network.max_message_bytes``
    (the aggregators send no more sums than fit: :func:`~fedsim.protocol.codec.partial_groups`)."""
    return min(scenario.network.max_message_bytes, codec.max_partial_bytes(num_params))


def largest_message(scenario: Scenario, num_params: int) -> int:
    """The largest message of a deployed run: a partial where aggregation nodes send them
    (:func:`partial_limit`), else :func:`message_limit`; the base of the broker's packet
    limit (:func:`~fedsim.transports.security.packet_limit`)."""
    largest = message_limit(scenario, num_params)
    if scenario.aggregators.count:
        largest = max(largest, partial_limit(scenario, num_params))
    return largest


def broker_queue_bytes(scenario: Scenario, num_params: int, num_clients: int) -> int:
    """The broker's ``max_queued_bytes`` (per session) for a deployed run: the server's bounded
    backlog (:func:`~fedsim.transports.security.queue_limit`) of one-model messages and, where
    aggregation nodes send partials, the partials the server holds of each between two closes
    (the closing window's and :data:`~fedsim.runtime.actors.partials.MAX_LATE_PARTIALS` late
    ones), each of the largest size. Sized as a backlog of the largest message alone, a
    partial (up to 64 sums), it let one aggregator have the broker queue 64 times a model's
    backlog for the server (a 50,890-parameter model: 17.2 GB instead of 269 MB)."""
    queued = queue_limit(num_clients) * packet_limit(message_limit(scenario, num_params))
    if scenario.aggregators.count:
        queued += ((MAX_LATE_PARTIALS + 1) * scenario.aggregators.count
                   * packet_limit(partial_limit(scenario, num_params)))
    return queued


def least_kept_counts(plans: Iterable[ClientPlan], num_params: int) -> dict[str, int]:
    """Per client, the fewest coordinates its honest ``threshold`` frames keep
    (:func:`~fedsim.runtime.actors.integrity.least_sparse_count`; 0: no bound), for the
    server's and an aggregation node's endpoint: a sparse frame keeping fewer is refused
    from its header, before it is expanded to a dense vector."""
    return {p.client_id: least_sparse_count(p.group, p.schedule, num_params) for p in plans}


def reconnect_policy(options: DeploymentOptions) -> ReconnectPolicy:
    """Reconnection attempts from 0.1 s apart up to ``options.max_backoff`` apart."""
    return ReconnectPolicy(initial_delay=min(0.1, options.max_backoff), max_delay=options.max_backoff)


def broker_for(
    options: DeploymentOptions, *, role: str, client_id: str | None = None
) -> tuple[BrokerSettings, str | None]:
    """:func:`resolve_broker` with ``options``' broker, secrets file, run name and TLS files."""
    tls = TlsSettings(
        ca_certs=options.tls_ca,
        certfile=options.tls_cert,
        keyfile=options.tls_key,
        insecure=options.tls_insecure,
    )
    return resolve_broker(
        options.broker,
        secrets_file=options.secrets_file,
        role=role,
        client_id=client_id,
        run=options.run,
        tls=tls,
    )


class Connectable(Protocol):
    """An endpoint that connects (:meth:`start`, retrying within its connect timeout) and
    disconnects (:meth:`close`), as fedsim's MQTT endpoints do."""

    async def start(self) -> None: ...

    async def close(self) -> None: ...


@contextlib.asynccontextmanager
async def connected(endpoint: Connectable, stop: asyncio.Event | None) -> AsyncIterator[bool]:
    """``endpoint`` connected for the block and closed after it: yields True, or False if
    ``stop`` (SIGTERM, SIGINT) was set before the first connection was made. A process whose
    broker is not up yet keeps trying for the connect timeout (30 s by default); a signal in
    that time ends the attempt at once instead of being honoured only after it. A failure to
    connect is raised."""
    made, _ = await unless_stopped(endpoint.start(), stop)  # a cancelled start closes itself
    if not made:
        yield False
        return
    try:
        yield True
    finally:
        await endpoint.close()


STOPPED_BEFORE_CONNECTING = "stopped by a signal before the first connection to the broker"
"""The stop reason a process reports when a signal ended its first connection attempt."""


def run_process(main: Callable[[asyncio.Event], Coroutine[Any, Any, T]], threads: int) -> T:
    """Run a server or client coroutine factory with SIGTERM/SIGINT setting its stop event."""
    torch.set_num_threads(threads)

    async def supervised() -> T:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        return await main(stop)

    return asyncio.run(supervised())
