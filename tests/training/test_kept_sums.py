"""A round that keeps its clipped sums (deployed clients under ``interrupt: switch``): the same
update as the plain path for every sequence of splits, and a split computes again only the
records due from it on (fedsim.training.kept_sums)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from fedsim.data import load_dataset
from fedsim.privacy import schedules
from fedsim.training import LocalTrainer, build_model, flat_params
from fedsim.training.kept_sums import SPLIT_POINTS_PER_STEP, RoundSums, keeps_sums
from fedsim.training.local import AdaptiveClipConfig
from fedsim.training.rounds import record_phase

FEATURES, CLASSES = 6, 3


def _trainer(model: torch.nn.Module, *, sampling: str, local_steps: int, adaptive: bool,
             records: int = 60, seed: int = 4) -> LocalTrainer:
    x, y, _, _ = load_dataset("synthetic", seed=seed, num_train=records, num_test=1,
                              num_features=FEATURES, num_classes=CLASSES)
    return LocalTrainer(
        model, x, y, batch_size=20, sampling=sampling, clip=schedules.constant(100, 1.1, 0.5),
        noise=schedules.constant(100, 1.1, 0.5), local_steps=local_steps, local_lr=0.3,
        generator=torch.Generator().manual_seed(seed),
        adaptive_clip=AdaptiveClipConfig(0.5, 0.2, 4.0) if adaptive else None)


def _models(seed: int) -> tuple[torch.nn.Module, list[np.ndarray]]:
    torch.manual_seed(0)
    model = build_model("mlp", in_features=FEATURES, num_classes=CLASSES, hidden=[7])
    w0 = flat_params(model)
    rng = np.random.default_rng(seed)
    return model, [w0] + [w0 + np.float32(0.3) * rng.standard_normal(w0.size).astype(np.float32)
                          for _ in range(3)]


def _same_clip_state(keeping: LocalTrainer, plain: LocalTrainer) -> None:
    """Adaptive clipping's norm left alike (None alike without it: pytest 9's approx takes
    no None)."""
    got, want = keeping.adaptive_state(), plain.adaptive_state()
    assert (got is None) == (want is None)
    if want is not None:
        assert got == pytest.approx(want, rel=1e-9)


@pytest.mark.parametrize("sampling", ["poisson", "fixed"])
@pytest.mark.parametrize("local_steps", [1, 2])
@pytest.mark.parametrize("adaptive", [False, True])
@pytest.mark.parametrize("splits", [(), (0.3,), (0.05, 0.61), (0.2, 0.45, 0.97)])
def test_kept_sums_give_the_plain_paths_update_after_every_split(
        sampling: str, local_steps: int, adaptive: bool, splits: tuple[float, ...]) -> None:
    """Computed after each split (as a deployed client does), the kept sums' update equals the
    plain path's for the same segments computed once, as do the adaptive clip it leaves and
    the round's other results."""
    model, ws = _models(len(splits))
    keeping = _trainer(model, sampling=sampling, local_steps=local_steps, adaptive=adaptive)
    plain = _trainer(model, sampling=sampling, local_steps=local_steps, adaptive=adaptive)
    for round_index in range(2):
        kept = keeping.begin_round(ws[0], round_index)
        assert kept.keep_sums() == SPLIT_POINTS_PER_STEP * local_steps
        kept.result()
        once = plain.begin_round(ws[0], round_index)
        for fraction, w in zip(splits, ws[1:], strict=False):
            kept.switch(fraction, w)
            kept.result()
            once.switch(fraction, w)
        got, want = kept.result(), once.result()
        assert [d.indices.tolist() for d in kept.draws] == [d.indices.tolist() for d in once.draws]
        np.testing.assert_allclose(got.update, want.update, rtol=2e-5, atol=2e-6)
        assert (got.batch_sizes, got.sample_grads, got.steps) == \
            (want.batch_sizes, want.sample_grads, want.steps)
        assert got.clip == pytest.approx(want.clip, rel=1e-9)
        assert got.mean_loss == pytest.approx(want.mean_loss, rel=1e-5, nan_ok=True)
        _same_clip_state(keeping, plain)


def _computed_once(local_steps: int, round_index: int, seed: int):  # noqa: ANN202
    """A fixed-batch round (20 records a step) that keeps its sums, computed once: its
    trainer, the round, its sums and the models to split it with."""
    model, ws = _models(seed)
    trainer = _trainer(model, sampling="fixed", local_steps=local_steps, adaptive=False)
    pending = trainer.begin_round(ws[0], round_index)
    pending.keep_sums()
    sums = pending.kept
    assert isinstance(sums, RoundSums)
    pending.result()
    assert sums.records_computed == 20 * local_steps
    return trainer, pending, sums, ws


