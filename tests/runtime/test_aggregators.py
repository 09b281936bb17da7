"""Aggregation nodes (issue 26): the simulated topology against the flat one, lossy and late
aggregators, and the server's checks of partials and manifests."""

from __future__ import annotations

import asyncio
import collections
import copy
import dataclasses
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from structlog.testing import capture_logs

from fedsim.aggregation import ConstantStepSize, UniformWeights
from fedsim.aggregation.mixing import DataSizeWeights
from fedsim.aggregation.policies import TimeWindows
from fedsim.clock import WallClock
from fedsim.protocol.headers import MAX_COUNTER
from fedsim.protocol.messages import (
    ClientStatus,
    ClientUpdate,
    GlobalModel,
    ManifestEntry,
    Partial,
    WindowClose,
)
from fedsim.runtime.actors.aggregator import AggregatorActor
from fedsim.runtime.actors.client_book import Kind
from fedsim.runtime.actors.integrity import ClientLimits, update_norm_bound
from fedsim.runtime.actors.server import ClientInfo, ServerActor
from tests.doubles import RecordingEndpoint
from tests.runtime.test_simulation import run, scenario


def _with_aggregators(data: dict, **aggregators: object) -> dict:
    changed = copy.deepcopy(data)
    changed["aggregators"] = aggregators
    return changed


def _applied_by_window(result) -> list[list[tuple[str, int, int]]]:
    by_version: dict[int, list[tuple[str, int, int]]] = collections.defaultdict(list)
    for client, round_, base, version in result.applied_log:
        by_version[version].append((client, round_, base))
    return [sorted(by_version[v]) for v in sorted(by_version)]


@pytest.mark.parametrize("changes", [{}, {"server.participation": 0.5},
                                     {"server.normalize": "window", "server.mixing": "data_size"}],
                         ids=["shipped-defaults", "invitations", "window-normalised"])
def test_zero_latency_aggregators_give_the_flat_model(tmp_path: Path, changes: dict) -> None:
    data = scenario(**changes)
    flat = run(data, tmp_path / "flat")
    two = run(_with_aggregators(data, count=2), tmp_path / "two")
    # The same updates applied to the same versions, the same counts in every window ...
    assert _applied_by_window(two) == _applied_by_window(flat)
    assert len(flat.applied_log) > 10
    keys = ("window", "version", "received", "applied", "stale", "duplicate", "rejected",
            "dropped_in_flight")
    assert [[m[k] for k in keys] for m in two.metrics] == [[m[k] for k in keys] for m in flat.metrics]
    # ... through both aggregators (one partial per window each) ...
    links = two.summary["network"]["aggregators"]
    windows = len(flat.metrics)
    assert links["uplink"]["delivered"] >= 2 * windows - 2
    # ... and the same model up to float32 rounding of the pre-mixed sums.
    scale = float(np.max(np.abs(flat.final_params)))
    np.testing.assert_allclose(two.final_params, flat.final_params, rtol=0, atol=1e-5 * scale)


def test_lossy_and_late_aggregators_lose_updates_and_never_apply_one_twice(tmp_path: Path) -> None:
    data = scenario()
    # A close and its partial take up to 0.6 s against a wait of 0.3 s: about half the
    # partials miss their window (they join the next one's mix), and a tenth of the messages
    # are lost.
    lossy = run(_with_aggregators(data, count=3, drop=0.1,
                                  latency={"kind": "uniform", "low": 0.0, "high": 0.3}, wait=0.3),
                tmp_path / "lossy")
    keys = [(c, r) for c, r, _, _ in lossy.applied_log]
    assert len(keys) == len(set(keys)), "an update was applied twice"
    applied = lossy.summary["updates"]["applied"]
    assert applied > 0
    # What is lost: the clients' own lost updates and those in partials lost on their link
    # (late ones are not: they join the next window's mix).
    lost = sum(m["dropped_in_flight"] for m in lossy.metrics)
    clients_lost = lossy.summary["network"]["uplink"]["dropped"] \
        + lossy.summary["network"]["uplink"]["lost"]
    assert lost > clients_lost
    assert lossy.summary["network"]["aggregators"]["uplink"]["dropped"] > 0


def test_on_arrival_policies_get_single_updates_through_aggregators(tmp_path: Path) -> None:
    data = scenario(**{"server.aggregation": {"kind": "fedasync", "alpha": 0.5}})
    flat = run(data, tmp_path / "flat")
    two = run(_with_aggregators(data, count=2), tmp_path / "two")
    assert sorted(two.applied_log) == sorted(flat.applied_log)
    np.testing.assert_array_equal(two.final_params, flat.final_params)


# -- the server's checks of partials --------------------------------------------------------

DIM = 4


def _limits() -> ClientLimits:
    return ClientLimits(sampling="poisson", batch_size=8.0, num_samples=100, dim=DIM,
                        clip=lambda r: 1.0, sigma=lambda r: 1.0)


def _server(endpoint: RecordingEndpoint) -> ServerActor:
    clients = {c: ClientInfo(100 * (i + 1), 0.5, limits=_limits()) for i, c in enumerate("abc")}
    return ServerActor(clock=endpoint.clock, endpoint=endpoint, initial_params=np.zeros(DIM),
                       clients=clients, window=1.0, strategy=DataSizeWeights(),
                       step_size=ConstantStepSize(1.0), aggregators=("g0", "g1"),
                       aggregator_wait=0.05)


def _aggregator(endpoint: RecordingEndpoint, clients: str, *, versions: int = 1,
                **options: Any) -> AggregatorActor:
    """Aggregation node "g0" of ``clients`` (one letter each; ``options``' ``slot`` their
    pacing slot, the rest the actor's), uniform weights, time windows, having seen the global
    models of versions 0 .. ``versions`` - 1."""
    slot = {"slot": options.pop("slot")} if "slot" in options else {}
    infos = {c: ClientInfo(100, 0.5, limits=_limits(), **slot) for c in clients}
    actor = AggregatorActor(aggregator_id="g0", clock=endpoint.clock, endpoint=endpoint,
                            clients=infos, size=DIM, strategy=UniformWeights(),
                            policy=TimeWindows(), **options)
    for version in range(versions):
        actor._learn(GlobalModel(version, np.zeros(DIM, np.float32)))
    return actor


def _partial(aggregator: str, entries: list[tuple[str, int, float]], total: np.ndarray,
             window: int = 1) -> Partial:
    return Partial(aggregator, window, (0,) if entries else (),
                   tuple(ManifestEntry(c, r, 0, 0, w) for c, r, w in entries),
                   total.astype(np.float32) if entries else np.zeros(0, np.float32))


