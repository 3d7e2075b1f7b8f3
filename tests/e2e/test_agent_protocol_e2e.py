"""The agent protocol end to end: the real kernel on the tiny (random-weight) model, a real daemon.

Random weights never choose a tool call or valid JSON by themselves: where a test needs one, the
request constrains the output (tool_choice, response_format), which is what makes it valid.
"""

from __future__ import annotations

import json

import pytest
import trio
from structlog.testing import capture_logs

from daemon_harness import daemon, openai_client, real_loaded, request

OPEN_FILE = {"type": "function", "function": {
    "name": "open_file", "description": "Open a file at a line",
    "parameters": {"type": "object", "properties": {
        "path": {"type": "string", "maxLength": 12},
        "line": {"type": "integer", "minimum": 1, "maximum": 999},
        "mode": {"type": "string", "enum": ["read", "write"]},
        "create": {"type": "boolean"},
        "comment": {"type": "string"}},           # optional: left out under a forced call
        "required": ["path", "line", "mode", "create"]}}}
LIST_DIR = {"type": "function", "function": {
    "name": "list_dir", "description": "List a directory",
    "parameters": {"type": "object", "properties": {"depth": {"type": "integer", "minimum": 0, "maximum": 3}},
                   "required": ["depth"]}}}
TOOLS = [LIST_DIR, OPEN_FILE]


def validate(value, schema: dict, where: str = "$") -> None:
    """The subset of JSON Schema these tests use; raises AssertionError naming the place."""
    t = schema.get("type")
    if t == "object":
        assert isinstance(value, dict), where
        props = schema.get("properties", {})
        for k in schema.get("required", []):
            assert k in value, f"{where}.{k} missing"
        for k, v in value.items():
            assert k in props, f"{where}.{k} not in the schema"
            validate(v, props[k], f"{where}.{k}")
    elif t == "string":
        assert isinstance(value, str), where
        assert len(value) <= schema.get("maxLength", len(value)), where
    elif t == "integer":
        assert isinstance(value, int) and not isinstance(value, bool), where
        assert schema.get("minimum", value) <= value <= schema.get("maximum", value), where
    elif t == "boolean":
        assert isinstance(value, bool), where
    if "enum" in schema:
        assert value in schema["enum"], where


@pytest.fixture(scope="module")
def loaded(tiny_model_dir):
    return real_loaded(tiny_model_dir)


MSGS = [{"role": "system", "content": "You are a coding agent."}, {"role": "user", "content": "Open the readme."}]


async def test_forced_tool_call_streamed_and_not_through_the_openai_sdk(loaded, tmp_path):
    sock = tmp_path / "c.sock"
    with trio.fail_after(120), capture_logs():
        async with daemon(loaded, sock):
            def use_client():
                c = openai_client(sock)
                kw = dict(model="tiny", messages=MSGS, tools=TOOLS, max_tokens=500, temperature=0,
                          tool_choice={"type": "function", "function": {"name": "open_file"}})
                return c.chat.completions.create(**kw), list(c.chat.completions.create(**kw, stream=True))

            full, chunks = await trio.to_thread.run_sync(use_client)
    choice = full.choices[0]
    assert choice.finish_reason == "tool_calls" and choice.message.content is None
    (call,) = choice.message.tool_calls
    assert call.type == "function" and call.id.startswith("call_") and call.function.name == "open_file"
    validate(json.loads(call.function.arguments), OPEN_FILE["function"]["parameters"])
    # streamed: id and name in one delta, then argument fragments that add up to the same arguments
    deltas = [tc for ch in chunks if ch.choices for tc in (ch.choices[0].delta.tool_calls or [])]
    assert deltas[0].id and deltas[0].function.name == "open_file" and deltas[0].function.arguments == ""
    assert all(d.id is None and d.function.name is None for d in deltas[1:])
    assert "".join(d.function.arguments for d in deltas) == call.function.arguments
    assert "".join(ch.choices[0].delta.content or "" for ch in chunks if ch.choices) == ""
    assert [ch.choices[0].finish_reason for ch in chunks if ch.choices][-1] == "tool_calls"


