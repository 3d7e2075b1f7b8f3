"""Chat responders with the V4 output parser: whole and streamed replies agree; a malformed tool-call
block comes back as content with a warning in the log (daemon/api/responders.py)."""

from __future__ import annotations

import json

from structlog.testing import capture_logs

from cairn.actors.engine.messages import Done, Started, TokenOut, Usage
from cairn.daemon.service.logs import get_logger
from cairn.daemon.api.responders import ChatJSON, ChatStream
from cairn.daemon.api.schemas import parse_chat

D = "｜DSML｜"
TOOLS = [{"type": "function", "function": {"name": "read", "parameters": {
    "type": "object", "properties": {"path": {"type": "string"}}}}}]


class PieceTok:
    """token id i is the i-th piece of the reply (what the logprob entries name)."""

    def __init__(self, pieces):
        self.pieces = pieces

    def token_bytes(self, i):
        return self.pieces[i].encode()


class FakeAPI:
    model_id, fingerprint, tok = "m", "fp_x", None

    def __init__(self):
        self.log = get_logger()


async def run(cls, pieces, *, stream: bool, thinking: bool, finish: str = "stop", **fields):
    req = parse_chat({"model": "m", "messages": [{"role": "user", "content": "x"}], "tools": TOOLS,
                      "stream": stream, **fields})
    sent = []

    async def send(msg):
        sent.append(msg)

    api = FakeAPI()
    api.tok = PieceTok(pieces)
    r = cls(api, "chatcmpl-1", req, thinking=thinking)
    await r.start(send, Started(0, None))
    for i, p in enumerate(pieces):
        await r.token(send, TokenOut(i, p, -0.5, ()))
    await r.done(send, Done(finish, Usage(3, len(pieces), 0)))
    body = b"".join(m.get("body", b"") for m in sent if m["type"] == "http.response.body").decode()
    if not stream:
        return json.loads(body)
    return [json.loads(b[6:]) for b in body.split("\n\n") if b.startswith("data: {")]


REPLY = ["let me", " see</th", "ink>Reading", ".\n\n<", f"{D}tool_calls>\n<{D}invoke name=\"read\">\n",
         f"<{D}parameter name=\"path\" string=\"true\">a.txt</{D}", "parameter>\n", f"</{D}invoke>\n</{D}tool_calls>"]


async def test_whole_and_streamed_replies_carry_the_same_parts():
    whole = await run(ChatJSON, REPLY, stream=False, thinking=True)
    msg = whole["choices"][0]["message"]
    assert whole["choices"][0]["finish_reason"] == "tool_calls"
    assert (msg["reasoning_content"], msg["content"]) == ("let me see", "Reading.")
    assert "reasoning" not in msg                     # one name only (docs/api.md, Reasoning)
    (call,) = msg["tool_calls"]
    assert call["function"] == {"name": "read", "arguments": '{"path": "a.txt"}'}
    chunks = await run(ChatStream, REPLY, stream=True, thinking=True)
    deltas = [c["choices"][0]["delta"] for c in chunks if c["choices"]]
    assert "".join(d.get("reasoning_content", "") for d in deltas) == "let me see"
    assert not any("reasoning" in d for d in deltas)
    assert "".join(d.get("content") or "" for d in deltas) == "Reading."
    calls = [tc for d in deltas for tc in d.get("tool_calls", [])]
    assert calls[0]["id"].startswith("call_") and calls[0]["function"] == {"name": "read", "arguments": ""}
    # the call goes out once it closed: its start, then its whole arguments
    assert [tc["function"].get("arguments") for tc in calls[1:]] == [call["function"]["arguments"]]
    assert chunks[-1]["choices"][0]["finish_reason"] == "tool_calls"


async def test_a_malformed_block_comes_back_as_content_with_a_warning():
    bad = ["Sure.\n\n", f"<{D}tool_calls>\n<{D}invoke nam=\"read\">\n</{D}tool_calls>"]
    with capture_logs() as logs:
        whole = await run(ChatJSON, bad, stream=False, thinking=False)
    msg = whole["choices"][0]["message"]
    assert whole["choices"][0]["finish_reason"] == "stop" and "tool_calls" not in msg
    assert msg["content"] == "".join(bad)                     # all of it, whitespace included
    (w,) = [e for e in logs if e["event"] == "model_output_malformed"]
    assert w["log_level"] == "warning" and w["request_id"] == "chatcmpl-1" and "malformed" in w["problem"]


