"""Run incarnations on the wire (codec) and the client's rules for adopting one."""

from __future__ import annotations

import numpy as np
import pytest

from fedsim.errors import CodecError
from fedsim.protocol import codec
from fedsim.protocol.messages import ClientStatus, GlobalModel
from fedsim.transports.incarnation import ClientIncarnation, ServerIncarnation, new_incarnation


def _global(version: int, incarnation: str, lineage: tuple[str, ...] = ()) -> codec.Frame:
    data = codec.encode(GlobalModel(version, np.zeros(2, np.float32)), incarnation=incarnation,
                        lineage=lineage)
    return codec.decode_frame(data)


def test_every_message_carries_its_incarnation_and_a_global_its_lineage() -> None:
    frame = _global(3, "ab12", ("0f", "1e"))
    assert (frame.incarnation, frame.lineage, frame.message.version) == ("ab12", ("0f", "1e"), 3)
    status = codec.decode_frame(codec.encode(ClientStatus("c", "waiting", 0, 0.0, 0.0),
                                             incarnation="cd"))
    assert status.incarnation == "cd" and status.lineage == ()
    with pytest.raises(CodecError):
        codec.encode(GlobalModel(1, np.zeros(2, np.float32)), incarnation="not hex")
    fresh = {new_incarnation() for _ in range(100)}
    assert len(fresh) == 100 and all(len(i) == 16 for i in fresh)


def test_a_server_accepts_its_own_lineage_and_unwelcomed_statuses_only() -> None:
    server = ServerIncarnation.start(["old1", "old2"])
    assert server.all[-1] == server.current and server.lineage == ("old1", "old2")
    assert server.accepts(server.current, status=False) and server.accepts("old1", status=False)
    assert server.accepts("", status=True) and not server.accepts("", status=False)
    assert not server.accepts("feed", status=True)


def test_a_client_trusts_only_the_live_server_and_its_continuations() -> None:
    client = ClientIncarnation()
    retained_old = _global(30, "0001")
    assert client.admit_global(retained_old) is None  # held back: who is live is not known
    assert client.admit_global(_global(0, "0002")) is None
    assert client.confirm("0002", [])  # the live server's welcome
    kept, ignored = client.release_held_back()
    assert kept is not None and kept.message.version == 0 and ignored == [retained_old]
    assert client.admit_global(_global(31, "0001")) is None  # the old run stays ignored
    restarted = _global(5, "0003", ("0002",))  # a restart of the run this client follows
    assert client.admit_global(restarted) is restarted and client.current == "0003"
    assert not client.confirm("0009", ["0001"])  # not a continuation of 0003
    assert client.ignored == 3