def test_the_server_mixes_partials_like_the_updates_they_hold() -> None:
    server = _server(RecordingEndpoint(WallClock()))
    u = {c: np.full(DIM, 0.01 * (i + 1), np.float32) for i, c in enumerate("abc")}
    server._take_partial(_partial("g0", [("a", 0, 100.0), ("b", 0, 200.0)],
                                  0.5 * (100 * u["a"].astype(np.float64) + 200 * u["b"])))
    server._inbox = [ClientUpdate("c", 0, 0, u["c"], 8.0)]  # a forwarded update, judged here
    report = server.close_window()
    assert report.applied == 3 and report.rejected == 0
    expected = -0.5 * (100 * u["a"].astype(np.float64) + 200 * u["b"] + 300 * u["c"]) / 600
    np.testing.assert_allclose(server.params, expected, rtol=1e-6)


def test_a_server_behind_aggregation_nodes_never_streams_a_window() -> None:
    """Its close mixes partials with the updates forwarded to it: an accepted update folded
    into a stream would be left out of that mix (close_window asserts there is none)."""
    import sys

    server = _server(RecordingEndpoint(WallClock()))
    assert server.stream_above == sys.maxsize


@pytest.mark.parametrize("forgery", ["weight", "norm", "twice", "unknown", "future"])
def test_a_forged_partial_is_refused_whole(forgery: str) -> None:
    server = _server(RecordingEndpoint(WallClock()))
    bound = update_norm_bound(sampling="poisson", clip=1.0, sigma=1.0, batch_size=8.0,
                              num_samples=100, dim=DIM)
    small = np.full(DIM, 0.01, np.float64)
    honest = [("a", 0, 100.0), ("b", 0, 200.0)]
    total = 0.5 * 300 * small
    if forgery == "twice":  # the same (client, round) from the other aggregator too
        server._take_partial(_partial("g0", [("a", 0, 100.0)], 50 * small))
    entries = {"weight": [("a", 0, 1e6), ("b", 0, 200.0)],
               "unknown": [("z", 0, 100.0), ("b", 0, 200.0)]}.get(forgery, honest)
    if forgery == "norm":  # just beyond what two honest updates can sum to
        total = np.full(DIM, 1.0001 * 0.5 * 300 * bound / np.sqrt(DIM))
    partial = _partial("g1", entries, total)
    if forgery == "future":
        partial = Partial("g1", 1, (5,), tuple(ManifestEntry(c, r, 5, 0, w) for c, r, w in honest),
                          total.astype(np.float32))
    with capture_logs() as logs:
        server._take_partial(partial)
        report = server.close_window()
    assert report.rejections.get(Kind.BAD_PARTIAL) == 2
    assert report.applied == (1 if forgery == "twice" else 0)
    assert any(entry["event"] == "partial refused" for entry in logs)


def test_a_late_partial_joins_the_next_mix_and_a_silent_aggregator_is_not_waited_for() -> None:
    async def scenario_() -> tuple[list[int], list[int], list[float]]:
        endpoint = RecordingEndpoint(WallClock())
        server = _server(endpoint)
        lost, applied, waits = [], [], []
        late = _partial("g0", [("a", 0, 100.0)], 50 * np.ones(DIM) * 0.01, window=1)
        for window in (1, 2, 3):
            started = endpoint.clock.now()
            # nobody answers in time: g0 and g1 are silent
            await server.partials.gather(server.clock, server.endpoint,
                                         server.windows_closed + 1, server.version)
            waits.append(endpoint.clock.now() - started)
            report = server.close_window()
            lost.append(report.lost_in_partials)
            applied.append(report.applied)
            if window == 1:  # g0 answers window 1 after it closed, twice (a network duplicate)
                server._take_partial(late)
                server._take_partial(late)
        server.ended = True  # after the end of the run, a partial is lost in flight
        server._take_partial(_partial("g1", [("b", 0, 200.0)], np.ones(DIM), window=3))
        lost.append(server.close_window().lost_in_partials)
        assert [type(m) for _, m in endpoint.published] == [WindowClose] * 3
        return lost, applied, waits

    lost, applied, waits = asyncio.run(scenario_())
    assert applied == [0, 1, 0]  # the late partial's update, once, with window 2
    assert lost == [0, 0, 0, 1]
    assert waits[0] >= 0.05  # waited its bound for both; then only for g0 (live again)


def test_a_late_partial_whose_base_grew_too_stale_counts_as_stale() -> None:
    server = ServerActor(
        clock=WallClock(), endpoint=RecordingEndpoint(WallClock()), initial_params=np.zeros(DIM),
        clients={c: ClientInfo(100, 0.5, limits=_limits()) for c in "ab"}, window=1.0,
        strategy=DataSizeWeights(), step_size=ConstantStepSize(1.0), aggregators=("g0",),
        max_staleness=0)
    server.book.publish(0)
    server._inbox = [ClientUpdate("b", 0, 0, np.full(DIM, 0.01, np.float32), 8.0)]
    assert server.close_window().applied == 1  # version 0 -> 1: base 0 is now stale
    server._take_partial(_partial("g0", [("a", 0, 100.0)], 50 * np.ones(DIM) * 0.01, window=1))
    report = server.close_window()
    assert (report.applied, report.stale, report.rejected) == (0, 1, 0)
    assert server.book.judge_entry("a", 0, 0, 0).kind is Kind.DUPLICATE  # judged for good


def test_an_aggregator_folds_what_passes_and_forwards_what_only_the_server_can_judge() -> None:
    async def scenario_() -> Partial:
        endpoint = RecordingEndpoint(WallClock())
        actor = _aggregator(endpoint, "ab", max_staleness=2)
        ok = np.full(DIM, 0.01, np.float32)
        for update in (ClientUpdate("a", 0, 0, ok, 8.0), ClientUpdate("a", 0, 0, ok, 8.0),
                       ClientUpdate("b", 0, 0, np.full(DIM, 1e3, np.float32), 8.0),
                       ClientUpdate("b", 1, 7, ok, 8.0), ClientUpdate("z", 0, 0, ok, 8.0)):
            await actor._arrived(update)
        partial = await actor.flush(WindowClose(1, 0))
        forwarded = [m for _, m in endpoint.published if isinstance(m, ClientUpdate)]
        assert [(m.client_id, m.round) for m in forwarded] == [("b", 1)]  # future version
        return partial

    partial = asyncio.run(scenario_())
    assert [(e.client_id, e.round, e.weight) for e in partial.entries] == [("a", 0, 1.0)]
    np.testing.assert_allclose(partial.sums, 0.5 * 0.01, rtol=1e-6)
    assert partial.rejections == {"duplicate": 1, "norm": 1, "unknown_client": 1}


