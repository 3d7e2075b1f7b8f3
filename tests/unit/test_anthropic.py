"""The Anthropic Messages API's translator (daemon/api/anthropic.py) and serializer
(daemon/api/anthropic_reply.py): what maps to what, the 400s naming the field, and the exact SSE
event sequence, on the same OutputParser events the chat responders consume."""

from __future__ import annotations

import json

import pytest

from cairn.actors.engine.messages import Done, Started, TokenOut, Usage
from cairn.actors.decoding.stops import StopMatcher
from cairn.daemon.api.anthropic import check_context, error_body, parse_count_tokens, parse_messages
from cairn.daemon.api.anthropic_reply import MessagesJSON, MessagesStream
from cairn.daemon.api.schemas import APIError, parse_chat
from cairn.daemon.protocol.chat_encoding import V4Renderer
from cairn.daemon.protocol.dsv4.encoding import ChatOptions
from cairn.daemon.service.logs import get_logger

D = "｜DSML｜"
READ = {"name": "read", "description": "Read a file",
        "input_schema": {"type": "object", "properties": {"path": {"type": "string"}}, "required": ["path"]}}


def body(**kw) -> dict:
    return {"model": "m", "max_tokens": 100, "messages": [{"role": "user", "content": "hi"}], **kw}


def refused(d: dict, parse=parse_messages) -> APIError:
    with pytest.raises(APIError) as e:
        parse(d)
    assert e.value.status == 400
    return e.value


# --- translation ------------------------------------------------------------------------------

def test_a_tool_conversation_maps_onto_the_chat_request_and_renders_as_chat_would():
    req = parse_messages(body(
        system=[{"type": "text", "text": "You are an agent.", "cache_control": {"type": "ephemeral"}},
                {"type": "text", "text": "Be brief."}],
        max_tokens=2000, tools=[READ], stop_sequences=["END"], temperature=0.5, top_p=0.9, top_k=40,
        thinking={"type": "enabled", "budget_tokens": 1024}, metadata={"user_id": "u1"},
        messages=[{"role": "user", "content": [{"type": "text", "text": "read a", "cache_control": {"type": "ephemeral"}}]},
                  {"role": "assistant", "content": [
                      {"type": "thinking", "thinking": "need it", "signature": "sig"},
                      {"type": "text", "text": "Reading."},
                      {"type": "tool_use", "id": "toolu_1", "name": "read", "input": {"path": "a"}}]},
                  {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_1", "content": "A"},
                                               {"type": "text", "text": "and b?"}]}]))
    c = req.common
    assert (c.model, c.max_tokens, c.stop, c.temperature, c.top_p, c.top_k) == ("m", 2000, ("END",), 0.5, 0.9, 40)
    assert req.thinking == {"type": "enabled"} and req.tool_choice == "auto" and req.parallel_tool_calls
    assert req.tools == [{"type": "function", "function": {"name": "read", "description": "Read a file",
                                                           "parameters": READ["input_schema"]}}]
    chat = parse_chat({"model": "m", "tools": req.tools, "messages": [
        {"role": "system", "content": "You are an agent.\n\nBe brief."},
        {"role": "user", "content": "read a"},
        {"role": "assistant", "content": "Reading.", "reasoning_content": "need it",
         "tool_calls": [{"id": "toolu_1", "type": "function", "function": {"name": "read", "arguments": '{"path": "a"}'}}]},
        {"role": "tool", "tool_call_id": "toolu_1", "content": "A"},
        {"role": "user", "content": "and b?"}]})
    r = V4Renderer()
    opts = ChatOptions(thinking=True)
    mine = r.render(req.messages, tools=req.tools, options=opts)
    assert mine == r.render(chat.messages, tools=chat.tools, options=opts)
    assert "<tool_result>A</tool_result>" in mine.text and "need it</think>Reading." in mine.text


