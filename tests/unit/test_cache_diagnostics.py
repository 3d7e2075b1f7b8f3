"""Cache diagnostics (daemon/api/cache_diagnostics.py): fingerprints, the comparison (what changed
first, the first divergent token), the vendors' shapes, the bounded table, and the request fields."""

from __future__ import annotations

import pytest

from cairn.daemon.api.anthropic import parse_count_tokens, parse_messages
from cairn.daemon.api.cache_diagnostics import (BLOCK, ENTRY_OVERHEAD, Ask, FingerprintTable, anthropic_diagnostics,
                                                compare, fingerprint, openai_diagnostics, outcome, prepare)
from cairn.daemon.api.responses import parse_responses
from cairn.daemon.api.schemas import APIError

SYSTEM = [{"role": "system", "content": "You are a coding agent."}]
TOOLS = [{"type": "function", "function": {"name": "open_file", "parameters": {"type": "object"}}}]
ASK = {"role": "user", "content": "Open the readme."}
REPLY = {"role": "assistant", "content": "Opened."}
NEXT = {"role": "user", "content": "Now the license."}


def ids(n: int, start: int = 1000) -> list[int]:
    return list(range(start, start + n))


def fp(messages, prompt, tools=TOOLS, model="m", **kw):
    return fingerprint(model, messages, tools, prompt, **kw)


TURN1 = ids(300)                                 # system + tools 0..199, the user's message 200..299
PREV = fp(SYSTEM + [ASK], TURN1)


def test_an_appended_turn_is_a_hit_and_no_divergence_is_reported():
    cur = fp(SYSTEM + [ASK, REPLY, NEXT], TURN1 + ids(50, 9000))
    c = compare(PREV, cur, "msg_1")
    assert c.reason is None and c.first_divergent_token == 300 and c.reusable == 300
    assert c.possible == 300 and c.missed == 0
    assert anthropic_diagnostics(Ask("anthropic", "msg_1"), True, c) is None       # null: no divergence
    assert openai_diagnostics(Ask("openai", "resp-1"), True, c) == {"type": "cache_hit"}
    # the same prompt again (a retry) holds all it can of the earlier one: a hit too
    assert compare(PREV, fp(SYSTEM + [ASK], TURN1), "msg_1").reason is None


def test_a_changed_system_prompt_names_the_system_with_the_exact_token():
    prompt = TURN1[:37] + [7] + TURN1[38:]
    cur = fp([{"role": "system", "content": "You are a coding agent. Today is Monday."}, ASK], prompt)
    c = compare(PREV, cur, "msg_1")
    assert c.reason == "system_changed" and c.first_divergent_token == 37 and c.missed == 300 - 37
    assert anthropic_diagnostics(Ask("anthropic", "msg_1"), True, c) == {
        "cache_miss_reason": {"type": "system_changed", "cache_missed_input_tokens": 263}}
    assert openai_diagnostics(Ask("openai", "resp-1"), True, c) == {
        "type": "cache_miss", "reason": "input_changed", "cache_missed_tokens": 263, "comparison_reusable_tokens": 300}


def test_changed_tools_and_model_come_before_the_system_and_the_messages():
    prompt = TURN1[:150] + [7] * 150
    tools = [{"type": "function", "function": {"name": "open_files", "parameters": {"type": "object"}}}]
    c = compare(PREV, fp(SYSTEM + [ASK], prompt, tools=tools), "r")
    assert (c.reason, c.first_divergent_token) == ("tools_changed", 150)
    assert openai_diagnostics(Ask("openai", "r"), True, c)["reason"] == "tools_changed"
    # a reordered tool schema is a change: the encoder writes JSON in the order it was sent
    a = [{"type": "function", "function": {"name": "f", "parameters": {"type": "object", "properties": {}}}}]
    b = [{"type": "function", "function": {"name": "f", "parameters": {"properties": {}, "type": "object"}}}]
    assert fp(SYSTEM, [1], tools=a).tools != fp(SYSTEM, [1], tools=b).tools
    c = compare(PREV, fp([{"role": "system", "content": "other"}, ASK], prompt, tools=tools, model="n"), "r")
    assert c.reason == "model_changed"
    assert anthropic_diagnostics(Ask("anthropic", "r"), True, c)["cache_miss_reason"]["type"] == "model_changed"


def test_an_edited_earlier_message_is_named_by_its_index():
    turn2 = TURN1 + ids(100, 5000)
    prev = fp(SYSTEM + [ASK, REPLY, NEXT], turn2)
    edited = {"role": "assistant", "content": "Opened it."}
    prompt = turn2[:312] + [1] + ids(80, 7000)
    c = compare(prev, fp(SYSTEM + [ASK, edited, NEXT, {"role": "user", "content": "and?"}], prompt), "msg_2")
    assert (c.reason, c.message_index, c.first_divergent_token) == ("messages_changed", 1, 312)
    assert anthropic_diagnostics(Ask("anthropic", "msg_2"), True, c) == {
        "cache_miss_reason": {"type": "messages_changed", "cache_missed_input_tokens": 400 - 312}}
    # a dropped message (history truncated)
    c = compare(prev, fp(SYSTEM + [ASK], turn2[:250] + [3] * 10), "msg_2")
    assert (c.reason, c.message_index, c.first_divergent_token) == ("messages_changed", 1, 250)


