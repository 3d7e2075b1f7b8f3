"""`POST /v1/responses` end to end: the official openai SDK's `client.responses.create` over the Unix
socket, a real daemon, the real kernel on the tiny (random-weight) model.

Random weights never call a tool or close their reasoning by themselves: the function-call round trip
forces the call (tool_choice), in chat mode; thinking-mode replies are all reasoning.
"""

from __future__ import annotations

import json

import pytest
import trio
from structlog.testing import capture_logs

from daemon_harness import daemon, openai_client, real_loaded, request

SHELL = {"type": "function", "name": "shell", "description": "Runs a shell command and returns its output",
         "strict": False, "parameters": {"type": "object", "properties": {
             "command": {"type": "string", "maxLength": 20}, "workdir": {"type": "string", "maxLength": 8}},
             "required": ["command"]}}
INSTRUCTIONS = "You are Codex, a coding agent running in the Codex CLI. " + " ".join(
    f"Rule {i}: keep changes small and explain them." for i in range(30))


@pytest.fixture(scope="module")
def loaded(tiny_model_dir):
    return real_loaded(tiny_model_dir)


def codex_turn(input_items: list) -> dict:
    """A request as Codex CLI sends one (codex-rs ResponsesApiRequest): stateless, streamed, the
    reasoning asked for with a summary and as encrypted content, a hosted tool beside the function."""
    return {"model": "tiny", "instructions": INSTRUCTIONS, "input": input_items,
            "tools": [SHELL, {"type": "web_search", "external_web_access": False}],
            "tool_choice": "auto", "parallel_tool_calls": False,
            "reasoning": {"effort": "medium", "summary": "auto"}, "store": False, "stream": True,
            "include": ["reasoning.encrypted_content"], "prompt_cache_key": "0199-thread",
            "max_output_tokens": 8, "temperature": 0}


CODEX_HISTORY = [
    {"type": "message", "role": "developer", "content": [
        {"type": "input_text", "text": "<permissions instructions>sandbox: workspace-write</permissions instructions>"}]},
    {"type": "message", "role": "user", "content": [
        {"type": "input_text", "text": "<environment_context><cwd>/repo</cwd></environment_context>"}]},
    {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "What is in this repo?"}]},
    {"type": "reasoning", "id": "rs_0", "summary": [{"type": "summary_text", "text": "**Listing** the files."}],
     "encrypted_content": "gAAAAB-from-another-server"},
    {"type": "function_call", "id": "fc_0", "name": "shell", "arguments": '{"command": "ls"}', "call_id": "call_0"},
    {"type": "function_call_output", "call_id": "call_0", "output": "README.md\nsrc\ntests"},
]


def _sse(r) -> list[dict]:
    assert r.status == 200, r.body[:500]
    events = []
    for block in r.body.decode().split("\n\n"):
        if block.startswith("event: "):
            head, data = block.split("\n", 1)
            events.append(json.loads(data.removeprefix("data: ")))
            assert head == "event: " + events[-1]["type"]
    return events