def test_cache_control_and_the_string_form_of_system_do_not_change_the_prompt():
    r = V4Renderer()
    plain = parse_messages(body(system="S"))
    blocks = parse_messages(body(system=[{"type": "text", "text": "S", "cache_control": {"type": "ephemeral"}}]))
    assert r.render(plain.messages).text == r.render(blocks.messages).text


def test_tool_choice_maps_onto_the_grammar_choices():
    pick = {"auto": "auto", "any": "required", "none": "none"}
    for kind, want in pick.items():
        req = parse_messages(body(tools=[READ], tool_choice={"type": kind}))
        assert req.tool_choice == want
    named = parse_messages(body(tools=[READ], tool_choice={"type": "tool", "name": "read",
                                                           "disable_parallel_tool_use": True}))
    assert named.forced_tool == "read" and named.parallel_tool_calls is False
    assert parse_messages(body(tools=[READ], tool_choice={"type": "none"})).callable_tools is None


def test_tool_result_error_flag_and_blocks_and_redacted_thinking():
    req = parse_messages(body(tools=[READ], messages=[
        {"role": "user", "content": "go"},
        {"role": "assistant", "content": [{"type": "redacted_thinking", "data": "xx"},
                                          {"type": "tool_use", "id": "t1", "name": "read", "input": {"path": "a"}}]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t1", "is_error": True,
                                      "content": [{"type": "text", "text": "no such file"}]}]}]))
    assert req.messages[1] == {"role": "assistant", "content": [], "tool_calls": [
        {"id": "t1", "type": "function", "function": {"name": "read", "arguments": {"path": "a"}}}]}
    assert req.messages[2] == {"role": "tool", "tool_call_id": "t1", "content": "Error: no such file"}


def test_thinking_disabled_and_absent():
    assert parse_messages(body(thinking={"type": "disabled"})).thinking == {"type": "disabled"}
    assert parse_messages(body()).thinking == {"type": "disabled"}     # Anthropic's default: no thinking


@pytest.mark.parametrize("reasoning", ["chat", "thinking", "high", "max"])
def test_effort_is_not_thinking_whatever_the_server_default(reasoning):
    # Claude Code sends output_config.effort on every request; CLAUDE_CODE_DISABLE_THINKING=1 drops
    # only the thinking field, and that must mean chat mode.
    from cairn.daemon.protocol.agent_protocol import AgentProtocol

    agent = AgentProtocol(None, 10, get_logger("test"))
    for effort in ("low", "high", "max"):
        off = agent.options(parse_messages(body(output_config={"effort": effort})), reasoning)
        assert off.thinking is False
        on = agent.options(parse_messages(body(thinking={"type": "adaptive"}, output_config={"effort": effort})),
                           reasoning)
        assert on.thinking is True and on.effort == {"low": "low", "high": "high", "max": "max"}[effort]


def test_claude_codes_thinking_display_and_context_management_are_accepted():
    req = parse_messages(body(thinking={"type": "adaptive", "display": "updates"},
                              context_management={"edits": [{"type": "clear_thinking_20251015",
                                                              "keep": "all"}]}))
    assert req.thinking == {"type": "enabled"}
    e = refused(body(context_management={"edits": [{"type": "clear_tool_uses_20250919"}]}))
    assert e.param == "context_management.edits[0].type" and "clear_thinking_20251015" in e.message
    assert refused(body(thinking={"type": "adaptive", "display": "loud"})).param == "thinking.display"


def render(req, thinking=False) -> str:
    return V4Renderer().render(req.messages, tools=req.tools, options=ChatOptions(thinking=thinking)).text


