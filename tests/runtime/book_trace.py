"""A recorded hostile run through the server's judging path, and the script that records it.

``python -m tests.runtime.book_trace PATH_TO_OLD_CHECKOUT`` plays :func:`hostile_events` through
the server of another checkout (the commit before the client book, 97ec5ba) and writes the
events with that server's verdicts to ``tests/runtime/data/book_trace.json``;
``tests/runtime/test_client_book.py`` plays the same events through this tree's server and
asserts the same verdicts. fedsim is imported inside the functions only, so that the script can
put the old checkout first on ``sys.path`` before anything of fedsim is loaded.

The events: four known clients (``a`` with a 60-round limit) and an unknown one, honest rounds
in and out of order, network duplicates and replays of applied rounds, far-ahead rounds, rounds
beyond the limit, future and never-published base versions, non-finite, too-large and
wrong-length vectors, stale bases, rounds of windows the client was not invited to, statuses
that agree and disagree with what the server saw, an update contradicting a "done" status, and
a restart from a snapshot halfway. Status claims stay within ``MAX_ROUND_GAP`` of the rounds the
server judged (beyond that the client book refuses claims the old server accepted: finding 5 of
issue 25, tested on its own).
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

TRACE = Path(__file__).parent / "data" / "book_trace.json"
CLIENTS = ("a", "b", "c", "d")
DIM = 4
GAP = 1024


class _Clock:
    def __init__(self) -> None:
        self.time = 0.0

    def now(self) -> float:
        return self.time

    async def sleep(self, seconds: float) -> None:
        self.time += max(0.0, seconds)


def make_server() -> Any:
    """The trace's server: 4-parameter model, participation 0.5, max staleness 3, no pacing."""
    import numpy as np

    from fedsim.aggregation import ConstantStepSize, UniformWeights
    from fedsim.runtime.actors.integrity import ClientLimits
    from fedsim.runtime.actors.server import ClientInfo, ServerActor
    from tests.doubles import SilentEndpoint  # (it imports fedsim: inside, as fedsim is)

    def limits(max_rounds: int | None) -> ClientLimits:
        return ClientLimits(sampling="poisson", batch_size=8.0, num_samples=100, dim=DIM,
                            clip=lambda r: 1.0, sigma=lambda r: 1.0, max_rounds=max_rounds)

    clients = {c: ClientInfo(100, 0.1, limits=limits(60 if c == "a" else None))
               for c in CLIENTS}
    return ServerActor(clock=_Clock(), endpoint=SilentEndpoint(), initial_params=np.zeros(DIM),
                       clients=clients, window=1.0, strategy=UniformWeights(),
                       step_size=ConstantStepSize(1.0), max_staleness=3, participation=0.5,
                       rng=np.random.default_rng(3))


def _delta(kind: str) -> Any:
    import numpy as np

    return {"ok": np.full(DIM, 0.05, np.float32), "big": np.full(DIM, 1e3, np.float32),
            "nan": np.array([np.nan] * DIM, np.float32),
            "short": np.zeros(DIM - 1, np.float32)}[kind]


def hostile_events(seed: int = 25, steps: int = 600) -> list[list[Any]]:  # noqa: C901
    """The events (JSON lists), drawn against the *old* server's state as the script plays
    them: ``["update", client, round, base_version, window, delta kind]``, ``["status",
    client, state, rounds]``, ``["close"]`` (apply what was accepted, publish every other time),
    ``["restart"]`` (snapshot, restore into a new server, renew the version)."""
    import numpy as np

    rng = np.random.default_rng(seed)
    state: dict[str, Any] = {"next": dict.fromkeys(CLIENTS, 0), "sent": {c: [] for c in CLIENTS}}
    events: list[list[Any]] = []

    def draw(server: Any) -> list[Any]:  # noqa: C901, PLR0911, PLR0912 - one branch per kind of event
        client = str(rng.choice(CLIENTS))
        version, window = server.version, server.windows_closed + 1
        base = int(rng.choice(sorted(server.published))) if rng.random() < 0.3 else version
        pick = rng.random()
        sent = state["sent"][client]
        if pick < 0.40:  # honest next round, sometimes skipping one (lost, comes later)
            r = state["next"][client] + int(rng.random() < 0.15)
            state["next"][client] = r + 1
            sent.append(r)
            return ["update", client, r, base, window, "ok"]
        if pick < 0.50 and sent:  # a duplicate or a replay of an earlier round
            return ["update", client, int(rng.choice(sent)), base, window, "ok"]
        if pick < 0.55:  # the round skipped earlier arrives late
            r = max(0, state["next"][client] - int(rng.integers(1, 4)))
            return ["update", client, r, base, window, "ok"]
        if pick < 0.58:
            return ["update", "mallory", 0, version, window, "ok"]
        if pick < 0.61:
            return ["update", client, state["next"][client], version, window, "short"]
        if pick < 0.64:
            return ["update", client, state["next"][client] + GAP + int(rng.integers(1, 50)),
                    version, window, "ok"]
        if pick < 0.66:
            return ["update", "a", 60 + int(rng.integers(0, 5)), version, window, "ok"]
        if pick < 0.69:
            return ["update", client, state["next"][client], version + 1, window, "ok"]
        if pick < 0.72:
            unpublished = [v for v in range(version + 1) if v not in server.published]
            if unpublished:
                return ["update", client, state["next"][client], int(rng.choice(unpublished)),
                        window, "ok"]
            return ["close"]
        if pick < 0.74:
            return ["update", client, state["next"][client], version, window,
                    str(rng.choice(["nan", "big"]))]
        if pick < 0.77:  # an old base: stale once the version moved on
            r = state["next"][client]
            state["next"][client] = r + 1
            return ["update", client, r, 0, window, "ok"]
        if pick < 0.80:  # a window it may not have been invited to
            r = state["next"][client]
            state["next"][client] = r + 1
            return ["update", client, r, base, int(rng.integers(1, window + 1)), "ok"]
        if pick < 0.88:  # statuses: agreeing, fewer than seen, far ahead, done, unknown
            # (old server internals: claims beyond the judged rounds + GAP but within an
            # earlier status's + GAP, or far claims from a client without a record, get other
            # verdicts from the book by design: findings 5 and 6, tested on their own)
            highest = server._highest_round.get(client, -1) + 1
            known = server._known_rounds(client)
            far = known + GAP + 5 if highest or client in server.statuses else highest
            claim = int(rng.choice([highest, highest + int(rng.integers(0, 20)),
                                    max(0, highest - 5), far, 60]))
            if claim > highest + GAP:
                claim = max(claim, known + GAP + 1)
            who = client if rng.random() > 0.1 else "mallory"
            what = str(rng.choice(["training", "training", "done", "budget_exhausted"]))
            return ["status", who, what, claim]
        if pick < 0.97:
            return ["close"]
        return ["restart"]

    server = make_server()
    played = Player(server)
    for _ in range(steps):
        event = draw(played.server)
        events.append(event)
        played.play(event)
    return events