async def test_a_codex_shaped_turn_streams_and_the_next_turn_reuses_its_prompt(loaded, tmp_path):
    sock = tmp_path / "c.sock"
    with trio.fail_after(180), capture_logs() as logs:
        async with daemon(loaded, sock, checkpoint_min_tokens=16):
            first = _sse(await request(sock, "POST", "/v1/responses", codex_turn(CODEX_HISTORY)))
            output = first[-1]["response"]["output"]
            # Codex keeps the output items, drops reasoning `content` when re-sending, adds the next message
            resent = [{k: v for k, v in item.items() if not (item["type"] == "reasoning" and k == "content")}
                      for item in output]
            nxt = CODEX_HISTORY + resent + [
                {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "Now read README."}]}]
            second = _sse(await request(sock, "POST", "/v1/responses", codex_turn(nxt)))
    types = [e["type"] for e in first]
    assert types[:2] == ["response.created", "response.in_progress"]
    assert types[-1] == "response.incomplete"          # max_output_tokens reached
    assert [e["sequence_number"] for e in first] == list(range(len(first)))
    u1 = first[-1]["response"]["usage"]
    assert u1["output_tokens"] == 8 and u1["input_tokens"] > 300
    # thinking mode (effort medium) and random weights: the whole reply is reasoning
    (rs,) = output
    assert rs["type"] == "reasoning" and rs["content"][0]["text"] and rs["summary"][0]["text"] == rs["content"][0]["text"]
    assert rs["encrypted_content"].startswith("cairn-reasoning-v1:")
    assert u1["output_tokens_details"]["reasoning_tokens"] == 8
    deltas = "".join(e["delta"] for e in first if e["type"] == "response.reasoning_summary_text.delta")
    assert deltas == rs["summary"][0]["text"]
    u2 = second[-1]["response"]["usage"]
    assert u2["input_tokens"] > u1["input_tokens"]
    assert u2["input_tokens_details"]["cached_tokens"] >= 0.9 * u1["input_tokens"], (u1, u2)
    ignored = {e["field"] for e in logs if e["event"] == "request_field_ignored"}
    assert {"prompt_cache_key", "tools[].type=web_search"} <= ignored


async def test_function_call_round_trip_through_the_openai_sdk(loaded, tmp_path):
    sock = tmp_path / "c.sock"
    with trio.fail_after(180), capture_logs():
        async with daemon(loaded, sock, checkpoint_min_tokens=16):
            def use_client():
                c = openai_client(sock)
                kw = dict(model="tiny", instructions=INSTRUCTIONS, tools=[SHELL], reasoning={"effort": "none"},
                          temperature=0, max_output_tokens=200, store=False)
                ask = [{"role": "user", "content": "List the files."}]
                call = c.responses.create(input=ask, tool_choice={"type": "function", "name": "shell"}, **kw)
                streamed = list(c.responses.create(input=ask, tool_choice={"type": "function", "name": "shell"},
                                                   stream=True, **kw))
                # the SDK's own stream helper accumulates the events into the same final response
                with c.responses.stream(input=ask, tool_choice={"type": "function", "name": "shell"}, **kw) as s:
                    helper = s.get_final_response()
                assert helper.output[-1].arguments == call.output[-1].arguments
                fc = call.output[-1]
                back = ask + [item.model_dump(exclude_none=True) for item in call.output] + [
                    {"type": "function_call_output", "call_id": fc.call_id, "output": "README.md\nsrc"}]
                answer = c.responses.create(input=back, max_output_tokens=5, **{k: v for k, v in kw.items()
                                                                                 if k != "max_output_tokens"})
                return call, streamed, answer

            call, streamed, answer = await trio.to_thread.run_sync(use_client)
    assert call.status == "completed" and call.output[-1].type == "function_call"
    fc = call.output[-1]
    assert fc.name == "shell" and fc.call_id.startswith("call_") and fc.status == "completed"
    assert isinstance(json.loads(fc.arguments)["command"], str)
    # streamed: the same call, its arguments as deltas that add up, then the completed response
    types = [e.type for e in streamed]
    assert types[0] == "response.created" and types[-1] == "response.completed"
    done = [e for e in streamed if e.type == "response.function_call_arguments.done"]
    deltas = "".join(e.delta for e in streamed if e.type == "response.function_call_arguments.delta")
    assert len(done) == 1 and done[0].arguments == deltas == fc.arguments      # temperature 0: the same call
    assert streamed[-1].response.output[-1].arguments == fc.arguments
    # the next turn: the whole input re-sent with the call and its output; the call re-renders as generated
    assert answer.status == "incomplete" and answer.output[-1].type == "message" and answer.output_text
    assert answer.usage.input_tokens_details.cached_tokens > call.usage.input_tokens, (call.usage, answer.usage)


