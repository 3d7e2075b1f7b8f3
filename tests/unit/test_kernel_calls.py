"""The prefill worker's grouping of plan.pieces into kernel calls (pure)."""

from __future__ import annotations

import pytest

from cairn.actors.prefill import kernel_calls


def test_fresh_prefill_is_segments_on_chunk_multiples():
    assert kernel_calls(0, 1000, 128, 512) == [(0, 512), (512, 1000)]


def test_capture_points_end_a_call_and_the_next_call_realigns():
    calls = kernel_calls(0, 1000, 128, 4096, [300])
    assert calls == [(0, 300), (300, 384), (384, 1000)]


def test_restore_at_an_unaligned_position_starts_with_one_short_piece():
    assert kernel_calls(300, 700, 128, 4096) == [(300, 384), (384, 700)]
    assert kernel_calls(256, 700, 128, 4096) == [(256, 700)]
    assert kernel_calls(700, 700, 128, 4096) == []


@pytest.mark.parametrize("start,end,chunk,seg,cuts", [(0, 5000, 64, 1024, [700, 3001]), (13, 999, 32, 100, [40, 41]),
                                                      (0, 10, 4, 4, [])])
def test_calls_cover_the_range_split_at_cuts_within_the_segment_size(start, end, chunk, seg, cuts):
    calls = kernel_calls(start, end, chunk, seg, cuts)
    assert calls[0][0] == start and calls[-1][1] == end
    assert all(a[1] == b[0] for a, b in zip(calls, calls[1:]))
    ends = {b for _, b in calls}
    assert all(c in ends for c in cuts if start < c < end)
    for a, b in calls:
        assert b - a <= max(seg, chunk)
        assert a % chunk == 0 or b - a <= chunk   # unaligned calls are one short piece
