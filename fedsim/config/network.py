"""The scenario's network: the links between the clients and the server (each direction's
latency, losses and bandwidth), a group's own links, and the aggregation nodes between them.

Under ``fedsim run`` the simulated network applies them (:mod:`fedsim.transports.link_model`);
deployed, each client emulates its links on the broker's real network
(:mod:`fedsim.transports.emulated`), and the aggregation nodes' links are the broker's
(docs/DEPLOYMENT.md).
"""

from __future__ import annotations

from typing import Annotated

from pydantic import Field

from fedsim.config import limits
from fedsim.config.distributions import (
    AggregatorCount,
    Distribution,
    MessageBytes,
    Probability,
    Seconds,
    Strict,
    zero_seconds,
)

__all__ = ["Aggregators", "Link", "LinkOverride", "Network", "client_links", "imperfect"]

_Strict = Strict


class Link(_Strict):
    """One direction of the network: per-message latency, losses, and bandwidth."""

    latency: Distribution = zero_seconds(
        "The delay of each message, in virtual seconds.")
    drop: Probability = Field(default=0.0, description="The probability that a message is lost.")
    duplicate: Probability = Field(
        default=0.0, description="The probability that a message is delivered twice.")
    reorder: Probability = Field(
        default=0.0, description="The probability that a message is held back behind later ones.")
    bandwidth_bytes_per_s: Annotated[float, Field(ge=1.0, le=1e15, allow_inf_nan=False)] | None \
        = Field(default=None, description="Bytes per second (1 to 10^15), which adds a transfer time "
                "to each message; omitted, transfers take no time.")


class LinkOverride(_Strict):
    """Per-group network settings; unset fields inherit the scenario's ``network``."""

    uplink: Link | None = Field(
        default=None, description="The link that carries the group's messages to the server.")
    downlink: Link | None = Field(
        default=None, description="The link that carries the server's messages to the group.")


class Network(_Strict):
    """The links between every client and the server."""

    uplink: Link = Field(default_factory=Link,
                         description="The link that carries client-to-server messages.")
    downlink: Link = Field(default_factory=Link,
                           description="The link that carries server-to-client messages.")
    max_message_bytes: MessageBytes = Field(
        default=64 * 1024 * 1024, description="The largest message the network carries, in bytes "
        "(at most 1 GiB); a model must fit in one.")


class Aggregators(_Strict):
    """Aggregation nodes between the clients and the server (each update goes through one;
    docs/DEPLOYMENT.md, "Aggregation nodes")."""

    count: AggregatorCount = Field(
        default=0, description=f"How many aggregators (0 to {limits.MAX_AGGREGATORS}); 0: updates "
        "go straight to the server.")
    latency: Distribution = zero_seconds(
        "The delay of each message between an aggregator and the server, in "
        "virtual seconds.")
    drop: Probability = Field(
        default=0.0, description="The probability that a message between an aggregator and "
        "the server is lost.")
    wait: Seconds | None = Field(
        default=None, description="How long the server waits for the aggregators' partials "
        "after a window's end, in seconds; omitted, one window.")


def client_links(network: Network, override: LinkOverride | None) -> tuple[Link, Link]:
    """A client's (uplink, downlink): its group's ``override`` of a direction where set (the
    whole link, not field by field), else the scenario's ``network``."""
    return ((override and override.uplink) or network.uplink,
            (override and override.downlink) or network.downlink)


def imperfect(link: Link) -> bool:
    """Whether ``link`` does anything to a message (the default link does nothing)."""
    return link != Link()