def test_a_split_computes_again_only_the_records_due_from_it() -> None:
    """One local step, a fixed batch of 20: the first compute takes every record once; a
    split at f takes the records due from f on twice (out at the old w, in at the new), the
    others not at all; a model arriving after the round's compute time changes nothing."""
    trainer, pending, sums, ws = _computed_once(1, 3, 0)
    phases = record_phase(trainer.phase_offsets[pending.draws[0].indices], 3).numpy()
    for fraction, w in ((0.4, ws[1]), (0.9, ws[2])):
        before = sums.records_computed
        pending.switch(fraction, w)
        pending.result()
        expected = int((phases >= fraction).sum())
        assert sums.records_computed - before == 2 * expected
        assert 0 < expected < 20
    before = sums.records_computed
    pending.switch(1.0, ws[3])
    pending.result()
    assert sums.records_computed == before


def test_a_split_in_the_first_step_computes_the_second_whole() -> None:
    """Two local steps: a split in the first step takes out and adds its records from the
    split on, and the second step (whose start point moved) is computed whole."""
    trainer, pending, sums, ws = _computed_once(2, 1, 1)
    phases = record_phase(trainer.phase_offsets[pending.draws[0].indices], 1).numpy()
    pending.switch(0.25, ws[1])  # half way through step 0
    pending.result()
    assert sums.records_computed - 40 == 2 * int((phases >= 0.5).sum()) + 20
    # a split in the second step leaves the first's sum as it is
    phases = record_phase(trainer.phase_offsets[pending.draws[1].indices], 1).numpy()
    before = sums.records_computed
    pending.switch(0.8, ws[2])
    pending.result()
    assert sums.records_computed - before == 2 * int((phases >= 0.6).sum())


def test_a_model_too_large_keeps_no_sums() -> None:
    """Kept sums hold at most 64 MB a round, three model-sized vectors a local step: a
    100,000-value model keeps them, as does a 5 M one; a 6 M one (or 2 M at three local steps)
    does not, and a split then recomputes the round whole (released by the old rule)."""
    assert keeps_sums(101_770, 1) and keeps_sums(5_000_000, 1)
    assert not keeps_sums(6_000_000, 1) and not keeps_sums(2_000_000, 3)


def test_a_round_in_a_batcher_keeps_no_sums() -> None:
    """The batched pass computes its rounds whole: a round waiting there keeps no sums."""
    from fedsim.training.batched import RoundBatcher
    model, ws = _models(0)
    trainer = _trainer(model, sampling="fixed", local_steps=1, adaptive=False)
    pending = trainer.begin_round(ws[0], 0, RoundBatcher(model))
    assert pending.keep_sums() == 0 and pending.kept is None


