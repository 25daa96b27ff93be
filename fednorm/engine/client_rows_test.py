"""Clients' samples gathered on first read: the same tensors as an eager gather, and none copied
for a method that never reads them."""

from __future__ import annotations

import pytest
import torch

from fednorm.engine.client_rows import ClientRows, LazyClientContext


def test_client_rows_equal_an_eager_gather_and_gather_only_what_is_read():
    source = torch.arange(40.0).view(20, 2)
    indices = [torch.tensor([3, 1]), torch.tensor([0, 19, 7]), torch.tensor([], dtype=torch.long)]
    rows = ClientRows(source, indices)
    assert len(rows) == 3 and not rows._cache
    assert torch.equal(rows[1], source[indices[1]]) and list(rows._cache) == [1]  # only the client read
    eager = [source.index_select(0, ix) for ix in indices]
    assert all(torch.equal(a, b) for a, b in zip(rows, eager))
    assert torch.equal(rows[-1], eager[-1]) and [t.shape for t in rows[0:2]] == [(2, 2), (3, 2)]
    assert rows[1] is rows[1]  # gathered once per round
    with pytest.raises(IndexError):
        rows[3]


def test_a_lazy_context_gathers_its_client_only_when_read():
    x, y = torch.randn(10, 3), torch.arange(10)
    idx = torch.tensor([8, 2, 5])
    ctx = LazyClientContext(x, y, idx, server_round=1, client_id=4, model=torch.nn.Linear(3, 2), global_state={},
                            local_state={})
    assert ctx.num_examples == 3 and ctx._xy == [None, None]  # counting copies nothing
    assert torch.equal(ctx.y, y[idx]) and ctx._xy[0] is None
    assert torch.equal(ctx.x, x[idx])
    ctx.x = torch.zeros(3, 3)  # a hook may replace them, as on the eager context
    assert torch.equal(ctx.x, torch.zeros(3, 3))
