"""Replies reused exactly, end to end (daemon/protocol/reply_ids.py): the real kernel on the tiny
model, a real daemon, each API's turn 2 re-sending turn 1's reply as that API returned it.

Turn 2 restores the state after turn 1's reply: its cached tokens are at least turn 1's prompt plus
its reply but the final EOS (the decode loop never feeds the last token; the "reply_end" checkpoint
and the live state both hold prompt + reply[:-1]; turn 2 computes that EOS with its own new tokens).
The same turn with one byte of the reply changed (a tool call's id, which the prompt does not even
render) does not use the table. Exactness: turn 2 answers as a daemon with checkpoints off that
prefills the same prompt ids cold.

Random weights end a reply by themselves only under a grammar: a forced tool call, or a JSON reply.
"""

from __future__ import annotations

import numpy as np
import pytest
import trio
from structlog.testing import capture_logs

from daemon_harness import daemon, real_loaded, request, post_ok as post

ON = {"checkpoint_min_tokens": 32}
SYSTEM = "You are a coding agent. " + " ".join(f"Rule {i}: read file_{i}.py before you change it." for i in range(12))
OPEN_PARAMS = {"type": "object", "properties": {"path": {"type": "string", "maxLength": 12},
                                                "line": {"type": "integer", "minimum": 1, "maximum": 999}},
               "required": ["path", "line"]}
CHAT_TOOLS = [{"type": "function", "function": {"name": "open_file", "description": "Open a file at a line",
                                                 "parameters": OPEN_PARAMS}}]
OTHER = {"model": "tiny", "messages": [{"role": "system", "content": "You write short titles."},
                                       {"role": "user", "content": "Title this."}],
         "max_tokens": 3, "temperature": 0}


@pytest.fixture(scope="module")
def loaded(tiny_model_dir):
    return real_loaded(tiny_model_dir)




async def replies(sock) -> dict:
    r = await request(sock, "GET", "/v1/status")
    return r.json()["replies"]


def events(evs, name, **match) -> list[dict]:
    return [e for e in evs if e["event"] == name and all(e.get(k) == v for k, v in match.items())]


def cached(body) -> int:
    u = body["usage"]
    if "prompt_tokens_details" in u:
        return u["prompt_tokens_details"]["cached_tokens"]
    if "input_tokens_details" in u:
        return u["input_tokens_details"]["cached_tokens"]
    return u["cache_read_input_tokens"]


def prompt_of(body) -> int:
    u = body["usage"]
    if "prompt_tokens" in u:
        return u["prompt_tokens"]
    if "input_tokens_details" in u:
        return u["input_tokens"]
    return u["input_tokens"] + u["cache_read_input_tokens"]


def completion_of(body) -> int:
    u = body["usage"]
    return u.get("completion_tokens", u.get("output_tokens"))


def one_byte_off(s: str) -> str:
    return s[:-1] + ("x" if s[-1] != "x" else "y")


# --- each API's second turn -------------------------------------------------------------------

