"""The Responses API (`POST /v1/responses`): the translator into the chat request (daemon/api/responses.py)
and the reply built from the shared OutputParser's events (daemon/api/responses_reply.py)."""

from __future__ import annotations

import json

import pytest
from pydantic import TypeAdapter

from openai.types.responses import Response, ResponseStreamEvent

from cairn.actors.engine.messages import Done, Started, TokenOut, Usage
from cairn.daemon.api.responses import ENCRYPTED_PREFIX, as_responses_error, parse_responses
from cairn.daemon.api.responses_reply import ResponsesJSON, ResponsesStream
from cairn.daemon.api.schemas import APIError
from cairn.daemon.service.logs import get_logger

D = "｜DSML｜"
SHELL = {"type": "function", "name": "shell", "description": "Runs a shell command", "strict": False,
         "parameters": {"type": "object", "properties": {"command": {"type": "array", "items": {"type": "string"}}},
                        "required": ["command"]}}
READ = {"type": "function", "name": "read", "parameters": {"type": "object", "properties": {"path": {"type": "string"}}}}


def codex_body(**over) -> dict:
    """A request shaped as Codex CLI sends one (codex-rs ResponsesApiRequest): stateless, streamed."""
    body = {
        "model": "m", "instructions": "You are Codex, a coding agent.",
        "input": [
            {"type": "message", "role": "developer", "content": [{"type": "input_text", "text": "sandbox: read-only"}]},
            {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "list the files"}]},
            {"type": "reasoning", "id": "rs_1", "summary": [{"type": "summary_text", "text": "I will list."}],
             "encrypted_content": None},
            {"type": "function_call", "id": "fc_1", "call_id": "call_1", "name": "shell",
             "arguments": '{"command": ["ls"]}'},
            {"type": "function_call_output", "call_id": "call_1", "output": "README.md\nsrc"},
            {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "Two entries."}]},
            {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "thanks"}]},
        ],
        "tools": [SHELL, {"type": "web_search", "external_web_access": False}],
        "tool_choice": "auto", "parallel_tool_calls": False,
        "reasoning": {"effort": "medium", "summary": "auto"}, "store": False, "stream": True,
        "include": ["reasoning.encrypted_content"], "prompt_cache_key": "thread-1",
        "text": {"verbosity": "medium"}, "client_metadata": {"session_id": "s1"},
    }
    return {**body, **over}