CUT = REPLY[:5] + [f"<{D}parameter name=\"path\" string=\"true\">a.t"]     # max_tokens inside the call


async def test_a_call_cut_off_by_max_tokens_is_no_call_in_either_mode():
    whole = await run(ChatJSON, CUT, stream=False, thinking=True, finish="length")
    choice = whole["choices"][0]
    assert choice["finish_reason"] == "length" and "tool_calls" not in choice["message"]
    assert choice["message"]["content"] == "Reading."                 # no raw DSML
    chunks = await run(ChatStream, CUT, stream=True, thinking=True, finish="length")
    deltas = [c["choices"][0]["delta"] for c in chunks if c["choices"]]
    assert "".join(d.get("content") or "" for d in deltas) == "Reading."
    # a call's deltas go out only once it closed: a streaming client never saw any of this one
    assert not any("tool_calls" in d for d in deltas)
    assert chunks[-1]["choices"][0]["finish_reason"] == "length"


# a first call closes, the second is cut off by max_tokens
SECOND_CUT = REPLY[:7] + [f"</{D}invoke>\n<{D}invoke name=\"read\">\n<{D}parameter name=\"path\" string=\"true\">b"]


async def test_the_call_closed_before_the_cut_is_delivered_whole_and_the_finish_is_length():
    whole = await run(ChatJSON, SECOND_CUT, stream=False, thinking=True, finish="length")
    choice = whole["choices"][0]
    assert choice["finish_reason"] == "length"
    (call,) = choice["message"]["tool_calls"]
    assert call["function"] == {"name": "read", "arguments": '{"path": "a.txt"}'}
    chunks = await run(ChatStream, SECOND_CUT, stream=True, thinking=True, finish="length")
    calls = [tc for c in chunks if c["choices"] for tc in c["choices"][0]["delta"].get("tool_calls", [])]
    assert {tc["index"] for tc in calls} == {0}                      # nothing of the cut-off call
    assert "".join(tc["function"]["arguments"] for tc in calls) == '{"path": "a.txt"}'
    assert chunks[-1]["choices"][0]["finish_reason"] == "length"


async def test_a_cut_off_call_never_finishes_as_tool_calls():
    """The engine stopped (a stop string) inside the call: "stop", not "tool_calls"."""
    chunks = await run(ChatStream, CUT, stream=True, thinking=True)
    assert chunks[-1]["choices"][0]["finish_reason"] == "stop"
    whole = await run(ChatJSON, CUT, stream=False, thinking=True)
    assert whole["choices"][0]["finish_reason"] == "stop" and "tool_calls" not in whole["choices"][0]["message"]


async def test_streamed_chunks_carry_usage_only_when_the_client_asks():
    chunks = await run(ChatStream, REPLY, stream=True, thinking=True)
    assert len(chunks) > 3 and all("usage" not in c for c in chunks)
    asked = await run(ChatStream, REPLY, stream=True, thinking=True, stream_options={"include_usage": True})
    assert len(asked) == len(chunks) + 1
    assert all(c["usage"] is None for c in asked[:-1])            # OpenAI's shape: null until the last chunk
    assert asked[-1]["choices"] == [] and asked[-1]["usage"]["prompt_tokens"] == 3
    assert asked[-1]["usage"]["completion_tokens"] == len(REPLY)


THOUGHT = ["let me", " see</th", "ink>", "The", " answer", " is\n\n", "42", "."]


async def test_streamed_logprobs_ride_on_content_never_on_empty_or_reasoning_deltas():
    chunks = await run(ChatStream, THOUGHT, stream=True, thinking=True, logprobs=True)
    deltas = [(c["choices"][0]["delta"], c["choices"][0].get("logprobs")) for c in chunks[1:] if c["choices"]]
    for delta, lp in deltas:
        assert delta != {"content": ""} or lp is None             # no empty content delta carries them
        if "reasoning_content" in delta:
            assert lp is None
    tokens = [e["token"] for _, lp in deltas if lp for e in lp["content"]]
    # the content tokens, each once, in order; " is\n\n" was held back (whitespace before a possible
    # block) and rides with "42"
    assert tokens == ["The", " answer", " is\n\n", "42", "."]
    assert not any(d == {"content": ""} for d, _ in deltas)


async def test_whole_reply_logprobs_are_the_content_tokens_too():
    whole = await run(ChatJSON, THOUGHT, stream=False, thinking=True, logprobs=True)
    assert [e["token"] for e in whole["choices"][0]["logprobs"]["content"]] == ["The", " answer", " is\n\n", "42", "."]
