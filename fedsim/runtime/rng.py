"""The seeded random-number tree: run -> client -> purpose.

Every stream of randomness in a simulation (a client's batch sampling, its DP noise, its
compute speed, its availability, the network's delays and losses, the partition, the server's
participation subsets) comes from its own node of one :class:`numpy.random.SeedSequence` tree,
addressed by names: ``SeedTree(seed).child("client", "c003").numpy("speed")``. Streams are
independent of each other and of the order in which they are created, so adding a new purpose
or a new client never changes the numbers another stream draws.

Names map to spawn keys through a stable hash (BLAKE2b), not Python's salted ``hash``.
"""

from __future__ import annotations

import hashlib

import numpy as np
import torch

__all__ = ["SeedTree"]


def _key(name: str | int) -> int:
    if isinstance(name, int) and not isinstance(name, bool) and name >= 0:
        return name
    digest = hashlib.blake2b(str(name).encode("utf-8"), digest_size=4).digest()
    # Offset by 2**32 so that named keys never collide with small integer keys.
    return int.from_bytes(digest, "little") + 2**32


class SeedTree:
    """One node of the seed tree. Children are addressed by names or non-negative integers."""

    def __init__(self, seed: int, path: tuple[str | int, ...] = ()) -> None:
        if isinstance(seed, bool) or not isinstance(seed, int) or seed < 0:
            raise ValueError(f"seed must be a non-negative integer, got {seed!r}")
        self.seed = seed
        self.path = path
        self._sequence = np.random.SeedSequence(seed, spawn_key=tuple(_key(p) for p in path))

    def child(self, *names: str | int) -> SeedTree:
        return SeedTree(self.seed, self.path + names)

    def numpy(self, *purpose: str | int) -> np.random.Generator:
        """A numpy Generator for ``purpose`` under this node."""
        node = self.child(*purpose) if purpose else self
        return np.random.Generator(np.random.PCG64(node._sequence))

    def integer(self, *purpose: str | int) -> int:
        """A 63-bit integer seed for ``purpose`` (for libraries that take an int)."""
        node = self.child(*purpose) if purpose else self
        return int(node._sequence.generate_state(2, np.uint32).astype(np.uint64) @ np.array(
            [1, 2**32], dtype=np.uint64)) & (2**63 - 1)

    def torch(self, *purpose: str | int) -> torch.Generator:
        """A CPU ``torch.Generator`` for ``purpose`` under this node."""
        generator = torch.Generator()
        generator.manual_seed(self.integer(*purpose))
        return generator

    def __repr__(self) -> str:
        return f"SeedTree({self.seed}, {'/'.join(map(str, self.path)) or '<root>'})"
