"""plan_prefill (live reuse vs restore vs fresh, capture rules) and the chunk splitter."""

import pytest

from cairn.actors.checkpoints.disk_format import prefix_hash
from cairn.actors.checkpoints.plan import CapturePoint, common_prefix_len, pieces, plan_prefill
from cairn.actors.checkpoints.store import CheckpointStore

SYSTEM = list(range(1000, 1800))  # 800 tokens
TURN1 = SYSTEM + list(range(3000, 3400))
TURN2 = TURN1 + list(range(4000, 4100))


def store(*prefixes, **kw) -> CheckpointStore:
    s = CheckpointStore(max_slots=8, **kw)
    for p in prefixes:
        s.put(p, "common", b"b")
    return s


def test_first_request_is_fresh_and_captures_system_and_prompt_end():
    p = plan_prefill(TURN1, None, store(), hint_tokens=800)
    assert (p.action, p.start, p.end, p.restore_id) == ("fresh", 0, 1200, None)
    assert p.captures == (CapturePoint(800, "system"),)
    assert p.capture_prompt_end
    assert p.live_miss == "no live state" and p.store_miss == "no stored prefix"
    assert "fresh prefill of 1200 tokens" in p.describe()


def test_prompt_extending_live_state_reuses_it():
    p = plan_prefill(TURN2, TURN1, store(SYSTEM), hint_tokens=800)
    assert (p.action, p.start, p.live_miss) == ("reuse_live", 1200, None)
    assert p.captures == ()                        # system boundary is before the start
    assert p.skipped[0] == "system at 800: not after the start position 1200"


def test_prompt_equal_to_live_state_reuses_it_without_prefill():
    p = plan_prefill(TURN1, TURN1, store())
    assert (p.action, p.start, p.end) == ("reuse_live", 1200, 1200)
    assert list(pieces(p.start, p.end, 128)) == []


def test_divergent_live_state_restores_longest_stored_prefix():
    s = store(SYSTEM[:600], SYSTEM)
    other = SYSTEM + [9] * 300
    p = plan_prefill(other, TURN1, s)
    assert (p.action, p.start, p.restore_id) == ("restore", 800, prefix_hash(SYSTEM))
    assert p.live_miss == "live state diverges at token 800"
    assert p.store_miss is None
    assert "restore checkpoint" in p.describe() and "diverges at token 800" in p.describe()


def test_shorter_than_live_state():
    p = plan_prefill(TURN1[:1000], TURN1, store())
    assert p.action == "fresh" and p.live_miss == "prompt (1000 tokens) is shorter than the live state (1200)"


def test_store_misses_are_explained():
    assert plan_prefill(SYSTEM[:700], None, store(SYSTEM)).store_miss == "stored prefixes all longer than prompt"
    assert plan_prefill([5] * 900, None, store(SYSTEM)).store_miss == "no stored prefix matches (1 stored)"


def test_restore_only_when_it_saves_more_than_it_costs():
    s = store(SYSTEM[:100])
    p = plan_prefill(SYSTEM, None, s, restore_cost_tokens=100)
    assert p.action == "fresh" and "saves less than it costs" in p.store_miss
    assert plan_prefill(SYSTEM, None, s, restore_cost_tokens=99).action == "restore"
    # costs may depend on the entry (a disk-only entry costs a read)
    assert plan_prefill(SYSTEM, None, s, restore_cost_tokens=lambda e: 1000).action == "fresh"


def test_longer_checkpoint_beats_a_shorter_live_state():
    s = store(TURN1)
    p = plan_prefill(TURN2, SYSTEM, s, restore_cost_tokens=64)
    assert (p.action, p.start) == ("restore", 1200)
    assert p.live_miss == "a checkpoint saves more (1200 tokens vs live 800)"
    # ... but not when the gain does not pay the restore
    p = plan_prefill(TURN2, TURN1[:1150], s, restore_cost_tokens=64)
    assert (p.action, p.start) == ("reuse_live", 1150)


def test_equal_length_checkpoint_is_restorable():
    p = plan_prefill(TURN1, [1, 2], store(TURN1))
    assert (p.action, p.start, p.end) == ("restore", 1200, 1200)
    assert not p.capture_prompt_end               # already stored


def test_common_prefix_capture_from_previous_fresh_prompt():
    prev = SYSTEM + [7] * 50
    p = plan_prefill(TURN1, None, store(), previous_fresh_prompt=prev)
    assert p.captures == (CapturePoint(800, "common"),)
    # same boundary as the hint: one capture, kind "system"
    p = plan_prefill(TURN1, None, store(), hint_tokens=800, previous_fresh_prompt=prev)
    assert p.captures == (CapturePoint(800, "system"),)
    assert any("same position" in s for s in p.skipped)
    # both, at different positions, sorted
    p = plan_prefill(TURN1, None, store(), hint_tokens=600, previous_fresh_prompt=prev)
    assert p.captures == (CapturePoint(600, "system"), CapturePoint(800, "common"))
    assert p.capture_positions == (600, 800)


@pytest.mark.parametrize("hint,why", [
    (511, "below minimum 512"),
    (1192, "within the last 8 tokens"),
    (1199, "within the last 8 tokens"),
    (1200, "not inside the prompt"),
    (5000, "not inside the prompt"),
])
def test_capture_limits(hint, why):
    p = plan_prefill(TURN1, None, store(), hint_tokens=hint)
    assert p.captures == () and p.skipped == (f"system at {hint}: {why}",)