async def test_tool_choice_required_calls_one_of_the_tools(loaded, tmp_path):
    sock = tmp_path / "c.sock"
    body = {"model": "tiny", "messages": MSGS, "tools": TOOLS, "tool_choice": "required", "max_tokens": 500,
            "temperature": 0}
    with trio.fail_after(120), capture_logs():
        async with daemon(loaded, sock):
            r = await request(sock, "POST", "/v1/chat/completions", body)
    assert r.status == 200, r.body
    msg = r.json()["choices"][0]["message"]
    assert r.json()["choices"][0]["finish_reason"] == "tool_calls" and msg["tool_calls"]
    schemas = {t["function"]["name"]: t["function"]["parameters"] for t in TOOLS}
    for c in msg["tool_calls"]:
        validate(json.loads(c["function"]["arguments"]), schemas[c["function"]["name"]])


async def test_json_schema_response_validates_with_random_weights(loaded, tmp_path):
    schema = {"type": "object", "properties": {
        "verdict": {"type": "string", "enum": ["pass", "fail"]}, "score": {"type": "integer", "minimum": 0,
                                                                       "maximum": 10},
        "flag": {"type": "boolean"}}, "required": ["verdict", "score", "flag"], "additionalProperties": False}
    sock = tmp_path / "c.sock"
    with trio.fail_after(120), capture_logs():
        async with daemon(loaded, sock):
            def use_client():
                return openai_client(sock).chat.completions.create(
                    model="tiny", messages=MSGS, max_tokens=100, temperature=0.7, seed=3,
                    response_format={"type": "json_schema", "json_schema": {"name": "review", "schema": schema}})

            full = await trio.to_thread.run_sync(use_client)
    assert full.choices[0].finish_reason == "stop"
    validate(json.loads(full.choices[0].message.content), schema)


def _usage(r) -> tuple[int, int]:
    u = r.json()["usage"]
    return u["prompt_tokens"], u["prompt_tokens_details"]["cached_tokens"]


async def test_agent_loop_in_thinking_mode_reuses_each_previous_prompt(loaded, tmp_path):
    # user -> tool call -> tool result -> answer -> next user, thinking mode, tools (reasoning kept)
    end_think = loaded.tokenizer.token_to_id("</think>")
    sock = tmp_path / "c.sock"
    msgs = list(MSGS)
    base = {"model": "tiny", "tools": TOOLS, "reasoning_effort": "high", "temperature": 0}
    seen = []
    with trio.fail_after(120), capture_logs():
        async with daemon(loaded, sock, checkpoint_min_tokens=16):
            # the model is pushed past its reasoning (logit_bias) so the forced call can follow
            r = await request(sock, "POST", "/v1/chat/completions", {
                **base, "messages": msgs, "max_tokens": 500, "logit_bias": {str(end_think): 100},
                "tool_choice": {"type": "function", "function": {"name": "list_dir"}}})
            seen.append(_usage(r))
            m = r.json()["choices"][0]["message"]
            assert r.json()["choices"][0]["finish_reason"] == "tool_calls", r.json()
            msgs += [{"role": "assistant", "content": m["content"], "reasoning_content": m["reasoning_content"],
                      "tool_calls": m["tool_calls"]},
                     {"role": "tool", "tool_call_id": m["tool_calls"][0]["id"], "content": "README.md src/"}]
            r = await request(sock, "POST", "/v1/chat/completions", {**base, "messages": msgs, "max_tokens": 6})
            seen.append(_usage(r))
            m = r.json()["choices"][0]["message"]
            msgs += [{"role": "assistant", "content": m["content"], "reasoning_content": m["reasoning_content"]},
                     {"role": "user", "content": "Now open it."}]
            r = await request(sock, "POST", "/v1/chat/completions", {**base, "messages": msgs, "max_tokens": 6})
            seen.append(_usage(r))
    for (prev_prompt, _), (_, cached) in zip(seen, seen[1:]):
        assert cached >= prev_prompt - 1, seen
    # the tool-call turn re-renders exactly as generated: turn 2 extended the live state past turn 1's
    # prompt (prompt + the generated call); later turns restore at least the prompt-end checkpoint
    assert seen[1][1] > seen[0][0], seen


