"""The MQTT topic layout of one run, shared by the MQTT transport and the ACL generator.

``fedsim/<run>/global`` carries the latest global model (retained); ``updates/<client>`` and
``status/<client>`` carry one client's messages to the server; ``acks/<client>`` carries the
server's receipts for that client's updates (so the client can resend what was never received);
``hello/<client>`` carries a client's request to be told the run's incarnation (answered on
``acks/<client>``, :mod:`fedsim.transports.incarnation`).
"""

from __future__ import annotations

from dataclasses import dataclass

from fedsim.errors import CodecError, ConfigError
from fedsim.protocol.codec import check_client_id

PREFIX = "fedsim"


@dataclass(frozen=True)
class Topics:
    """Topic names under ``fedsim/<run>/``; ``run`` follows the client id rules (no ``/``)."""

    run: str

    def __post_init__(self) -> None:
        try:
            check_client_id(self.run)
        except CodecError:
            raise ConfigError(
                f"run name {self.run!r} must be 1-64 letters, digits, '.', '_' or '-' "
                "(it names MQTT topics)"
            ) from None

    @property
    def root(self) -> str:
        return f"{PREFIX}/{self.run}"

    @property
    def global_model(self) -> str:
        return f"{self.root}/global"

    def updates(self, client_id: str) -> str:
        return f"{self.root}/updates/{client_id}"

    def status(self, client_id: str) -> str:
        return f"{self.root}/status/{client_id}"

    def acks(self, client_id: str) -> str:
        return f"{self.root}/acks/{client_id}"

    def hello(self, client_id: str) -> str:
        return f"{self.root}/hello/{client_id}"

    @property
    def all_hello(self) -> str:
        return f"{self.root}/hello/+"

    @property
    def all_updates(self) -> str:
        return f"{self.root}/updates/+"

    @property
    def all_status(self) -> str:
        return f"{self.root}/status/+"

    def sender_of(self, topic: str) -> tuple[str, str] | None:
        """``("updates" | "status" | "hello", client_id)`` for a client topic of this run, else
        None."""
        parts = topic.split("/")
        if len(parts) != 4 or parts[0] != PREFIX or parts[1] != self.run:
            return None
        if parts[2] not in ("updates", "status", "hello"):
            return None
        return parts[2], parts[3]
