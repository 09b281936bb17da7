"""The interrupt rule ``switch`` (van Dijk & Nguyen's interrupt service routine): a round split at a
w-hat's arrival, against an independent numpy computation of the per-example gradients."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from fedsim.data import load_dataset
from fedsim.privacy import schedules
from fedsim.protocol import norms
from fedsim.training import LocalTrainer, build_model, flat_params
from fedsim.training.batched import RoundBatcher
from tests.doubles import RoundTimes, count_norm_reads

FEATURES, CLASSES, LR = 5, 3, 0.3
SQRT2_M1 = math.sqrt(2) - 1


def _offsets(seed: int, records: int = 40) -> torch.Tensor:
    """Phase offsets attached to the records by hand (independent of the trainer's stream)."""
    return torch.from_numpy(np.random.default_rng(seed + 1000).random(records))


def _trainer(model: torch.nn.Module, seed: int, *, sampling: str = "fixed", batch: int = 12,
             clip: float = 0.4, local_steps: int = 1, records: int = 40) -> LocalTrainer:
    x, y, _, _ = load_dataset("synthetic", seed=seed, num_train=records, num_test=1,
                              num_features=FEATURES, num_classes=CLASSES)
    return LocalTrainer(model, x, y, batch_size=batch, sampling=sampling,
                        clip=schedules.constant(100, 1.3, clip),
                        noise=schedules.constant(100, 1.3, clip), local_steps=local_steps,
                        local_lr=LR, generator=torch.Generator().manual_seed(seed),
                        phase_offsets=_offsets(seed, records))


def _logreg() -> torch.nn.Module:
    torch.manual_seed(0)
    return build_model("logreg", in_features=FEATURES, num_classes=CLASSES)


def _clipped_grads(w: np.ndarray, x: np.ndarray, y: np.ndarray, clip: float) -> np.ndarray:
    """Per-example clipped gradients of softmax regression (weight rows then bias), by hand:
    g_i = (softmax(W x_i + b) - e_{y_i}) (x) [x_i, 1], times min(1, C / (||g_i|| + 1e-6))."""
    weight = w[: CLASSES * FEATURES].reshape(CLASSES, FEATURES).astype(np.float64)
    bias = w[CLASSES * FEATURES:].astype(np.float64)
    logits = x @ weight.T + bias
    p = np.exp(logits - logits.max(axis=1, keepdims=True))
    p /= p.sum(axis=1, keepdims=True)
    p[np.arange(len(y)), y] -= 1.0
    g = np.concatenate([(p[:, :, None] * x[:, None, :]).reshape(len(y), -1), p], axis=1)
    norms = np.linalg.norm(g, axis=1)
    return g * np.minimum(1.0, clip / (norms + 1e-6))[:, None]


def _phase(offsets: np.ndarray, round_index: int) -> np.ndarray:
    """frac(u + (round + 1)(sqrt 2 - 1)): the record's own offset, rotated by the round."""
    v = offsets + (round_index + 1) * SQRT2_M1
    return v - np.floor(v)


@pytest.mark.parametrize("fraction", [0.0, 0.3, 0.77])
def test_a_split_round_computes_the_later_gradients_at_w_hat(fraction: float) -> None:
    """switch(f, w-hat): U_switch - U_snapshot = (1/m) sum over the records due at or after f of
    [clip g_i(w-hat)] - [clip g_i(w)]; the noise (drawn at round start) is the same."""
    model = _logreg()
    w0 = flat_params(model)
    w1 = w0 + np.float32(0.4) * np.random.default_rng(3).standard_normal(w0.size).astype(np.float32)
    split, whole = _trainer(model, 5), _trainer(model, 5)
    pending = split.begin_round(w0, 2)
    pending.switch(fraction, w1)
    got = pending.result().update
    want_snapshot = whole.run_round(w0, 2).update
    indices = pending.draws[0].indices.numpy()
    late = indices[_phase(_offsets(5).numpy()[indices], 2) >= fraction]
    x = split.features.numpy().astype(np.float64)
    y = split.labels.numpy()
    diff = (_clipped_grads(w1, x[late], y[late], 0.4)
            - _clipped_grads(w0, x[late], y[late], 0.4)).sum(axis=0) / 12
    assert 0 < len(late) <= len(indices)
    np.testing.assert_allclose(got - want_snapshot, diff, atol=2e-6)
    if fraction == 0.0:  # the whole round at w-hat
        np.testing.assert_allclose(got, _trainer(model, 5).run_round(w1, 2).update, atol=2e-6)


def test_a_switch_at_or_after_the_round_end_changes_nothing() -> None:
    model = _logreg()
    w0 = flat_params(model)
    pending = _trainer(model, 6).begin_round(w0, 0)
    pending.switch(1.0, w0 + np.float32(1.0))
    np.testing.assert_array_equal(pending.result().update, _trainer(model, 6).run_round(w0, 0).update)


def test_a_record_is_due_at_its_own_phase_whatever_the_rest_of_the_batch() -> None:
    """Removing a record from the batch moves no other record across the split (the paper's
    'each a_h independent of one another'): a record's segment depends on it alone."""
    from fedsim.training.rounds import Segment, step_segments

    trainer = _trainer(_logreg(), 9, records=30)
    segments = [Segment(0.0, np.zeros(1)), Segment(0.5, np.ones(1))]
    batch = torch.arange(30)
    fewer_batch = batch[batch != 7]
    full = dict(step_segments(segments, 0, 1, batch, trainer.record_phases(batch, 4)))
    fewer = dict(step_segments(segments, 0, 1, fewer_batch,
                               trainer.record_phases(fewer_batch, 4)))
    for k in full:
        assert set(full[k].tolist()) - {7} == set(fewer[k].tolist())
    late = set(full[1].tolist())
    assert late == {i for i in range(30) if _phase(_offsets(9, 30).numpy()[[i]], 4)[0] >= 0.5}
    assert 0 < len(late) < 30


def test_two_local_steps_the_second_after_the_switch_starts_at_w_hat_minus_the_first() -> None:
    """local_steps = 2, switch at 1/2: step 0 entirely at w, step 1 at w-hat - lr * s0 (s0: step
    0's noisy gradient, the same as a one-step round's from the same generator)."""
    model = _logreg()
    w0 = flat_params(model)
    w1 = w0 + np.float32(0.3)
    two = _trainer(model, 8, local_steps=2)
    pending = two.begin_round(w0, 0)
    pending.switch(0.5, w1)
    got = pending.result().update
    snapshot = _trainer(model, 8, local_steps=2).run_round(w0, 0).update
    s0 = _trainer(model, 8).run_round(w0, 0).update.astype(np.float64)
    batch1 = pending.draws[1].indices.numpy()
    x, y = two.features.numpy().astype(np.float64), two.labels.numpy()
    at_hat = (w1.astype(np.float64) - LR * s0).astype(np.float32)
    at_w = (w0.astype(np.float64) - LR * s0).astype(np.float32)
    diff = (_clipped_grads(at_hat, x[batch1], y[batch1], 0.4)
            - _clipped_grads(at_w, x[batch1], y[batch1], 0.4)).sum(axis=0) / 12
    np.testing.assert_allclose(got - snapshot, diff, atol=5e-6)


def test_split_rounds_in_a_batched_pass_equal_each_computed_alone() -> None:
    """The batcher computes a split round's segments as jobs of one pass (noise on the first):
    the same update as the round computed alone, and as its two halves by hand."""
    model = _logreg()
    base = flat_params(model)
    rng = np.random.default_rng(1)
    params = [base + np.float32(0.2) * rng.standard_normal(base.size).astype(np.float32)
              for _ in range(4)]
    hat = base - np.float32(0.25)
    batcher = RoundBatcher(model)
    together = [_trainer(model, 20 + k, sampling="poisson") for k in range(4)]
    alone = [_trainer(model, 20 + k, sampling="poisson") for k in range(4)]
    pending = [t.begin_round(p, 1, batcher) for t, p in zip(together, params, strict=True)]
    for k, p in enumerate(pending[:3]):
        p.switch(0.25 * (k + 1), hat)
    pending[0].result()
    assert batcher.pending == 0 and batcher.rounds_batched == 4
    for k, (p, trainer, w) in enumerate(zip(pending, alone, params, strict=True)):
        mine = trainer.begin_round(w, 1)
        if k < 3:
            mine.switch(0.25 * (k + 1), hat)
        np.testing.assert_allclose(p.result().update, mine.result().update, atol=2e-6)


def test_the_pass_measures_each_whole_rounds_update_once_and_the_clients_check_reads_none(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """With ``measure`` (the simulation's: norms.measured_for_sender) the pass measures a
    whole round's update as it makes it; the client's check of it later reads no vector and
    gets the same norm as a fresh measurement. A split round is added up after the pass and
    measured by the client; the updates are those of a batcher without ``measure``."""
    model = _logreg()
    base = flat_params(model)
    rng = np.random.default_rng(2)
    params = [base + np.float32(0.2) * rng.standard_normal(base.size).astype(np.float32)
              for _ in range(4)]
    measured: list[np.ndarray] = []

    def measure(update: np.ndarray) -> float:
        measured.append(update)
        return norms.measured_for_sender(update)

    results = {}
    for batcher in (RoundBatcher(model, measure=measure), RoundBatcher(model)):
        trainers = [_trainer(model, 60 + k, sampling="poisson") for k in range(4)]
        pending = [t.begin_round(p, 1, batcher) for t, p in zip(trainers, params, strict=True)]
        pending[1].switch(0.5, base - np.float32(0.25))  # one split round
        pending[0].result()
        results[batcher.measure is None] = [p.result().update for p in pending]
    assert [r.tobytes() for r in results[True]] == [r.tobytes() for r in results[False]]
    updates = results[False]
    whole = [updates[k] for k in (0, 2, 3)]
    assert len(measured) == 3 and all(any(m is u for m in measured) for u in whole)
    assert not any(m is updates[1] for m in measured)
    fresh = [norms.vector_norm(update.copy()) for update in whole]
    reads = count_norm_reads(monkeypatch)
    for update, norm in zip(whole, fresh, strict=True):
        assert norms.given_up_norm(update) == norm
    assert reads[0] == 0
    for update in whole:  # handed on once: given up again, read again
        norms.given_up_norm(update)
    assert reads[0] == 3
    norms.given_up_norm(updates[1])
    assert reads[0] == 4


def test_the_batcher_keeps_a_round_that_may_still_be_split_until_the_horizon() -> None:
    model = _logreg()
    w0 = flat_params(model)
    horizon = [5.0]
    times = RoundTimes(lambda owner: horizon[0])
    batcher = RoundBatcher(model, schedule=times)
    trainers = [_trainer(model, 30 + k) for k in range(3)]
    rounds = [t.begin_round(w0, 0, batcher) for t in trainers]
    for round_, end in zip(rounds, (4.0, 9.0, 5.0), strict=True):
        times.set(round_, end)
    rounds[0].result()
    assert rounds[0].done and rounds[2].done and not rounds[1].done
    rounds[1].switch(0.5, w0 + np.float32(0.1))  # not computed yet: nothing wasted
    horizon[0] = 10.0
    rounds[1].result()
    assert batcher.recomputed == 0
    rounds[2].switch(0.5, w0)  # a (mis-)late split of a computed round: computed again
    assert not rounds[2].done and batcher.pending == 1 and batcher.recomputed == 1
    rounds[2].result()


def test_the_horizon_is_asked_per_client_and_holds_only_that_clients_round() -> None:
    """A client whose w-hat has arrived (none in flight to it before the next publish) has its
    round computed while another client's round, with a model still on the way, waits."""
    model = _logreg()
    w0 = flat_params(model)
    next_model = {"a": 10.0, "b": 3.0}
    times = RoundTimes(lambda owner: next_model[owner])
    batcher = RoundBatcher(model, schedule=times)
    rounds = {}
    for k, owner in enumerate(("a", "b", "c")):
        rounds[owner] = _trainer(model, 40 + k).begin_round(w0, 0, batcher)
        # c is not splittable: computed with the first flush, never asked about
        times.set(rounds[owner], None if owner == "c" else 5.0, owner)
    rounds["a"].result()
    assert times.asked == [["b"]]  # the due round and the unsplittable one are not asked about
    assert rounds["a"].done and rounds["c"].done and not rounds["b"].done
    rounds["b"].switch(0.4, w0 + np.float32(0.1))  # arrives before b's end: nothing wasted
    next_model["b"] = 12.0
    rounds["b"].result()
    assert batcher.recomputed == 0 and batcher.pending == 0


@pytest.mark.parametrize("draw_pairs", [1 << 22, 1])  # all rows in one draw, or one a row
@pytest.mark.parametrize("split", [False, True])
def test_an_accelerators_noise_block_computes_what_each_rounds_own_draw_computes(
        monkeypatch: pytest.MonkeyPatch, split: bool, draw_pairs: int) -> None:
    """Off the CPU a pass draws every round's noise as a row of one block (zeros for a split
    round's later segments). Here on the CPU, both ways with torch's sampler (the compiled one
    differs from it by float32 rounding): the same updates, whole and split rounds, up to a
    BLAS product's rounding (which may follow its output's alignment); and a round's update
    to the byte whatever its row in the pass (rows are aligned alike)."""
    from fedsim.training import batched_pass, gaussian

    monkeypatch.setattr(gaussian, "_native", lambda: None)
    monkeypatch.setattr(batched_pass, "_BLOCK_DRAW_PAIRS", draw_pairs)
    model = _logreg()
    base = flat_params(model)
    rng = np.random.default_rng(3)
    params = [base + np.float32(0.2) * rng.standard_normal(base.size).astype(np.float32)
              for _ in range(5)]

    def updates(in_block: bool, order: list[int]) -> list[np.ndarray]:
        monkeypatch.setattr(batched_pass, "_noise_in_block", lambda device: in_block)
        batcher = RoundBatcher(model)
        # each round its own clip, so its own noise std
        trainers = {k: _trainer(model, 70 + k, sampling="poisson", clip=0.2 + 0.3 * k)
                    for k in order}
        pending = {k: trainers[k].begin_round(params[k], 1, batcher) for k in order}
        if split:
            pending[1].switch(0.5, base - np.float32(0.25))  # a zero row in the block
            pending[3].switch(0.3, base + np.float32(0.1))
        pending[order[0]].result()
        assert batcher.rounds_batched == 5
        return [pending[k].result().update for k in range(5)]

    in_block = updates(True, [0, 1, 2, 3, 4])
    for got, want in zip(in_block, updates(False, [0, 1, 2, 3, 4]), strict=True):
        np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-8)
    assert [u.tobytes() for u in updates(True, [4, 2, 0, 3, 1])] == [u.tobytes() for u in in_block]


@pytest.mark.parametrize("in_block", [False, True])
def test_a_round_without_records_releases_exactly_its_own_noise_either_way(
        monkeypatch: pytest.MonkeyPatch, in_block: bool) -> None:
    """Rounds whose Poisson batch is empty release their noise alone: each exactly its own
    key's draw at its own std (five clips, so five stds), cut to a model of an odd size (the
    draw padded to whole pairs), whether the pass draws per round or as one block."""
    from fedsim.training import batched_pass, gaussian
    from fedsim.training.dpsgd import noise_std

    monkeypatch.setattr(gaussian, "_native", lambda: None)  # torch's sampler both ways
    monkeypatch.setattr(batched_pass, "_noise_in_block", lambda device: in_block)
    torch.manual_seed(0)
    model = build_model("logreg", in_features=4, num_classes=3)  # (4 + 1) * 3: odd
    base = flat_params(model)
    assert base.size % 2 == 1
    batcher = RoundBatcher(model)
    clips = [0.1, 0.4, 2.0, 7.5, 0.01]
    pending, seed = [], 0
    for clip in clips:
        while True:  # a seed whose first Poisson batch of 1 in 40 is empty
            seed += 1
            x, y, _, _ = load_dataset("synthetic", seed=seed, num_train=40, num_test=1,
                                      num_features=4, num_classes=3)

            def trainer(x: torch.Tensor = x, y: torch.Tensor = y, seed: int = seed,
                        clip: float = clip) -> LocalTrainer:
                return LocalTrainer(model, x, y, batch_size=1, sampling="poisson",
                                    clip=schedules.constant(100, 1.3, clip),
                                    noise=schedules.constant(100, 1.3, clip), local_lr=LR,
                                    generator=torch.Generator().manual_seed(seed))

            if trainer().begin_round(base, 1).draws[0].indices.numel() == 0:
                pending.append(trainer().begin_round(base, 1, batcher))
                break
    pending[0].result()
    assert batcher.rounds_batched == len(clips)
    for round_, clip in zip(pending, clips, strict=True):
        key = round_.draws[0].noise
        std = noise_std("poisson", clip, 1.3, 1)
        want = gaussian.reference_pairs((base.size + 1) // 2, key.seed, key.gamma, std)
        update = round_.result().update
        assert update.tobytes() == want[: base.size].numpy().tobytes()
        assert update.base is None and update.flags.owndata  # released as its own array
