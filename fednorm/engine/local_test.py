import itertools

import pytest
import torch

from fednorm.engine.local import batch_plan, batch_sizes
from fednorm.engine.rng import derive_seed, torch_generator


def test_epochs_visit_every_sample_once_per_epoch():
    g = torch.Generator().manual_seed(0)
    plan = batch_plan(23, 5, epochs=3, generator=g)
    flat = torch.cat(plan)
    assert len(flat) == 69
    for e in range(3):
        # batches never straddle epochs: each epoch is 5 batches (5,5,5,5,3)
        epoch = torch.cat(plan[5 * e : 5 * e + 5])
        assert sorted(epoch.tolist()) == list(range(23))


def test_trailing_singleton_batch_is_dropped_and_drop_last_honoured():
    assert [len(b) for b in batch_plan(11, 5, generator=torch.Generator().manual_seed(0))] == [5, 5]
    assert [len(b) for b in batch_plan(13, 5, drop_last=True, generator=torch.Generator().manual_seed(0))] == [5, 5]
    assert [len(b) for b in batch_plan(13, 5, generator=torch.Generator().manual_seed(0))] == [5, 5, 3]
    assert [len(b) for b in batch_plan(1, 5, generator=torch.Generator().manual_seed(0))] == [1]


def test_steps_mode_cycles_fresh_permutations():
    plan = batch_plan(7, 3, steps=5, generator=torch.Generator().manual_seed(1))
    assert [len(b) for b in plan] == [3] * 5
    flat = torch.cat(plan)
    assert sorted(flat[:7].tolist()) == list(range(7))  # first pass is a permutation
    small = batch_plan(2, 8, steps=3, generator=torch.Generator().manual_seed(1))
    assert [sorted(b.tolist()) for b in small] == [[0, 1]] * 3


def test_empty_client_has_no_batches():
    assert batch_plan(0, 4) == []


def test_derived_seeds_are_stable_and_distinct():
    a = derive_seed(0, "batches", 3, 7)
    assert a == derive_seed(0, "batches", 3, 7)
    assert len({a, derive_seed(0, "batches", 3, 8), derive_seed(0, "batches", 4, 7), derive_seed(1, "batches", 3, 7)}) == 4
    x = torch.rand(3, generator=torch_generator(5, "x"))
    assert torch.equal(x, torch.rand(3, generator=torch_generator(5, "x")))


def test_the_written_out_sgd_step_equals_torch_optim_sgd_bit_for_bit() -> None:
    from fednorm.engine.local import _sgd_step

    gen = torch.Generator().manual_seed(0)
    for momentum, weight_decay in [(0.0, 0.0), (0.9, 0.0), (0.9, 5e-4), (0.5, 1e-3)]:
        a = [torch.randn(5, 3, generator=gen, requires_grad=True), torch.randn(7, generator=gen, requires_grad=True)]
        b = [t.detach().clone().requires_grad_() for t in a]
        opt = torch.optim.SGD(b, lr=0.05, momentum=momentum, weight_decay=weight_decay)
        buffers: list = [None, None]
        for _ in range(4):
            grads = [torch.randn(t.shape, generator=gen) for t in a]
            for p, q, g in zip(a, b, grads):
                p.grad, q.grad = g.clone(), g.clone()
            _sgd_step(a, buffers, 0.05, momentum, weight_decay)
            opt.step()
            for p, q in zip(a, b):
                assert torch.equal(p, q)


def test_batch_sizes_are_the_drawn_plans_sizes_for_every_setting():
    # The counts the bookkeeping uses must be what the streams draw, whatever the seed.
    for n, b, epochs, steps, drop_last in itertools.product(range(0, 14), (1, 2, 3, 4, 5, 8, 16), (1, 2, 3), (None, 1, 4),
                                                            (False, True)):
        for seed in (0, 7):
            drawn = [len(x) for x in batch_plan(n, b, epochs=epochs, steps=steps, drop_last=drop_last,
                                                generator=torch.Generator().manual_seed(seed))]
            assert batch_sizes(n, b, epochs=epochs, steps=steps, drop_last=drop_last) == drawn, (n, b, epochs, steps, drop_last)


@pytest.mark.parametrize("n,b,drop_last,expected", [(11, 5, False, [5, 5]), (13, 5, True, [5, 5]), (13, 5, False, [5, 5, 3]),
                                                    (1, 5, False, [1]), (1, 5, True, [1]), (10, 5, True, [5, 5])])
def test_batch_sizes_by_hand(n, b, drop_last, expected):
    # A trailing singleton goes (BatchNorm cannot normalise it); a lone short batch stays even with drop_last.
    assert batch_sizes(n, b, drop_last=drop_last) == expected