async def test_chat_completions_thinking_with_tools_turn_2_extends_turn_1_reply(loaded, tmp_path):
    """Thinking mode with tools (the reasoning is kept: the reply follows `<think>`); turn 2 right
    after turn 1 extends the live state. A small bias on `</think>` ends the reasoning after a few
    tokens, which here are bytes of no valid UTF-8: returned as U+FFFD, they tokenize otherwise."""
    sock = tmp_path / "c.sock"
    end_think = loaded.tokenizer.token_to_id("</think>")
    msgs = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": "Open the readme."}]
    body = {"model": "tiny", "messages": msgs, "tools": CHAT_TOOLS, "max_tokens": 200, "temperature": 0,
            "thinking": {"type": "enabled"}, "logit_bias": {str(end_think): 4},
            "tool_choice": {"type": "function", "function": {"name": "open_file"}}}
    with trio.fail_after(240), capture_logs() as evs:
        async with daemon(loaded, sock, **ON):
            t1 = await post(sock, "/v1/chat/completions", body)
            reply = t1["choices"][0]["message"]
            assert t1["choices"][0]["finish_reason"] == "tool_calls" and reply["reasoning_content"]   # some reasoning
            call = reply["tool_calls"][0]
            turn2 = msgs + [{k: reply[k] for k in ("role", "content", "reasoning_content", "tool_calls")},
                            {"role": "tool", "tool_call_id": call["id"], "content": "# Readme"}]
            t2 = await post(sock, "/v1/chat/completions", {**body, "messages": turn2, "max_tokens": 3,
                                                           "tool_choice": "auto", "logit_bias": {}})
            before = await replies(sock)
            # one byte off in the call's id (not even rendered): the table is not used
            edited = [dict(m) for m in turn2]
            edited[2]["tool_calls"] = [{**call, "id": one_byte_off(call["id"])}]
            edited[3]["tool_call_id"] = edited[2]["tool_calls"][0]["id"]
            t2e = await post(sock, "/v1/chat/completions", {**body, "messages": edited, "max_tokens": 3,
                                                            "tool_choice": "auto", "logit_bias": {}})
            after = await replies(sock)
    p1, c1 = prompt_of(t1), completion_of(t1)
    assert cached(t2) >= p1 + c1 - 1, (t1["usage"], t2["usage"])
    assert before["replayed_turns"] == 1 and after["replayed_turns"] == 1 and before["entries"] >= 1
    print(f"chat: prompt1 {p1} completion1 {c1} turn-2 cached {cached(t2)}; one byte off: {cached(t2e)}")
    assert events(evs, "prefill_plan", action="reuse_live")


async def test_messages_turn_2_restores_the_reply_end_checkpoint(loaded, tmp_path):
    """Anthropic's shape, chat mode, a forced tool call; another conversation runs in between, so the
    slot's live state is gone and turn 2 restores the checkpoint taken at the end of turn 1's reply."""
    sock = tmp_path / "c.sock"
    tools = [{"name": "open_file", "description": "Open a file at a line", "input_schema": OPEN_PARAMS}]
    ask = [{"role": "user", "content": "Open the readme."}]
    body = {"model": "tiny", "max_tokens": 200, "temperature": 0, "system": SYSTEM, "messages": ask, "tools": tools,
            "tool_choice": {"type": "tool", "name": "open_file"}, "thinking": {"type": "disabled"}}
    with trio.fail_after(240), capture_logs() as evs:
        async with daemon(loaded, sock, **ON):
            t1 = await post(sock, "/v1/messages", body)
            assert t1["stop_reason"] == "tool_use"
            use = t1["content"][-1]
            await post(sock, "/v1/chat/completions", OTHER)
            turn2 = ask + [{"role": "assistant", "content": t1["content"]},
                           {"role": "user", "content": [{"type": "tool_result", "tool_use_id": use["id"],
                                                         "content": "# Readme"}]}]
            t2 = await post(sock, "/v1/messages", {**body, "messages": turn2, "max_tokens": 3,
                                                   "tool_choice": {"type": "auto"}})
            edited = [dict(m) for m in turn2]
            edited[1] = {"role": "assistant", "content": [{**use, "id": one_byte_off(use["id"])}]}
            edited[2] = {"role": "user", "content": [{"type": "tool_result", "tool_use_id": one_byte_off(use["id"]),
                                                      "content": "# Readme"}]}
            await post(sock, "/v1/chat/completions", OTHER)
            t2e = await post(sock, "/v1/messages", {**body, "messages": edited, "max_tokens": 3,
                                                    "tool_choice": {"type": "auto"}})
            st = await replies(sock)
    p1, c1 = prompt_of(t1), completion_of(t1)
    assert cached(t2) >= p1 + c1 - 1, (t1["usage"], t2["usage"])
    assert events(evs, "checkpoint_hit", kind="reply_end", tokens=p1 + c1 - 1)
    assert st["replayed_turns"] == 1
    print(f"messages: prompt1 {p1} completion1 {c1} turn-2 cached {cached(t2)}; one byte off: {cached(t2e)}")