async def test_thinking_mode_without_tools_next_turn_reuses_all_but_the_mode_marker(loaded, tmp_path):
    # Reasoning is dropped from past turns: turn 1's prompt ends `<think>`, turn 2 renders `</think>`
    # there. The capture before that token is what turn 2 restores.
    sock = tmp_path / "c.sock"
    system = "Be brief. " + " ".join(f"rule {i}: answer the user's question." for i in range(40))
    msgs = [{"role": "system", "content": system}, {"role": "user", "content": "Name a colour."}]
    base = {"model": "tiny", "thinking": {"type": "enabled"}, "temperature": 0, "max_tokens": 6}
    with trio.fail_after(120), capture_logs():
        async with daemon(loaded, sock, checkpoint_min_tokens=16):
            r1 = await request(sock, "POST", "/v1/chat/completions", {**base, "messages": msgs})
            m = r1.json()["choices"][0]["message"]
            msgs += [{"role": "assistant", "content": m["content"], "reasoning_content": m["reasoning_content"]},
                     {"role": "user", "content": "Another."}]
            r2 = await request(sock, "POST", "/v1/chat/completions", {**base, "messages": msgs})
    n1, _ = _usage(r1)
    _, cached = _usage(r2)
    assert n1 > 200 and cached == n1 - 1


def _sse_ok(r) -> list:
    assert r.status == 200, r.body[:500]
    events = r.events()
    assert events[-1] == "[DONE]" and all("error" not in e for e in events[:-1])
    return events


HISTORY = [{"role": "system", "content": "You are an expert engineer."},
           {"role": "user", "content": "List the files."},
           {"role": "assistant", "content": None, "reasoning_content": "I should list.",
            "tool_calls": [{"id": "call_1", "type": "function",
                            "function": {"name": "list_dir", "arguments": '{"depth": 1}'}}]},
           {"role": "tool", "tool_call_id": "call_1", "content": "README.md"}]


async def test_requests_shaped_as_agent_clients_send_them_are_answered(loaded, tmp_path):
    opencode = {"model": "tiny", "messages": HISTORY, "max_tokens": 4, "temperature": 0.6, "top_p": 0.95,
                "frequency_penalty": 0.2, "presence_penalty": 0.1, "stop": ["\n\n\n"], "seed": 7, "user": "u1",
                "reasoning_effort": "high", "verbosity": "low", "tools": TOOLS, "tool_choice": "auto",
                "stream": True, "stream_options": {"include_usage": True},
                "providerOptions": {"cairn": {}}}                  # a provider extra: accepted, ignored
    roo = {"model": "tiny", "temperature": 0, "stream": True, "stream_options": {"include_usage": True},
           "tools": TOOLS, "tool_choice": "auto", "parallel_tool_calls": False, "max_completion_tokens": 4,
           "messages": [{"role": "system", "content": [{"type": "text", "text": "You are Roo.",
                                                        "cache_control": {"type": "ephemeral"}}]},
                        {"role": "user", "content": [{"type": "text", "text": "<task>fix it</task>",
                                                      "cache_control": {"type": "ephemeral"}}]}]}
    cline = {"model": "tiny", "temperature": 0, "max_tokens": 4, "stream": True,
             "stream_options": {"include_usage": True}, "tools": TOOLS,
             "messages": [{"role": "system", "content": "You are Cline."},
                          {"role": "user", "content": [{"type": "text", "text": "<task>go</task>"},
                                                       {"type": "text", "text": "<environment_details/>"}]}]}
    aider_edit = {"model": "tiny", "stream": False, "temperature": 0, "max_tokens": 4, "reasoning_effort": "low",
                  "messages": [{"role": "system", "content": "Act as an expert."}, {"role": "user", "content": "x"}],
                  "tools": [OPEN_FILE], "tool_choice": {"type": "function", "function": {"name": "open_file"}}}
    aider_warm = {"model": "tiny", "stream": False, "temperature": 0, "max_tokens": 1,
                  "messages": [{"role": "system", "content": "Act as an expert."}, {"role": "user", "content": "x"}]}
    sock = tmp_path / "c.sock"
    with trio.fail_after(120), capture_logs() as logs:
        async with daemon(loaded, sock):
            models = await request(sock, "GET", "/v1/models")
            got = [await request(sock, "POST", "/v1/chat/completions", b)
                   for b in (opencode, roo, cline, aider_edit, aider_warm, opencode)]
    assert models.status == 200
    for r in got[:3]:
        events = _sse_ok(r)
        assert events[-2]["usage"]["completion_tokens"] >= 1
    for r in got[3:5]:
        assert r.status == 200, r.body[:500]
        assert r.json()["choices"][0]["finish_reason"] == "length"
    ignored = [e for e in logs if e["event"] == "request_field_ignored"]
    assert [e["field"] for e in ignored] == ["providerOptions"]        # once, though sent twice
    (start,) = [e for e in logs if e["event"] == "chat_encoding"]      # which encoding, said at start
    assert start["encoding"] == "deepseek-v4 native" and "renders as the V4 encoding" in start["detail"]


