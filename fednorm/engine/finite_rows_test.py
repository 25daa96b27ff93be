"""The per-client finiteness check of the server update (``_finite_rows``) against an independent
element-by-element reading, for NaN, +inf and -inf anywhere in a row, every float dtype, 1-D
per-client scalars and empty rows."""

from __future__ import annotations

import math

import pytest
import torch

from fednorm.engine.simulator import _finite_rows


def _by_elements(t: torch.Tensor) -> list[bool]:
    rows = t.double().reshape(t.shape[0], -1).tolist()
    return [all(math.isfinite(v) for v in row) for row in rows]


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32, torch.float64])
def test_a_row_is_finite_exactly_when_each_of_its_entries_is(dtype: torch.dtype) -> None:
    gen = torch.Generator().manual_seed(0)
    state = {}
    for i, shape in enumerate([(5, 3, 4), (5, 1), (5, 1000), (5,), (5, 0), (5, 2, 0, 3)]):
        t = torch.randn(shape, generator=gen).to(dtype)
        if t[0].numel():
            for row, bad in ((1, float("nan")), (2, float("inf")), (3, -float("inf"))):
                if (i + row) % 2 == 0:
                    flat = t[row].reshape(-1)
                    flat[int(torch.randint(flat.numel(), (1,), generator=gen))] = bad
        state[f"t{i}"] = t
    state["steps"] = torch.arange(5)  # integer buffers are not read
    out = _finite_rows(state)
    assert list(out) == [k for k in state if state[k].is_floating_point()]
    for key, flags in out.items():
        assert flags == _by_elements(state[key]), key
    assert not all(all(f) for f in out.values())  # the sample does hold non-finite rows
