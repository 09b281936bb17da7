"""Test doubles shared by the actor, runtime and batcher tests (import as
``from tests.doubles import ...``): a ledger, endpoints, a round schedule."""

from __future__ import annotations

import asyncio
from typing import Any

from fedsim.clock import Clock


class FreeLedger:
    """A ledger that pays for every round and records nothing: for tests of an actor's timing
    and messages, where the accounting is tested elsewhere."""

    def can_spend(self, steps: Any) -> bool:
        return True

    def spend(self, steps: Any, *, time: float, round: int) -> None:
        pass

    def plan(self, future_rounds: Any) -> int:
        return len(future_rounds)


class RecordingEndpoint:
    """An actor's endpoint. The test puts messages into ``inbox`` (now, at a virtual time with
    :meth:`deliver_at`, or a schedule with :meth:`feed`); every published message is kept with
    its clock time (0.0 without a clock) in ``published`` and noted as ``"publish <type>"`` in
    ``log`` (share a ledger's log to check what came first). ``wire=True``: a published message
    is kept as the codec decodes it (what a server receives off the wire)."""

    def __init__(self, clock: Clock | None = None, *, log: list[str] | None = None,
                 wire: bool = False) -> None:
        self.clock = clock
        self.log = log if log is not None else []
        self.wire = wire
        self.inbox: asyncio.Queue[Any] = asyncio.Queue()
        self.published: list[tuple[float, Any]] = []

    async def publish(self, message: Any) -> None:
        if self.wire:
            from fedsim.protocol import codec

            message = codec.decode(codec.encode(message))
        self.log.append(f"publish {type(message).__name__}")
        self.published.append((self.clock.now() if self.clock is not None else 0.0, message))

    async def receive(self) -> Any:
        return await self.inbox.get()

    async def close(self) -> None:
        pass

    def updates(self) -> list[tuple[float, Any]]:
        """The published client updates, with their clock times."""
        from fedsim.protocol.messages import ClientUpdate

        return [(t, m) for t, m in self.published if isinstance(m, ClientUpdate)]

    def deliver_at(self, when: float, message: Any) -> None:
        """Put ``message`` into the inbox at clock time ``when`` (on the running loop)."""
        assert self.clock is not None
        asyncio.get_running_loop().call_later(when - self.clock.now(), self.inbox.put_nowait,
                                              message)

    async def feed(self, arrivals: list[tuple[float, Any]]) -> None:
        """Put each ``(time, message)`` into the inbox at its clock time, in order."""
        assert self.clock is not None
        for at, message in arrivals:
            await self.clock.sleep(at - self.clock.now())
            self.inbox.put_nowait(message)


class SilentEndpoint:
    """An endpoint where nothing arrives and what is published goes nowhere."""

    async def publish(self, message: Any) -> None:
        """Dropped."""

    async def receive(self) -> Any:
        await asyncio.Event().wait()

    async def close(self) -> None:
        pass


class RoundTimes:
    """A runtime's round schedule for a RoundBatcher (fedsim.training.batched.RoundSchedule):
    the test says each round's end (``ends``, by round) and client (``owners``), and
    ``reach(client)`` when a model can next reach that client; ``asked`` records the clients
    each horizon question named."""

    def __init__(self, reach: Any = None) -> None:
        self.ends: dict[int, float | None] = {}
        self.owners: dict[int, str | None] = {}
        self.reach = reach if reach is not None else (lambda owner: float("inf"))
        self.asked: list[list[str | None]] = []

    def set(self, round_: Any, ends_at: float | None, owner: str | None = None) -> None:
        self.ends[id(round_)], self.owners[id(round_)] = ends_at, owner

    def ends_at(self, round_: Any) -> float | None:
        return self.ends.get(id(round_))

    def horizon(self, rounds: Any) -> list[float]:
        owners = [self.owners.get(id(r)) for r in rounds]
        self.asked.append(owners)
        return [float(self.reach(owner)) for owner in owners]


def count_norm_reads(monkeypatch: Any) -> list[int]:
    """Count the vectors :func:`fedsim.protocol.norms.vector_norm` reads from now on (in
    ``[0]``): whether a remembered norm spared a pass."""
    from fedsim.protocol import norms

    reads = [0]
    real = norms.vector_norm

    def counted(values: Any) -> float:
        reads[0] += 1
        return real(values)

    monkeypatch.setattr(norms, "vector_norm", counted)
    return reads
