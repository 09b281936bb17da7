"""Run incarnations: which server start a message belongs to.

A broker keeps state across runs: a retained global model and the server's persistent session
(its queue of updates) outlive the processes that made them. A second run of the same name on
that broker would otherwise adopt the first run's retained model (a higher version, so every
new broadcast looks older) or apply the first run's queued updates.

Every server start draws a fresh random **incarnation** (:func:`new_incarnation`, 64 bits from
the OS). Every message carries its sender's incarnation (the codec header's ``incarnation``):

* the server stamps its global models and receipts with its incarnation and its **lineage**
  (the incarnations of the earlier starts it continues, kept in its checkpoint: a restarted
  server continues the run, a fresh state directory starts a new one). It accepts updates and
  statuses of its own incarnation or its lineage, and a status stamped ``""`` (a client that
  has not yet learnt the incarnation), which it answers with a *welcome* (an empty receipt on
  the client's ``acks`` topic, a topic no retained message or old session can fill);
  everything else is ignored and logged;
* a client learns the incarnation only from the live server: a welcome or a receipt, or a
  global model whose lineage holds the incarnation it already follows
  (:class:`ClientIncarnation`). A retained model that arrives before that is held back, and
  delivered once its incarnation is confirmed.

Incarnations are not authentication (an authenticated client can copy the current one into
its messages; the broker's passwords and ACL and the server's checks deal with it); they keep
an honest run from mixing with the leftovers of an earlier one.
"""

from __future__ import annotations

import secrets
import weakref
from collections.abc import Sequence
from dataclasses import dataclass, field

from fedsim.protocol.codec import Frame
from fedsim.protocol.headers import MAX_LINEAGE
from fedsim.protocol.messages import Message

__all__ = ["ClientIncarnation", "ServerIncarnation", "new_incarnation"]


def new_incarnation() -> str:
    """A fresh random incarnation id (16 hex digits from the OS's entropy)."""
    return secrets.token_hex(8)


@dataclass(frozen=True)
class ServerIncarnation:
    """The server's incarnation and the earlier ones it continues."""

    current: str
    lineage: tuple[str, ...] = ()

    @classmethod
    def start(cls, lineage: Sequence[str] = ()) -> ServerIncarnation:
        return cls(new_incarnation(), tuple(lineage)[-(MAX_LINEAGE - 1):])

    @property
    def all(self) -> tuple[str, ...]:
        """The lineage and the current incarnation, oldest first (what a checkpoint keeps)."""
        return (*self.lineage, self.current)

    def accepts(self, incarnation: str, *, status: bool) -> bool:
        """Whether a client message stamped ``incarnation`` belongs to this run (a status may
        also come from a client that has not learnt the incarnation yet)."""
        return incarnation == self.current or incarnation in self.lineage or (
            status and incarnation == ""
        )


@dataclass
class ClientIncarnation:
    """What a client endpoint knows of the run's incarnation (see the module docstring)."""

    current: str | None = None
    held_back: dict[str, Frame] = field(default_factory=dict)
    """The latest global model of each incarnation seen before the current one was known."""
    ignored: int = 0
    _stamps: dict[int, tuple[weakref.ref[Message], str]] = field(default_factory=dict,
                                                                   repr=False)
    """Each delivered message still alive, by identity: its reference and its stamp."""

    def delivered(self, frame: Frame) -> Message:
        """``frame``'s message, to deliver: its incarnation is remembered while the message
        lives (:meth:`of`), since it may be taken up after the client followed another."""
        message = frame.message
        key = id(message)

        def forget(ref: weakref.ref[Message]) -> None:
            kept = self._stamps.get(key)
            if kept is not None and kept[0] is ref:  # (not a later message at that address)
                del self._stamps[key]

        self._stamps[key] = (weakref.ref(message, forget), frame.incarnation)
        return message

    def of(self, message: Message) -> str | None:
        """The incarnation a message :meth:`delivered` was stamped with (None: not one of
        those, or no longer alive)."""
        kept = self._stamps.get(id(message))
        return kept[1] if kept is not None and kept[0]() is message else None

    def confirm(self, incarnation: str, lineage: Sequence[str]) -> bool:
        """A welcome or receipt from the live server: adopt its incarnation if this client
        follows none yet or one in its lineage. False (ignore the message) otherwise."""
        if incarnation == self.current:
            return True
        if self.current is None or self.current in lineage:
            self.current = incarnation
            return True
        self.ignored += 1
        return False

    def admit_global(self, frame: Frame) -> Frame | None:
        """The global model ``frame`` if it may be delivered now (its incarnation is current,
        or continues the current one); None if it is held back or ignored."""
        if self.current is None:
            self.held_back[frame.incarnation] = frame  # the latest arrival of each
            return None
        if frame.incarnation == self.current:
            return frame
        if self.current in frame.lineage:
            self.current = frame.incarnation
            return frame
        self.ignored += 1
        return None

    def release_held_back(self) -> tuple[Frame | None, list[Frame]]:
        """Once the incarnation is confirmed: the held-back global model of it (or None), and
        those of other incarnations, now ignored."""
        held, self.held_back = self.held_back, {}
        kept = held.pop(self.current or "", None)
        self.ignored += len(held)
        return kept, list(held.values())