async def test_a_function_call_cut_off_by_max_output_tokens_is_no_item_streamed_or_not(loaded, tmp_path):
    """The forced call, with max_output_tokens half of what it takes: the reply ends inside the call;
    the response is incomplete and has no function_call item (no truncated arguments)."""
    sock = tmp_path / "c.sock"
    with trio.fail_after(180), capture_logs() as logs:
        async with daemon(loaded, sock):
            def use_client():
                c = openai_client(sock)
                kw = dict(model="tiny", instructions=INSTRUCTIONS, tools=[SHELL], reasoning={"effort": "none"},
                          temperature=0, store=False, input=[{"role": "user", "content": "List the files."}],
                          tool_choice={"type": "function", "name": "shell"})
                full = c.responses.create(max_output_tokens=200, **kw)
                half = full.usage.output_tokens // 2
                return full, c.responses.create(max_output_tokens=half, **kw), \
                    list(c.responses.create(max_output_tokens=half, stream=True, **kw))

            full, cut, streamed = await trio.to_thread.run_sync(use_client)
    assert full.status == "completed" and full.output[-1].type == "function_call"
    assert cut.status == "incomplete" and cut.incomplete_details.reason == "max_output_tokens"
    assert not [i for i in cut.output if i.type == "function_call"]
    assert streamed[-1].type == "response.incomplete"
    assert not [e for e in streamed if "function_call" in e.type]
    assert not [e for e in streamed if getattr(getattr(e, "item", None), "type", None) == "function_call"]
    assert not [i for i in streamed[-1].response.output if i.type == "function_call"]
    assert sum("cut off" in e.get("problem", "") for e in logs if e["event"] == "model_output_malformed") == 2


async def test_reasoning_streamed_and_not_through_the_openai_sdk(loaded, tmp_path):
    sock = tmp_path / "c.sock"
    with trio.fail_after(120), capture_logs():
        async with daemon(loaded, sock):
            def use_client():
                c = openai_client(sock)
                kw = dict(model="tiny", input="Name a colour.", reasoning={"effort": "high", "summary": "detailed"},
                          temperature=0, max_output_tokens=10)
                return c.responses.create(**kw), list(c.responses.create(**kw, stream=True))

            whole, events = await trio.to_thread.run_sync(use_client)
    (rs,) = whole.output
    assert rs.type == "reasoning" and rs.content[0].type == "reasoning_text" and rs.content[0].text
    assert rs.summary[0].text == rs.content[0].text and rs.encrypted_content is None   # include not asked
    assert whole.usage.output_tokens == 10 and whole.usage.output_tokens_details.reasoning_tokens == 10
    assert "".join(e.delta for e in events if e.type == "response.reasoning_text.delta") == rs.content[0].text
    assert events[-1].type == "response.incomplete" and events[-1].response.output[0].content[0].text == rs.content[0].text


async def test_json_schema_text_format_constrains_the_reply(loaded, tmp_path):
    schema = {"type": "object", "properties": {"verdict": {"type": "string", "enum": ["pass", "fail"]},
                                               "score": {"type": "integer", "minimum": 0, "maximum": 9}},
              "required": ["verdict", "score"], "additionalProperties": False}
    sock = tmp_path / "c.sock"
    with trio.fail_after(120), capture_logs():
        async with daemon(loaded, sock):
            def use_client():
                return openai_client(sock).responses.create(
                    model="tiny", input="Review it.", reasoning={"effort": "none"}, temperature=0.7,
                    max_output_tokens=60, text={"format": {"type": "json_schema", "name": "review", "schema": schema}})

            r = await trio.to_thread.run_sync(use_client)
            bad = await request(sock, "POST", "/v1/responses", {"model": "tiny", "input": "x",
                                                                 "previous_response_id": "resp_1"})
            too_long = await request(sock, "POST", "/v1/responses", {"model": "tiny", "input": "x",
                                                                      "max_output_tokens": 1 << 30})
    assert r.status == "completed"
    value = json.loads(r.output_text)
    assert value["verdict"] in ("pass", "fail") and 0 <= value["score"] <= 9 and set(value) == {"verdict", "score"}
    assert bad.status == 400 and bad.json()["error"]["param"] == "previous_response_id"
    assert "keeps no responses" in bad.json()["error"]["message"]
    err = too_long.json()["error"]
    assert too_long.status == 400 and err["param"] == "max_output_tokens" and err["code"] == "context_length_exceeded"