def test_a_rejoining_aggregator_forwards_what_its_predecessor_may_have_folded() -> None:
    """Joining at window 5 (server version 3): updates on versions <= 3 go to the server alone
    (it may have applied them from the predecessor's partial); newer ones are folded. A resend
    of an update judged here before goes to the server too (for its receipt); a copy within the
    same partial stops here."""
    async def scenario_() -> tuple[Partial, Partial, list[tuple[str, int]]]:
        endpoint = RecordingEndpoint(WallClock())
        actor = _aggregator(endpoint, "ab", versions=5)
        ok = np.full(DIM, 0.01, np.float32)
        for update in (ClientUpdate("a", 0, 3, ok, 8.0), ClientUpdate("b", 0, 4, ok, 8.0),
                       ClientUpdate("b", 0, 4, ok, 8.0)):
            await actor._arrived(update)
        first = await actor.flush(WindowClose(5, 3))
        await actor._arrived(ClientUpdate("b", 0, 4, ok, 8.0))  # a resend, next window
        second = await actor.flush(WindowClose(6, 4))
        forwarded = [(m.client_id, m.round) for _, m in endpoint.published
                     if isinstance(m, ClientUpdate)]
        return first, second, forwarded

    first, second, forwarded = asyncio.run(scenario_())
    assert [(e.client_id, e.base_version) for e in first.entries] == [("b", 4)]
    assert first.rejections == {"duplicate": 1}  # the copy in the same partial
    assert forwarded == [("a", 0), ("b", 0)]  # base 3 alone; then the resend of b's round 0
    assert second.entries == () and second.rejections == {}


def test_a_partial_overtaken_by_a_later_one_still_joins_once() -> None:
    """Network reordering (an aggregator link's ``reorder``) can deliver window 1's partial
    after window 2's: it joins the mix like a late partial, once; a duplicate of it is ignored;
    one older than the remembered horizon is ignored, logged (it may be a duplicate of one
applied: counting it as lost would be wrong)."""
    from fedsim.runtime.actors.partials import TAKEN_HORIZON

    server = _server(RecordingEndpoint(WallClock()))
    server.windows_closed = 1  # window 2 is closing
    u = 0.01 * np.ones(DIM)
    server._take_partial(_partial("g0", [("a", 1, 100.0)], 100 * u, window=2))
    server._take_partial(_partial("g0", [("a", 0, 100.0)], 100 * u, window=1))
    server._take_partial(_partial("g0", [("a", 0, 100.0)], 100 * u, window=1))  # duplicate
    server._take_partial(_partial("g0", [("a", 1, 100.0)], 100 * u, window=2))  # duplicate
    assert server.partials.held == [("g0", 1), ("g0", 2)]
    report = server.close_window()
    assert report.applied == 2 and report.rejected == 0 and report.lost_in_partials == 0
    server.windows_closed = TAKEN_HORIZON + 5
    server._take_partial(_partial("g0", [("b", 0, 200.0)], 200 * u, window=TAKEN_HORIZON + 5))
    with capture_logs() as logs:
        server._take_partial(_partial("g0", [("c", 0, 100.0)], 100 * u, window=3))
    assert report.lost_in_partials == 0 and server.partials.lost == 0
    assert ("g0", 3) not in server.partials.held
    assert any("older than the windows" in entry["event"] for entry in logs)


def test_updates_past_what_one_partial_may_carry_go_to_the_server_alone(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A partial carries at most the codec's MAX_PARTIAL_ENTRIES folded updates (and as many
    settled, at most MAX_PARTIAL_GROUPS base versions): past that the aggregator forwards the
    updates unmixed, for the server to judge, instead of building a partial no codec sends."""
    from fedsim.runtime.actors import aggregator as aggregator_module

    monkeypatch.setattr(aggregator_module, "MAX_PARTIAL_ENTRIES", 2)

    async def scenario_() -> tuple[Partial, list[tuple[str, int]]]:
        endpoint = RecordingEndpoint(WallClock())
        actor = _aggregator(endpoint, "abcd")
        ok = np.full(DIM, 0.01, np.float32)
        for client in "abcd":
            await actor._arrived(ClientUpdate(client, 0, 0, ok, 8.0))
        partial = await actor.flush(WindowClose(1, 0))
        forwarded = [(m.client_id, m.round) for _, m in endpoint.published
                     if isinstance(m, ClientUpdate)]
        return partial, forwarded

    partial, forwarded = asyncio.run(scenario_())
    assert [(e.client_id, e.round) for e in partial.entries] == [("a", 0), ("b", 0)]
    assert forwarded == [("c", 0), ("d", 0)]


def test_base_versions_past_max_groups_go_to_the_server_alone() -> None:
    """An aggregator sends no more sums than its ``max_groups`` (what the server's message
    limit takes: ``codec.partial_groups``): an update of a further base version is forwarded
    unmixed, and the partial's bases are the first ``max_groups`` met."""
    async def scenario_() -> tuple[Partial, list[tuple[str, int]]]:
        endpoint = RecordingEndpoint(WallClock(), wire=True)
        actor = _aggregator(endpoint, "abcd", versions=3, max_groups=2)
        ok = np.full(DIM, 0.01, np.float32)
        for client, base in zip("abcd", (0, 1, 2, 1), strict=True):
            await actor._arrived(ClientUpdate(client, 0, base, ok, 8.0))
        partial = await actor.flush(WindowClose(1, 2))
        forwarded = [(m.client_id, m.base_version) for _, m in endpoint.published
                     if isinstance(m, ClientUpdate)]
        return partial, forwarded

    partial, forwarded = asyncio.run(scenario_())
    assert partial.bases == (0, 1)
    assert sorted((e.client_id, e.base_version) for e in partial.entries) == [
        ("a", 0), ("b", 1), ("d", 1)]
    assert forwarded == [("c", 2)]
    with pytest.raises(ValueError, match="max_groups"):
        AggregatorActor(aggregator_id="g0", clock=WallClock(), endpoint=RecordingEndpoint(
            WallClock()), clients={}, size=DIM, strategy=UniformWeights(), policy=TimeWindows(),
            max_groups=0)




def _server_and_aggregator() -> tuple[ServerActor, AggregatorActor]:
    """A server behind one aggregation node "g0", both speaking through the codec."""
    clients = {c: ClientInfo(100, 0.5, limits=_limits()) for c in "abc"}
    server_side = RecordingEndpoint(WallClock(), wire=True)
    server = ServerActor(clock=server_side.clock, endpoint=server_side,
                         initial_params=np.zeros(DIM), clients=clients, window=1.0,
                         strategy=DataSizeWeights(), step_size=ConstantStepSize(1.0),
                         aggregators=("g0",), aggregator_wait=0.01)
    aggregator_side = RecordingEndpoint(WallClock(), wire=True)
    aggregator = AggregatorActor(aggregator_id="g0", clock=aggregator_side.clock,
                                 endpoint=aggregator_side, clients=clients, size=DIM,
                                 strategy=DataSizeWeights(), policy=TimeWindows())
    aggregator._learn(GlobalModel(0, np.zeros(DIM, np.float32)))
    return server, aggregator