def test_a_system_message_inside_messages_renders_as_part_of_the_user_turn_at_its_place():
    env = "<system-reminder>cwd: /src</system-reminder>"
    turn1 = body(system="S", messages=[{"role": "user", "content": "fix it"},
                                       {"role": "system", "content": [{"type": "text", "text": env}]}])
    text = render(parse_messages(turn1))
    assert text == f"<｜begin▁of▁sentence｜>S<｜User｜>fix it\n\n{env}<｜Assistant｜></think>"
    # the next turn appends: its prompt starts with turn 1's, byte for byte
    turn2 = body(system="S", messages=[*turn1["messages"], {"role": "assistant", "content": "done"},
                                       {"role": "user", "content": "thanks"}])
    assert render(parse_messages(turn2)).startswith(text)
    # after an assistant turn it opens a user turn of its own, so the reply is announced
    turn3 = body(system="S", messages=[*turn2["messages"][:3], {"role": "system", "content": env}])
    assert render(parse_messages(turn3)).endswith(f"done<｜end▁of▁sentence｜><｜User｜>{env}<｜Assistant｜></think>")


def test_the_billing_header_nonce_is_left_out_and_counted_tokens_match():
    def conv(nonce):
        return body(system=[{"type": "text", "text": f"x-anthropic-billing-header: cc_version=2.1.332.{nonce}; "
                                                     "cc_entrypoint=cli;"},
                            {"type": "text", "text": "You are Claude Code."}])
    a, b = parse_messages(conv("a1f")), parse_messages(conv("9c0"))
    assert render(a) == render(b) and "billing" not in render(a) and "You are Claude Code." in render(a)
    assert a.dropped_nonces == ("system[0]: anthropic-billing-header",)
    counted = parse_count_tokens({k: v for k, v in conv("77e").items() if k != "max_tokens"})
    assert render(counted) == render(a)
    # a block that only mentions it is instructions, and kept
    kept = parse_messages(body(system="Never print the x-anthropic-billing-header: line.\nBe brief."))
    assert "billing" in render(kept) and kept.dropped_nonces == ()


def test_output_config_and_the_newer_thinking_types():
    req = parse_messages(body(thinking={"type": "adaptive", "display": "summarized"}, cache_control={"type": "ephemeral"},
                              output_config={"effort": "max", "format": {"type": "json_schema", "schema": {
                                  "type": "object", "properties": {"ok": {"type": "boolean"}}}}}))
    assert req.thinking == {"type": "enabled"} and req.reasoning_effort == "max"
    assert req.json_schema == {"type": "object", "properties": {"ok": {"type": "boolean"}}}
    assert parse_messages(body(thinking={"type": "between_tools"})).thinking == {"type": "enabled"}
    assert refused(body(output_config={"effort": "extreme"})).param == "output_config.effort"
    assert refused(body(output_config={"format": {"type": "regex"}})).param == "output_config.format"


def test_count_tokens_needs_no_max_tokens():
    req = parse_count_tokens({"model": "m", "messages": [{"role": "user", "content": "hi"}], "system": "S"})
    assert req.common.max_tokens is None and req.messages[0] == {"role": "system", "content": "S"}


# --- 400s naming the field --------------------------------------------------------------------

