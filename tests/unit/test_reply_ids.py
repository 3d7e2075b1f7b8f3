"""Replies reused exactly (daemon/protocol/reply_ids.py): the key, the table, and the replay of a
reply's generated ids in a later prompt; and that each API's reply, sent back as its clients send
it, has the key the reply was kept under."""

from __future__ import annotations

import json

import pytest

from cairn.actors.engine.messages import Done, Started, TokenOut, Usage
from cairn.daemon.api.anthropic import parse_messages
from cairn.daemon.api.anthropic_reply import MessagesJSON, MessagesStream
from cairn.daemon.api.responders import ChatJSON, ChatStream
from cairn.daemon.api.responses import parse_responses
from cairn.daemon.api.responses_reply import ResponsesJSON, ResponsesStream
from cairn.daemon.api.schemas import parse_chat
from cairn.daemon.protocol.chat_encoding import V4Renderer
from cairn.daemon.protocol.dsv4.encoding import ChatOptions
from cairn.daemon.protocol.reply_end import reply_end
from cairn.daemon.protocol.reply_ids import (ENTRY_OVERHEAD, ReplyTable, keepable, message_key, parsed_key,
                                             replay, reply_key, reply_marks)
from cairn.daemon.protocol.tokenizer import TextTokenizer
from cairn.daemon.protocol.dsv4.output import OutputParser
from cairn.daemon.service.logs import get_logger

D = "｜DSML｜"


# --- the key --------------------------------------------------------------------------------

CALL = ("call_1", "read", '{"path": "a.txt", "n": 2}')


def test_one_byte_of_difference_anywhere_misses():
    key = reply_key("Reading.", "let me see", [CALL])
    assert key == reply_key("Reading.", "let me see", [CALL])
    for other in (reply_key("Reading!", "let me see", [CALL]),
                  reply_key("Reading.", "let me sea", [CALL]),
                  reply_key("Reading.", "let me see", [("call_2", "read", CALL[2])]),
                  reply_key("Reading.", "let me see", [("call_1", "reads", CALL[2])]),
                  reply_key("Reading.", "let me see", [("call_1", "read", '{"path": "a.txu", "n": 2}')]),
                  reply_key("Reading.", "let me see", [("call_1", "read", '{"path": "a.txt", "n": 2.0}')]),
                  reply_key("Reading.", "let me see", [("call_1", "read", '{"n": 2, "path": "a.txt"}')]),
                  reply_key("Reading.", "let me see", [CALL, CALL]),
                  reply_key("Reading.", "let me see", []),
                  reply_key("Reading.let me see", "", [CALL])):
        assert other != key


def test_arguments_are_read_as_the_encoder_renders_them():
    # a JSON object string, its compact form and the object itself render alike: one key
    same = [reply_key("", "", [("c", "f", a)]) for a in ('{"a": 1, "b": "é"}', '{"a":1,"b":"\\u00e9"}',
                                                        {"a": 1, "b": "é"})]
    assert same[0] == same[1] == same[2]
    # anything else is rendered raw, so its bytes count
    assert reply_key("", "", [("c", "f", "[1, 2]")]) != reply_key("", "", [("c", "f", "[1,2]")])
    assert reply_key("", "", [("c", "f", "not json")]) != reply_key("", "", [("c", "f", "not json ")])


def test_a_messages_key_reads_it_as_the_encoder_does():
    calls = [{"id": "call_1", "type": "function", "function": {"name": "read", "arguments": CALL[2]}}]
    want = reply_key("Reading.", "let me see", [CALL])
    assert message_key({"role": "assistant", "content": "Reading.", "reasoning_content": "let me see",
                        "tool_calls": calls}) == want
    assert message_key({"role": "assistant", "content": [{"type": "text", "text": "Reading."}],
                        "reasoning": "let me see", "tool_calls": calls}) == want
    assert message_key({"role": "assistant", "content": None}) == message_key({"role": "assistant", "content": ""})


# --- the table ------------------------------------------------------------------------------

def test_the_table_is_bounded_and_least_recently_used_goes_first():
    t = ReplyTable(3 * (ENTRY_OVERHEAD + 4 * 10))
    for k in range(3):
        assert t.put(bytes([k]), 5, list(range(10)))
    assert t.bytes == 3 * (ENTRY_OVERHEAD + 40) and len(t) == 3
    assert t.get(bytes([0])) is not None            # 0 is now the most recently used
    t.put(bytes([3]), 5, list(range(10)))
    assert t.get(bytes([1])) is None and t.get(bytes([0])) is not None and len(t) == 3
    assert t.stats()["evicted"] == 1
    assert not t.put(b"big", 5, list(range(10_000)))  # larger than the whole table: refused
    assert len(t) == 3 and t.bytes <= t.max_bytes
    t.put(bytes([0]), 6, [1, 2])                     # replaced, counted once
    assert t.get(bytes([0])).opener == 6 and list(t.get(bytes([0])).ids) == [1, 2]
    assert t.bytes == 2 * (ENTRY_OVERHEAD + 40) + ENTRY_OVERHEAD + 8


