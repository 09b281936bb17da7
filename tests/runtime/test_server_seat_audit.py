"""An end-to-end privacy audit from the server's seat (issue 15).

One deployed-style client (the runtime's :class:`ClientActor`, its :class:`LocalTrainer` and
the deployment's generator, :func:`fedsim.runtime.actors.exposure.client_generator`) trains a
two-class logistic regression under virtual time; the server sees its messages through the
wire codec and nothing else, plus everything public: the scenario seed, the model it sent.

Canaries: feature ``j`` (1..2K) is zero for every ordinary record; canary ``j`` is
``10 e_j`` with label 0, so only canary ``j`` moves the weights ``W[:, j]``, and with two
classes its gradient there always points along ``(-1, +1)``. Canaries ``1..K`` are in the
client's data, ``K+1..2K`` are not (add/remove neighbours, each canary its own experiment:
coordinates of independent noise, canaries sampled independently). The server's statistic for
canary ``j`` is the whole run's evidence: the sum over every released update of its
``W[:, j]`` part along ``(-1, +1)``. If the server can rebuild the noise (the client seeded
from the public scenario seed) it subtracts it first.

For a threshold test, (eps, delta)-DP gives ``TPR <= e^eps FPR + delta`` and
``1 - FPR <= e^eps (1 - TPR) + delta`` (Kairouz et al. 2015). Clopper-Pearson bounds on the
rates (Bonferroni over the thresholds and both inequalities, 95% overall) turn each threshold
into a 95% lower bound on eps. It must stay below the eps the client itself reports (its last
status message); with noise the server can rebuild it exceeds it, so the audit has teeth.
"""

from __future__ import annotations

import asyncio
import math
from pathlib import Path

import numpy as np
import pytest
import torch
from scipy import stats

from fedsim.privacy.ledger import PrivacyLedger
from fedsim.protocol import codec
from fedsim.protocol.messages import ClientStatus, ClientUpdate, GlobalModel, Message
from fedsim.runtime.actors.client import ClientActor
from fedsim.runtime.actors.exposure import ClientExposure, client_generator
from fedsim.runtime.rng import SeedTree
from fedsim.runtime.simulated.kernel import VirtualClock, run_virtual
from fedsim.training import LocalTrainer, build_model, flat_params
from fedsim.training.gaussian import gaussian_noise

pytestmark = pytest.mark.slow
torch.set_num_threads(1)

CANARIES = 600  # present; as many absent
ORDINARY = 100
FEATURES = 1 + 2 * CANARIES
ROUNDS = 3
SIGMA = 2.5
CLIP = 1.0
DELTA = 1e-5
SEED = 33
THRESHOLDS = (0.5, 1.0, 2.0, 3.0, 4.0)  # in units of C, fixed before looking at the data
CONFIDENCE = 0.95


class _ServerSeat:
    """Everything the client publishes, as the server decodes it."""

    def __init__(self) -> None:
        self.inbox: asyncio.Queue[Message] = asyncio.Queue()
        self.received: list[Message] = []

    async def publish(self, message: Message) -> None:
        self.received.append(codec.decode(codec.encode(message)))

    async def receive(self) -> Message:
        return await self.inbox.get()

    async def close(self) -> None:
        pass


def _client_data() -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(5)
    ordinary = torch.zeros(ORDINARY, FEATURES)
    ordinary[:, 0] = torch.randn(ORDINARY, generator=generator)
    canaries = torch.zeros(CANARIES, FEATURES)
    canaries[torch.arange(CANARIES), 1 + torch.arange(CANARIES)] = 10.0  # features 1..K
    labels = torch.cat([torch.randint(0, 2, (ORDINARY,), generator=generator),
                        torch.zeros(CANARIES, dtype=torch.long)])
    return torch.cat([ordinary, canaries]), labels