@pytest.mark.parametrize("d, param, words", [
    (body(messages=[{"role": "user", "content": [{"type": "image", "source": {"type": "base64", "data": "x"}}]}]),
     "messages[0].content[0].type", "'image' blocks are not supported"),
    (body(messages=[{"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t", "content": [
        {"type": "image", "source": {}}]}]}]), "messages[0].content[0].content[0].type", "reads text only"),
    (body(messages=[{"role": "user", "content": [{"type": "document", "source": {}}]}]),
     "messages[0].content[0].type", "'document' blocks"),
    (body(tools=[READ], tool_choice={"type": "required"}), "tool_choice.type", "auto, any, tool, none"),
    (body(tools=[READ], tool_choice="any"), "tool_choice", "expected an object"),
    (body(tools=[READ], tool_choice={"type": "tool", "name": "write"}), "tool_choice.name", "not among the tools"),
    (body(tools=[READ], tool_choice={"type": "tool"}), "tool_choice.name", "required"),
    (body(tool_choice={"type": "any"}), "tool_choice.type", "needs tools"),
    (body(thinking={"type": "enabled", "budget_tokens": 100}), "thinking.budget_tokens", "at least 1024"),
    (body(thinking={"type": "enabled"}), "thinking.budget_tokens", "required"),
    (body(max_tokens=2000, thinking={"type": "enabled", "budget_tokens": 2000}), "thinking.budget_tokens",
     "less than max_tokens"),
    (body(thinking={"type": "on"}), "thinking.type", "enabled"),
    (body(max_tokens=None), "max_tokens", "required"),
    (body(max_tokens=0), "max_tokens", "at least 1"),
    (body(temperature=1.5), "temperature", "out of range"),
    (body(stop_sequences="END"), "stop_sequences", "array of strings"),
    (body(metadata={"user_id": 7}), "metadata.user_id", "expected a string"),
    (body(messages=[{"role": "tool", "content": "x"}]), "messages[0].role", "user, assistant or system"),
    (body(messages=[{"role": "user", "content": "x"}, {"role": "system", "content": [{"type": "image"}]}]),
     "messages[1].content[0]", "text block"),
    (body(messages=[{"role": "user", "content": "x"}, {"role": "assistant", "content": "Sure"}]),
     "messages[1].role", "prefilling"),
    (body(tools=[{"type": "web_search_20250305", "name": "web_search"}]), "tools[0].type", "server tool"),
    (body(tools=[{"name": "read"}]), "tools[0].input_schema", "required"),
    (body(tools=[{"name": "read", "input_schema": {"properties": []}}]), "tools[0].input_schema.properties",
     "expected an object"),
    (body(messages=[{"role": "assistant", "content": [{"type": "tool_use", "id": "t", "name": "read",
                                                        "input": "{}"}]}, {"role": "user", "content": "x"}]),
     "messages[0].content[0].input", "expected an object"),
    (body(messages=[{"role": "user", "content": [{"type": "tool_result"}]}]), "messages[0].content[0].tool_use_id",
     "required"),
    (body(max_token=5), "max_token", "did you mean 'max_tokens'"),
])
def test_bad_requests_are_refused_naming_the_field(d, param, words):
    d = {k: v for k, v in d.items() if v is not None}
    e = refused(d)
    assert e.param == param and e.message.startswith(param + ":") and words in e.message, e.message


def test_errors_take_anthropics_shape_and_statuses():
    assert error_body(APIError(400, "x: bad")) == (400, {"type": "error", "error": {
        "type": "invalid_request_error", "message": "x: bad"}})
    assert error_body(APIError(401, "k"))[1]["error"]["type"] == "authentication_error"
    assert error_body(APIError(404, "m"))[1]["error"]["type"] == "not_found_error"
    assert error_body(APIError(413, "big"))[1]["error"]["type"] == "request_too_large"
    assert error_body(APIError(429, "busy"))[1]["error"]["type"] == "rate_limit_error"
    assert error_body(APIError(500, "bug"))[1]["error"]["type"] == "api_error"
    assert error_body(APIError(503, "going"))[0] == 529
    # no memory for this conversation: a retry fails alike, so it is a prompt too long (Claude Code compacts)
    assert error_body(APIError(507, "memory: 9 MiB")) == (400, {"type": "error", "error": {
        "type": "invalid_request_error", "message": "prompt is too long: memory: 9 MiB"}})


def test_context_overflow_uses_anthropics_messages():
    with pytest.raises(APIError, match=r"^prompt is too long: 100 tokens > 99 maximum$"):
        check_context(100, 5, 100)
    with pytest.raises(APIError, match=r"input length and `max_tokens` exceed context limit: 90 \+ 20 > 100"):
        check_context(90, 20, 100)
    check_context(90, 10, 100)


def test_stop_matcher_says_which_stop_string_ended_the_text():
    m = StopMatcher(("STOP", "END"))
    assert m.push("abc EN") == ("abc ", False) and m.matched is None
    assert m.push("D and STOP") == ("", True) and m.matched == "END"      # the earliest, not the first listed