async def _window(server: ServerActor, aggregator: AggregatorActor,
                  updates: list[ClientUpdate], adopt_after_close: bool = False):
    """One time window through the node: its updates reach the aggregator, the server closes
    it (``adopt_after_close``: c's far status lands between the close and the partial), the
    aggregator answers with its partial and forwards what it does not fold."""
    for update in updates:
        await aggregator._arrived(update)
    published = len(server.endpoint.published)
    await server.partials.gather(server.clock, server.endpoint, server.windows_closed + 1,
                                 server.version)
    (_, close), = server.endpoint.published[published:]
    if adopt_after_close:
        assert server.accept_status(ClientStatus("c", "waiting", 2000, 0.0, 1e-5))
    sent = len(aggregator.endpoint.published)
    await aggregator.flush(close)
    for _, message in aggregator.endpoint.published[sent:]:
        if isinstance(message, Partial):
            server._take_partial(message)
        else:
            server._inbox.append(message)  # forwarded unmixed
    report = server.close_window()
    await server.broadcast()  # the next window's model, which the aggregator learns
    aggregator._learn(server.endpoint.published[-1][1])
    return close, report


def test_a_client_adopted_at_a_far_count_cannot_get_its_neighbours_partial_refused() -> None:
    """Session 56's finding: a client whose first status claims 2,000 rounds is adopted by the
    server (its rounds below 2,000 count as judged there); the aggregator never sees statuses
    and folded its rounds 0, 1, ... beside the honest ones, and every such group was refused
    whole (eight windows without a model in a deployed run). The server now names the
    client's watermark in its next close and the aggregator forwards those rounds alone."""
    ok = np.full(DIM, 0.01, np.float32)

    async def scenario_():
        server, aggregator = _server_and_aggregator()
        assert server.accept_status(ClientStatus("c", "waiting", 2000, 0.0, 1e-5))
        windows = []
        for r in range(3):
            windows.append(await _window(server, aggregator, [
                ClientUpdate("a", r, server.version, ok, 8.0),
                ClientUpdate("b", r, server.version, ok, 8.0),
                ClientUpdate("c", r, server.version, ok, 8.0)]))
        return windows

    windows = asyncio.run(scenario_())
    # Named in the close after its status, and in every close after (a restarted aggregator).
    assert [close.watermarks for close, _ in windows] == [(("c", 2000),)] * 3
    for _, report in windows:
        assert Kind.BAD_PARTIAL not in report.rejections
        assert (report.applied, report.duplicate) == (2, 1)  # a and b; c's round judged alone


def test_a_far_status_between_a_close_and_its_partial_costs_its_group_one_window() -> None:
    """The status lands after the close was sent: that window's group is refused whole (the
    server cannot take one entry out of a sum). The next close names the client (every round
    of it judged by the server alone from then on) and the refused group: the aggregator
    forwards the group's updates, the honest ones are applied then, once (their clients'
    later resends are duplicates), and no group is refused again."""
    ok = np.full(DIM, 0.01, np.float32)

    async def scenario_():
        server, aggregator = _server_and_aggregator()
        first = await _window(server, aggregator, [ClientUpdate(c, 0, 0, ok, 8.0) for c in "abc"],
                              adopt_after_close=True)
        second = await _window(server, aggregator, [ClientUpdate("c", 1, 0, ok, 8.0)])
        third = await _window(server, aggregator, [
            ClientUpdate("a", 0, 0, ok, 8.0),  # a's resend (its receipt came late)
            *(ClientUpdate(c, r, server.version, ok, 8.0)
              for c, r in (("a", 1), ("b", 1), ("c", 2001)))])
        return first, second, third, server, aggregator

    first, second, third, server, aggregator = asyncio.run(scenario_())
    assert first[1].rejections == {Kind.BAD_PARTIAL: 3} and first[1].applied == 0
    assert second[0].watermarks == (("c", MAX_COUNTER),)  # all its rounds alone from now on
    assert second[0].refused == (("g0", 1, 0),) and aggregator.resent == 3
    assert Kind.BAD_PARTIAL not in second[1].rejections
    assert (second[1].applied, second[1].duplicate) == (2, 2)  # a's, b's; c's 0 and 1
    # c's round 2001, past its adopted 2,000, forwarded alone and applied like any.
    assert Kind.BAD_PARTIAL not in third[1].rejections
    assert (third[1].applied, third[1].duplicate) == (3, 1)
    applied = [(c, r) for _, report in (first, second, third) for c, r, _ in report.applied_updates]
    assert sorted(applied) == [("a", 0), ("a", 1), ("b", 0), ("b", 1), ("c", 2001)]  # each once
    assert third[0].refused == ()


def test_a_late_partials_refused_group_is_replayed_too() -> None:
    """The third review: a partial that reaches the server after its window closed is judged
    at the next close, so its refusal is named one close later; the aggregator kept only its
    last partial's updates, and the honest ones waited for their clients' resends. It keeps
    the last two."""
    ok = np.full(DIM, 0.01, np.float32)

    async def scenario_():
        server, aggregator = _server_and_aggregator()
        reports = []
        for window in (1, 2, 3):
            if window == 1:
                for c in "abc":
                    await aggregator._arrived(ClientUpdate(c, 0, 0, ok, 8.0))
            published = len(server.endpoint.published)
            await server.partials.gather(server.clock, server.endpoint, window, server.version)
            (_, close), = server.endpoint.published[published:]
            if window == 1:  # c's far status lands between the close and its partial
                assert server.accept_status(ClientStatus("c", "waiting", 2000, 0.0, 1e-5))
            sent = len(aggregator.endpoint.published)
            await aggregator.flush(close)
            messages = [m for _, m in aggregator.endpoint.published[sent:]]
            if window == 1:
                late = messages  # window 1's partial arrives after its close
                messages = []
            elif window == 2:
                messages += late
            for message in messages:
                if isinstance(message, Partial):
                    server._take_partial(message)
                else:
                    server._inbox.append(message)
            reports.append((close, server.close_window()))
            await server.broadcast()
            aggregator._learn(server.endpoint.published[-1][1])
        return reports, aggregator

    reports, aggregator = asyncio.run(scenario_())
    assert reports[1][1].rejections == {Kind.BAD_PARTIAL: 3}  # the late partial, judged now
    assert reports[2][0].refused == (("g0", 1, 0),) and aggregator.resent == 3
    assert (reports[2][1].applied, reports[2][1].duplicate) == (2, 1)  # a's and b's; c's