@pytest.mark.parametrize("huge", [1e30, 3e38])
@pytest.mark.parametrize("side", ["before", "after"])
def test_kept_sums_with_a_non_finite_record_give_the_plain_paths_update(huge: float,
                                                                       side: str) -> None:
    """A record whose gradient norm is not finite contributes zero, as in the plain path's
    step (the step computed again without it where 0 x inf made the sum nan), before and
    after a split, whether the split moves that record or not."""
    from tests.training.test_nonfinite_records import BAD, _model
    from tests.training.test_nonfinite_records import _trainer as bad_trainer

    model = _model("linear")
    w0 = flat_params(model)
    keeping, plain = bad_trainer(model, huge, 6), bad_trainer(model, huge, 6)
    kept, once = keeping.begin_round(w0, 0), plain.begin_round(w0, 0)
    kept.keep_sums()
    kept.result()
    bad_phase = float(record_phase(keeping.phase_offsets[torch.tensor([BAD])], 0)[0])
    # a split just after the bad record is due leaves it in the kept sum; just before, moves it
    fraction = min(0.999, bad_phase + 1e-3) if side == "before" else max(0.0, bad_phase - 1e-3)
    for pending in (kept, once):
        pending.switch(fraction, w0 + np.float32(0.01))
    got, want = kept.result(), once.result()
    assert np.isfinite(got.update).all() and got.nonfinite_examples == 1
    assert want.nonfinite_examples == 1
    np.testing.assert_allclose(got.update, want.update, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("local_steps", [1, 2])
@pytest.mark.parametrize("adaptive", [False, True])
def test_a_paced_round_computes_each_record_once_and_gives_the_plain_update(
        local_steps: int, adaptive: bool) -> None:
    """As a deployed client computes it: an eighth of a step at a time (advance), with w-hats
    taking effect from the first point not computed yet. Every record is computed exactly
    once, and the update (and adaptive clip) is the plain path's for the same segments."""
    model, ws = _models(7)
    keeping = _trainer(model, sampling="poisson", local_steps=local_steps, adaptive=adaptive)
    plain = _trainer(model, sampling="poisson", local_steps=local_steps, adaptive=adaptive)
    for round_index in range(2):
        kept, once = keeping.begin_round(ws[0], round_index), plain.begin_round(ws[0], round_index)
        points = kept.keep_sums()
        sums = kept.kept
        assert isinstance(sums, RoundSums) and points == 8 * local_steps
        arrivals = {2: ws[1], 3: ws[2], points - 2: ws[3]}  # after the part before that point
        for point in range(points):
            kept.advance((point + 1) / points)
            if point + 1 in arrivals:
                for pending in (kept, once):
                    pending.switch((point + 1) / points, arrivals[point + 1])
        got, want = kept.result(), once.result()
        assert sums.records_computed == sum(len(d.indices) for d in kept.draws)
        np.testing.assert_allclose(got.update, want.update, rtol=2e-5, atol=2e-6)
        assert got.batch_sizes == want.batch_sizes
        _same_clip_state(keeping, plain)


def test_a_part_advanced_after_a_split_drops_the_later_steps_sums() -> None:
    """Two local steps computed whole, a split in the first, then only part of the first step
    brought up to date: the second step's kept sum (from the old first step) is not used;
    the update is the plain path's."""
    model, ws = _models(3)
    keeping = _trainer(model, sampling="fixed", local_steps=2, adaptive=False)
    plain = _trainer(model, sampling="fixed", local_steps=2, adaptive=False)
    kept, once = keeping.begin_round(ws[0], 0), plain.begin_round(ws[0], 0)
    kept.keep_sums()
    kept.result()
    for pending in (kept, once):
        pending.switch(0.2, ws[1])
    kept.advance(0.3)
    np.testing.assert_allclose(kept.result().update, once.result().update, rtol=2e-5,
                               atol=2e-6)


@pytest.mark.parametrize("huge", [1e30, 3e38])
def test_a_paced_round_with_a_non_finite_record_gives_the_plain_update(huge: float) -> None:
    """Paced, a record whose gradient norm is not finite contributes zero; where its part's
    sum went nan, that part is summed again without it (the plain path does the step again),
    and no other part is computed twice."""
    from tests.training.test_nonfinite_records import BAD, _model
    from tests.training.test_nonfinite_records import _trainer as bad_trainer

    model = _model("linear")
    w0 = flat_params(model)
    keeping, plain = bad_trainer(model, huge, 6), bad_trainer(model, huge, 6)
    kept, once = keeping.begin_round(w0, 0), plain.begin_round(w0, 0)
    points = kept.keep_sums()
    sums = kept.kept
    assert isinstance(sums, RoundSums)
    for point in range(points):
        kept.advance((point + 1) / points)
    got, want = kept.result(), once.result()
    assert np.isfinite(got.update).all() and got.nonfinite_examples == want.nonfinite_examples == 1
    np.testing.assert_allclose(got.update, want.update, rtol=1e-5, atol=1e-6)
    # nothing again for a zero contribution (1e30); the bad record's part again for a nan
    phases = record_phase(keeping.phase_offsets[kept.draws[0].indices], 0)
    part = torch.floor(phases * points)
    bad_part = int((part == part[kept.draws[0].indices == BAD]).sum())
    assert sums.records_computed == 20 + (bad_part if huge > 1e38 else 0)


def test_an_error_in_a_part_stays_the_rounds_outcome_after_a_split() -> None:
    """A part that raises ends the round with its error (its client's alone); a w-hat arriving
    later does not reset it into a recompute (a review: whether a failed round was released
    depended on whether a model arrived)."""
    model, ws = _models(2)
    trainer = _trainer(model, sampling="fixed", local_steps=1, adaptive=False)
    pending = trainer.begin_round(ws[0], 0)
    pending.keep_sums()

    def broken(pending_round: object, upto: float) -> None:
        raise RuntimeError("the part failed")

    trainer.advance = broken  # type: ignore[method-assign]
    pending.advance(0.5)
    pending.switch(0.75, ws[1])
    with pytest.raises(RuntimeError, match="the part failed"):
        pending.result()
    assert pending.recomputed == 0


@pytest.mark.parametrize("paced", [False, True])
def test_a_cancelled_round_leaves_adaptive_clipping_where_it_began(paced: bool) -> None:
    """A deployed round is computed before its release; a crash before the release cancels
    it, uncharged: the norm its compute moved goes back (an attacker's review: the next
    round's clip depended on a noisy count no one paid for)."""
    model, ws = _models(3)
    trainer = _trainer(model, sampling="poisson", local_steps=2, adaptive=True)
    before = trainer.adaptive_state()
    pending = trainer.begin_round(ws[0], 0)
    if paced:
        pending.keep_sums()
        pending.advance(0.75)  # the first local step done: its norm moved
    else:
        pending.result()
    assert trainer.adaptive_state() != before
    pending.cancel()
    assert trainer.adaptive_state() == before


def _logreg_grads(w: np.ndarray, x: np.ndarray, y: np.ndarray, features: int,
                  classes: int) -> tuple[np.ndarray, np.ndarray]:
    """Per-example gradients of softmax regression (an ``nn.Linear``: weight rows, then
    bias) by hand in float64, and their float32 squared norms (inf where they or the float32
    logits overflow: the engine's non-finite norm)."""
    weight = w[: classes * features].reshape(classes, features).astype(np.float64)
    logits = x @ weight.T + w[classes * features:].astype(np.float64)
    p = np.exp(logits - logits.max(axis=1, keepdims=True))
    p /= p.sum(axis=1, keepdims=True)
    p[np.arange(len(y)), y] -= 1.0
    g = np.concatenate([(p[:, :, None] * x[:, None, :]).reshape(len(y), -1), p], axis=1)
    with np.errstate(over="ignore", invalid="ignore"):
        squares = np.square(g.astype(np.float32)).sum(axis=1, dtype=np.float32)
        logits32 = x.astype(np.float32) @ weight.astype(np.float32).T
    return g, np.where(np.isfinite(logits32).all(axis=1), squares, np.float32(np.inf))


def _split_round_by_hand(trainer: LocalTrainer, pending, clip: float,  # noqa: ANN001
                         adaptive: AdaptiveClipConfig | None) -> tuple[np.ndarray, int, float]:
    """A fixed-batch split round of a softmax regression computed from the rule alone: for
    each step its noise (from its key), plus each record's clipped gradient (factor min(1,
    C / (||g|| + 1e-6))) at the ``w`` of the last segment started by ``(step + phase) /
    local_steps`` less lr times the round's noisy sum before the step, over m; a record whose
    norm is not finite left out. Adaptive clipping moves C after each step (Andrew et al.,
    fixed-size batches). Returns the update, the records left out and the final C."""
    from fedsim.training.dpsgd import noise_std
    from fedsim.training.gaussian import gaussian_noise
    from fedsim.training.local import sum_noise_multiplier

    features = trainer.features.shape[1]
    classes = int(trainer.labels.max()) + 1
    x = trainer.features.numpy().astype(np.float64)
    y = trainer.labels.numpy()
    m, steps, lr = trainer.batch_size, trainer.local_steps, trainer.local_lr
    sigma = pending.steps[0].sigma
    sum_sigma = sigma if adaptive is None else sum_noise_multiplier(
        sigma, adaptive.count_noise_std, "fixed")
    starts = np.array([s.start for s in pending.segments])
    offsets = trainer.phase_offsets.numpy()
    progress = np.zeros(len(pending.params))
    left_out = 0
    for step, draws in enumerate(pending.draws):
        batch = draws.indices.numpy()
        phase = offsets[batch] + (pending.round_index + 1) * (np.sqrt(2) - 1)
        phase -= np.floor(phase)
        owner = np.maximum(np.searchsorted(starts, (step + phase) / steps, side="right") - 1, 0)
        total = gaussian_noise(len(progress), noise_std("fixed", clip, sum_sigma, m),
                               draws.noise, torch.zeros(1)).numpy().astype(np.float64)
        within = 0
        for k, segment in enumerate(pending.segments):
            rows = batch[owner == k]
            if not len(rows):
                continue
            at = (segment.params.astype(np.float64) - lr * progress).astype(np.float32)
            g, squares = _logreg_grads(at, x[rows], y[rows], features, classes)
            finite = np.isfinite(squares)
            left_out += int((~finite).sum())
            norms = np.linalg.norm(g[finite], axis=1)
            total += (g[finite] * np.minimum(1.0, clip / (norms + 1e-6))[:, None]).sum(axis=0) / m
            within += int((norms <= clip).sum())
        progress += total.astype(np.float32)
        if adaptive is not None and draws.count_noise is not None:
            noise = float(gaussian_noise(1, adaptive.count_noise_std, draws.count_noise,
                                         torch.zeros(1, dtype=torch.float64))[0])
            clip = min(adaptive.max_clip, clip * np.exp(
                -adaptive.learning_rate * ((within + noise) / m - adaptive.target_quantile)))
    return progress.astype(np.float32), left_out, clip


@pytest.mark.parametrize("local_steps", [1, 2])
@pytest.mark.parametrize("adaptive", [False, True])
@pytest.mark.parametrize("huge", [None, 1e30, 3e38])
def test_a_round_above_the_kept_budget_is_the_kept_paths_and_the_rules_update(
        monkeypatch: pytest.MonkeyPatch, local_steps: int, adaptive: bool,
        huge: float | None) -> None:
    """A model above KEPT_MAX_BYTES (the budget made 0 here) keeps no sums: a deployed round
    is computed when it begins and, after each split, again whole (counted in
    ``recomputed``) by kept_sums' code with nothing kept. Its update (and the adaptive clip
    it leaves, and the records with a non-finite norm it leaves out) is the kept path's for
    the same splits, up to float rounding (the noise added first here, last there), and the
    rule's computed by hand in numpy; it is bitwise that of a round that never asked to keep
    sums (a simulated client's)."""
    from fedsim.training import kept_sums
    from tests.training.test_nonfinite_records import BAD, _data

    features, classes = 4, 3
    x, y = _data(huge if huge is not None else 1.0)
    if huge is None:
        x[BAD, 0] = 0.5
    config = AdaptiveClipConfig(0.5, 0.2, 4.0) if adaptive else None

    def trainer() -> LocalTrainer:
        torch.manual_seed(0)
        model = torch.nn.Linear(features, classes)
        with torch.no_grad():
            model.weight.fill_(1.0)  # unsaturated at the huge record: its norm overflows
        return LocalTrainer(
            model, x, y, batch_size=12, sampling="fixed", clip=schedules.constant(100, 1.0, 0.5),
            noise=schedules.constant(100, 1.0, 0.5), local_steps=local_steps, local_lr=0.01,
            generator=torch.Generator().manual_seed(11), adaptive_clip=config,
            phase_offsets=torch.from_numpy(np.random.default_rng(3).random(len(x))))

    keeping, large, simulated = trainer(), trainer(), trainer()
    w0 = flat_params(keeping.model)
    rng = np.random.default_rng(5)  # models that move the logits apart (a constant would not)
    ws = [w0 + np.float32(0.2) * rng.standard_normal(w0.size).astype(np.float32)
          for _ in range(3)]
    splits = (0.2, 0.45, 0.8)
    left_out_in_all = 0
    for round_index in range(2):
        clip = keeping.clip_for(round_index)
        kept = keeping.begin_round(w0, round_index)
        assert kept.keep_sums() > 0
        with monkeypatch.context() as patch:
            patch.setattr(kept_sums, "KEPT_MAX_BYTES", 0)
            whole = large.begin_round(w0, round_index)
            assert whole.keep_sums() == 0 and whole.kept is None
        once = simulated.begin_round(w0, round_index)
        kept.result()
        whole.result()
        for fraction, w in zip(splits, ws, strict=True):
            for pending in (kept, whole, once):
                pending.switch(fraction, w)
            kept.result()
            whole.result()
        assert whole.recomputed == len(splits) and len(whole.segments) == 4
        got, want, plain = whole.result(), kept.result(), once.result()
        np.testing.assert_array_equal(got.update, plain.update)
        assert (got.nonfinite_examples, got.clip, got.mean_loss, large.adaptive_state()) == (
            plain.nonfinite_examples, plain.clip, plain.mean_loss, simulated.adaptive_state())
        np.testing.assert_allclose(got.update, want.update, rtol=2e-5, atol=2e-6)
        assert got.nonfinite_examples == want.nonfinite_examples
        _same_clip_state(large, keeping)
        by_hand, left_out, final_clip = _split_round_by_hand(large, whole, clip, config)
        np.testing.assert_allclose(got.update, by_hand, rtol=2e-5, atol=2e-6)
        assert got.nonfinite_examples == left_out
        left_out_in_all += left_out
        if adaptive:
            assert large.adaptive_state() == pytest.approx(final_clip, rel=1e-6)
        assert np.isfinite(got.update).all()
    assert (left_out_in_all > 0) == (huge is not None)
