"""A deployed client's durable outbox (fedsim/transports/durable_outbox.py): what a client
process sent and saw no receipt for is on its disk, and the next process resends exactly those
bytes, only for rounds its ledger records; a damaged or foreign file is set aside, counted,
never sent."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

import numpy as np
import pytest

from fedsim.protocol import codec
from fedsim.protocol.messages import ClientStatus, ClientUpdate
from fedsim.transports.broker import LocalMosquitto as Broker
from fedsim.transports.durable_outbox import DurableOutbox
from fedsim.transports.mqtt import MqttClientEndpoint, MqttServerEndpoint, ReconnectPolicy

RUN = "test-run"  # the conftest ``mosquitto`` fixture's run
PARAMS = 64
FAST = ReconnectPolicy(initial_delay=0.05, max_delay=0.4, connect_timeout=5.0)
LIMIT = codec.max_message_bytes(PARAMS)


def update(client_id: str, round_: int, base: int = 0) -> ClientUpdate:
    delta = np.random.default_rng(round_).standard_normal(PARAMS).astype(np.float32)
    return ClientUpdate(client_id, round_, base, delta, 16.0)


def sealed(client_id: str, round_: int, base: int = 0) -> bytes:
    return codec.encode(update(client_id, round_, base), incarnation=STAMP)


STAMP = "0123456789abcdef"


def restore(outbox: DurableOutbox, recorded: set[int], client_id: str = "c1",
            newest: int = 256):
    return outbox.restore(client_id=client_id, recorded=recorded, expected_params=PARAMS,
                          max_bytes=LIMIT, newest=newest)


def test_kept_updates_come_back_oldest_first_as_the_bytes_sent(tmp_path: Path) -> None:
    outbox = DurableOutbox(tmp_path / "state" / "outbox")
    for round_ in (12, 3, 7):
        outbox.keep(round_, sealed("c1", round_, base=round_ // 2))
    outbox.forget(7)  # acknowledged
    outbox.forget(99)  # never kept: nothing to do
    restored = restore(outbox, {3, 7, 12})
    assert [(u.round, u.base_version) for u in restored.updates] == [(3, 1), (12, 6)]
    assert {u.incarnation for u in restored.updates} == {STAMP}
    assert restored.updates[1].payload == sealed("c1", 12, base=6)
    assert restored.rejected == 0
    assert oct(os.stat(outbox.path(3)).st_mode & 0o777) == "0o600"  # the client's own


def test_nothing_kept_nothing_restored(tmp_path: Path) -> None:
    assert restore(DurableOutbox(tmp_path / "none"), {0}).updates == ()


def test_files_that_are_not_this_clients_charged_updates_are_set_aside(tmp_path: Path) -> None:
    """Never sent: a truncated file, another client's update, one renamed to another round, a
    round the ledger does not hold (never charged), a status, a directory in the way; a write
    cut short (its temporary file) is removed; an unrelated file is left alone."""
    outbox = DurableOutbox(tmp_path / "outbox")
    outbox.keep(1, sealed("c1", 1))
    outbox.keep(2, sealed("c1", 2)[:-10])  # truncated
    outbox.keep(3, sealed("c2", 3))  # another client's
    outbox.keep(4, sealed("c1", 5))  # renamed
    outbox.keep(6, sealed("c1", 6))  # not in the ledger
    outbox.keep(8, codec.encode(ClientStatus("c1", "waiting", 8, 0.1, 1e-5)))
    (outbox.directory / "9.update").mkdir()
    (outbox.directory / "10.update").symlink_to(outbox.path(1))  # never written by it
    (outbox.directory / ".12.update.1-ab.tmp").mkdir()  # cannot be removed: said, not raised
    (outbox.directory / "010.update").write_bytes(sealed("c1", 10))  # not a canonical name
    (outbox.directory / ".11.update.123-abcd.tmp").write_bytes(b"half")
    (outbox.directory / "notes.txt").write_text("mine")
    restored = restore(outbox, {1, 2, 3, 4, 5, 8, 9, 10})
    assert [u.round for u in restored.updates] == [1]
    assert restored.rejected == 8
    names = sorted(p.name for p in outbox.directory.iterdir())
    assert names == [".12.update.1-ab.tmp", "010.update.rejected", "1.update",
                     "10.update.rejected", "2.update.rejected", "3.update.rejected",
                     "4.update.rejected", "6.update.rejected", "8.update.rejected",
                     "9.update.rejected", "notes.txt"]
    again = restore(outbox, {1, 2, 3, 4, 5, 8, 9, 10})  # set aside: not read again
    assert [u.round for u in again.updates] == [1] and again.rejected == 0


def test_an_oversized_file_is_refused_before_it_is_read_whole(tmp_path: Path) -> None:
    outbox = DurableOutbox(tmp_path / "outbox")
    outbox.keep(1, sealed("c1", 1) + b"\0" * LIMIT)
    restored = restore(outbox, {1})
    assert restored.updates == () and restored.rejected == 1


def test_the_endpoint_keeps_each_update_before_sending_and_forgets_it_on_receipt(
        tmp_path: Path) -> None:
    """Not connected: each published update is on disk at once; an update abandoned from a
    full outbox or expired by staleness leaves the disk too."""
    outbox = DurableOutbox(tmp_path / "outbox")

    async def main() -> MqttClientEndpoint:
        endpoint = MqttClientEndpoint("mqtt://127.0.0.1:1", run="r", client_id="c1",
                                      expected_params=PARAMS, max_unacknowledged=2,
                                      max_staleness=2, outbox=outbox)
        for round_ in (0, 1, 2):
            await endpoint.publish(update("c1", round_, base=round_))
            assert codec.decode(outbox.path(round_).read_bytes()).round == round_
        assert endpoint.unacknowledged == (1, 2) and not outbox.path(0).exists()  # abandoned
        from fedsim.protocol.messages import GlobalModel
        endpoint._deliver(GlobalModel(4, np.zeros(PARAMS, np.float32), 0.0))
        await endpoint._resend(older_than=0.0)  # round 1 (base 1) is 3 behind: expired
        return endpoint

    endpoint = asyncio.run(main())
    assert endpoint.unacknowledged == (2,) and not outbox.path(1).exists()
    assert outbox.path(2).exists() and endpoint.stats.expired == 1
    assert endpoint.stats.abandoned == 1


def test_a_publish_cancelled_while_its_copy_is_written_keeps_the_charged_update(
        tmp_path: Path) -> None:
    """A stopping client process cancels its actor, which may be inside ``publish`` between
    the ledger's charge and the outbox: the update was then in neither the outbox nor on disk
    (its write, queued for a thread, was cancelled with it), and a resumed launch's client had
    a round charged, never sent, and counted nowhere (flaky in CI). Now it is unacknowledged
    at once (the exit's flush sends it, or the report lists it) and its copy is on disk by
    the time the endpoint is closed."""
    import threading

    class SlowOutbox(DurableOutbox):
        gate = threading.Event()

        def keep(self, round_index: int, payload: bytes) -> None:
            assert self.gate.wait(10)
            super().keep(round_index, payload)

    outbox = SlowOutbox(tmp_path / "outbox")

    async def main() -> tuple[tuple[int, ...], bool]:
        endpoint = MqttClientEndpoint("mqtt://127.0.0.1:1", run="r", client_id="c1",
                                      expected_params=PARAMS, outbox=outbox)
        publish = asyncio.ensure_future(endpoint.publish(update("c1", 3)))
        await asyncio.sleep(0.05)  # in the write
        publish.cancel()
        with pytest.raises(asyncio.CancelledError):
            await publish
        unacknowledged = endpoint.unacknowledged
        on_disk_before = outbox.path(3).exists()
        SlowOutbox.gate.set()
        await endpoint.close()
        return unacknowledged, on_disk_before

    unacknowledged, on_disk_before = asyncio.run(main())
    assert unacknowledged == (3,) and not on_disk_before
    assert codec.decode(outbox.path(3).read_bytes()).round == 3


def test_an_unwritable_outbox_is_counted_and_the_update_still_sent(tmp_path: Path) -> None:
    (tmp_path / "outbox").write_text("a file where the directory should be")

    async def main() -> MqttClientEndpoint:
        endpoint = MqttClientEndpoint("mqtt://127.0.0.1:1", run="r", client_id="c1",
                                      expected_params=PARAMS,
                                      outbox=DurableOutbox(tmp_path / "outbox"))
        await endpoint.publish(update("c1", 0))
        return endpoint

    endpoint = asyncio.run(main())
    assert endpoint.unacknowledged == (0,) and endpoint.stats.outbox_write_errors == 1


def _server(broker: Broker, **kwargs) -> MqttServerEndpoint:
    return MqttServerEndpoint(broker.server_url(), run=RUN, expected_params=PARAMS,
                              reconnect=FAST, seed=0, **kwargs)


def _client(broker: Broker, outbox: DurableOutbox) -> MqttClientEndpoint:
    return MqttClientEndpoint(broker.client_url("c1"), run=RUN, client_id="c1",
                              expected_params=PARAMS, reconnect=FAST, seed=1,
                              resend_after=60.0, outbox=outbox)


async def _received(server: MqttServerEndpoint, rounds: set[int]) -> dict[int, ClientUpdate]:
    got: dict[int, ClientUpdate] = {}
    async with asyncio.timeout(10):
        while set(got) != rounds:
            message = await server.receive()
            if isinstance(message, ClientUpdate):
                got[message.round] = message
    return got


@pytest.mark.mqtt
async def test_a_restarted_client_resends_what_its_killed_process_saw_unacknowledged(
        mosquitto: Broker, tmp_path: Path) -> None:
    """The first process sends rounds 0-3 and sees a receipt for 0 and 1 only, then dies
    without a flush (its memory is gone); the next process on the same state directory sends
    2 and 3 again, the same values, before it has computed anything, and once they are
    acknowledged the disk holds none. Before the durable outbox, 2 and 3 were lost."""
    outbox_dir = tmp_path / "state" / "outbox"
    async with _server(mosquitto) as server:
        first = _client(mosquitto, DurableOutbox(outbox_dir))
        await first.start()
        async with asyncio.timeout(5):
            while first.incarnation.current is None:
                await asyncio.sleep(0.02)
        sent = {round_: update("c1", round_) for round_ in range(4)}
        for message in sent.values():
            await first.publish(message)
        await _received(server, {0, 1, 2, 3})
        server.acknowledge({("c1", 0), ("c1", 1)})
        async with asyncio.timeout(5):
            while first.unacknowledged != (2, 3):
                await asyncio.sleep(0.02)
        await first.close()  # the process is gone: nothing of its memory is used below
        assert sorted(p.name for p in outbox_dir.iterdir()) == ["2.update", "3.update"]

        second = _client(mosquitto, DurableOutbox(outbox_dir))
        assert second.resume_outbox({0, 1, 2, 3}) == 2 and second.stats.restored == 2
        await second.start()
        resent = await _received(server, {2, 3})
        for round_, message in resent.items():
            assert message.delta.tobytes() == sent[round_].delta.tobytes()
        server.acknowledge({("c1", 2), ("c1", 3)})
        assert await second.flush(5)
        await second.close()
    assert list(outbox_dir.iterdir()) == []


def test_past_an_outboxs_bound_the_oldest_are_abandoned_unread(tmp_path: Path) -> None:
    outbox = DurableOutbox(tmp_path / "outbox")
    for round_ in range(5):
        outbox.keep(round_, sealed("c1", round_))
    outbox.path(0).write_bytes(b"damaged, but abandoned before it is read")
    restored = restore(outbox, set(range(5)), newest=2)
    assert [u.round for u in restored.updates] == [3, 4]
    assert restored.abandoned == 3 and restored.rejected == 0
    assert sorted(p.name for p in outbox.directory.iterdir()) == ["3.update", "4.update"]


def test_files_set_aside_take_no_place_of_a_charged_update(tmp_path: Path) -> None:
    """The bound counts the updates that can be resent, not every file named like one: two
    damaged files of later rounds (a directory handed over, junk from elsewhere) had the
    oldest of three charged, unacknowledged updates abandoned and removed from the disk,
    never sent (an attacker's review, session 64)."""
    outbox = DurableOutbox(tmp_path / "outbox")
    for round_ in (10, 11, 12):
        outbox.keep(round_, sealed("c1", round_))
    outbox.path(500).write_bytes(b"damaged")
    (outbox.directory / "501.update").mkdir()
    restored = restore(outbox, {10, 11, 12}, newest=3)
    assert [u.round for u in restored.updates] == [10, 11, 12]
    assert restored.rejected == 2 and restored.abandoned == 0
    assert sorted(p.name for p in outbox.directory.iterdir()) == [
        "10.update", "11.update", "12.update", "500.update.rejected", "501.update.rejected"]


def _ack(endpoint: MqttClientEndpoint, rounds: list[int], incarnation: str, *,
         lineage: tuple[str, ...] = (), relayed_by: str | None = None) -> None:
    from fedsim.transports.mqtt_receipts import Ack
    topic = endpoint.topics.acks("c1") if relayed_by is None else \
        endpoint.topics.relayed_acks(relayed_by, "c1")
    endpoint._on_message(topic, Ack(rounds=rounds, incarnation=incarnation,
                                    lineage=list(lineage)).model_dump_json().encode())


def test_restored_updates_wait_for_the_live_server_then_take_its_relayed_receipts(
        tmp_path: Path) -> None:
    """An attacker's review: a restarted client behind an aggregator resent its restored
    update at once, before the server's welcome; the receipt its aggregator relayed was
    dropped (its incarnation not yet known), and the file outlived the run. Now nothing is
    resent before the welcome, and the relayed receipt after it removes the file."""
    outbox = DurableOutbox(tmp_path / "outbox")
    outbox.keep(5, sealed("c1", 5))

    async def main() -> MqttClientEndpoint:
        endpoint = MqttClientEndpoint("mqtt://127.0.0.1:1", run="r", client_id="c1",
                                      expected_params=PARAMS, aggregator="aggregator-0",
                                      recorded_rounds=6, outbox=outbox)
        assert endpoint.resume_outbox(set(range(6))) == 1
        await endpoint._resend(older_than=None)
        assert endpoint._outbox[5].resends == 0  # not before the live server is known
        _ack(endpoint, [], STAMP)  # the welcome
        assert endpoint.incarnation.current == STAMP
        await asyncio.sleep(0)  # (the resend it starts finds no connection)
        _ack(endpoint, [5], STAMP, relayed_by="aggregator-0")
        return endpoint

    endpoint = asyncio.run(main())
    assert endpoint.unacknowledged == () and endpoint.stats.acked == 1
    assert not outbox.path(5).exists()


def _restarted(outbox: DurableOutbox, recorded: set[int]) -> MqttClientEndpoint:
    """A restarted client's endpoint (not connected) with its outbox's updates restored."""
    endpoint = MqttClientEndpoint("mqtt://127.0.0.1:1", run="r", client_id="c1",
                                  expected_params=PARAMS, outbox=outbox)
    endpoint.resume_outbox(recorded)
    return endpoint


@pytest.mark.parametrize("continued", [False, True])
def test_restored_updates_of_another_run_are_forgotten(tmp_path: Path, continued: bool) -> None:
    """A state directory reused by another run of the same name: its server does not continue
    the incarnation the restored update was stamped with and would ignore it for ever; a
    restarted server of the same run does (its lineage)."""
    outbox = DurableOutbox(tmp_path / "outbox")
    outbox.keep(5, sealed("c1", 5))

    async def main() -> MqttClientEndpoint:
        endpoint = _restarted(outbox, {5})
        _ack(endpoint, [], "fedcba9876543210", lineage=(STAMP,) if continued else ())
        return endpoint

    endpoint = asyncio.run(main())
    assert endpoint.unacknowledged == ((5,) if continued else ())
    assert endpoint.stats.other_run == (0 if continued else 1)
    assert outbox.path(5).exists() == continued


def test_at_the_runs_end_the_unacknowledged_leave_the_disk_not_the_report(
        tmp_path: Path) -> None:
    outbox = DurableOutbox(tmp_path / "outbox")

    async def main() -> MqttClientEndpoint:
        endpoint = MqttClientEndpoint("mqtt://127.0.0.1:1", run="r", client_id="c1",
                                      expected_params=PARAMS, outbox=outbox)
        await endpoint.publish(update("c1", 0))
        await endpoint.release(update("c1", 1))  # still on an emulated link
        assert endpoint.forget_on_disk() == 2
        return endpoint

    endpoint = asyncio.run(main())
    assert endpoint.unacknowledged == (0,) and list(outbox.directory.iterdir()) == []


def test_a_released_update_is_sent_as_the_bytes_kept(tmp_path: Path) -> None:
    """Behind an emulated link the file is written at the release, and the bytes sent when
    the link hands it on are those bytes (not encoded again, not written again)."""
    outbox = DurableOutbox(tmp_path / "outbox")

    async def main() -> MqttClientEndpoint:
        endpoint = MqttClientEndpoint("mqtt://127.0.0.1:1", run="r", client_id="c1",
                                      expected_params=PARAMS, outbox=outbox)
        await endpoint.release(update("c1", 3))
        kept = outbox.path(3).read_bytes()
        writes: list[int] = []
        outbox.keep = lambda round_, payload: writes.append(round_)  # type: ignore[method-assign]
        await endpoint.publish(update("c1", 3))
        await endpoint.publish(update("c1", 3))  # the link's duplicate
        assert endpoint._outbox[3].payload == kept and writes == []
        return endpoint

    endpoint = asyncio.run(main())
    assert endpoint.unacknowledged == (3,)


@pytest.mark.parametrize("same_run", [True, False])
def test_the_retained_end_of_its_run_forgets_the_restored_updates(tmp_path: Path,
                                                                  same_run: bool) -> None:
    """A review: a client restarted after its server finished never got a welcome, so its
    restored updates stayed on disk, reported unacknowledged though applied. The broker's
    retained end of their run (stamped with their incarnation) now forgets them; the end of
    another run does not (and neither is delivered before the live server confirms it)."""
    from fedsim.protocol.messages import RunFinished

    outbox = DurableOutbox(tmp_path / "outbox")
    outbox.keep(5, sealed("c1", 5))

    async def main() -> MqttClientEndpoint:
        endpoint = _restarted(outbox, {5})
        stamp = STAMP if same_run else "fedcba9876543210"
        endpoint._on_message(endpoint.topics.global_model, codec.encode(
            RunFinished(7, "windows", 30.0), incarnation=stamp))
        return endpoint

    endpoint = asyncio.run(main())
    assert endpoint.incarnation.current is None and endpoint.stats.received == 0
    assert endpoint.unacknowledged == (() if same_run else (5,))
    assert outbox.path(5).exists() == (not same_run)
    assert endpoint.stats.other_run == (1 if same_run else 0)