def test_a_client_whose_forwarded_round_the_server_refused_is_judged_alone_after() -> None:
    """The second review's leap: round 1,100 (more than 1,024 ahead of the 0 rounds known)
    is forwarded for the server to judge, which refuses it, while the aggregator counts it
    judged; its next leap, round 2,000, was then folded beside the neighbours' and refused with
    them. The server now names a client whose forwarded update it refuses so (all its rounds):
    round 2,000 is forwarded, judged alone."""
    ok = np.full(DIM, 0.01, np.float32)

    async def scenario_():
        server, aggregator = _server_and_aggregator()
        first = await _window(server, aggregator, [
            ClientUpdate("a", 0, 0, ok, 8.0), ClientUpdate("b", 0, 0, ok, 8.0),
            ClientUpdate("c", 1100, 0, ok, 8.0)])
        second = await _window(server, aggregator, [
            ClientUpdate(c, r, server.version, ok, 8.0)
            for c, r in (("a", 1), ("b", 1), ("c", 2000))])
        return first[1], second[1]

    first, second = asyncio.run(scenario_())
    assert first.applied == 2 and first.rejections == {Kind.ROUND_AHEAD: 1}
    assert second.applied == 2 and second.rejections == {Kind.ROUND_AHEAD: 1}  # c's, alone


def test_a_round_the_server_passed_over_is_not_folded_and_a_new_aggregator_learns_rounds(
        ) -> None:
    """The third review: a kept status claiming 1,025 rounds lets round 1,500 through at the
    server (the aggregator, which knows 1, forwards it), and the server's book passes over the
    rounds below 477; round 1 was then folded and its group refused. The aggregator records
    what it forwards as judged, as the server does, so round 1 is a duplicate there too. And a
    fresh aggregator (a restart) facing clients past round 1,024 forwards each one's first
    update, then folds the next ones (not forwarded for ever)."""
    ok = np.full(DIM, 0.01, np.float32)

    async def scenario_():
        server, aggregator = _server_and_aggregator()
        await _window(server, aggregator, [ClientUpdate(c, 0, 0, ok, 8.0) for c in "abc"])
        assert server.accept_status(ClientStatus("c", "waiting", 1025, 0.0, 1e-5))
        passed = await _window(server, aggregator, [ClientUpdate("c", 1500, 1, ok, 8.0)])
        after = await _window(server, aggregator, [ClientUpdate(c, 1, 2, ok, 8.0) for c in "abc"])
        return passed[1], after[1]

    passed, after = asyncio.run(scenario_())
    assert passed.applied == 1  # c's 1,500, within its status's 1,025 + 1,024
    assert Kind.BAD_PARTIAL not in after.rejections
    assert (after.applied, after.duplicate) == (2, 1)  # a's and b's; c's round 1 judged before

    async def restarted():
        server, aggregator = _server_and_aggregator()
        for client in "ab":  # long-running clients: the server has their rounds to 1,499
            server.book.record(client, 1499)
            aggregator.book.version = server.version
        folded, forwarded = [], []
        for r in range(1500, 1503):
            sent = aggregator.forwarded
            await _window(server, aggregator, [ClientUpdate(c, r, server.version, ok, 8.0)
                                               for c in "ab"])
            folded.append(aggregator.folded)
            forwarded.append(aggregator.forwarded - sent)
        return folded, forwarded

    folded, forwarded = asyncio.run(restarted())
    assert forwarded == [2, 0, 0] and folded == [0, 2, 4]


def test_every_client_with_an_entry_refused_is_named_and_names_take_turns() -> None:
    """Two leaping clients in one group: both are named at the next close (naming the first
    alone cost one more refused window a client). More names than a close may carry are
    sent new ones first, then in turn, so every aggregator hears of each one."""
    from fedsim.protocol.headers import MAX_CLOSE_WATERMARKS
    from fedsim.runtime.actors.partials import CloseNotes

    server = _server(RecordingEndpoint(WallClock()))
    server.book.record("a", 0)  # and nothing of b or c: their round 2,000 is round_ahead
    server._take_partial(_partial("g0", [("a", 1, 100.0), ("b", 2000, 200.0), ("c", 2000, 300.0)],
                                  np.full(DIM, 0.001)))
    report = server.close_window()
    assert report.rejections == {Kind.BAD_PARTIAL: 3}
    watermarks, refused = server.partials.notes.take()
    assert watermarks == (("b", MAX_COUNTER), ("c", MAX_COUNTER)) and refused == (("g0", 1, 0),)

    notes = CloseNotes()
    clients = [f"c{i:04d}" for i in range(MAX_CLOSE_WATERMARKS + 100)]
    for client in clients:
        notes.hold_back(client, 2000)
    first = {c for c, _ in notes.take()[0]}
    notes.hold_back("late", 7)
    second = [c for c, _ in notes.take()[0]]
    assert len(first) == len(second) == MAX_CLOSE_WATERMARKS
    assert set(second[:101]) == {*clients[MAX_CLOSE_WATERMARKS:], "late"}  # the new ones first
    third = {c for c, _ in notes.take()[0]}
    assert first | set(second) | third == {*clients, "late"}  # every name within three closes


def test_a_window_close_names_watermarks_on_the_wire_within_its_bounds() -> None:
    """A close without watermarks is the frame it was before them; one with them travels
    whole; more than the header allows, or an id no client may have, is refused."""
    from fedsim.errors import CodecError
    from fedsim.protocol import codec
    from fedsim.protocol.headers import MAX_CLOSE_REFUSED, MAX_CLOSE_WATERMARKS

    plain = codec.encode(WindowClose(3, 2, 1.5), incarnation="ab")
    assert b"watermarks" not in plain and b"refused" not in plain
    assert codec.decode(plain) == WindowClose(3, 2, 1.5)
    named = WindowClose(3, 2, 1.5, (("c-1", 2000), ("c-2", 7)), (("aggregator-0", 2, 1),))
    assert codec.decode(codec.encode(named, incarnation="ab")) == named
    for bad in ((("c", 1),) * (MAX_CLOSE_WATERMARKS + 1), (("no/slash", 1),), (("c", -1),)):
        with pytest.raises(CodecError):
            codec.encode(WindowClose(3, 2, 1.5, bad), incarnation="ab")
    with pytest.raises(CodecError):
        codec.encode(WindowClose(3, 2, 1.5, (), (("a", 1, 1),) * (MAX_CLOSE_REFUSED + 1)),
                     incarnation="ab")