async def test_responses_turn_2_restores_the_reply_end_checkpoint(loaded, tmp_path):
    """The Responses API's items, chat mode, a forced function call, another conversation in between."""
    sock = tmp_path / "c.sock"
    tools = [{"type": "function", "name": "open_file", "description": "Open a file at a line",
              "parameters": OPEN_PARAMS}]
    ask = [{"type": "message", "role": "user", "content": [{"type": "input_text", "text": "Open the readme."}]}]
    body = {"model": "tiny", "instructions": SYSTEM, "input": ask, "tools": tools, "max_output_tokens": 200,
            "temperature": 0, "tool_choice": {"type": "function", "name": "open_file"}}
    with trio.fail_after(240), capture_logs() as evs:
        async with daemon(loaded, sock, **ON):
            t1 = await post(sock, "/v1/responses", body)
            assert t1["status"] == "completed"
            (call,) = [i for i in t1["output"] if i["type"] == "function_call"]
            await post(sock, "/v1/chat/completions", OTHER)
            turn2 = ask + t1["output"] + [{"type": "function_call_output", "call_id": call["call_id"],
                                            "output": "# Readme"}]
            t2 = await post(sock, "/v1/responses", {**body, "input": turn2, "max_output_tokens": 3,
                                                    "tool_choice": "auto"})
            edited = ask + [{**call, "call_id": one_byte_off(call["call_id"])},
                            {"type": "function_call_output", "call_id": one_byte_off(call["call_id"]),
                             "output": "# Readme"}]
            await post(sock, "/v1/chat/completions", OTHER)
            t2e = await post(sock, "/v1/responses", {**body, "input": edited, "max_output_tokens": 3,
                                                     "tool_choice": "auto"})
            st = await replies(sock)
    p1, c1 = prompt_of(t1), completion_of(t1)
    assert cached(t2) >= p1 + c1 - 1, (t1["usage"], t2["usage"])
    assert events(evs, "checkpoint_hit", kind="reply_end", tokens=p1 + c1 - 1)
    assert st["replayed_turns"] == 1
    print(f"responses: prompt1 {p1} completion1 {c1} turn-2 cached {cached(t2)}; one byte off: {cached(t2e)}")


# --- exactness --------------------------------------------------------------------------------

def answer(body: dict) -> tuple[list, list]:
    content = body["choices"][0]["logprobs"]["content"]
    return [c["token"] for c in content], [c["logprob"] for c in content]


async def test_turn_2_answers_as_a_cold_prefill_of_the_same_ids(loaded, tmp_path):
    """A JSON reply (content only): turn 2 restores the reply_end checkpoint on one daemon; a daemon
    with checkpoints off runs the same requests, replays the same reply (its greedy turn 1 is the same)
    and prefills turn 2's ids cold. Same prompt length, same tokens, same log-probabilities."""
    msgs = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": "Give the readme's path as JSON."}]
    schema = {"type": "object", "properties": {"path": {"type": "string", "maxLength": 10}}, "required": ["path"]}
    t1_body = {"model": "tiny", "messages": msgs, "max_tokens": 120, "temperature": 0,
               "response_format": {"type": "json_schema", "json_schema": {"name": "p", "schema": schema}}}

    async def run(sock, **settings):
        async with daemon(loaded, sock, **settings):
            t1 = await post(sock, "/v1/chat/completions", t1_body)
            assert t1["choices"][0]["finish_reason"] == "stop"
            await post(sock, "/v1/chat/completions", OTHER)    # the slot's live state is another one now
            turn2 = msgs + [{"role": "assistant", "content": t1["choices"][0]["message"]["content"]},
                            {"role": "user", "content": "Now open it."}]
            t2 = await post(sock, "/v1/chat/completions", {**t1_body, "messages": turn2, "max_tokens": 12,
                                                           "logprobs": True})
            return t1, t2, await replies(sock)

    with trio.fail_after(240), capture_logs() as evs:
        on1, on2, on_st = await run(tmp_path / "on.sock", **ON)
        off1, off2, off_st = await run(tmp_path / "off.sock", checkpoints=False)
    assert on1["choices"][0]["message"] == off1["choices"][0]["message"]
    assert on_st["replayed_turns"] == off_st["replayed_turns"] == 1
    p1, c1 = prompt_of(on1), completion_of(on1)
    assert cached(on2) >= p1 + c1 - 1 and cached(off2) == 0
    assert events(evs, "checkpoint_hit", kind="reply_end")
    assert prompt_of(on2) == prompt_of(off2)
    (ta, la), (tb, lb) = answer(on2), answer(off2)
    assert ta == tb and len(ta) > 0
    np.testing.assert_array_equal(la, lb)