def test_the_reply_is_part_of_what_the_next_turn_reuses():
    reply = [11, 12, 13, 2]                             # the generated ids, EOS last
    done = PREV.finished(reply)
    assert list(done.ids) == TURN1 + reply and done.reusable == 303 and done.prompt_tokens == 300
    assert PREV.finished(None) is PREV and PREV.finished([]) is PREV
    # the next prompt holds the reply's ids exactly: a hit over prompt + reply but the EOS
    c = compare(done, fp(SYSTEM + [ASK, REPLY, NEXT], TURN1 + reply + ids(20, 8000)), "msg_1")
    assert c.reason is None and c.possible == 303
    # re-sent otherwise than generated (tokenized again): the reply, the message after the earlier ones
    c = compare(done, fp(SYSTEM + [ASK, REPLY, NEXT], TURN1 + [11, 99, 13, 2] + ids(20, 8000)), "msg_1")
    assert (c.reason, c.message_index, c.first_divergent_token, c.missed) == ("messages_changed", 1, 301, 2)
    # where the next turn diverges by design (V4 thinking drops `<think>`), no reply is added
    thinking = fp(SYSTEM + [ASK], TURN1, turn_end=299)
    assert thinking.reusable == 299 and thinking.finished(reply) is thinking


def test_a_changed_setting_with_the_same_messages():
    prev = fp(SYSTEM + [ASK], TURN1, thinking=True, effort="high")
    c = compare(prev, fp(SYSTEM + [ASK], TURN1[:299] + [5], thinking=False), "x")
    assert c.reason == "reasoning_changed" and c.first_divergent_token == 299
    assert anthropic_diagnostics(Ask("anthropic", "x"), True, c) == {"cache_miss_reason": {"type": "unavailable"}}
    assert openai_diagnostics(Ask("openai", "x"), True, c)["reason"] == "reasoning_effort_changed"
    c = compare(PREV, fp(SYSTEM + [ASK], TURN1[:299] + [5], response_schema={"type": "object"}), "x")
    assert c.reason == "text_format_changed"
    assert openai_diagnostics(Ask("openai", "x"), True, c)["reason"] == "text_format_changed"
    c = compare(PREV, fp(SYSTEM + [ASK], TURN1[:299] + [5]), "x")     # nothing explains it
    assert c.reason == "unknown" and openai_diagnostics(Ask("openai", "x"), True, c) == {"type": "unavailable"}


def test_what_is_answered_when_nothing_is_compared():
    assert anthropic_diagnostics(None, False, None) is None                      # not asked: null
    assert anthropic_diagnostics(Ask("anthropic", None), False, None) is None    # first turn: null
    assert anthropic_diagnostics(Ask("anthropic", "msg_x"), False, None) == {
        "cache_miss_reason": {"type": "previous_message_not_found"}}
    assert openai_diagnostics(None, False, None) is None
    assert openai_diagnostics(Ask("openai", "resp-x"), False, None) == {"type": "comparison_response_not_found"}


def test_the_table_is_bounded_in_bytes_and_entries_least_recently_used_out():
    one = fp(SYSTEM + [ASK], ids(100))
    t = FingerprintTable(3 * one.nbytes)
    for i in range(4):
        assert t.put(f"r{i}", one)
    assert len(t) == 3 and t.get("r0") is None and t.evicted == 1 and t.bytes == 3 * one.nbytes
    t.get("r1")                                  # used: r2 goes next
    t.put("r4", one)
    assert t.get("r2") is None and t.get("r1") is one
    assert not FingerprintTable(ENTRY_OVERHEAD).put("big", one)     # one entry over the bound: not kept
    few = FingerprintTable(1 << 20, max_entries=2)
    for i in range(3):
        few.put(f"r{i}", one)
    assert len(few) == 2 and few.get("r0") is None
    assert one.nbytes == ENTRY_OVERHEAD + 4 * 100 + 16 * 1


def test_the_latest_earlier_turn_a_prompt_extends_is_found():
    t = FingerprintTable(1 << 20)
    t1 = fp(SYSTEM + [ASK], TURN1).finished([11, 2])
    t2 = fp(SYSTEM + [ASK, REPLY, NEXT], TURN1 + [11, 2] + ids(40, 6000))
    other = fp(SYSTEM + [NEXT], TURN1[:BLOCK] + [9] * 100)           # same first block, another conversation
    t.put("msg_1", t1)
    t.put("msg_2", t2)
    t.put("msg_3", other)
    cur = fp(SYSTEM + [ASK, REPLY, NEXT, REPLY, NEXT], list(t2.ids) + ids(30, 4000))
    assert t.extended(cur)[0] == "msg_2"
    assert t.extended(fp(SYSTEM, TURN1 + [11, 2, 5])) == ("msg_1", t1)
    assert t.extended(fp(SYSTEM, ids(40))) is None                   # shorter than a block: not indexed
    t.put("msg_2", t2)                                               # replaced, still indexed once
    t._drop("msg_2")
    assert t.extended(cur)[0] == "msg_1"


