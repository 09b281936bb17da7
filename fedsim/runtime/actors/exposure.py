"""What a client exposes to the server, and how the runtime keeps it to public values.

The threat model for privacy (docs/DEPLOYMENT.md, "Privacy against the server") is an
honest-but-curious server that knows the scenario (its seed included) and sees every byte and
every timestamp a client sends. A client's guarantee covers what it releases through the
mechanism (its noised updates) and nothing else, so everything else it sends must be a
function of public values:

* **Randomness** (:func:`client_generator`). In deployment a client's batch sampling and noise
  come from a generator keyed from the operating system's entropy
  (:func:`fedsim.training.dpsgd.secure_generator`, 64 bits of ``os.urandom``; the compiled
  noise kernel's keys are drawn from it, :meth:`fedsim.training.gaussian.NoiseKey.draw`). The
  scenario seed is public, so a seeded stream would let the server regenerate and subtract the
  noise. ``privacy.deployed_randomness: seeded_not_private`` keeps the simulator's seeded
  stream for reproducible tests; it is logged and written to ``summary.json`` as not private.
  The simulator is seeded by design (it simulates; nobody observes it).
* **The data set size N.** Under add/remove neighbours (Poisson sampling) N and N+1 are
  neighbours, so no message carries N. The server weighs by the *declared* sizes: the
  partition sizes the scenario defines (the split is a public function of the scenario and its
  seed, so the server computes the same sizes as the clients). A deployed client's declared
  size is its plan's size in the scenario, fixed before it sees its data; a client whose real
  data differs (one record more or less: the neighbouring data set) still samples at the
  public rate ``q = m / N_declared``, is charged for that ``q``, and reports the eps of that
  ``q`` in its statuses.
* **Timing** (:func:`expected_sample_grads`, :func:`release_time`). With ``privacy.timing:
  public`` (the default) a round's compute time is the speed model's cost of the *expected*
  number of per-example gradients (``local_steps * m * per_example_steps``), not of the
  realised Poisson batch. In
  the simulator that cost is the virtual duration; a deployed client computes inside it and
  releases at ``start + k * cost`` for the smallest ``k >= 1`` by which the real compute has
  ended (``k > 1`` is an overrun: logged and counted in ``summary.json``). ``privacy.timing:
  realised`` waits ``speed * realised batch`` (the realistic model); its release times reveal
  the realised batch sizes, which the accountant does not cover (logged and marked).
* **Client sampling by invitation** (:func:`invitation_bits`, :func:`is_invited`). With
  ``server.participation < 1`` the server draws each window's participants from its own
  generator and names them in the global model message that opens the window; a client
  trains only under the latest invitation that names it, tags its update with that window,
  and the server applies every update of an invited round (nothing computed is thrown away).
"""

from __future__ import annotations

import functools
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

from fedsim.config.schema import ClientGroup, Scenario
from fedsim.logging import get_logger

if TYPE_CHECKING:  # the client actor imports this module and never imports torch itself
    import torch

    from fedsim.runtime.rng import SeedTree

__all__ = [
    "MIN_PART_WALL_SECONDS",
    "ClientExposure",
    "NOT_PRIVATE_RANDOMNESS",
    "REALISED_TIMING",
    "Randomness",
    "client_exposure",
    "client_generator",
    "expected_sample_grads",
    "group_sample_grads",
    "invitation_bits",
    "invitation_bits_in",
    "is_invited",
    "privacy_caveats",
    "release_time",
]

_log = get_logger("fedsim.runtime.actors.exposure")
_warned: set[str] = set()

Randomness = Literal["os_entropy", "seeded_not_private"]

NOT_PRIVATE_RANDOMNESS = (
    "NOT PRIVATE: deployed clients drew batches and noise from the scenario seed "
    "(privacy.deployed_randomness = seeded_not_private); anyone who knows the scenario, the "
    "server included, can regenerate and subtract their noise"
)
REALISED_TIMING = (
    "NOT COVERED BY THE ACCOUNTANT: privacy.timing = realised; release times follow the "
    "realised Poisson batch sizes, which the server sees and the accountant does not cover"
)


