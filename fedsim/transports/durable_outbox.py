"""A deployed client's outbox on its own disk: every update it published that the server has
not acknowledged, kept as the bytes it sent, so that a client process killed at any moment
resends them after its restart (docs/DEPLOYMENT.md, "Crash safety").

The order of a release: the ledger is fsynced (the actor's commit), then the update's file is
written here durably, then it is sent. A process killed after the write never loses the
update: its restart reads the files back (:meth:`DurableOutbox.restore`), keeps those whose
round its ledger records, and resends them as they were first sent, stamped with the run
incarnation they were released under (a server that does not continue that incarnation
ignores them, as it would have ignored their first sending). A process killed between the
ledger's sync and this write (one file write) loses that one update: charged, never sent.

A receipt removes the file without a sync: a removal that a power failure undoes resends an
acknowledged update, which the server drops as a duplicate. Resending a released update spends
nothing: it is the same bytes, post-processing of a release already charged.

A file that cannot be read back as this client's update of a recorded round (damaged, another
client's, a round the ledger does not hold) is never sent: it is renamed ``*.rejected`` (kept
for whoever looks into it), logged and counted.
"""

from __future__ import annotations

import re
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
    """An update read back from the outbox: its round, base version and the bytes sent."""

    round: int
    base_version: int
    payload: bytes


@dataclass(frozen=True)
class Restored:
    """What :meth:`DurableOutbox.restore` found: the updates to resend, oldest round first,
    and how many files it refused."""

    updates: tuple[KeptUpdate, ...]
    rejected: int


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
        """Remove round ``round_index``'s update (acknowledged, abandoned or expired)."""
        try:
            self.path(round_index).unlink(missing_ok=True)
        except OSError as exc:  # a resend of it later is a duplicate the server drops
            _log.warning("could not remove an acknowledged update from the outbox",
                         path=str(self.path(round_index)), error=str(exc))

    def restore(self, *, client_id: str, recorded: Collection[int],
                expected_params: int | None, max_bytes: int) -> Restored:
        """The updates a previous process of ``client_id`` published and did not see
        acknowledged: every file that decodes (within ``max_bytes``, of ``expected_params``
        values) to an update of ``client_id`` whose round is its name's and one of
        ``recorded`` (the ledger's rounds). Others are renamed ``*.rejected`` and counted;
        the temporary files of a write cut short are removed."""
        if not self.directory.is_dir():
            return Restored((), 0)
        updates: list[KeptUpdate] = []
        rejected = 0
        for path in sorted(self.directory.iterdir()):
            name = path.name
            if name.startswith(".") and name.endswith(".tmp"):
                path.unlink(missing_ok=True)  # a write cut short: its update was never sent
                continue
            if not name.endswith(_SUFFIX):
                continue
            try:
                updates.append(self._read(path, client_id, recorded, expected_params,
                                          max_bytes))
            except (OSError, CodecError, ValueError) as exc:
                rejected += 1
                _log.warning("an update in the outbox cannot be resent: set aside",
                             path=str(path), reason=str(exc))
                try:
                    path.replace(path.with_name(name + ".rejected"))
                except OSError:
                    pass  # read-only: it stays, and is refused again next time
        updates.sort(key=lambda update: update.round)
        return Restored(tuple(updates), rejected)

    @staticmethod
    def _read(path: Path, client_id: str, recorded: Collection[int],
              expected_params: int | None, max_bytes: int) -> KeptUpdate:
        match = _NAME.match(path.name)
        if match is None:
            raise ValueError("not named <round>.update")
        round_index = int(match.group(1))
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
        return KeptUpdate(round_index, message.base_version, payload)