def test_outcome_reports_a_shortfall_against_the_turn_a_prompt_extends():
    t = FingerprintTable(1 << 20)
    t.put("msg_1", PREV)
    cur = fp(SYSTEM + [ASK, REPLY, NEXT], TURN1 + ids(50, 9000))
    p = prepare(t, cur, None)                                        # nothing asked (chat completions)
    assert p.vendor is None and p.extends[0] == "msg_1"
    ev, miss, short = outcome(p, 200, {"from": "checkpoint", "kind": "system", "tokens": 200})
    assert not miss and short
    assert ev["compared_to"] == "msg_1" and ev["first_divergent_token"] == 300 and ev["possible_tokens"] == 300
    assert ev["tokens_lost"] == 100 and ev["restored"]["kind"] == "system"
    assert outcome(p, 300)[2] is False                               # all of it reused: no shortfall
    # asked, and the system changed: a miss; its lost tokens are the client's
    p = prepare(t, fp([{"role": "system", "content": "new"}, ASK], TURN1[:10] + [1] * 290), Ask("anthropic", "msg_1"))
    ev, miss, short = outcome(p, 0)
    assert miss and not short and ev["reason"] == "system_changed" and ev["cache_missed_tokens"] == 290
    assert p.vendor == {"cache_miss_reason": {"type": "system_changed", "cache_missed_input_tokens": 290}}
    t.note({"request_id": "msg_2", **ev}, asked=True, miss=miss, shortfall=short)
    st = t.stats()
    assert st["compared"] == 1 and st["misses"] == 1 and st["recent"][-1]["reason"] == "system_changed"
    p = prepare(t, cur, Ask("openai", "resp-gone"))
    assert p.vendor == {"type": "comparison_response_not_found"} and outcome(p, 0)[0]["reason"] == "not_found"


# --- the request fields -----------------------------------------------------------------------

def anthropic_body(**kw) -> dict:
    return {"model": "m", "max_tokens": 8, "messages": [{"role": "user", "content": "hi"}], **kw}


def test_anthropic_diagnostics_field():
    assert parse_messages(anthropic_body()).diagnostics is None
    assert parse_messages(anthropic_body(diagnostics={"previous_message_id": None})).diagnostics == \
        Ask("anthropic", None)
    assert parse_messages(anthropic_body(diagnostics={"previous_message_id": "msg_1"})).diagnostics == \
        Ask("anthropic", "msg_1")
    for bad, param in (("yes", "diagnostics"), ({}, "diagnostics.previous_message_id"),
                       ({"previous_message_id": 3}, "diagnostics.previous_message_id"),
                       ({"previous_message_id": ""}, "diagnostics.previous_message_id")):
        with pytest.raises(APIError) as e:
            parse_messages(anthropic_body(diagnostics=bad))
        assert e.value.status == 400 and e.value.param == param, bad
    # count_tokens has no such field: accepted as an unknown one, nothing compared
    assert parse_count_tokens({"model": "m", "messages": [{"role": "user", "content": "hi"}],
                               "diagnostics": {"previous_message_id": "msg_1"}}).diagnostics is None


def test_responses_prompt_cache_options_field():
    base = {"model": "m", "input": "hi"}
    assert parse_responses(base).chat.diagnostics is None
    r = parse_responses({**base, "prompt_cache_options": {"comparison_response_id": "resp-1", "mode": "implicit",
                                                          "ttl": "30m"}})
    assert r.chat.diagnostics == Ask("openai", "resp-1")
    assert {"prompt_cache_options.mode", "prompt_cache_options.ttl"} <= set(r.chat.common.ignored)
    assert parse_responses({**base, "prompt_cache_options": {"mode": "explicit"}}).chat.diagnostics is None
    for bad, param in (([], "prompt_cache_options"), ({"mode": "always"}, "prompt_cache_options.mode"),
                       ({"ttl": "1h"}, "prompt_cache_options.ttl"),
                       ({"comparison_response_id": 5}, "prompt_cache_options.comparison_response_id")):
        with pytest.raises(APIError) as e:
            parse_responses({**base, "prompt_cache_options": bad})
        assert e.value.status == 400 and e.value.param == param, bad


def test_status_shows_the_latest_miss():
    from cairn.daemon.api.status import StatusBoard
    from cairn.daemon.cli.client import format_status

    t = FingerprintTable(1 << 20)
    t.note({"request_id": "msg_2", "reason": "system_changed", "first_divergent_token": 37, "tokens_lost": 0},
           asked=True, miss=True, shortfall=False)
    s = StatusBoard(fingerprints=t).snapshot("tiny")
    assert s["cache_diagnostics"]["misses"] == 1 and s["cache_diagnostics"]["recent"][0]["request_id"] == "msg_2"
    assert "1 compared, 1 missed" in format_status(s) and "system_changed at token 37" in format_status(s)
    assert StatusBoard().snapshot("tiny")["cache_diagnostics"] is None