@dataclass(frozen=True)
class ClientExposure:
    """How a client actor keeps what it sends to public values (see the module docstring)."""

    timing: Literal["public", "realised"] = "public"
    invitation_index: int | None = None
    """Its index among the sorted client ids when the server invites (participation < 1)."""
    pad_release: bool = False
    """Compute inside the public slot and release on its schedule (wall-clock runtimes)."""
    compute_in_thread: bool = False
    """Compute a padded round in a worker thread, so that the event loop (the connection's
    PUBACKs, pings and resends) never waits for it (deployed clients; the virtual loop runs
    no threads)."""
    randomness: str = "simulated"
    """Where its batches and noise come from (``os_entropy``, ``seeded_not_private``, or the
    simulator's seeded ``simulated``), for the run's outputs."""
    min_part_seconds: float = 0.0
    """The least clock time a paced round gives one part of its compute
    (:mod:`fedsim.runtime.actors.round_timing`): a deployed client's
    :data:`MIN_PART_WALL_SECONDS` in scenario seconds (0: any)."""


MIN_PART_WALL_SECONDS = 0.025
"""A paced round's parts each get at least this much wall time (their fixed cost, about a
millisecond, and a loaded machine's wake-up delays): a round of a shorter slot is computed in
fewer parts, down to one (computed at once when it begins)."""


def invitation_positions(client_ids: Iterable[str]) -> dict[str, int]:
    """Each client's index among the sorted client ids (its bit in an invitation)."""
    return {client_id: index for index, client_id in enumerate(sorted(client_ids))}


def client_exposure(
    scenario: Scenario, client_ids: Sequence[str] | Mapping[str, int], client_id: str, *,
    deployed: bool = False, time_scale: float = 1.0,
) -> ClientExposure:
    """The scenario's :class:`ClientExposure` for ``client_id`` (simulated or deployed, at
    ``time_scale`` wall seconds a scenario second). ``client_ids``: every client id, or their
    :func:`invitation_positions` (computed once for a population, so that building N actors
    stays linear in N)."""
    invites = scenario.server.participation < 1.0
    randomness = scenario.privacy.deployed_randomness if deployed else "simulated"
    for caveat, applies in ((NOT_PRIVATE_RANDOMNESS, randomness == "seeded_not_private"),
                            (REALISED_TIMING, scenario.privacy.timing == "realised")):
        if applies and caveat not in _warned:  # once per process
            _warned.add(caveat)
            _log.warning("privacy caveat", caveat=caveat)
    return _shared_exposure(scenario.privacy.timing,
                            _position(client_ids, client_id) if invites else None,
                            deployed and scenario.privacy.timing == "public", deployed, randomness,
                            MIN_PART_WALL_SECONDS / time_scale if deployed else 0.0)


@functools.lru_cache(maxsize=64)
def _shared_exposure(timing: Literal["public", "realised"], invitation_index: int | None,
                     pad_release: bool, compute_in_thread: bool,
                     randomness: str, min_part_seconds: float) -> ClientExposure:
    """One (frozen) exposure per setting, shared by the clients that have it (every client
    of a run without invitations: 190 bytes a client at 10^6 clients, issue 24 item 5)."""
    return ClientExposure(timing=timing, invitation_index=invitation_index,
                          pad_release=pad_release, compute_in_thread=compute_in_thread,
                          randomness=randomness, min_part_seconds=min_part_seconds)


def _position(client_ids: Sequence[str] | Mapping[str, int], client_id: str) -> int:
    if isinstance(client_ids, Mapping):
        return client_ids[client_id]
    return sorted(client_ids).index(client_id)


def client_generator(
    tree: SeedTree, client_id: str, first_round: int, randomness: Randomness = "os_entropy"
) -> torch.Generator:
    """The generator of a deployed client's batches and noise.

    ``os_entropy`` (the default): a fresh generator keyed from ``os.urandom`` per process;
    nothing the server knows reproduces it. ``seeded_not_private``: the simulator's stream
    ``client/<id>/train``; a process restarted at round ``first_round > 0`` draws a stream
    keyed by that round instead (replaying the first incarnation's stream would release the
    same noise twice, revealing the difference of two gradients).
    """
    from fedsim.training.dpsgd import secure_generator

    if randomness == "os_entropy":
        return secure_generator()
    if first_round == 0:
        return tree.torch("client", client_id, "train")
    return tree.torch("client", client_id, "train", "from-round", first_round)