# --- replay ---------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def tok(tiny_md):
    return TextTokenizer.from_model_dir(tiny_md)


TOOLS = [{"type": "function", "function": {"name": "read", "parameters": {
    "type": "object", "properties": {"path": {"type": "string"}}}}}]
REPLY_MSG = {"role": "assistant", "content": "Reading.", "reasoning_content": "let me see",
             "tool_calls": [{"id": "call_1", "type": "function",
                             "function": {"name": "read", "arguments": '{"path": "a.txt"}'}}]}
CONV = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "read a"}, REPLY_MSG,
        {"role": "tool", "tool_call_id": "call_1", "content": "text of a"}]


def render(tok, messages, thinking=True, tools=TOOLS):
    r = V4Renderer()
    rendered = r.render(messages, tools=tools, options=ChatOptions(thinking=thinking))
    spans = getattr(rendered, "content_spans", ())   # the request's text, never control tokens
    ids, ends = tok.encode_with_offsets(rendered.text, spans) if spans else tok.encode_with_offsets(rendered.text)
    return rendered, rendered.text.encode(), ids, ends


def test_a_kept_reply_is_replayed_with_its_own_ids_and_the_boundaries_move(tok):
    marks = reply_marks(tok, V4Renderer())
    assert marks is not None and reply_marks(tok, object()) is None     # V4's own encoding only
    rendered, data, ids, ends = render(tok, CONV)
    gen = [101, 102, marks.end_think, 103, 104, 105, marks.eos]          # what the model wrote, say
    t = ReplyTable(1 << 20)
    assert replay(ids, ends, data, CONV, t, marks) is None               # nothing kept: nothing replayed
    t.put(message_key(REPLY_MSG), marks.think, gen)
    r = replay(ids, ends, data, CONV, t, marks)
    assert r is not None and len(r.spans) == 1
    # the turn is the ids after `<｜Assistant｜><think>` up to its EOS; all else is as tokenized
    a = ids.index(marks.assistant)
    e = ids.index(marks.eos)
    assert ids[a + 1] == marks.think and (a + 2, e + 1) == r.spans[0][:2]
    assert r.ids == ids[:a + 2] + gen + ids[e + 1:]
    assert r.position(a + 2) == a + 2 and r.position(a + 5) is None
    assert r.position(len(ids)) == len(r.ids) and r.position(None) is None
    assert r.tokens == len(gen) and t.stats()["replayed_turns"] == 1
    # the prompt the reply was generated for is a prefix: the state after it extends it exactly
    first, _, ids1, _ = render(tok, CONV[:2])
    assert r.ids[:len(ids1)] == ids1 and ids1[-2:] == [marks.assistant, marks.think]


def test_one_byte_of_difference_or_another_mode_is_not_replayed(tok):
    marks = reply_marks(tok, V4Renderer())
    t = ReplyTable(1 << 20)
    gen = [101, 102, marks.eos]
    t.put(message_key(REPLY_MSG), marks.think, gen)
    edited = [dict(m) for m in CONV]
    edited[2] = {**REPLY_MSG, "content": "Reading!"}
    _, data, ids, ends = render(tok, edited)
    assert replay(ids, ends, data, edited, t, marks) is None
    # the same message where the reply was generated in chat mode (opener `</think>`): not this turn
    t2 = ReplyTable(1 << 20)
    t2.put(message_key(REPLY_MSG), marks.end_think, gen)
    _, data, ids, ends = render(tok, CONV)
    assert replay(ids, ends, data, CONV, t2, marks) is None
    # thinking without tools drops past reasoning: rendered after `</think>`, not as generated
    conv = CONV[:3] + [{"role": "user", "content": "go on"}]
    plain = [{**m, "tool_calls": None} if m is REPLY_MSG else m for m in conv]
    t3 = ReplyTable(1 << 20)
    t3.put(message_key(plain[2]), marks.think, gen)
    _, data, ids, ends = render(tok, plain, tools=None)
    assert replay(ids, ends, data, plain, t3, marks) is None