# --- replies ----------------------------------------------------------------------------------

class FakeAPI:
    model_id, fingerprint, tok = "m", "fp_x", None

    def __init__(self):
        self.log = get_logger()


REPLY = ["let me", " see</th", "ink>Reading", ".\n\n<", f"{D}tool_calls>\n<{D}invoke name=\"read\">\n",
         f"<{D}parameter name=\"path\" string=\"true\">a.txt</{D}", "parameter>\n", f"</{D}invoke>\n</{D}tool_calls>"]


async def run(cls, pieces, *, thinking=True, done=None, thinking_field=None, **fields):
    if thinking_field is not None:
        fields["thinking"] = thinking_field
    req = parse_messages(body(tools=[READ], stream=cls is MessagesStream, **fields))
    sent = []

    async def send(msg):
        sent.append(msg)

    r = cls(FakeAPI(), "msg_1", req, 7, thinking=thinking)
    await r.start(send, Started(2, None))
    for i, p in enumerate(pieces):
        await r.token(send, TokenOut(i, p, 0.0, ()))
    await r.done(send, done or Done("stop", Usage(7, len(pieces), 2)))
    assert sent[-1]["type"] == "http.response.body" and not sent[-1].get("more_body")   # the response ends
    raw = b"".join(m.get("body", b"") for m in sent if m["type"] == "http.response.body").decode()
    if cls is MessagesJSON:
        return json.loads(raw)
    events = []
    for block in raw.split("\n\n")[:-1]:
        name_line, data_line = block.split("\n")
        assert name_line.startswith("event: ") and data_line.startswith("data: ")
        data = json.loads(data_line[6:])
        assert data["type"] == name_line[7:]            # the event line names the data's type
        events.append(data)
    return events


async def test_the_stream_is_anthropics_exact_event_sequence():
    events = await run(MessagesStream, REPLY)
    names = [(e["type"], e.get("delta", e.get("content_block", {})).get("type")) for e in events]
    assert names == [
        ("message_start", None), ("ping", None),
        ("content_block_start", "thinking"), ("content_block_delta", "thinking_delta"),
        ("content_block_delta", "thinking_delta"), ("content_block_delta", "signature_delta"),
        ("content_block_stop", None),
        ("content_block_start", "text"), ("content_block_delta", "text_delta"), ("content_block_delta", "text_delta"),
        ("content_block_stop", None),
        ("content_block_start", "tool_use"), ("content_block_delta", "input_json_delta"),
        ("content_block_stop", None),
        ("message_delta", None), ("message_stop", None)]
    start = events[0]["message"]
    assert start["id"] == "msg_1" and start["role"] == "assistant" and start["content"] == []
    assert start["stop_reason"] is None and start["usage"] == {
        "input_tokens": 5, "cache_creation_input_tokens": 0, "cache_read_input_tokens": 2, "output_tokens": 0}
    assert [e["index"] for e in events if e["type"] == "content_block_stop"] == [0, 1, 2]
    tool = events[11]["content_block"]
    assert tool["type"] == "tool_use" and tool["id"].startswith("toolu_") and tool["name"] == "read"
    assert tool["input"] == {}
    args = "".join(e["delta"]["partial_json"] for e in events if e.get("delta", {}).get("type") == "input_json_delta")
    assert json.loads(args) == {"path": "a.txt"}
    assert events[-2]["delta"] == {"stop_reason": "tool_use", "stop_sequence": None}
    assert events[-2]["usage"]["output_tokens"] == len(REPLY)


