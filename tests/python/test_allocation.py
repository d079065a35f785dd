"""Sizes that cannot be allocated name themselves: ValueError for a byte count no
buffer can have, RuntimeError (not a bare MemoryError) for one the allocator refuses.

Every size here needs more bytes than a 64-bit process can address, so it is
refused at once and nothing touches real memory.
"""

from __future__ import annotations

import pytest

import optex


def test_a_state_whose_size_would_wrap_is_a_value_error() -> None:
    with pytest.raises(ValueError, match=rf"optimizer state: dimension {2**62} need more than"):
        optex.init_state(optex.Adam(), 2**62)


def test_a_state_too_large_to_allocate_names_its_bytes() -> None:
    d = 2**46
    with pytest.raises(RuntimeError) as refused:
        optex.init_state(optex.Adam(), d)
    message = str(refused.value)
    assert f"optimizer state: dimension {d}" in message
    assert f"need {2 * d * 4} bytes (2 fp32 slots); allocation failed" in message
    assert not isinstance(refused.value, MemoryError)