async def test_logit_bias_steers_the_sampler(loaded, tmp_path):
    sock = tmp_path / "c.sock"
    target = loaded.tokenizer.encode(" model")[0]
    with trio.fail_after(60), capture_logs():
        async with daemon(loaded, sock):
            r = await request(sock, "POST", "/v1/completions", {
                "model": "tiny", "prompt": "x", "max_tokens": 4, "temperature": 0, "logprobs": 0,
                "logit_bias": {str(target): 100}})
    assert r.status == 200, r.body
    toks = r.json()["choices"][0]["logprobs"]["tokens"]
    assert toks == [loaded.tokenizer.token_bytes(target).decode()] * 4


async def test_reasoning_is_returned_streamed_and_not_in_thinking_mode(loaded, tmp_path):
    sock = tmp_path / "c.sock"
    with trio.fail_after(60), capture_logs():
        async with daemon(loaded, sock, reasoning="thinking"):       # the server default: thinking
            def use_client():
                c = openai_client(sock)
                kw = dict(model="tiny", messages=MSGS, max_tokens=12, temperature=0)
                chat = c.chat.completions.create(**kw, reasoning_effort="none")   # the request wins
                return (chat, c.chat.completions.create(**kw),
                        list(c.chat.completions.create(**kw, stream=True)))

            chat, full, chunks = await trio.to_thread.run_sync(use_client)
    assert chat.choices[0].message.content and getattr(chat.choices[0].message, "reasoning_content", None) is None
    msg = full.choices[0].message
    # random weights never close their reasoning: everything is reasoning, under one name only
    assert msg.reasoning_content and getattr(msg, "reasoning", None) is None and msg.content == ""
    deltas = [ch.choices[0].delta for ch in chunks if ch.choices]
    assert "".join(getattr(d, "reasoning_content", None) or "" for d in deltas) == msg.reasoning_content
    assert "".join(d.content or "" for d in deltas) == ""


async def test_tool_choice_none_never_opens_a_call_block(loaded, tmp_path):
    """A bias of +100 makes the model open V4's call block at once; under tool_choice "none" the
    block's opening token is banned, so the reply is words and no tool_calls."""
    sock = tmp_path / "c.sock"
    dsml = loaded.tokenizer.token_to_id("｜DSML｜")
    body = {"model": "tiny", "messages": MSGS, "tools": TOOLS, "max_tokens": 6, "temperature": 0,
            "logprobs": True, "logit_bias": {str(dsml): 100}}
    with trio.fail_after(120), capture_logs():
        async with daemon(loaded, sock):
            auto = await request(sock, "POST", "/v1/chat/completions", body)
            none = await request(sock, "POST", "/v1/chat/completions", body | {"tool_choice": "none"})
    assert auto.status == 200 and none.status == 200, (auto.body, none.body)
    auto_toks = [t["token"] for t in auto.json()["choices"][0]["logprobs"]["content"]]
    assert "｜DSML｜" in "".join(auto_toks)          # the bias alone does open the block
    choice = none.json()["choices"][0]
    none_toks = [t["token"] for t in choice["logprobs"]["content"]]
    assert len(none_toks) == 6 and "｜DSML｜" not in "".join(none_toks)
    assert choice["finish_reason"] == "length" and not choice["message"].get("tool_calls")


async def test_codex_shaped_developer_role_streams_as_system_and_chunks_have_no_usage_key(loaded, tmp_path):
    """Codex sends `developer` and no stream_options: a 200 with the same tokens as `system`, and (no
    include_usage) no chunk carries a `usage` key at all."""
    def body(role):
        return {"model": "tiny", "temperature": 0, "max_tokens": 6, "stream": True, "tools": TOOLS,
                "messages": [{"role": role, "content": "You are Codex."}, {"role": "user", "content": "fix it"}]}
    sock = tmp_path / "c.sock"
    with trio.fail_after(60), capture_logs():
        async with daemon(loaded, sock):
            dev, sys_ = [await request(sock, "POST", "/v1/chat/completions", body(r)) for r in ("developer", "system")]
    dev_events, sys_events = _sse_ok(dev)[:-1], _sse_ok(sys_)[:-1]
    assert all("usage" not in e for e in dev_events + sys_events)
    deltas = [[e["choices"][0]["delta"] for e in evs if e["choices"]] for evs in (dev_events, sys_events)]
    assert deltas[0] == deltas[1] and len(deltas[0]) >= 3