async def test_whole_and_streamed_replies_carry_the_same_blocks():
    whole = await run(MessagesJSON, REPLY)
    assert whole["type"] == "message" and whole["stop_reason"] == "tool_use" and whole["stop_sequence"] is None
    thinking, text, tool = whole["content"]
    assert thinking["type"] == "thinking" and thinking["thinking"] == "let me see" and thinking["signature"]
    assert text == {"type": "text", "text": "Reading."}
    assert tool["type"] == "tool_use" and tool["name"] == "read" and tool["input"] == {"path": "a.txt"}
    assert whole["usage"] == {"input_tokens": 5, "cache_creation_input_tokens": 0, "cache_read_input_tokens": 2,
                              "output_tokens": len(REPLY)}
    events = await run(MessagesStream, REPLY)
    built = {}
    for e in events:
        if e["type"] == "content_block_start":
            built[e["index"]] = dict(e["content_block"], _json="")
        elif e["type"] == "content_block_delta":
            b, d = built[e["index"]], e["delta"]
            if d["type"] == "thinking_delta":
                b["thinking"] += d["thinking"]
            elif d["type"] == "signature_delta":
                b["signature"] = d["signature"]
            elif d["type"] == "text_delta":
                b["text"] += d["text"]
            else:
                b["_json"] += d["partial_json"]
    streamed = [b for _, b in sorted(built.items())]
    streamed[2]["input"] = json.loads(streamed[2].pop("_json"))
    for b in streamed[:2]:
        b.pop("_json")
    assert [{k: v for k, v in b.items() if k != "id"} for b in streamed] == \
        [{k: v for k, v in b.items() if k != "id"} for b in whole["content"]]


# max_tokens inside the call's parameter; and a first call closed, the second cut off
CUT = REPLY[:5] + [f"<{D}parameter name=\"path\" string=\"true\">a.t"]
SECOND_CUT = REPLY[:7] + [f"</{D}invoke>\n<{D}invoke name=\"read\">\n<{D}parameter name=\"path\" string=\"true\">b"]


@pytest.mark.parametrize("cls", [MessagesJSON, MessagesStream])
async def test_a_tool_call_cut_off_by_max_tokens_is_never_a_tool_use_block(cls):
    out = await run(cls, CUT, done=Done("length", Usage(7, len(CUT), 2)))
    if cls is MessagesJSON:
        assert out["stop_reason"] == "max_tokens" and out["stop_sequence"] is None
        assert [b["type"] for b in out["content"]] == ["thinking", "text"]
        assert out["content"][1] == {"type": "text", "text": "Reading."}
        return
    # the stream never started a tool_use block: the call was held until it would close
    assert not any(e.get("content_block", {}).get("type") == "tool_use" for e in out)
    assert not any(e.get("delta", {}).get("type") == "input_json_delta" for e in out)
    assert [e["index"] for e in out if e["type"] == "content_block_stop"] == [0, 1]
    assert out[-2]["delta"] == {"stop_reason": "max_tokens", "stop_sequence": None}


@pytest.mark.parametrize("cls", [MessagesJSON, MessagesStream])
async def test_the_call_closed_before_the_cut_is_a_whole_tool_use_and_the_stop_is_max_tokens(cls):
    out = await run(cls, SECOND_CUT, done=Done("length", Usage(7, len(SECOND_CUT), 2)))
    if cls is MessagesJSON:
        assert out["stop_reason"] == "max_tokens"
        (tool,) = [b for b in out["content"] if b["type"] == "tool_use"]
        assert tool["input"] == {"path": "a.txt"}
        return
    starts = [e["content_block"] for e in out if e["type"] == "content_block_start"]
    assert [b["type"] for b in starts] == ["thinking", "text", "tool_use"]
    args = [e["delta"]["partial_json"] for e in out if e.get("delta", {}).get("type") == "input_json_delta"]
    assert args == ['{"path": "a.txt"}']
    assert out[-2]["delta"]["stop_reason"] == "max_tokens"


async def test_a_call_cut_off_by_a_stop_sequence_is_no_tool_use_and_the_stop_says_so():
    done = Done("stop", Usage(7, len(CUT), 2), stop_sequence="a.t")
    whole = await run(MessagesJSON, CUT, done=done, stop_sequences=["a.t"])
    assert (whole["stop_reason"], whole["stop_sequence"]) == ("stop_sequence", "a.t")
    assert not any(b["type"] == "tool_use" for b in whole["content"])
    events = await run(MessagesStream, CUT, done=done, stop_sequences=["a.t"])
    assert not any(e.get("content_block", {}).get("type") == "tool_use" for e in events)
    assert events[-2]["delta"] == {"stop_reason": "stop_sequence", "stop_sequence": "a.t"}