def test_chat_mode_turns_and_several_replies(tok):
    marks = reply_marks(tok, V4Renderer())
    first = {"role": "assistant", "content": "Hello there."}
    second = {"role": "assistant", "content": "Bye."}
    conv = [{"role": "user", "content": "Hi"}, first, {"role": "user", "content": "Bye"}, second,
            {"role": "user", "content": "again"}]
    t = ReplyTable(1 << 20)
    g1, g2 = [201, 202, 203, 204, marks.eos], [205, marks.eos]
    t.put(message_key(first), marks.end_think, g1)
    t.put(message_key(second), marks.end_think, g2)
    _, data, ids, ends = render(tok, conv, thinking=False, tools=None)
    r = replay(ids, ends, data, conv, t, marks)
    assert r is not None and len(r.spans) == 2
    (s1, e1, _), (s2, e2, _) = r.spans
    assert r.ids == ids[:s1] + g1 + ids[e1:s2] + g2 + ids[e2:]
    assert r.position(len(ids) - 1) == len(r.ids) - 1
    # a continued final assistant message renders no EOS: it is not a closed turn
    cont = conv[:4]
    _, data, ids, ends = render(tok, cont, thinking=False, tools=None)
    r = replay(ids, ends, data, cont, t, marks)
    assert r is not None and len(r.spans) == 1 and r.spans[0][2] == len(g1)


def test_an_eos_that_closes_no_assistant_turn_stops_the_replay(tok):
    marks = reply_marks(tok, V4Renderer())
    first = {"role": "assistant", "content": "Hello there."}
    conv = [{"role": "user", "content": "Hi"}, first, {"role": "user", "content": "Bye"}]
    t = ReplyTable(1 << 20)
    t.put(message_key(first), marks.end_think, [201, marks.eos])
    _, data, ids, ends = render(tok, conv, thinking=False, tools=None)
    extra = ids[:3] + [marks.eos] + ids[3:]           # as a prompt with one more EOS would be
    assert replay(extra, ends[:3] + [ends[2]] + ends[3:], data, conv, t, marks) is None
    assert replay(ids, ends, data, conv, t, marks) is not None


# --- what each API returns, sent back, has the key it was kept under -------------------------

PIECES = ["let me", " see</th", "ink>Reading", " é.\n\n<", f"{D}tool_calls>\n<{D}invoke name=\"read\">\n",
          f"<{D}parameter name=\"path\" string=\"true\">a.txt</{D}", "parameter>\n",
          f"<{D}parameter name=\"n\" string=\"false\">2.50</{D}parameter>\n",
          f"</{D}invoke>\n</{D}tool_calls>"]
READ_PARAMS = {"type": "object", "properties": {"path": {"type": "string"}, "n": {"type": "number"}}}


class FakeAPI:
    model_id, fingerprint, tok = "m", "fp_x", None

    def __init__(self):
        self.log = get_logger()


async def drive(r, stream: bool):
    sent = []

    async def send(msg):
        sent.append(msg)

    await r.start(send, Started(0, None))
    for i, p in enumerate(PIECES):
        await r.token(send, TokenOut(i, p, 0.0, ()))
    await r.done(send, Done("stop", Usage(3, len(PIECES), 0)))
    raw = b"".join(m.get("body", b"") for m in sent if m["type"] == "http.response.body").decode()
    return raw


def kept_key(r) -> bytes:
    parsed = r.parser.result
    assert keepable(parsed, reply_end("stop", None, parsed), [1, 2], 2)
    return parsed_key(parsed)


@pytest.mark.parametrize("cls", [ChatJSON, ChatStream])
async def test_chat_reply_sent_back(cls):
    req = parse_chat({"model": "m", "messages": [{"role": "user", "content": "x"}], "stream": cls is ChatStream,
                      "tools": [{"type": "function", "function": {"name": "read", "parameters": READ_PARAMS}}]})
    api = FakeAPI()

    class Tok:
        def token_bytes(self, i):
            return PIECES[i].encode()

    api.tok = Tok()
    r = cls(api, "chatcmpl-1", req, thinking=True)
    raw = await drive(r, cls is ChatStream)
    if cls is ChatJSON:
        msg = json.loads(raw)["choices"][0]["message"]
    else:     # as a client assembles the stream
        msg = {"role": "assistant", "content": "", "reasoning_content": "", "tool_calls": []}
        for block in raw.split("\n\n"):
            if not block.startswith("data: {"):
                continue
            for ch in json.loads(block[6:])["choices"]:
                d = ch["delta"]
                msg["content"] += d.get("content") or ""
                msg["reasoning_content"] += d.get("reasoning_content") or ""
                for tc in d.get("tool_calls", []):
                    if tc.get("id"):
                        msg["tool_calls"].append({"id": tc["id"], "type": "function",
                                                  "function": {"name": tc["function"]["name"], "arguments": ""}})
                    msg["tool_calls"][tc["index"]]["function"]["arguments"] += tc["function"].get("arguments") or ""
    back = parse_chat({"model": "m", "messages": [{"role": "user", "content": "x"}, msg,
                                                  {"role": "user", "content": "y"}]})
    assert message_key(back.messages[1]) == kept_key(r)
    msg["tool_calls"][0]["function"]["arguments"] = msg["tool_calls"][0]["function"]["arguments"].replace("2.5", "2.6")
    assert message_key(msg) != kept_key(r)