def test_a_window_holds_a_bounded_share_of_one_clients_flood() -> None:
    """A client floods its aggregator within one time window (an attacker's review of the
    deployed aggregator: every copy was held, decoded, until the close, and each copy of a
    judged round forwarded to the server): 2,000 new rounds and 2,000 resends of one. The
    window holds what the pacer lets through or makes wait (256) and one copy of the resent
    round; the rest is counted (``rate``, ``duplicate``); the honest client's update is folded."""
    flood = 2_000

    async def scenario_() -> tuple[Partial, int, int]:
        endpoint = RecordingEndpoint(WallClock())
        actor = _aggregator(endpoint, "ab", slot=3600.0)
        ok = np.full(DIM, 0.01, np.float32)
        await actor._arrived(ClientUpdate("b", 0, 0, ok, 8.0))
        for r in range(flood):
            await actor._arrived(ClientUpdate("a", r, 0, ok, 8.0))
        for _ in range(flood):
            await actor._arrived(ClientUpdate("a", 0, 0, ok, 8.0))
        held, noted = len(actor._held), len(actor.pacer._noted)
        return await actor.flush(WindowClose(1, 0)), held, noted

    partial, held, noted = asyncio.run(scenario_())
    assert held == noted == 1 + 1 + 256  # b's, a's round 0 (its token), a's 256 waiting
    assert partial.rejections == {"duplicate": flood, "rate": flood - 1 - 256}
    assert partial.waiting == 256  # (said beside them: the server bounds what it counts)
    assert sorted((e.client_id, e.round) for e in partial.entries) == [("a", 0), ("b", 0)]


def test_differing_copies_of_a_held_round_are_forked_not_held() -> None:
    """Copies of a round held for the close that differ in base version or norm passed the
    resend check and were all held, decoded, until the close (a review: 2,000 of them); now
    one copy a round is held and the others are counted ``forked`` at once, as the close's
    client book would rule them."""
    copies = 2_000

    async def scenario_() -> tuple[Partial, int]:
        endpoint = RecordingEndpoint(WallClock())
        actor = _aggregator(endpoint, "ab", slot=3600.0)
        await actor._arrived(ClientUpdate("b", 0, 0, np.full(DIM, 0.01, np.float32), 8.0))
        for index in range(copies):  # each copy another update: another norm (as decoded)
            values = np.full(DIM, 0.01 + 1e-4 * index, np.float32)
            await actor._arrived(ClientUpdate("a", 0, 0, values, 8.0,
                                              norm=float(np.linalg.norm(values))))
        held = len(actor.pacer._noted)  # what the close will judge
        return await actor.flush(WindowClose(1, 0)), held

    partial, held = asyncio.run(scenario_())
    assert held == 2  # b's round 0 and a's first copy
    assert partial.rejections == {"forked": copies - 1}
    assert sorted((e.client_id, e.round) for e in partial.entries) == [("a", 0), ("b", 0)]


@pytest.mark.parametrize("order", ["newest first", "oldest first"])
def test_an_aggregator_gets_a_bounded_number_of_late_partials_held(order: str) -> None:
    """A compromised aggregator silent for many windows, then sending a partial of each (up to
    64 sums apiece), had every one held until the next close (whatever the order: oldest first
    each is 'ahead' of the last): past MAX_LATE_PARTIALS a late one is refused, counted and
    logged, and remembered as taken (a copy is ignored); the closing window's own partial is
    always held."""
    from fedsim.runtime.actors.partials import MAX_LATE_PARTIALS

    server = _server(RecordingEndpoint(WallClock()))
    server.windows_closed = 99  # window 100 is closing
    u = 0.01 * np.ones(DIM)
    late = range(99, 79, -1) if order == "newest first" else range(80, 100)
    with capture_logs() as logs:
        server._take_partial(_partial("g1", [("b", 0, 200.0)], 200 * u, window=100))
        for window in late:
            server._take_partial(_partial("g0", [("a", window, 100.0)], 100 * u, window=window))
        server._take_partial(_partial("g0", [("c", 0, 300.0)], 300 * u, window=100))
    held = [window for aggregator, window in server.partials.held if aggregator == "g0"]
    assert held == sorted([*late[:MAX_LATE_PARTIALS], 100])
    assert server.partials.held.count(("g1", 100)) == 1  # another aggregator's: untouched
    refused = len(late) - MAX_LATE_PARTIALS
    assert sum("past the bound" in entry["event"] for entry in logs) == refused
    report = server.close_window()
    assert report.rejections.get(Kind.BAD_PARTIAL) == refused
    # A copy of a refused one after the close is ignored, as a duplicate of one taken: its
    # updates come back as their clients' resends, forwarded one by one.
    window = late[MAX_LATE_PARTIALS]
    server._take_partial(_partial("g0", [("a", window, 100.0)], 100 * u, window=window))
    assert ("g0", window) not in server.partials.held


def test_one_aggregators_refused_groups_cannot_crowd_another_out_of_a_close() -> None:
    """A hostile aggregator gets 320 groups refused between two closes (five partials of 64)
    after an honest one had two refused: the close, which names at most 256, names the honest
    aggregator's two (it kept the newest 256, all the hostile one's), and the rest of its
    room goes to the flood, newest first, in the order refused."""
    from fedsim.protocol.headers import MAX_CLOSE_REFUSED
    from fedsim.runtime.actors.partials import CloseNotes

    notes = CloseNotes()
    notes.refused("honest", 4, 3)
    notes.refused("other", 4, 2)
    notes.refused("honest", 5, 4)
    flood = [("hostile", 5, base) for base in range(320)]
    for group in flood:
        notes.refused(*group)
    _, refused = notes.take()
    assert len(refused) == MAX_CLOSE_REFUSED
    assert refused[:3] == (("honest", 4, 3), ("other", 4, 2), ("honest", 5, 4))
    assert refused[3:] == tuple(flood[-(MAX_CLOSE_REFUSED - 3):])
    assert notes.take()[1] == ()  # taken once
    few = [("a", 1, 1), ("b", 1, 2), ("a", 2, 1)]
    for group in few:
        notes.refused(*group)
    assert notes.take()[1] == tuple(few)  # within the bound: all of them, as refused



# -- updates deferred at an aggregator and the stop on spent budgets ------------------------

SLOT = 2.5


