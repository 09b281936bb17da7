"""The deployed aggregation node: the scenario's :class:`AggregatorActor` on the wall clock,
behind an MQTT endpoint (:class:`~fedsim.transports.mqtt.MqttAggregatorEndpoint`), until the
server announces the end of the run (docs/DEPLOYMENT.md, "Aggregation nodes").

It reads the updates of the clients routed to it (a fixed route per client,
:func:`~fedsim.transports.topics.aggregator_of`), judges what public data allows, and at each
window's close sends one partial to the server. It keeps no state on disk: a restarted aggregator
starts with an empty book, and the updates its predecessor held but had not yet sent are dropped
in flight (their clients resend what the server never acknowledged; nothing is applied twice,
since the server's book is the one that applies). On exit it writes ``<state>/<id>.json``: what it
folded, forwarded and sent, and its endpoint's counters.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

from fedsim.clock import ScaledClock
from fedsim.config.loading import LoadedScenario
from fedsim.errors import ConfigError
from fedsim.logging import get_logger
from fedsim.protocol.messages import Message, RunFinished
from fedsim.runtime.actors.tasks import unless_stopped
from fedsim.runtime.assembly import make_aggregator_actor
from fedsim.runtime.deployed.deployment import (
    STOPPED_BEFORE_CONNECTING,
    connected,
    least_kept_counts,
    message_limit,
    reconnect_policy,
    run_name,
)
from fedsim.runtime.deployed.guarantees import require_public_slots
from fedsim.runtime.deployed.options import DeploymentOptions
from fedsim.runtime.population import Population, build_population
from fedsim.runtime.run_outputs import write_json
from fedsim.transports.mqtt import BrokerSettings, MqttAggregatorEndpoint
from fedsim.transports.topics import aggregator_ids

__all__ = ["aggregator_state_file", "run_aggregator"]

_log = get_logger("fedsim.runtime.deployed.aggregator_process")


def aggregator_state_file(state_dir: str | Path, aggregator_id: str) -> Path:
    return Path(state_dir) / f"{aggregator_id}.json"


class _UntilFinished:
    """The aggregator's endpoint, keeping the end of the run from the actor: it sets
    ``finished`` instead."""

    def __init__(self, inner: MqttAggregatorEndpoint) -> None:
        self.inner = inner
        self.finished = asyncio.Event()

    async def publish(self, message: Message) -> None:
        await self.inner.publish(message)

    async def receive(self) -> Message:
        while True:
            message = await self.inner.receive()
            if not isinstance(message, RunFinished):
                return message
            self.finished.set()

    async def close(self) -> None:
        await self.inner.close()


async def _until_finished(serving: asyncio.Future[Any], endpoint: _UntilFinished) -> None:
    """Wait for the end of the run; a failure of the actor (its endpoint's) is raised."""
    ended: asyncio.Future[Any] = asyncio.ensure_future(endpoint.finished.wait())
    try:
        await asyncio.wait({serving, ended}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        ended.cancel()
    if serving.done():
        serving.result()


async def run_aggregator(
    loaded: LoadedScenario,
    aggregator_id: str,
    broker: BrokerSettings,
    *,
    run: str | None = None,
    state_dir: str | Path,
    options: DeploymentOptions = DeploymentOptions(),
    stop: asyncio.Event | None = None,
    population: Population | None = None,
) -> dict[str, Any]:
    """Serve as aggregator ``aggregator_id`` until the run is finished (or ``stop`` is set);
    the outcome, also written to ``state_dir``."""
    scenario = loaded.scenario
    require_public_slots(scenario)
    ids = aggregator_ids(scenario.aggregators.count)
    if aggregator_id not in ids:
        raise ConfigError(
            f"{aggregator_id!r} is not an aggregator of this scenario (aggregators.count = "
            f"{scenario.aggregators.count}: {list(ids)}; fedsim launch --aggregators K or "
            "--set aggregators.count=K sets it)")
    run = run_name(scenario, run)
    population = population or build_population(loaded)
    size = int(population.initial_params.size)
    endpoint = MqttAggregatorEndpoint(
        broker, run=run, aggregator_id=aggregator_id, aggregators=ids,
        client_ids=[p.client_id for p in population.plans], expected_params=size,
        max_message_bytes=message_limit(scenario, size), reconnect=reconnect_policy(options),
        seed=scenario.seed,
        compressions={p.client_id: p.group.compression for p in population.plans},
        least_kept=least_kept_counts(population.plans, size))
    wrapped = _UntilFinished(endpoint)
    actor = make_aggregator_actor(population, aggregator_id,
                                  clock=ScaledClock(options.time_scale), endpoint=wrapped)
    outcome: dict[str, Any] = {"aggregator": aggregator_id, "run": run,
                               "clients": len(endpoint.client_ids), "finished": False}
    try:
        async with connected(endpoint, stop) as made:
            if not made:
                outcome["stop_reason"] = STOPPED_BEFORE_CONNECTING
                return outcome
            _log.info("aggregator serving", aggregator=aggregator_id, clients=len(endpoint.client_ids))
            serving = asyncio.ensure_future(actor.run())
            try:
                finished, _ = await unless_stopped(_until_finished(serving, wrapped), stop)
                outcome["finished"] = finished
            finally:
                serving.cancel()
                await asyncio.gather(serving, return_exceptions=True)
    finally:
        outcome.update({"folded": actor.folded, "forwarded": actor.forwarded,
                        "resent_refused": actor.resent,
                        "partials": actor.partials, "mqtt": endpoint.stats.as_dict()})
        Path(state_dir).mkdir(parents=True, exist_ok=True)
        write_json(aggregator_state_file(state_dir, aggregator_id), outcome)
    return outcome