@pytest.mark.parametrize("done, fields, want", [
    (Done("length", Usage(7, 2, 0)), {}, ("max_tokens", None)),
    (Done("stop", Usage(7, 2, 0), stop_sequence="END"), {"stop_sequences": ["END"]}, ("stop_sequence", "END")),
    (Done("stop", Usage(7, 2, 0)), {}, ("end_turn", None)),
])
async def test_stop_reasons(done, fields, want):
    whole = await run(MessagesJSON, ["Hello", " there"], thinking=False, done=done, **fields)
    assert (whole["stop_reason"], whole["stop_sequence"]) == want
    assert whole["content"] == [{"type": "text", "text": "Hello there"}]
    events = await run(MessagesStream, ["Hello", " there"], thinking=False, done=done, **fields)
    assert events[-2]["delta"] == {"stop_reason": want[0], "stop_sequence": want[1]}


async def test_a_failure_after_the_stream_started_is_an_error_event():
    req = parse_messages(body(stream=True))
    sent = []

    async def send(msg):
        sent.append(msg)

    r = MessagesStream(FakeAPI(), "msg_1", req, 3)
    await r.start(send, Started(0, None))
    await r.failed(send, APIError(507, "no memory for this conversation"))
    last = sent[-1]
    assert last["more_body"] is False
    assert last["body"] == b'event: error\ndata: {"type":"error","error":{"type":"invalid_request_error",' \
                           b'"message":"prompt is too long: no memory for this conversation"}}\n\n'
    before = MessagesJSON(FakeAPI(), "msg_2", parse_messages(body()), 3)
    sent.clear()
    await before.failed(send, APIError(429, "busy", headers={"Retry-After": "1"}))
    assert sent[0]["status"] == 429 and (b"retry-after", b"1") in sent[0]["headers"]
    assert json.loads(sent[1]["body"]) == {"type": "error", "error": {"type": "rate_limit_error", "message": "busy"}}


async def test_thinking_display_omitted_sends_thinking_blocks_without_their_text():
    from cairn.daemon.protocol.reply_ids import message_key, parsed_key

    fields = dict(thinking_field={"type": "adaptive", "display": "omitted"})
    whole = await run(MessagesJSON, ["let me see", "</think>", "Hello"], **fields)
    thinking, text = whole["content"]
    assert thinking == {"type": "thinking", "thinking": "", "signature": thinking["signature"]}
    assert thinking["signature"] and text == {"type": "text", "text": "Hello"}
    events = await run(MessagesStream, ["let me see", "</think>", "Hello"], **fields)
    deltas = [d["delta"]["type"] for d in events if d["type"] == "content_block_delta"]
    assert "thinking_delta" not in deltas and "signature_delta" in deltas
    # shown by default
    shown = await run(MessagesJSON, ["let me see", "</think>", "Hello"], thinking_field={"type": "adaptive"})
    assert shown["content"][0]["thinking"] == "let me see"
    # the reply table keys the reply as the client got it, so as it comes back
    r = MessagesJSON(FakeAPI(), "msg_1", parse_messages(body(thinking=fields["thinking_field"])), 7, thinking=True)
    for piece in ("let me see", "</think>", "Hello"):
        r.parser.feed(piece)
    r.parser.finish()
    back = parse_messages(body(messages=[{"role": "user", "content": "hi"},
                                         {"role": "assistant", "content": [thinking, text]},
                                         {"role": "user", "content": "more"}]))
    assert parsed_key(r.parser.result, omit_reasoning=r.omits_reasoning) == message_key(back.messages[1])