@pytest.mark.parametrize("cls", [MessagesJSON, MessagesStream])
async def test_anthropic_reply_sent_back(cls):
    read = {"name": "read", "input_schema": READ_PARAMS}
    body = {"model": "m", "max_tokens": 100, "messages": [{"role": "user", "content": "hi"}], "tools": [read],
            "stream": cls is MessagesStream}
    r = cls(FakeAPI(), "msg_1", parse_messages(body), 7, thinking=True)
    raw = await drive(r, cls is MessagesStream)
    if cls is MessagesJSON:
        blocks = json.loads(raw)["content"]
    else:     # the blocks as the SDK assembles them
        blocks, partial = [], {}
        for part in raw.split("\n\n")[:-1]:
            ev = json.loads(part.split("\n")[1][6:])
            if ev["type"] == "content_block_start":
                blocks.append(dict(ev["content_block"]))
            elif ev["type"] == "content_block_delta":
                d, b = ev["delta"], blocks[ev["index"]]
                if d["type"] == "text_delta":
                    b["text"] += d["text"]
                elif d["type"] == "thinking_delta":
                    b["thinking"] += d["thinking"]
                elif d["type"] == "signature_delta":
                    b["signature"] = d["signature"]
                else:
                    partial[ev["index"]] = partial.get(ev["index"], "") + d["partial_json"]
        for i, js in partial.items():
            blocks[i]["input"] = json.loads(js)
    assert [b["type"] for b in blocks] == ["thinking", "text", "tool_use"]
    back = parse_messages({**body, "messages": body["messages"] + [
        {"role": "assistant", "content": blocks},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": blocks[2]["id"], "content": "A"}]}]})
    assert message_key(back.messages[1]) == kept_key(r)


@pytest.mark.parametrize("cls", [ResponsesJSON, ResponsesStream])
async def test_responses_reply_sent_back(cls):
    read = {"type": "function", "name": "read", "parameters": READ_PARAMS}
    body = {"model": "m", "input": "x", "tools": [read], "stream": cls is ResponsesStream,
            "include": ["reasoning.encrypted_content"]}
    r = cls(FakeAPI(), "resp-1", parse_responses(body), thinking=True)
    raw = await drive(r, cls is ResponsesStream)
    if cls is ResponsesJSON:
        items = json.loads(raw)["output"]
    else:
        items = [ev["item"] for ev in (json.loads(b.split("\n")[1][6:]) for b in raw.split("\n\n") if b)
                 if ev["type"] == "response.output_item.done"]
    assert [i["type"] for i in items] == ["reasoning", "message", "function_call"]
    # Codex sends the items back; with the reasoning as its encrypted_content only, or as its content
    for reasoning in ({**items[0], "content": None}, items[0]):
        sent = [{"role": "user", "content": "x"}, reasoning, *items[1:],
                {"type": "function_call_output", "call_id": items[2]["call_id"], "output": "A"}]
        back = parse_responses({**body, "input": sent}).chat
        assert message_key(back.messages[1]) == kept_key(r)


def test_what_is_kept_only_replies_that_ended_by_themselves():
    def parsed(text, tools=True):
        p = OutputParser(thinking=False, tools=[{"type": "function", "function": {"name": "f"}}] if tools else None,
                         whole_calls=True)
        p.feed(text)
        p.finish()
        return p.result

    ok = parsed("hi")
    assert keepable(ok, reply_end("stop", None, ok), [5, 9], 9)
    assert not keepable(ok, reply_end("length", None, ok), [5, 9], 9)       # cut by the limit
    assert not keepable(ok, reply_end("stop", "hi", ok), [5, 9], 9)         # a stop string
    assert not keepable(ok, reply_end("stop", None, ok), [5, 6], 9)         # no EOS at the end
    cut = parsed(f"x\n\n<{D}tool_calls>\n<{D}invoke name=\"f\">\n")
    assert not keepable(cut, reply_end("stop", None, cut), [5, 9], 9)        # a call dropped
    bad = parsed(f"x\n\n<{D}tool_calls>\n<{D}oops>")
    assert bad.warnings and not keepable(bad, reply_end("stop", None, bad), [5, 9], 9)
