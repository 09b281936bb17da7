"""Where an MQTT broker is, how to log in and how to reconnect: the settings of
:mod:`fedsim.transports.mqtt` (no aiomqtt here, so commands can parse broker URLs cheaply)."""

from __future__ import annotations

import random
import ssl
from dataclasses import dataclass, field, fields, replace
from urllib.parse import unquote, urlsplit

from fedsim.errors import ConfigError
from fedsim.transports.security import Credentials

DEFAULT_PORT = 1883
DEFAULT_TLS_PORT = 8883


@dataclass(frozen=True)
class TlsSettings:
    """TLS for ``mqtts://``: CA bundle (system default if None), optional client certificate."""

    ca_certs: str | None = None
    certfile: str | None = None
    keyfile: str | None = None
    insecure: bool = False  # skip certificate and host name checks (testing only)

    def context(self) -> ssl.SSLContext:
        try:
            context = ssl.create_default_context(cafile=self.ca_certs)
            if self.certfile is not None:
                context.load_cert_chain(self.certfile, self.keyfile)
        except (OSError, ssl.SSLError) as exc:
            raise ConfigError(f"TLS settings unusable: {exc}") from None
        if self.insecure:
            context.check_hostname = False
            context.verify_mode = ssl.CERT_NONE
        return context


@dataclass(frozen=True)
class BrokerSettings:
    """Where the broker is and how to log in."""

    host: str
    port: int = DEFAULT_PORT
    username: str | None = None
    password: str | None = field(default=None, repr=False)
    tls: TlsSettings | None = None

    def with_credentials(self, credentials: Credentials) -> BrokerSettings:
        return replace(self, username=credentials.username, password=credentials.password)

    def describe(self) -> str:
        """The broker as a URL without the password (safe to log)."""
        scheme = "mqtts" if self.tls else "mqtt"
        user = f"{self.username}@" if self.username else ""
        return f"{scheme}://{user}{self.host}:{self.port}"


def parse_broker_url(url: str, *, tls: TlsSettings | None = None) -> BrokerSettings:
    """``mqtt://[user[:password]@]host[:port]`` or ``mqtts://...`` (TLS, default port 8883).

    User and password may be percent-encoded. ``tls`` refines the TLS settings of ``mqtts``.
    """
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError as exc:
        raise ConfigError(f"broker URL {url!r}: {exc}") from None
    if parts.scheme not in ("mqtt", "mqtts"):
        raise ConfigError(f"broker URL {url!r} must start with mqtt:// or mqtts://")
    if not parts.hostname:
        raise ConfigError(f"broker URL {url!r} names no host")
    if parts.path not in ("", "/") or parts.query or parts.fragment:
        raise ConfigError(f"broker URL {url!r} must not have a path, query or fragment")
    secure = parts.scheme == "mqtts"
    return BrokerSettings(
        host=parts.hostname,
        port=port if port is not None else (DEFAULT_TLS_PORT if secure else DEFAULT_PORT),
        username=unquote(parts.username) if parts.username is not None else None,
        password=unquote(parts.password) if parts.password is not None else None,
        tls=(tls or TlsSettings()) if secure else None,
    )


@dataclass(frozen=True)
class ReconnectPolicy:
    """Capped exponential backoff with jitter between connection attempts.

    Attempt ``k`` (0-based, reset by every successful connection) waits a uniform time in
    ``[d/2, d]`` with ``d = min(max_delay, initial_delay * multiplier**k)``. The first
    connection must succeed within ``connect_timeout`` seconds; later outages are waited out.
    """

    initial_delay: float = 0.1
    max_delay: float = 10.0
    multiplier: float = 2.0
    connect_timeout: float = 30.0

    def delay(self, attempt: int, rng: random.Random) -> float:
        capped = min(self.max_delay, self.initial_delay * self.multiplier ** min(attempt, 64))
        return rng.uniform(capped / 2, capped)


@dataclass
class MqttStats:
    """Counters of one MQTT endpoint."""

    connections: int = 0
    connection_losses: int = 0
    published: int = 0
    received: int = 0
    rejected: int = 0  # undecodable or of the wrong kind
    denied: int = 0  # client id in the payload differs from the topic's
    acks_sent: int = 0
    acked: int = 0
    resent: int = 0
    abandoned: int = 0  # updates dropped from a full outbox
    expired: int = 0  # unacknowledged updates not resent: stale by the newest model seen
    other_incarnation: int = 0  # messages of another run incarnation, ignored
    receipts_forgotten: int = 0  # rounds dropped from a client's full table of unrecorded ones
    restored: int = 0  # unacknowledged updates of a previous process queued again (its disk)
    outbox_rejected: int = 0  # files in a client's durable outbox that could not be resent
    outbox_write_errors: int = 0  # updates sent without their durable copy (a full disk)
    other_run: int = 0  # restored updates of another run's incarnation or of an ended run
    refused_by_kind: dict[str, int] = field(default_factory=dict)
    """Every message the endpoint refused (rejected, denied, other incarnation), by kind."""

    def refused(self, kind: str) -> None:
        self.refused_by_kind[kind] = self.refused_by_kind.get(kind, 0) + 1

    def as_dict(self) -> dict[str, object]:
        values = {f.name: getattr(self, f.name) for f in fields(self)}
        values["refused_by_kind"] = dict(sorted(self.refused_by_kind.items()))
        return values


__all__ = [
    "DEFAULT_PORT",
    "DEFAULT_TLS_PORT",
    "BrokerSettings",
    "MqttStats",
    "ReconnectPolicy",
    "TlsSettings",
    "parse_broker_url",
]
