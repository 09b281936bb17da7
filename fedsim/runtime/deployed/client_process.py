"""The deployed client process: one client's :class:`ClientActor` on the wall clock, behind an
MQTT endpoint, its ledger resumed from its state directory (see :mod:`fedsim.runtime.deployed.deployment`
for the crash-safety contract).

State directory: ``<state>/ledgers/<id>.jsonl`` (the ledger), ``<state>/outbox/`` (the
updates sent and not yet acknowledged, resent by the next process:
:mod:`fedsim.transports.durable_outbox`), ``<state>/followed.json`` (the run incarnations it
followed, kept as the server confirms them:
:func:`~fedsim.runtime.deployed.state_owner.remember_followed`) and
``<state>/client-<id>.json`` (what the last incarnation reported on exit).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch

from fedsim.clock import Clock, ScaledClock
from fedsim.config import limits
from fedsim.config.loading import LoadedScenario
from fedsim.config.network import client_links, imperfect
from fedsim.config.schema import Scenario
from fedsim.errors import ConfigError, LedgerError, TransportError
from fedsim.logging import get_logger
from fedsim.privacy.ledger import PrivacyLedger
from fedsim.protocol.messages import ClientState, ClientStatus
from fedsim.runtime.actors.client import ClientActor
from fedsim.runtime.actors.exposure import client_exposure, client_generator
from fedsim.runtime.actors.releases import Releases
from fedsim.runtime.actors.stops import ClientStopKind
from fedsim.runtime.actors.tasks import alongside, unless_stopped
from fedsim.runtime.assembly import (
    aggregator_wait,
    make_client_actor,
    open_ledger,
    toggle_availability,
)
from fedsim.runtime.deployed.client_lives import (
    CRASHED_FOR_GOOD,
    DOWN_AT_THE_END,
    ClientLives,
    ServerTimeline,
    crash_stop,
)
from fedsim.runtime.deployed.deployment import (
    STOPPED_BEFORE_CONNECTING,
    connected,
    message_limit,
    reconnect_policy,
    run_name,
)
from fedsim.runtime.deployed.guarantees import require_public_slots
from fedsim.runtime.deployed.options import FLUSH_TIMEOUT, DeploymentOptions
from fedsim.runtime.deployed.state_owner import (
    RUN_FINISHED,
    add_counts,
    claim_state_dir,
    client_state_file,
    emulated_totals,
    followed_incarnations,
    followed_runs,
    read_client_report,
    refuse_ended_run,
    remember_followed,
    report_count,
    run_ended_error,
    stopped_for_good,
)
from fedsim.runtime.normalisation import normalisation_generator
from fedsim.runtime.population import ClientPlan, Population, build_population, plan_of
from fedsim.runtime.run_outputs import ledger_file, write_json
from fedsim.transports.base import Endpoint
from fedsim.transports.durable_outbox import DurableOutbox
from fedsim.transports.emulated import EmulatedLinks
from fedsim.transports.link_model import link_model
from fedsim.transports.mqtt import BrokerSettings, FollowedRuns, MqttClientEndpoint
from fedsim.transports.topics import aggregator_ids, aggregator_of

__all__ = ["client_resend_after", "client_state_file", "run_client", "training_generator"]

_log = get_logger("fedsim.runtime.deployed.client_process")

ANNOUNCE_EVERY = 1.0  # wall seconds between a starting client's "connected" statuses
RELAYED_RECEIPTS_WAIT = 5.0
"""Wall seconds a client routed through an aggregator waits, once the server has finished the
run, for receipts still on their way (the server sends the last ones just before the end; an
aggregator passes them on a few milliseconds later)."""


def client_resend_after(scenario: Scenario, time_scale: float) -> float:
    """Wall seconds after which a client resends an unacknowledged update.

    The server acknowledges at the end of the window after arrival (after its checkpoint), so a
    receipt takes up to one window of wall time, and with aggregators up to the server's wait
    for their partials more; 1.5 windows (and that wait) plus a second keeps resends to
    updates that were really lost (a crashed server, a broker that lost its queue)."""
    wait = aggregator_wait(scenario) if scenario.aggregators.count else 0.0
    return max(2.0, (1.5 * scenario.server.window + wait) * time_scale + 1.0)


def training_generator(population: Population, client_id: str, first_round: int) -> torch.Generator:
    """The generator of batches and noise for a client process that starts at ``first_round``.

    The first incarnation (round 0) draws the simulator's stream ``client/<id>/train``. A
    restarted one must not replay noise that was already released (two releases with the same
    noise vector would reveal the difference of their gradients), so it draws from a stream
    keyed by the round it resumes at. Each released round comes from the stream of the
    incarnation that released it, and an incarnation starting at round r releases nothing
    before r; two incarnations can only share a stream if the first released nothing.
    Only with ``privacy.deployed_randomness: seeded_not_private``; by default the stream is
    keyed from OS entropy (:func:`fedsim.runtime.actors.exposure.client_generator`).
    """
    randomness = population.scenario.privacy.deployed_randomness
    return client_generator(population.tree, client_id, first_round, randomness)


async def _announce(lives: ClientLives, endpoint: MqttClientEndpoint, delta: float) -> None:
    """Say "connected" until the first global model arrives (the server may wait for every
    client before its first window, and a status sent before it subscribed is lost)."""
    while lives.actor.held_version < 0 and not lives.crashed_for_good:
        ledger = lives.record.ledger
        await endpoint.publish(
            ClientStatus(
                lives.actor.client_id,
                "waiting",
                len(ledger.rounds),
                ledger.epsilon(delta),
                delta,
                "connected",
                lives.clock.now(),
            )
        )
        await asyncio.sleep(ANNOUNCE_EVERY)


async def _say_crashed(endpoint: MqttClientEndpoint, lives: ClientLives, delta: float,
                       timeout: float) -> None:
    """Tell the server the client crashed for good (client_lives' docstring: a simulation knows
    its actors' states, a deployed server only what it is told): again every
    ``ANNOUNCE_EVERY`` until once after the live server has answered it (a status sent before
    a resumed server subscribed is lost: an attacker's review), for at most ``timeout`` wall
    seconds."""
    ledger = lives.record.ledger
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while True:
        live = endpoint.incarnation.current is not None
        with contextlib.suppress(TransportError):
            await endpoint.publish(ClientStatus(
                lives.actor.client_id, "crashed", ledger.next_round, ledger.epsilon(delta),
                delta, CRASHED_FOR_GOOD, lives.server_now()))
        if live or loop.time() >= deadline:
            return
        await asyncio.sleep(ANNOUNCE_EVERY)


async def _halt_when(event: Awaitable[object], halt: asyncio.Event) -> None:
    await event
    halt.set()


async def run_client(
    loaded: LoadedScenario,
    client_id: str,
    broker: BrokerSettings,
    *,
    run: str | None = None,
    state_dir: str | Path,
    options: DeploymentOptions = DeploymentOptions(),
    flush_timeout: float = FLUSH_TIMEOUT,
    stop: asyncio.Event | None = None,
    population: Population | None = None,
) -> dict[str, Any]:
    """Run one client until its rounds or budget end, the server says the run is finished (or
    ``stop`` is set); then wait up to ``flush_timeout`` wall seconds for the server to
    acknowledge every update sent (not after the end of the run: no receipt follows it). On/off
    ``availability`` periods pause and resume the actor (scenario time).

    Resumes the ledger in ``state_dir``; writes ``client-<id>.json`` there (also returned).
    Refuses at once (:class:`~fedsim.errors.ConfigError`) where that report says the run
    ended (:func:`~fedsim.runtime.deployed.state_owner.refuse_ended_run`).
    """
    scenario = loaded.scenario
    require_public_slots(scenario)
    run = run_name(scenario, run)
    state = Path(state_dir)
    # Read before anything is opened: damage to either stops the start (exit status 2), and
    # so does a run that ended (before its data, ledger or broker: nothing to do).
    previous = read_client_report(state, client_id)
    refuse_ended_run(state, client_id, previous)
    followed = followed_runs(state, previous)
    population = population or build_population(loaded)
    plan = plan_of(population, client_id)
    claim_state_dir(state, client_id)
    ledger = open_ledger(plan, ledger_file(state, client_id))
    first_round = ledger.next_round
    trainer = population.trainer(
        plan, generator=training_generator(population, client_id, first_round), ledger=ledger,
        normalisation_generator=normalisation_generator(
            population.tree, client_id, scenario.privacy.deployed_randomness),
    )
    clock = ScaledClock(options.time_scale, start=ledger.last_time)  # never back in time
    report_file = client_state_file(state, client_id)
    endpoint = _client_endpoint(scenario, population, client_id, broker, run=run,
                                options=options, first_round=first_round,
                                outbox=DurableOutbox(state / "outbox"),
                                followed=FollowedRuns(frozenset(followed),
                                                      _remembering(state, client_id, followed)))
    endpoint.resume_outbox(ledger.rounds)  # what a killed process sent and saw no receipt for
    links = emulated_links(loaded, plan, endpoint, clock, first_round, population)
    _log.info(
        "client starting",
        client=client_id,
        first_round=first_round,
        ledger_rounds=len(ledger.rounds),
        run=run,
    )
    exposure = client_exposure(scenario, [p.client_id for p in population.plans], client_id,
                               deployed=True, time_scale=options.time_scale)

    def make_actor(opened: PrivacyLedger, releases: Releases, through: Endpoint) -> ClientActor:
        # An incarnation's actor: a crash's rejoin makes another (ClientLives).
        return make_client_actor(
            plan, clock=clock, endpoint=through, trainer=trainer, ledger=opened,
            speed_rng=population.tree.numpy("client", client_id, "speed", "from-round",
                                            opened.next_round),
            delta=scenario.privacy.delta, exposure=exposure,
            releases=releases)  # its report lists every released round

    # Made before connecting (it only holds its parts), so every outcome reports it.
    lives = ClientLives(
        plan, trainer, ledger, clock=clock, make_actor=make_actor,
        endpoint=links if links is not None else endpoint,
        reopen=lambda: open_ledger(plan, ledger_file(state, client_id)),
        crash_rng=population.tree.numpy("client", client_id, "crashes", "from-round",
                                        first_round),
        align=_aligner(clock, scenario),  # its clock meets the server's at its first model
        # (and its stop is said on the server's timeline: it cannot go back to meet it)
        timeline=ServerTimeline(clock, _latest_time(scenario), endpoint.incarnation))
    parts = _ClientProcess(scenario, plan, population, clock, endpoint, links, lives,
                           first_round, previous, followed, state)
    made: bool | None = None  # False: a signal came before the first connection
    failure: BaseException | None = None
    try:
        async with connected(endpoint, stop) as made:
            if made:
                await parts.serve(stop, flush_timeout)
    except BaseException as exc:
        failure = exc
        raise
    finally:
        outcome = parts.outcome(made, stop)
        if failure is not None and made is None and isinstance(failure, Exception):
            # Never connected (a refused login, no broker): the report says why (a stranger
            # read "waiting" and an empty reason beside the error the command printed).
            outcome["stop_reason"] = f"could not connect: {failure}"
        lives.record.ledger.close()
        state.mkdir(parents=True, exist_ok=True)
        write_json(report_file, outcome)
    return outcome


@dataclass
class _ClientProcess:
    """The parts of one client process, from its connection to its report."""

    scenario: Scenario
    plan: ClientPlan
    population: Population
    clock: Clock
    endpoint: MqttClientEndpoint
    links: EmulatedLinks | None
    lives: ClientLives
    first_round: int
    previous: dict[str, Any]
    """Its earlier processes' report (empty: none)."""
    followed: list[str]
    """The run incarnations its processes followed, this one's as it comes to follow them
    (:func:`_remembering`): the report says them without reading ``followed.json`` again."""
    state: Path

    @property
    def crashed(self) -> bool:
        """Crashed for good, here or in an earlier process (a resumed launch restarts it)."""
        return self.lives.crashed_for_good or \
            self.previous.get("stop_kind") == ClientStopKind.CRASHED

    async def serve(self, stop: asyncio.Event | None, flush_timeout: float) -> None:
        """Run the client's incarnations until they end, then let what it sent arrive."""
        if not self.crashed:  # a crash for good is for good, resumed or not
            try:
                await self._live(stop)
            except BaseException:
                if self.links is not None:  # its tasks end, what they held is counted lost
                    await self.links.stop()
                raise
        await self._let_arrive(flush_timeout)

    async def _live(self, stop: asyncio.Event | None) -> None:
        """The incarnations, with the process's helpers beside them, until they end, a signal
        or the server's refusal."""
        scenario, plan, endpoint, lives = self.scenario, self.plan, self.endpoint, self.lives
        helpers = [_announce(lives, endpoint, scenario.privacy.delta)]
        if plan.group.availability.online is not None:
            rng = self.population.tree.numpy(
                "client", plan.client_id, "availability", "from-round", self.first_round
            )
            helpers.append(toggle_availability(plan, self.clock, rng, lives.set_online))
        halt = asyncio.Event()  # a signal (stop), the server knows a lost ledger, the
        helpers.append(_halt_when(endpoint.refused(), halt))  # emulated links failed, or
        helpers.append(_halt_when(endpoint.ended(), halt))  # the run it followed had ended
        if self.links is not None:
            helpers.append(_halt_when(self.links.broken(), halt))
        if stop is not None:
            helpers.append(_halt_when(stop.wait(), halt))
        await unless_stopped(alongside(lives.run(), helpers), halt)

    async def _let_arrive(self, flush_timeout: float) -> None:
        """After the incarnations: the uplink's last updates, a crash's status, and the
        server's receipts (none follow the end of the run)."""
        endpoint, lives, client_id = self.endpoint, self.lives, self.plan.client_id
        # One deadline for every wait here: the launcher gives a stopping client
        # FLUSH_TIMEOUT and a little more before it kills it (a review: two waits of a whole
        # flush_timeout each could outlast it, and the report was never written).
        loop = asyncio.get_running_loop()
        deadline = loop.time() + flush_timeout

        def left() -> float:
            return max(0.0, deadline - loop.time())

        await _end_links(self.links, stopped_on_its_own=lives.finished is None
                         and endpoint.refusal is None, timeout=left())
        if endpoint.refusal is not None:
            raise LedgerError(f"{lives.record.ledger.path}: {endpoint.refusal}")
        ended = endpoint.ended_before
        if ended is not None:  # before this process released anything: it trained on nothing
            reason = ended.reason or "no reason given"
            raise run_ended_error(self.state, client_id,
                                  f"at version {ended.version} ({reason})",
                                  "the broker's retained end of the run it followed says")
        if self.links is not None and self.links.failure is not None:
            raise TransportError(f"client {client_id}: its emulated links failed: "
                                 f"{self.links.failure}") from self.links.failure
        if self.crashed:
            await _say_crashed(endpoint, lives, self.scenario.privacy.delta, left())
        if lives.finished is not None:  # its last receipts came before (flat): none follow
            if endpoint.unacknowledged and self.scenario.aggregators.count:
                # ... or trail the end by their aggregator's relay (docs/DEPLOYMENT.md).
                await endpoint.flush(RELAYED_RECEIPTS_WAIT)
            if endpoint.unacknowledged:
                _log.warning("updates not acknowledged before the server finished",
                             client=client_id, rounds=list(endpoint.unacknowledged))
            # No receipt follows the end, and no later process may send them: lost, as a
            # simulation loses what is in flight at its end (the report still lists them).
            endpoint.forget_on_disk()
            await self._say_final()
        elif not await endpoint.flush(left()):
            _log.warning(
                "updates not acknowledged before exit",
                client=client_id,
                rounds=list(endpoint.unacknowledged),
            )

    async def _say_final(self) -> None:
        """Tell the server, which ended the run and waits a little for it, how this client
        ended: its report's state and reason, its rounds and eps, and how many of its released
        updates were never acknowledged (a stranger's ``server.json`` kept every client at
        its last state before the end, and nothing said what was charged and never applied).
        Sent once: a server already gone keeps the last status it had. Sent at the server's
        time as this client knows it (:class:`ServerTimeline`): a server's view of the run
        states the client's stop by it."""
        ledger, delta = self.lives.record.ledger, self.scenario.privacy.delta
        state, _, _, reason = self._final_state()
        with contextlib.suppress(TransportError):
            await self.endpoint.publish(ClientStatus(
                self.plan.client_id, state, ledger.next_round,
                ledger.epsilon(delta), delta, reason, self.lives.server_now(),
                unacknowledged=len(self.endpoint.unacknowledged)))

    def _final_state(self) -> tuple[ClientState, ClientStopKind | None, float | None, str]:
        """The client's state, stop kind, stop time and stop reason after its incarnations."""
        lives = self.lives
        actor = lives.actor
        if self.crashed:
            _, kind, stopped_at = crash_stop(lives)
            return "crashed", kind, stopped_at, CRASHED_FOR_GOOD
        if lives.down:  # down when the run ended (a simulation's state for it: crashed)
            return ("crashed", None, None,
                    DOWN_AT_THE_END if lives.finished is not None else "")
        return actor.state, actor.stop_kind, lives.server_time(actor.stopped_at), \
            actor.stop_reason

    def outcome(self, made: bool | None, stop: asyncio.Event | None) -> dict[str, Any]:
        """The client's report (``client-<id>.json``) after this process."""
        lives, previous, endpoint = self.lives, self.previous, self.endpoint
        released = [*previous.get("released", []), *(asdict(r) for r in lives.kept)]
        finished = lives.finished or endpoint.ended_before
        followed, current = self.followed, endpoint.incarnation.current
        state, kind, stopped_at, reason = self._final_state()
        outcome = {
            "client_id": self.plan.client_id,
            "first_round": self.first_round,
            "state": state,
            "stop_reason": STOPPED_BEFORE_CONNECTING if made is False else reason,
            "stop_kind": kind,
            # A signal is no stop kind of a client (it may resume: ClientStopKind is why one
            # never trains again), but the report says it, as the server's does.
            "signalled": stop is not None and stop.is_set(),
            "stopped_at": stopped_at,
            "crashes": report_count(previous, "crashes") + lives.crashes,
            "ledger_rounds": sorted(lives.record.ledger.rounds),
            "released": released,
            "unacknowledged": list(endpoint.unacknowledged),
            # Counts over every process of this client (a restart, a resumed launch), as its
            # released rounds are (a stranger: a resumed launch's counts were its last part's).
            "mqtt": add_counts(add_counts({}, previous.get("mqtt")), endpoint.stats.as_dict()),
            "randomness": self.scenario.privacy.deployed_randomness,
            # (over every process of this client, as its released rounds are: a restart or
            # a resumed launch counted the last process's alone)
            **{name: report_count(previous, name) + lives.count(name)
               for name in ("timing_overruns", "split_delays", "late_models")},
            "refused": None if endpoint.refusal is None else str(endpoint.refusal),
            # The server's end of the run, once seen (here or by an earlier process): no
            # process goes on from this state directory (state_owner.refuse_ended_run).
            RUN_FINISHED: previous.get(RUN_FINISHED) if finished is None else {
                "version": finished.version, "reason": finished.reason},
            # The run incarnations this client followed (followed.json keeps them as they
            # are confirmed): the broker's retained end of one ends a later process at once.
            "incarnations": followed_incarnations({"incarnations": [
                *followed, *([current] if current and current not in followed else [])]}),
            # The scenario's links, emulated (None: they are perfect, nothing to emulate).
            "emulated_network": None if self.links is None else emulated_totals(
                [previous.get("emulated_network"), self.links.counts()]),
            # A delayed send that failed (logged, and raised to the actor's next call).
            "emulated_send_error": None if self.links is None or self.links.failure is None
            else str(self.links.failure),
        }
        _keep_first_stop(outcome, previous, released_here=bool(lives.kept),
                         ended=endpoint.ended_before is not None)
        return outcome


def _aligner(clock: ScaledClock, scenario: Scenario) -> Callable[[float], None]:
    """What moves the client's clock to its first global model's send time: forward only
    (:meth:`~fedsim.clock.ScaledClock.catch_up`), and not past the latest time any run's
    server can reach (``MAX_WINDOWS`` windows; a review: a server's send time of 1e17 froze
    a client's clock at float's resolution, and with it the release padding)."""
    latest = _latest_time(scenario)

    def align(sent_at: float) -> None:
        if sent_at > latest:
            _log.warning("a global model's send time lies past any run's end: the client's "
                         "clock is not moved to it", sent_at=sent_at, latest=latest)
            return
        clock.catch_up(sent_at)

    return align


def _latest_time(scenario: Scenario) -> float:
    """The latest time any run's server can reach (``MAX_WINDOWS`` windows)."""
    return limits.MAX_WINDOWS * scenario.server.window


def _client_endpoint(scenario: Scenario, population: Population, client_id: str,
                     broker: BrokerSettings, *, run: str, options: DeploymentOptions,
                     first_round: int, outbox: DurableOutbox,
                     followed: FollowedRuns) -> MqttClientEndpoint:
    """The client's MQTT endpoint, with the scenario's limits and the deployment's options."""
    return MqttClientEndpoint(
        broker,
        run=run,
        client_id=client_id,
        expected_params=int(population.initial_params.size),
        max_message_bytes=message_limit(scenario, int(population.initial_params.size)),
        reconnect=reconnect_policy(options),
        resend_after=client_resend_after(scenario, options.time_scale),
        max_staleness=scenario.server.max_staleness,
        seed=population.tree.integer("client", client_id, "mqtt", first_round),
        aggregator=(aggregator_of(client_id, aggregator_ids(scenario.aggregators.count))
                    if scenario.aggregators.count else None),
        recorded_rounds=first_round,
        outbox=outbox,
        followed=followed,
    )


def _remembering(state: Path, client_id: str, followed: list[str]) -> Callable[[str], None]:
    """What keeps each run incarnation the client comes to follow in ``state``
    (:func:`~fedsim.runtime.deployed.state_owner.remember_followed`), and adds it to
    ``followed`` (its report's). A write that fails, or a file damaged since the start, is
    logged and the client goes on: the loss is only that a later process, started after the
    run ended with no report of this one, waits for a welcome instead of exiting (a damaged
    file is left as it is: the next start refuses it)."""
    def remember(incarnation: str) -> None:
        if incarnation not in followed:
            followed.append(incarnation)
        try:
            remember_followed(state, incarnation)
        except (OSError, ConfigError) as exc:
            _log.error("could not keep the run incarnation followed", client=client_id,
                       incarnation=incarnation, error=str(exc))

    return remember


async def _end_links(links: EmulatedLinks | None, *, stopped_on_its_own: bool,
                     timeout: float) -> None:
    """Stop the client's emulated links (not its endpoint, whose outbox still waits for the
    server's receipts); a client that stopped on its own first lets what its uplink holds
    arrive (up to ``timeout`` wall seconds); the rest is lost in flight."""
    if links is None:
        return
    if stopped_on_its_own:
        await links.drain(timeout)
    await links.stop()


def emulated_links(loaded: LoadedScenario, plan: ClientPlan, endpoint: MqttClientEndpoint,
                   clock: Clock, first_round: int, population: Population) -> EmulatedLinks | None:
    """The client's scenario links in front of ``endpoint`` (:mod:`fedsim.transports.emulated`),
    or None where both are perfect. Their draws come from the client's own stream of the seed
    tree, keyed by the round this process starts at (network fates are public)."""
    uplink, downlink = client_links(loaded.scenario.network, plan.group.network)
    if not (imperfect(uplink) or imperfect(downlink)):
        return None
    tree, client_id = population.tree, plan.client_id
    return EmulatedLinks(
        endpoint, uplink=link_model(uplink), downlink=link_model(downlink), clock=clock,
        uplink_rng=tree.numpy("client", client_id, "uplink", "from-round", first_round),
        downlink_rng=tree.numpy("client", client_id, "downlink", "from-round", first_round),
        client_id=client_id)


def _keep_first_stop(outcome: dict[str, Any], previous: dict[str, Any], *,
                     released_here: bool, ended: bool = False) -> None:
    """A client restarted after it had stopped for good keeps the first stop in its report
    (``ended``: this process found its run ended, before it had a model)."""
    if stopped_for_good(previous) and (stopped_for_good(outcome) or ended) \
            and not released_here:
        # Restarted after it had stopped for good (a resumed launch restarts every
        # client): it released nothing, and its stop is the first one's, not this
        # process's clock's (a stranger saw a budget stop move from 253 s to 261 s).
        outcome.update({key: previous.get(key) for key in
                        ("state", "stop_reason", "stop_kind", "stopped_at")})