def _deferred_run(*, hostile: bool, windows: int) -> tuple[list, list[Partial]]:
    """A server behind one aggregation node "g0" on the simulated network (every message as
    the codec's bytes), under virtual time, windows of 1 s; clients a and b paced at a public
    slot of 2.5 s at both. Every client has said its budget is spent (a: 2 rounds released, b: 1), so
    no client can train. a's two rounds reach the aggregator together (an outbox replaying
    after a reconnect): its round 1 waits there for a's next token (at 0.2 + 2.5 s).
    ``hostile``: a's round 1 never comes (lost with its client) and a hostile aggregator claims
    2**40 deferred updates in every partial. The server's first ``windows`` reports and the
    partials it received."""
    from fedsim.runtime.simulated.kernel import VirtualClock, run_virtual
    from fedsim.transports.link_model import LinkModel
    from fedsim.transports.simulated import SimulatedNetwork

    ok = np.full(DIM, 0.01, np.float32)

    async def main(clock: VirtualClock) -> tuple[list, list[Partial]]:
        network = SimulatedNetwork(clock, rng=np.random.default_rng(0), uplink=LinkModel(),
                                   downlink=LinkModel(), aggregators=("g0",), wire_bytes=True)
        clients = {c: ClientInfo(100, 0.5, limits=_limits(), slot=SLOT) for c in "ab"}
        server_side = network.server_endpoint()
        received: list[Partial] = []
        inner_receive = server_side.receive

        async def receive():  # (the server's own endpoint; the test notes the partials)
            message = await inner_receive()
            if isinstance(message, Partial):
                received.append(message)
            return message

        server_side.receive = receive  # type: ignore[method-assign]
        server = ServerActor(clock=clock, endpoint=server_side, initial_params=np.zeros(DIM),
                             clients=clients, window=1.0, strategy=DataSizeWeights(),
                             step_size=ConstantStepSize(1.0), aggregators=("g0",),
                             aggregator_wait=0.05, max_staleness=10)
        aggregator_side = network.aggregator_endpoint("g0")
        aggregator = AggregatorActor(aggregator_id="g0", clock=clock, endpoint=aggregator_side,
                                     clients=clients, size=DIM, strategy=DataSizeWeights(),
                                     policy=TimeWindows())
        if hostile:
            honest_publish = aggregator_side.publish

            async def publish(message):  # the impostor's claim, in every partial
                if isinstance(message, Partial):
                    message = dataclasses.replace(message, waiting=2**40)
                await honest_publish(message)

            aggregator_side.publish = publish  # type: ignore[method-assign]
        a, b = network.client_endpoint("a"), network.client_endpoint("b")
        for endpoint, rounds in ((a, 2), (b, 1)):
            await endpoint.publish(ClientStatus(endpoint.client_id, "budget_exhausted", rounds,
                                                  1.0, 1e-5))
        reports: list = []
        serving = asyncio.ensure_future(aggregator.run())
        running = asyncio.ensure_future(
            server.run(lambda r: reports.append(r) or r.window >= windows))
        await clock.sleep(0.2)
        await a.publish(ClientUpdate("a", 0, 0, ok, 8.0))
        if not hostile:
            await a.publish(ClientUpdate("a", 1, 0, ok, 8.0))  # a replay's bunch: deferred
        await clock.sleep(0.2)
        await b.publish(ClientUpdate("b", 0, 0, ok, 8.0))
        await running
        serving.cancel()
        return reports, received

    return run_virtual(main)


def _stop_kinds(reports: list) -> list:
    from fedsim.config.schema import Stop

    stop = Stop(windows=60)  # all_budgets_spent is on by default
    return [None if (v := r.stop_reason(stop, active_clients=0)) is None else v.kind
            for r in reports]


def test_the_stop_on_spent_budgets_waits_for_an_update_deferred_at_an_aggregator() -> None:
    """An update its aggregator's pacer deferred was not counted by the server's quiet rule:
    the run stopped on spent budgets (window 2: nothing accepted, nothing waiting at the
    server) while the aggregator held an honest update it would forward at window 3. Each
    partial now says what its aggregator holds deferred; the stop waits for it and the update
    is applied."""
    from fedsim.runtime.actors.stops import RunStopKind

    reports, partials = _deferred_run(hostile=False, windows=5)
    kinds = _stop_kinds(reports)
    applied = [[(c, r) for c, r, _ in report.applied_updates] for report in reports]
    assert applied[:3] == [[("a", 0), ("b", 0)], [], [("a", 1)]]
    # Window 2 accepted nothing; a's round 1 waited at the aggregator through it, as its
    # partial said (on the wire), and the server counted it ...
    assert [p.waiting for p in partials[:3]] == [1, 1, 0]
    assert [(r.accepted, r.waiting, r.waiting_at_aggregators) for r in reports[:4]] == [
        (2, 1, 1), (0, 1, 1), (1, 0, 0), (0, 0, 0)]
    # ... so the run stops on spent budgets only once it is applied (without the claim:
    # at window 2, with a's round 1 never applied)
    assert kinds[:4] == [None, None, None, RunStopKind.BUDGETS_SPENT]
    assert all("waiting" not in r.rejections for r in reports)  # (a count, not a rejection)


def test_an_aggregators_claim_of_deferred_updates_cannot_hold_the_stop_for_ever() -> None:
    """A hostile aggregator claims 2**40 deferred updates in every partial while a's round 1,
    released by its status, never arrives. The server counts at most the released updates it
    has not judged (here 1) and only for as many windows in a row as an honest aggregator's
    queue of that many takes to drain (one slot of 2.5 s: 3 windows, plus 2), then stops."""
    from fedsim.runtime.actors.partials import deferred_hold_windows
    from fedsim.runtime.actors.stops import RunStopKind

    reports, partials = _deferred_run(hostile=True, windows=12)
    kinds = _stop_kinds(reports)
    assert {p.waiting for p in partials if p.waiting} == {2**40}
    assert max(r.waiting for r in reports) == 1  # the claim, bounded by what is missing
    bound = deferred_hold_windows(1, SLOT, 1.0)
    assert bound == 5
    # Window 1 accepted a0 and b0; from window 2 on only the claim held the stop, 5 windows.
    assert [r.waiting for r in reports[:8]] == [1, 1, 1, 1, 1, 1, 0, 0]
    assert kinds.index(RunStopKind.BUDGETS_SPENT) == 1 + bound  # window 7
    assert kinds[1 + bound:] == [RunStopKind.BUDGETS_SPENT] * (len(kinds) - 1 - bound)


def test_with_nothing_missing_an_aggregators_claim_holds_nothing() -> None:
    """Every round the clients released has been judged: a claim of deferred updates, however
    large, counts for nothing (a flood or a hostile aggregator cannot hold the stop then)."""
    from fedsim.runtime.actors.client_book import ClientBook
    from fedsim.runtime.actors.integrity import Rejections
    from fedsim.runtime.actors.partials import PartialIntake
    from fedsim.runtime.actors.window_report import WindowReport

    book = ClientBook({"a": _limits()}, DIM)
    book.record("a", 0)
    intake = PartialIntake(("g0",), 0.0, book=book, weights={"a": 1.0},
                           entry_bound=lambda c, r, w: 1.0, size=DIM, slot=SLOT)
    claim = Partial("g0", 1, (), (), np.zeros(0, np.float32),
                    rejections={"rate": 3}, waiting=2**40)
    intake.take(claim, closing=1, ended=False, rejections=Rejections())
    report = WindowReport(window=1, time=1.0, version=0)
    intake.judge(report, set(), Rejections(), on_arrival=False)
    assert (report.rejected, report.received) == (3, 3)  # the count is no rejection
    assert intake.deferred_at_aggregators(window=1, own=0, accepted=0) == 0


