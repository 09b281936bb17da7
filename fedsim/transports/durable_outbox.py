"""A deployed client's outbox on its own disk: every update it published that the server has
not acknowledged, kept as the bytes it sent, so that a client process killed at any moment
resends them after its restart (docs/DEPLOYMENT.md, "Crash safety").

The order of a release: the ledger is fsynced (the actor's commit), then the update's file is
written here durably, then it is sent - or, behind the scenario's emulated links
(:mod:`fedsim.transports.emulated`), given to its uplink, whose drop removes the file again. A
process killed after the write never loses the update: its restart reads the files back
(:meth:`DurableOutbox.restore`), keeps those whose round its ledger records, and resends them
as they were first sent, once the live server is known and only if it continues the run
incarnation they were stamped with (another run's are forgotten, counted). A process killed
between the ledger's sync and this write (one file write) loses that one update: charged,
never sent. When the run ends, what is still unacknowledged is removed: no receipt follows the
end, and no later process may send it (a simulation loses what is in flight at the end).

A receipt removes the file without a sync: a removal that a power failure undoes resends an
acknowledged update, which the server drops as a duplicate. Resending a released update spends
nothing: it is the same bytes, post-processing of a release already charged.

A file that cannot be read back as this client's update of a recorded round (damaged, another
client's, a round the ledger does not hold, a link or anything but a regular file) is never
sent: it is renamed ``*.rejected`` (kept for whoever looks into it), logged and counted. What a
file holds is not tied to the ledger's record beyond its client and round: whoever can write
the state directory can write the ledger too (docs/SECURITY.md, "A compromised client
machine").
"""

from __future__ import annotations

import os
import re
import stat
from collections.abc import Collection
from dataclasses import dataclass
from pathlib import Path

from fedsim.atomic import fsync_directory, read_regular, write_atomically
from fedsim.errors import CodecError
from fedsim.logging import get_logger
from fedsim.protocol import codec
from fedsim.protocol.messages import ClientUpdate

__all__ = ["DurableOutbox", "KeptUpdate", "Restored"]

_log = get_logger(__name__)

_SUFFIX = ".update"
_NAME = re.compile(r"^(0|[1-9][0-9]{0,17})\.update$")


@dataclass(frozen=True)
class KeptUpdate:
    """An update read back from the outbox: its round, base version, the run incarnation it
    was stamped with and the bytes sent."""

    round: int
    base_version: int
    incarnation: str
    payload: bytes


@dataclass(frozen=True)
class Restored:
    """What :meth:`DurableOutbox.restore` found: the updates to resend, oldest round first,
    how many files it refused, and how many older updates it abandoned (past ``newest``)."""

    updates: tuple[KeptUpdate, ...]
    rejected: int
    abandoned: int = 0


class DurableOutbox:
    """The directory ``directory`` (created on the first update) holding one file an
    unacknowledged update (``<round>.update``)."""

    def __init__(self, directory: str | Path) -> None:
        self.directory = Path(directory)
        self._made = False

    def path(self, round_index: int) -> Path:
        """The file of round ``round_index``'s update."""
        return self.directory / f"{round_index}{_SUFFIX}"

    def keep(self, round_index: int, payload: bytes) -> None:
        """Write round ``round_index``'s sent bytes durably (fsynced, renamed into place, the
        directory fsynced) before they are sent. Raises :class:`OSError` (a full disk)."""
        if not self._made:
            fresh = not self.directory.is_dir()
            self.directory.mkdir(parents=True, exist_ok=True)
            if fresh:  # the directory's own entry must survive too
                fsync_directory(self.directory.parent)
            self._made = True
        write_atomically(self.path(round_index), payload, durability="durable", mode=0o600)

    def forget(self, round_index: int) -> None:
        """Remove round ``round_index``'s update (acknowledged, abandoned or expired; one left
        by an error is resent later, a duplicate the server drops)."""
        _remove(self.path(round_index))

    def restore(self, *, client_id: str, recorded: Collection[int],
                expected_params: int | None, max_bytes: int, newest: int) -> Restored:
        """The updates a previous process of ``client_id`` published and did not see
        acknowledged: every file that decodes (within ``max_bytes``, of ``expected_params``
        values) to an update of ``client_id`` whose round is its name's and one of
        ``recorded`` (the ledger's rounds), the ``newest`` rounds of them (an outbox holds no
        more: older ones are abandoned unread, their files removed; a file refused takes no
        place among them). Others are renamed
        ``*.rejected`` and counted; the temporary files of a write cut short are removed. An
        unreadable directory is logged and restores nothing."""
        try:
            entries = sorted(self.directory.iterdir()) if self.directory.is_dir() else []
        except OSError as exc:
            _log.error("the durable outbox cannot be read: nothing of it is resent",
                       path=str(self.directory), error=str(exc))
            return Restored((), 0)
        named: list[tuple[int, Path]] = []
        rejected = 0
        for path in entries:
            name = path.name
            if name.startswith(".") and name.endswith(".tmp"):
                _remove(path)  # a write cut short: its update was never sent
                continue
            if not name.endswith(_SUFFIX):
                continue
            match = _NAME.match(name)
            if match is None:
                rejected += _set_aside(path, "not named <round>.update")
            else:
                named.append((int(match.group(1)), path))
        # Newest first, until ``newest`` updates can be resent: a file set aside takes no
        # place of a charged update (an attacker's review, session 64: two damaged files of
        # later rounds had two charged updates abandoned); the older ones are abandoned unread.
        named.sort(reverse=True)
        updates: list[KeptUpdate] = []
        abandoned = 0
        for round_index, path in named:
            if len(updates) >= newest:
                _remove(path)
                abandoned += 1
                continue
            try:
                updates.append(self._read(path, round_index, client_id, recorded,
                                          expected_params, max_bytes))
            except (OSError, CodecError, ValueError) as exc:
                rejected += _set_aside(path, str(exc))
        return Restored(tuple(reversed(updates)), rejected, abandoned)

    @staticmethod
    def _read(path: Path, round_index: int, client_id: str, recorded: Collection[int],
              expected_params: int | None, max_bytes: int) -> KeptUpdate:
        if not stat.S_ISREG(os.lstat(path).st_mode):
            raise ValueError("not a regular file (this outbox writes nothing else)")
        payload = read_regular(path, limit=max_bytes + 1)
        frame = codec.decode_frame(payload, expected_params=expected_params,
                                   max_bytes=max_bytes)
        message = frame.message
        if not isinstance(message, ClientUpdate):
            raise ValueError(f"holds a {type(message).__name__}, not an update")
        if message.client_id != client_id:
            raise ValueError(f"an update of client {message.client_id!r}, not {client_id!r}")
        if message.round != round_index:
            raise ValueError(f"holds round {message.round}, named {round_index}")
        if round_index not in recorded:
            raise ValueError(f"round {round_index} is not in this client's ledger: never "
                             f"charged, so never sent")
        return KeptUpdate(round_index, message.base_version, frame.incarnation, payload)


def _remove(path: Path) -> None:
    try:
        path.unlink(missing_ok=True)
    except OSError as exc:  # read-only, or a directory in the way: left, said
        _log.warning("could not remove a file from the durable outbox", path=str(path),
                     error=str(exc))


def _set_aside(path: Path, reason: str) -> int:
    """Rename ``path`` to ``*.rejected`` (logged); 1, to count it."""
    _log.warning("an update in the outbox cannot be resent: set aside", path=str(path),
                 reason=reason)
    try:
        path.replace(path.with_name(path.name + ".rejected"))
    except OSError:
        pass  # read-only: it stays, and is refused again next time
    return 1
