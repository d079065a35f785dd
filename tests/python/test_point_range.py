"""optex.point_range: the C++ split of a round's points over groups of workers
(DistributedEngine's, and optex.torch's under torch.distributed)."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

import optex


def reference_split(points: int, groups: int, group: int) -> range:
    """The documented split, written out: group sizes points // groups, plus one
    for the first points % groups groups, laid end to end."""
    sizes = [points // groups + (1 if g < points % groups else 0) for g in range(groups)]
    first = sum(sizes[:group])
    return range(first, first + sizes[group])


@st.composite
def splits(draw) -> tuple[int, int, int]:
    points = draw(st.integers(1, 10_000))
    groups = draw(st.integers(1, points + 8))  # more groups than points is allowed
    return points, groups, draw(st.integers(0, groups - 1))


@given(splits())
def test_matches_the_reference(split: tuple[int, int, int]) -> None:
    assert optex.point_range(*split) == reference_split(*split)


@given(st.integers(1, 300), st.integers(1, 40))
def test_the_groups_cover_every_point_once_in_order(points: int, groups: int) -> None:
    blocks = [optex.point_range(points, groups, g) for g in range(groups)]
    assert [i for block in blocks for i in block] == list(range(points))
    sizes = [len(block) for block in blocks]
    assert sizes == sorted(sizes, reverse=True)  # the larger blocks first
    assert max(sizes) - min(sizes) <= 1


def test_small_cases() -> None:
    assert optex.point_range(3, 2, 0) == range(0, 2)
    assert optex.point_range(3, 2, 1) == range(2, 3)
    assert optex.point_range(2, 3, 2) == range(2, 2)
    assert isinstance(optex.point_range(1, 1, 0), range)


@pytest.mark.parametrize(
    ("args", "error", "message"),
    [
        ((0, 1, 0), ValueError, "points: must be >= 1, got 0"),
        ((-2, 1, 0), ValueError, "points: must be >= 1, got -2"),
        ((4, 0, 0), ValueError, "groups: must be >= 1, got 0"),
        ((4, 2, 2), IndexError, "group: 2 is outside [0, 2)"),
        ((4, 2, -1), IndexError, "group: -1 is outside [0, 2)"),
    ],
)
def test_bad_arguments_raise_naming_them(args, error, message) -> None:
    with pytest.raises(error) as raised:
        optex.point_range(*args)
    assert str(raised.value) == message


def test_exported_and_documented() -> None:
    assert "point_range" in optex.__all__
    assert "DistributedEngine" in optex.point_range.__doc__
