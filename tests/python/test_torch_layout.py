"""optex.torch.layout.FlatLayout: the parameters of the param groups as one float32 vector.

Needs PyTorch (skips without it, as test_torch.py).
"""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

torch = pytest.importorskip("torch", reason="optex.torch needs PyTorch (pip install torch); not installed here")

from optex.torch.layout import FlatLayout, Segment  # noqa: E402

shapes = st.lists(st.integers(0, 4), min_size=0, max_size=3).map(tuple)
dtypes = st.sampled_from([torch.float32, torch.float64])


def bits(t: torch.Tensor) -> bytes:
    return t.detach().contiguous().numpy().tobytes()


def make_param(shape: tuple[int, ...], dtype: torch.dtype, seed: int) -> torch.nn.Parameter:
    """Values that float32 holds exactly, whatever the dtype."""
    g = torch.Generator().manual_seed(seed)
    return torch.nn.Parameter(torch.randn(shape, generator=g).to(dtype))


@st.composite
def param_groups(draw) -> list[list[torch.nn.Parameter]]:
    """1 to 3 groups of 0 to 3 parameters of mixed shapes and dtypes, at least one element."""
    groups = draw(st.lists(st.lists(st.tuples(shapes, dtypes), max_size=3), min_size=1, max_size=3))
    params = [[make_param(shape, dtype, seed=7 * g + j) for j, (shape, dtype) in enumerate(group)]
              for g, group in enumerate(groups)]
    if sum(p.numel() for group in params for p in group) == 0:
        params[0].append(make_param((2, 3), torch.float32, seed=99))
    return params


@settings(max_examples=60, deadline=None)
@given(param_groups())
def test_params_to_flat_to_params_is_bit_for_bit(groups) -> None:
    layout = FlatLayout(groups)
    params = [p for group in groups for p in group]
    before = [bits(p) for p in params]
    flat = layout.flatten()
    assert flat.dtype == torch.float32 and flat.shape == (layout.dim,)
    # Groups in order, then parameters, each row-major.
    expected = torch.cat([torch.zeros(0)] + [p.detach().reshape(-1).float() for p in params])
    assert bits(flat) == bits(expected)
    with torch.no_grad():
        for p in params:
            p.fill_(123.0)
    layout.write(flat)
    assert [bits(p) for p in params] == before
    assert [p.dtype for p in params] == [p.dtype for p in layout.params]


@settings(max_examples=60, deadline=None)
@given(param_groups(), st.integers(0, 2**31 - 1))
def test_flat_to_params_to_flat_is_bit_for_bit(groups, seed) -> None:
    layout = FlatLayout(groups)
    flat = torch.randn(layout.dim, generator=torch.Generator().manual_seed(seed))
    layout.write(flat)
    assert bits(layout.flatten()) == bits(flat)
    layout.check_holds(flat)  # does not raise


@settings(max_examples=60, deadline=None)
@given(param_groups())
def test_segments_and_group_ranges_tile_the_vector(groups) -> None:
    layout = FlatLayout(groups)
    ranges = layout.group_ranges()
    assert len(ranges) == len(groups)
    segments = iter(layout.segments())
    offset = 0
    for group, span in zip(groups, ranges):
        assert span.offset == offset
        for p in group:
            segment = next(segments)
            assert segment == Segment(offset, p.numel())
            offset = segment.stop
        assert span.stop == offset
    assert offset == layout.dim


def test_group_ranges_of_three_groups() -> None:
    a, b = torch.nn.Parameter(torch.zeros(2, 3)), torch.nn.Parameter(torch.zeros(4))
    c = torch.nn.Parameter(torch.zeros(5, dtype=torch.float64))
    d = torch.nn.Parameter(torch.zeros(3, 1, 2))
    layout = FlatLayout([[a, b], [c], [d]])
    assert layout.group_ranges() == [Segment(0, 10), Segment(10, 5), Segment(15, 6)]
    assert [(r.offset, r.size) for r in layout.group_ranges()] == [(0, 10), (10, 5), (15, 6)]
    assert layout.dim == 21
    assert layout.params == [a, b, c, d]


def test_a_group_without_elements_has_an_empty_range() -> None:
    a, b = torch.nn.Parameter(torch.zeros(3)), torch.nn.Parameter(torch.zeros(0))
    layout = FlatLayout([[a], [], [b], [a.new_zeros(2)]])
    assert layout.group_ranges() == [Segment(0, 3), Segment(3, 0), Segment(3, 0), Segment(3, 2)]


def test_no_elements_at_all_is_refused() -> None:
    with pytest.raises(ValueError, match="params: the parameters have no elements"):
        FlatLayout([[torch.nn.Parameter(torch.zeros(0))], []])


def test_missing_gradients_read_as_zeros() -> None:
    a, b = torch.nn.Parameter(torch.zeros(2, 2)), torch.nn.Parameter(torch.zeros(3))
    c = torch.nn.Parameter(torch.zeros(2, dtype=torch.float64))
    layout = FlatLayout([[a, b], [c]])
    a.grad = torch.arange(4.0).view(2, 2)
    c.grad = torch.tensor([0.1, -2.5], dtype=torch.float64)  # rounded to float32
    out = torch.full((layout.dim,), float("nan"))
    layout.read_grads(out)
    expected = torch.tensor([0, 1, 2, 3, 0, 0, 0, 0.1, -2.5], dtype=torch.float32)
    assert bits(out) == bits(expected)
    layout.clear_grads()
    assert a.grad is None and b.grad is None and c.grad is None


def test_a_sparse_gradient_is_refused() -> None:
    a = torch.nn.Parameter(torch.zeros(4))
    layout = FlatLayout([[a]])
    a.grad = torch.zeros(4).to_sparse()
    with pytest.raises(ValueError, match="closure: produced a sparse gradient"):
        layout.read_grads(torch.empty(4))


def test_check_holds_names_the_changed_parameter() -> None:
    a, b = torch.nn.Parameter(torch.zeros(2)), torch.nn.Parameter(torch.zeros(3, dtype=torch.float64))
    layout = FlatLayout([[a], [b]])
    flat = torch.tensor([1.0, 2.0, 0.1, 0.2, 0.3])
    layout.write(flat)
    layout.check_holds(flat)  # a float64 parameter holds the float32 values cast
    with torch.no_grad():
        b[1] += 1e-9
    with pytest.raises(RuntimeError, match=r"step: parameter 1 \(in the order param groups, then parameters\)"):
        layout.check_holds(flat)