def test_a_codex_request_becomes_the_chat_request_the_chat_path_runs():
    r = parse_responses(codex_body())
    c = r.chat
    assert c.messages == [
        {"role": "system", "content": "You are Codex, a coding agent."},
        {"role": "developer", "content": [{"type": "text", "text": "sandbox: read-only"}]},
        {"role": "user", "content": [{"type": "text", "text": "list the files"}]},
        {"role": "assistant", "content": None, "reasoning_content": "I will list.",
         "tool_calls": [{"id": "call_1", "type": "function",
                         "function": {"name": "shell", "arguments": '{"command": ["ls"]}'}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": "README.md\nsrc"},
        {"role": "assistant", "content": [{"type": "text", "text": "Two entries."}]},
        {"role": "user", "content": [{"type": "text", "text": "thanks"}]},
    ]
    assert c.tools == [{"type": "function", "function": {
        "name": "shell", "description": "Runs a shell command", "parameters": SHELL["parameters"]}}]
    assert r.dropped_tools == ("web_search",) and r.tools == [SHELL]
    assert (c.reasoning_effort, r.summary, r.include_encrypted) == ("medium", "auto", True)
    assert c.common.stream and c.tool_choice == "auto" and c.parallel_tool_calls is False
    assert c.common.ignored == ("client_metadata", "prompt_cache_key")      # accepted, logged once


def test_other_fields_map_onto_the_chat_request():
    schema = {"type": "object", "properties": {"ok": {"type": "boolean"}}}
    r = parse_responses({"model": "m", "input": "hi", "max_output_tokens": 7, "temperature": 0.5,
                         "text": {"format": {"type": "json_schema", "name": "v", "schema": schema, "strict": True}},
                         "tools": [READ], "tool_choice": {"type": "function", "name": "read"},
                         "reasoning": {"effort": "none"}})
    c = r.chat
    assert c.messages == [{"role": "user", "content": "hi"}]
    assert (c.common.max_tokens, c.common.temperature, c.reasoning_effort) == (7, 0.5, "none")
    assert c.response_format == {"type": "json_schema", "json_schema": {"name": "v", "schema": schema}}
    assert c.json_schema == schema and c.forced_tool == "read"
    assert parse_responses({"model": "m", "input": "x", "text": {"format": {"type": "json_object"}}}
                           ).chat.response_format == {"type": "json_object"}


def test_reasoning_comes_back_from_content_then_our_encrypted_content_then_the_summary():
    def reasoning(item):
        body = {"model": "m", "input": [{"role": "user", "content": "q"}, {"type": "reasoning", "id": "r", **item},
                                        {"role": "assistant", "content": "a"}]}
        return parse_responses(body).chat.messages[1]["reasoning_content"]

    ours = ENCRYPTED_PREFIX + "w6lsYW4gIOKAlCB0aGluaw=="        # base64 of "élan  — think"
    assert reasoning({"summary": [{"type": "summary_text", "text": "s"}], "encrypted_content": ours}) == "élan  — think"
    assert reasoning({"summary": [], "content": [{"type": "reasoning_text", "text": "c"}], "encrypted_content": ours}) == "c"
    assert reasoning({"summary": [{"type": "summary_text", "text": "a"}, {"type": "summary_text", "text": "b"}],
                      "encrypted_content": "gAAAAB-someone-elses"}) == "a\n\nb"


@pytest.mark.parametrize("body, param, code", [
    ({"input": "x"}, "model", "missing_field"),
    ({"model": "m"}, "input", "missing_field"),
    ({"model": "m", "input": []}, "input", "invalid_type"),
    ({"model": "m", "input": "x", "previous_response_id": "resp_1"}, "previous_response_id", "unsupported_value"),
    ({"model": "m", "input": "x", "conversation": "c1"}, "conversation", "unsupported_value"),
    ({"model": "m", "input": "x", "background": True}, "background", "unsupported_value"),
    ({"model": "m", "input": "x", "truncation": "auto"}, "truncation", "unsupported_value"),
    ({"model": "m", "input": "x", "instructions": 3}, "instructions", "invalid_type"),
    ({"model": "m", "input": "x", "max_output_tokens": 0}, "max_output_tokens", "invalid_value"),
    ({"model": "m", "input": "x", "max_output_token": 5}, "max_output_token", "unknown_field"),
    ({"model": "m", "input": "x", "temperature": 3}, "temperature", "invalid_value"),
    ({"model": "m", "input": [{"type": "item_reference", "id": "msg_1"}]}, "input[0].type", "unsupported_value"),
    ({"model": "m", "input": [{"type": "web_search_call"}]}, "input[0].type", "unsupported_value"),
    ({"model": "m", "input": [{"role": "robot", "content": "x"}]}, "input[0].role", "invalid_value"),
    ({"model": "m", "input": [{"role": "user", "content": [{"type": "input_image", "image_url": "u"}]}]},
     "input[0].content[0].type", "unsupported_value"),
    ({"model": "m", "input": [{"role": "user", "content": [{"type": "input_text"}]}]},
     "input[0].content[0].text", "invalid_type"),
    ({"model": "m", "input": [{"role": "user", "content": "x"}, {"type": "function_call", "name": "f", "arguments": "{}"}]},
     "input[1].call_id", "missing_field"),
    ({"model": "m", "input": [{"role": "user", "content": "x"},
                              {"type": "function_call", "call_id": "c", "name": "f", "arguments": {"a": 1}}]},
     "input[1].arguments", "invalid_type"),
    ({"model": "m", "input": [{"role": "user", "content": "x"}, {"type": "function_call", "call_id": "c", "name": "f",
                                                                 "arguments": '"\\ud800"'}]},
     "input[1].arguments", "invalid_value"),
    ({"model": "m", "input": [{"type": "function_call_output", "output": "x"}]}, "input[0].call_id", "missing_field"),
    ({"model": "m", "input": [{"type": "function_call_output", "call_id": "c"}]}, "input[0].output", "missing_field"),
    ({"model": "m", "input": [{"type": "reasoning", "summary": "x"}]}, "input[0].summary", "invalid_type"),
    ({"model": "m", "input": [{"type": "reasoning", "summary": [], "encrypted_content": ENCRYPTED_PREFIX + "%%"}]},
     "input[0].encrypted_content", "invalid_value"),
    ({"model": "m", "input": "x", "tools": [{"type": "function"}]}, "tools[0].name", "missing_field"),
    ({"model": "m", "input": "x", "tools": [{"type": "robot"}]}, "tools[0].type", "invalid_value"),
    ({"model": "m", "input": "x", "tools": [{"type": "function", "name": "f", "parameters": {"properties": 3}}]},
     "tools[0].parameters.properties", "invalid_type"),
    ({"model": "m", "input": "x", "tools": [READ], "tool_choice": {"type": "function", "name": "nope"}},
     "tool_choice", "invalid_value"),
    ({"model": "m", "input": "x", "tool_choice": {"type": "file_search"}}, "tool_choice", "invalid_value"),
    ({"model": "m", "input": "x", "tool_choice": "required", "tools": [{"type": "web_search"}]},
     "tool_choice", "invalid_value"),
    ({"model": "m", "input": "x", "reasoning": {"effort": "huge"}}, "reasoning.effort", "invalid_value"),
    ({"model": "m", "input": "x", "reasoning": {"summary": "long"}}, "reasoning.summary", "invalid_value"),
    ({"model": "m", "input": "x", "text": {"format": {"type": "yaml"}}}, "text.format", "invalid_value"),
    ({"model": "m", "input": "x", "text": {"format": {"type": "json_schema", "name": "v"}}},
     "text.format.schema", "missing_field"),
    ({"model": "m", "input": "x", "text": {"verbosity": "loud"}}, "text.verbosity", "invalid_value"),
    ({"model": "m", "input": "x", "include": "reasoning.encrypted_content"}, "include", "invalid_type"),
])
def test_bad_requests_get_a_400_naming_the_responses_field(body, param, code):
    with pytest.raises(APIError) as e:
        parse_responses(body)
    assert (e.value.status, e.value.param, e.value.code) == (400, param, code), e.value.message
    assert e.value.message.startswith(param + ":"), e.value.message


def test_errors_from_the_shared_chat_path_name_the_responses_field():
    e = as_responses_error(APIError(400, "response_format: the schema could not be compiled", param="response_format",
                                    code="invalid_value"))
    assert (e.param, e.message) == ("text.format", "text.format: the schema could not be compiled")
    e = as_responses_error(APIError(400, "tool_choice: too many tools", param="tool_choice"))
    assert (e.param, e.message) == ("tool_choice", "tool_choice: too many tools")


# --- replies -----------------------------------------------------------------------------------

class FakeAPI:
    model_id = "m"

    def __init__(self):
        self.log = get_logger()


REPLY = ["let me", " see</th", "ink>Reading", ".\n\n<", f"{D}tool_calls>\n<{D}invoke name=\"read\">\n",
         f"<{D}parameter name=\"path\" string=\"true\">a.txt</{D}", "parameter>\n", f"</{D}invoke>\n</{D}tool_calls>"]


async def run(cls, pieces, *, finish="stop", **fields):
    req = parse_responses({"model": "m", "input": "x", "tools": [READ], **fields})
    sent = []

    async def send(msg):
        sent.append(msg)

    r = cls(FakeAPI(), "resp-1", req, thinking=True)
    await r.start(send, Started(0, None))
    for i, p in enumerate(pieces):
        await r.token(send, TokenOut(i, p, 0.0, ()))
    await r.done(send, Done(finish, Usage(30, len(pieces), 12)))
    if cls is ResponsesStream:
        assert sent[-1]["more_body"] is False          # the stream ends after the last event
    body = b"".join(m.get("body", b"") for m in sent if m["type"] == "http.response.body").decode()
    if cls is ResponsesJSON:
        return json.loads(body)
    events = []
    for block in body.split("\n\n"):
        if block:
            head, data = block.split("\n")
            ev = json.loads(data.removeprefix("data: "))
            assert head == "event: " + ev["type"]
            events.append(ev)
    return events


def _shape(events):
    return [(e["type"], e.get("output_index")) for e in events]


async def test_the_stream_events_come_in_the_order_the_responses_api_defines():
    events = await run(ResponsesStream, REPLY, stream=True, reasoning={"effort": "high", "summary": "auto"})
    assert [e["sequence_number"] for e in events] == list(range(len(events)))
    reasoning_deltas = [("response.reasoning_text.delta", 0), ("response.reasoning_summary_text.delta", 0)] * 2
    # a call goes out once it closed: one arguments delta with the whole arguments, then done
    shape = _shape(events)
    assert shape == [
        ("response.created", None), ("response.in_progress", None),
        ("response.output_item.added", 0), ("response.content_part.added", 0),
        ("response.reasoning_summary_part.added", 0),
        *reasoning_deltas,
        ("response.reasoning_text.done", 0), ("response.content_part.done", 0),
        ("response.reasoning_summary_text.done", 0), ("response.reasoning_summary_part.done", 0),
        ("response.output_item.done", 0),
        ("response.output_item.added", 1), ("response.content_part.added", 1),
        ("response.output_text.delta", 1), ("response.output_text.delta", 1),
        ("response.output_text.done", 1), ("response.content_part.done", 1), ("response.output_item.done", 1),
        ("response.output_item.added", 2),
        ("response.function_call_arguments.delta", 2),
        ("response.function_call_arguments.done", 2), ("response.output_item.done", 2),
        ("response.completed", None)]
    for e in events:                                   # every event is one the SDK's types accept
        TypeAdapter(ResponseStreamEvent).validate_python(e)
    final = events[-1]["response"]
    Response.model_validate(final)
    rs, msg, call = final["output"]
    assert rs["content"] == [{"type": "reasoning_text", "text": "let me see"}]
    assert rs["summary"] == [{"type": "summary_text", "text": "let me see"}]
    assert "encrypted_content" not in rs               # not asked for (include)
    assert msg["content"][0]["text"] == "Reading." and msg["status"] == "completed"
    assert (call["name"], call["arguments"], call["status"]) == ("read", '{"path": "a.txt"}', "completed")
    assert call["call_id"].startswith("call_") and call["id"].startswith("fc_")
    assert final["usage"] == {"input_tokens": 30, "input_tokens_details": {"cached_tokens": 12, "cache_write_tokens": 0},
                              "output_tokens": 8, "output_tokens_details": {"reasoning_tokens": 3},
                              "total_tokens": 38}
    assert events[0]["response"]["status"] == "in_progress" and events[0]["response"]["output"] == []


async def test_without_a_summary_asked_reasoning_streams_as_reasoning_text_only():
    events = await run(ResponsesStream, ["let me", " see"], stream=True, reasoning={"effort": "high"})
    types = [e["type"] for e in events]
    assert not any("summary" in t for t in types)
    assert types.count("response.reasoning_text.delta") == 2


async def test_whole_and_streamed_replies_carry_the_same_output():
    fields = dict(reasoning={"effort": "high", "summary": "detailed"}, include=["reasoning.encrypted_content"])
    whole = await run(ResponsesJSON, REPLY, **fields)
    Response.model_validate(whole)
    streamed = (await run(ResponsesStream, REPLY, stream=True, **fields))[-1]["response"]
    strip = lambda out: [{k: v for k, v in i.items() if k not in ("id", "call_id")} for i in out]   # noqa: E731
    assert strip(whole["output"]) == strip(streamed["output"])
    assert whole["status"] == "completed" and whole["usage"] == streamed["usage"]
    # the reasoning item, sent back as Codex sends it (summary + encrypted_content, no content),
    # renders the same reasoning again
    rs = dict(whole["output"][0])
    del rs["content"]
    assert rs["encrypted_content"].startswith(ENCRYPTED_PREFIX)
    again = parse_responses({"model": "m", "input": [{"role": "user", "content": "x"}, rs, *whole["output"][1:]],
                             "tools": [READ]}).chat.messages[1]
    assert again["reasoning_content"] == "let me see" and again["content"] == [{"type": "text", "text": "Reading."}]
    assert again["tool_calls"][0]["function"] == {"name": "read", "arguments": '{"path": "a.txt"}'}


async def test_a_reply_cut_off_by_max_output_tokens_is_incomplete():
    events = await run(ResponsesStream, ["one", " two"], finish="length", stream=True, reasoning={"effort": "none"})
    last = events[-1]
    assert last["type"] == "response.incomplete"
    assert last["response"]["status"] == "incomplete"
    assert last["response"]["incomplete_details"] == {"reason": "max_output_tokens"}
    assert last["response"]["output"][0]["status"] == "incomplete"
    Response.model_validate(last["response"])


# max_output_tokens inside the call's parameter; and a first call closed, the second cut off
CUT = REPLY[:5] + [f"<{D}parameter name=\"path\" string=\"true\">a.t"]
SECOND_CUT = REPLY[:7] + [f"</{D}invoke>\n<{D}invoke name=\"read\">\n<{D}parameter name=\"path\" string=\"true\">b"]


def _incomplete(response: dict) -> None:
    Response.model_validate(response)
    assert response["status"] == "incomplete"
    assert response["incomplete_details"] == {"reason": "max_output_tokens"}


async def test_a_call_cut_off_by_max_output_tokens_is_no_function_call_item():
    whole = await run(ResponsesJSON, CUT, finish="length")
    _incomplete(whole)
    assert [i["type"] for i in whole["output"]] == ["reasoning", "message"]
    assert whole["output"][1]["content"][0]["text"] == "Reading." and whole["output"][1]["status"] == "incomplete"
    events = await run(ResponsesStream, CUT, finish="length", stream=True)
    assert not any("function_call" in e["type"] for e in events)
    assert not any(e.get("item", {}).get("type") == "function_call" for e in events)
    assert events[-1]["type"] == "response.incomplete"
    _incomplete(events[-1]["response"])
    assert [i["type"] for i in events[-1]["response"]["output"]] == ["reasoning", "message"]


async def test_the_call_closed_before_the_cut_is_a_completed_item_of_an_incomplete_response():
    for cls in (ResponsesJSON, ResponsesStream):
        out = await run(cls, SECOND_CUT, finish="length", stream=cls is ResponsesStream)
        response = out if cls is ResponsesJSON else out[-1]["response"]
        _incomplete(response)
        (call,) = [i for i in response["output"] if i["type"] == "function_call"]
        assert (call["arguments"], call["status"]) == ('{"path": "a.txt"}', "completed")
        if cls is ResponsesStream:
            added = [e["item"]["type"] for e in out if e["type"] == "response.output_item.added"]
            assert added == ["reasoning", "message", "function_call"]
            assert [e["delta"] for e in out if e["type"] == "response.function_call_arguments.delta"] == \
                ['{"path": "a.txt"}']


async def test_a_failure_after_the_stream_started_is_an_error_event_then_response_failed():
    req = parse_responses({"model": "m", "input": "x", "stream": True})
    sent = []

    async def send(msg):
        sent.append(msg)

    r = ResponsesStream(FakeAPI(), "resp-1", req)
    await r.start(send, Started(0, None))
    await r.token(send, TokenOut(0, "hi", 0.0, ()))
    await r.failed(send, APIError(500, "ValueError: boom", code="engine_error"))
    body = b"".join(m.get("body", b"") for m in sent if m["type"] == "http.response.body").decode()
    events = [json.loads(b.split("\n")[1][6:]) for b in body.split("\n\n") if b]
    assert [e["type"] for e in events[-2:]] == ["error", "response.failed"]
    assert events[-2]["code"] == "engine_error" and events[-2]["message"] == "ValueError: boom"
    assert events[-1]["response"]["error"] == {"code": "server_error", "message": "ValueError: boom"}
    assert [e["sequence_number"] for e in events] == list(range(len(events)))
    assert sent[-1]["more_body"] is False
    for e in events:
        TypeAdapter(ResponseStreamEvent).validate_python(e)