def expected_sample_grads(batch_size: int, local_steps: int, per_example_steps: int = 1) -> float:
    """Per-example gradients a round computes in expectation: ``local_steps * m * s``.

    Under Poisson sampling with the public rate ``q = m / N_declared`` each step's batch has
    expected size ``q * N_declared = m``; the realised size is private (it depends on N).
    With ``per_example_steps = s`` each example's ``a_h`` is ``s`` SGD steps on it alone, ``s``
    gradients (:class:`~fedsim.training.local.LocalTrainer`): the public slot covers them, or a
    deployed round would overrun it every time and be released at a time that follows its
    realised batch."""
    return float(local_steps * batch_size * per_example_steps)


def group_sample_grads(group: ClientGroup) -> float:
    """:func:`expected_sample_grads` of a client of ``group``: a round's public cost in
    per-example gradients, the one definition the slot, the pacing and the run's horizon
    multiply by seconds per sample."""
    return expected_sample_grads(group.batch_size, group.local_steps, group.per_example_steps)


def release_time(start: float, slot: float, now: float) -> float:
    """The first point of the schedule ``start + k * slot`` (k = 1, 2, ...) not before ``now``.

    The schedule depends on public values only (``slot`` is the speed model's cost of the
    expected batch); a computation that ends within the first slot is released at
    ``start + slot`` whatever its batch. ``slot <= 0`` has no schedule: ``now``."""
    if not (slot > 0 and math.isfinite(slot)):
        return now
    k = max(1, math.ceil((now - start) / slot - 1e-12))
    return start + k * slot


def invitation_bits(client_ids: Sequence[str], invited: Iterable[str]) -> bytes:
    """The bitmap naming ``invited`` among the sorted ``client_ids`` (bit i of byte i // 8)."""
    return invitation_bits_in({c: i for i, c in enumerate(sorted(client_ids))}, invited)


def invitation_bits_in(order: Mapping[str, int], invited: Iterable[str]) -> bytes:
    """:func:`invitation_bits` with the sorted ids' positions already known (``order``: id ->
    its index among them; a server keeps it rather than sorting every window)."""
    bits = bytearray((len(order) + 7) // 8)
    for client_id in invited:
        index = order[client_id]
        bits[index // 8] |= 1 << (index % 8)
    return bytes(bits)


def is_invited(bits: bytes | None, index: int) -> bool:
    """Whether the client at ``index`` of the sorted ids is named (None invites everyone)."""
    if bits is None:
        return True
    return 0 <= index < 8 * len(bits) and bool(bits[index // 8] >> (index % 8) & 1)


def privacy_caveats(timing: str, clients: Iterable[Any]) -> list[str]:
    """What a run's outputs must say its clients' eps does not cover (``[]``: nothing).

    ``clients`` are the run's client actors (or the deployed runtime's records of them), read
    for ``randomness`` and ``timing_overruns``."""
    caveats = []
    actors = list(clients)
    seeded = sorted(getattr(a, "client_id", "?") for a in actors
                    if getattr(a, "randomness", "") == "seeded_not_private")
    if seeded:
        caveats.append(f"{NOT_PRIVATE_RANDOMNESS} (clients: {', '.join(seeded[:8])}"
                       + (" ..." if len(seeded) > 8 else "") + ")")
    if timing == "realised":
        caveats.append(REALISED_TIMING)
    overruns = sum(int(getattr(a, "timing_overruns", 0)) for a in actors)
    if overruns:
        caveats.append(
            f"{overruns} deployed round(s) computed longer than their public release slot and "
            "were released at a later slot: those release times depend on the compute time "
            "(give the clients' speed model more time per sample, or a deployed run a "
            "larger --time-scale)"
        )
    return caveats