def _intake_judging(counts: dict) -> tuple[Any, Any, Any, list[dict]]:
    """A server's intake of aggregator "g0" (the only one; clients a, b and c routed to it)
    judging one partial of window 1 that settled a's round 0 and counts ``counts``: the intake,
    the window's report and rejections, and the warnings logged."""
    from fedsim.runtime.actors.client_book import ClientBook
    from fedsim.runtime.actors.integrity import Rejections
    from fedsim.runtime.actors.partials import PartialIntake
    from fedsim.runtime.actors.window_report import WindowReport

    book = ClientBook({c: _limits() for c in "abc"}, DIM)
    intake = PartialIntake(("g0",), 0.0, book=book, weights=dict.fromkeys("abc", 1.0),
                           entry_bound=lambda c, r, w: 1.0, size=DIM)
    partial = Partial("g0", 1, (), (), np.zeros(0, np.float32), settled=(("a", 0),),
                      rejections=counts)
    rejections = Rejections()
    intake.take(partial, closing=1, ended=False, rejections=rejections)
    report = WindowReport(window=1, time=1.0, version=0)
    with capture_logs() as logs:
        intake.judge(report, set(), rejections, on_arrival=False)
    assert book.known_rounds("a") == 1  # the partial's settled round is taken all the same
    return intake, report, rejections, [e for e in logs if e["log_level"] == "warning"]


def test_an_aggregators_plausible_rejection_counts_reach_the_windows_metrics() -> None:
    # 3 clients routed to it: 3 x 16 x 256 rejections at most, in all
    intake, report, rejections, warned = _intake_judging(
        {"rate": 12000, "norm": 286, "duplicate": 1, "stale": 1})
    assert (report.received, report.rejected, report.duplicate, report.stale) == (
        12288, 12286, 1, 1)
    assert rejections.as_dict() == {"norm": 286, "rate": 12000} and warned == []


@pytest.mark.parametrize("counts", [
    {"rate": 12288, "duplicate": 1}, {"rate": 2**52}, {"before_start": 1}, {"made_up": 1},
    {"accepted": 2}, {"bad_partial": 1}, {"status_inconsistent": 1}, {"norm": -1},
    {"norm": True}, {"norm": 1.0}, {"rate": 1, "x": 0}])
def test_an_aggregators_implausible_rejection_counts_are_left_out(counts: dict) -> None:
    """An aggregation node's made-up counts were added to the window's metrics as they came:
    any kind (``before_start``, which a launch's summary reads as refused early updates), any
    number. Counts of a kind no aggregator counts, not a non-negative integer, or more than its
    clients allow are left out, counted (the window's ``implausible_counts``) and logged; the
    rest of the partial is taken."""
    _, report, rejections, warned = _intake_judging(counts)
    assert (report.received, report.rejected, report.duplicate, report.stale) == (0, 0, 0, 0)
    assert rejections.as_dict() == {"implausible_counts": 1}
    assert [(w["event"], w["aggregator"]) for w in warned] == [
        ("partial's rejection counts implausible: left out", "g0")]


def test_an_aggregators_implausible_counts_reach_the_windows_metrics_line() -> None:
    """The partials whose counts were left out were counted in an attribute nothing read: an
    operator saw a warning once per aggregator and nothing in the run's outputs. They are a
    rejection kind of the window's ``metrics.jsonl`` line now, beside every other refusal (not
    an update: ``rejected`` does not count them), and the partial's update is applied."""
    ok = np.full(DIM, 0.01, np.float32)

    async def scenario_() -> Any:
        server, aggregator = _server_and_aggregator()
        aggregator._rejections.add("before_start", 3)  # made up: no aggregator counts it
        _, report = await _window(server, aggregator, [ClientUpdate("a", 0, 0, ok, 8.0)])
        return report

    report = asyncio.run(scenario_())
    line = report.metrics_line(rejected=report.rejected, dropped_in_flight=0, active_clients=3,
                               min_remaining_epsilon=None)
    assert line["rejections"] == {"implausible_counts": 1}
    assert (line["rejected"], line["applied"]) == (0, 1)


def test_an_aggregator_reports_a_floods_rejections_over_its_next_partials() -> None:
    """An honest aggregator never reports more than the server takes: one client's flood of
    9,000 copies of a held round is counted 4,096 a partial, the rest in the next ones, and
    every partial's counts reach the server's metrics."""
    from fedsim.runtime.actors.client_book import ClientBook
    from fedsim.runtime.actors.integrity import Rejections
    from fedsim.runtime.actors.partials import PartialIntake
    from fedsim.runtime.actors.window_report import WindowReport

    async def flood() -> list[Partial]:
        actor = _aggregator(RecordingEndpoint(WallClock()), "a")
        update = ClientUpdate("a", 0, 0, np.full(DIM, 0.01, np.float32), 8.0)
        for _ in range(9001):
            await actor._arrived(update)
        return [await actor.flush(WindowClose(w, 0)) for w in (1, 2, 3, 4)]

    partials = asyncio.run(flood())
    assert [p.rejections for p in partials] == [
        {"duplicate": 4096}, {"duplicate": 4096}, {"duplicate": 808}, {}]
    intake = PartialIntake(("g0",), 0.0, book=ClientBook({"a": _limits()}, DIM),
                           weights={"a": 1.0}, entry_bound=lambda c, r, w: 1.0, size=DIM)
    duplicates = 0
    for partial in partials:
        intake.take(partial, closing=partial.window, ended=False, rejections=Rejections())
        report = WindowReport(window=partial.window, time=1.0, version=0)
        rejections = Rejections()
        intake.judge(report, set(), rejections, on_arrival=False)
        duplicates += report.duplicate
        assert rejections.as_dict() == {}  # none left out as implausible
    assert duplicates == 9000


def test_rejections_taken_up_to_a_bound_leave_the_rest() -> None:
    from fedsim.runtime.actors.integrity import Rejections

    held = Rejections()
    held.add(Kind.RATE, 5)
    held.add("norm", 3)
    assert held.take(4) == {"norm": 3, "rate": 1}
    assert held.as_dict() == {"rate": 4}
    assert held.take(0) == {} and held.take(10) == {"rate": 4} and held.as_dict() == {}