def _run(tmp_path: Path, randomness: str) -> tuple[list[ClientUpdate], ClientStatus, np.ndarray]:
    tree = SeedTree(SEED)
    torch.manual_seed(tree.integer("model-init"))
    model = build_model("logreg", in_features=FEATURES, num_classes=2)
    initial = flat_params(model)
    features, labels = _client_data()
    trainer = LocalTrainer(
        model, features, labels, batch_size=len(features) // 2, sampling="poisson",
        clip=_Constant(CLIP), noise=_Constant(SIGMA), local_lr=1e-3,
        generator=client_generator(tree, "c-000", 0, randomness))  # type: ignore[arg-type]
    ledger = PrivacyLedger.open(tmp_path / f"{randomness}.jsonl", client_id="c-000",
                                sampling="poisson", budget=None)

    async def main(clock: VirtualClock) -> _ServerSeat:
        seat = _ServerSeat()
        actor = ClientActor(
            "c-000", clock=clock, endpoint=seat, trainer=trainer, ledger=ledger, local_lr=1e-3,
            batch_size=len(features) // 2, seconds_per_sample=lambda: 0.001, max_rounds=ROUNDS,
            status_epsilon=lambda: (ledger.epsilon(DELTA), DELTA),
            exposure=ClientExposure(randomness=randomness))
        seat.inbox.put_nowait(GlobalModel(1, initial.copy(), 0.0, 1))
        await actor.run()
        return seat

    seat = run_virtual(main)
    ledger.close()
    updates = [m for m in seat.received if isinstance(m, ClientUpdate)]
    status = seat.received[-1]
    assert isinstance(status, ClientStatus) and len(updates) == ROUNDS
    return updates, status, initial


class _Constant:
    def __init__(self, value: float) -> None:
        self.value = value

    def clip(self, t: int) -> float:
        return self.value

    def sigma(self, t: int) -> float:
        return self.value


def _server_statistics(updates: list[ClientUpdate], m: int, num_records: int) -> np.ndarray:
    """Per canary column (present first): the run's evidence along (-1, +1) in units of C,
    after subtracting whatever noise the server can rebuild from the public seed."""
    tree = SeedTree(SEED)
    replay = tree.torch("client", "c-000", "train")  # the only stream the server can know
    size = updates[0].delta.size
    evidence = np.zeros(2 * CANARIES)
    for update in updates:
        torch.rand(num_records, generator=replay)  # the batch draw (declared N is public)
        key_noise = gaussian_noise(size, 1.0, replay, torch.zeros(size)).numpy()
        released = update.delta.astype(np.float64) * m
        if abs(np.corrcoef(key_noise, released)[0, 1]) > 0.5:  # rebuilt: subtract it
            scale = float(released @ key_noise / (key_noise @ key_noise))
            released = released - scale * key_noise
        weights = released[: 2 * FEATURES].reshape(2, FEATURES)
        evidence += (weights[1, 1:] - weights[0, 1:]) / math.sqrt(2) / CLIP
    return evidence


def _upper(failures: int, trials: int, alpha: float) -> float:
    if failures >= trials:
        return 1.0
    return float(stats.beta.ppf(1 - alpha, failures + 1, trials - failures))


def _lower(successes: int, trials: int, alpha: float) -> float:
    return 1.0 - _upper(trials - successes, trials, alpha)


def epsilon_lower_bound_95(present: np.ndarray, absent: np.ndarray) -> float:
    alpha = (1 - CONFIDENCE) / (2 * 2 * len(THRESHOLDS))  # two rates, two inequalities
    best = 0.0
    for threshold in THRESHOLDS:
        tpr = _lower(int((present > threshold).sum()), len(present), alpha)
        fpr = _upper(int((absent > threshold).sum()), len(absent), alpha)
        tnr = _lower(int((absent <= threshold).sum()), len(absent), alpha)
        fnr = _upper(int((present <= threshold).sum()), len(present), alpha)
        for numerator, denominator in ((tpr - DELTA, fpr), (tnr - DELTA, fnr)):
            if numerator > 0 and denominator > 0:
                best = max(best, math.log(numerator / denominator))
    return best


def _audit(tmp_path: Path, randomness: str) -> tuple[float, float]:
    updates, status, _ = _run(tmp_path, randomness)
    num_records = ORDINARY + CANARIES
    evidence = _server_statistics(updates, num_records // 2, num_records)
    lower = epsilon_lower_bound_95(evidence[:CANARIES], evidence[CANARIES:])
    return lower, status.epsilon


def test_the_audit_from_the_servers_seat_stays_below_the_reported_epsilon(tmp_path) -> None:
    lower, reported = _audit(tmp_path, "os_entropy")
    assert 1.5 < reported < 1.8  # q = 0.5, sigma 2.5, 3 steps (pld)
    assert lower < reported, (lower, reported)


def test_the_audit_catches_noise_the_server_can_rebuild(tmp_path) -> None:
    lower, reported = _audit(tmp_path, "seeded_not_private")
    assert lower > reported, (lower, reported)
