"""A client group's update compression (``compression:``): what a client puts on the wire.

Paper 000, footnote 1: "in practice, the client will only transmit a sparsification or lossy
compression of U-bar where small entries are discarded". Each kind is applied to the round's
update *after* its noise, by the codec (:mod:`fedsim.protocol.compression`), so it is
post-processing of the Gaussian mechanism's output and costs no privacy (docs/PRIVACY.md,
"Compressed updates").

* ``top_k``: keep the ``fraction`` of coordinates largest in magnitude (at least one), send
  their indices and values;
* ``threshold``: keep the coordinates with ``|u_i| >= threshold``;
* ``quantise``: unbiased stochastic rounding of every coordinate to one of ``2^bits`` levels
  evenly spaced between the vector's minimum and maximum, with randomness from a public seed
  (the client id and round), never from the client's data.
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field

from fedsim.config.distributions import Fraction, Scale, Strict

__all__ = ["Compression", "QuantiseCompression", "ThresholdCompression", "TopKCompression"]


class TopKCompression(Strict):
    """Top-k sparsification: the ``fraction`` of coordinates largest in |value|."""

    kind: Literal["top_k"] = Field(description="Keep the largest coordinates in magnitude.")
    fraction: Fraction = Field(
        description="The share of coordinates kept, in (0, 1]: k = ceil(fraction * d), at "
        "least 1.")


class ThresholdCompression(Strict):
    """Threshold sparsification: the coordinates with ``|value| >= threshold``."""

    kind: Literal["threshold"] = Field(
        description="Keep the coordinates whose magnitude is at least the threshold.")
    threshold: Scale = Field(
        description="The smallest |value| kept (in the update's units: Ubar/m); smaller "
        "entries are discarded.")


class QuantiseCompression(Strict):
    """Unbiased stochastic quantisation to ``bits`` bits per coordinate."""

    kind: Literal["quantise"] = Field(
        description="Stochastic rounding to 2^bits levels between the vector's min and max "
        "(unbiased), with a public seed from the client id and round.")
    bits: Literal[4, 8] = Field(default=8, description="Bits per coordinate: 8 or 4.")


Compression = Annotated[
    TopKCompression | ThresholdCompression | QuantiseCompression, Field(discriminator="kind")
]