class Player:
    """Plays events through a server's judging path and records each verdict."""

    def __init__(self, server: Any) -> None:
        from fedsim.runtime.actors.window_report import WindowReport

        self.server = server
        self.closes = 0
        self.report = WindowReport(1, 0.0, 0)
        self.accepted: list[Any] = []
        self.keys: set[tuple[str, int]] = set()
        self.verdicts: list[str] = []
        asyncio.run(server.publish_model(invite=True))

    def _counts(self) -> tuple[int, int, int, dict[str, int]]:
        r = self.report
        return r.duplicate, r.stale, r.rejected, dict(self.server._rejections.counts)

    def play(self, event: list[Any]) -> str:
        from fedsim.protocol.messages import ClientStatus, ClientUpdate

        server = self.server
        if event[0] == "update":
            _, client, round_, base, window, kind = event
            update = ClientUpdate(client, round_, base, _delta(kind), 8.0, 0.0, window)
            before = self._counts()
            admitted = server._admit(update, self.report, self.keys)
            after = self._counts()
            if admitted is not None:
                self.accepted.append(admitted)
                self.keys.add((client, round_))
                verdict = "accepted"
            elif after[0] > before[0]:
                verdict = "duplicate"
            elif after[1] > before[1]:
                verdict = "stale"
            else:
                grown = [k for k, n in after[3].items() if n > before[3].get(k, 0)]
                verdict = "rejected:" + ",".join(sorted(grown))
        elif event[0] == "status":
            _, client, what, rounds = event
            before = self._counts()
            kept = server.accept_status(ClientStatus(client, what, rounds, 1.0, 1e-5))
            grown = [k for k, n in self._counts()[3].items() if n > before[3].get(k, 0)]
            verdict = "kept" if kept else "refused:" + ",".join(sorted(grown))
        elif event[0] == "close":
            self.closes += 1
            if self.accepted:
                server._apply(self.accepted, self.report, 1.0)
            self.accepted, self.keys = [], set()
            server.windows_closed += 1
            if self.closes % 2 == 0:
                asyncio.run(server.publish_model(invite=True))
            verdict = f"version {server.version} missing {server.missing_updates()}"
        else:  # restart: what was accepted but not applied dies with the server
            snapshot = server.snapshot()
            self.server = server = make_server()
            server.restore(snapshot)
            server.renew_version()
            self.accepted, self.keys = [], set()
            asyncio.run(server.publish_model(invite=True))
            verdict = f"restarted at version {server.version} missing {server.missing_updates()}"
        self.verdicts.append(verdict)
        return verdict


def main(old_checkout: str) -> None:
    sys.path.insert(0, str(Path(old_checkout).resolve()))
    from structlog.testing import capture_logs

    import fedsim

    commit = subprocess.run(["git", "-C", old_checkout, "rev-parse", "HEAD"], check=True,
                            capture_output=True, text=True).stdout.strip()
    with capture_logs():
        events = hostile_events()
        player = Player(make_server())
        for event in events:
            player.play(event)
    TRACE.write_text(json.dumps({"commit": commit, "events": events,
                                 "verdicts": player.verdicts}) + "\n")
    print(f"{len(events)} events through {fedsim.__file__} at {commit}")


if __name__ == "__main__":
    main(sys.argv[1])
