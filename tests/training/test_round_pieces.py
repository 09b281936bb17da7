"""A round kept in pieces (deployed clients under ``interrupt: switch``): the same update as
the plain path for every sequence of splits, and a split recomputes only the records due from
its piece on (fedsim.training.pieces)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from fedsim.data import load_dataset
from fedsim.privacy import schedules
from fedsim.training import LocalTrainer, build_model, flat_params
from fedsim.training.local import AdaptiveClipConfig
from fedsim.training.pieces import PIECES_PER_STEP, RoundPieces, pieces_per_step
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


@pytest.mark.parametrize("sampling", ["poisson", "fixed"])
@pytest.mark.parametrize("local_steps", [1, 2])
@pytest.mark.parametrize("adaptive", [False, True])
@pytest.mark.parametrize("splits", [(), (0.3,), (0.05, 0.61), (0.2, 0.45, 0.97)])
def test_pieces_give_the_plain_paths_update_after_every_split(
        sampling: str, local_steps: int, adaptive: bool, splits: tuple[float, ...]) -> None:
    """Computed after each split (as a deployed client does), the kept pieces' update equals
    the plain path's for the same segments computed once, as do the adaptive clip it leaves
    and the round's other results."""
    model, ws = _models(len(splits))
    pieced = _trainer(model, sampling=sampling, local_steps=local_steps, adaptive=adaptive)
    plain = _trainer(model, sampling=sampling, local_steps=local_steps, adaptive=adaptive)
    for round_index in range(2):
        kept = pieced.begin_round(ws[0], round_index)
        assert kept.keep_pieces() == PIECES_PER_STEP * local_steps
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
        assert pieced.adaptive_state() == pytest.approx(plain.adaptive_state(), rel=1e-9)


def test_a_split_recomputes_only_the_records_due_from_its_piece_on() -> None:
    """One local step, a fixed batch of 20: the first compute takes every record; a split at f
    takes again exactly the records whose phase lies in f's piece or later; a split in the last
    piece only that piece's."""
    model, ws = _models(0)
    trainer = _trainer(model, sampling="fixed", local_steps=1, adaptive=False)
    pending = trainer.begin_round(ws[0], 3)
    pending.keep_pieces()
    pieces = pending.pieces
    assert isinstance(pieces, RoundPieces)
    pending.result()
    assert pieces.records_computed == 20
    phases = record_phase(trainer.phase_offsets[pending.draws[0].indices], 3).numpy()
    piece = np.floor(phases * PIECES_PER_STEP)
    for fraction, w in ((0.4, ws[1]), (0.9, ws[2])):
        before = pieces.records_computed
        pending.switch(fraction, w)
        pending.result()
        expected = int((piece >= np.floor(fraction * PIECES_PER_STEP)).sum())
        assert pieces.records_computed - before == expected
        assert 0 < expected < 20
    # a model arriving after the round's compute time changes nothing
    before = pieces.records_computed
    pending.switch(1.0, ws[3])
    pending.result()
    assert pieces.records_computed == before


def test_a_later_steps_pieces_are_all_recomputed() -> None:
    """Two local steps: a split in the first step's half forgets its later pieces and every
    piece of the second step (computed from the first step's new result)."""
    pieces = RoundPieces(4, 2)
    for step in range(2):
        for p in range(4):
            pieces.keep(step, p, object())  # type: ignore[arg-type]
    pieces.forget_from(0.3)  # step 0, phase 0.6: piece 2
    assert [[pieces.get(s, p) is not None for p in range(4)] for s in range(2)] == \
        [[True, True, False, False], [False] * 4]
    assert pieces.per_round == 8


def test_a_model_too_large_keeps_no_pieces() -> None:
    """Pieces hold at most 64 MB a round: 8 of a 100,000-value step, 4 (a power of two, so
    that their starts are starts of eighths) above 2 M values, none (a split recomputes the
    round whole, released by the old rule) above 8 M."""
    assert pieces_per_step(101_770, 1) == PIECES_PER_STEP
    assert pieces_per_step(2_500_000, 1) == 4
    assert pieces_per_step(6_000_000, 1) == 2
    assert pieces_per_step(10_000_000, 1) == 1
    assert pieces_per_step(3_000_000, 3) == 1


def test_a_round_in_a_batcher_keeps_no_pieces() -> None:
    """The batched pass computes its rounds whole: a round waiting there keeps no pieces."""
    from fedsim.training.batched import RoundBatcher
    model, ws = _models(0)
    trainer = _trainer(model, sampling="fixed", local_steps=1, adaptive=False)
    pending = trainer.begin_round(ws[0], 0, RoundBatcher(model))
    assert pending.keep_pieces() == 0 and pending.pieces is None


def test_pieces_with_a_non_finite_record_give_the_plain_paths_update() -> None:
    """A record whose gradient norm is not finite contributes zero in its piece, as in the
    plain path's step (computed again without it where 0 x inf made the sum nan)."""
    from tests.training.test_nonfinite_records import HUGE, _model
    from tests.training.test_nonfinite_records import _trainer as bad_trainer

    for huge in HUGE:
        model = _model("linear")
        w0 = flat_params(model)
        pieced, plain = bad_trainer(model, huge, 6), bad_trainer(model, huge, 6)
        kept, once = pieced.begin_round(w0, 0), plain.begin_round(w0, 0)
        kept.keep_pieces()
        kept.result()
        for pending in (kept, once):
            pending.switch(0.5, w0 + np.float32(0.01))
        got, want = kept.result(), once.result()
        assert np.isfinite(got.update).all() and got.nonfinite_examples == 1
        assert want.nonfinite_examples == 1
        np.testing.assert_allclose(got.update, want.update, rtol=1e-5, atol=1e-6)