def test_capture_limits_edges_accepted():
    assert plan_prefill(TURN1, None, store(), hint_tokens=512).capture_positions == (512,)
    assert plan_prefill(TURN1, None, store(), hint_tokens=1191).capture_positions == (1191,)
    assert plan_prefill(TURN1, None, store(), hint_tokens=600, min_tokens=700, tail_guard=0).captures == ()


def test_no_duplicate_captures_and_only_after_start():
    s = store(SYSTEM)
    p = plan_prefill(TURN1, None, s, hint_tokens=800)
    assert p.action == "restore" and p.captures == ()
    p = plan_prefill(TURN1, TURN1[:900], store(), hint_tokens=800)
    assert p.captures == () and "not after the start position 900" in p.skipped[0]


def test_short_prompts_capture_nothing():
    p = plan_prefill(list(range(300)), None, store(), hint_tokens=200)
    assert p.captures == () and not p.capture_prompt_end


def test_common_prefix_len():
    assert common_prefix_len([1, 2, 3], [1, 2, 4]) == 2
    assert common_prefix_len([1, 2], [1, 2, 3]) == 2
    assert common_prefix_len([], [1]) == 0


def test_pieces_cut_exactly_at_capture_points():
    got = list(pieces(100, 1500, 512, [600, 300]))
    assert got == [(100, 300), (300, 600), (600, 1112), (1112, 1500)]


@pytest.mark.parametrize("start,end,size,cuts", [(0, 5000, 1024, [700, 3001]), (13, 999, 100, [40, 41, 13, 999]),
                                                 (0, 10, 4, [])])
def test_pieces_cover_the_range_split_at_cuts_within_the_size(start, end, size, cuts):
    got = list(pieces(start, end, size, cuts))
    assert got[0][0] == start and got[-1][1] == end
    assert all(a[1] == b[0] for a, b in zip(got, got[1:]))
    assert all(0 < b - a <= size for a, b in got)
    assert {c for c in cuts if start < c < end} <= {b for _, b in got}


def test_pieces_edge_cases():
    assert list(pieces(0, 256, 128, [0, 128, 256])) == [(0, 128), (128, 256)]
    assert list(pieces(5, 5, 128)) == []
    with pytest.raises(ValueError):
        list(pieces(0, 10, 0))


def test_turn_end_capture_replaces_the_prompt_end_one_inside_the_tail_guard():
    # V4 thinking mode: the prompt's last token (`<think>`) is not shared by the next turn
    p = plan_prefill(TURN1, None, store(), hint_tokens=800, turn_end_tokens=1199)
    assert p.captures == (CapturePoint(800, "system"), CapturePoint(1199, "prompt_end"))
    assert not p.capture_prompt_end
    nxt = TURN1[:1199] + [7] + list(range(5000, 5050))      # the next turn diverges at 1199
    s = store()
    s.put(TURN1[:1199], "prompt_end", b"b")
    q = plan_prefill(nxt, TURN1 + [9, 9], s, hint_tokens=800)
    assert (q.action, q.start) == ("restore", 1199)


def test_turn_end_capture_obeys_the_minimum_and_the_store():
    p = plan_prefill(TURN1, None, store(TURN1[:1199]), turn_end_tokens=1199)
    assert p.captures == () and not p.capture_prompt_end
    assert p.skipped == ("prompt_end at 1199 (turn end): not after the start position 1199",)
    p = plan_prefill(TURN1, None, store(), turn_end_tokens=1199, min_tokens=1500)
    assert "prompt_end at 1199 (turn end): below minimum 1500" in p.skipped


def test_last_user_start_is_a_common_capture_beside_the_system_one():
    p = plan_prefill(TURN2, None, store(), hint_tokens=800, turn_tokens=1200)
    assert p.captures == (CapturePoint(800, "system"), CapturePoint(1200, "common"))
    # the first request of a conversation: the last user message starts where the system part ends
    p = plan_prefill(TURN1, None, store(), hint_tokens=800, turn_tokens=800)
    assert p.captures == (CapturePoint(800, "system"),)
    assert "turn at 800: same position as the system capture" in p.skipped
    # the rule-2 common prefix at the same position as the turn start: one capture
    p = plan_prefill(TURN2, None, store(), turn_tokens=1200, previous_fresh_prompt=TURN1 + [5])
    assert p.captures == (CapturePoint(1200, "common"),)
    assert "common at 1200: same position as the turn capture" in p.skipped
    p = plan_prefill(TURN2, None, store(TURN1), hint_tokens=800, turn_tokens=1200)
    assert p.action == "restore" and p.captures == ()


def test_turn_capture_needs_min_tokens_past_the_start():
    # restored the previous turn's prompt end (1100): the turn start adds only the reply
    p = plan_prefill(TURN2, None, store(TURN1[:1100]), turn_tokens=1200)
    assert (p.action, p.start, p.captures) == ("restore", 1100, ())
    assert "turn at 1200: only 100 tokens past the start 1100" in p.skipped
    p = plan_prefill(TURN2, None, store(SYSTEM[:500]), turn_tokens=1200)
    assert p.captures == (CapturePoint(1200, "common"),)
