"""Rounds of many clients computed together (RoundBatcher) against each round computed alone."""

from __future__ import annotations

import gc

import numpy as np
import pytest
import torch

from fedsim.data import load_dataset
from fedsim.errors import ModelError
from fedsim.privacy import schedules
from fedsim.training import LocalTrainer, build_model, flat_params
from fedsim.training.batched import RoundBatcher, _jobs, batchable_layers
from fedsim.training.batched_pass import _Batch
from fedsim.training.local import AdaptiveClipConfig
from tests.doubles import RoundTimes

FEATURES, CLASSES = 12, 4

# (sampling, batch size, clip, sigma, extra options): different postures in one batch, one
# with adaptive clipping, one whose Poisson batches are often empty.
POSTURES = [
    ("poisson", 8, 0.5, 1.5, {}),
    ("poisson", 9, 1.0, 1.2, {}),
    ("fixed", 16, 1.5, 1.5, {}),
    ("fixed", 7, 0.2, 0.8, {}),
    ("poisson", 12, 0.7, 1.1, {"adaptive_clip": AdaptiveClipConfig(0.5, 0.2, 10.0)}),
    ("poisson", 1, 1.0, 1.0, {}),
]


def _data(seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    x, y, _, _ = load_dataset("synthetic", seed=seed, num_train=60, num_test=1,
                              num_features=FEATURES, num_classes=CLASSES)
    return x, y


def _trainers(model: torch.nn.Module, **overrides: object) -> list[LocalTrainer]:
    """One trainer per posture, each with its own data and generator (seeded by its index)."""
    trainers = []
    for k, (sampling, batch, clip, sigma, extra) in enumerate(POSTURES):
        x, y = _data(k)
        options = {**extra, **overrides}
        trainers.append(LocalTrainer(
            model, x, y, batch_size=batch, sampling=sampling,
            clip=schedules.constant(100, clip, sigma), noise=schedules.constant(100, clip, sigma),
            local_lr=0.3, generator=torch.Generator().manual_seed(100 + k), **options))
    return trainers


def _params(model: torch.nn.Module, count: int) -> list[np.ndarray]:
    base = flat_params(model)
    rng = np.random.default_rng(7)
    return [base + np.float32(0.05) * rng.standard_normal(base.size).astype(np.float32)
            for _ in range(count)]


def _mlp() -> torch.nn.Module:
    torch.manual_seed(0)
    return build_model("mlp", in_features=FEATURES, hidden=[16, 8], num_classes=CLASSES,
                       activation="tanh")


@pytest.mark.parametrize("model_name", ["mlp", "logreg"])
def test_batched_rounds_equal_each_round_computed_alone(model_name: str) -> None:
    torch.manual_seed(0)
    model = _mlp() if model_name == "mlp" else build_model("logreg", in_features=FEATURES,
                                                           num_classes=CLASSES)
    assert batchable_layers(model) is not None
    together, alone = _trainers(model), _trainers(model)
    batcher = RoundBatcher(model)
    params = _params(model, len(POSTURES))
    for round_index in range(4):  # adaptive clipping's state carries over rounds
        pending = [t.begin_round(p, round_index, batcher) for t, p in zip(together, params, strict=True)]
        assert batcher.pending == len(POSTURES)
        first = pending[2].result()  # any result computes the whole batch
        assert batcher.pending == 0 and all(p.done for p in pending)
        assert first is pending[2].result()
        for p, trainer, w in zip(pending, alone, params, strict=True):
            got, want = p.result(), trainer.run_round(w, round_index)
            assert got.batch_sizes == want.batch_sizes
            assert got.sample_grads == p.sample_grads == sum(want.batch_sizes)
            assert got.steps == want.steps and got.sigma == want.sigma
            assert got.clip == pytest.approx(want.clip, rel=1e-5)
            np.testing.assert_allclose(got.update, want.update, rtol=2e-4, atol=2e-6)
            if want.sample_grads:
                assert got.mean_loss == pytest.approx(want.mean_loss, rel=1e-5)
            else:
                assert np.isnan(got.mean_loss)
    assert batcher.rounds_batched > 0 and batcher.batches >= 1
    # the adaptive client's clipping norm moved and stayed in step with the lone computation
    assert together[4]._adaptive_norm == pytest.approx(alone[4]._adaptive_norm, rel=1e-5)
    assert together[4]._adaptive_norm != POSTURES[4][2]


def test_an_unusable_parameter_vector_fails_only_its_own_round() -> None:
    model = _mlp()
    trainers = _trainers(model)[:4]
    params = _params(model, 4)
    params[1] = params[1].copy()
    params[1][5] = np.nan
    params[3] = params[3][:-1]
    batcher = RoundBatcher(model)
    pending = [t.begin_round(p, 0, batcher) for t, p in zip(trainers, params, strict=True)]
    with pytest.raises(ModelError, match="non-finite"):
        pending[1].result()
    with pytest.raises(ModelError, match="shape"):
        pending[3].result()
    alone = _trainers(model)[:3]
    for k in (0, 2):
        np.testing.assert_allclose(pending[k].result().update,
                                   alone[k].run_round(params[k], 0).update, rtol=2e-4, atol=2e-6)


def test_rounds_a_batch_cannot_take_are_computed_exactly_as_alone() -> None:
    # A CNN (not a chain of Linear layers) and multi-step rounds go through the lone engine.
    torch.manual_seed(0)
    cnn = build_model("dp_mnist_cnn")
    assert batchable_layers(cnn) is None
    x = torch.rand(40, 1, 28, 28)
    y = torch.randint(0, 10, (40,))

    def cnn_trainer() -> LocalTrainer:
        return LocalTrainer(cnn, x, y, batch_size=8, sampling="poisson",
                            clip=schedules.constant(10, 1.0, 1.0),
                            noise=schedules.constant(10, 1.0, 1.0),
                            generator=torch.Generator().manual_seed(3))

    mlp = _mlp()
    multi = [_trainers(mlp, local_steps=2)[k] for k in (0, 2)]
    multi_alone = [_trainers(mlp, local_steps=2)[k] for k in (0, 2)]
    cnn_params, mlp_params = flat_params(cnn), _params(mlp, 2)
    batcher = RoundBatcher(cnn)
    cnn_round = cnn_trainer().begin_round(cnn_params, 0, batcher)
    multi_rounds = [t.begin_round(p, 0, batcher) for t, p in zip(multi, mlp_params, strict=True)]
    cnn_round.result()
    assert batcher.rounds_batched == 0
    np.testing.assert_array_equal(cnn_round.result().update,
                                  cnn_trainer().run_round(cnn_params, 0).update)
    for got, trainer, w in zip(multi_rounds, multi_alone, mlp_params, strict=True):
        np.testing.assert_array_equal(got.result().update, trainer.run_round(w, 0).update)


def test_a_cancelled_round_is_never_computed_and_a_lone_round_uses_the_single_engine() -> None:
    model = _mlp()
    trainers, alone = _trainers(model)[:2], _trainers(model)[:2]
    params = _params(model, 2)
    batcher = RoundBatcher(model)
    pending = [t.begin_round(p, 0, batcher) for t, p in zip(trainers, params, strict=True)]
    pending[0].cancel()
    assert batcher.pending == 1
    pending[1].result()
    assert not pending[0].done and batcher.rounds_batched == 0
    alone[0].begin_round(params[0], 0)  # the cancelled round's draws were still made
    np.testing.assert_array_equal(pending[1].result().update, alone[1].run_round(params[1], 0).update)
    # the cancelled client's generator went on from where its draws left it
    assert torch.equal(trainers[0].generator.get_state(), alone[0].generator.get_state())


def test_drawing_at_begin_keeps_the_generator_order_of_a_computed_round() -> None:
    # begin_round draws everything a round uses, in run_round's order: computing later or
    # never does not change what the next round draws.
    model = _mlp()
    early, late = _trainers(model)[4], _trainers(model)[4]  # the adaptive-clipping posture
    w = _params(model, 1)[0]
    first = early.begin_round(w, 0)
    first.result()
    second_early = early.begin_round(w, 1)
    first_late = late.begin_round(w, 0)
    second_late = late.begin_round(w, 1)
    assert torch.equal(second_early.draws[0].indices, second_late.draws[0].indices)
    assert second_early.draws[0].noise == second_late.draws[0].noise
    assert first_late.draws[0].noise == first.draws[0].noise


def test_a_loss_that_is_not_per_example_fails_every_round_of_the_pass() -> None:
    model = _mlp()

    def mean_loss(outputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        return torch.nn.functional.cross_entropy(outputs, targets)  # one number, not (B,)

    trainers = _trainers(model, loss_fn=mean_loss)[:3]
    batcher = RoundBatcher(model)
    pending = [t.begin_round(p, 0, batcher) for t, p in zip(trainers, _params(model, 3), strict=True)]
    for round_ in pending:
        with pytest.raises(ModelError, match="per-example losses"):
            round_.result()


def test_a_flush_computes_one_pass_of_the_rounds_that_end_soonest() -> None:
    """More rounds pending than a pass holds: a flush computes the due round and the others
    that end soonest, 128 in all (a result computed early waits in memory until its round
    ends); the rest stay pending and are computed, equal to alone, when their turn comes."""
    model = _mlp()
    count = 200
    x, y = _data(0)

    def trainer(k: int) -> LocalTrainer:  # one client a round, as in a run
        return LocalTrainer(model, x, y, batch_size=8, sampling="poisson",
                            clip=schedules.constant(100, 1.0, 1.2),
                            noise=schedules.constant(100, 1.0, 1.2), local_lr=0.3,
                            generator=torch.Generator().manual_seed(500 + k))

    times = RoundTimes()  # no model ever reaches a client: every round may be computed now
    batcher = RoundBatcher(model, schedule=times)
    params = _params(model, 1)[0]
    ends = np.random.default_rng(3).permutation(count).astype(float)
    rounds = []
    for k in range(count):
        rounds.append(trainer(k).begin_round(params, 0, batcher))
        times.set(rounds[-1], float(ends[k]))
    due = int(np.argmax(ends))  # the round ending last is asked for first
    result = rounds[due].result()
    computed = {k for k, r in enumerate(rounds) if r.done}
    soonest = {int(k) for k in np.argsort(ends)[:127]}
    assert computed == soonest | {due} and batcher.pending == count - 128
    expected = [trainer(k).run_round(params, 0) for k in range(count)]  # the same draws, alone
    np.testing.assert_allclose(result.update, expected[due].update, atol=2e-6)
    for k in sorted(set(range(count)) - computed)[:5]:
        np.testing.assert_allclose(rounds[k].result().update, expected[k].update, atol=2e-6)


def _graph_grads(batch: _Batch, chain: list[torch.nn.Module]) -> tuple[torch.Tensor, tuple[torch.Tensor, ...]]:
    """The per-example losses and the loss sum's gradients at every Linear layer's output
    through one autograd graph over every round's products (the pass before issue 24's)."""
    outputs: list[torch.Tensor] = []
    with torch.enable_grad():
        h, index = batch.x, -1
        for module in chain:
            if type(module) is not torch.nn.Linear:
                h = module(h)
                continue
            index += 1
            h = torch.cat([torch.nn.functional.linear(h[start:stop], *batch.weights[k][index])
                           for k, (start, stop) in enumerate(batch.spans)])
            if index == 0:
                h = h.detach().requires_grad_()
            outputs.append(h)
        losses = batch.loss_fn(h, batch.y)
        return losses.detach(), torch.autograd.grad(losses.sum(), outputs)


@pytest.mark.parametrize("shape", ["tanh-mlp", "linear-linear-sigmoid"])
def test_the_pass_computes_what_a_graph_through_every_rounds_products_computes(shape: str) -> None:
    """The pass takes each Linear layer's products and input gradients round by round without
    an autograd graph: its losses, inputs and gradients equal, bit for bit, those of one graph
    through all rounds' products; models with activations between, no activation between two
    Linear layers and one after the last; rounds with an empty batch and rounds sharing a vector."""
    torch.manual_seed(0)
    model = _mlp() if shape == "tanh-mlp" else torch.nn.Sequential(
        torch.nn.Linear(FEATURES, 6), torch.nn.Linear(6, 5), torch.nn.Tanh(),
        torch.nn.Linear(5, CLASSES), torch.nn.Sigmoid())
    chain = batchable_layers(model)
    assert chain is not None
    trainers = _trainers(model)
    params = _params(model, len(trainers))
    params[3] = params[1]  # two clients holding the same received model
    batcher = RoundBatcher(model)
    empty = 0
    for round_index in range(4):
        pending = [t.begin_round(p, round_index, batcher) for t, p in
                   zip(trainers, params, strict=True)]
        jobs = [job for p in pending for job in _jobs(p)]
        empty += sum(job.size == 0 for job in jobs)
        assert batcher._chain_pass is not None
        batch = batcher._chain_pass._gather(jobs)
        forward = batcher._chain_pass._forward(batch)
        losses, grads = _graph_grads(batch, chain)
        assert torch.equal(forward.losses, losses)
        assert len(forward.grads) == len(grads)
        for got, want in zip(forward.grads, grads, strict=True):
            assert torch.equal(got, want)
        # a pass's per-round views, taken in one call a tensor, are the slices themselves
        for tensor, dim in ((batch.x, 0), (forward.grads[0].t(), 1)):
            for view, (start, stop) in zip(batch.rows(tensor, dim), batch.spans, strict=True):
                want = tensor[start:stop] if dim == 0 else tensor[:, start:stop]
                assert (view.shape, view.stride(), view.storage_offset()) == (
                    want.shape, want.stride(), want.storage_offset())
                assert view.untyped_storage().data_ptr() == want.untyped_storage().data_ptr()
        for p in pending:
            p.cancel()
    assert empty  # the batch-1 Poisson posture drew an empty batch


def test_rounds_sharing_a_vector_or_a_data_set_compute_what_rounds_with_their_own_do() -> None:
    """Rounds of clients that share one stored data set (``rows``) are gathered by one
    selection, and rounds of one parameter vector computed one after the other with one sum
    for its finite check: every result equals, bit for bit, that of the same pass over
    clients holding their own copies of their records and of the vector."""
    torch.manual_seed(0)
    model = _mlp()
    x, y = _data(0)
    rows = [torch.arange(k, 60, 3) for k in range(3)] * 2

    def trainers(shared: bool) -> list[LocalTrainer]:
        return [LocalTrainer(
            model, x if shared else x.index_select(0, r).clone(),
            y if shared else y.index_select(0, r).clone(), rows=r if shared else None,
            batch_size=3, sampling="poisson", clip=schedules.constant(100, 1.0, 1.2),
            noise=schedules.constant(100, 1.0, 1.2), generator=torch.Generator().manual_seed(k))
            for k, r in enumerate(rows)]

    vectors = _params(model, 2)
    results = {}
    for shared in (True, False):
        batcher = RoundBatcher(model)
        own = trainers(shared)
        pending = [t.begin_round(vectors[k % 2] if shared else vectors[k % 2].copy(), 0, batcher)
                   for k, t in enumerate(own)]
        results[shared] = [p.result() for p in pending]
        assert batcher.rounds_batched == len(own)
    for a, b in zip(results[True], results[False], strict=True):
        np.testing.assert_array_equal(a.update, b.update)
        assert (a.batch_sizes, a.mean_loss, a.sample_grads) == (b.batch_sizes, b.mean_loss,
                                                                  b.sample_grads)


def test_a_hooked_model_or_sequence_inputs_are_computed_alone() -> None:
    """A hook would not run in the batched pass (it computes the chain's products itself), and
    a Sequential without Flatten applies its first Linear to the last axis of (B, T, d)
    records, which the pass (on flattened rows) does not compute: those rounds are computed
    alone, with the hook and the model's own forward, and nothing is batched."""
    model = _mlp()
    handle = model.net[-1].register_forward_hook(lambda m, args, out: out * 0.5)
    try:
        together, alone = _trainers(model)[:3], _trainers(model)[:3]
        params = _params(model, 3)
        batcher = RoundBatcher(model)
        pending = [t.begin_round(p, 0, batcher) for t, p in zip(together, params, strict=True)]
        for p, trainer, w in zip(pending, alone, params, strict=True):
            np.testing.assert_array_equal(p.result().update, trainer.run_round(w, 0).update)
        assert batcher.rounds_batched == 0 and batcher.batches == 0
    finally:
        handle.remove()

    torch.manual_seed(0)
    sequence = torch.nn.Sequential(torch.nn.Linear(FEATURES // 2, CLASSES))
    assert batchable_layers(sequence) is not None  # a chain, for (B, d) records only

    def trainers() -> list[LocalTrainer]:
        made = []
        for k in range(2):
            x, y = _data(k)
            made.append(LocalTrainer(
                sequence, x.reshape(len(x), 2, FEATURES // 2), y, batch_size=4,
                sampling="fixed", clip=schedules.constant(100, 1.0, 1.0),
                noise=schedules.constant(100, 1.0, 1.0), local_lr=0.3,
                generator=torch.Generator().manual_seed(1 + k),
                loss_fn=lambda out, t: torch.nn.functional.cross_entropy(
                    out.sum(1), t, reduction="none")))
        return made

    batcher = RoundBatcher(sequence)
    w = flat_params(sequence)
    pending = [t.begin_round(w, 0, batcher) for t in trainers()]
    for p, trainer in zip(pending, trainers(), strict=True):
        np.testing.assert_array_equal(p.result().update, trainer.run_round(w, 0).update)
    assert batcher.rounds_batched == 0 and batcher.batches == 0


def test_a_model_changed_after_its_batcher_was_built_is_computed_alone() -> None:
    """A layer frozen after the batcher recognised the chain: the pass would still train it,
    so the rounds are computed alone (which follow the model) and nothing is batched."""
    model = _mlp()
    batcher = RoundBatcher(model)
    model.net[0].weight.requires_grad_(False)
    together, alone = _trainers(model)[:3], _trainers(model)[:3]
    params = _params(model, 3)
    pending = [t.begin_round(p, 0, batcher) for t, p in zip(together, params, strict=True)]
    for p, trainer, w in zip(pending, alone, params, strict=True):
        np.testing.assert_array_equal(p.result().update, trainer.run_round(w, 0).update)
    assert batcher.rounds_batched == 0 and batcher.batches == 0


def test_the_chain_rule_is_decided_again_at_every_flush() -> None:
    """The rule is decided once a flush, not once for the batcher: rounds of a first flush
    are batched, a layer frozen before the next flush makes its rounds computed alone."""
    model = _mlp()
    batcher = RoundBatcher(model)
    params = _params(model, 3)
    first = [t.begin_round(p, 0, batcher) for t, p in zip(_trainers(model)[:3], params,
                                                          strict=True)]
    for p in first:
        p.result()
    assert batcher.rounds_batched == 3 and batcher.batches == 1
    model.net[0].weight.requires_grad_(False)
    together, alone = _trainers(model)[:3], _trainers(model)[:3]
    second = [t.begin_round(p, 1, batcher) for t, p in zip(together, params, strict=True)]
    for p, trainer, w in zip(second, alone, params, strict=True):
        np.testing.assert_array_equal(p.result().update, trainer.run_round(w, 1).update)
    assert batcher.rounds_batched == 3 and batcher.batches == 1


def test_rounds_after_one_computed_alone_are_decided_again() -> None:
    """A round computed alone inside a flush runs user code (its loss function) that may
    change the model: the rounds after it are decided again (here a layer it froze sends
    them to be computed alone; batched, the pass would have trained the frozen layer)."""
    model = _mlp()
    batcher = RoundBatcher(model)

    def freezing_loss(out: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        model.net[0].weight.requires_grad_(False)
        return torch.nn.functional.cross_entropy(out, target, reduction="none")

    x, y = _data(9)
    alone = LocalTrainer(model, x, y, batch_size=8, sampling="fixed",
                         clip=schedules.constant(100, 1.0, 1.0),
                         noise=schedules.constant(100, 1.0, 1.0), local_lr=0.3, local_steps=2,
                         generator=torch.Generator().manual_seed(5), loss_fn=freezing_loss)
    trainers = _trainers(model)[:4]
    order = [trainers[0], trainers[1], alone, trainers[2], trainers[3]]
    params = _params(model, 5)
    pending = [t.begin_round(p, 0, batcher) for t, p in zip(order, params, strict=True)]
    pending[0].result()
    assert batcher.rounds_batched == 2  # the two decided before the freeze
    fresh = _trainers(model)[2:4]  # the same postures and generators, the model now frozen
    for later, trainer, w in zip(pending[3:], fresh, params[3:], strict=True):
        np.testing.assert_array_equal(later.result().update, trainer.run_round(w, 0).update)
    assert batcher.rounds_batched == 2


@pytest.mark.parametrize("hidden", [[16, 8], [15]])
def test_a_released_update_owns_its_memory_and_the_network_takes_it_uncopied(
        hidden: list[int]) -> None:
    """On the CPU a batched round's update is the numpy array its memory belongs to, so the
    in-process network seals it as it is (made read-only) instead of copying a view of a
    tensor's memory; a model of an odd size (the update padded to whole noise pairs) releases
    a copy of its first values, an array of its own, which the network takes as it is too.
    Either way the values are the pass's."""
    from fedsim.protocol import codec
    from fedsim.protocol.messages import ClientUpdate

    torch.manual_seed(0)
    model = build_model("mlp", in_features=FEATURES, hidden=hidden, num_classes=CLASSES,
                        activation="tanh")
    size = sum(p.numel() for p in model.parameters())
    assert size % 2 == (1 if hidden == [15] else 0)
    batcher = RoundBatcher(model)
    trainers = _trainers(model)
    params = _params(model, len(POSTURES))
    pending = [t.begin_round(p, 0, batcher) for t, p in zip(trainers, params, strict=True)]
    results = [p.result() for p in pending]
    assert batcher.rounds_batched == len(POSTURES)
    # Nothing of the pass can still write an update released as its own array: no live
    # tensor shares its memory.
    gc.collect()
    spans = [(r.update.ctypes.data, r.update.ctypes.data + r.update.nbytes) for r in results]
    for obj in gc.get_objects():  # (other tests' objects too: lazy parameters, meta tensors)
        if not issubclass(type(obj), torch.Tensor) or issubclass(
                type(obj), torch.nn.parameter.UninitializedTensorMixin):
            continue
        try:
            if obj.device.type != "cpu":
                continue
            storage = obj.untyped_storage()
            start, end = storage.data_ptr(), storage.data_ptr() + storage.nbytes()
        except (RuntimeError, ValueError):  # no storage to overlap
            continue
        assert not any(start < high and low < end for low, high in spans)
    for k, result in enumerate(results):
        update = result.update
        assert update.shape == (size,) and update.dtype == np.float32
        values = update.copy()
        sealed = codec.seal(ClientUpdate(f"c{k}", 0, 0, update, 8.0))
        assert update.base is None and update.flags.owndata
        assert sealed.body is update and not update.flags.writeable  # given up, not copied
        opened = sealed.open(expected_params=size)
        assert isinstance(opened, ClientUpdate)
        np.testing.assert_array_equal(opened.delta, values)


def _draw_values(pending: object) -> list[tuple[list[int], tuple[int, int], object]]:
    """A round's draws as plain values (batch indices, noise key, count-noise key)."""
    return [(d.indices.tolist(), (d.noise.seed, d.noise.gamma),
             None if d.count_noise is None else (d.count_noise.seed, d.count_noise.gamma))
            for d in pending.draws]  # type: ignore[attr-defined]


def test_a_batched_round_draws_at_its_pass_what_it_drew_when_it_began() -> None:
    """Rounds waiting in a batcher draw their randomness when the pass first reads it (the
    pass's rounds one after the other), not when they begin: each round still gets the values
    of a round drawn at its start, including after a round cancelled before its pass (its
    draws are made at the cancel), so a client's stream is the one it always was."""
    model = _mlp()
    lazy, eager = _trainers(model), _trainers(model)
    batcher = RoundBatcher(model)
    params = _params(model, len(POSTURES))
    for round_index in range(5):
        states = [t.generator.get_state() for t in lazy]
        begun = [t.begin_round(p, round_index, batcher) for t, p in zip(lazy, params, strict=True)]
        # nothing is drawn yet: every generator is where it was before the rounds began
        assert all(torch.equal(t.generator.get_state(), s)
                   for t, s in zip(lazy, states, strict=True))
        expected = [_draw_values(t.begin_round(p, round_index))
                    for t, p in zip(eager, params, strict=True)]
        if round_index == 2:  # a crash before the pass: never computed, its draws still made
            begun[1].cancel()
            assert not torch.equal(lazy[1].generator.get_state(), states[1])
        begun[0].result()  # the pass: every other round's draws made there
        assert all(not torch.equal(t.generator.get_state(), s)
                   for t, s in zip(lazy, states, strict=True))
        assert [_draw_values(b) for b in begun] == expected
        assert [b.sample_grads for b in begun] == [sum(len(i) for i, _, _ in e)
                                                    for e in expected]


def test_a_round_begun_without_a_batcher_draws_at_once() -> None:
    """Alone (a deployed client's round, ``run_round``), a round draws when it begins, as the
    generator's order of use has always been."""
    model = _mlp()
    trainer = _trainers(model)[0]
    before = trainer.generator.get_state()
    pending = trainer.begin_round(_params(model, 1)[0], 0)
    assert not torch.equal(trainer.generator.get_state(), before)
    assert pending.sample_grads == len(pending.draws[0].indices)
